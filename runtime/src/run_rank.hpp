// Internal helpers around multi-process communicators, shared by mlopt_comm_run_rank (run_rank.cpp), the
// enforcer over a communicator (enforcer.cpp) and the tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm.hpp"
#include "mlopt/mlopt.h"
#include "transport.hpp"

namespace mlopt {

// Fails with the first failure of a broken communicator (mlopt_comm_s::broken_status), as every later run does.
mlopt_status comm_broken_error(const mlopt_comm_s& comm, mlopt_error* err);

// Records a failed run: the communicator is broken from now on (the first failure stays).
void break_comm(mlopt_comm_s& comm, mlopt_status status, const std::string& message);

// A Transport that forwards every call to `target` without owning it (a MemoryTransportGroup's view, which the
// group owns, inside a communicator, which owns its transport). `target` must outlive it.
std::unique_ptr<Transport> borrow_transport(Transport& target);

// A multi-process communicator for rank `rank` of `nranks` over `transport` (what mlopt_comm_create makes, minus
// the rendezvous): tests run several in one process over a MemoryTransportGroup. NULL when out of memory. Free
// with mlopt_comm_free.
mlopt_comm make_comm_for_test(int32_t rank, int32_t nranks, std::unique_ptr<Transport> transport);

}  // namespace mlopt

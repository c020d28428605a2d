// The argument checks of a collective run, shared by mlopt_comm_run (comm.cpp, every rank's buffers) and
// mlopt_comm_run_rank (run_rank.cpp, this rank's buffers). Defined in comm.cpp. Every function returns
// MLOPT_OK or fails through fail(err, ...) with a one-line message naming the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "handles.hpp"
#include "mlopt/mlopt.h"

namespace mlopt {

// What a caller's buffers say about the run, once they passed the checks.
struct Layout {
    size_t chunk_elems = 0;
    bool any_inplace = false;
    bool any_outofplace = false;
};

// "<plan source>: <message>" (the message alone for a plan without a source).
std::string prefixed(const mlopt_plan_s& plan, const std::string& message);

// Copies the fields the caller's struct has (struct_size) over the defaults (mlopt_run_options_init) and
// checks them; a CUDA backend must be available.
mlopt_status read_options(const mlopt_run_options* given, mlopt_run_options& out, mlopt_error* err);

// A runnable program (an MSCCL-EF plan, not JSON) for a communicator of `nranks`, valid dtype and op. `plan`
// may be NULL (refused).
mlopt_status check_program_args(const mlopt_plan_s* plan, mlopt_dtype dtype, mlopt_redop op, int32_t nranks,
                                mlopt_error* err);

// count: a multiple of the program's i_chunks, not so large that a buffer overflows size_t. Sets
// layout.chunk_elems.
mlopt_status check_count(const mlopt_plan_s& plan, size_t count, mlopt_dtype dtype, Layout& layout,
                         mlopt_error* err);

// Rank r's buffers (count > 0; after check_count): not NULL, aligned to the element size, disjoint or the
// executor's in-place layout. `in_name`/`out_name` name them in messages ("inputs[2]", "input"). Records
// in layout whether the rank runs in place.
mlopt_status check_rank_buffers(const mlopt_plan_s& plan, size_t r, const void* in, const void* out,
                                const std::string& in_name, const std::string& out_name, mlopt_dtype dtype,
                                Layout& layout, mlopt_error* err);

// The program declares the kinds of run the buffers make (inplace="1", outofplace="1"): MLOPT_ERR_MISMATCH.
mlopt_status check_declared(const mlopt_plan_s& plan, const Layout& layout, mlopt_error* err);

}  // namespace mlopt

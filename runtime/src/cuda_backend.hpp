// The CUDA backend's entry points, as comm.cpp sees them. Built from src/cuda/backend.cu when the library is
// configured with -DMLOPT_CUDA=ON (MLOPT_HAVE_CUDA); otherwise src/cuda_absent.cpp answers that the backend
// is not in this build. Everything a GPU run needs besides CUDA (tables, sizes, reports) is in
// device_program.hpp, which every build compiles and tests.
#pragma once

#include <memory>
#include <string>

#include "interpreter.hpp"
#include "mlopt/mlopt.h"
#include "program.hpp"

namespace mlopt {

// Device memory and events a communicator keeps between GPU runs (arena of tables, FIFOs and scratch).
struct CudaWorkspace;
struct CudaWorkspaceDeleter {
    void operator()(CudaWorkspace* workspace) const;
};
using CudaWorkspacePtr = std::unique_ptr<CudaWorkspace, CudaWorkspaceDeleter>;

// MLOPT_OK when a GPU run can start on this thread's current device; else MLOPT_ERR_UNSUPPORTED and the
// reason in `why` ("built without the CUDA backend", "no CUDA device: ...").
mlopt_status cuda_backend_available(std::string& why);

// Runs `program` once as one kernel launch: the GPU counterpart of run_program (interpreter.hpp), with the same
// request (request.ranks hold device-addressable pointers) and the same results, statuses and messages.
// Blocks until the kernel has finished. Creates `workspace` on first use.
RunResult run_program_cuda(const Program& program, const RunRequest& request, CudaWorkspacePtr& workspace);

}  // namespace mlopt

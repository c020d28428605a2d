// The CUDA backend's entry points in a library built without it (no -DMLOPT_CUDA=ON): every GPU request is
// answered MLOPT_ERR_UNSUPPORTED with the way to get it. See src/cuda/backend.cu for the real ones.
#ifndef MLOPT_HAVE_CUDA

#include "cuda_backend.hpp"

namespace mlopt {

struct CudaWorkspace {};

void CudaWorkspaceDeleter::operator()(CudaWorkspace* workspace) const { delete workspace; }

mlopt_status cuda_backend_available(std::string& why) {
    why = "this library was built without the CUDA backend (configure runtime/ with -DMLOPT_CUDA=ON where nvcc "
          "exists; pip: MLOPT_CMAKE_ARGS=-DMLOPT_CUDA=ON)";
    return MLOPT_ERR_UNSUPPORTED;
}

RunResult run_program_cuda(const Program&, const RunRequest&, CudaWorkspacePtr&) {
    RunResult result;
    result.status = cuda_backend_available(result.message);
    return result;
}

}  // namespace mlopt

#endif  // MLOPT_HAVE_CUDA

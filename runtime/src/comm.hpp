// The communicator behind mlopt_comm: in-process (mlopt_comm_create_local, comm.cpp) or one rank of a
// multi-process communicator (mlopt_comm_create, comm_mp.cpp; runs in run_rank.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_backend.hpp"
#include "interpreter.hpp"
#include "mlopt/mlopt.h"
#include "transport.hpp"

struct mlopt_comm_s {
    int32_t nranks = 0;
    std::mutex busy;              // held for the length of a run: one collective at a time
    mlopt::Workspace workspace;   // scratch and FIFO payloads, reused by the next run
    mlopt::CudaWorkspacePtr cuda_workspace;  // the CUDA backend's device memory, made by its first GPU run
    mlopt_run_stats last_stats{sizeof(mlopt_run_stats), 0, 0, 0, 0, 0.0, 0.0, MLOPT_BACKEND_CPU};

    // Multi-process communicators only.
    int32_t rank = -1;                            // this process's rank; -1: in-process communicator
    std::unique_ptr<mlopt::Transport> transport;  // streams to the other ranks
    uint64_t runs = 0;                            // runs started on this rank (message headers carry it)
    mlopt_status broken_status = MLOPT_OK;        // the first failed run: every later run returns it
    std::string broken;
};

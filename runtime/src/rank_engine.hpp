// The rank engine: runs ONE rank (program position) of an MSCCL-EF program over a Transport, for multi-process
// communicators (mlopt_comm_run_rank, run_rank.cpp) and the enforcer over them (enforcer.cpp). The semantics
// are the in-process interpreter's (interpreter.hpp; step data in step_ops.hpp): the same loop iterations and
// slices, cnt=0 steps move nothing, nops never signal, dependencies through per-threadblock flags.
//
// Threads: one per threadblock of the rank, each walking its steps for every loop iteration and blocking in
// the transport; flags and a condition variable order the rank's threadblocks.
//
// Messages are streamed: a sending step writes a fixed header (MessageHeader in rank_engine.cpp: run number,
// signature of the run, iteration, sending step, cnt, ...) and then its payload straight from its buffers into
// the transport's reserved spans; a receiving step checks the header and applies its operation straight from
// the peeked spans (forwarding steps write the outgoing stream in the same pass). No message is ever copied
// whole. A consequence: a step blocks while its message does not fit the FIFO, so a ring whose every rank sends
// first deadlocks when one message is larger than a FIFO (the executor's slots have the same limit); runs
// without chunk_bytes therefore get default_chunk_bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "interpreter.hpp"
#include "mlopt/mlopt.h"
#include "program.hpp"
#include "transport.hpp"

namespace mlopt {

// Largest message a run without chunk_bytes sends (see default_chunk_bytes): a quarter of the default
// shared-memory FIFO (mlopt_comm_options::shm_fifo_bytes, 4 MiB).
constexpr int64_t kDefaultMessageBytes = int64_t{1} << 20;

// The chunk_bytes a run uses when the caller gives none (<= 0): slices such that no message of `program` carries
// more than kDefaultMessageBytes. Depends only on the program and the dtype, so every rank picks the same.
int64_t default_chunk_bytes(const Program& program, mlopt_dtype dtype);

struct RankRunRequest {
    int32_t position = 0;        // the program position (gpu) this rank runs
    std::vector<int32_t> ranks;  // global rank of every program position (the enforcer's motif ranks); empty:
                                 // position p is rank p
    int32_t tag_base = 0;        // streams use tag tag_base + the threadblock's channel
    RankMemory memory;           // this position's input and output (chunk 0 of each)
    size_t chunk_elems = 0;      // elements per chunk (count / i_chunks)
    mlopt_dtype dtype = MLOPT_FLOAT32;
    mlopt_redop op = MLOPT_SUM;
    int32_t watchdog_ms = 10000;  // <= 0: 10000
    int64_t chunk_bytes = 0;      // <= 0: default_chunk_bytes
    uint64_t run = 0;             // carried by every message; a message of another run is refused
    // How `run` reads in messages ("run 7", "op 1 motif 0 (iteration 3)"); empty: "run N".
    std::function<std::string(uint64_t)> describe_run;
    // The status of a message of another run (the ranks run collectives in different orders): plain runs
    // MLOPT_ERR_MISMATCH; the enforcer reports motifs issued in different orders as a deadlock.
    mlopt_status out_of_order_status = MLOPT_ERR_MISMATCH;
    // Set by another thread to stop the run (MLOPT_ERR_INVALID_ARGUMENT, cancel_reason); checked every wait tick.
    const std::atomic<bool>* cancel = nullptr;
    std::string cancel_reason = "the run was cancelled";
};

struct RankRunResult : RunResult {
    // The run failed only because this rank's transport was aborted by another run on it (the enforcer runs
    // motifs on disjoint channels at once): that run's failure is the cause, and that run reports it.
    bool aborted_elsewhere = false;
};

// Runs request.position of `program` (validated, as every loaded plan is) over `transport`, whose rank must be
// the position's global rank. Blocks until every threadblock of the position finished every loop iteration or
// the run failed: MLOPT_ERR_MISMATCH (a peer runs another program, count, dtype, op, slicing or run),
// MLOPT_ERR_SEMANTIC (a message does not match its receiving step), MLOPT_ERR_DEADLOCK (nothing moved on this
// rank for watchdog_ms: the message lists what each unfinished threadblock waits for; or a peer failed:
// "peer failed: ..."). A failed run aborts the transport (transport.abort) so that the peers fail at once.
// Scratch comes from `workspace` (slot 0). Stats are this rank's. Never throws.
RankRunResult run_rank_program(const Program& program, const RankRunRequest& request, Transport& transport,
                               Workspace& workspace);

}  // namespace mlopt

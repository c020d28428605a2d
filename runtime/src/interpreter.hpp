// The CPU interpreter of MSCCL-EF programs: every rank is a set of threadblocks sharing this process's memory;
// threadblocks are resumable state machines run by a small pool of worker threads and talk through in-process
// FIFOs (one per (sender, receiver, channel)). Semantics: mlopt/sim/symbolic.py (step table, FIFO matching,
// dependencies) and the MSCCL executor (loop iterations over slices of every chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mlopt/mlopt.h"
#include "program.hpp"

namespace mlopt {

// An owned block of uninitialised memory, 64-byte aligned (a cache line: full-width vector loads, and two
// blocks never share a line between writers).
class Block {
public:
    Block() = default;
    explicit Block(size_t bytes);
    Block(Block&& other) noexcept : data_(std::move(other.data_)), capacity_(std::exchange(other.capacity_, 0)) {}
    Block& operator=(Block&& other) noexcept {
        data_ = std::move(other.data_);
        capacity_ = std::exchange(other.capacity_, 0);
        return *this;
    }
    std::byte* data() const { return data_.get(); }
    size_t capacity() const { return capacity_; }

private:
    struct Free {
        void operator()(std::byte* p) const;
    };
    std::unique_ptr<std::byte[], Free> data_;
    size_t capacity_ = 0;
};

// Memory kept between runs of one communicator (scratch buffers and FIFO message payloads), so that repeated
// collectives reuse pages already faulted in instead of mapping fresh ones every time. Not thread-safe: the
// interpreter calls it under its scheduler lock.
class Workspace {
public:
    // Rank `rank`'s scratch buffer of at least `bytes` (contents unspecified).
    std::byte* scratch(size_t rank, size_t bytes);
    // A payload of at least `bytes`: a spare one when there is one big enough, else a new one.
    Block take(size_t bytes);
    // Returns a payload for reuse.
    void give(Block block);

private:
    std::vector<Block> scratch_;
    std::vector<Block> spare_;
};

// Chunk 0 of one rank's input and output buffers (in-place runs: pointers into one allocation, as the caller
// laid them out).
struct RankMemory {
    std::byte* input = nullptr;
    std::byte* output = nullptr;
};

struct RunRequest {
    std::vector<RankMemory> ranks;  // one per gpu of the program
    size_t chunk_elems = 0;         // elements per chunk (count / i_chunks)
    mlopt_dtype dtype = MLOPT_FLOAT32;
    mlopt_redop op = MLOPT_SUM;
    int32_t watchdog_ms = 10000;  // <= 0: 10000
    int32_t fifo_slots = 0;       // messages in flight per connection; <= 0: unbounded
    int64_t chunk_bytes = 0;      // most bytes of a chunk per loop iteration; <= 0: whole chunks
    int32_t threads = 0;          // worker threads; <= 0: std::thread::hardware_concurrency()
    void* cuda_stream = nullptr;  // CUDA backend: cudaStream_t (NULL: default stream)
    int32_t cuda_block_threads = 0;  // CUDA backend: threads per block; <= 0: 512
};

struct RunResult {
    mlopt_status status = MLOPT_OK;
    std::string message;  // one line when status != MLOPT_OK
    mlopt_run_stats stats{};
};

// Runs `program` once over request.ranks (`program` must have passed validate_program, as every loaded
// plan has; request.ranks hold
// i_chunks/o_chunks chunks of request.chunk_elems elements each). Blocks until every threadblock has finished
// every loop iteration, a message does not match its receiving step (MLOPT_ERR_SEMANTIC), or the program
// deadlocks (MLOPT_ERR_DEADLOCK). Never throws.
RunResult run_program(const Program& program, const RunRequest& request, Workspace& workspace);

}  // namespace mlopt

// The data side of MSCCL-EF steps, shared by both CPU engines: interpreter.cpp (every rank in this process,
// messages are payload blocks) and rank_engine.cpp (one rank of a multi-process communicator, messages streamed
// through a Transport). One definition of what each step type does with its source, destination, received and
// sent bytes, of how a run splits chunks into loop iterations, and of the dependency flags (mlopt/sim/symbolic.py;
// the MSCCL executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mlopt/mlopt.h"
#include "program.hpp"

namespace mlopt {

// How a run splits every chunk into loop iterations (the executor's slices): iteration i covers elements
// [i * slice_elems, min((i + 1) * slice_elems, chunk_elems)) of each chunk.
struct LoopSlicing {
    size_t chunk_elems = 0;
    size_t slice_elems = 0;
    int64_t iterations = 0;

    LoopSlicing() = default;
    // chunk_bytes <= 0: whole chunks (one iteration); else at most chunk_bytes per chunk and iteration, but at
    // least one element.
    LoopSlicing(size_t chunk_elems, int64_t chunk_bytes, size_t elem_size);
    size_t offset(int64_t iteration) const { return static_cast<size_t>(iteration) * slice_elems; }
    size_t length(int64_t iteration) const;
};

// The value a threadblock's dependency flag takes once `step` of loop iteration `iteration` completed (a hasdep
// step, never a nop); a step waiting for (depid, deps) runs once depid's flag reaches flag_value(its
// iteration, deps).
inline int64_t flag_value(int64_t iteration, int64_t step) { return (iteration << 32) | step; }

// "rank 1 tb 0 step 3 (r)"
std::string step_label(int32_t rank, int32_t tb, size_t step, StepType type);

// The threadblocks a deadlock report names (also the CUDA backend's, device_program.cpp): the first kMaxListed
// described, "; "-separated, the rest counted ("; ... and N more threadblocks").
class ThreadblockList {
public:
    // Describes one more threadblock with describe() while the list has room, else only counts it.
    template <typename Describe>
    void add(Describe&& describe) {
        if (listed_ == kMaxListed) {
            ++more_;
            return;
        }
        if (listed_++ > 0) text_ += "; ";
        text_ += describe();
    }
    std::string text() const {
        return more_ > 0 ? text_ + "; ... and " + std::to_string(more_) + " more threadblocks" : text_;
    }

private:
    static constexpr size_t kMaxListed = 8;
    std::string text_;
    size_t listed_ = 0;
    size_t more_ = 0;
};

// Where one step's data lies in one loop iteration: cnt pieces (the slice of each of cnt consecutive chunks),
// which make up the step's message in order. Whole-chunk slices are one contiguous piece.
struct StepData {
    StepType type = StepType::nop;
    mlopt_dtype dtype = MLOPT_FLOAT32;
    mlopt_redop op = MLOPT_SUM;
    std::byte* src = nullptr;  // piece 0 of the source; NULL for steps that do not read it
    std::byte* dst = nullptr;  // piece 0 of the destination; NULL for steps that do not write it
    size_t stride = 0;         // bytes from one piece to the next in the buffers (a chunk)
    size_t piece_bytes = 0;
    size_t bytes = 0;          // all pieces: the message payload; 0 for cnt=0 steps and nops
};

// The step's data in `iteration`, given its rank's source and destination buffers (chunk 0 of each).
StepData step_data(const Step& st, std::byte* src_buffer, std::byte* dst_buffer, const LoopSlicing& slicing,
                   int64_t iteration, mlopt_dtype dtype, mlopt_redop op);

// Applies the step to message bytes [offset, offset + n) (n <= d.bytes - offset): `in` holds those bytes of the
// received message (steps that receive), `out` gets those bytes of the sent message (steps that send). A
// forwarding step may pass out == in (the received payload forwarded in place), else the two are disjoint.
// cpy and re have no message: they take the same byte ranges of their pieces (in and out NULL).
// Reducing steps (rrs, rrc, rrcs, re) need offset and n multiples of the element size and `in` (and, for rrs,
// `out`) aligned to it; s, r, rcs and cpy work on any byte range.
void apply_step(const StepData& d, size_t offset, size_t n, const std::byte* in, std::byte* out);

}  // namespace mlopt

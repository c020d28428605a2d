// The data side of MSCCL-EF steps (see step_ops.hpp).
#include "step_ops.hpp"

#include <algorithm>
#include <cstring>

#include "reduce.hpp"
#include "validate.hpp"

namespace mlopt {

LoopSlicing::LoopSlicing(size_t chunk, int64_t chunk_bytes, size_t elem_size) : chunk_elems(chunk), slice_elems(chunk) {
    if (chunk_bytes > 0) {
        const size_t per_slice = static_cast<size_t>(chunk_bytes) / elem_size;
        slice_elems = std::min(chunk, std::max<size_t>(per_slice, 1));
    }
    iterations = chunk == 0 ? 0 : static_cast<int64_t>((chunk + slice_elems - 1) / slice_elems);
}

size_t LoopSlicing::length(int64_t iteration) const { return std::min(slice_elems, chunk_elems - offset(iteration)); }

std::string step_label(int32_t rank, int32_t tb, size_t step, StepType type) {
    return "rank " + std::to_string(rank) + " tb " + std::to_string(tb) + " step " + std::to_string(step) + " (" +
           step_type_name(type) + ")";
}

StepData step_data(const Step& st, std::byte* src_buffer, std::byte* dst_buffer, const LoopSlicing& slicing,
                   int64_t iteration, mlopt_dtype dtype, mlopt_redop op) {
    StepData d;
    d.type = st.type;
    d.dtype = dtype;
    d.op = op;
    if (st.cnt <= 0 || st.type == StepType::nop) return d;  // moves nothing
    const size_t es = dtype_size(dtype);
    const size_t offset = slicing.offset(iteration);
    const size_t len = slicing.length(iteration);
    d.stride = slicing.chunk_elems * es;
    // Whole chunks: the cnt slices are one contiguous run, handled as one piece (one memcpy/reduce call).
    const bool contiguous = len == slicing.chunk_elems;
    d.piece_bytes = (contiguous ? len * static_cast<size_t>(st.cnt) : len) * es;
    d.bytes = len * static_cast<size_t>(st.cnt) * es;
    if (step_reads_src(st.type)) d.src = src_buffer + static_cast<size_t>(st.srcoff) * d.stride + offset * es;
    if (step_writes_dst(st.type)) d.dst = dst_buffer + static_cast<size_t>(st.dstoff) * d.stride + offset * es;
    return d;
}

namespace {

// One step on `len` bytes of one piece: src/dst at that place in the buffers, in/out at that place in the messages.
void apply_piece(const StepData& d, std::byte* src, std::byte* dst, const std::byte* in, std::byte* out, size_t len) {
    const size_t elems = len / dtype_size(d.dtype);
    switch (d.type) {
        case StepType::s: std::memcpy(out, src, len); break;
        case StepType::r: std::memcpy(dst, in, len); break;
        case StepType::rcs:
            std::memcpy(dst, in, len);
            if (out != in) std::memcpy(out, in, len);
            break;
        case StepType::rrs: reduce(d.dtype, d.op, out, in, src, elems); break;
        case StepType::rrc: reduce(d.dtype, d.op, dst, in, src, elems); break;
        case StepType::rrcs:
            if (out == in) {  // forwarded in place: one pass writes the message and the destination
                reduce_keep(d.dtype, d.op, dst, out, src, elems);
            } else {          // the same values: the reduction stored once, then copied into the outgoing message
                reduce(d.dtype, d.op, dst, in, src, elems);
                std::memcpy(out, dst, len);
            }
            break;
        case StepType::cpy:
            if (dst != src) std::memmove(dst, src, len);
            break;
        case StepType::re: reduce(d.dtype, d.op, dst, dst, src, elems); break;
        case StepType::nop: break;
    }
}

}  // namespace

void apply_step(const StepData& d, size_t offset, size_t n, const std::byte* in, std::byte* out) {
    while (n > 0) {
        const size_t piece = offset / d.piece_bytes;
        const size_t within = offset % d.piece_bytes;
        const size_t len = std::min(n, d.piece_bytes - within);
        const size_t at = piece * d.stride + within;
        apply_piece(d, d.src ? d.src + at : nullptr, d.dst ? d.dst + at : nullptr, in, out, len);
        offset += len;
        n -= len;
        if (in != nullptr) in += len;
        if (out != nullptr) out += len;
    }
}

}  // namespace mlopt

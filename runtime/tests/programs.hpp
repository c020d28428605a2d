// Hand-built MSCCL-EF programs and the buffers to run them on, shared by the tests of the two CPU engines:
// test_interpreter.cpp (mlopt_comm_run, every rank in this process) and test_rank_engine.cpp
// (mlopt_comm_run_rank, a thread per rank).
//
//   new_program, add_tb, add_step     a program, its threadblocks and their steps (I, O, S: the buffers)
//   ring_allgather, ring_allreduce    ring collectives; dependency_program: local steps ordered by deps only
//   as_plan                           a program as the C ABI hands it out (not validated)
//   make_buffers                      every rank's input and output in the executor's layout
//
// Header-only (inline), in namespace mlopt_test.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "handles.hpp"
#include "mlopt/mlopt.h"
#include "program.hpp"
#include "reduce.hpp"

namespace mlopt_test {

using mlopt::Buffer;
using mlopt::Program;
using mlopt::StepType;
using mlopt::Threadblock;

// ------------------------------------------------------------------------------------------------ programs

inline Program new_program(const std::string& coll, int32_t ngpus, int32_t i_chunks, int32_t o_chunks,
                           int32_t s_chunks, bool inplace = true, bool outofplace = true) {
    Program p;
    p.name = "test-" + coll;
    p.proto = "Simple";
    p.coll = coll;
    p.ngpus = ngpus;
    p.nchannels = 1;
    p.nchunksperloop = std::max(i_chunks, o_chunks);
    p.inplace = inplace;
    p.outofplace = outofplace;
    for (int32_t r = 0; r < ngpus; ++r) {
        mlopt::Gpu gpu;
        gpu.id = r;
        gpu.i_chunks = i_chunks;
        gpu.o_chunks = o_chunks;
        gpu.s_chunks = s_chunks;
        p.gpus.push_back(gpu);
    }
    return p;
}

inline Threadblock& add_tb(Program& p, int32_t rank, int32_t send, int32_t recv, int32_t chan = 0) {
    auto& tbs = p.gpus[rank].tbs;
    Threadblock tb;
    tb.id = static_cast<int32_t>(tbs.size());
    tb.send = send;
    tb.recv = recv;
    tb.chan = chan;
    tbs.push_back(tb);
    p.nchannels = std::max(p.nchannels, chan + 1);
    return tbs.back();
}

struct Dep {
    int32_t depid = -1;
    int32_t deps = -1;
    bool hasdep = false;
};

inline void add_step(Threadblock& tb, StepType type, Buffer srcbuf, int32_t srcoff, Buffer dstbuf, int32_t dstoff,
                     int32_t cnt = 1, Dep dep = {}) {
    mlopt::Step st;
    st.s = static_cast<int32_t>(tb.steps.size());
    st.type = type;
    st.srcbuf = srcbuf;
    st.srcoff = srcoff;
    st.dstbuf = dstbuf;
    st.dstoff = dstoff;
    st.cnt = cnt;
    st.depid = dep.depid;
    st.deps = dep.deps;
    st.hasdep = dep.hasdep;
    tb.steps.push_back(st);
}

inline int32_t mod(int32_t a, int32_t n) { return ((a % n) + n) % n; }

constexpr Buffer I = Buffer::input;
constexpr Buffer O = Buffer::output;
constexpr Buffer S = Buffer::scratch;

// Ring allgather: one tb per rank (send r+1, recv r-1) running cpy, s, rcs, r; chunk j of the output is rank
// j's input.
inline Program ring_allgather(int32_t n) {
    Program p = new_program("allgather", n, 1, n, 0);
    for (int32_t r = 0; r < n; ++r) {
        Threadblock& tb = add_tb(p, r, mod(r + 1, n), mod(r - 1, n));
        add_step(tb, StepType::cpy, I, 0, O, r);
        add_step(tb, StepType::s, I, 0, O, 0);
        for (int32_t k = 1; k < n; ++k) add_step(tb, k < n - 1 ? StepType::rcs : StepType::r, I, 0, O, mod(r - k, n));
    }
    return p;
}

// Ring allreduce (reduce-scatter then allgather) on `channels` rings, each ring owning n of the n*channels
// chunks: s, rrs, then rrcs (`fused`) or rrc + s (more step types covered), then rcs, r. With cnt > 1, every
// step moves cnt chunks (the pieces of a sliced message are then not contiguous).
inline Program ring_allreduce(int32_t n, int32_t channels = 1, bool fused = true, int32_t cnt = 1) {
    const int32_t chunks = n * channels * cnt;
    Program p = new_program("allreduce", n, chunks, chunks, 0);
    for (int32_t r = 0; r < n; ++r) {
        for (int32_t c = 0; c < channels; ++c) {
            Threadblock& tb = add_tb(p, r, mod(r + 1, n), mod(r - 1, n), c);
            auto chunk = [&](int32_t j) { return (c * n + mod(j, n)) * cnt; };
            add_step(tb, StepType::s, I, chunk(r - 1), O, 0, cnt);
            for (int32_t k = 1; k < n - 1; ++k) add_step(tb, StepType::rrs, I, chunk(r - 1 - k), O, 0, cnt);
            if (fused) {
                add_step(tb, StepType::rrcs, I, chunk(r), O, chunk(r), cnt);
            } else {
                add_step(tb, StepType::rrc, I, chunk(r), O, chunk(r), cnt);
                add_step(tb, StepType::s, O, chunk(r), O, 0, cnt);
            }
            for (int32_t k = 1; k < n; ++k)
                add_step(tb, k < n - 1 ? StepType::rcs : StepType::r, I, 0, O, chunk(r - k), cnt);
        }
    }
    return p;
}

// Two ranks, local steps ordered only by dependencies: each rank computes s0 = i0 + i1 (tb0 copies, tb1
// waits behind a nop and reduces), sends s0 to the peer, receives the peer's s0 into s1, then tb3 writes
// o0 = s0 + s1: the sum of all four input chunks. Also a cnt=0 send (no message). The step after the nop
// repeats its dependency, as the executor requires (it does not store nops).
inline Program dependency_program() {
    Program p = new_program("allreduce", 2, 2, 1, 2, false, true);
    for (int32_t r = 0; r < 2; ++r) {
        const int32_t peer = 1 - r;
        Threadblock& copier = add_tb(p, r, -1, -1);
        add_step(copier, StepType::cpy, I, 0, S, 0, 1, {-1, -1, true});
        add_step(copier, StepType::cpy, I, 1, S, 1, 1, {-1, -1, true});
        Threadblock& reducer = add_tb(p, r, -1, -1);
        add_step(reducer, StepType::nop, I, 0, O, 0, 0, {0, 1, false});
        add_step(reducer, StepType::re, S, 1, S, 0, 1, {0, 1, true});
        Threadblock& exchanger = add_tb(p, r, peer, peer);
        add_step(exchanger, StepType::s, S, 0, O, 0, 1, {1, 1, false});
        add_step(exchanger, StepType::s, S, 0, O, 0, 0);  // cnt=0: sends no message
        add_step(exchanger, StepType::r, I, 0, S, 1, 1, {-1, -1, true});
        Threadblock& finisher = add_tb(p, r, -1, -1);
        add_step(finisher, StepType::cpy, S, 0, O, 0, 1, {2, 2, false});
        add_step(finisher, StepType::re, S, 1, O, 0);
    }
    return p;
}

// A plan as the C ABI hands it out. Not validated: these programs exercise the engines, not the collective
// contracts or the executor's limits the loader enforces; the sanitizer build checks they index safely.
inline mlopt_plan_s as_plan(const Program& program) {
    mlopt_plan_s plan;
    plan.kind = MLOPT_PLAN_MSCCL_XML;
    plan.source = program.name + ".xml";
    plan.format = "msccl-ef";
    plan.planner = "collective";
    plan.program = program;
    return plan;
}

// ------------------------------------------------------------------------------------------------ buffers

// Every rank's input and output, allocated as mlopt_comm_run expects (in place: one allocation per rank in
// the executor's layout). Outputs start filled with 0xA5 bytes so that chunks nobody writes show.
struct Buffers {
    size_t count = 0;  // elements per rank's input
    size_t chunk = 0;  // elements per chunk
    size_t elem = 0;   // bytes per element
    std::vector<std::vector<uint64_t>> storage;
    std::vector<void*> inputs;
    std::vector<void*> outputs;
    std::vector<size_t> out_bytes;  // per rank: bytes of its output

    std::byte* in(size_t r) const { return static_cast<std::byte*>(inputs[r]); }
    std::byte* out(size_t r) const { return static_cast<std::byte*>(outputs[r]); }
};

inline Buffers make_buffers(const Program& p, size_t count, mlopt_dtype dtype, bool inplace) {
    Buffers b;
    b.count = count;
    b.elem = mlopt::dtype_size(dtype);
    b.chunk = count / static_cast<size_t>(p.gpus[0].i_chunks);
    const size_t n = p.gpus.size();
    b.storage.resize(2 * n);
    for (size_t r = 0; r < n; ++r) {
        const size_t in_bytes = static_cast<size_t>(p.gpus[r].i_chunks) * b.chunk * b.elem;
        const size_t out_bytes = static_cast<size_t>(p.gpus[r].o_chunks) * b.chunk * b.elem;
        b.out_bytes.push_back(out_bytes);
        auto alloc = [&](std::vector<uint64_t>& v, size_t bytes) {
            v.assign(bytes / 8 + 1, 0xA5A5A5A5A5A5A5A5ull);
            return reinterpret_cast<std::byte*>(v.data());
        };
        if (!inplace) {
            b.inputs.push_back(alloc(b.storage[2 * r], in_bytes));
            b.outputs.push_back(alloc(b.storage[2 * r + 1], out_bytes));
        } else if (p.coll == "allgather") {
            std::byte* base = alloc(b.storage[2 * r], out_bytes);
            b.outputs.push_back(base);
            b.inputs.push_back(base + r * in_bytes);
        } else if (p.coll == "reducescatter") {
            std::byte* base = alloc(b.storage[2 * r], in_bytes);
            b.inputs.push_back(base);
            b.outputs.push_back(base + r * out_bytes);
        } else {
            std::byte* base = alloc(b.storage[2 * r], std::max(in_bytes, out_bytes));
            b.inputs.push_back(base);
            b.outputs.push_back(base);
        }
    }
    return b;
}

}  // namespace mlopt_test

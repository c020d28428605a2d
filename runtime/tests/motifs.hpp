// What the enforcer tests share: test_enforcer.cpp (the in-process enforcer, a thread per rank) and
// test_enforcer_comm.cpp (an enforcer per communicator). kRanks ranks run float32 ops of kElems elements.
//
//   Spec, add           a motif as the tests write it, and mlopt_enforcer_add_motif of it
//   same, segment       per-position byte ranges; one segment of a 4-rank allreduce op
//   scatter_gather      a 4-rank allreduce op as a reduce-scatter, then an allgather
//   value, Buffers      every rank's op inputs (known values) and outputs
//   Outcome, outcome    what a rank's submit/wait calls returned, and how long they took
//
// Header-only (inline), in namespace mlopt_test.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"

namespace mlopt_test {

constexpr int32_t kRanks = 4;
constexpr size_t kElems = 64;               // float32 elements of every op buffer here
constexpr uint64_t kOpBytes = kElems * 4;  // 256 bytes

// A motif as the tests write it; `add` turns it into an mlopt_motif_desc.
struct Spec {
    int32_t op = 0;
    int32_t index = 0;
    int32_t seq = 0;
    std::vector<int32_t> ranks{0, 1, 2, 3};
    std::vector<int32_t> deps;
    uint64_t mask = 1;
    const mlopt::Plan* plan = nullptr;
    size_t count = 0;
    uint64_t op_bytes = kOpBytes;
    mlopt_motif_source source = MLOPT_MOTIF_FROM_OUTPUT;
    std::vector<std::vector<mlopt_byte_range>> gather, scatter;  // per position
};

struct Result {
    mlopt_status status = MLOPT_OK;
    std::string message;
};

inline Result add(mlopt_enforcer e, const Spec& s) {
    std::vector<mlopt_motif_position> positions(s.ranks.size());
    for (size_t p = 0; p < s.ranks.size(); ++p) {
        if (p < s.gather.size()) {
            positions[p].gather = s.gather[p].data();
            positions[p].gather_count = s.gather[p].size();
        }
        if (p < s.scatter.size()) {
            positions[p].scatter = s.scatter[p].data();
            positions[p].scatter_count = s.scatter[p].size();
        }
    }
    mlopt_motif_desc d{};
    d.struct_size = sizeof d;
    d.name = "m";
    d.op = s.op;
    d.index = s.index;
    d.seq = s.seq;
    d.program = s.plan ? s.plan->get() : nullptr;
    d.nranks = static_cast<int32_t>(s.ranks.size());
    d.ranks = s.ranks.data();
    d.deps = s.deps.data();
    d.deps_count = s.deps.size();
    d.channel_mask = s.mask;
    d.dtype = MLOPT_FLOAT32;
    d.redop = MLOPT_SUM;
    d.count = s.count;
    d.op_bytes = s.op_bytes;
    d.source = s.source;
    d.positions = positions.data();
    mlopt_error err = nullptr;
    Result r{mlopt_enforcer_add_motif(e, &d, &err), ""};
    if (err) r.message = mlopt_error_message(err);
    mlopt_error_free(err);
    return r;
}

// The same ranges on every position.
inline std::vector<std::vector<mlopt_byte_range>> same(size_t positions, std::vector<mlopt_byte_range> ranges) {
    return std::vector<std::vector<mlopt_byte_range>>(positions, ranges);
}

// Segment `seg` of `segs` of an allreduce op over 4 ranks, run by ring4_allreduce.xml (i_chunks 8).
inline Spec segment(const mlopt::Plan& plan, int32_t op, int32_t seg, int32_t segs, int32_t seq, uint64_t mask) {
    const uint64_t bytes = kOpBytes / segs;
    Spec s;
    s.op = op;
    s.index = seg;
    s.seq = seq;
    s.mask = mask;
    s.plan = &plan;
    s.count = bytes / 4;
    s.gather = same(kRanks, {{seg * bytes, 0, bytes}});
    s.scatter = s.gather;
    return s;
}

// A.1's ring all-reduce as one op's two motifs over its kRanks blocks: a reduce-scatter (index 0: the whole
// buffer in, the own block out), then (deps) an allgather (index 1: the own block in, every other block out).
// `rs_plan`: ring4_reducescatter_legacy.xml (i_chunks 8, o 2); `ag_plan`: ring4_allgather.xml (i_chunks 2, o 8).
struct ScatterGather {
    Spec rs, ag;
};

inline ScatterGather scatter_gather(const mlopt::Plan& rs_plan, const mlopt::Plan& ag_plan, int32_t op,
                                    int32_t rs_seq, int32_t ag_seq, uint64_t ag_mask) {
    constexpr uint64_t kBlock = kOpBytes / kRanks;
    ScatterGather m;
    m.rs.op = op;
    m.rs.seq = rs_seq;
    m.rs.plan = &rs_plan;
    m.rs.count = kElems;
    m.rs.gather = same(kRanks, {{0, 0, kOpBytes}});
    m.ag.op = op;
    m.ag.index = 1;
    m.ag.seq = ag_seq;
    m.ag.mask = ag_mask;
    m.ag.deps = {0};
    m.ag.plan = &ag_plan;
    m.ag.count = kBlock / 4;
    for (uint64_t p = 0; p < kRanks; ++p) {
        m.rs.scatter.push_back({{p * kBlock, 0, kBlock}});
        m.ag.gather.push_back({{p * kBlock, 0, kBlock}});
        std::vector<mlopt_byte_range> others;
        for (uint64_t j = 0; j < kRanks; ++j)
            if (j != p) others.push_back({j * kBlock, j * kBlock, kBlock});
        m.ag.scatter.push_back(others);
    }
    return m;
}

// Element i of op `op`'s input on `rank` in `iteration`: small integers, so float sums are exact in any order.
inline float value(int32_t rank, int32_t op, int64_t iteration, size_t i) {
    return static_cast<float>((rank + 1) * (op + 2) + static_cast<int64_t>(i % 7) - iteration);
}

// Each rank's buffers of each op.
struct Buffers {
    std::vector<std::vector<float>> in, out;  // [rank * ops + op]
    int32_t ops = 0;
    explicit Buffers(int32_t nops) : in(kRanks * nops, std::vector<float>(kElems)), out(in), ops(nops) {}
    // Inputs: value(); outputs: -1000.
    void fill(int64_t iteration) {
        for (int32_t r = 0; r < kRanks; ++r)
            for (int32_t o = 0; o < ops; ++o)
                for (size_t i = 0; i < kElems; ++i) {
                    in[r * ops + o][i] = value(r, o, iteration, i);
                    out[r * ops + o][i] = -1000.0f;
                }
    }
    float* input(int32_t r, int32_t o) { return in[r * ops + o].data(); }
    // Bad elements of an allreduce of op `o` over all ranks.
    int bad_sums(int32_t o, int64_t iteration) const {
        int bad = 0;
        for (int32_t r = 0; r < kRanks; ++r)
            for (size_t i = 0; i < kElems; ++i) {
                float want = 0;
                for (int32_t q = 0; q < kRanks; ++q) want += value(q, o, iteration, i);
                if (out[r * ops + o][i] != want) ++bad;
            }
        return bad;
    }
};

struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    double seconds = 0;
};

// Takes (and frees) the call's error object.
inline Outcome outcome(mlopt_status status, mlopt_error err, std::chrono::steady_clock::time_point since) {
    Outcome o{status, err ? mlopt_error_message(err) : "",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count()};
    mlopt_error_free(err);
    return o;
}

}  // namespace mlopt_test

// Tests of multi-process runs without processes: the in-memory transport (src/transport_memory.cpp), the rank
// engine (src/rank_engine.*) and mlopt_comm_run_rank (src/run_rank.cpp). Every rank is a communicator made by
// make_comm_for_test over one MemoryTransportGroup and runs on its own thread; outputs are compared bit for bit
// with the in-process interpreter's (mlopt_comm_run) on the same inputs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "comm.hpp"
#include "handles.hpp"
#include "mlopt/mlopt.h"
#include "program.hpp"
#include "programs.hpp"
#include "rank_engine.hpp"
#include "reduce.hpp"
#include "run_rank.hpp"
#include "transport.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace mlopt_test;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ------------------------------------------------------------------------------------------------ programs

// Rank 0 receives one chunk from rank 1, whose part of the program never sends it.
Program missing_send() {
    Program p = new_program("allgather", 2, 1, 2, 0, false);
    Threadblock& receiver = add_tb(p, 0, -1, 1);
    add_step(receiver, StepType::r, I, 0, O, 1);
    Threadblock& copier = add_tb(p, 1, -1, -1);
    add_step(copier, StepType::cpy, I, 0, O, 1);
    return p;
}

std::string data_path(const std::string& name) {
    const std::string local = "data/" + name;
    if (FILE* f = std::fopen(local.c_str(), "rb")) {
        std::fclose(f);
        return local;
    }
    const char* repo = std::getenv("MLOPT_REPO");
    return std::string(repo && *repo ? repo : "../..") + "/runtime/tests/data/" + name;
}

struct LoadedPlan {
    mlopt_plan plan = nullptr;
    explicit LoadedPlan(const std::string& file) {
        mlopt_error err = nullptr;
        if (mlopt_plan_load(data_path(file).c_str(), &plan, &err) != MLOPT_OK) {
            CHECK_EQ(std::string(mlopt_error_message(err)), "");
            plan = nullptr;
        }
        mlopt_error_free(err);
    }
    ~LoadedPlan() { mlopt_plan_free(plan); }
    LoadedPlan(const LoadedPlan&) = delete;
    LoadedPlan& operator=(const LoadedPlan&) = delete;
};

// ------------------------------------------------------------------------------------------------ buffers

// Finite values with fractions (reductions in the same order give the same bits; no NaN payloads to argue about).
void fill(Buffers& b, mlopt_dtype dtype, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    for (size_t r = 0; r < b.inputs.size(); ++r)
        for (size_t i = 0; i < b.count; ++i) {
            std::byte* at = b.in(r) + i * b.elem;
            const float v = dist(rng);
            uint16_t h = 0;
            int32_t k = static_cast<int32_t>(v * 100);
            switch (dtype) {
                case MLOPT_FLOAT32: std::memcpy(at, &v, 4); break;
                case MLOPT_INT32: std::memcpy(at, &k, 4); break;
                case MLOPT_FLOAT16: h = mlopt::float_to_half(v); std::memcpy(at, &h, 2); break;
                case MLOPT_BFLOAT16: h = mlopt::float_to_bfloat16(v); std::memcpy(at, &h, 2); break;
            }
        }
}

// ------------------------------------------------------------------------------------------------ runs
//
// CHECK is not thread-safe: rank threads return Outcomes, the main thread checks them.

mlopt_run_options options(int64_t chunk_bytes, int32_t watchdog_ms = 10000) {
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.chunk_bytes = chunk_bytes;
    o.watchdog_ms = watchdog_ms;
    return o;
}

struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    double seconds = 0;
    mlopt_run_stats stats{sizeof(mlopt_run_stats), 0, 0, 0, 0, 0.0, 0.0, 0};
};

// An error object comes with every failure and only then: else the outcome says so (and fails its check).
Outcome take(mlopt_status status, mlopt_error err, Clock::time_point since) {
    Outcome o;
    o.status = status;
    o.seconds = seconds_since(since);
    if (err != nullptr) o.message = mlopt_error_message(err);
    if ((err != nullptr) != (status != MLOPT_OK)) o.message += " [error object does not match the status]";
    mlopt_error_free(err);
    return o;
}

// n communicators over one in-memory transport group, as n processes would have them.
struct Ranks {
    std::unique_ptr<mlopt::MemoryTransportGroup> group;
    std::vector<mlopt_comm> comms;
    Ranks(int32_t n, size_t fifo_bytes) : group(mlopt::make_memory_transport_group(n, fifo_bytes)) {
        for (int32_t r = 0; r < n; ++r)
            comms.push_back(mlopt::make_comm_for_test(r, n, mlopt::borrow_transport(group->rank_view(r))));
    }
    ~Ranks() {
        for (mlopt_comm c : comms) mlopt_comm_free(c);
    }
    Ranks(const Ranks&) = delete;
    Ranks& operator=(const Ranks&) = delete;
};

// body(r) on a thread per rank, at once.
std::vector<Outcome> on_every_rank(int32_t n, const std::function<Outcome(int32_t)>& body) {
    std::vector<Outcome> outcomes(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r) threads.emplace_back([&, r] { outcomes[r] = body(r); });
    for (std::thread& t : threads) t.join();
    return outcomes;
}

Outcome run_rank(mlopt_comm comm, const mlopt_plan_s& plan, const Buffers& b, int32_t r, size_t count,
                 mlopt_dtype dtype, mlopt_redop op, const mlopt_run_options& o) {
    mlopt_error err = nullptr;
    const auto since = Clock::now();
    const mlopt_status s = mlopt_comm_run_rank(comm, &plan, b.inputs[r], b.outputs[r], count, dtype, op, &o, &err);
    Outcome out = take(s, err, since);
    mlopt_comm_last_stats(comm, &out.stats);
    return out;
}

Outcome run_local(const mlopt_plan_s& plan, Buffers& b, mlopt_dtype dtype, mlopt_redop op,
                  const mlopt_run_options& o) {
    mlopt_comm comm = nullptr;
    CHECK_EQ(mlopt_comm_create_local(plan.program.ngpus, &comm, nullptr), MLOPT_OK);
    mlopt_error err = nullptr;
    const auto since = Clock::now();
    const mlopt_status s = mlopt_comm_run(comm, &plan, b.inputs.data(), b.outputs.data(), b.count, dtype, op, &o, &err);
    Outcome out = take(s, err, since);
    mlopt_comm_last_stats(comm, &out.stats);
    mlopt_comm_free(comm);
    return out;
}

// Runs `plan` both ways on the same inputs and compares every output byte (and the step/message counters).
void compare(const std::string& what, const mlopt_plan_s& plan, size_t count, mlopt_dtype dtype, mlopt_redop op,
             bool inplace, int64_t chunk_bytes, size_t fifo_bytes) {
    const Program& p = plan.program;
    const int32_t n = p.ngpus;
    const std::string label = what + " " + mlopt::dtype_name(dtype) + " " + mlopt::redop_name(op) +
                              (inplace ? " in-place" : "") + " chunk_bytes=" + std::to_string(chunk_bytes) +
                              " fifo=" + std::to_string(fifo_bytes);
    Buffers want = make_buffers(p, count, dtype, inplace);
    fill(want, dtype, 7u + static_cast<uint32_t>(count));
    Buffers got = make_buffers(p, count, dtype, inplace);
    for (int32_t r = 0; r < n; ++r) std::memcpy(got.in(r), want.in(r), count * want.elem);
    const mlopt_run_options o = options(chunk_bytes);
    const Outcome local = run_local(plan, want, dtype, op, o);
    if (!CHECK_EQ(local.message, "")) return;
    Ranks ranks(n, fifo_bytes);
    const std::vector<Outcome> outs =
        on_every_rank(n, [&](int32_t r) { return run_rank(ranks.comms[r], plan, got, r, count, dtype, op, o); });
    int64_t steps = 0, messages = 0;
    for (int32_t r = 0; r < n; ++r) {
        if (!outs[r].message.empty()) std::fprintf(stderr, "%s: rank %d failed\n", label.c_str(), r);
        if (!CHECK_EQ(outs[r].message, "")) return;
        steps += outs[r].stats.steps_executed;
        messages += outs[r].stats.messages;
        const bool same = std::memcmp(got.out(r), want.out(r), want.out_bytes[r]) == 0 &&
                          std::memcmp(got.in(r), want.in(r), count * want.elem) == 0;
        if (!same) std::fprintf(stderr, "%s: rank %d differs\n", label.c_str(), r);
        CHECK(same);
    }
    if (chunk_bytes > 0) {  // the same slicing: the same work
        CHECK_EQ(steps, local.stats.steps_executed);
        CHECK_EQ(messages, local.stats.messages);
        CHECK_EQ(outs[0].stats.loop_iterations, local.stats.loop_iterations);
    }
}


// A one-way chain: rank 0 sends (s), the middle ranks reduce and forward (rrs), the last one reduces into its
// output (rrc). With a whole chunk per iteration, each message is many FIFOs long: it must stream.
Program reduce_chain(int32_t n) {
    Program p = new_program("allreduce", n, 1, 1, 0, false);
    for (int32_t r = 0; r < n; ++r) {
        Threadblock& tb = add_tb(p, r, r + 1 < n ? r + 1 : -1, r > 0 ? r - 1 : -1);
        add_step(tb, r == 0 ? StepType::s : r + 1 < n ? StepType::rrs : StepType::rrc, I, 0, O, 0);
    }
    return p;
}

// ------------------------------------------------------------------------------------------------ tests

// Streams: ordered bytes through a ring much smaller than the data, bad peers and tags, deadlines.
void test_memory_transport() {
    auto group = mlopt::make_memory_transport_group(3, 64);
    mlopt::Transport& a = group->rank_view(0);
    mlopt::Transport& b = group->rank_view(1);
    CHECK_EQ(a.rank(), 0);
    CHECK_EQ(b.nranks(), 3);
    CHECK_EQ(std::string(a.peer_kind(0)), "self");
    CHECK_EQ(std::string(a.peer_kind(1)), "local");
    const auto far = mlopt::TransportClock::now() + std::chrono::seconds(5);
    std::string why;
    mlopt::SendStream* out = nullptr;
    mlopt::RecvStream* in = nullptr;
    CHECK(a.send_stream(3, 0, &out, far, why) == mlopt::TransportWait::failed);
    CHECK_CONTAINS(why, "rank 3 is not in 0..2");
    CHECK(a.send_stream(1, mlopt::kMaxTags, &out, far, why) == mlopt::TransportWait::failed);
    CHECK_CONTAINS(why, "tag 4096");
    REQUIRE(b.recv_stream(0, 7, &in, far, why) == mlopt::TransportWait::ok);  // the reader's end first
    REQUIRE(a.send_stream(1, 7, &out, far, why) == mlopt::TransportWait::ok);
    // 10000 bytes through a 64-byte ring: order kept across many wraps.
    constexpr size_t kBytes = 10000;
    std::thread writer([&] {
        std::string w;
        for (size_t done = 0; done < kBytes;) {
            std::byte* span = nullptr;
            size_t n = 0;
            if (out->reserve(std::min<size_t>(kBytes - done, 37), &span, &n, far, w) != mlopt::TransportWait::ok) return;
            for (size_t i = 0; i < n; ++i) span[i] = static_cast<std::byte>((done + i) * 7 % 251);
            out->commit(n, w);
            done += n;
        }
    });
    size_t bad = 0;
    for (size_t done = 0; done < kBytes;) {
        const std::byte* span = nullptr;
        size_t n = 0;
        if (!CHECK(in->peek(kBytes - done, &span, &n, far, why) == mlopt::TransportWait::ok)) break;
        CHECK(n > 0 && n <= 64);
        for (size_t i = 0; i < n; ++i) bad += span[i] != static_cast<std::byte>((done + i) * 7 % 251);
        in->consume(n);
        done += n;
    }
    writer.join();
    CHECK_EQ(bad, size_t{0});
    // Deadlines: an empty ring times out for the reader, a full one for the writer.
    const std::byte* span = nullptr;
    size_t n = 0;
    const auto since = Clock::now();
    CHECK(in->peek(8, &span, &n, mlopt::TransportClock::now() + std::chrono::milliseconds(30), why) ==
          mlopt::TransportWait::timeout);
    CHECK(seconds_since(since) >= 0.025);
    std::byte* wspan = nullptr;
    for (size_t filled = 0; filled < 64; filled += n) {  // two spans: the ring wraps at 10000 % 64 = 16
        REQUIRE(out->reserve(64 - filled, &wspan, &n, far, why) == mlopt::TransportWait::ok);
        CHECK_EQ(n, filled == 0 ? size_t{48} : size_t{16});
        CHECK(out->commit(n, why) == mlopt::TransportWait::ok);
    }
    CHECK(out->reserve(1, &wspan, &n, mlopt::TransportClock::now() + std::chrono::milliseconds(10), why) ==
          mlopt::TransportWait::timeout);
}

// An abort wakes the peer's wait at once, naming the rank and the reason; the aborting rank's own waits fail;
// streams between healthy ranks go on.
void test_memory_transport_abort() {
    auto group = mlopt::make_memory_transport_group(3, 64);
    mlopt::Transport& a = group->rank_view(0);
    mlopt::Transport& b = group->rank_view(1);
    const auto far = mlopt::TransportClock::now() + std::chrono::seconds(5);
    std::string why;
    mlopt::SendStream* out = nullptr;
    mlopt::RecvStream* in = nullptr;
    REQUIRE(a.send_stream(1, 0, &out, far, why) == mlopt::TransportWait::ok);
    REQUIRE(b.recv_stream(0, 0, &in, far, why) == mlopt::TransportWait::ok);
    std::byte* wspan = nullptr;
    const std::byte* span = nullptr;
    size_t n = 0;
    REQUIRE(out->reserve(64, &wspan, &n, far, why) == mlopt::TransportWait::ok);
    CHECK(out->commit(n, why) == mlopt::TransportWait::ok);
    mlopt::RecvStream* from_two = nullptr;
    REQUIRE(b.recv_stream(2, 0, &from_two, far, why) == mlopt::TransportWait::ok);
    std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        group->rank_view(2).abort("simulated crash");
    });
    const auto since = Clock::now();
    std::string reason;
    CHECK(from_two->peek(8, &span, &n, far, reason) == mlopt::TransportWait::failed);
    killer.join();
    CHECK(seconds_since(since) < 2.0);
    CHECK_EQ(reason, "rank 2 aborted: simulated crash");
    CHECK_EQ(group->rank_view(2).aborted(), "simulated crash");
    CHECK_EQ(a.aborted(), "");
    group->rank_view(2).abort("second reason");  // idempotent: the first reason stays
    CHECK_EQ(group->rank_view(2).aborted(), "simulated crash");
    mlopt::SendStream* two_out = nullptr;
    REQUIRE(group->rank_view(2).send_stream(0, 0, &two_out, far, why) == mlopt::TransportWait::ok);
    CHECK(two_out->reserve(8, &wspan, &n, far, why) == mlopt::TransportWait::failed);
    CHECK_CONTAINS(why, "this rank (2) aborted");
    CHECK(in->peek(64, &span, &n, far, why) == mlopt::TransportWait::ok && n == 64);
}

void test_reference_xmls() {
    const char* files[] = {
        "ring4_allreduce.xml",          "ring4_allgather.xml",           "ring4_alltoall.xml",
        "ring4_reducescatter_legacy.xml", "switch4_broadcast_legacy.xml", "ndv2_allreduce_tree.xml",
        "ndv2_allgather_taccl.xml",     "msccl-scheduler_ncv4_ag_hier_4_LL.xml", "rccl_alltoall-8n-0-9kb.xml",
        "handmade_nop_deps_2gpu.xml",
    };
    for (const char* file : files) {
        LoadedPlan loaded(file);
        if (loaded.plan == nullptr) continue;
        const Program& p = loaded.plan->program;
        const bool reduces = p.coll == "allreduce" || p.coll == "reducescatter" || p.coll == "reduce";
        const mlopt_dtype dtype = reduces ? MLOPT_FLOAT32 : MLOPT_FLOAT16;
        const size_t count = static_cast<size_t>(p.gpus[0].i_chunks) * 300;
        for (const bool inplace : {false, true})
            if (inplace ? p.inplace : p.outofplace) compare(file, *loaded.plan, count, dtype, MLOPT_SUM, inplace, 256, 4096);
        compare(file, *loaded.plan, count, MLOPT_BFLOAT16, MLOPT_MAX, false, 0, size_t{1} << 20);
    }
}

// Every step type, dtype and op; slicing with a remainder; cnt=2 pieces; in place; dependencies.
void test_programs() {
    const mlopt_plan_s fused = as_plan(ring_allreduce(4));
    const mlopt_plan_s split = as_plan(ring_allreduce(3, 2, false));
    for (const mlopt_dtype dtype : {MLOPT_FLOAT32, MLOPT_FLOAT16, MLOPT_BFLOAT16, MLOPT_INT32})
        for (const mlopt_redop op : {MLOPT_SUM, MLOPT_PROD, MLOPT_MAX, MLOPT_MIN}) {
            compare("ring allreduce", fused, 4 * 250, dtype, op, false, 96, 4096);
            compare("ring allreduce rrc+s 2 channels", split, 6 * 250, dtype, op, true, 200, 4096);
        }
    // 1000 floats per chunk in slices of 96: 11 iterations, the last one 40 elements.
    compare("ring allreduce sliced", fused, 4 * 1000, MLOPT_FLOAT32, MLOPT_SUM, true, 384, 4096);
    compare("ring allreduce cnt=2", as_plan(ring_allreduce(3, 1, true, 2)), 6 * 333, MLOPT_FLOAT16, MLOPT_SUM,
            false, 100, 4096);
    const mlopt_plan_s gather = as_plan(ring_allgather(5));
    for (const bool inplace : {false, true}) compare("ring allgather", gather, 777, MLOPT_INT32, MLOPT_SUM, inplace, 500, 4096);
    const mlopt_plan_s deps = as_plan(dependency_program());
    for (const int64_t chunk_bytes : {int64_t{0}, int64_t{12}})
        compare("dependencies", deps, 2 * 50, MLOPT_FLOAT32, MLOPT_SUM, false, chunk_bytes, 4096);
    // A smaller slice than one element still moves one per iteration.
    compare("ring allreduce 1-byte slices", as_plan(ring_allreduce(2)), 2 * 7, MLOPT_FLOAT16, MLOPT_MAX, true, 1, 4096);
}

// FIFOs of odd sizes wrap inside elements and hand out unaligned spans: reductions go through the bounce
// buffers, copies do not care.
void test_unaligned_fifos() {
    const mlopt_plan_s fused = as_plan(ring_allreduce(4));
    for (const mlopt_dtype dtype : {MLOPT_FLOAT32, MLOPT_FLOAT16, MLOPT_BFLOAT16, MLOPT_INT32}) {
        compare("ring allreduce odd FIFO", fused, 4 * 1001, dtype, MLOPT_SUM, false, 1000, 4099);
        compare("reduce chain odd FIFO", as_plan(reduce_chain(3)), 5003, dtype, MLOPT_MIN, false, 0, 1031);
    }
    compare("ring allgather odd FIFO", as_plan(ring_allgather(3)), 999, MLOPT_FLOAT16, MLOPT_SUM, true, 333, 4097);
}

// Messages many FIFOs long stream through (64 KiB messages, 4 KiB FIFOs); the default slicing keeps messages
// of big buffers within a MiB.
void test_streaming() {
    compare("reduce chain 64 KiB", as_plan(reduce_chain(4)), 16384, MLOPT_FLOAT32, MLOPT_SUM, false, 1 << 20, 4096);
    const mlopt_plan_s fused = as_plan(ring_allreduce(4));
    compare("ring allreduce default slicing", fused, 4 * 300000, MLOPT_FLOAT32, MLOPT_SUM, false, 0, size_t{4} << 20);
    CHECK_EQ(mlopt::default_chunk_bytes(fused.program, MLOPT_FLOAT32), mlopt::kDefaultMessageBytes);
    CHECK_EQ(mlopt::default_chunk_bytes(ring_allreduce(3, 1, true, 2), MLOPT_FLOAT16), mlopt::kDefaultMessageBytes / 2);
}

// Several runs in a row on the same communicators (the run number advances on every rank).
void test_repeated_runs() {
    const mlopt_plan_s plan = as_plan(ring_allreduce(3));
    Ranks ranks(3, 4096);
    for (int run = 0; run < 3; ++run) {
        const size_t count = 3 * static_cast<size_t>(100 + run);
        Buffers b = make_buffers(plan.program, count, MLOPT_INT32, run == 1);
        fill(b, MLOPT_INT32, static_cast<uint32_t>(run));
        std::vector<int64_t> want(count, 0);
        for (int32_t r = 0; r < 3; ++r)
            for (size_t i = 0; i < count; ++i) {
                int32_t v;
                std::memcpy(&v, b.in(r) + 4 * i, 4);
                want[i] += v;
            }
        const auto outs = on_every_rank(3, [&](int32_t r) {
            return run_rank(ranks.comms[r], plan, b, r, count, MLOPT_INT32, MLOPT_SUM, options(128));
        });
        for (int32_t r = 0; r < 3; ++r) {
            CHECK_EQ(outs[r].message, "");
            size_t wrong = 0;
            for (size_t i = 0; i < count; ++i) {
                int32_t v;
                std::memcpy(&v, b.out(r) + 4 * i, 4);
                wrong += v != want[i];
            }
            CHECK_EQ(wrong, size_t{0});
            // Stats: 5 steps per iteration, 4 of them send; 4 bytes per element.
            const int64_t iterations = outs[r].stats.loop_iterations;
            CHECK_EQ(iterations, static_cast<int64_t>((count / 3 * 4 + 127) / 128));
            CHECK_EQ(outs[r].stats.steps_executed, 5 * iterations);
            CHECK_EQ(outs[r].stats.messages, 4 * iterations);
            CHECK_EQ(outs[r].stats.backend, static_cast<int32_t>(MLOPT_BACKEND_CPU));
            CHECK(outs[r].stats.bytes_moved > 0 && outs[r].stats.wall_us > 0);
        }
    }
    for (mlopt_comm c : ranks.comms) CHECK_EQ(c->runs, uint64_t{3});
}

// Runs every rank with its own count/dtype/plan; returns the outcomes.
struct Side {
    const mlopt_plan_s* plan;
    size_t count;
    mlopt_dtype dtype;
};

std::vector<Outcome> run_sides(Ranks& ranks, const std::vector<Side>& sides, int32_t watchdog_ms = 10000) {
    std::vector<Buffers> buffers;
    for (const Side& s : sides) {
        buffers.push_back(make_buffers(s.plan->program, s.count, s.dtype, false));
        fill(buffers.back(), s.dtype, 3);
    }
    return on_every_rank(static_cast<int32_t>(sides.size()), [&](int32_t r) {
        return run_rank(ranks.comms[r], *sides[r].plan, buffers[r], r, sides[r].count, sides[r].dtype, MLOPT_SUM,
                        options(0, watchdog_ms));
    });
}

// The ranks that found the mismatch report it with both sides named; the others see a failed peer.
void expect_mismatch(const std::vector<Outcome>& outs, mlopt_status status, std::initializer_list<const char*> parts) {
    int found = 0;
    for (const Outcome& o : outs) {
        CHECK(o.seconds < 5.0);
        if (o.status == status) {
            ++found;
            for (const char* part : parts) CHECK_CONTAINS(o.message, part);
        } else {
            CHECK_EQ(o.status, MLOPT_ERR_DEADLOCK);
            CHECK_CONTAINS(o.message, "peer failed");
        }
    }
    CHECK(found > 0);
}

void test_mismatches() {
    const mlopt_plan_s ring = as_plan(ring_allreduce(2));
    {
        Ranks ranks(2, 4096);
        expect_mismatch(run_sides(ranks, {{&ring, 1024, MLOPT_FLOAT32}, {&ring, 2048, MLOPT_FLOAT32}}),
                        MLOPT_ERR_MISMATCH,
                        {"'test-allreduce' count=1024 float32 sum", "'test-allreduce' count=2048 float32 sum",
                         "rank 0 ", "rank 1 ", "sent for"});
    }
    {
        Ranks ranks(2, 4096);
        expect_mismatch(run_sides(ranks, {{&ring, 64, MLOPT_FLOAT32}, {&ring, 64, MLOPT_INT32}}), MLOPT_ERR_MISMATCH,
                        {"count=64 float32 sum", "count=64 int32 sum"});
    }
    {
        Program renamed = ring_allreduce(2);
        renamed.name = "x";
        const mlopt_plan_s other = as_plan(renamed);
        Ranks ranks(2, 4096);
        expect_mismatch(run_sides(ranks, {{&ring, 64, MLOPT_FLOAT32}, {&other, 64, MLOPT_FLOAT32}}), MLOPT_ERR_MISMATCH,
                        {"'test-allreduce'", "'x'"});
    }
    {
        Ranks ranks(2, 4096);
        ranks.comms[1]->runs = 5;  // rank 1 ran five collectives the other did not
        expect_mismatch(run_sides(ranks, {{&ring, 64, MLOPT_FLOAT32}, {&ring, 64, MLOPT_FLOAT32}}), MLOPT_ERR_MISMATCH,
                        {"different orders", "run 1", "run 6"});
    }
    {
        // The same program on both sides, but its send and receive disagree (only hand-built programs can).
        Program p = new_program("allgather", 2, 2, 4, 0, false);
        add_step(add_tb(p, 0, 1, -1), StepType::s, I, 0, O, 0, 2);
        add_step(add_tb(p, 1, -1, 0), StepType::r, I, 0, O, 0, 1);
        const mlopt_plan_s plan = as_plan(p);
        Ranks ranks(2, 4096);
        const auto outs = run_sides(ranks, {{&plan, 64, MLOPT_FLOAT32}, {&plan, 64, MLOPT_FLOAT32}});
        CHECK_EQ(outs[1].status, MLOPT_ERR_SEMANTIC);
        CHECK_CONTAINS(outs[1].message, "rank 1 tb 0 step 0 (r) of loop iteration 0 receives cnt=1 but the matching "
                                        "send rank 0 tb 0 step 0 (s) has cnt=2");
    }
}

void test_deadlock_and_peer_failure() {
    {
        const mlopt_plan_s plan = as_plan(missing_send());
        Ranks ranks(2, 4096);
        const auto outs = run_sides(ranks, {{&plan, 64, MLOPT_FLOAT32}, {&plan, 64, MLOPT_FLOAT32}}, 300);
        CHECK_EQ(outs[0].status, MLOPT_ERR_DEADLOCK);
        CHECK_CONTAINS(outs[0].message, "deadlock: nothing moved on rank 0 for 300 ms: rank 0 tb 0 step 0 (r) of loop "
                                        "iteration 0 waits for a message from rank 1 on channel 0");
        CHECK(outs[0].seconds >= 0.25 && outs[0].seconds < 3.0);
        CHECK_EQ(outs[1].message, "");
        // Broken: the next run fails at once with the first failure.
        Buffers b = make_buffers(plan.program, 64, MLOPT_FLOAT32, false);
        const Outcome again = run_rank(ranks.comms[0], plan, b, 0, 64, MLOPT_FLOAT32, MLOPT_SUM, options(0));
        CHECK_EQ(again.status, MLOPT_ERR_DEADLOCK);
        CHECK_CONTAINS(again.message, "broken by an earlier failed run");
        CHECK_CONTAINS(again.message, "waits for a message from rank 1");
        CHECK(again.seconds < 0.5);
    }
    {
        // Rank 0 "dies" (aborts its transport) instead of running: the others fail within a tick, not at their
        // 10 s watchdog, with its reason.
        const mlopt_plan_s plan = as_plan(ring_allreduce(3));
        Ranks ranks(3, 4096);
        Buffers b = make_buffers(plan.program, 3 * 64, MLOPT_FLOAT32, false);
        const auto outs = on_every_rank(3, [&](int32_t r) {
            if (r == 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                ranks.group->rank_view(0).abort("simulated crash (pid 123 exited)");
                return Outcome{};
            }
            return run_rank(ranks.comms[r], plan, b, r, 3 * 64, MLOPT_FLOAT32, MLOPT_SUM, options(0));
        });
        for (int32_t r = 1; r < 3; ++r) {
            CHECK_EQ(outs[r].status, MLOPT_ERR_DEADLOCK);
            CHECK_CONTAINS(outs[r].message, "peer failed");
            CHECK_CONTAINS(outs[r].message, "simulated crash (pid 123 exited)");
            CHECK(outs[r].seconds < 2.0);
            const Outcome again = run_rank(ranks.comms[r], plan, b, r, 3 * 64, MLOPT_FLOAT32, MLOPT_SUM, options(0));
            CHECK_EQ(again.status, MLOPT_ERR_DEADLOCK);
            CHECK_CONTAINS(again.message, "simulated crash");
        }
    }
}

void test_argument_errors() {
    const mlopt_plan_s plan = as_plan(ring_allreduce(2));
    Ranks ranks(2, 4096);
    Buffers b = make_buffers(plan.program, 64, MLOPT_FLOAT32, false);
    auto call = [&](mlopt_comm comm, const mlopt_plan_s* p, const void* in, void* out, size_t count,
                    const mlopt_run_options* o) {
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_comm_run_rank(comm, p, in, out, count, MLOPT_FLOAT32, MLOPT_SUM, o, &err);
        return take(status, err, Clock::now());
    };
    const mlopt_run_options o = options(0);
    Outcome r = call(nullptr, &plan, b.in(0), b.out(0), 64, &o);
    CHECK_EQ(r.status, MLOPT_ERR_INVALID_ARGUMENT);
    r = call(ranks.comms[0], nullptr, b.in(0), b.out(0), 64, &o);
    CHECK_CONTAINS(r.message, "plan is NULL");
    r = call(ranks.comms[0], &plan, b.in(0), b.out(0), 63, &o);
    CHECK_CONTAINS(r.message, "count=63 is not a multiple of the program's i_chunks=2");
    r = call(ranks.comms[0], &plan, b.in(0) + 1, b.out(0), 64, &o);
    CHECK_CONTAINS(r.message, "input or output is not aligned to 4 bytes (float32)");
    r = call(ranks.comms[0], &plan, nullptr, b.out(0), 64, &o);
    CHECK_CONTAINS(r.message, "input or output is NULL");
    r = call(ranks.comms[0], &plan, b.in(0), b.in(0) + 4, 64, &o);
    CHECK_CONTAINS(r.message, "input overlaps output but is not equal to it");
    mlopt_run_options cuda = o;
    cuda.backend = MLOPT_BACKEND_CUDA;
    r = call(ranks.comms[0], &plan, b.in(0), b.out(0), 64, &cuda);
    CHECK_EQ(r.status, MLOPT_ERR_UNSUPPORTED);
    CHECK_CONTAINS(r.message, "CPU backend only");
    const mlopt_plan_s three = as_plan(ring_allreduce(3));
    r = call(ranks.comms[0], &three, b.in(0), b.out(0), 66, &o);
    CHECK_EQ(r.status, MLOPT_ERR_MISMATCH);
    CHECK_CONTAINS(r.message, "ngpus=3");
    mlopt_comm local = nullptr;
    CHECK_EQ(mlopt_comm_create_local(2, &local, nullptr), MLOPT_OK);
    r = call(local, &plan, b.in(0), b.out(0), 64, &o);
    CHECK_EQ(r.status, MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(r.message, "use mlopt_comm_run");
    mlopt_comm_free(local);
    mlopt_error err = nullptr;
    const mlopt_status status =
        mlopt_comm_run(ranks.comms[0], &plan, b.inputs.data(), b.outputs.data(), 64, MLOPT_FLOAT32, MLOPT_SUM, &o, &err);
    r = take(status, err, Clock::now());
    CHECK_EQ(r.status, MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(r.message, "use mlopt_comm_run_rank");
    // None of these broke the communicator or counted as a run.
    CHECK_EQ(ranks.comms[0]->broken_status, MLOPT_OK);
    CHECK_EQ(ranks.comms[0]->runs, uint64_t{0});
    // count = 0: nothing to do, on every rank.
    const auto outs = on_every_rank(2, [&](int32_t rank) {
        return run_rank(ranks.comms[rank], plan, b, rank, 0, MLOPT_FLOAT32, MLOPT_SUM, o);
    });
    for (const Outcome& out : outs) CHECK(out.status == MLOPT_OK && out.stats.steps_executed == 0);
}

}  // namespace

int main() {
    const std::vector<std::pair<const char*, void (*)()>> tests = {
        {"memory transport", test_memory_transport},
        {"memory transport abort", test_memory_transport_abort},
        {"reference XMLs", test_reference_xmls},
        {"programs", test_programs},
        {"unaligned FIFOs", test_unaligned_fifos},
        {"streaming", test_streaming},
        {"repeated runs", test_repeated_runs},
        {"mismatches", test_mismatches},
        {"deadlock and peer failure", test_deadlock_and_peer_failure},
        {"argument errors", test_argument_errors},
    };
    for (const auto& [name, fn] : tests) {
        const auto start = Clock::now();
        const int before = check::failures();
        fn();
        std::printf("%-28s %s (%.2f s)\n", name, check::failures() == before ? "ok" : "FAILED", seconds_since(start));
    }
    return check::finish("test_rank_engine");
}

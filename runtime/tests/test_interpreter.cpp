// Tests of the CPU interpreter (src/interpreter.*, src/comm.cpp, src/reduce.*): hand-built MSCCL-EF programs
// run through mlopt_comm_run and checked against results computed directly here; the reference XMLs through
// mlopt_plan_load when the loader is built in.
//
// `test_interpreter bench [KiB] [chunk_bytes] [threads] [fifo_slots]` instead times a 4-rank ring allreduce
// of float32 (default 65536 KiB = 64 MiB per rank) and prints the bandwidths and the time per step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "handles.hpp"
#include "interpreter.hpp"
#include "mlopt/mlopt.h"
#include "program.hpp"
#include "programs.hpp"
#include "reduce.hpp"

// The loader may not be linked into this build yet: the XML tests skip when it is missing.
#pragma weak mlopt_plan_load
#pragma weak mlopt_plan_free

namespace {

using namespace mlopt_test;

int g_failures = 0;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            ++g_failures;                                                   \
            std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                              \
            std::fprintf(stderr, "\n");                                     \
        }                                                                   \
    } while (0)

// ------------------------------------------------------------------------------------------------ programs

// Ring reduce-scatter: output chunk 0 of rank r is the sum of every rank's input chunk r (in place: the output
// is input chunk r itself, so the last step reduces onto its own source).
Program ring_reducescatter(int32_t n) {
    Program p = new_program("reducescatter", n, n, 1, 0);
    for (int32_t r = 0; r < n; ++r) {
        Threadblock& tb = add_tb(p, r, mod(r + 1, n), mod(r - 1, n));
        add_step(tb, StepType::s, I, mod(r - 1, n), O, 0);
        for (int32_t k = 1; k < n - 1; ++k) add_step(tb, StepType::rrs, I, mod(r - 1 - k, n), O, 0);
        add_step(tb, StepType::rrc, I, r, O, 0);
    }
    return p;
}

// Alltoall: output chunk j of rank r is input chunk r of rank j; one tb per peer plus a local copy.
Program alltoall(int32_t n) {
    Program p = new_program("alltoall", n, n, n, 0, false, true);
    for (int32_t r = 0; r < n; ++r) {
        Threadblock& local = add_tb(p, r, -1, -1);
        add_step(local, StepType::cpy, I, r, O, r);
        for (int32_t peer = 0; peer < n; ++peer) {
            if (peer == r) continue;
            Threadblock& tb = add_tb(p, r, peer, peer);
            add_step(tb, StepType::s, I, peer, O, 0);
            add_step(tb, StepType::r, I, 0, O, peer);
        }
    }
    return p;
}

// ------------------------------------------------------------------------------------------------ buffers

// Element values as doubles (read and written in the buffer's dtype).
double load(mlopt_dtype dtype, const std::byte* base, size_t index) {
    const std::byte* at = base + index * mlopt::dtype_size(dtype);
    uint16_t h;
    switch (dtype) {
        case MLOPT_FLOAT32: { float f; std::memcpy(&f, at, 4); return f; }
        case MLOPT_INT32: { int32_t i; std::memcpy(&i, at, 4); return i; }
        case MLOPT_FLOAT16: std::memcpy(&h, at, 2); return mlopt::half_to_float(h);
        case MLOPT_BFLOAT16: std::memcpy(&h, at, 2); return mlopt::bfloat16_to_float(h);
    }
    return 0;
}

void store(mlopt_dtype dtype, std::byte* base, size_t index, double value) {
    std::byte* at = base + index * mlopt::dtype_size(dtype);
    uint16_t h;
    switch (dtype) {
        case MLOPT_FLOAT32: { float f = static_cast<float>(value); std::memcpy(at, &f, 4); return; }
        case MLOPT_INT32: { int32_t i = static_cast<int32_t>(value); std::memcpy(at, &i, 4); return; }
        case MLOPT_FLOAT16: h = mlopt::float_to_half(static_cast<float>(value)); std::memcpy(at, &h, 2); return;
        case MLOPT_BFLOAT16: h = mlopt::float_to_bfloat16(static_cast<float>(value)); std::memcpy(at, &h, 2); return;
    }
}

// Random bits in every input (copies must reproduce them bitwise, NaN payloads included).
void fill_random_bits(const Buffers& b, uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t r = 0; r < b.inputs.size(); ++r) {
        for (size_t i = 0; i < b.count * b.elem; ++i) b.in(r)[i] = static_cast<std::byte>(rng() & 0xff);
    }
}

// Small integers whose reductions are exact in every dtype (sums of <= 8 values in [-8, 8], products of
// +-1 and +-2, which stay powers of two), so reduction order cannot matter.
void fill_exact_values(const Buffers& b, mlopt_dtype dtype, mlopt_redop op, uint32_t seed) {
    std::mt19937 rng(seed);
    static const double kFactors[] = {-2, -1, 1, 2};
    for (size_t r = 0; r < b.inputs.size(); ++r) {
        for (size_t i = 0; i < b.count; ++i) {
            const double v = op == MLOPT_PROD ? kFactors[rng() % 4] : static_cast<double>(static_cast<int>(rng() % 17) - 8);
            store(dtype, b.in(r), i, v);
        }
    }
}

double combine(mlopt_redop op, double a, double b) {
    switch (op) {
        case MLOPT_SUM: return a + b;
        case MLOPT_PROD: return a * b;
        case MLOPT_MAX: return std::max(a, b);
        case MLOPT_MIN: return std::min(a, b);
    }
    return 0;
}

// ------------------------------------------------------------------------------------------------ runs

struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    mlopt_run_stats stats{sizeof(mlopt_run_stats), 0, 0, 0, 0, 0.0, 0.0, 0};
    double seconds = 0;
};

mlopt_run_options options(int32_t fifo_slots = 0, int64_t chunk_bytes = 0, int32_t threads = 0,
                          int32_t watchdog_ms = 10000) {
    mlopt_run_options o;
    mlopt_run_options_init(&o);
    o.fifo_slots = fifo_slots;
    o.chunk_bytes = chunk_bytes;
    o.threads = threads;
    o.watchdog_ms = watchdog_ms;
    return o;
}

Outcome run(const mlopt_plan_s& plan, Buffers& b, mlopt_dtype dtype, mlopt_redop op, const mlopt_run_options& opts,
            int32_t nranks = -1) {
    Outcome outcome;
    mlopt_comm comm = nullptr;
    mlopt_status created = mlopt_comm_create_local(nranks > 0 ? nranks : plan.program.ngpus, &comm, nullptr);
    if (created != MLOPT_OK) {
        outcome.status = created;
        return outcome;
    }
    mlopt_error err = nullptr;
    const auto start = std::chrono::steady_clock::now();
    outcome.status = mlopt_comm_run(comm, &plan, b.inputs.data(), b.outputs.data(), b.count, dtype, op, &opts, &err);
    outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (err != nullptr) outcome.message = mlopt_error_message(err);
    EXPECT((err != nullptr) == (outcome.status != MLOPT_OK), "error object iff failure (%s)", outcome.message.c_str());
    mlopt_error_free(err);
    mlopt_comm_last_stats(comm, &outcome.stats);
    mlopt_comm_free(comm);
    return outcome;
}

std::string describe(const char* what, int32_t n, mlopt_dtype dtype, const mlopt_run_options& o, bool inplace) {
    return std::string(what) + " n=" + std::to_string(n) + " " + mlopt::dtype_name(dtype) +
           (inplace ? " in-place" : " out-of-place") + " fifo=" + std::to_string(o.fifo_slots) +
           " chunk_bytes=" + std::to_string(o.chunk_bytes) + " threads=" + std::to_string(o.threads);
}

bool same_bytes(const std::byte* a, const std::byte* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Checks one allgather run: output chunk j of every rank equals rank j's input, bitwise.
void check_allgather(int32_t n, mlopt_dtype dtype, bool inplace, const mlopt_run_options& o, size_t count) {
    const Program p = ring_allgather(n);
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, count, dtype, inplace);
    fill_random_bits(b, 17u * static_cast<uint32_t>(n));
    std::vector<std::vector<std::byte>> expected_inputs;
    for (int32_t r = 0; r < n; ++r) expected_inputs.emplace_back(b.in(r), b.in(r) + count * b.elem);
    const Outcome out = run(plan, b, dtype, MLOPT_SUM, o);
    const std::string what = describe("allgather", n, dtype, o, inplace);
    EXPECT(out.status == MLOPT_OK, "%s: %s", what.c_str(), out.message.c_str());
    if (out.status != MLOPT_OK) return;
    const size_t bytes = count * b.elem;
    for (int32_t r = 0; r < n; ++r) {
        for (int32_t j = 0; j < n; ++j) {
            EXPECT(same_bytes(b.out(r) + j * bytes, expected_inputs[j].data(), bytes), "%s: rank %d chunk %d",
                   what.c_str(), r, j);
        }
    }
    const int64_t iterations = out.stats.loop_iterations;
    EXPECT(out.stats.steps_executed == iterations * n * (n + 1), "%s: steps %lld", what.c_str(),
           static_cast<long long>(out.stats.steps_executed));
    EXPECT(out.stats.messages == iterations * n * (n - 1), "%s: messages %lld", what.c_str(),
           static_cast<long long>(out.stats.messages));
}

// Checks one allreduce run against the reduction computed here: exact for the exact-value inputs,
// relative tolerance for random float32 reals (`exact` false).
void check_allreduce(const Program& p, mlopt_dtype dtype, mlopt_redop op, bool inplace, const mlopt_run_options& o,
                     size_t count, bool exact = true) {
    const int32_t n = p.ngpus;
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, count, dtype, inplace);
    if (exact) {
        fill_exact_values(b, dtype, op, 31u * static_cast<uint32_t>(n) + static_cast<uint32_t>(op));
    } else {
        std::mt19937 rng(5);
        std::uniform_real_distribution<double> dist(-1.0, 1.0);
        for (int32_t r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) store(dtype, b.in(r), i, dist(rng));
        }
    }
    std::vector<double> expected(count);
    for (size_t i = 0; i < count; ++i) {
        double acc = load(dtype, b.in(0), i);
        for (int32_t r = 1; r < n; ++r) acc = combine(op, acc, load(dtype, b.in(r), i));
        expected[i] = acc;
    }
    const Outcome out = run(plan, b, dtype, op, o);
    const std::string what = describe("allreduce", n, dtype, o, inplace) + " " + mlopt::redop_name(op);
    EXPECT(out.status == MLOPT_OK, "%s: %s", what.c_str(), out.message.c_str());
    if (out.status != MLOPT_OK) return;
    size_t bad = 0;
    for (int32_t r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
            const double got = load(dtype, b.out(r), i);
            const double tolerance = exact ? 0.0 : 1e-5 * n;
            if (!(std::fabs(got - expected[i]) <= tolerance) && bad++ < 3) {
                EXPECT(false, "%s: rank %d element %zu is %g, expected %g", what.c_str(), r, i, got, expected[i]);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------ tests

void test_allgather() {
    for (int32_t n : {2, 3, 4, 8}) {
        for (bool inplace : {false, true}) check_allgather(n, MLOPT_FLOAT32, inplace, options(), 257);
    }
    for (mlopt_dtype dtype : {MLOPT_FLOAT16, MLOPT_BFLOAT16, MLOPT_INT32}) {
        check_allgather(4, dtype, false, options(), 100);
        check_allgather(3, dtype, true, options(2, 6), 100);
    }
}

void test_allreduce_every_dtype_and_op() {
    for (int32_t n : {2, 3, 4, 8}) {
        for (bool inplace : {false, true}) {
            check_allreduce(ring_allreduce(n), MLOPT_FLOAT32, MLOPT_SUM, inplace, options(), n * 61);
        }
    }
    for (mlopt_dtype dtype : {MLOPT_FLOAT32, MLOPT_FLOAT16, MLOPT_BFLOAT16, MLOPT_INT32}) {
        for (mlopt_redop op : {MLOPT_SUM, MLOPT_PROD, MLOPT_MAX, MLOPT_MIN}) {
            check_allreduce(ring_allreduce(3, 2, false), dtype, op, false, options(), 6 * 301);
            check_allreduce(ring_allreduce(4), dtype, op, true, options(1, 64), 4 * 300);
        }
    }
    check_allreduce(ring_allreduce(8, 2), MLOPT_FLOAT32, MLOPT_SUM, false, options(), 16 * 1000, false);
}

void test_reducescatter() {
    for (int32_t n : {2, 3, 4}) {
        for (bool inplace : {false, true}) {
            const Program p = ring_reducescatter(n);
            const mlopt_plan_s plan = as_plan(p);
            const size_t per_chunk = 50;
            Buffers b = make_buffers(p, static_cast<size_t>(n) * per_chunk, MLOPT_INT32, inplace);
            fill_exact_values(b, MLOPT_INT32, MLOPT_SUM, 13);
            std::vector<double> want(static_cast<size_t>(n) * per_chunk, 0.0);
            for (int32_t q = 0; q < n; ++q) {
                for (size_t i = 0; i < want.size(); ++i) want[i] += load(MLOPT_INT32, b.in(q), i);
            }
            const Outcome out = run(plan, b, MLOPT_INT32, MLOPT_SUM, options(1, 40));
            EXPECT(out.status == MLOPT_OK, "reducescatter n=%d: %s", n, out.message.c_str());
            for (int32_t r = 0; r < n && out.status == MLOPT_OK; ++r) {
                for (size_t i = 0; i < per_chunk; ++i) {
                    const double got = load(MLOPT_INT32, b.out(r), i);
                    const double expected = want[static_cast<size_t>(r) * per_chunk + i];
                    if (got != expected) {
                        EXPECT(false, "reducescatter n=%d %s rank %d element %zu: %g, expected %g", n,
                               inplace ? "in-place" : "out-of-place", r, i, got, expected);
                        break;
                    }
                }
            }
        }
    }
}

void test_alltoall() {
    for (int32_t n : {2, 5, 8}) {
        const Program p = alltoall(n);
        const mlopt_plan_s plan = as_plan(p);
        const size_t count = static_cast<size_t>(n) * 33;
        Buffers b = make_buffers(p, count, MLOPT_BFLOAT16, false);
        fill_random_bits(b, 3);
        const Outcome out = run(plan, b, MLOPT_BFLOAT16, MLOPT_SUM, options(1));
        EXPECT(out.status == MLOPT_OK, "alltoall n=%d: %s", n, out.message.c_str());
        const size_t bytes = 33 * b.elem;
        for (int32_t r = 0; r < n && out.status == MLOPT_OK; ++r) {
            for (int32_t j = 0; j < n; ++j) {
                EXPECT(same_bytes(b.out(r) + j * bytes, b.in(j) + r * bytes, bytes), "alltoall n=%d rank %d chunk %d",
                       n, r, j);
            }
        }
    }
}

void test_dependencies() {
    const Program p = dependency_program();
    const mlopt_plan_s plan = as_plan(p);
    for (mlopt_dtype dtype : {MLOPT_INT32, MLOPT_FLOAT32, MLOPT_FLOAT16}) {
        for (int32_t threads : {1, 2, 5}) {
            for (int64_t chunk_bytes : {int64_t{0}, int64_t{12}}) {
                Buffers b = make_buffers(p, 2 * 50, dtype, false);
                fill_exact_values(b, dtype, MLOPT_SUM, 11);
                const Outcome out = run(plan, b, dtype, MLOPT_SUM, options(0, chunk_bytes, threads));
                EXPECT(out.status == MLOPT_OK, "dependency program: %s", out.message.c_str());
                for (int32_t r = 0; r < 2 && out.status == MLOPT_OK; ++r) {
                    for (size_t e = 0; e < 50; ++e) {
                        double want = 0;
                        for (int32_t q = 0; q < 2; ++q) want += load(dtype, b.in(q), e) + load(dtype, b.in(q), 50 + e);
                        const double got = load(dtype, b.out(r), e);
                        EXPECT(got == want, "dependency program %s threads=%d rank %d element %zu: %g, expected %g",
                               mlopt::dtype_name(dtype), threads, r, e, got, want);
                    }
                }
                // 9 steps per rank per iteration; one message per rank (the cnt=0 send sends none).
                const int64_t iterations = out.stats.loop_iterations;
                EXPECT(out.stats.steps_executed == 18 * iterations, "steps %lld",
                       static_cast<long long>(out.stats.steps_executed));
                EXPECT(out.stats.messages == 2 * iterations, "messages %lld", static_cast<long long>(out.stats.messages));
            }
        }
    }
}

void test_slicing_and_fifos() {
    // 1000 floats per chunk in slices of 96: 11 iterations, the last one 40 elements.
    for (int32_t fifo : {1, 2, 0}) {
        for (int32_t threads : {1, 3, 0}) {
            check_allreduce(ring_allreduce(3), MLOPT_FLOAT32, MLOPT_SUM, false, options(fifo, 384, threads), 3 * 1000);
            check_allgather(4, MLOPT_INT32, fifo == 1, options(fifo, 384, threads), 1000);
        }
    }
    const Program p = ring_allreduce(3);
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, 3 * 1000, MLOPT_FLOAT32, false);
    const Outcome sliced = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, options(0, 384));
    EXPECT(sliced.stats.loop_iterations == 11, "iterations %lld", static_cast<long long>(sliced.stats.loop_iterations));
    EXPECT(sliced.stats.steps_executed == 11 * 3 * 5, "steps %lld", static_cast<long long>(sliced.stats.steps_executed));
    EXPECT(sliced.stats.bytes_moved > 0 && sliced.stats.wall_us > 0, "stats bytes/time");
    // A slice smaller than an element still moves one element per iteration.
    check_allreduce(ring_allreduce(2), MLOPT_FLOAT16, MLOPT_MAX, true, options(1, 1), 2 * 7);
    // count = 0: nothing to do.
    Buffers empty = make_buffers(p, 0, MLOPT_FLOAT32, false);
    const Outcome none = run(plan, empty, MLOPT_FLOAT32, MLOPT_SUM, options());
    EXPECT(none.status == MLOPT_OK && none.stats.steps_executed == 0, "count=0: %s", none.message.c_str());
}

// Each rank sends twice, then receives twice: fine with unbounded FIFOs or 2 slots, deadlocked with 1.
Program send_twice_then_receive() {
    Program p = new_program("allgather", 2, 2, 2, 0, false, true);
    for (int32_t r = 0; r < 2; ++r) {
        Threadblock& tb = add_tb(p, r, 1 - r, 1 - r);
        add_step(tb, StepType::s, I, 0, O, 0);
        add_step(tb, StepType::s, I, 1, O, 0);
        add_step(tb, StepType::r, I, 0, O, 0);
        add_step(tb, StepType::r, I, 0, O, 1);
    }
    return p;
}

void test_deadlocks() {
    {  // both ranks receive first
        Program p = new_program("allgather", 2, 1, 2, 0, false, true);
        for (int32_t r = 0; r < 2; ++r) {
            Threadblock& tb = add_tb(p, r, 1 - r, 1 - r);
            add_step(tb, StepType::r, I, 0, O, 1 - r);
            add_step(tb, StepType::s, I, 0, O, 0);
        }
        const mlopt_plan_s plan = as_plan(p);
        Buffers b = make_buffers(p, 64, MLOPT_FLOAT32, false);
        const Outcome out = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, options(0, 0, 2, 10000));
        EXPECT(out.status == MLOPT_ERR_DEADLOCK, "status %d: %s", out.status, out.message.c_str());
        EXPECT(out.seconds < 2.0, "the certain deadlock took %.3f s to report", out.seconds);
        EXPECT(out.message.find("rank 0 tb 0 step 0 (r) waits for a message from rank 1 on channel 0") !=
                   std::string::npos &&
               out.message.find("rank 1 tb 0 step 0 (r) waits for a message from rank 0 on channel 0") !=
                   std::string::npos,
               "message: %s", out.message.c_str());
        EXPECT(out.message.find('\n') == std::string::npos, "one line: %s", out.message.c_str());
    }
    {  // bounded FIFOs
        const Program p = send_twice_then_receive();
        const mlopt_plan_s plan = as_plan(p);
        for (int32_t fifo : {0, 2, 1}) {
            Buffers b = make_buffers(p, 2 * 16, MLOPT_INT32, false);
            fill_random_bits(b, 9);
            const Outcome out = run(plan, b, MLOPT_INT32, MLOPT_SUM, options(fifo, 0, 1));
            if (fifo == 1) {
                EXPECT(out.status == MLOPT_ERR_DEADLOCK, "fifo=1: status %d", out.status);
                EXPECT(out.message.find("cannot send to rank 1 on channel 0: FIFO full") != std::string::npos,
                       "message: %s", out.message.c_str());
            } else {
                EXPECT(out.status == MLOPT_OK, "fifo=%d: %s", fifo, out.message.c_str());
                for (int32_t r = 0; r < 2 && out.status == MLOPT_OK; ++r) {
                    EXPECT(same_bytes(b.out(r), b.in(1 - r), 32 * 4), "fifo=%d rank %d", fifo, r);
                }
            }
        }
    }
    {  // a dependency on a step that never signals (no hasdep)
        Program p = new_program("allreduce", 1, 1, 1, 0);
        Threadblock& a = add_tb(p, 0, -1, -1);
        add_step(a, StepType::cpy, I, 0, O, 0);
        Threadblock& b2 = add_tb(p, 0, -1, -1);
        add_step(b2, StepType::re, I, 0, O, 0, 1, {0, 0, false});
        const mlopt_plan_s plan = as_plan(p);
        Buffers b = make_buffers(p, 8, MLOPT_FLOAT32, false);
        const Outcome out = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, options(0, 2));
        EXPECT(out.status == MLOPT_ERR_DEADLOCK, "status %d", out.status);
        EXPECT(out.message.find("rank 0 tb 1 step 0 (re) of loop iteration 0 waits for tb 0 to complete step 0") !=
                   std::string::npos,
               "message: %s", out.message.c_str());
    }
}

void test_watchdog() {
    // One step longer than the watchdog's patience (a 1 ms watchdog, 64 MiB copies) is reported, not waited for.
    Program p = new_program("allreduce", 1, 1, 1, 0);
    Threadblock& tb = add_tb(p, 0, -1, -1);
    for (int i = 0; i < 8; ++i) add_step(tb, StepType::cpy, I, 0, O, 0);
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, size_t{16} << 20, MLOPT_FLOAT32, false);
    const Outcome out = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, options(0, 0, 1, 1));
    EXPECT(out.status == MLOPT_ERR_DEADLOCK, "status %d: %s", out.status, out.message.c_str());
    EXPECT(out.message.find("no step completed for 1 ms") != std::string::npos &&
               out.message.find("rank 0 tb 0 step") != std::string::npos,
           "message: %s", out.message.c_str());
}

void test_message_mismatch() {
    Program p = new_program("allgather", 2, 2, 2, 0, false, true);
    Threadblock& sender = add_tb(p, 0, 1, -1);
    add_step(sender, StepType::s, I, 0, O, 0, 2);
    Threadblock& receiver = add_tb(p, 1, -1, 0);
    add_step(receiver, StepType::r, I, 0, O, 0, 1);
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, 2 * 8, MLOPT_FLOAT32, false);
    const Outcome out = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, options());
    EXPECT(out.status == MLOPT_ERR_SEMANTIC, "status %d: %s", out.status, out.message.c_str());
    EXPECT(out.message.find("rank 1 tb 0 step 0 (r) receives cnt=1 but the matching send rank 0 tb 0 step 0 (s) "
                            "has cnt=2") != std::string::npos,
           "message: %s", out.message.c_str());

    // A receive nothing sends: the message names it.
    Program lonely = new_program("allgather", 2, 1, 1, 0, false, true);
    add_tb(lonely, 0, 1, -1);
    Threadblock& waiting = add_tb(lonely, 1, -1, 0);
    add_step(waiting, StepType::r, I, 0, O, 0);
    const mlopt_plan_s lonely_plan = as_plan(lonely);
    Buffers lb = make_buffers(lonely, 4, MLOPT_FLOAT32, false);
    const Outcome never = run(lonely_plan, lb, MLOPT_FLOAT32, MLOPT_SUM, options());
    EXPECT(never.status == MLOPT_ERR_DEADLOCK &&
               never.message.find("rank 1 tb 0 step 0 (r) waits for a message from rank 0 on channel 0, which never "
                                  "comes") != std::string::npos,
           "message: %s", never.message.c_str());

    // Unpaired sends: the receiver's second message arrives from the sender's next loop iteration.
    Program q = new_program("allgather", 2, 1, 1, 0, false, true);
    Threadblock& twice = add_tb(q, 0, 1, -1);
    add_step(twice, StepType::s, I, 0, O, 0);
    Threadblock& once = add_tb(q, 1, -1, 0);
    add_step(once, StepType::r, I, 0, O, 0);
    add_step(once, StepType::r, I, 0, O, 0);
    const mlopt_plan_s qplan = as_plan(q);
    Buffers qb = make_buffers(q, 10, MLOPT_FLOAT32, false);
    const Outcome unpaired = run(qplan, qb, MLOPT_FLOAT32, MLOPT_SUM, options(0, 16));  // slices 4, 4, 2
    EXPECT(unpaired.status == MLOPT_ERR_SEMANTIC, "status %d: %s", unpaired.status, unpaired.message.c_str());
    EXPECT(unpaired.message.find("rank 1 tb 0 step 1 (r) of loop iteration 0 receives a message of loop iteration 1") !=
               std::string::npos,
           "message: %s", unpaired.message.c_str());
}

void test_argument_errors() {
    const Program p = ring_allgather(2);
    const mlopt_plan_s plan = as_plan(p);
    Buffers b = make_buffers(p, 16, MLOPT_FLOAT32, false);
    mlopt_run_options o = options();

    Program ar = ring_allreduce(2);
    const mlopt_plan_s ar_plan = as_plan(ar);
    Buffers ab = make_buffers(ar, 16, MLOPT_FLOAT32, false);
    ab.count = 15;  // not a multiple of i_chunks = 2
    EXPECT(run(ar_plan, ab, MLOPT_FLOAT32, MLOPT_SUM, o).status == MLOPT_ERR_INVALID_ARGUMENT, "count not a multiple of i_chunks");

    const Outcome wrong_size = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, o, 3);
    EXPECT(wrong_size.status == MLOPT_ERR_MISMATCH, "comm size: %d", wrong_size.status);
    EXPECT(wrong_size.message.find("ngpus=2") != std::string::npos, "message: %s", wrong_size.message.c_str());

    Program no_inplace = ring_allgather(2);
    no_inplace.inplace = false;
    const mlopt_plan_s np = as_plan(no_inplace);
    Buffers ib = make_buffers(no_inplace, 16, MLOPT_FLOAT32, true);
    const Outcome inplace = run(np, ib, MLOPT_FLOAT32, MLOPT_SUM, o);
    EXPECT(inplace.status == MLOPT_ERR_MISMATCH, "in-place without inplace: %d %s", inplace.status,
           inplace.message.c_str());

    Program only_inplace = ring_allgather(2);
    only_inplace.outofplace = false;
    const mlopt_plan_s op_plan = as_plan(only_inplace);
    EXPECT(run(op_plan, b, MLOPT_FLOAT32, MLOPT_SUM, o).status == MLOPT_ERR_MISMATCH, "out-of-place without outofplace");

    Buffers bad_layout = make_buffers(p, 16, MLOPT_FLOAT32, true);
    bad_layout.inputs[1] = bad_layout.outputs[1];  // an allgather's input must be chunk r of the output
    EXPECT(run(plan, bad_layout, MLOPT_FLOAT32, MLOPT_SUM, o).status == MLOPT_ERR_INVALID_ARGUMENT, "layout");

    EXPECT(run(plan, b, static_cast<mlopt_dtype>(9), MLOPT_SUM, o).status == MLOPT_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT(run(plan, b, MLOPT_FLOAT32, static_cast<mlopt_redop>(-1), o).status == MLOPT_ERR_INVALID_ARGUMENT, "op");

    // Without the CUDA backend (or a GPU), a CUDA run is refused as unsupported, naming why.
    mlopt_run_options cuda = options();
    cuda.backend = MLOPT_BACKEND_CUDA;
    if (mlopt_backend_available(MLOPT_BACKEND_CUDA, nullptr) != MLOPT_OK) {
        const Outcome refused = run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, cuda);
        EXPECT(refused.status == MLOPT_ERR_UNSUPPORTED && !refused.message.empty(), "cuda backend: %s",
               refused.message.c_str());
    }
    EXPECT(mlopt_backend_available(MLOPT_BACKEND_CPU, nullptr) == MLOPT_OK, "the CPU backend is always there");
    EXPECT(mlopt_backend_available(static_cast<mlopt_backend>(7), nullptr) == MLOPT_ERR_INVALID_ARGUMENT,
           "not a backend");
    mlopt_run_options uninitialised{};
    EXPECT(run(plan, b, MLOPT_FLOAT32, MLOPT_SUM, uninitialised).status == MLOPT_ERR_INVALID_ARGUMENT, "struct_size");

    Buffers misaligned = make_buffers(p, 16, MLOPT_FLOAT32, false);
    misaligned.inputs[0] = misaligned.in(0) + 2;
    EXPECT(run(plan, misaligned, MLOPT_FLOAT32, MLOPT_SUM, o).status == MLOPT_ERR_INVALID_ARGUMENT, "alignment");

    mlopt_plan_s json_plan = as_plan(p);
    json_plan.kind = MLOPT_PLAN_JSON;
    EXPECT(run(json_plan, b, MLOPT_FLOAT32, MLOPT_SUM, o).status == MLOPT_ERR_INVALID_ARGUMENT, "JSON plan");

    mlopt_comm comm = nullptr;
    mlopt_error err = nullptr;
    EXPECT(mlopt_comm_create_local(0, &comm, &err) == MLOPT_ERR_INVALID_ARGUMENT && comm == nullptr, "0 ranks");
    mlopt_error_free(err);
    EXPECT(mlopt_comm_run(nullptr, &plan, b.inputs.data(), b.outputs.data(), 16, MLOPT_FLOAT32, MLOPT_SUM, &o,
                          nullptr) == MLOPT_ERR_INVALID_ARGUMENT,
           "NULL comm");
    EXPECT(mlopt_comm_size(nullptr) == 0, "size of NULL");
    mlopt_run_stats stats{};
    stats.struct_size = sizeof stats;
    EXPECT(mlopt_comm_last_stats(nullptr, &stats) == MLOPT_ERR_INVALID_ARGUMENT, "stats of NULL");
    mlopt_comm_free(nullptr);

    // A communicator is reusable, and NULL options mean the defaults.
    EXPECT(mlopt_comm_create_local(2, &comm, nullptr) == MLOPT_OK && mlopt_comm_size(comm) == 2, "create");
    for (int i = 0; i < 3; ++i) {
        EXPECT(mlopt_comm_run(comm, &plan, b.inputs.data(), b.outputs.data(), 16, MLOPT_FLOAT32, MLOPT_SUM, nullptr,
                              nullptr) == MLOPT_OK,
               "reuse %d", i);
    }
    EXPECT(mlopt_comm_last_stats(comm, &stats) == MLOPT_OK && stats.steps_executed == 6, "stats after reuse");
    EXPECT(stats.backend == MLOPT_BACKEND_CPU && stats.device_us == 0.0, "CPU runs have no device time");
    // An older caller's smaller struct gets only its fields; an unset struct_size is refused.
    mlopt_run_stats older;
    std::memset(&older, 0x5a, sizeof older);
    older.struct_size = offsetof(mlopt_run_stats, wall_us);
    EXPECT(mlopt_comm_last_stats(comm, &older) == MLOPT_OK && older.steps_executed == 6 &&
               older.struct_size == offsetof(mlopt_run_stats, wall_us),
           "older stats struct");
    unsigned char beyond[sizeof older.wall_us];
    std::memset(beyond, 0x5a, sizeof beyond);
    EXPECT(std::memcmp(&older.wall_us, beyond, sizeof beyond) == 0, "nothing written past an older struct");
    mlopt_run_stats unset{};
    EXPECT(mlopt_comm_last_stats(comm, &unset) == MLOPT_ERR_INVALID_ARGUMENT, "struct_size unset");
    mlopt_comm_free(comm);
}

// ------------------------------------------------------------------------------------------------ dtypes

uint16_t reference_bfloat16(float value) {
    // Nearest of the two bfloat16 neighbours by exact double arithmetic, ties to the even one.
    uint32_t bits = mlopt::float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN: checked separately
    const uint32_t down = bits & 0xffff0000u;
    const uint32_t up = down + 0x10000u;
    const double lo = mlopt::bits_float(down);
    const double hi = (up & 0x7f800000u) == 0x7f800000u && (down & 0x7f800000u) != 0x7f800000u
                          ? std::copysign(std::ldexp(1.0, 128), value)
                          : static_cast<double>(mlopt::bits_float(up));
    const double dlo = std::fabs(static_cast<double>(value) - lo);
    const double dhi = std::fabs(hi - static_cast<double>(value));
    if (dlo < dhi) return static_cast<uint16_t>(down >> 16);
    if (dhi < dlo) return static_cast<uint16_t>(up >> 16);
    return static_cast<uint16_t>(((down >> 16) & 1u) ? up >> 16 : down >> 16);
}

void test_conversions() {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = mlopt::half_to_float(static_cast<uint16_t>(h));
        const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
        if (nan) {
            EXPECT(std::isnan(f) && (mlopt::float_to_half(f) & 0x7fffu) > 0x7c00u, "half NaN %04x", h);
        } else {
            EXPECT(mlopt::float_to_half(f) == h, "half round trip %04x", h);
        }
#if defined(__FLT16_MAX__)
        if (!nan) {
            _Float16 ref;
            const uint16_t bits16 = static_cast<uint16_t>(h);
            std::memcpy(&ref, &bits16, 2);
            EXPECT(static_cast<float>(ref) == f, "half_to_float(%04x)", h);
        }
#endif
        const float bf = mlopt::bfloat16_to_float(static_cast<uint16_t>(h));
        const bool bnan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
        if (!bnan) EXPECT(mlopt::float_to_bfloat16(bf) == h, "bfloat16 round trip %04x", h);
        if (bnan) EXPECT(std::isnan(mlopt::bfloat16_to_float(mlopt::float_to_bfloat16(bf))), "bf16 NaN %04x", h);
    }
    // Rounding: ties to even, overflow to infinity, subnormals.
    EXPECT(mlopt::float_to_half(1.0f + 0x1p-11f) == 0x3c00, "tie rounds down to even");
    EXPECT(mlopt::float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie rounds up to even");
    EXPECT(mlopt::float_to_half(65504.0f) == 0x7bff && mlopt::float_to_half(65519.99f) == 0x7bff, "max half");
    EXPECT(mlopt::float_to_half(65520.0f) == 0x7c00 && mlopt::float_to_half(-1e10f) == 0xfc00, "overflow");
    EXPECT(mlopt::float_to_half(0x1p-24f) == 0x0001 && mlopt::float_to_half(0x1p-25f) == 0x0000 &&
               mlopt::float_to_half(3 * 0x1p-25f) == 0x0002,
           "subnormal halves");
    EXPECT(mlopt::float_to_bfloat16(1.0f + 0x1p-8f) == 0x3f80 && mlopt::float_to_bfloat16(1.0f + 3 * 0x1p-8f) == 0x3f82,
           "bfloat16 ties to even");
    EXPECT(mlopt::float_to_bfloat16(3.4e38f) == 0x7f80, "bfloat16 overflow");
    std::mt19937 rng(1);
    for (int i = 0; i < 400000; ++i) {
        const uint32_t bits = static_cast<uint32_t>(rng());
        const float f = mlopt::bits_float(bits);
        if (std::isnan(f)) {
            EXPECT(std::isnan(mlopt::half_to_float(mlopt::float_to_half(f))) &&
                       std::isnan(mlopt::bfloat16_to_float(mlopt::float_to_bfloat16(f))),
                   "NaN stays NaN %08x", bits);
            continue;
        }
        EXPECT(mlopt::float_to_bfloat16(f) == reference_bfloat16(f), "bfloat16(%08x)", bits);
#if defined(__FLT16_MAX__)
        const _Float16 ref = static_cast<_Float16>(f);
        uint16_t ref_bits;
        std::memcpy(&ref_bits, &ref, 2);
        EXPECT(mlopt::float_to_half(f) == ref_bits, "half(%08x) = %04x, expected %04x", bits, mlopt::float_to_half(f),
               ref_bits);
#endif
    }
}

// The kernels against a scalar reference, for every dtype and op, with dst disjoint, equal to a, equal to b.
void test_reduce_kernels() {
    const size_t n = 1000;  // not a multiple of any vector width or block
    for (mlopt_dtype dtype : {MLOPT_FLOAT32, MLOPT_FLOAT16, MLOPT_BFLOAT16, MLOPT_INT32}) {
        for (mlopt_redop op : {MLOPT_SUM, MLOPT_PROD, MLOPT_MAX, MLOPT_MIN}) {
            const size_t es = mlopt::dtype_size(dtype);
            std::vector<uint64_t> sa(n * es / 8 + 1), sb(n * es / 8 + 1), sd(n * es / 8 + 1);
            auto* a = reinterpret_cast<std::byte*>(sa.data());
            auto* b = reinterpret_cast<std::byte*>(sb.data());
            auto* d = reinterpret_cast<std::byte*>(sd.data());
            std::mt19937 rng(static_cast<uint32_t>(dtype) * 4 + static_cast<uint32_t>(op));
            std::uniform_real_distribution<double> dist(-100, 100);
            std::vector<double> want(n);
            for (size_t i = 0; i < n; ++i) {
                store(dtype, a, i, dtype == MLOPT_INT32 ? std::round(dist(rng)) : dist(rng));
                store(dtype, b, i, dtype == MLOPT_INT32 ? std::round(dist(rng)) : dist(rng));
                const double exact = combine(op, load(dtype, a, i), load(dtype, b, i));
                std::byte tmp[4];
                store(dtype, tmp, 0, exact);  // rounded once to the dtype, as the kernel must
                want[i] = load(dtype, tmp, 0);
            }
            auto check = [&](const std::byte* got, const char* how) {
                for (size_t i = 0; i < n; ++i) {
                    if (load(dtype, got, i) != want[i]) {
                        EXPECT(false, "reduce %s %s %s: element %zu is %g, expected %g", mlopt::dtype_name(dtype),
                               mlopt::redop_name(op), how, i, load(dtype, got, i), want[i]);
                        return;
                    }
                }
            };
            mlopt::reduce(dtype, op, d, a, b, n);
            check(d, "disjoint");
            std::memcpy(d, a, n * es);
            mlopt::reduce(dtype, op, d, d, b, n);
            check(d, "dst=a");
            std::memcpy(d, b, n * es);
            mlopt::reduce(dtype, op, d, a, d, n);
            check(d, "dst=b");
            // reduce_keep: the result lands in dst and in a (a copy of a, as it modifies it).
            std::vector<uint64_t> sk(sa);
            auto* keep = reinterpret_cast<std::byte*>(sk.data());
            std::memset(d, 0, n * es);
            mlopt::reduce_keep(dtype, op, d, keep, b, n);
            check(d, "keep, dst");
            check(keep, "keep, a");
            sk = sa;
            std::memcpy(d, b, n * es);
            mlopt::reduce_keep(dtype, op, d, keep, d, n);
            check(d, "keep, dst=b");
            check(keep, "keep, dst=b, a");
        }
    }
    // The 16-bit kernels (hardware conversions where the CPU has them) on every bit pattern: max(x, x) must
    // give x back (NaN: some NaN), and sums of random pairs must match the scalar conversions.
    for (mlopt_dtype dtype : {MLOPT_FLOAT16, MLOPT_BFLOAT16}) {
        std::vector<uint16_t> all(0x10000), out(0x10000), other(0x10000), sum(0x10000);
        for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
        mlopt::reduce(dtype, MLOPT_MAX, out.data(), all.data(), all.data(), all.size());
        std::mt19937 rng(77);
        for (uint16_t& v : other) v = static_cast<uint16_t>(rng());
        mlopt::reduce(dtype, MLOPT_SUM, sum.data(), all.data(), other.data(), all.size());
        const bool half = dtype == MLOPT_FLOAT16;
        auto decode = [&](uint16_t v) { return half ? mlopt::half_to_float(v) : mlopt::bfloat16_to_float(v); };
        auto encode = [&](float v) { return half ? mlopt::float_to_half(v) : mlopt::float_to_bfloat16(v); };
        size_t bad = 0;
        for (uint32_t h = 0; h < 0x10000; ++h) {
            const bool nan = std::isnan(decode(static_cast<uint16_t>(h)));
            const bool ok_max = nan ? std::isnan(decode(out[h])) : out[h] == h;
            const float exact = decode(static_cast<uint16_t>(h)) + decode(other[h]);
            const bool ok_sum = std::isnan(exact) ? std::isnan(decode(sum[h])) : sum[h] == encode(exact);
            if ((!ok_max || !ok_sum) && bad++ < 3) {
                EXPECT(false, "%s kernel on %04x: max %04x, + %04x = %04x, expected %04x", mlopt::dtype_name(dtype), h,
                       out[h], other[h], sum[h], encode(exact));
            }
        }
    }
    int32_t big[2] = {INT32_MAX, INT32_MAX};
    int32_t one[2] = {1, 2};
    mlopt::reduce(MLOPT_INT32, MLOPT_SUM, big, big, one, 2);
    EXPECT(big[0] == INT32_MIN && big[1] == INT32_MIN + 1, "int32 sums wrap");
}

// ------------------------------------------------------------------------------------------------ XML

std::string data_path(const char* name) {
    const char* repo = std::getenv("MLOPT_REPO");
    const std::string local = std::string("data/") + name;
    if (FILE* f = std::fopen(local.c_str(), "rb")) {
        std::fclose(f);
        return local;
    }
    return std::string(repo ? repo : "..") + "/../shared/reference/msccl-xml/" + name;
}

// The root of a broadcast (reduce): the only rank that never receives (sends), else 0 (symbolic.py _root).
int32_t collective_root(const Program& p) {
    const bool broadcast = p.coll == "broadcast";
    int32_t root = -1;
    int32_t candidates = 0;
    for (const mlopt::Gpu& gpu : p.gpus) {
        bool moves = false;
        for (const Threadblock& tb : gpu.tbs) {
            for (const mlopt::Step& st : tb.steps) {
                const bool receiving = st.type == StepType::r || st.type == StepType::rcs || st.type == StepType::rrs ||
                                       st.type == StepType::rrc || st.type == StepType::rrcs;
                const bool sending = st.type == StepType::s || st.type == StepType::rcs || st.type == StepType::rrs ||
                                     st.type == StepType::rrcs;
                moves |= st.cnt > 0 && (broadcast ? receiving : sending);
            }
        }
        if (!moves) {
            root = gpu.id;
            ++candidates;
        }
    }
    return candidates == 1 ? root : 0;
}

// What output chunk j of rank r must hold (symbolic.py _Values): one input chunk copied, or the reduction of
// chunk `chunk` over every rank's input, or nothing specified.
struct Expected {
    enum Kind { copy, reduction, unspecified } kind = unspecified;
    int32_t rank = 0;
    size_t chunk = 0;
};

Expected expected_chunk(const Program& p, int32_t root, int32_t r, size_t j) {
    const auto n = static_cast<size_t>(p.ngpus);
    const auto c = static_cast<size_t>(p.nchunksperloop);
    const size_t k = std::max<size_t>(1, c / n);
    Expected e;
    if (p.coll == "allgather") {
        e = {Expected::copy, static_cast<int32_t>(j / k), j % k};
    } else if (p.coll == "alltoall") {
        e = {Expected::copy, static_cast<int32_t>(j / k), static_cast<size_t>(r) * k + j % k};
    } else if (p.coll == "broadcast") {
        e = {Expected::copy, root, j};
    } else if (p.coll == "allreduce") {
        e = {Expected::reduction, 0, j};
    } else if (p.coll == "reducescatter") {
        e = {Expected::reduction, 0, static_cast<size_t>(r) * k + j};
    } else if (p.coll == "reduce" && r == root) {
        e = {Expected::reduction, 0, j};
    }
    return e;
}

// Runs a loaded program on every variant it declares and checks every output chunk: bitwise (float16 random
// bits) for data movement, exactly (float32 small integers) for reductions.
void check_loaded_program(const mlopt_plan_s& plan, const char* file) {
    const Program& p = plan.program;
    const bool reduces = p.coll == "allreduce" || p.coll == "reducescatter" || p.coll == "reduce";
    const mlopt_dtype dtype = reduces ? MLOPT_FLOAT32 : MLOPT_FLOAT16;
    const int32_t root = collective_root(p);
    const size_t per_chunk = 37;
    const size_t count = static_cast<size_t>(p.gpus[0].i_chunks) * per_chunk;
    for (bool inplace : {false, true}) {
        if (inplace ? !p.inplace : !p.outofplace) continue;
        for (const mlopt_run_options& o : {options(0, 0), options(2, 24, 1), options(1, 40, 3)}) {
            Buffers b = make_buffers(p, count, dtype, inplace);
            if (reduces) {
                fill_exact_values(b, dtype, MLOPT_SUM, 41);
            } else {
                fill_random_bits(b, 23);
            }
            std::vector<std::vector<std::byte>> inputs;
            for (size_t r = 0; r < b.inputs.size(); ++r) inputs.emplace_back(b.in(r), b.in(r) + count * b.elem);
            const Outcome out = run(plan, b, dtype, MLOPT_SUM, o);
            const std::string what = std::string(file) + (inplace ? " in-place" : " out-of-place") +
                                     " fifo=" + std::to_string(o.fifo_slots) + " chunk_bytes=" +
                                     std::to_string(o.chunk_bytes);
            EXPECT(out.status == MLOPT_OK, "%s: %s", what.c_str(), out.message.c_str());
            if (out.status != MLOPT_OK) continue;
            const size_t bytes = per_chunk * b.elem;
            for (int32_t r = 0; r < p.ngpus; ++r) {
                for (size_t j = 0; j < static_cast<size_t>(p.gpus[r].o_chunks); ++j) {
                    const Expected e = expected_chunk(p, root, r, j);
                    const std::byte* got = b.out(r) + j * bytes;
                    if (e.kind == Expected::copy) {
                        EXPECT(same_bytes(got, inputs[e.rank].data() + e.chunk * bytes, bytes), "%s: rank %d chunk %zu",
                               what.c_str(), r, j);
                    } else if (e.kind == Expected::reduction) {
                        for (size_t i = 0; i < per_chunk; ++i) {
                            double want = 0;
                            for (const auto& in : inputs) want += load(dtype, in.data(), e.chunk * per_chunk + i);
                            const double value = load(dtype, got, i);
                            if (value != want) {
                                EXPECT(false, "%s: rank %d chunk %zu element %zu is %g, expected %g", what.c_str(), r,
                                       j, i, value, want);
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}

// Every MSCCL-EF XML of tests/data (the two third-party reference algorithms among them) on its number of
// ranks.
void test_reference_xmls() {
    if (&mlopt_plan_load == nullptr) {
        std::printf("skip: the loader is not built in yet\n");
        return;
    }
    const char* files[] = {
        "rccl_alltoall-8n-0-9kb.xml", "msccl-scheduler_ncv4_ag_hier_4_LL.xml", "handmade_nop_deps_2gpu.xml",
        "ring4_allgather.xml",        "ring4_allreduce.xml",                   "ring4_alltoall.xml",
        "ring4_reducescatter_legacy.xml", "switch4_broadcast_legacy.xml",      "ndv2_allreduce_tree.xml",
        "ndv2_allgather_taccl.xml",
    };
    for (const char* file : files) {
        mlopt_plan plan = nullptr;
        mlopt_error err = nullptr;
        const std::string path = data_path(file);
        if (mlopt_plan_load(path.c_str(), &plan, &err) != MLOPT_OK) {
            EXPECT(false, "%s: %s", path.c_str(), err ? mlopt_error_message(err) : "?");
            mlopt_error_free(err);
            continue;
        }
        check_loaded_program(*plan, file);
        mlopt_plan_free(plan);
    }
}

// ------------------------------------------------------------------------------------------------ bench

int bench(int argc, char** argv) {
    const size_t kib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 65536;
    const int64_t chunk_bytes = argc > 3 ? std::strtoll(argv[3], nullptr, 10) : 0;
    const int32_t threads = argc > 4 ? static_cast<int32_t>(std::strtol(argv[4], nullptr, 10)) : 0;
    const int32_t fifo = argc > 5 ? static_cast<int32_t>(std::strtol(argv[5], nullptr, 10)) : 0;
    const int32_t n = 4;
    const Program p = ring_allreduce(n);
    const mlopt_plan_s plan = as_plan(p);
    const size_t count = (kib << 10) / 4 / n * n;
    Buffers b = make_buffers(p, count, MLOPT_FLOAT32, false);
    for (int32_t r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) store(MLOPT_FLOAT32, b.in(r), i, static_cast<double>(i % 7));
    }
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(n, &comm, nullptr);
    const mlopt_run_options o = options(fifo, chunk_bytes, threads);
    std::vector<double> times;
    mlopt_run_stats stats{};
    stats.struct_size = sizeof stats;
    for (int i = 0; i < 8; ++i) {
        mlopt_error err = nullptr;
        if (mlopt_comm_run(comm, &plan, b.inputs.data(), b.outputs.data(), count, MLOPT_FLOAT32, MLOPT_SUM, &o, &err) !=
            MLOPT_OK) {
            std::fprintf(stderr, "run failed: %s\n", mlopt_error_message(err));
            return 1;
        }
        mlopt_comm_last_stats(comm, &stats);
        if (i >= 2) times.push_back(stats.wall_us * 1e-6);  // two warm-up runs
    }
    mlopt_comm_free(comm);
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double bytes = static_cast<double>(count) * 4;
    std::printf("ring allreduce %d ranks, %zu KiB float32, chunk_bytes=%lld threads=%d fifo=%d: median %.3f ms, "
                "algbw %.2f GB/s, busbw %.2f GB/s, %lld steps (%.2f us/step)\n",
                n, kib, static_cast<long long>(chunk_bytes), threads, fifo, median * 1e3, bytes / median / 1e9,
                bytes / median / 1e9 * 2 * (n - 1) / n, static_cast<long long>(stats.steps_executed),
                median * 1e6 / static_cast<double>(std::max<int64_t>(1, stats.steps_executed)));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "bench") == 0) return bench(argc, argv);
    const std::vector<std::pair<const char*, std::function<void()>>> tests = {
        {"conversions", test_conversions},
        {"reduce kernels", test_reduce_kernels},
        {"allgather", test_allgather},
        {"allreduce, every dtype and op", test_allreduce_every_dtype_and_op},
        {"reducescatter", test_reducescatter},
        {"alltoall", test_alltoall},
        {"dependencies", test_dependencies},
        {"slicing and FIFOs", test_slicing_and_fifos},
        {"deadlocks", test_deadlocks},
        {"watchdog", test_watchdog},
        {"message mismatch", test_message_mismatch},
        {"argument errors", test_argument_errors},
        {"reference XMLs", test_reference_xmls},
    };
    for (const auto& [name, fn] : tests) {
        const int before = g_failures;
        const auto start = std::chrono::steady_clock::now();
        fn();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("%-32s %s (%.2f s)\n", name, g_failures == before ? "ok" : "FAILED", s);
    }
    if (g_failures > 0) std::printf("%d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}

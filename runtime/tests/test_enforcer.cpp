// Tests of the enforcer (src/enforcer.*, mlopt.h "enforcer"): Syndicate's Pseudocode 2 over in-process ranks.
// Every rank is a thread of this test acting as its application; results are checked element by element
// against sums computed here (small integer values: float sums are exact in any order).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"
#include "motifs.hpp"
#include "plans.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace mlopt_test;

// One application thread per rank; an exception (a failed call through the C++ wrapper) is a failed check.
void run_ranks(const std::function<void(int32_t)>& body) {
    std::vector<std::string> errors(kRanks);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < kRanks; ++r)
        threads.emplace_back([&, r] {
            try {
                body(r);
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (const std::string& error : errors) CHECK_EQ(error, "");
}

mlopt::Enforcer make(int32_t enforce, int32_t watchdog_ms = 10000) {
    mlopt_enforcer_options o = mlopt::default_enforcer_options();
    o.enforce_order = enforce;
    o.watchdog_ms = watchdog_ms;
    return mlopt::Enforcer::create(kRanks, o);
}

// Ops A (op 0) and B (op 1), each an allreduce in two segments (masks of segments 0 and 1); A's segments have
// seq 0, B's seq 1.
void add_two_segmented_ops(mlopt::Enforcer& e, const mlopt::Plan& plan, uint64_t mask0, uint64_t mask1) {
    for (int32_t op = 0; op < 2; ++op)
        for (int32_t seg = 0; seg < 2; ++seg) {
            const Result r = add(e.get(), segment(plan, op, seg, 2, op, seg == 0 ? mask0 : mask1));
            CHECK_EQ(r.message, "");
        }
}

// Ranks 0 and 2 submit A then B, ranks 1 and 3 B then A (op 1 in place); then each waits for everything.
std::vector<Outcome> submit_crossed(mlopt::Enforcer& e, Buffers& b) {
    std::vector<Outcome> outcomes(kRanks);
    run_ranks([&](int32_t r) {
        const int32_t order[2] = {r % 2, 1 - r % 2};
        for (const int32_t o : order) {
            float* in = b.in[r * 2 + o].data();
            float* out = o == 1 ? in : b.out[r * 2 + o].data();
            mlopt_error err = nullptr;
            const auto since = Clock::now();
            const mlopt_status s = mlopt_enforcer_submit(e.get(), r, o, in, out, &err);
            if (s != MLOPT_OK) {
                outcomes[r] = outcome(s, err, since);
                return;
            }
        }
        mlopt_error err = nullptr;
        const auto since = Clock::now();
        const mlopt_status s = mlopt_enforcer_wait(e.get(), r, -1, &err);
        outcomes[r] = outcome(s, err, since);
    });
    return outcomes;
}

// Op 1 runs in place: its results are in `in`.
int bad_crossed(const Buffers& b, int32_t o, int64_t iteration) {
    if (o == 0) return b.bad_sums(0, iteration);
    Buffers view = b;
    view.out = view.in;
    return view.bad_sums(1, iteration);
}

// (1) Different submission orders, enforced: correct sums, one issue order on every rank, several iterations;
// with the segments on disjoint channels and on one channel alike.
void test_different_orders_enforced() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    for (const auto& [mask0, mask1] : {std::pair<uint64_t, uint64_t>{1, 2}, {1, 1}}) {
        mlopt::Enforcer e = make(1);
        add_two_segmented_ops(e, plan, mask0, mask1);
        e.start();
        Buffers b(2);
        constexpr int64_t kIterations = 3;
        for (int64_t it = 0; it < kIterations; ++it) {
            b.fill(it);
            for (const Outcome& o : submit_crossed(e, b)) CHECK_EQ(o.message, "");
            CHECK_EQ(bad_crossed(b, 0, it), 0);
            CHECK_EQ(bad_crossed(b, 1, it), 0);
        }
        const std::vector<mlopt::IssuedMotif> first = e.issue_log(0);
        REQUIRE(first.size() == 4 * kIterations);
        for (size_t i = 0; i < first.size(); ++i) {  // per iteration: A.0 A.1 B.0 B.1
            CHECK_EQ(first[i].iteration, static_cast<int32_t>(i / 4));
            CHECK_EQ(first[i].op, static_cast<int32_t>(i % 4 / 2));
            CHECK_EQ(first[i].index, static_cast<int32_t>(i % 2));
        }
        for (int32_t r = 1; r < kRanks; ++r) {
            const std::vector<mlopt::IssuedMotif> log = e.issue_log(r);
            REQUIRE(log.size() == first.size());
            for (size_t i = 0; i < log.size(); ++i)
                CHECK(log[i].op == first[i].op && log[i].index == first[i].index &&
                      log[i].iteration == first[i].iteration);
        }
        const mlopt_enforcer_stats st = e.stats(3);
        CHECK_EQ(st.iterations, kIterations);
        CHECK_EQ(st.motifs_issued, 4 * kIterations);
        CHECK_EQ(st.motifs_completed, 4 * kIterations);
        CHECK(st.last_wall_us > 0);
    }
}

// (1) The same without enforcement and on one channel: every rank's channel queue starts with another op, so
// nothing can run; the watchdog reports it and free does not hang.
void test_different_orders_deadlock_without_enforcement() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Enforcer e = make(0, 300);
    add_two_segmented_ops(e, plan, 1, 1);
    e.start();
    Buffers b(2);
    b.fill(0);
    for (const Outcome& o : submit_crossed(e, b)) {
        CHECK_EQ(o.status, MLOPT_ERR_DEADLOCK);
        CHECK_CONTAINS(o.message, "deadlock");
        CHECK_CONTAINS(o.message, "channel 0 head op");
        CHECK(o.seconds < 5.0);
    }
    CHECK_EQ(e.issue_log(0).front().op, 0);  // in arrival order
    CHECK_EQ(e.issue_log(1).front().op, 1);
    try {  // sticky: every later call reports it
        e.wait(0, 0);
        CHECK(!"wait after a deadlock succeeded");
    } catch (const mlopt::Error& err) {
        CHECK_EQ(err.status(), MLOPT_ERR_DEADLOCK);
    }
    const auto since = Clock::now();
    { mlopt::Enforcer gone = std::move(e); }
    CHECK(std::chrono::duration<double>(Clock::now() - since).count() < 5.0);
}

// The baseline works when every rank submits in the same order.
void test_no_enforcement_with_one_order() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Enforcer e = make(0, 5000);
    add_two_segmented_ops(e, plan, 1, 1);
    e.start();
    Buffers b(2);
    b.fill(0);
    run_ranks([&](int32_t r) {
        for (int32_t o = 0; o < 2; ++o) e.submit(r, o, b.in[r * 2 + o].data(), b.out[r * 2 + o].data());
        e.wait(r);
    });
    CHECK_EQ(b.bad_sums(0, 0), 0);
    CHECK_EQ(b.bad_sums(1, 0), 0);
    CHECK_EQ(e.stats(2).wait_us, 0.0);
}

// (2) A.1's ring all-reduce: reduce-scatter, then (deps) allgather, over the op's four 64-byte blocks.
void test_ring_allreduce_with_deps() {
    const mlopt::Plan rs = mlopt::Plan::load(data_path("ring4_reducescatter_legacy.xml"));  // i_chunks 8, o 2
    const mlopt::Plan ag = mlopt::Plan::load(data_path("ring4_allgather.xml"));             // i_chunks 2, o 8
    // (allgather seq, allgather mask): after, issued with it (tie broken by index), on another channel.
    for (const auto& [seq, mask] : {std::pair<int32_t, uint64_t>{1, 1}, {0, 1}, {1, 2}}) {
        mlopt::Enforcer e = make(1);
        const ScatterGather m = scatter_gather(rs, ag, 0, 0, seq, mask);
        CHECK_EQ(add(e.get(), m.rs).message, "");
        CHECK_EQ(add(e.get(), m.ag).message, "");
        e.start();
        Buffers b(1);
        for (int64_t it = 0; it < 2; ++it) {
            b.fill(it);
            run_ranks([&](int32_t r) {
                e.submit(r, 0, b.in[r].data(), b.out[r].data());
                e.wait(r, 0);
            });
            CHECK_EQ(b.bad_sums(0, it), 0);
        }
        CHECK_EQ(e.stats(1).iterations, 2);
    }
}

// (3) Motifs of two ops with one seq on disjoint channels are issued together: a 4-rank allreduce (channel 0)
// and two 2-rank allreduces over ranks {0, 2} and {3, 1} (channel 1).
void test_equal_seqs_on_disjoint_channels() {
    const mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    const mlopt::Plan ar2 = mlopt::Plan::from_memory(kAllreduce2, "ar2.xml");
    mlopt::Enforcer e = make(1);
    Spec whole = segment(ar4, 0, 0, 1, 0, 1);
    CHECK_EQ(add(e.get(), whole).message, "");
    for (int32_t i = 0; i < 2; ++i) {
        Spec pair;
        pair.op = 1;
        pair.index = i;
        pair.mask = 2;
        pair.ranks = i == 0 ? std::vector<int32_t>{0, 2} : std::vector<int32_t>{3, 1};
        pair.plan = &ar2;
        pair.count = kElems;
        pair.gather = same(2, {{0, 0, kOpBytes}});
        pair.scatter = pair.gather;
        CHECK_EQ(add(e.get(), pair).message, "");
    }
    e.start();
    Buffers b(2);
    b.fill(0);
    run_ranks([&](int32_t r) {  // op 1 first: its seq is op 0's, so neither is issued before both are here
        e.submit(r, 1, b.in[r * 2 + 1].data(), b.out[r * 2 + 1].data());
        e.submit(r, 0, b.in[r * 2].data(), b.out[r * 2].data());
        e.wait(r);
    });
    CHECK_EQ(b.bad_sums(0, 0), 0);
    for (int32_t r = 0; r < kRanks; ++r) {
        const int32_t peer = r == 0 ? 2 : r == 2 ? 0 : r == 1 ? 3 : 1;
        int bad = 0;
        for (size_t i = 0; i < kElems; ++i)
            if (b.out[r * 2 + 1][i] != value(r, 1, 0, i) + value(peer, 1, 0, i)) ++bad;
        CHECK_EQ(bad, 0);
        const std::vector<mlopt::IssuedMotif> log = e.issue_log(r);
        REQUIRE(log.size() == 2);
        CHECK(log[0].op == 0 && log[0].index == 0 && log[0].iteration == 0);
        CHECK(log[1].op == 1 && log[1].index == (r == 0 || r == 2 ? 0 : 1) && log[1].iteration == 0);
    }
}

Result start(mlopt::Enforcer& e) {
    mlopt_error err = nullptr;
    Result r{mlopt_enforcer_start(e.get(), &err), ""};
    if (err) r.message = mlopt_error_message(err);
    mlopt_error_free(err);
    return r;
}

void expect_invalid(const Result& r, std::initializer_list<const char*> parts) {
    CHECK_EQ(r.status, MLOPT_ERR_INVALID_ARGUMENT);
    for (const char* part : parts) CHECK_CONTAINS(r.message, part);
}

// (4) Bad motifs are refused when added, with the op, the motif and the field named.
void test_add_motif_validation() {
    const mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Enforcer e = make(1);
    const Spec good = segment(ar4, 0, 0, 1, 0, 1);
    auto variant = [&](const std::function<void(Spec&)>& change) {
        Spec s = good;
        change(s);
        return add(e.get(), s);
    };
    expect_invalid(variant([](Spec& s) { s.ranks = {0, 7, 2, 3}; }), {"motif (op 0, index 0, 'm')", "ranks[1]=7"});
    expect_invalid(variant([](Spec& s) { s.ranks = {0, 1, 1, 3}; }), {"ranks[2]=1 repeats ranks[1]"});
    expect_invalid(variant([](Spec& s) { s.gather[2] = {{200, 0, 100}}; }),
                   {"positions[2].gather[0]", "past op_bytes=256"});
    expect_invalid(variant([](Spec& s) { s.scatter[0] = {{0, 200, 100}}; }),
                   {"positions[0].scatter[0]", "staging_offset 200", "program output's 256 bytes"});
    expect_invalid(variant([](Spec& s) { s.ranks = {0, 1}; }), {"program ngpus=4", "nranks=2"});
    expect_invalid(variant([](Spec& s) { s.count = 60; }), {"count=60", "i_chunks=8"});
    expect_invalid(variant([](Spec& s) { s.deps = {0}; }), {"deps[0]=0"});
    expect_invalid(variant([](Spec& s) { s.mask = 0; }), {"channel_mask=0"});
    expect_invalid(variant([](Spec& s) { s.plan = nullptr; }), {"program is NULL"});
    expect_invalid(variant([](Spec& s) { s.seq = -1; }), {"seq=-1"});
    CHECK_EQ(add(e.get(), good).status, MLOPT_OK);
    expect_invalid(add(e.get(), good), {"already has a motif with this index"});
    expect_invalid(variant([](Spec& s) { s.index = 1, s.op_bytes = 512; }), {"op_bytes=512", "op 0 motif 0"});
    mlopt_motif_desc small{};
    small.struct_size = 8;
    expect_invalid(Result{mlopt_enforcer_add_motif(e.get(), &small, nullptr), ""}, {});
}

// (4) The table is checked when it is frozen.
void test_start_validation() {
    const mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    {
        mlopt::Enforcer e = make(1);
        expect_invalid(start(e), {"no motifs"});
    }
    {
        mlopt::Enforcer e = make(1);
        CHECK_EQ(add(e.get(), segment(ar4, 0, 0, 2, 0, 1)).status, MLOPT_OK);
        Spec third = segment(ar4, 0, 1, 2, 0, 1);
        third.index = 2;
        CHECK_EQ(add(e.get(), third).status, MLOPT_OK);
        expect_invalid(start(e), {"op 0: motif index 1 is missing", "0, 2"});
    }
    {
        mlopt::Enforcer e = make(1);
        CHECK_EQ(add(e.get(), segment(ar4, 1, 0, 1, 0, 1)).status, MLOPT_OK);
        expect_invalid(start(e), {"op 0 has no motifs"});
    }
    {
        mlopt::Enforcer e = make(1);
        CHECK_EQ(add(e.get(), segment(ar4, 0, 0, 2, 5, 1)).status, MLOPT_OK);
        Spec later = segment(ar4, 0, 1, 2, 2, 1);
        later.deps = {0};
        CHECK_EQ(add(e.get(), later).status, MLOPT_OK);
        expect_invalid(start(e), {"op 0 motif 1 ('m')", "has seq 5 > this motif's seq 2"});
    }
}

// (4) Calls out of place: bad ranks and ops, a rank outside the op, all-to-all in place, late adds, options.
void test_call_validation() {
    const mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    const mlopt::Plan ar2 = mlopt::Plan::from_memory(kAllreduce2, "ar2.xml");
    mlopt::Enforcer e = make(1);
    float buffer[kElems] = {};
    expect_invalid(Result{mlopt_enforcer_wait(e.get(), 0, 0, nullptr), ""}, {});
    CHECK_EQ(add(e.get(), segment(ar4, 0, 0, 1, 0, 1)).status, MLOPT_OK);
    Spec pair;
    pair.op = 1;
    pair.ranks = {0, 1};
    pair.plan = &ar2;
    pair.count = kElems;
    pair.source = MLOPT_MOTIF_FROM_INPUT;
    pair.gather = same(2, {{0, 0, kOpBytes}});
    CHECK_EQ(add(e.get(), pair).status, MLOPT_OK);
    CHECK_EQ(start(e).status, MLOPT_OK);
    expect_invalid(add(e.get(), segment(ar4, 2, 0, 1, 0, 1)), {"frozen"});
    expect_invalid(start(e), {"already started"});
    auto submit = [&](int32_t rank, int32_t op, void* in, void* out) {
        mlopt_error err = nullptr;
        Result r{mlopt_enforcer_submit(e.get(), rank, op, in, out, &err), ""};
        if (err) r.message = mlopt_error_message(err);
        mlopt_error_free(err);
        return r;
    };
    float other[kElems] = {};
    expect_invalid(submit(9, 0, buffer, buffer), {"rank=9"});
    expect_invalid(submit(0, 5, buffer, buffer), {"op is not in 0..1"});
    expect_invalid(submit(2, 1, buffer, other), {"no motif of the op involves the rank"});
    expect_invalid(submit(0, 1, buffer, buffer), {"output must be another buffer"});
    expect_invalid(submit(0, 0, nullptr, buffer), {"NULL"});
    mlopt_enforcer_options o = mlopt::default_enforcer_options();
    o.enforce_order = 2;
    mlopt_enforcer bad = nullptr;
    CHECK_EQ(mlopt_enforcer_create(4, &o, &bad, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    CHECK(bad == nullptr);
    CHECK_EQ(mlopt_enforcer_create(0, nullptr, &bad, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_enforcer_stats st{};
    CHECK_EQ(mlopt_enforcer_get_stats(e.get(), 0, &st, nullptr), MLOPT_ERR_INVALID_ARGUMENT);  // no struct_size
    mlopt_enforcer_free(nullptr);
}

// (5) A rank that submits B (seq 1) and only later A (seq 0) waits in ENFORCEORDER: the time is its wait
// time, and it dominates the iteration, so a replan is suggested; the ranks in order never wait.
void test_wait_time_and_replan() {
    const mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Enforcer e = make(1);
    CHECK_EQ(add(e.get(), segment(ar4, 0, 0, 1, 0, 1)).status, MLOPT_OK);
    CHECK_EQ(add(e.get(), segment(ar4, 1, 0, 1, 1, 1)).status, MLOPT_OK);
    e.start();
    Buffers b(2);
    for (int64_t it = 0; it < 2; ++it) {
        b.fill(it);
        run_ranks([&](int32_t r) {
            const bool late = r == 3 && it == 0;
            const int32_t order[2] = {late ? 1 : 0, late ? 0 : 1};
            for (const int32_t o : order) {
                e.submit(r, o, b.in[r * 2 + o].data(), b.out[r * 2 + o].data());
                if (late && o == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
            e.wait(r);
        });
        CHECK_EQ(b.bad_sums(0, it), 0);
        CHECK_EQ(b.bad_sums(1, it), 0);
        const mlopt_enforcer_stats late = e.stats(3);
        const mlopt_enforcer_stats early = e.stats(0);
        CHECK_EQ(late.iterations, it + 1);
        CHECK_EQ(early.last_wait_us, 0.0);
        CHECK_EQ(early.replan_suggested, 0);
        if (it == 0) {
            CHECK(late.last_wait_us > 100000.0);
            CHECK(late.last_wall_us >= late.last_wait_us);
            CHECK_EQ(late.replan_suggested, 1);
        } else {  // submitted in order: no wait this time, the total keeps the first one
            CHECK_EQ(late.last_wait_us, 0.0);
            CHECK_EQ(late.replan_suggested, 0);
            CHECK(late.wait_us > 100000.0);
        }
    }
}

// Iteration k+1 submitted before iteration k completed (other buffers): both right.
void test_pipelined_iterations() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Enforcer e = make(1);
    add_two_segmented_ops(e, plan, 1, 2);
    e.start();
    Buffers b0(2), b1(2);
    b0.fill(0);
    b1.fill(1);
    run_ranks([&](int32_t r) {
        for (Buffers* b : {&b0, &b1})
            for (int32_t o = 0; o < 2; ++o) e.submit(r, o, b->in[r * 2 + o].data(), b->out[r * 2 + o].data());
        e.wait(r, 1);  // the latest submission of op 1: iteration 1's
    });
    e.drain();
    for (int32_t o = 0; o < 2; ++o) {
        CHECK_EQ(b0.bad_sums(o, 0), 0);
        CHECK_EQ(b1.bad_sums(o, 1), 0);
    }
    CHECK_EQ(e.stats(0).iterations, 2);
}

// free with work pending (only some ranks submitted) or running returns promptly.
void test_free_with_pending_work() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    for (const int32_t enforce : {0, 1})
        for (const int32_t submitting : {2, 4}) {
            mlopt::Enforcer e = make(enforce);
            add_two_segmented_ops(e, plan, 1, 2);
            e.start();
            Buffers b(2);
            b.fill(0);
            for (int32_t r = 0; r < submitting; ++r)
                for (int32_t o = 0; o < 2; ++o) e.submit(r, o, b.in[r * 2 + o].data(), b.out[r * 2 + o].data());
            const auto since = Clock::now();
            { mlopt::Enforcer gone = std::move(e); }
            CHECK(std::chrono::duration<double>(Clock::now() - since).count() < 5.0);
        }
}

}  // namespace

int main() try {
    test_different_orders_enforced();
    test_different_orders_deadlock_without_enforcement();
    test_no_enforcement_with_one_order();
    test_ring_allreduce_with_deps();
    test_equal_seqs_on_disjoint_channels();
    test_add_motif_validation();
    test_start_validation();
    test_call_validation();
    test_wait_time_and_replan();
    test_pipelined_iterations();
    test_free_with_pending_work();
    return check::finish("test_enforcer");
} catch (const std::exception& e) {  // mlopt::Error from the C++ wrapper: a call the test expected to work failed
    CHECK(!"uncaught exception");
    std::fprintf(stderr, "uncaught exception: %s\n", e.what());
    return check::finish("test_enforcer");
}

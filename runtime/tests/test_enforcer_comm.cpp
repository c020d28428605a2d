// Tests of the enforcer over multi-process communicators (mlopt_enforcer_create_comm, src/enforcer.cpp) without
// processes: each rank is a communicator made by make_comm_for_test over one in-memory transport group, with its
// own enforcer and its own application thread, submitting in its own order. Results and issue logs are compared
// with the in-process enforcer's (mlopt_enforcer_create) on the same table and inputs.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "comm.hpp"
#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"
#include "motifs.hpp"
#include "plans.hpp"
#include "run_rank.hpp"
#include "transport.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace mlopt_test;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Plans {
    mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Plan rs = mlopt::Plan::load(data_path("ring4_reducescatter_legacy.xml"));
    mlopt::Plan ag = mlopt::Plan::load(data_path("ring4_allgather.xml"));
    mlopt::Plan ar2 = mlopt::Plan::from_memory(kAllreduce2, "ar2.xml");
};

Spec pair(const Plans& plans, int32_t op, int32_t index, std::vector<int32_t> ranks, int32_t seq, uint64_t mask) {
    Spec s;
    s.op = op;
    s.index = index;
    s.seq = seq;
    s.mask = mask;
    s.ranks = std::move(ranks);
    s.plan = &plans.ar2;
    s.count = kElems;
    s.gather = same(2, {{0, 0, kOpBytes}});
    s.scatter = s.gather;
    return s;
}

// The table every test uses (some keep only ops 0 and 1):
//   op 0, 1: 4-rank allreduces in two segments on channels mask0 / mask1, seq 0 and 1 (op 1 runs in place);
//   op 2: 2-rank allreduces over {0, 2} and {3, 1} on channel 2, seq 0 (issued with op 0);
//   op 3: reduce-scatter, then (deps) allgather on channels 0 and 1, seqs 2 and 3;
//   op 4: a 2-rank allreduce over {0, 1}, then (deps, same seq and channel) one over {1, 2}: rank 2 runs the
//         second without seeing the first, which is another process's motif.
void add_table(mlopt_enforcer e, const Plans& plans, uint64_t mask0, uint64_t mask1, bool full) {
    for (int32_t op = 0; op < 2; ++op)
        for (int32_t seg = 0; seg < 2; ++seg)
            CHECK_EQ(add(e, segment(plans.ar4, op, seg, 2, op, seg ? mask1 : mask0)).message, "");
    if (!full) return;
    CHECK_EQ(add(e, pair(plans, 2, 0, {0, 2}, 0, 4)).message, "");
    CHECK_EQ(add(e, pair(plans, 2, 1, {3, 1}, 0, 4)).message, "");
    const ScatterGather rs_ag = scatter_gather(plans.rs, plans.ag, 3, 2, 3, 2);
    CHECK_EQ(add(e, rs_ag.rs).message, "");
    CHECK_EQ(add(e, rs_ag.ag).message, "");
    CHECK_EQ(add(e, pair(plans, 4, 0, {0, 1}, 4, 8)).message, "");
    Spec second = pair(plans, 4, 1, {1, 2}, 4, 8);
    second.deps = {0};
    CHECK_EQ(add(e, second).message, "");
}

// The ops each rank submits, in its own order (every rank a different one).
std::vector<int32_t> submission_order(int32_t rank, bool full) {
    std::vector<int32_t> ops = {0, 1};
    if (full) {
        ops = {0, 1, 2, 3};
        if (rank <= 2) ops.push_back(4);
    }
    std::rotate(ops.begin(), ops.begin() + rank % static_cast<int32_t>(ops.size()), ops.end());
    if (rank % 2) std::reverse(ops.begin(), ops.end());
    return ops;
}

// The table's buffers (ops 0..4); op 1 runs in place (its results are in `in`).
struct TableBuffers : Buffers {
    TableBuffers() : Buffers(5) {}
    float* output(int32_t r, int32_t o) { return o == 1 ? input(r, o) : out[r * ops + o].data(); }
};

// Rank r's application: submits `ops` in that order, then waits for all of them.
Outcome application(mlopt_enforcer e, int32_t r, TableBuffers& b, const std::vector<int32_t>& ops) {
    mlopt_error err = nullptr;
    const auto since = Clock::now();
    mlopt_status s = MLOPT_OK;
    for (const int32_t o : ops) {
        s = mlopt_enforcer_submit(e, r, o, b.input(r, o), b.output(r, o), &err);
        if (s != MLOPT_OK) break;
    }
    if (s == MLOPT_OK) s = mlopt_enforcer_wait(e, r, -1, &err);
    return outcome(s, err, since);
}

// CHECK is not thread-safe: rank threads return Outcomes, the main thread checks them.
std::vector<Outcome> on_every_rank(const std::function<Outcome(int32_t)>& body) {
    std::vector<Outcome> outcomes(kRanks);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { outcomes[r] = body(r); });
    for (std::thread& t : threads) t.join();
    return outcomes;
}

mlopt_enforcer_options enforcer_options(int32_t enforce_order, int32_t watchdog_ms) {
    mlopt_enforcer_options o = mlopt::default_enforcer_options();
    o.enforce_order = enforce_order;
    o.watchdog_ms = watchdog_ms;
    return o;
}

// kRanks communicators over one in-memory transport group and an enforcer on each ("a process per rank").
struct World {
    std::unique_ptr<mlopt::MemoryTransportGroup> group;
    std::vector<mlopt_comm> comms;
    std::vector<mlopt::Enforcer> enforcers;

    World(const mlopt_enforcer_options& o, size_t fifo_bytes)
        : group(mlopt::make_memory_transport_group(kRanks, fifo_bytes)) {
        for (int32_t r = 0; r < kRanks; ++r) {
            comms.push_back(mlopt::make_comm_for_test(r, kRanks, mlopt::borrow_transport(group->rank_view(r))));
            mlopt_enforcer e = nullptr;
            mlopt_error err = nullptr;
            CHECK_EQ(mlopt_enforcer_create_comm(comms.back(), &o, &e, &err), MLOPT_OK);
            mlopt_error_free(err);
            enforcers.emplace_back(e);
        }
    }
    ~World() {
        enforcers.clear();  // before the communicators they run on
        for (mlopt_comm c : comms) mlopt_comm_free(c);
    }
    World(const World&) = delete;
    World& operator=(const World&) = delete;

    // The table (add_table) on every enforcer, then every enforcer started.
    void start(const Plans& plans, uint64_t mask0, uint64_t mask1, bool full) {
        for (mlopt::Enforcer& e : enforcers) add_table(e.get(), plans, mask0, mask1, full);
        for (mlopt::Enforcer& e : enforcers) e.start();
    }
};

bool same_issue_log(const std::vector<mlopt::IssuedMotif>& a, const std::vector<mlopt::IssuedMotif>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].op != b[i].op || a[i].index != b[i].index || a[i].iteration != b[i].iteration) return false;
    return true;
}

// ------------------------------------------------------------------------------------------------ tests

// Every rank submits in its own order; the enforcers over the communicators give the in-process enforcer's
// results bit for bit and issue in its order, over several iterations; on disjoint channels and on one.
void test_same_as_in_process() {
    const Plans plans;
    constexpr int64_t kIterations = 3;
    for (const auto& [mask0, mask1] : {std::pair<uint64_t, uint64_t>{1, 2}, {1, 1}}) {
        const mlopt_enforcer_options o = enforcer_options(1, 10000);
        mlopt::Enforcer local = mlopt::Enforcer::create(kRanks, o);
        add_table(local.get(), plans, mask0, mask1, true);
        local.start();
        World world(o, 4096);
        world.start(plans, mask0, mask1, true);
        TableBuffers want, got;
        for (int64_t it = 0; it < kIterations; ++it) {
            want.fill(it);
            got.fill(it);
            for (const Outcome& out : on_every_rank([&](int32_t r) {
                     return application(local.get(), r, want, submission_order(r, true));
                 }))
                CHECK_EQ(out.message, "");
            for (const Outcome& out : on_every_rank([&](int32_t r) {
                     return application(world.enforcers[r].get(), r, got, submission_order(r, true));
                 }))
                CHECK_EQ(out.message, "");
            CHECK(want.in == got.in);
            CHECK(want.out == got.out);
            float sum = 0;  // a sanity check of the reference: op 0 element 0 is the sum over the ranks
            for (int32_t r = 0; r < kRanks; ++r) sum += value(r, 0, it, 0);
            CHECK_EQ(want.output(3, 0)[0], sum);
        }
        for (int32_t r = 0; r < kRanks; ++r) {
            const std::vector<mlopt::IssuedMotif> log = world.enforcers[r].issue_log(r);
            CHECK(same_issue_log(log, local.issue_log(r)));
            const mlopt_enforcer_stats st = world.enforcers[r].stats(r);
            const mlopt_enforcer_stats ref = local.stats(r);
            CHECK_EQ(st.iterations, kIterations);
            CHECK_EQ(st.motifs_issued, ref.motifs_issued);
            CHECK_EQ(st.motifs_completed, ref.motifs_completed);
        }
    }
}

// The baseline without enforcement works when every rank submits in one order, and deadlocks (reported, not a
// hang) when the orders differ on a shared channel: each rank runs another op's motif on channel 0.
void test_without_enforcement() {
    const Plans plans;
    {
        World world(enforcer_options(0, 5000), 4096);
        world.start(plans, 1, 1, false);
        TableBuffers b;
        b.fill(0);
        const auto outs =
            on_every_rank([&](int32_t r) { return application(world.enforcers[r].get(), r, b, {0, 1}); });
        for (const Outcome& out : outs) CHECK_EQ(out.message, "");
        float sum = 0;
        for (int32_t r = 0; r < kRanks; ++r) sum += value(r, 0, 0, 5);
        for (int32_t r = 0; r < kRanks; ++r) CHECK_EQ(b.output(r, 0)[5], sum);
    }
    World world(enforcer_options(0, 300), 4096);
    world.start(plans, 1, 1, false);
    TableBuffers b;
    b.fill(0);
    const auto outs = on_every_rank([&](int32_t r) {  // ranks 0 and 2: op 0 first; 1 and 3: op 1 first
        return application(world.enforcers[r].get(), r, b, {r % 2, 1 - r % 2});
    });
    int out_of_order = 0;
    for (const Outcome& out : outs) {
        CHECK_EQ(out.status, MLOPT_ERR_DEADLOCK);
        CHECK_CONTAINS(out.message, "deadlock");
        out_of_order += out.message.find("different orders") != std::string::npos;
        CHECK(out.seconds < 5.0);
    }
    CHECK(out_of_order > 0);
    CHECK_EQ(world.enforcers[0].issue_log(0).front().op, 0);  // in arrival order
    CHECK_EQ(world.enforcers[1].issue_log(1).front().op, 1);
    const auto since = Clock::now();
    world.enforcers.clear();
    CHECK(seconds_since(since) < 5.0);
    // The failed motif run broke the communicator. Its enforcer thread does so when the run returns, which may be
    // after the application's own wait gave up (both watch one deadline): read it once the threads have joined.
    CHECK(world.comms[0]->broken_status != MLOPT_OK);
}

// A process handles its own rank only; an in-process communicator is refused.
void test_call_validation() {
    const Plans plans;
    World world(enforcer_options(1, 10000), 4096);
    mlopt::Enforcer& e = world.enforcers[1];
    add_table(e.get(), plans, 1, 2, true);
    e.start();
    float buffer[kElems] = {};
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_enforcer_submit(e.get(), 0, 0, buffer, buffer, &err), MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(mlopt_error_message(err), "rank=0 is not this process's rank 1");
    mlopt_error_free(err);
    CHECK_EQ(mlopt_enforcer_submit(e.get(), 1, 4, buffer, buffer, nullptr), MLOPT_OK);  // op 4 involves rank 1
    CHECK_EQ(mlopt_enforcer_wait(e.get(), 2, -1, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_enforcer_stats st{};
    st.struct_size = sizeof st;
    CHECK_EQ(mlopt_enforcer_get_stats(e.get(), 3, &st, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    size_t count = 0;
    CHECK_EQ(mlopt_enforcer_issue_log(e.get(), 0, nullptr, nullptr, nullptr, 0, &count, nullptr),
             MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_EQ(mlopt_enforcer_issue_log(e.get(), 1, nullptr, nullptr, nullptr, 0, &count, nullptr), MLOPT_OK);
    // Rank 3 is in no motif of op 4.
    CHECK_EQ(mlopt_enforcer_submit(world.enforcers[3].get(), 3, 4, buffer, buffer, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_comm local = nullptr;
    CHECK_EQ(mlopt_comm_create_local(2, &local, nullptr), MLOPT_OK);
    mlopt_enforcer bad = nullptr;
    CHECK_EQ(mlopt_enforcer_create_comm(local, nullptr, &bad, &err), MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(mlopt_error_message(err), "in-process communicator");
    mlopt_error_free(err);
    CHECK(bad == nullptr);
    mlopt_comm_free(local);
    CHECK_EQ(mlopt_enforcer_create_comm(nullptr, nullptr, &bad, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    // A broken communicator takes no enforcer.
    mlopt_comm broken = mlopt::make_comm_for_test(0, kRanks, mlopt::borrow_transport(world.group->rank_view(0)));
    mlopt::break_comm(*broken, MLOPT_ERR_DEADLOCK, "an earlier failure");
    CHECK_EQ(mlopt_enforcer_create_comm(broken, nullptr, &bad, &err), MLOPT_ERR_DEADLOCK);
    CHECK_CONTAINS(mlopt_error_message(err), "an earlier failure");
    mlopt_error_free(err);
    mlopt_comm_free(broken);
}

// free with work pending (some ranks never submit, so a motif waits for them) returns promptly: the running
// motif is cancelled, which breaks its communicator.
void test_free_with_pending_work() {
    const Plans plans;
    World world(enforcer_options(1, 10000), 4096);
    world.start(plans, 1, 2, false);
    TableBuffers b;
    b.fill(0);
    for (int32_t r = 0; r < 2; ++r)
        for (int32_t o = 0; o < 2; ++o) world.enforcers[r].submit(r, o, b.input(r, o), b.output(r, o));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let rank 0's first motif start and wait
    const auto since = Clock::now();
    world.enforcers.clear();
    CHECK(seconds_since(since) < 3.0);
    CHECK_EQ(world.comms[0]->broken_status, MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(world.comms[0]->broken, "cancelled");
}

}  // namespace

int main() try {
    const std::vector<std::pair<const char*, void (*)()>> tests = {
        {"same as in process", test_same_as_in_process},
        {"without enforcement", test_without_enforcement},
        {"call validation", test_call_validation},
        {"free with pending work", test_free_with_pending_work},
    };
    for (const auto& [name, fn] : tests) {
        const auto start = Clock::now();
        const int before = check::failures();
        fn();
        std::printf("%-24s %s (%.2f s)\n", name, check::failures() == before ? "ok" : "FAILED", seconds_since(start));
    }
    return check::finish("test_enforcer_comm");
} catch (const std::exception& e) {  // mlopt::Error from the C++ wrapper: a call the test expected to work failed
    CHECK(!"uncaught exception");
    std::fprintf(stderr, "uncaught exception: %s\n", e.what());
    return check::finish("test_enforcer_comm");
}

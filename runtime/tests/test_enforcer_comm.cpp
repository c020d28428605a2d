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
#include "run_rank.hpp"
#include "transport.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string data_path(const std::string& name) {
    const char* repo = std::getenv("MLOPT_REPO");
    return (repo && *repo ? std::string(repo) + "/runtime/tests/data" : std::string("data")) + "/" + name;
}

// A 2-rank allreduce of one chunk (test_enforcer.cpp's).
const char* const kAllreduce2 = R"(<algo name="ar2" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2"
    coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="1099511627776">
  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="1" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>)";

constexpr int32_t kRanks = 4;
constexpr size_t kElems = 64;
constexpr uint64_t kOpBytes = kElems * 4;

struct Plans {
    mlopt::Plan ar4 = mlopt::Plan::load(data_path("ring4_allreduce.xml"));
    mlopt::Plan rs = mlopt::Plan::load(data_path("ring4_reducescatter_legacy.xml"));
    mlopt::Plan ag = mlopt::Plan::load(data_path("ring4_allgather.xml"));
    mlopt::Plan ar2 = mlopt::Plan::from_memory(kAllreduce2, "ar2.xml");
};

// A motif as the tests write it (test_enforcer.cpp's Spec).
struct Spec {
    int32_t op = 0;
    int32_t index = 0;
    int32_t seq = 0;
    std::vector<int32_t> ranks{0, 1, 2, 3};
    std::vector<int32_t> deps;
    uint64_t mask = 1;
    const mlopt::Plan* plan = nullptr;
    size_t count = 0;
    std::vector<std::vector<mlopt_byte_range>> gather, scatter;  // per position
};

std::vector<std::vector<mlopt_byte_range>> same(size_t positions, std::vector<mlopt_byte_range> ranges) {
    return std::vector<std::vector<mlopt_byte_range>>(positions, ranges);
}

std::string add(mlopt_enforcer e, const Spec& s) {
    std::vector<mlopt_motif_position> positions(s.ranks.size());
    for (size_t p = 0; p < s.ranks.size(); ++p) {
        if (p < s.gather.size()) positions[p].gather = s.gather[p].data(), positions[p].gather_count = s.gather[p].size();
        if (p < s.scatter.size())
            positions[p].scatter = s.scatter[p].data(), positions[p].scatter_count = s.scatter[p].size();
    }
    mlopt_motif_desc d{};
    d.struct_size = sizeof d;
    d.name = "m";
    d.op = s.op;
    d.index = s.index;
    d.seq = s.seq;
    d.program = s.plan->get();
    d.nranks = static_cast<int32_t>(s.ranks.size());
    d.ranks = s.ranks.data();
    d.deps = s.deps.data();
    d.deps_count = s.deps.size();
    d.channel_mask = s.mask;
    d.dtype = MLOPT_FLOAT32;
    d.redop = MLOPT_SUM;
    d.count = s.count;
    d.op_bytes = kOpBytes;
    d.source = MLOPT_MOTIF_FROM_OUTPUT;
    d.positions = positions.data();
    mlopt_error err = nullptr;
    mlopt_enforcer_add_motif(e, &d, &err);
    const std::string message = err ? mlopt_error_message(err) : "";
    mlopt_error_free(err);
    return message;
}

// Segment `seg` of `segs` of a 4-rank allreduce op.
Spec segment(const Plans& plans, int32_t op, int32_t seg, int32_t segs, int32_t seq, uint64_t mask) {
    const uint64_t bytes = kOpBytes / segs;
    Spec s;
    s.op = op;
    s.index = seg;
    s.seq = seq;
    s.mask = mask;
    s.plan = &plans.ar4;
    s.count = bytes / 4;
    s.gather = same(kRanks, {{seg * bytes, 0, bytes}});
    s.scatter = s.gather;
    return s;
}

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
        for (int32_t seg = 0; seg < 2; ++seg) CHECK_EQ(add(e, segment(plans, op, seg, 2, op, seg ? mask1 : mask0)), "");
    if (!full) return;
    CHECK_EQ(add(e, pair(plans, 2, 0, {0, 2}, 0, 4)), "");
    CHECK_EQ(add(e, pair(plans, 2, 1, {3, 1}, 0, 4)), "");
    constexpr uint64_t kBlock = kOpBytes / kRanks;
    Spec rs;
    rs.op = 3;
    rs.seq = 2;
    rs.plan = &plans.rs;
    rs.count = kElems;
    rs.gather = same(kRanks, {{0, 0, kOpBytes}});
    Spec ag;
    ag.op = 3;
    ag.index = 1;
    ag.seq = 3;
    ag.mask = 2;
    ag.deps = {0};
    ag.plan = &plans.ag;
    ag.count = kBlock / 4;
    for (uint64_t p = 0; p < kRanks; ++p) {
        rs.scatter.push_back({{p * kBlock, 0, kBlock}});
        ag.gather.push_back({{p * kBlock, 0, kBlock}});
        std::vector<mlopt_byte_range> others;
        for (uint64_t j = 0; j < kRanks; ++j)
            if (j != p) others.push_back({j * kBlock, j * kBlock, kBlock});
        ag.scatter.push_back(others);
    }
    CHECK_EQ(add(e, rs), "");
    CHECK_EQ(add(e, ag), "");
    CHECK_EQ(add(e, pair(plans, 4, 0, {0, 1}, 4, 8)), "");
    Spec second = pair(plans, 4, 1, {1, 2}, 4, 8);
    second.deps = {0};
    CHECK_EQ(add(e, second), "");
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

float value(int32_t rank, int32_t op, int64_t iteration, size_t i) {
    return static_cast<float>((rank + 1) * (op + 2) + static_cast<int64_t>(i % 7) - iteration);
}

// Each rank's buffers of each op; op 1 runs in place (its results are in `in`).
struct Buffers {
    std::vector<std::vector<float>> in, out;  // [rank * kOps + op]
    static constexpr int32_t kOps = 5;
    Buffers() : in(kRanks * kOps, std::vector<float>(kElems)), out(in) {}
    void fill(int64_t iteration) {
        for (int32_t r = 0; r < kRanks; ++r)
            for (int32_t o = 0; o < kOps; ++o)
                for (size_t i = 0; i < kElems; ++i) {
                    in[r * kOps + o][i] = value(r, o, iteration, i);
                    out[r * kOps + o][i] = -1000.0f;
                }
    }
    float* input(int32_t r, int32_t o) { return in[r * kOps + o].data(); }
    float* output(int32_t r, int32_t o) { return o == 1 ? input(r, o) : out[r * kOps + o].data(); }
};

struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    double seconds = 0;
};

// Rank r's application: submits its ops in its order, then waits for all of them.
Outcome application(mlopt_enforcer e, int32_t r, Buffers& b, bool full) {
    mlopt_error err = nullptr;
    const auto since = Clock::now();
    mlopt_status s = MLOPT_OK;
    for (const int32_t o : submission_order(r, full)) {
        s = mlopt_enforcer_submit(e, r, o, b.input(r, o), b.output(r, o), &err);
        if (s != MLOPT_OK) break;
    }
    if (s == MLOPT_OK) s = mlopt_enforcer_wait(e, r, -1, &err);
    Outcome out{s, err ? mlopt_error_message(err) : "", seconds_since(since)};
    mlopt_error_free(err);
    return out;
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
        for (mlopt::Enforcer& e : world.enforcers) add_table(e.get(), plans, mask0, mask1, true);
        for (mlopt::Enforcer& e : world.enforcers) e.start();
        Buffers want, got;
        for (int64_t it = 0; it < kIterations; ++it) {
            want.fill(it);
            got.fill(it);
            for (const Outcome& out : on_every_rank([&](int32_t r) { return application(local.get(), r, want, true); }))
                CHECK_EQ(out.message, "");
            for (const Outcome& out :
                 on_every_rank([&](int32_t r) { return application(world.enforcers[r].get(), r, got, true); }))
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
        for (mlopt::Enforcer& e : world.enforcers) add_table(e.get(), plans, 1, 1, false);
        for (mlopt::Enforcer& e : world.enforcers) e.start();
        Buffers b;
        b.fill(0);
        const auto outs = on_every_rank([&](int32_t r) {
            mlopt_error err = nullptr;
            mlopt_status s = MLOPT_OK;
            for (int32_t o = 0; o < 2; ++o)
                if (s == MLOPT_OK) s = mlopt_enforcer_submit(world.enforcers[r].get(), r, o, b.input(r, o), b.output(r, o), &err);
            if (s == MLOPT_OK) s = mlopt_enforcer_wait(world.enforcers[r].get(), r, -1, &err);
            Outcome out{s, err ? mlopt_error_message(err) : "", 0};
            mlopt_error_free(err);
            return out;
        });
        for (const Outcome& out : outs) CHECK_EQ(out.message, "");
        float sum = 0;
        for (int32_t r = 0; r < kRanks; ++r) sum += value(r, 0, 0, 5);
        for (int32_t r = 0; r < kRanks; ++r) CHECK_EQ(b.output(r, 0)[5], sum);
    }
    World world(enforcer_options(0, 300), 4096);
    for (mlopt::Enforcer& e : world.enforcers) add_table(e.get(), plans, 1, 1, false);
    for (mlopt::Enforcer& e : world.enforcers) e.start();
    Buffers b;
    b.fill(0);
    const auto outs = on_every_rank([&](int32_t r) {  // ranks 0 and 2: op 0 first; 1 and 3: op 1 first
        mlopt_error err = nullptr;
        const auto since = Clock::now();
        mlopt_status s = MLOPT_OK;
        for (const int32_t o : {r % 2, 1 - r % 2})
            if (s == MLOPT_OK) s = mlopt_enforcer_submit(world.enforcers[r].get(), r, o, b.input(r, o), b.output(r, o), &err);
        if (s == MLOPT_OK) s = mlopt_enforcer_wait(world.enforcers[r].get(), r, -1, &err);
        Outcome out{s, err ? mlopt_error_message(err) : "", seconds_since(since)};
        mlopt_error_free(err);
        return out;
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
    CHECK(world.comms[0]->broken_status != MLOPT_OK);  // the failed motif run broke the communicator
    const auto since = Clock::now();
    world.enforcers.clear();
    CHECK(seconds_since(since) < 5.0);
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
    for (mlopt::Enforcer& e : world.enforcers) add_table(e.get(), plans, 1, 2, false);
    for (mlopt::Enforcer& e : world.enforcers) e.start();
    Buffers b;
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

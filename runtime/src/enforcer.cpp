// Syndicate's plan enforcer (Pseudocode 2): the C ABI of mlopt.h ("enforcer"), over in-process ranks
// (mlopt_enforcer_create) or over one rank of a multi-process communicator (mlopt_enforcer_create_comm).
//
// Threads, all sharing one mutex (the state is small and every change touches several parts of it):
// * one progress thread per rank (enforce_order = 1): ENFORCEORDER, issuing the rank's motifs in the table's
//   order once the application has submitted them;
// * executors: run motif instances whose channels are free on all their ranks (gather, mlopt_comm_run on an
//   in-process communicator of the motif's size, scatter) outside the lock;
// * a monitor: the watchdog, which turns "nothing moves while work is pending" into MLOPT_ERR_DEADLOCK.
// Application threads call submit (ENFORCEEXECPLAN) and wait.
//
// Over a multi-process communicator the process handles its own rank only ("the local rank"): the same
// bookkeeping restricted to it (handles()). A motif instance runs when it heads the local rank's queues of its
// channels and its local deps completed; the ranks agree because every one issues in the same order, and the
// messages synchronise them (a peer that is not there yet makes the run wait). It runs the motif program's
// position of the local rank with the rank engine over the communicator's transport, on the tags of its lowest
// channel, so that motifs running at once (disjoint channels) never share a stream.
#include "enforcer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <set>
#include <system_error>  // std::system_error (std::thread's failures); not implied by <thread> on every libstdc++
#include <thread>
#include <tuple>

#include "rank_engine.hpp"
#include "reduce.hpp"
#include "run_rank.hpp"

namespace mlopt {
namespace enforcer {

// ------------------------------------------------------------------------------------------------ table

std::string Motif::label() const {
    std::string out = "op " + std::to_string(op) + " motif " + std::to_string(index);
    if (!name.empty()) out += " ('" + name + "')";
    return out;
}

namespace {

std::string where(const mlopt_motif_desc& d) {
    std::string out = "motif (op " + std::to_string(d.op) + ", index " + std::to_string(d.index);
    if (d.name != nullptr && d.name[0] != '\0') out += ", '" + std::string(d.name) + "'";
    return out + ")";
}

// offset + length <= limit without overflow.
bool fits(uint64_t offset, uint64_t length, uint64_t limit) { return length <= limit && offset <= limit - length; }

std::string check_numbers(const mlopt_motif_desc& d) {
    if (d.op < 0) return "op=" + std::to_string(d.op) + " must be >= 0";
    if (d.index < 0) return "index=" + std::to_string(d.index) + " must be >= 0";
    if (d.seq < 0) return "seq=" + std::to_string(d.seq) + " must be >= 0";
    if (d.channel_mask == 0) return "channel_mask=0: a motif needs at least one channel";
    if (!is_valid_dtype(d.dtype)) return "dtype=" + std::to_string(static_cast<int>(d.dtype)) + " is not a mlopt_dtype";
    if (!is_valid_redop(d.redop)) return "redop=" + std::to_string(static_cast<int>(d.redop)) + " is not a mlopt_redop";
    if (d.op_bytes == 0) return "op_bytes=0 must be positive";
    if (d.source != MLOPT_MOTIF_FROM_OUTPUT && d.source != MLOPT_MOTIF_FROM_INPUT)
        return "source=" + std::to_string(static_cast<int>(d.source)) + " is not a mlopt_motif_source";
    return "";
}

std::string check_ranks(const mlopt_motif_desc& d, int32_t nranks) {
    if (d.nranks < 1) return "nranks=" + std::to_string(d.nranks) + " must be >= 1";
    if (d.ranks == nullptr) return "ranks is NULL";
    for (int32_t p = 0; p < d.nranks; ++p) {
        const int32_t r = d.ranks[p];
        const std::string field = "ranks[" + std::to_string(p) + "]=" + std::to_string(r);
        if (r < 0 || r >= nranks)
            return field + " is not a rank of the enforcer (0.." + std::to_string(nranks - 1) + ")";
        for (int32_t q = 0; q < p; ++q)
            if (d.ranks[q] == r) return field + " repeats ranks[" + std::to_string(q) + "]";
    }
    return "";
}

std::string check_deps(const mlopt_motif_desc& d) {
    if (d.deps_count > 0 && d.deps == nullptr) return "deps is NULL but deps_count=" + std::to_string(d.deps_count);
    for (size_t i = 0; i < d.deps_count; ++i)
        if (d.deps[i] < 0 || d.deps[i] >= d.index)
            return "deps[" + std::to_string(i) + "]=" + std::to_string(d.deps[i]) +
                   " is not an earlier motif index of the op (deps must be in 0..index-1)";
    return "";
}

// The program: runnable, one position per rank, run out of place on staging buffers of `count` elements.
std::string check_program(const mlopt_motif_desc& d, size_t& out_count) {
    if (d.program == nullptr) return "program is NULL";
    if (d.program->kind != MLOPT_PLAN_MSCCL_XML) return "program is a JSON plan, not an MSCCL-EF program";
    const Program& p = d.program->program;
    if (p.ngpus != d.nranks)
        return "program ngpus=" + std::to_string(p.ngpus) + " but the motif has nranks=" + std::to_string(d.nranks);
    if (!p.outofplace)
        return "program " + d.program->source +
               " does not declare outofplace=1 (the enforcer runs it out of place, on staging buffers)";
    const auto i_chunks = static_cast<size_t>(p.gpus.front().i_chunks);
    const auto o_chunks = static_cast<size_t>(p.gpus.front().o_chunks);
    if (d.count == 0) return "count=0 must be positive";
    if (i_chunks == 0 || d.count % i_chunks != 0)
        return "count=" + std::to_string(d.count) + " is not a multiple of the program's i_chunks=" +
               std::to_string(i_chunks);
    const size_t chunk = d.count / i_chunks;
    const size_t most = std::max<size_t>({i_chunks, o_chunks, 1});
    if (chunk > std::numeric_limits<size_t>::max() / most / dtype_size(d.dtype))
        return "count=" + std::to_string(d.count) + " is too large";
    out_count = chunk * o_chunks;
    return "";
}

std::string check_ranges(const mlopt_byte_range* ranges, size_t n, const std::string& field, uint64_t op_bytes,
                         uint64_t staging_bytes, const char* staging, std::vector<Range>& out) {
    if (n > 0 && ranges == nullptr) return field + " is NULL but its count is " + std::to_string(n);
    for (size_t i = 0; i < n; ++i) {
        const mlopt_byte_range& r = ranges[i];
        const std::string at = field + "[" + std::to_string(i) + "]: ";
        if (!fits(r.op_offset, r.length, op_bytes))
            return at + "op_offset " + std::to_string(r.op_offset) + " + length " + std::to_string(r.length) +
                   " is past op_bytes=" + std::to_string(op_bytes);
        if (!fits(r.staging_offset, r.length, staging_bytes))
            return at + "staging_offset " + std::to_string(r.staging_offset) + " + length " +
                   std::to_string(r.length) + " is past the program " + staging + "'s " +
                   std::to_string(staging_bytes) + " bytes";
        out.push_back({r.op_offset, r.staging_offset, r.length});
    }
    return "";
}

std::string check_positions(const mlopt_motif_desc& d, Motif& m) {
    if (d.positions == nullptr) return "positions is NULL";
    m.positions.resize(static_cast<size_t>(d.nranks));
    for (int32_t p = 0; p < d.nranks; ++p) {
        const mlopt_motif_position& pos = d.positions[p];
        const std::string field = "positions[" + std::to_string(p) + "].";
        std::string problem = check_ranges(pos.gather, pos.gather_count, field + "gather", d.op_bytes, m.in_bytes,
                                           "input", m.positions[p].gather);
        if (problem.empty())
            problem = check_ranges(pos.scatter, pos.scatter_count, field + "scatter", d.op_bytes, m.out_bytes,
                                   "output", m.positions[p].scatter);
        if (!problem.empty()) return problem;
    }
    return "";
}

std::string check_draft(const mlopt_motif_desc& d, const Draft& draft) {
    const auto op = draft.find(d.op);
    if (op == draft.end()) return "";
    if (op->second.count(d.index)) return "op " + std::to_string(d.op) + " already has a motif with this index";
    const Motif& first = op->second.begin()->second;
    if (first.op_bytes != d.op_bytes)
        return "op_bytes=" + std::to_string(d.op_bytes) + " but " + first.label() + " has op_bytes=" +
               std::to_string(first.op_bytes) + " (one buffer size per op)";
    return "";
}

void copy_fields(const mlopt_motif_desc& d, Motif& m) {
    m.name = d.name != nullptr ? d.name : "";
    m.op = d.op;
    m.index = d.index;
    m.seq = d.seq;
    m.ranks.assign(d.ranks, d.ranks + d.nranks);
    std::set<int32_t> deps(d.deps, d.deps + d.deps_count);  // sorted, duplicates dropped
    m.deps.assign(deps.begin(), deps.end());
    for (int32_t c = 0; c < kMaxChannels; ++c)
        if (d.channel_mask & (uint64_t{1} << c)) m.channels.push_back(c);
    m.dtype = d.dtype;
    m.redop = d.redop;
    m.count = d.count;
    m.op_bytes = d.op_bytes;
    m.from_input = d.source == MLOPT_MOTIF_FROM_INPUT;
}

}  // namespace

std::string read_motif(const mlopt_motif_desc& d, int32_t nranks, const Draft& draft, Motif& m) {
    std::string problem = check_numbers(d);
    if (problem.empty()) problem = check_ranks(d, nranks);
    if (problem.empty()) problem = check_deps(d);
    size_t out_count = 0;
    if (problem.empty()) problem = check_program(d, out_count);
    if (problem.empty()) {
        m.in_bytes = d.count * dtype_size(d.dtype);
        m.out_bytes = out_count * dtype_size(d.dtype);
        problem = check_positions(d, m);
    }
    if (problem.empty()) problem = check_draft(d, draft);
    if (!problem.empty()) return where(d) + ": " + problem;
    copy_fields(d, m);
    m.program = std::make_shared<const mlopt_plan_s>(*d.program);
    return "";
}

namespace {

std::string list(const std::map<int32_t, Motif>& motifs) {
    std::string out;
    for (const auto& [index, _] : motifs) out += (out.empty() ? "" : ", ") + std::to_string(index);
    return out;
}

std::string check_dense(const Draft& draft) {
    if (draft.empty()) return "no motifs were added";
    const int32_t last = draft.rbegin()->first;
    for (int32_t op = 0; op <= last; ++op) {
        const auto it = draft.find(op);
        if (it == draft.end())
            return "op " + std::to_string(op) + " has no motifs (ops must be numbered 0..ops-1; the largest is " +
                   std::to_string(last) + ")";
        const int32_t k = static_cast<int32_t>(it->second.size());
        for (int32_t i = 0; i < k; ++i)
            if (!it->second.count(i))
                return "op " + std::to_string(op) + ": motif index " + std::to_string(i) +
                       " is missing (motif indices must be 0..k-1; the op has " + list(it->second) + ")";
    }
    return "";
}

// A dep with a later seq would be issued after its dependant: the dependant would hold its channels waiting
// for a motif queued behind it.
std::string check_dep_seqs(const Op& op) {
    for (const Motif& m : op.motifs)
        for (const int32_t d : m.deps)
            if (op.motifs[d].seq > m.seq)
                return m.label() + ": deps " + op.motifs[d].label() + " has seq " +
                       std::to_string(op.motifs[d].seq) + " > this motif's seq " + std::to_string(m.seq) +
                       " (a motif cannot be issued before its deps)";
    return "";
}

void derive_orders(Table& t) {
    std::vector<std::map<int32_t, Step>> steps(static_cast<size_t>(t.nranks));
    for (int32_t o = 0; o < static_cast<int32_t>(t.ops.size()); ++o)
        for (const Motif& m : t.ops[o].motifs)
            for (const int32_t r : m.ranks) {
                Step& s = steps[r][m.seq];
                s.seq = m.seq;
                s.motifs.emplace_back(o, m.index);  // ops and indices ascend: the list stays sorted
                ++t.motifs_per_iteration[r];
            }
    for (int32_t r = 0; r < t.nranks; ++r)
        for (auto& [_, step] : steps[r]) t.order[r].push_back(std::move(step));
}

}  // namespace

std::string build_table(Draft&& draft, int32_t nranks, Table& t) {
    std::string problem = check_dense(draft);
    if (!problem.empty()) return problem;
    t.nranks = nranks;
    t.ops.resize(draft.size());
    t.order.assign(static_cast<size_t>(nranks), {});
    t.motifs_per_iteration.assign(static_cast<size_t>(nranks), 0);
    for (auto& [o, motifs] : draft) {
        Op& op = t.ops[o];
        op.of_rank.assign(static_cast<size_t>(nranks), {});
        for (auto& [i, m] : motifs) {
            op.op_bytes = m.op_bytes;
            (m.from_input ? op.reads_input : op.reads_output) = true;
            for (const int32_t r : m.ranks) op.of_rank[r].push_back(i);
            for (const int32_t c : m.channels) t.nchannels = std::max(t.nchannels, c + 1);
            op.motifs.push_back(std::move(m));
        }
        problem = check_dep_seqs(op);
        if (!problem.empty()) return problem;
    }
    derive_orders(t);
    return "";
}

}  // namespace enforcer
}  // namespace mlopt

// ------------------------------------------------------------------------------------------------ runtime

namespace mlopt {
namespace enforcer {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One motif of one iteration. Ordered as every rank issues under enforce_order = 1 (after the seq).
struct Key {
    int64_t iteration = 0;
    int32_t op = 0;
    int32_t index = 0;
    bool operator<(const Key& o) const { return std::tie(iteration, op, index) < std::tie(o.iteration, o.op, o.index); }
    bool operator==(const Key& o) const { return iteration == o.iteration && op == o.op && index == o.index; }
    std::string text() const {
        return "op " + std::to_string(op) + " motif " + std::to_string(index) + " (iteration " +
               std::to_string(iteration) + ")";
    }
};

// An op submitted by one rank for one iteration, until every motif of it involving the rank completed.
struct Submission {
    const std::byte* input = nullptr;
    std::byte* output = nullptr;
    int64_t remaining = 0;
};

struct IterationRecord {
    Clock::time_point first_submit;
    double wait_us = 0;
    int64_t remaining = 0;  // motif instances involving the rank not yet completed
};

struct LogEntry {
    int32_t op;
    int32_t index;
    int32_t iteration;
};

struct RankState {
    std::vector<int64_t> submitted;                          // per op: submissions so far
    std::map<std::pair<int32_t, int64_t>, Submission> open;  // (op, iteration) -> unfinished submission
    std::vector<std::deque<Key>> queues;                     // per channel: issued, not completed
    std::map<int64_t, IterationRecord> iterations;           // unfinished iterations
    std::vector<LogEntry> log;
    size_t cursor = 0;       // position in the rank's issue order (Pseudocode 2's nextMotifSeqNum)
    int64_t iteration = 0;   // the iteration the cursor is in
    int64_t queued = 0;      // motif instances submitted, not yet issued
    mlopt_enforcer_stats stats{};
    std::condition_variable wake;  // the progress thread's: a submission, or stopping
};

// A motif instance every rank has issued and whose channels are free: ready to run.
struct Job {
    Key key;
    const Motif* motif = nullptr;
    std::vector<const std::byte*> sources;  // per position: the op buffer gather ranges read
    std::vector<std::byte*> outputs;        // per position: the op output buffer
};

struct Instance {
    const Motif* motif = nullptr;
    size_t issued = 0;  // ranks that issued it
    bool dispatched = false;
};

struct OpRun {  // one op in one iteration: which motifs completed (for deps)
    std::vector<char> done;
    size_t remaining = 0;
};

struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    bool secondary = false;  // failed because another motif's failure aborted this rank's transport
};

// Program buffers of one executor thread, reused from one motif to the next.
struct Staging {
    std::vector<std::vector<std::byte>> inputs, outputs;
    Workspace workspace;  // scratch of the rank engine (multi-process communicators)
};

}  // namespace
}  // namespace enforcer
}  // namespace mlopt

struct mlopt_enforcer_s {
    int32_t nranks = 0;
    // Over a multi-process communicator: the process's rank and the communicator (not owned); else -1 / NULL.
    int32_t local_rank = -1;
    mlopt_comm comm = nullptr;
    std::atomic<bool> cancel{false};  // set by free: running motifs stop (their rank engines poll it)
    mlopt_enforcer_options options{};
    mlopt::enforcer::Draft draft;  // until start
    mlopt::enforcer::Table table;  // from start on, read-only
    bool started = false;

    mutable std::mutex mutex;  // guards everything below
    std::vector<std::unique_ptr<mlopt::enforcer::RankState>> ranks;
    std::map<mlopt::enforcer::Key, mlopt::enforcer::Instance> instances;  // issued by some rank, not completed
    std::map<std::pair<int64_t, int32_t>, mlopt::enforcer::OpRun> op_runs;  // (iteration, op)
    std::deque<mlopt::enforcer::Job> ready;
    std::map<int32_t, std::vector<mlopt_comm>> idle_comms;  // by size: a comm runs one collective at a time
    std::condition_variable work;      // executors: a ready job, or stopping
    std::condition_variable finished;  // waiters: a submission completed, or a failure
    std::condition_variable monitor;   // the watchdog: stopping
    int64_t open_submissions = 0;      // over all ranks
    int64_t running = 0;               // jobs being executed
    mlopt::enforcer::Clock::time_point last_progress;
    bool stopping = false;
    mlopt_status failed = MLOPT_OK;  // sticky: the first failure
    std::string failure;
    std::vector<std::thread> threads;
};

namespace mlopt {
namespace enforcer {
namespace {

using Lock = std::unique_lock<std::mutex>;
constexpr size_t kLogCapacity = MLOPT_ENFORCER_LOG_CAPACITY;
constexpr int32_t kDefaultExecutors = 4;  // motifs on disjoint channels or ranks run at once
constexpr size_t kMaxDescribed = 8;  // blocked queues named in a deadlock message before "... and N more"

// --------------------------------------------------------------------------------------- bookkeeping

// The ranks whose bookkeeping this enforcer keeps: all of them in process, the local rank over a communicator.
bool handles(const mlopt_enforcer_s& e, int32_t r) { return e.local_rank < 0 || r == e.local_rank; }

bool involves_handled(const mlopt_enforcer_s& e, const Motif& m) {
    return e.local_rank < 0 || std::find(m.ranks.begin(), m.ranks.end(), e.local_rank) != m.ranks.end();
}

// Ranks that issue a motif instance before it can run: all of its ranks in process, the local one otherwise.
size_t issuers(const mlopt_enforcer_s& e, const Motif& m) { return e.local_rank < 0 ? m.ranks.size() : 1; }

void fail_all(mlopt_enforcer_s& e, mlopt_status status, const std::string& message) {
    if (e.failed != MLOPT_OK) return;
    e.failed = status;
    e.failure = message;
    e.finished.notify_all();
    e.work.notify_all();
    for (auto& r : e.ranks) r->wake.notify_all();
}

bool head_everywhere(const mlopt_enforcer_s& e, const Key& key, const Motif& m) {
    for (const int32_t r : m.ranks)
        for (const int32_t c : m.channels) {
            if (!handles(e, r)) continue;
            const auto& q = e.ranks[r]->queues[c];
            if (q.empty() || !(q.front() == key)) return false;
        }
    return true;
}

// Over a communicator, a dep without the local rank is another process's business: it changes none of this
// rank's buffers, and the motif's messages from the ranks it shares with the dep wait for it there.
bool deps_done(const mlopt_enforcer_s& e, const Key& key, const Motif& m) {
    const auto run = e.op_runs.find({key.iteration, key.op});
    for (const int32_t d : m.deps) {
        if (!involves_handled(e, e.table.ops[key.op].motifs[d])) continue;
        if (run == e.op_runs.end() || !run->second.done[d]) return false;
    }
    return true;
}

Job make_job(const mlopt_enforcer_s& e, const Key& key, const Motif& m) {
    Job job{key, &m, {}, {}};
    for (const int32_t r : m.ranks) {
        if (!handles(e, r)) {  // another process's position
            job.sources.push_back(nullptr);
            job.outputs.push_back(nullptr);
            continue;
        }
        const Submission& s = e.ranks[r]->open.at({key.op, key.iteration});  // issued, so submitted
        job.sources.push_back(m.from_input ? s.input : s.output);
        job.outputs.push_back(s.output);
    }
    return job;
}

// Moves every motif instance that can run now (at the head of all its queues, deps done) to the ready list.
void dispatch(mlopt_enforcer_s& e) {
    bool any = false;
    for (auto& rank : e.ranks)
        for (const auto& q : rank->queues) {
            if (q.empty()) continue;
            const Key key = q.front();
            Instance& inst = e.instances.at(key);
            if (inst.dispatched || inst.issued < issuers(e, *inst.motif)) continue;
            if (!head_everywhere(e, key, *inst.motif) || !deps_done(e, key, *inst.motif)) continue;
            inst.dispatched = true;
            e.ready.push_back(make_job(e, key, *inst.motif));
            any = true;
        }
    if (any) e.work.notify_all();
}

// Appends the motif instance to rank r's queues of its channels (issuing never blocks).
void issue(mlopt_enforcer_s& e, int32_t r, const Key& key) {
    RankState& rs = *e.ranks[r];
    const Motif& m = e.table.ops[key.op].motifs[key.index];
    if (rs.log.size() < kLogCapacity)
        rs.log.push_back({key.op, key.index, static_cast<int32_t>(std::min<int64_t>(key.iteration, INT32_MAX))});
    ++rs.stats.motifs_issued;
    for (const int32_t c : m.channels) rs.queues[c].push_back(key);
    Instance& inst = e.instances[key];
    inst.motif = &m;
    ++inst.issued;
    e.last_progress = Clock::now();
}

void finish_iteration(RankState& rs, const IterationRecord& rec, double threshold) {
    ++rs.stats.iterations;
    rs.stats.last_wall_us = micros(Clock::now() - rec.first_submit);
    rs.stats.last_wait_us = rec.wait_us;
    rs.stats.replan_suggested = rec.wait_us > threshold * rs.stats.last_wall_us ? 1 : 0;
}

// Rank r's share of a completed motif instance: its submission and its iteration.
void complete_on_rank(mlopt_enforcer_s& e, int32_t r, const Key& key) {
    RankState& rs = *e.ranks[r];
    ++rs.stats.motifs_completed;
    const auto sub = rs.open.find({key.op, key.iteration});
    if (--sub->second.remaining == 0) {
        rs.open.erase(sub);
        --e.open_submissions;
    }
    const auto it = rs.iterations.find(key.iteration);
    if (it != rs.iterations.end() && --it->second.remaining == 0) {
        finish_iteration(rs, it->second, e.options.replan_threshold);
        rs.iterations.erase(it);
    }
}

void complete(mlopt_enforcer_s& e, const Job& job) {
    const Motif& m = *job.motif;
    for (const int32_t r : m.ranks) {
        if (!handles(e, r)) continue;
        for (const int32_t c : m.channels) e.ranks[r]->queues[c].pop_front();  // it was the head everywhere
        complete_on_rank(e, r, job.key);
    }
    const std::pair<int64_t, int32_t> run_key{job.key.iteration, job.key.op};
    auto run = e.op_runs.find(run_key);
    if (run == e.op_runs.end()) {
        const Op& op = e.table.ops[job.key.op];
        const size_t k = op.motifs.size();
        const size_t tracked = e.local_rank < 0 ? k : op.of_rank[e.local_rank].size();  // motifs that complete here
        run = e.op_runs.emplace(run_key, OpRun{std::vector<char>(k, 0), tracked}).first;
    }
    run->second.done[m.index] = 1;
    if (--run->second.remaining == 0) e.op_runs.erase(run);
    e.instances.erase(job.key);
    e.last_progress = Clock::now();
    dispatch(e);
    e.finished.notify_all();
}

// ------------------------------------------------------------------------------------------ execution

mlopt_comm take_comm(mlopt_enforcer_s& e, int32_t n) {
    auto& idle = e.idle_comms[n];
    if (!idle.empty()) {
        mlopt_comm comm = idle.back();
        idle.pop_back();
        return comm;
    }
    mlopt_comm comm = nullptr;
    mlopt_comm_create_local(n, &comm, nullptr);
    return comm;  // NULL when out of memory: the run reports it
}

// Program position p's staging buffers, filled from the op's buffers.
void gather_position(const Job& job, size_t p, Staging& st) {
    const Motif& m = *job.motif;
    const size_t n = m.ranks.size();
    st.inputs.resize(std::max(st.inputs.size(), n));
    st.outputs.resize(std::max(st.outputs.size(), n));
    // Padding and bytes no range covers are zero; the output too, so that a scatter of bytes the program
    // does not write is deterministic.
    st.inputs[p].assign(m.in_bytes, std::byte{0});
    st.outputs[p].assign(m.out_bytes, std::byte{0});
    for (const Range& r : m.positions[p].gather)
        std::memcpy(st.inputs[p].data() + r.staging_offset, job.sources[p] + r.op_offset, r.length);
}

void scatter_position(const Job& job, size_t p, const Staging& st) {
    for (const Range& r : job.motif->positions[p].scatter)
        std::memcpy(job.outputs[p] + r.op_offset, st.outputs[p].data() + r.staging_offset, r.length);
}

void gather(const Job& job, Staging& st) {
    for (size_t p = 0; p < job.motif->ranks.size(); ++p) gather_position(job, p, st);
}

void scatter(const Job& job, const Staging& st) {
    for (size_t p = 0; p < job.motif->ranks.size(); ++p) scatter_position(job, p, st);
}

Outcome run_motif(const Job& job, mlopt_comm comm, const mlopt_enforcer_options& o, Staging& st) {
    const Motif& m = *job.motif;
    if (comm == nullptr) return {MLOPT_ERR_NO_MEMORY, "out of memory for a communicator"};
    gather(job, st);
    std::vector<void*> ins, outs;
    for (size_t p = 0; p < m.ranks.size(); ++p) {
        ins.push_back(st.inputs[p].data());
        outs.push_back(st.outputs[p].data());
    }
    mlopt_run_options ro;
    mlopt_run_options_init(&ro);
    ro.watchdog_ms = o.watchdog_ms;
    ro.threads = o.threads;
    mlopt_error err = nullptr;
    const mlopt_status status =
        mlopt_comm_run(comm, m.program.get(), ins.data(), outs.data(), m.count, m.dtype, m.redop, &ro, &err);
    Outcome out{status, status == MLOPT_OK ? "" : (err ? mlopt_error_message(err) : mlopt_status_string(status))};
    mlopt_error_free(err);
    if (status == MLOPT_OK) scatter(job, st);
    return out;
}

// A motif instance's number in message headers (RankRunRequest::run): the same on every rank, whatever the order
// in which motifs on other channels start. Top bit set; 31 bits of iteration, 16 of op, 16 of index (a wrapped
// value only weakens the check).
uint64_t motif_run_id(const Key& key) {
    return uint64_t{1} << 63 | (static_cast<uint64_t>(key.iteration) & 0x7fffffffu) << 32 |
           (static_cast<uint64_t>(key.op) & 0xffffu) << 16 | (static_cast<uint64_t>(key.index) & 0xffffu);
}

std::string motif_run_text(uint64_t id) {
    if (!(id >> 63)) return "run " + std::to_string(id);  // a plain mlopt_comm_run_rank
    return Key{static_cast<int64_t>(id >> 32 & 0x7fffffffu), static_cast<int32_t>(id >> 16 & 0xffffu),
               static_cast<int32_t>(id & 0xffffu)}
        .text();
}

// Over a multi-process communicator: the local rank's position of the motif, with the rank engine over the
// communicator's transport. A motif issued in another order by a peer shows as a message of another motif on
// the channel: the ranks' queues disagree, which is what the in-process enforcer reports as a deadlock.
Outcome run_motif_on_comm(mlopt_enforcer_s& e, const Job& job, Staging& st) {
    const Motif& m = *job.motif;
    const auto p = static_cast<size_t>(std::find(m.ranks.begin(), m.ranks.end(), e.local_rank) - m.ranks.begin());
    gather_position(job, p, st);
    const Program& program = m.program->program;
    RankRunRequest request;
    request.position = static_cast<int32_t>(p);
    request.ranks = m.ranks;
    request.tag_base = m.channels.front() * kTagsPerChannelGroup;
    request.memory.input = st.inputs[p].data();
    request.memory.output = st.outputs[p].data();
    request.chunk_elems = m.count / static_cast<size_t>(program.gpus.front().i_chunks);
    request.dtype = m.dtype;
    request.op = m.redop;
    request.watchdog_ms = e.options.watchdog_ms;
    request.run = motif_run_id(job.key);
    request.describe_run = motif_run_text;
    request.out_of_order_status = MLOPT_ERR_DEADLOCK;
    request.cancel = &e.cancel;
    request.cancel_reason = "cancelled: the enforcer was freed while the motif ran";
    const RankRunResult result = run_rank_program(program, request, *e.comm->transport, st.workspace);
    if (result.status == MLOPT_OK) scatter_position(job, p, st);
    return {result.status, result.message, result.aborted_elsewhere};
}

void executor_loop(mlopt_enforcer_s& e) {
    Staging staging;
    Lock lock(e.mutex);
    while (true) {
        e.work.wait(lock, [&] { return e.stopping || (!e.ready.empty() && e.failed == MLOPT_OK); });
        if (e.stopping) return;
        Job job = std::move(e.ready.front());
        e.ready.pop_front();
        const auto n = static_cast<int32_t>(job.motif->ranks.size());
        mlopt_comm comm = e.comm == nullptr ? take_comm(e, n) : nullptr;
        ++e.running;
        lock.unlock();
        Outcome outcome;
        try {
            outcome = e.comm != nullptr ? run_motif_on_comm(e, job, staging) : run_motif(job, comm, e.options, staging);
        } catch (const std::bad_alloc&) {
            outcome = {MLOPT_ERR_NO_MEMORY, "out of memory for staging buffers"};
        }
        lock.lock();
        --e.running;
        if (comm != nullptr) e.idle_comms[n].push_back(comm);
        if (outcome.secondary) {
            // Not completed, not the cause: the motif whose failure aborted the transport reports that.
        } else if (outcome.status != MLOPT_OK) {
            const std::string message = job.motif->label() + " (iteration " + std::to_string(job.key.iteration) +
                                        "): " + outcome.message;
            if (e.comm != nullptr) break_comm(*e.comm, outcome.status, message);  // its streams are mid-message
            fail_all(e, outcome.status, message);
        } else {
            complete(e, job);
        }
    }
}

// ------------------------------------------------------------------------------------------ ordering

// ENFORCEORDER's inner step: issues every motif of the rank's next expected seq once all of them are
// submitted for the current iteration; false while one is missing.
bool issue_next(mlopt_enforcer_s& e, int32_t r) {
    RankState& rs = *e.ranks[r];
    const std::vector<Step>& order = e.table.order[r];
    if (order.empty()) return false;
    const Step& step = order[rs.cursor];
    for (const auto& [op, _] : step.motifs)
        if (rs.submitted[op] <= rs.iteration) return false;
    for (const auto& [op, index] : step.motifs) issue(e, r, Key{rs.iteration, op, index});
    rs.queued -= static_cast<int64_t>(step.motifs.size());
    if (++rs.cursor == order.size()) {  // the end of the table: the counter resets, the next iteration begins
        rs.cursor = 0;
        ++rs.iteration;
    }
    dispatch(e);
    return true;
}

// Pseudocode 2's busy loop, as a condition variable (two cores: a spinning thread would starve the
// interpreter). Time spent here while some submitted motif of the rank waits behind the expected one is the
// rank's wait time, the replanning signal.
void progress_loop(mlopt_enforcer_s& e, int32_t r) {
    RankState& rs = *e.ranks[r];
    Lock lock(e.mutex);
    while (!e.stopping) {
        if (e.failed == MLOPT_OK && issue_next(e, r)) continue;
        const bool counting = e.failed == MLOPT_OK && rs.queued > 0;
        const auto since = Clock::now();
        const int64_t iteration = rs.iteration;
        rs.wake.wait(lock);
        if (!counting) continue;
        const double waited = micros(Clock::now() - since);
        rs.stats.wait_us += waited;
        const auto rec = rs.iterations.find(iteration);
        if (rec != rs.iterations.end()) rec->second.wait_us += waited;
    }
}

// --------------------------------------------------------------------------------------------- watchdog

std::string describe_issue_point(const mlopt_enforcer_s& e, int32_t r) {
    const RankState& rs = *e.ranks[r];
    if (!e.options.enforce_order || rs.queued == 0 || e.table.order[r].empty()) return "";
    const Step& step = e.table.order[r][rs.cursor];
    std::string missing;
    for (const auto& [op, index] : step.motifs)
        if (rs.submitted[op] <= rs.iteration)
            missing += (missing.empty() ? "" : ", ") + Key{rs.iteration, op, index}.text();
    return "waits to issue seq " + std::to_string(step.seq) + " of iteration " + std::to_string(rs.iteration) +
           " (not submitted: " + missing + ")";
}

std::string describe_head(const mlopt_enforcer_s& e, int32_t c, const Key& key) {
    const Instance& inst = e.instances.at(key);
    const Motif& m = *inst.motif;
    std::string out = "channel " + std::to_string(c) + " head " + key.text();
    if (inst.issued < issuers(e, m)) {
        std::string missing;
        for (const int32_t r : m.ranks) {
            if (!handles(e, r)) continue;
            const auto& q = e.ranks[r]->queues[c];
            if (std::find(q.begin(), q.end(), key) == q.end())
                missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        return out + " not yet issued by rank(s) " + missing;
    }
    for (const int32_t r : m.ranks)
        for (const int32_t ch : m.channels) {
            if (!handles(e, r)) continue;
            const auto& q = e.ranks[r]->queues[ch];
            if (!(q.front() == key)) return out + " behind " + q.front().text() + " on rank " + std::to_string(r) +
                                            " channel " + std::to_string(ch);
        }
    return out + (deps_done(e, key, m) ? " ready" : " waits for its deps");
}

std::string describe_blocked(const mlopt_enforcer_s& e) {
    std::vector<std::string> parts;
    for (int32_t r = 0; r < e.nranks; ++r) {
        std::string rank;
        const std::string point = describe_issue_point(e, r);
        if (!point.empty()) rank = point;
        const auto& queues = e.ranks[r]->queues;
        for (int32_t c = 0; c < static_cast<int32_t>(queues.size()); ++c)
            if (!queues[c].empty()) rank += (rank.empty() ? "" : "; ") + describe_head(e, c, queues[c].front());
        if (!rank.empty()) parts.push_back("rank " + std::to_string(r) + ": " + rank);
    }
    std::string out;
    for (size_t i = 0; i < parts.size() && i < kMaxDescribed; ++i) out += (i ? " | " : "") + parts[i];
    if (parts.size() > kMaxDescribed)
        out += " | ... and " + std::to_string(parts.size() - kMaxDescribed) + " more ranks";
    return out.empty() ? "no motif issued (every rank waits for submissions)" : out;
}

void monitor_loop(mlopt_enforcer_s& e) {
    const auto patience = std::chrono::milliseconds(e.options.watchdog_ms);
    const auto tick = std::clamp<Clock::duration>(patience / 10, std::chrono::milliseconds(1),
                                                  std::chrono::milliseconds(100));
    Lock lock(e.mutex);
    while (!e.stopping) {
        e.monitor.wait_for(lock, tick);
        if (e.stopping || e.failed != MLOPT_OK) continue;
        // A running motif is watched by its own run's watchdog; a ready one is about to run.
        const bool moving = e.running > 0 || !e.ready.empty();
        if (e.open_submissions == 0 || moving || Clock::now() - e.last_progress < patience) continue;
        fail_all(e, MLOPT_ERR_DEADLOCK,
                 "deadlock: nothing submitted, issued or completed for " + std::to_string(e.options.watchdog_ms) +
                     " ms while submitted ops are unfinished: " + describe_blocked(e));
    }
}

// ----------------------------------------------------------------------------------------- lifecycle

mlopt_status read_options(const mlopt_enforcer_options* given, mlopt_enforcer_options& out, mlopt_error* err) {
    mlopt_enforcer_options_init(&out);
    if (given == nullptr) return MLOPT_OK;
    const size_t known = offsetof(mlopt_enforcer_options, watchdog_ms) + sizeof(given->watchdog_ms);
    const mlopt_status status = read_sized(*given, known, "mlopt_enforcer_options_init", out, err);
    if (status != MLOPT_OK) return status;
    if (out.watchdog_ms <= 0) out.watchdog_ms = 10000;
    if (out.threads <= 0) out.threads = 1;
    if (!(out.replan_threshold >= 0))  // also NaN
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "options->replan_threshold must be >= 0");
    if (out.enforce_order != 0 && out.enforce_order != 1)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->enforce_order=" + std::to_string(out.enforce_order) + " must be 0 or 1");
    return MLOPT_OK;
}

void stop_threads(mlopt_enforcer_s& e) {
    e.cancel.store(true);  // running motifs over a communicator stop within a tick instead of at their watchdog
    {
        Lock lock(e.mutex);
        e.stopping = true;
        e.work.notify_all();
        e.finished.notify_all();
        e.monitor.notify_all();
        for (auto& r : e.ranks) r->wake.notify_all();
    }
    for (std::thread& t : e.threads) t.join();
    e.threads.clear();
}

void prepare_ranks(mlopt_enforcer_s& e) {
    for (auto& rs : e.ranks) {
        rs->submitted.assign(e.table.ops.size(), 0);
        rs->queues.resize(static_cast<size_t>(e.table.nchannels));
    }
    e.last_progress = Clock::now();
}

// Runs a thread's loop; the only exceptions are allocations of the bookkeeping, which fail the enforcer
// (the loop's lock was released while unwinding).
template <typename Loop>
void guard_thread(mlopt_enforcer_s& e, Loop&& loop) noexcept {
    try {
        loop();
    } catch (...) {
        try {
            Lock lock(e.mutex);
            fail_all(e, MLOPT_ERR_NO_MEMORY, "out of memory in an enforcer thread");
        } catch (...) {
        }
    }
}

void start_threads(mlopt_enforcer_s& e) {
    int32_t executors = e.options.executors;
    if (executors <= 0) executors = kDefaultExecutors;
    if (e.options.enforce_order)
        for (int32_t r = 0; r < e.nranks; ++r)
            if (handles(e, r))
                e.threads.emplace_back([&e, r] { guard_thread(e, [&] { progress_loop(e, r); }); });
    for (int32_t i = 0; i < executors; ++i)
        e.threads.emplace_back([&e] { guard_thread(e, [&] { executor_loop(e); }); });
    e.threads.emplace_back([&e] { guard_thread(e, [&] { monitor_loop(e); }); });
}

// ----------------------------------------------------------------------------------------- submission

// A rank the caller may name: any of the enforcer's in process, only the local one over a communicator.
mlopt_status check_rank(const mlopt_enforcer_s& e, int32_t rank, const char* function, mlopt_error* err) {
    if (rank < 0 || rank >= e.nranks)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, std::string(function) + ": rank=" + std::to_string(rank) +
                                                         " is not in 0.." + std::to_string(e.nranks - 1));
    if (!handles(e, rank))
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    std::string(function) + ": rank=" + std::to_string(rank) + " is not this process's rank " +
                        std::to_string(e.local_rank) + " (an enforcer over a multi-process communicator handles "
                        "its own rank only)");
    return MLOPT_OK;
}

mlopt_status check_call(mlopt_enforcer_s* e, int32_t rank, const char* function, mlopt_error* err) {
    if (e == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, std::string(function) + ": enforcer is NULL");
    if (!e->started)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, std::string(function) + ": the enforcer is not started");
    return check_rank(*e, rank, function, err);
}

mlopt_status check_submission(const mlopt_enforcer_s& e, int32_t rank, int32_t op, const void* input,
                              const void* output, mlopt_error* err) {
    const std::string where = "mlopt_enforcer_submit(rank " + std::to_string(rank) + ", op " + std::to_string(op) + ")";
    if (op < 0 || op >= static_cast<int32_t>(e.table.ops.size()))
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    where + ": op is not in 0.." + std::to_string(e.table.ops.size() - 1));
    const Op& o = e.table.ops[op];
    if (o.of_rank[rank].empty())
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, where + ": no motif of the op involves the rank");
    if (input == nullptr || output == nullptr)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, where + ": input or output is NULL");
    if (o.reads_input && input == output)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    where + ": the op's motifs read its input buffer (all-to-all): output must be another buffer");
    return MLOPT_OK;
}

// ENFORCEEXECPLAN: the op's motifs involving the rank enter the rank's queue of submitted motifs.
void enqueue(mlopt_enforcer_s& e, int32_t rank, int32_t op, const void* input, void* output) {
    RankState& rs = *e.ranks[rank];
    const std::vector<int32_t>& mine = e.table.ops[op].of_rank[rank];
    const int64_t iteration = rs.submitted[op]++;
    const auto n = static_cast<int64_t>(mine.size());
    rs.open[{op, iteration}] = Submission{static_cast<const std::byte*>(input), static_cast<std::byte*>(output), n};
    ++e.open_submissions;
    auto [rec, fresh] = rs.iterations.try_emplace(iteration);
    if (fresh) {
        rec->second.first_submit = Clock::now();
        rec->second.remaining = e.table.motifs_per_iteration[rank];
    }
    e.last_progress = Clock::now();
    if (e.options.enforce_order) {
        rs.queued += n;
        rs.wake.notify_one();
        return;
    }
    // No enforcement: issue at once, in the table's order within the op.
    std::vector<int32_t> order = mine;
    const auto& motifs = e.table.ops[op].motifs;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return motifs[a].seq < motifs[b].seq; });
    for (const int32_t index : order) issue(e, rank, Key{iteration, op, index});
    dispatch(e);
}

// "Has rank's latest submission of op (op = -1: every submission) completed?"
bool completed(const mlopt_enforcer_s& e, int32_t rank, int32_t op) {
    const RankState& rs = *e.ranks[rank];
    if (op < 0) return rs.open.empty();
    const int64_t latest = rs.submitted[op] - 1;
    return latest < 0 || rs.open.find({op, latest}) == rs.open.end();
}

mlopt_status wait_locked(mlopt_enforcer_s& e, Lock& lock, int32_t rank, int32_t op, mlopt_error* err) {
    e.finished.wait(lock, [&] { return e.failed != MLOPT_OK || e.stopping || completed(e, rank, op); });
    if (e.failed != MLOPT_OK) return fail(err, e.failed, e.failure);
    if (!completed(e, rank, op)) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "the enforcer is being freed");
    return succeed(err);
}

template <typename Body>
mlopt_status guarded(mlopt_error* err, const char* function, Body&& body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(err, MLOPT_ERR_NO_MEMORY, std::string(function) + ": out of memory");
    } catch (const std::exception& ex) {
        return fail(err, MLOPT_ERR_INTERNAL, std::string(function) + ": internal error: " + ex.what());
    } catch (...) {
        return fail(err, MLOPT_ERR_INTERNAL, std::string(function) + ": internal error");
    }
}

}  // namespace
}  // namespace enforcer
}  // namespace mlopt

using mlopt::fail;
using mlopt::succeed;
namespace enf = mlopt::enforcer;

extern "C" {

MLOPT_API void mlopt_enforcer_options_init(mlopt_enforcer_options* options) {
    if (options == nullptr) return;
    std::memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->watchdog_ms = 10000;
    options->replan_threshold = 0.05;
    options->threads = 1;
    options->enforce_order = 1;
    options->executors = 0;
}

MLOPT_API mlopt_status mlopt_enforcer_create(int32_t nranks, const mlopt_enforcer_options* options,
                                             mlopt_enforcer* out, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_create", [&] {
        if (out == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_create: out is NULL");
        *out = nullptr;
        if (nranks < 1)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_create: nranks=" + std::to_string(nranks) + " must be >= 1");
        auto e = std::make_unique<mlopt_enforcer_s>();
        const mlopt_status status = enf::read_options(options, e->options, err);
        if (status != MLOPT_OK) return status;
        e->nranks = nranks;
        for (int32_t r = 0; r < nranks; ++r) e->ranks.push_back(std::make_unique<enf::RankState>());
        *out = e.release();
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_create_comm(mlopt_comm comm, const mlopt_enforcer_options* options,
                                                  mlopt_enforcer* out, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_create_comm", [&] {
        if (out == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_create_comm: out is NULL");
        *out = nullptr;
        if (comm == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_create_comm: comm is NULL");
        if (comm->rank < 0 || comm->transport == nullptr)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_create_comm: an in-process communicator (use mlopt_enforcer_create)");
        {
            std::unique_lock<std::mutex> busy(comm->busy, std::try_to_lock);
            if (!busy.owns_lock())
                return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                            "mlopt_enforcer_create_comm: the communicator is running a collective");
            if (comm->broken_status != MLOPT_OK) return mlopt::comm_broken_error(*comm, err);
        }
        auto e = std::make_unique<mlopt_enforcer_s>();
        const mlopt_status status = enf::read_options(options, e->options, err);
        if (status != MLOPT_OK) return status;
        e->nranks = comm->nranks;
        e->local_rank = comm->rank;
        e->comm = comm;
        for (int32_t r = 0; r < e->nranks; ++r) e->ranks.push_back(std::make_unique<enf::RankState>());
        *out = e.release();
        return succeed(err);
    });
}

MLOPT_API void mlopt_enforcer_free(mlopt_enforcer enforcer) {
    if (enforcer == nullptr) return;
    enf::stop_threads(*enforcer);
    for (auto& [_, comms] : enforcer->idle_comms)
        for (mlopt_comm comm : comms) mlopt_comm_free(comm);
    delete enforcer;
}

MLOPT_API mlopt_status mlopt_enforcer_add_motif(mlopt_enforcer enforcer, const mlopt_motif_desc* motif,
                                                mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_add_motif", [&] {
        if (enforcer == nullptr || motif == nullptr)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_add_motif: enforcer or motif is NULL");
        if (enforcer->started)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_add_motif: the enforcer has started; its motif table is frozen");
        if (motif->struct_size < sizeof(mlopt_motif_desc))
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_add_motif: motif->struct_size=" + std::to_string(motif->struct_size) +
                            " is smaller than sizeof(mlopt_motif_desc)=" + std::to_string(sizeof(mlopt_motif_desc)));
        enf::Motif m;
        const std::string problem = enf::read_motif(*motif, enforcer->nranks, enforcer->draft, m);
        if (!problem.empty()) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_add_motif: " + problem);
        enforcer->draft[m.op].emplace(m.index, std::move(m));
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_start(mlopt_enforcer enforcer, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_start", [&] {
        if (enforcer == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_start: enforcer is NULL");
        if (enforcer->started)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_start: the enforcer has already started");
        const std::string problem = enf::build_table(std::move(enforcer->draft), enforcer->nranks, enforcer->table);
        enforcer->draft.clear();
        if (!problem.empty()) {
            enforcer->table = enf::Table{};
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_start: " + problem);
        }
        enf::prepare_ranks(*enforcer);
        try {
            enf::start_threads(*enforcer);
        } catch (const std::system_error&) {
            enf::stop_threads(*enforcer);
            return fail(err, MLOPT_ERR_INTERNAL, "mlopt_enforcer_start: cannot start the enforcer's threads");
        }
        enforcer->started = true;
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_submit(mlopt_enforcer enforcer, int32_t rank, int32_t op, const void* input,
                                             void* output, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_submit", [&] {
        mlopt_status status = enf::check_call(enforcer, rank, "mlopt_enforcer_submit", err);
        if (status != MLOPT_OK) return status;
        status = enf::check_submission(*enforcer, rank, op, input, output, err);
        if (status != MLOPT_OK) return status;
        const enf::Op& o = enforcer->table.ops[op];
        // In-place semantics: the output starts as the input. Copied before the motifs become visible, so no
        // motif can read the output earlier.
        if (o.reads_output && input != output) std::memmove(output, input, o.op_bytes);
        enf::Lock lock(enforcer->mutex);
        if (enforcer->failed != MLOPT_OK) return fail(err, enforcer->failed, enforcer->failure);
        enf::enqueue(*enforcer, rank, op, input, output);
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_wait(mlopt_enforcer enforcer, int32_t rank, int32_t op, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_wait", [&] {
        const mlopt_status status = enf::check_call(enforcer, rank, "mlopt_enforcer_wait", err);
        if (status != MLOPT_OK) return status;
        if (op < -1 || op >= static_cast<int32_t>(enforcer->table.ops.size()))
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_wait: op=" + std::to_string(op) + " is not -1 or in 0.." +
                            std::to_string(enforcer->table.ops.size() - 1));
        enf::Lock lock(enforcer->mutex);
        return enf::wait_locked(*enforcer, lock, rank, op, err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_drain(mlopt_enforcer enforcer, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_drain", [&] {
        const int32_t first = enforcer != nullptr && enforcer->local_rank >= 0 ? enforcer->local_rank : 0;
        const mlopt_status status = enf::check_call(enforcer, first, "mlopt_enforcer_drain", err);
        if (status != MLOPT_OK) return status;
        enf::Lock lock(enforcer->mutex);
        for (int32_t r = 0; r < enforcer->nranks; ++r) {
            if (!enf::handles(*enforcer, r)) continue;
            const mlopt_status s = enf::wait_locked(*enforcer, lock, r, -1, err);
            if (s != MLOPT_OK) return s;
        }
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_get_stats(const mlopt_enforcer_s* enforcer, int32_t rank,
                                                mlopt_enforcer_stats* out, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_get_stats", [&] {
        if (enforcer == nullptr || out == nullptr)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_get_stats: enforcer or out is NULL");
        const mlopt_status status = enf::check_rank(*enforcer, rank, "mlopt_enforcer_get_stats", err);
        if (status != MLOPT_OK) return status;
        enf::Lock lock(enforcer->mutex);
        mlopt_enforcer_stats stats = enforcer->ranks[rank]->stats;
        stats.struct_size = sizeof stats;
        if (!mlopt::copy_sized(stats, out))
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_get_stats: out->struct_size is not set");
        return succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_enforcer_issue_log(const mlopt_enforcer_s* enforcer, int32_t rank, int32_t* ops,
                                                int32_t* indices, int32_t* iterations, size_t capacity,
                                                size_t* count, mlopt_error* err) {
    return enf::guarded(err, "mlopt_enforcer_issue_log", [&] {
        if (enforcer == nullptr || count == nullptr)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_enforcer_issue_log: enforcer or count is NULL");
        const mlopt_status status = enf::check_rank(*enforcer, rank, "mlopt_enforcer_issue_log", err);
        if (status != MLOPT_OK) return status;
        if (capacity > 0 && (ops == nullptr || indices == nullptr || iterations == nullptr))
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_enforcer_issue_log: ops, indices or iterations is NULL with capacity > 0");
        enf::Lock lock(enforcer->mutex);
        const auto& log = enforcer->ranks[rank]->log;
        for (size_t i = 0; i < log.size() && i < capacity; ++i) {
            ops[i] = log[i].op;
            indices[i] = log[i].index;
            iterations[i] = log[i].iteration;
        }
        *count = log.size();
        return succeed(err);
    });
}

}  // extern "C"

// The rank engine (see rank_engine.hpp).
//
// Waiting: every blocking call (a transport wait, a dependency flag) waits at most one tick (watchdog/10,
// 1..100 ms) and then looks at the rank-wide progress counter (steps completed + bytes moved by any of the
// rank's threadblocks): a thread keeps waiting while the rank moved within watchdog_ms, and stops the run with
// MLOPT_ERR_DEADLOCK once nothing moved for that long. The tick also bounds how late a thread sees a stop
// (another threadblock's failure, a cancel), though a stop aborts the transport, which wakes its waits at once.
#include "rank_engine.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "reduce.hpp"
#include "step_ops.hpp"
#include "validate.hpp"

namespace mlopt {

int64_t default_chunk_bytes(const Program& program, mlopt_dtype dtype) {
    int32_t most = 1;  // the largest cnt of any message of the program
    for (const Gpu& gpu : program.gpus)
        for (const Threadblock& tb : gpu.tbs)
            for (const Step& st : tb.steps)
                if (step_sends(st.type)) most = std::max(most, st.cnt);
    const auto es = static_cast<int64_t>(dtype_size(dtype));
    return std::max<int64_t>(es, kDefaultMessageBytes / most / es * es);
}

namespace {

using Clock = TransportClock;

constexpr uint32_t kMagic = 0x484d4c4d;  // "MLMH" in memory order on little-endian machines
constexpr uint32_t kVersion = 1;
constexpr size_t kNameBytes = 32;
constexpr size_t kBounceBytes = 512;  // reduced through an aligned local buffer when spans are not aligned

// The header every message starts with. Fixed size and a multiple of 8 bytes, so that payloads keep the
// alignment of the stream position. Native byte order (the magic tells a foreign one apart).
struct MessageHeader {
    uint32_t magic;
    uint32_t version;
    uint64_t run;        // RankRunRequest::run
    uint64_t signature;  // run_signature: program, count, dtype, op, slicing
    uint64_t count;      // elements of each rank's input
    uint64_t slice_elems;
    int64_t iteration;
    uint64_t payload_bytes;
    int32_t sender;  // global rank
    int32_t tb;      // the sending step
    int32_t step;
    int32_t cnt;
    uint8_t dtype;
    uint8_t op;
    uint8_t reserved[6];
    char name[kNameBytes];  // the program's name, cut to fit, NUL-terminated
};
static_assert(sizeof(MessageHeader) == 112 && sizeof(MessageHeader) % 8 == 0, "header layout");
static_assert(std::is_trivially_copyable<MessageHeader>::value, "the header is copied as bytes");

// FNV-1a, 64 bits: enough to tell two runs apart, cheap to compute once per run.
class Hash {
public:
    void bytes(const void* data, size_t n) {
        const auto* p = static_cast<const unsigned char*>(data);
        for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 1099511628211ull;
    }
    template <typename T>
    void value(T v) {
        static_assert(std::is_arithmetic<T>::value || std::is_enum<T>::value, "plain values only");
        bytes(&v, sizeof v);
    }
    void text(const std::string& s) {
        value<uint64_t>(s.size());
        bytes(s.data(), s.size());
    }
    uint64_t get() const { return h_; }

private:
    uint64_t h_ = 14695981039346656037ull;
};

// What every rank of one run must agree on: the program (name, collective, step table), count, dtype, op and
// the loop slicing.
uint64_t run_signature(const Program& p, uint64_t count, mlopt_dtype dtype, mlopt_redop op, uint64_t slice_elems) {
    Hash h;
    h.text(p.name);
    h.text(p.coll);
    h.value<int32_t>(p.ngpus);
    for (const Gpu& gpu : p.gpus) {
        h.value<int32_t>(gpu.i_chunks);
        h.value<int32_t>(gpu.o_chunks);
        h.value<int32_t>(gpu.s_chunks);
        h.value<uint64_t>(gpu.tbs.size());
        for (const Threadblock& tb : gpu.tbs) {
            for (const int32_t v : {tb.send, tb.recv, tb.chan, static_cast<int32_t>(tb.steps.size())}) h.value(v);
            for (const Step& st : tb.steps) {
                for (const int32_t v : {static_cast<int32_t>(st.type), static_cast<int32_t>(st.srcbuf), st.srcoff,
                                        static_cast<int32_t>(st.dstbuf), st.dstoff, st.cnt, st.depid, st.deps,
                                        static_cast<int32_t>(st.hasdep)})
                    h.value(v);
            }
        }
    }
    h.value<uint64_t>(count);
    h.value<int32_t>(dtype);
    h.value<int32_t>(op);
    h.value<uint64_t>(slice_elems);
    return h.get();
}

enum class Wait : uint8_t { none, dependency, message, space };

// One threadblock's thread. The atomics say where it is, for deadlock messages written by other threads.
struct TbRun {
    const Threadblock* tb = nullptr;
    int32_t send_rank = -1;  // global ranks of its peers
    int32_t recv_rank = -1;
    SendStream* send = nullptr;  // made on first use
    RecvStream* recv = nullptr;
    std::atomic<int64_t> iteration{0};
    std::atomic<size_t> pc{0};
    std::atomic<Wait> wait{Wait::none};
    std::atomic<bool> finished{false};
    int64_t steps = 0;  // counters, summed once the threads have joined
    int64_t messages = 0;
    int64_t bytes_moved = 0;
};

bool aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

class RankEngine {
public:
    RankEngine(const Program& program, const RankRunRequest& request, Transport& transport, Workspace& workspace);
    RankRunResult run();

private:
    std::string setup();
    int32_t global(int32_t position) const {
        return request_.ranks.empty() ? position : request_.ranks[static_cast<size_t>(position)];
    }
    int32_t tag(const TbRun& t) const { return request_.tag_base + t.tb->chan; }
    std::byte* buffer(Buffer b) const;

    // Threadblock threads.
    void thread_main(TbRun& t) noexcept;
    bool walk(TbRun& t);
    bool await_dependency(TbRun& t, const Step& st, int64_t iteration);
    bool run_step(TbRun& t, const Step& st, int64_t iteration);
    void complete_step(TbRun& t, const Step& st, int64_t iteration, size_t pc, size_t bytes);

    // Messages.
    bool open_streams(TbRun& t, bool receiving, bool sending);
    bool read_exact(TbRun& t, void* data, size_t n);
    bool write_exact(TbRun& t, const void* data, size_t n);
    template <typename Fill>
    bool send_spans(TbRun& t, size_t bytes, Fill&& fill);
    bool commit(TbRun& t, size_t n);
    bool send_header(TbRun& t, const Step& st, int64_t iteration, size_t bytes);
    bool receive_header(TbRun& t, const Step& st, int64_t iteration, size_t bytes);
    bool check_header(const TbRun& t, const MessageHeader& h, const Step& st, int64_t iteration, size_t bytes);
    bool send_payload(TbRun& t, const StepData& d);
    bool receive_payload(TbRun& t, const StepData& d, bool forward);
    bool bounce(TbRun& t, const StepData& d, size_t offset, bool forward);

    // Waiting and stopping.
    template <typename Call>
    bool await(TbRun& t, Wait kind, Call&& call);
    bool patient(int64_t& seen, Clock::time_point& since);
    bool stopped();
    void stop(mlopt_status status, const std::string& message);
    void transport_failed(const std::string& why, const std::string& doing);
    void moved(int64_t amount) { progress_.fetch_add(amount, std::memory_order_relaxed); }

    // Messages about the run.
    std::string run_text(uint64_t run) const;
    std::string describe_side(int32_t rank, const char* verb, const char* name, uint64_t count, int dtype, int op,
                              uint64_t slice_elems) const;
    std::string where(const TbRun& t) const;
    std::string waiting_for(const TbRun& t) const;
    std::string describe_unfinished() const;

    const Program& program_;
    const RankRunRequest& request_;
    Transport& transport_;
    Workspace& workspace_;
    const Gpu& gpu_;
    const size_t es_;
    const LoopSlicing slicing_;
    const int32_t me_;  // this rank's global rank
    const std::chrono::milliseconds patience_;
    const Clock::duration tick_;
    uint64_t count_ = 0;
    uint64_t signature_ = 0;
    std::byte* scratch_ = nullptr;
    std::vector<TbRun> tbs_;

    std::mutex flag_mutex_;  // guards flags_
    std::condition_variable flag_cv_;
    std::vector<int64_t> flags_;  // per threadblock: flag_value of its last completed hasdep step, -1: none

    std::atomic<int64_t> progress_{0};  // steps completed + bytes moved: what the watchdog watches
    std::atomic<bool> stopped_{false};
    std::atomic<bool> aborted_elsewhere_{false};  // RankRunResult::aborted_elsewhere
    std::mutex status_mutex_;  // guards status_ and message_
    mlopt_status status_ = MLOPT_OK;
    std::string message_;
};

RankEngine::RankEngine(const Program& program, const RankRunRequest& request, Transport& transport,
                       Workspace& workspace)
    : program_(program),
      request_(request),
      transport_(transport),
      workspace_(workspace),
      gpu_(program.gpus.at(static_cast<size_t>(request.position))),
      es_(dtype_size(request.dtype)),
      slicing_(request.chunk_elems,
               request.chunk_bytes > 0 ? request.chunk_bytes : default_chunk_bytes(program, request.dtype), es_),
      me_(transport.rank()),
      patience_(request.watchdog_ms > 0 ? request.watchdog_ms : 10000),
      tick_(std::clamp<Clock::duration>(patience_ / 10, std::chrono::milliseconds(1),
                                        std::chrono::milliseconds(100))),
      tbs_(gpu_.tbs.size()),
      flags_(gpu_.tbs.size(), -1) {}

// Checks what the loader cannot know (the mapping to global ranks, the transport) and what only hand-built
// programs can get wrong (two threadblocks on one stream). Returns "" or the problem.
std::string RankEngine::setup() {
    const int32_t n = transport_.nranks();
    if (!request_.ranks.empty() && request_.ranks.size() != program_.gpus.size())
        return "the run maps " + std::to_string(request_.ranks.size()) + " ranks to a program of ngpus=" +
               std::to_string(program_.ngpus);
    for (size_t p = 0; p < program_.gpus.size(); ++p)
        if (global(static_cast<int32_t>(p)) < 0 || global(static_cast<int32_t>(p)) >= n)
            return "program position " + std::to_string(p) + " maps to rank " +
                   std::to_string(global(static_cast<int32_t>(p))) + ", not a rank of the communicator (0.." +
                   std::to_string(n - 1) + ")";
    if (global(request_.position) != me_)
        return "program position " + std::to_string(request_.position) + " is rank " +
               std::to_string(global(request_.position)) + ", but this transport is rank " + std::to_string(me_);
    std::map<std::pair<int32_t, int32_t>, int32_t> sending, receiving;  // (peer, chan) -> tb
    for (size_t i = 0; i < gpu_.tbs.size(); ++i) {
        const Threadblock& tb = gpu_.tbs[i];
        TbRun& t = tbs_[i];
        t.tb = &tb;
        if (request_.tag_base < 0 || request_.tag_base + tb.chan >= kMaxTags || tb.chan < 0)
            return "rank " + std::to_string(me_) + " tb " + std::to_string(tb.id) + ": channel " +
                   std::to_string(tb.chan) + " + tag base " + std::to_string(request_.tag_base) +
                   " is not a transport tag (0.." + std::to_string(kMaxTags - 1) + ")";
        for (const auto& [peer, rank, seen] : {std::make_tuple(tb.send, &t.send_rank, &sending),
                                               std::make_tuple(tb.recv, &t.recv_rank, &receiving)}) {
            if (peer < 0) continue;
            *rank = global(peer);
            const auto [it, fresh] = seen->emplace(std::make_pair(peer, tb.chan), tb.id);
            if (!fresh)
                return "rank " + std::to_string(me_) + " tbs " + std::to_string(it->second) + " and " +
                       std::to_string(tb.id) + " share the stream " + (seen == &sending ? "to" : "from") +
                       " program position " + std::to_string(peer) + " on channel " + std::to_string(tb.chan) +
                       " (one threadblock per connection)";
        }
    }
    count_ = static_cast<uint64_t>(request_.chunk_elems) * static_cast<uint64_t>(gpu_.i_chunks);
    signature_ = run_signature(program_, count_, request_.dtype, request_.op, slicing_.slice_elems);
    scratch_ = workspace_.scratch(0, static_cast<size_t>(gpu_.s_chunks) * request_.chunk_elems * es_);
    return "";
}

RankRunResult RankEngine::run() {
    const auto started = Clock::now();
    RankRunResult result;
    const std::string problem = setup();
    if (!problem.empty()) stop(MLOPT_ERR_SEMANTIC, problem);
    if (problem.empty() && !tbs_.empty() && slicing_.iterations > 0) {
        // The calling thread runs the last threadblock itself: a run of one threadblock (a 2-rank ring) then
        // starts no thread at all, and every run one thread fewer (thread start-up is most of a small run).
        std::vector<std::thread> threads;
        bool started = true;
        try {
            threads.reserve(tbs_.size() - 1);
            for (size_t i = 0; i + 1 < tbs_.size(); ++i) threads.emplace_back([this, &t = tbs_[i]] { thread_main(t); });
        } catch (...) {  // std::system_error or std::bad_alloc: the threads started so far stop with the run
            stop(MLOPT_ERR_INTERNAL, "rank " + std::to_string(me_) + ": cannot start a thread per threadblock");
            started = false;
        }
        if (started) thread_main(tbs_.back());
        for (std::thread& th : threads) th.join();
        result.stats.loop_iterations = slicing_.iterations;
    }
    for (const TbRun& t : tbs_) {
        result.stats.steps_executed += t.steps;
        result.stats.messages += t.messages;
        result.stats.bytes_moved += t.bytes_moved;
    }
    {
        std::lock_guard<std::mutex> lock(status_mutex_);
        result.status = status_;
        result.message = message_;
    }
    result.aborted_elsewhere = aborted_elsewhere_.load();
    result.stats.struct_size = sizeof result.stats;
    result.stats.backend = MLOPT_BACKEND_CPU;
    result.stats.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
    return result;
}

std::byte* RankEngine::buffer(Buffer b) const {
    switch (b) {
        case Buffer::input: return request_.memory.input;
        case Buffer::output: return request_.memory.output;
        case Buffer::scratch: return scratch_;
    }
    return nullptr;
}

// ------------------------------------------------------------------------------------------ threadblocks

void RankEngine::thread_main(TbRun& t) noexcept {
    try {
        if (walk(t)) t.finished.store(true);
    } catch (const std::bad_alloc&) {  // message text: the only allocations on a thread
        stop(MLOPT_ERR_NO_MEMORY, "rank " + std::to_string(me_) + ": out of memory");
    } catch (...) {
        stop(MLOPT_ERR_INTERNAL, "rank " + std::to_string(me_) + ": unexpected error in a threadblock thread");
    }
}

// The executor's loop: every step of the threadblock, for every loop iteration. False when the run stopped.
bool RankEngine::walk(TbRun& t) {
    const std::vector<Step>& steps = t.tb->steps;
    for (int64_t it = 0; it < slicing_.iterations; ++it) {
        t.iteration.store(it, std::memory_order_relaxed);
        for (size_t pc = 0; pc < steps.size(); ++pc) {
            t.pc.store(pc, std::memory_order_relaxed);
            const Step& st = steps[pc];
            if (!await_dependency(t, st, it)) return false;
            if (!run_step(t, st, it)) return false;
        }
    }
    return true;
}

bool RankEngine::await_dependency(TbRun& t, const Step& st, int64_t iteration) {
    if (st.depid < 0) return true;
    const int64_t want = flag_value(iteration, st.deps);
    const auto target = static_cast<size_t>(st.depid);
    std::unique_lock<std::mutex> lock(flag_mutex_);
    if (flags_[target] >= want) return true;
    t.wait.store(Wait::dependency);
    int64_t seen = progress_.load();
    auto since = Clock::now();
    while (flags_[target] < want) {
        if (stopped_.load()) return false;
        flag_cv_.wait_for(lock, tick_);
        if (flags_[target] >= want) break;
        lock.unlock();  // stop() takes flag_mutex_ to wake the other waiters
        const bool go_on = !stopped() && patient(seen, since);
        lock.lock();
        if (!go_on) return false;
    }
    t.wait.store(Wait::none);
    return true;
}

bool RankEngine::run_step(TbRun& t, const Step& st, int64_t iteration) {
    const StepData d =
        step_data(st, buffer(st.srcbuf), buffer(st.dstbuf), slicing_, iteration, request_.dtype, request_.op);
    const bool receiving = d.bytes > 0 && step_receives(st.type);  // cnt=0 and nop: no message
    const bool sending = d.bytes > 0 && step_sends(st.type);
    if (!open_streams(t, receiving, sending)) return false;
    if (receiving && !receive_header(t, st, iteration, d.bytes)) return false;
    if (sending && !send_header(t, st, iteration, d.bytes)) return false;
    if (receiving) {
        if (!receive_payload(t, d, sending)) return false;
    } else if (sending) {
        if (!send_payload(t, d)) return false;
    } else if (d.bytes > 0) {  // cpy, re
        apply_step(d, 0, d.bytes, nullptr, nullptr);
    }
    if (sending) ++t.messages;
    complete_step(t, st, iteration, t.pc.load(std::memory_order_relaxed), d.bytes);
    return true;
}

void RankEngine::complete_step(TbRun& t, const Step& st, int64_t iteration, size_t pc, size_t bytes) {
    ++t.steps;
    t.bytes_moved += static_cast<int64_t>(bytes) * step_copies(st.type);
    moved(1);
    if (st.hasdep && st.type != StepType::nop) {  // the executor never signals nops (symbolic.py)
        {
            std::lock_guard<std::mutex> lock(flag_mutex_);
            flags_[static_cast<size_t>(t.tb - gpu_.tbs.data())] = flag_value(iteration, static_cast<int64_t>(pc));
        }
        flag_cv_.notify_all();
    }
}

// ------------------------------------------------------------------------------------------ messages

bool RankEngine::open_streams(TbRun& t, bool receiving, bool sending) {
    if (receiving && t.recv == nullptr &&
        !await(t, Wait::message, [&](Clock::time_point deadline, std::string& why) {
            return transport_.recv_stream(t.recv_rank, tag(t), &t.recv, deadline, why);
        }))
        return false;
    if (sending && t.send == nullptr &&
        !await(t, Wait::space, [&](Clock::time_point deadline, std::string& why) {
            return transport_.send_stream(t.send_rank, tag(t), &t.send, deadline, why);
        }))
        return false;
    return true;
}

bool RankEngine::read_exact(TbRun& t, void* data, size_t n) {
    auto* to = static_cast<std::byte*>(data);
    for (size_t done = 0; done < n;) {
        const std::byte* span = nullptr;
        size_t size = 0;
        if (!await(t, Wait::message, [&](Clock::time_point deadline, std::string& why) {
                return t.recv->peek(n - done, &span, &size, deadline, why);
            }))
            return false;
        size = std::min(size, n - done);
        std::memcpy(to + done, span, size);
        t.recv->consume(size);
        done += size;
        moved(static_cast<int64_t>(size));
    }
    return true;
}

// Publishes the first n reserved bytes of t's outgoing message; false (the run stopped) when the peer failed.
bool RankEngine::commit(TbRun& t, size_t n) {
    std::string why;
    if (t.send->commit(n, why) != TransportWait::failed) return true;
    transport_failed(why, where(t) + " was sending to rank " + std::to_string(t.send_rank));
    return false;
}

// Sends `bytes` bytes span by span: fill(span, offset, n) writes bytes [offset, offset + n) of them into a
// reserved span, which is then committed.
template <typename Fill>
bool RankEngine::send_spans(TbRun& t, size_t bytes, Fill&& fill) {
    for (size_t offset = 0; offset < bytes;) {
        std::byte* span = nullptr;
        size_t n = 0;
        if (!await(t, Wait::space, [&](Clock::time_point deadline, std::string& why) {
                return t.send->reserve(bytes - offset, &span, &n, deadline, why);
            }))
            return false;
        n = std::min(n, bytes - offset);
        fill(span, offset, n);
        if (!commit(t, n)) return false;
        offset += n;
        moved(static_cast<int64_t>(n));
    }
    return true;
}

bool RankEngine::write_exact(TbRun& t, const void* data, size_t n) {
    const auto* from = static_cast<const std::byte*>(data);
    return send_spans(t, n, [&](std::byte* span, size_t offset, size_t size) {
        std::memcpy(span, from + offset, size);
    });
}

bool RankEngine::send_header(TbRun& t, const Step& st, int64_t iteration, size_t bytes) {
    MessageHeader h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.run = request_.run;
    h.signature = signature_;
    h.count = count_;
    h.slice_elems = slicing_.slice_elems;
    h.iteration = iteration;
    h.payload_bytes = bytes;
    h.sender = me_;
    h.tb = t.tb->id;
    h.step = static_cast<int32_t>(t.pc.load(std::memory_order_relaxed));
    h.cnt = st.cnt;
    h.dtype = static_cast<uint8_t>(request_.dtype);
    h.op = static_cast<uint8_t>(request_.op);
    std::memcpy(h.name, program_.name.data(), std::min(program_.name.size(), kNameBytes - 1));
    return write_exact(t, &h, sizeof h);
}

bool RankEngine::receive_header(TbRun& t, const Step& st, int64_t iteration, size_t bytes) {
    MessageHeader h{};
    if (!read_exact(t, &h, sizeof h)) return false;
    h.name[kNameBytes - 1] = '\0';
    return check_header(t, h, st, iteration, bytes);
}

// The message must belong to this run (MLOPT_ERR_MISMATCH, or out_of_order_status for another run) and match
// the receiving step, as the in-process interpreter's check_message (MLOPT_ERR_SEMANTIC).
bool RankEngine::check_header(const TbRun& t, const MessageHeader& h, const Step& st, int64_t iteration,
                              size_t bytes) {
    const std::string from = "rank " + std::to_string(t.recv_rank);
    if (h.magic != kMagic || h.version != kVersion) {
        stop(MLOPT_ERR_MISMATCH, where(t) + ": the stream from " + from + " on channel " +
                                     std::to_string(t.tb->chan) + " does not carry an mlopt message here (magic " +
                                     std::to_string(h.magic) + ", version " + std::to_string(h.version) +
                                     "): the peer runs another mlopt version, or the stream is out of step");
        return false;
    }
    if (h.run != request_.run) {
        const mlopt_status status = request_.out_of_order_status;
        stop(status, std::string(status == MLOPT_ERR_DEADLOCK ? "deadlock: " : "") + where(t) + " runs " +
                         run_text(request_.run) + " but receives from " + from + " a message of " + run_text(h.run) +
                         ": the ranks run collectives in different orders");
        return false;
    }
    if (h.signature != signature_) {
        std::string text = describe_side(me_, "runs", program_.name.c_str(), count_, request_.dtype, request_.op,
                                         slicing_.slice_elems) +
                           "; " + describe_side(h.sender, "sent for", h.name, h.count, h.dtype, h.op, h.slice_elems);
        if (program_.name.compare(0, kNameBytes - 1, h.name) == 0 && h.count == count_ && h.dtype == request_.dtype &&
            h.op == request_.op && h.slice_elems == slicing_.slice_elems)
            text += " (the programs differ: another step table under the same name)";
        stop(MLOPT_ERR_MISMATCH, text + " (" + where(t) + " on channel " + std::to_string(t.tb->chan) + ")");
        return false;
    }
    if (h.cnt == st.cnt && h.iteration == iteration && h.payload_bytes == bytes) return true;
    std::string sender = "rank " + std::to_string(h.sender) + " tb " + std::to_string(h.tb) + " step " +
                         std::to_string(h.step);
    const int32_t position = t.tb->recv;  // the same program on both sides: name the sender's step type too
    const std::vector<Threadblock>& peer_tbs = program_.gpus[static_cast<size_t>(position)].tbs;
    if (h.tb >= 0 && static_cast<size_t>(h.tb) < peer_tbs.size() && h.step >= 0 &&
        static_cast<size_t>(h.step) < peer_tbs[h.tb].steps.size())
        sender = step_label(h.sender, h.tb, static_cast<size_t>(h.step), peer_tbs[h.tb].steps[h.step].type);
    if (h.cnt != st.cnt)
        stop(MLOPT_ERR_SEMANTIC, where(t) + " receives cnt=" + std::to_string(st.cnt) + " but the matching send " +
                                     sender + " has cnt=" + std::to_string(h.cnt));
    else
        stop(MLOPT_ERR_SEMANTIC, where(t) + " receives a message of loop iteration " + std::to_string(h.iteration) +
                                     " from " + sender + ": the sends and receives on this connection do not pair up");
    return false;
}

// A sending-only step (s): its pieces straight into the reserved spans.
bool RankEngine::send_payload(TbRun& t, const StepData& d) {
    return send_spans(t, d.bytes, [&](std::byte* out, size_t offset, size_t n) {
        apply_step(d, offset, n, nullptr, out);
    });
}

// A receiving step: applied straight from the peeked spans; a forwarding step (rcs, rrs, rrcs) writes the same
// byte range of its outgoing message into a reserved span in the same pass (min(readable, writable) bytes).
// Reductions need whole, aligned elements: spans that are not go through bounce().
bool RankEngine::receive_payload(TbRun& t, const StepData& d, bool forward) {
    const bool reduces = d.type == StepType::rrs || d.type == StepType::rrc || d.type == StepType::rrcs;
    for (size_t offset = 0; offset < d.bytes;) {
        const std::byte* in = nullptr;
        size_t n = 0;
        if (!await(t, Wait::message, [&](Clock::time_point deadline, std::string& why) {
                return t.recv->peek(d.bytes - offset, &in, &n, deadline, why);
            }))
            return false;
        n = std::min(n, d.bytes - offset);
        std::byte* out = nullptr;
        if (forward) {
            size_t room = 0;
            if (!await(t, Wait::space, [&](Clock::time_point deadline, std::string& why) {
                    return t.send->reserve(n, &out, &room, deadline, why);
                }))
                return false;
            n = std::min(n, room);
        }
        if (reduces) n -= n % es_;
        const bool direct = n > 0 && (!reduces || (aligned(in, es_) && (d.type != StepType::rrs || aligned(out, es_))));
        if (direct) apply_step(d, offset, n, in, out);
        const size_t used = direct ? n : 0;  // otherwise both spans are handed back untouched
        t.recv->consume(used);
        if (forward && !commit(t, used)) return false;
        if (!direct && !bounce(t, d, offset, forward)) return false;
        const size_t done = direct ? n : std::min(kBounceBytes, d.bytes - offset);
        offset += done;
        moved(static_cast<int64_t>(direct ? n : 0));
    }
    return true;
}

// Reduces the next min(kBounceBytes, rest) message bytes through aligned local buffers: for spans that split
// an element (a FIFO wrapping inside one) or that the transport did not align.
bool RankEngine::bounce(TbRun& t, const StepData& d, size_t offset, bool forward) {
    alignas(16) std::byte in[kBounceBytes];
    alignas(16) std::byte out[kBounceBytes];
    const size_t n = std::min(kBounceBytes, d.bytes - offset);  // a multiple of the element size, as both are
    if (!read_exact(t, in, n)) return false;
    apply_step(d, offset, n, in, forward ? out : nullptr);
    return !forward || write_exact(t, out, n);
}

// ------------------------------------------------------------------------------------------ waiting

// Calls call(deadline, why) until it is not a timeout: true when it succeeded, false when the run stopped (a
// failed peer, the watchdog, another threadblock's failure, a cancel).
template <typename Call>
bool RankEngine::await(TbRun& t, Wait kind, Call&& call) {
    t.wait.store(kind, std::memory_order_relaxed);
    int64_t seen = progress_.load(std::memory_order_relaxed);
    auto since = Clock::now();
    std::string why;
    while (!stopped()) {
        const TransportWait w = call(Clock::now() + tick_, why);
        if (w == TransportWait::ok) {
            t.wait.store(Wait::none, std::memory_order_relaxed);
            return true;
        }
        if (w == TransportWait::failed) {
            transport_failed(why, where(t) + " " + waiting_for(t));
            return false;
        }
        if (!patient(seen, since)) return false;
    }
    return false;
}

// The watchdog, run by every waiting thread: false (and the run stopped) once the rank moved nothing for
// watchdog_ms.
bool RankEngine::patient(int64_t& seen, Clock::time_point& since) {
    const int64_t now_seen = progress_.load(std::memory_order_relaxed);
    const auto now = Clock::now();
    if (now_seen != seen) {
        seen = now_seen;
        since = now;
        return true;
    }
    if (now - since < patience_) return true;
    stop(MLOPT_ERR_DEADLOCK, "deadlock: nothing moved on rank " + std::to_string(me_) + " for " +
                                 std::to_string(patience_.count()) + " ms: " + describe_unfinished());
    return false;
}

// A transport wait failed: a peer died or aborted (MLOPT_ERR_DEADLOCK: the run cannot complete), or this rank's
// transport was aborted by another run on it (the enforcer's motifs on other channels), whose failure is the
// cause and is reported by that run.
void RankEngine::transport_failed(const std::string& why, const std::string& doing) {
    if (stopped()) return;  // this run's own stop (or a cancel) aborted the transport: that is the reason
    const std::string own = transport_.aborted();
    if (!own.empty()) {
        aborted_elsewhere_.store(true);
        stop(MLOPT_ERR_DEADLOCK, "another run on this rank failed: " + own + " (" + doing + ")");
        return;
    }
    stop(MLOPT_ERR_DEADLOCK, "peer failed: " + why + " (" + doing + ")");
}

bool RankEngine::stopped() {
    if (stopped_.load()) return true;
    if (request_.cancel == nullptr || !request_.cancel->load()) return false;
    stop(MLOPT_ERR_INVALID_ARGUMENT, request_.cancel_reason);
    return true;
}

// The first reason wins; a failed run aborts the transport, so the peers (and this rank's own waits) fail now
// rather than at their watchdogs.
void RankEngine::stop(mlopt_status status, const std::string& message) {
    {
        std::lock_guard<std::mutex> lock(status_mutex_);
        if (stopped_.load()) return;
        status_ = status;
        message_ = message;
        stopped_.store(true);
    }
    { std::lock_guard<std::mutex> lock(flag_mutex_); }  // a dependency waiter sees stopped_ or gets the notify
    flag_cv_.notify_all();
    try {
        transport_.abort(message);
    } catch (...) {  // the transport's own failure: the run's error already says why it stops
    }
}

// ------------------------------------------------------------------------------------------ descriptions

std::string RankEngine::run_text(uint64_t run) const {
    return request_.describe_run ? request_.describe_run(run) : "run " + std::to_string(run);
}

std::string RankEngine::describe_side(int32_t rank, const char* verb, const char* name, uint64_t count, int dtype,
                                      int op, uint64_t slice_elems) const {
    return "rank " + std::to_string(rank) + " " + verb + " '" + name + "' count=" + std::to_string(count) + " " +
           dtype_name(static_cast<mlopt_dtype>(dtype)) + " " + redop_name(static_cast<mlopt_redop>(op)) +
           " in slices of " + std::to_string(slice_elems) + " elements";
}

std::string RankEngine::where(const TbRun& t) const {
    const size_t pc = t.pc.load(std::memory_order_relaxed);
    if (pc >= t.tb->steps.size()) return "rank " + std::to_string(me_) + " tb " + std::to_string(t.tb->id);
    return step_label(me_, t.tb->id, pc, t.tb->steps[pc].type) + " of loop iteration " +
           std::to_string(t.iteration.load(std::memory_order_relaxed));
}

std::string RankEngine::waiting_for(const TbRun& t) const {
    const std::string channel = " on channel " + std::to_string(t.tb->chan);
    switch (t.wait.load(std::memory_order_relaxed)) {
        case Wait::dependency: {
            const Step& st = t.tb->steps[t.pc.load(std::memory_order_relaxed)];
            const TbRun& target = tbs_[static_cast<size_t>(st.depid)];
            std::string text = "waits for tb " + std::to_string(target.tb->id) + " to complete step " +
                               std::to_string(st.deps) + " (hasdep)";
            if (target.finished.load()) text += ", which has finished without signalling it";
            return text;
        }
        case Wait::message: return "waits for a message from rank " + std::to_string(t.recv_rank) + channel;
        case Wait::space: return "cannot send to rank " + std::to_string(t.send_rank) + channel + ": the FIFO is full";
        case Wait::none: break;
    }
    return "is running";
}

std::string RankEngine::describe_unfinished() const {
    ThreadblockList list;
    bool full = false;
    int32_t most = 1;  // the largest cnt this rank sends
    for (const TbRun& t : tbs_) {
        for (const Step& st : t.tb->steps)
            if (step_sends(st.type)) most = std::max(most, st.cnt);
        if (t.finished.load()) continue;
        full |= t.wait.load(std::memory_order_relaxed) == Wait::space;
        list.add([&] { return where(t) + " " + waiting_for(t); });
    }
    std::string text = list.text();
    if (full)  // the likely cause: a cycle of sends each waiting for the next rank to start reading
        text += " (a send blocks until its message has gone through the FIFO; messages here carry up to " +
                std::to_string(static_cast<size_t>(most) * slicing_.slice_elems * es_ + sizeof(MessageHeader)) +
                " bytes: lower chunk_bytes below the FIFO size)";
    return text;
}

}  // namespace

RankRunResult run_rank_program(const Program& program, const RankRunRequest& request, Transport& transport,
                               Workspace& workspace) {
    RankRunResult result;
    try {
        if (request.position < 0 || static_cast<size_t>(request.position) >= program.gpus.size()) {
            result.status = MLOPT_ERR_INVALID_ARGUMENT;
            result.message = "program position " + std::to_string(request.position) + " is not in 0.." +
                             std::to_string(program.gpus.size()) + "-1";
            transport.abort(result.message);
            return result;
        }
        RankEngine engine(program, request, transport, workspace);
        return engine.run();
    } catch (const std::bad_alloc&) {
        result.status = MLOPT_ERR_NO_MEMORY;
        result.message = "out of memory while setting up the run";
    } catch (...) {
        result.status = MLOPT_ERR_INTERNAL;
        result.message = "unexpected error while setting up the run";
    }
    try {
        transport.abort(result.message);
    } catch (...) {
    }
    return result;
}

}  // namespace mlopt

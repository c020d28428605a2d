// The CPU interpreter (see interpreter.hpp).
//
// Threading: every threadblock of every rank is a state machine (step index, loop iteration, and what the
// current step already holds: a received message, a reserved send slot). A pool of worker threads takes
// runnable threadblocks from a ready queue and runs each until it finishes or must wait; a threadblock that
// waits is parked on exactly one waiter list (a FIFO's data or space, another threadblock's dependency flag)
// and goes back to the ready queue when that changes. So every unfinished threadblock is at all times either
// ready, running, or parked, which makes the certain deadlock exact: nothing ready and nothing running.
//
// Locking: one scheduler mutex guards all the bookkeeping (queues, flags, waiter lists, counters); the data
// work of a step (memcpy, reductions) runs with the mutex released, once the step owns everything it touches.
// A step's lifecycle: acquire (dependency met, message popped, send slot reserved) -> execute (no lock) ->
// complete (push the message, signal the flag, wake waiters).
//
// FIFOs carry copies: a message is a payload block filled by the sender (or the received payload itself,
// forwarded by rcs/rrs/rrcs), so a sender may overwrite its buffers as soon as its step completes. Payload
// blocks come from the communicator's Workspace and are recycled.
#include "interpreter.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <thread>

#include "reduce.hpp"
#include "step_ops.hpp"
#include "validate.hpp"

namespace mlopt {

// ------------------------------------------------------------------------------------------------ memory

namespace {
constexpr std::align_val_t kBlockAlignment{64};
constexpr size_t kMaxSpareBlocks = 64;
constexpr size_t kMaxSpareBytes = size_t{1} << 30;  // spare payloads kept past this are freed
}  // namespace

Block::Block(size_t bytes)
    : data_(static_cast<std::byte*>(::operator new(std::max<size_t>(bytes, 1), kBlockAlignment))),
      capacity_(bytes) {}

void Block::Free::operator()(std::byte* p) const { ::operator delete(p, kBlockAlignment); }

std::byte* Workspace::scratch(size_t rank, size_t bytes) {
    if (scratch_.size() <= rank) scratch_.resize(rank + 1);
    if (scratch_[rank].capacity() < bytes) scratch_[rank] = Block(bytes);
    return scratch_[rank].data();
}

Block Workspace::take(size_t bytes) {
    size_t best = spare_.size();
    for (size_t i = 0; i < spare_.size(); ++i) {
        const size_t capacity = spare_[i].capacity();
        if (capacity >= bytes && (best == spare_.size() || capacity < spare_[best].capacity())) best = i;
    }
    if (best == spare_.size()) return Block(bytes);
    Block block = std::move(spare_[best]);
    spare_[best] = std::move(spare_.back());
    spare_.pop_back();
    return block;
}

void Workspace::give(Block block) {
    if (block.capacity() == 0) return;
    size_t kept = block.capacity();
    for (const Block& b : spare_) kept += b.capacity();
    if (spare_.size() >= kMaxSpareBlocks || kept > kMaxSpareBytes) return;  // freed here
    spare_.push_back(std::move(block));
}

// ------------------------------------------------------------------------------------------------ steps

namespace {

// Step classification and names: validate.hpp (shared with the loader).
// Step data operations, loop slicing, flags and labels: step_ops.hpp (shared with the rank engine).
constexpr auto receives = step_receives;
constexpr auto sends = step_sends;

}  // namespace

// ------------------------------------------------------------------------------------------------ engine

namespace {

using Clock = std::chrono::steady_clock;

enum class Wait : uint8_t { none, dependency, message, space };

struct Message {
    Block payload;
    int32_t cnt = 0;  // chunks of the sending step
    int64_t iteration = 0;
    int32_t rank = 0;  // the sending step, for error messages
    int32_t tb = 0;
    int32_t step = 0;
};

struct Connection {
    int32_t from = 0;
    int32_t to = 0;
    int32_t chan = 0;
    std::deque<Message> queue;
    int32_t reserved = 0;  // slots held by senders still filling them (count as in flight)
    std::vector<int32_t> data_waiters;
    std::vector<int32_t> space_waiters;
};

struct TbState {
    const Threadblock* tb = nullptr;
    int32_t rank = 0;
    int32_t first = 0;  // flat index of tb 0 of the same rank: depid -> flat index
    int32_t send_conn = -1;
    int32_t recv_conn = -1;
    size_t pc = 0;
    int64_t iteration = 0;
    bool finished = false;
    bool running = false;
    bool holding = false;   // `held` is the current step's received message
    bool reserved = false;  // the current step owns a slot of its send connection
    Message held;
    Block outgoing;  // payload a send-only step fills
    Wait wait = Wait::none;
    int32_t wait_target = -1;  // dependency: the flat index waited for
    int64_t flag = -1;         // (iteration << 32) | step of the last hasdep step completed
    std::vector<int32_t> flag_waiters;
};

class Engine {
public:
    Engine(const Program& program, const RunRequest& request, Workspace& workspace);
    RunResult run();

private:
    void build_state();
    int32_t connection_index(int32_t from, int32_t to, int32_t chan);
    size_t worker_count() const;

    // Scheduling; all under mutex_.
    void worker();
    void advance(int32_t g, std::unique_lock<std::mutex>& lock);
    bool acquire(int32_t g, TbState& t, const Step& st);
    bool check_message(const TbState& t, const Step& st);
    void complete(TbState& t, const Step& st);
    void finish(TbState& t);
    void wake(std::vector<int32_t>& waiters);
    void stop(mlopt_status status, std::string message);
    void supervise(std::unique_lock<std::mutex>& lock);
    void recycle();

    // Data; without the lock (the step owns its message and slot; buffers follow the program's ordering).
    void execute(TbState& t, const Step& st) const;
    std::byte* buffer(int32_t rank, Buffer b) const;

    std::string where(const TbState& t) const;
    std::string waiting_for(const TbState& t) const;
    bool senders_finished(int32_t conn) const;
    std::string describe_unfinished() const;

    const Program& program_;
    const RunRequest& request_;
    Workspace& workspace_;
    const size_t elem_size_;
    const LoopSlicing slicing_;
    const int64_t iterations_;
    size_t fifo_slots_ = 0;  // 0: unbounded
    std::vector<std::byte*> scratch_;

    std::vector<TbState> tbs_;
    std::deque<Connection> connections_;  // deque: Connection holds a deque, which moves with noexcept(false)

    std::mutex mutex_;
    std::condition_variable work_cv_;  // workers: something became ready, or stop
    std::condition_variable done_cv_;  // supervisor: stop
    std::deque<int32_t> ready_;
    std::vector<char> queued_;
    int32_t running_ = 0;
    int64_t unfinished_ = 0;
    int64_t progress_ = 0;  // steps completed: what the watchdog watches
    bool stopped_ = false;
    mlopt_status status_ = MLOPT_OK;
    std::string message_;
    mlopt_run_stats stats_{};
};

Engine::Engine(const Program& program, const RunRequest& request, Workspace& workspace)
    : program_(program),
      request_(request),
      workspace_(workspace),
      elem_size_(dtype_size(request.dtype)),
      slicing_(request.chunk_elems, request.chunk_bytes, elem_size_),
      iterations_(slicing_.iterations) {
    const size_t chunk = request.chunk_elems;
    fifo_slots_ = request.fifo_slots > 0 ? static_cast<size_t>(request.fifo_slots) : 0;
    for (size_t r = 0; r < program.gpus.size(); ++r) {
        scratch_.push_back(workspace.scratch(r, static_cast<size_t>(program.gpus[r].s_chunks) * chunk * elem_size_));
    }
    build_state();
}

int32_t Engine::connection_index(int32_t from, int32_t to, int32_t chan) {
    for (size_t i = 0; i < connections_.size(); ++i) {
        const Connection& c = connections_[i];
        if (c.from == from && c.to == to && c.chan == chan) return static_cast<int32_t>(i);
    }
    Connection c;
    c.from = from;
    c.to = to;
    c.chan = chan;
    connections_.push_back(std::move(c));
    return static_cast<int32_t>(connections_.size() - 1);
}

void Engine::build_state() {
    size_t total = 0;
    for (const Gpu& gpu : program_.gpus) total += gpu.tbs.size();
    tbs_.resize(total);
    queued_.assign(total, 0);
    size_t g = 0;
    for (const Gpu& gpu : program_.gpus) {
        const auto first = static_cast<int32_t>(g);
        for (const Threadblock& tb : gpu.tbs) {
            TbState& t = tbs_[g++];
            t.tb = &tb;
            t.rank = gpu.id;
            t.first = first;
            if (tb.send >= 0) t.send_conn = connection_index(gpu.id, tb.send, tb.chan);
            if (tb.recv >= 0) t.recv_conn = connection_index(tb.recv, gpu.id, tb.chan);
        }
    }
    unfinished_ = static_cast<int64_t>(total);
}

size_t Engine::worker_count() const {
    size_t wanted = request_.threads > 0 ? static_cast<size_t>(request_.threads) : std::thread::hardware_concurrency();
    return std::max<size_t>(1, std::min(wanted, tbs_.size()));
}

RunResult Engine::run() {
    const auto started = Clock::now();
    RunResult result;
    if (!tbs_.empty() && iterations_ > 0) {
        for (size_t g = 0; g < tbs_.size(); ++g) {
            ready_.push_back(static_cast<int32_t>(g));
            queued_[g] = 1;
        }
        std::vector<std::thread> workers;
        try {
            const size_t n = worker_count();
            workers.reserve(n);
            for (size_t i = 0; i < n; ++i) workers.emplace_back([this] { worker(); });
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            stop(MLOPT_ERR_INTERNAL, "cannot start the interpreter's worker threads");
        }
        {
            std::unique_lock<std::mutex> lock(mutex_);
            supervise(lock);
        }
        for (std::thread& w : workers) w.join();
        recycle();
        stats_.loop_iterations = iterations_;
    }
    result.status = status_;
    result.message = std::move(message_);
    result.stats = stats_;
    result.stats.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
    return result;
}

// The calling thread watches for two endings besides success: a worker declared a certain deadlock (stop), or
// no step completed for watchdog_ms (a step that never ends, or a scheduling bug: report rather than hang).
void Engine::supervise(std::unique_lock<std::mutex>& lock) {
    const int32_t ms = request_.watchdog_ms > 0 ? request_.watchdog_ms : 10000;
    const auto patience = std::chrono::milliseconds(ms);
    const auto tick = std::clamp<Clock::duration>(patience / 10, std::chrono::milliseconds(1),
                                                  std::chrono::milliseconds(100));
    int64_t seen = progress_;
    auto last_change = Clock::now();
    while (!stopped_) {
        done_cv_.wait_for(lock, tick);
        if (stopped_) break;
        const auto now = Clock::now();
        if (progress_ != seen) {
            seen = progress_;
            last_change = now;
        } else if (now - last_change >= patience) {
            stop(MLOPT_ERR_DEADLOCK,
                 "deadlock: no step completed for " + std::to_string(ms) + " ms: " + describe_unfinished());
        }
    }
}

void Engine::worker() {
    std::unique_lock<std::mutex> lock(mutex_);
    bool counted = false;  // this worker is in running_
    try {
        while (!stopped_) {
            if (ready_.empty()) {
                if (running_ == 0) {  // everything unfinished is parked: nothing can ever wake it
                    stop(MLOPT_ERR_DEADLOCK,
                         "deadlock: every unfinished threadblock is blocked: " + describe_unfinished());
                    break;
                }
                work_cv_.wait(lock);
                continue;
            }
            const int32_t g = ready_.front();
            ready_.pop_front();
            queued_[g] = 0;
            ++running_;
            counted = true;
            tbs_[g].running = true;
            advance(g, lock);
            tbs_[g].running = false;
            --running_;
            counted = false;
        }
    } catch (...) {
        // Only bookkeeping allocations throw (payload blocks, message text), always under the lock.
        if (!lock.owns_lock()) lock.lock();
        if (counted) --running_;
        stop(MLOPT_ERR_NO_MEMORY, "");
    }
}

// Runs threadblock g until it finishes, parks, or the run stops. Called and returns with the lock held.
void Engine::advance(int32_t g, std::unique_lock<std::mutex>& lock) {
    TbState& t = tbs_[g];
    const auto& steps = t.tb->steps;
    if (steps.empty()) {
        finish(t);
        return;
    }
    while (!stopped_) {
        if (t.pc == steps.size()) {
            t.pc = 0;
            if (++t.iteration == iterations_) {
                finish(t);
                return;
            }
        }
        const Step& st = steps[t.pc];
        if (!acquire(g, t, st)) return;
        lock.unlock();
        execute(t, st);
        lock.lock();
        complete(t, st);
    }
}

// Takes what step `st` needs, in the executor's order: its dependency, then the incoming message, then a
// slot on the outgoing FIFO. On a miss, parks g on the matching waiter list and returns false; what was
// already taken stays held, so a resumed step continues where it stopped.
bool Engine::acquire(int32_t g, TbState& t, const Step& st) {
    if (st.depid >= 0) {
        const int32_t target = t.first + st.depid;
        if (tbs_[target].flag < flag_value(t.iteration, st.deps)) {
            t.wait = Wait::dependency;
            t.wait_target = target;
            tbs_[target].flag_waiters.push_back(g);
            return false;
        }
    }
    const bool moves = st.cnt > 0;  // cnt=0 neither sends nor receives a message
    if (moves && receives(st.type) && !t.holding) {
        Connection& in = connections_[t.recv_conn];
        if (in.queue.empty()) {
            t.wait = Wait::message;
            in.data_waiters.push_back(g);
            return false;
        }
        t.held = std::move(in.queue.front());
        in.queue.pop_front();
        t.holding = true;
        wake(in.space_waiters);
        if (!check_message(t, st)) return false;
    }
    if (moves && sends(st.type) && !t.reserved) {
        Connection& out = connections_[t.send_conn];
        if (fifo_slots_ > 0 && out.queue.size() + static_cast<size_t>(out.reserved) >= fifo_slots_) {
            t.wait = Wait::space;
            out.space_waiters.push_back(g);
            return false;
        }
        ++out.reserved;
        t.reserved = true;
        // Steps that also receive forward the received payload; a plain send needs its own.
        if (!receives(st.type)) {
            t.outgoing = workspace_.take(static_cast<size_t>(st.cnt) * slicing_.length(t.iteration) * elem_size_);
        }
    }
    t.wait = Wait::none;
    return true;
}

// A received message must be what the step expects: the same chunk count, sent in the same loop iteration
// (a message from another iteration means the program's sends and receives on that connection do not pair
// up; then slice lengths may differ too).
bool Engine::check_message(const TbState& t, const Step& st) {
    const Message& m = t.held;
    if (m.cnt == st.cnt && m.iteration == t.iteration) return true;
    const StepType sender_type = program_.gpus[m.rank].tbs[m.tb].steps[m.step].type;
    const std::string receiver = where(t);
    const std::string sender = step_label(m.rank, m.tb, m.step, sender_type);
    if (m.cnt != st.cnt) {
        stop(MLOPT_ERR_SEMANTIC, receiver + " receives cnt=" + std::to_string(st.cnt) + " but the matching send " +
                                     sender + " has cnt=" + std::to_string(m.cnt));
    } else {
        stop(MLOPT_ERR_SEMANTIC, receiver + " receives a message of loop iteration " + std::to_string(m.iteration) +
                                     " from " + sender + ": the sends and receives on this connection do not pair up");
    }
    return false;
}

void Engine::complete(TbState& t, const Step& st) {
    const size_t elems = static_cast<size_t>(st.cnt) * slicing_.length(t.iteration);
    if (t.reserved) {
        Connection& out = connections_[t.send_conn];
        Message m;
        m.payload = t.holding ? std::move(t.held.payload) : std::move(t.outgoing);
        m.cnt = st.cnt;
        m.iteration = t.iteration;
        m.rank = t.rank;
        m.tb = t.tb->id;
        m.step = static_cast<int32_t>(t.pc);
        out.queue.push_back(std::move(m));
        --out.reserved;
        t.reserved = false;
        ++stats_.messages;
        wake(out.data_waiters);
    }
    if (t.holding) {
        workspace_.give(std::move(t.held.payload));  // no-op when forwarded above
        t.holding = false;
    }
    stats_.bytes_moved += static_cast<int64_t>(elems * elem_size_) * step_copies(st.type);
    ++stats_.steps_executed;
    ++progress_;
    if (st.hasdep && st.type != StepType::nop) {  // the executor never signals nops (symbolic.py)
        t.flag = flag_value(t.iteration, static_cast<int64_t>(t.pc));
        wake(t.flag_waiters);
    }
    ++t.pc;
}

void Engine::finish(TbState& t) {
    t.finished = true;
    if (--unfinished_ == 0) stop(MLOPT_OK, "");
}

void Engine::wake(std::vector<int32_t>& waiters) {
    for (int32_t w : waiters) {
        if (queued_[w]) continue;
        queued_[w] = 1;
        tbs_[w].wait = Wait::none;
        ready_.push_back(w);
        work_cv_.notify_one();
    }
    waiters.clear();
}

// The first reason to stop wins (a deadlock found after a semantic error is a consequence of it).
void Engine::stop(mlopt_status status, std::string message) {
    if (!stopped_) {
        stopped_ = true;
        status_ = status;
        message_ = std::move(message);
        if (status_ == MLOPT_ERR_NO_MEMORY && message_.empty()) message_ = "out of memory for FIFO messages";
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
}

// Payloads still in FIFOs or held by stopped threadblocks go back to the workspace for the next run.
void Engine::recycle() {
    for (Connection& c : connections_) {
        for (Message& m : c.queue) workspace_.give(std::move(m.payload));
        c.queue.clear();
    }
    for (TbState& t : tbs_) {
        workspace_.give(std::move(t.held.payload));
        workspace_.give(std::move(t.outgoing));
    }
}

std::byte* Engine::buffer(int32_t rank, Buffer b) const {
    switch (b) {
        case Buffer::input: return request_.ranks[rank].input;
        case Buffer::output: return request_.ranks[rank].output;
        case Buffer::scratch: return scratch_[rank];
    }
    return nullptr;
}

// The step's data work (step_ops.hpp): `in` is the received payload, which forwarding steps send on in place.
void Engine::execute(TbState& t, const Step& st) const {
    const StepData d = step_data(st, buffer(t.rank, st.srcbuf), buffer(t.rank, st.dstbuf), slicing_, t.iteration,
                                 request_.dtype, request_.op);
    const std::byte* in = t.holding ? t.held.payload.data() : nullptr;
    std::byte* out = t.reserved ? (t.holding ? t.held.payload.data() : t.outgoing.data()) : nullptr;
    apply_step(d, 0, d.bytes, in, out);
}

std::string Engine::where(const TbState& t) const {
    if (t.pc >= t.tb->steps.size()) return "rank " + std::to_string(t.rank) + " tb " + std::to_string(t.tb->id);
    std::string label = step_label(t.rank, t.tb->id, t.pc, t.tb->steps[t.pc].type);
    if (iterations_ > 1) label += " of loop iteration " + std::to_string(t.iteration);
    return label;
}

std::string Engine::waiting_for(const TbState& t) const {
    switch (t.wait) {
        case Wait::dependency: {
            const TbState& target = tbs_[t.wait_target];
            const Step& st = t.tb->steps[t.pc];
            std::string text = "waits for tb " + std::to_string(target.tb->id) + " to complete step " +
                               std::to_string(st.deps) + " (hasdep)";
            if (target.finished) text += ", which has finished without signalling it";
            return text;
        }
        case Wait::message: {
            const Connection& c = connections_[t.recv_conn];
            std::string text =
                "waits for a message from rank " + std::to_string(c.from) + " on channel " + std::to_string(c.chan);
            if (senders_finished(t.recv_conn)) text += ", which never comes (no sender left on that connection)";
            return text;
        }
        case Wait::space: {
            const Connection& c = connections_[t.send_conn];
            return "cannot send to rank " + std::to_string(c.to) + " on channel " + std::to_string(c.chan) +
                   ": FIFO full (" + std::to_string(fifo_slots_) + " messages in flight)";
        }
        case Wait::none: break;
    }
    return t.running ? "is running" : "is ready to run";
}

// True when no unfinished threadblock sends on connection `conn` (so a receiver waits for nothing).
bool Engine::senders_finished(int32_t conn) const {
    for (const TbState& t : tbs_) {
        if (t.send_conn == conn && !t.finished) return false;
    }
    return true;
}

std::string Engine::describe_unfinished() const {
    ThreadblockList list;
    for (const TbState& t : tbs_)
        if (!t.finished) list.add([&] { return where(t) + " " + waiting_for(t); });
    return list.text();
}

}  // namespace

RunResult run_program(const Program& program, const RunRequest& request, Workspace& workspace) {
    try {
        Engine engine(program, request, workspace);
        return engine.run();
    } catch (const std::bad_alloc&) {
        RunResult result;
        result.status = MLOPT_ERR_NO_MEMORY;
        result.message = "out of memory while setting up the run";
        return result;
    } catch (...) {
        RunResult result;
        result.status = MLOPT_ERR_INTERNAL;
        result.message = "unexpected error while setting up the run";
        return result;
    }
}

}  // namespace mlopt

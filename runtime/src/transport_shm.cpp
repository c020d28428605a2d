// The shared-memory transport (transport_shm.hpp has the design).
#include "transport_shm.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "socket_util.hpp"  // net::errno_text
#include "transport_common.hpp"

namespace mlopt {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory FIFOs need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words need lock-free 32-bit atomics");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is a plain 32-bit integer");

constexpr uint64_t kMagic = 0x314d5354504f4c4dull;  // "MLOPTSM1" read as little-endian bytes
constexpr uint32_t kVersion = 1;
constexpr size_t kReasonBytes = 1024;  // the reason of an abort, cut to one line
constexpr uint64_t kPage = 4096;
constexpr uint32_t kMinSlots = 16;
constexpr uint32_t kMaxSlots = 4096;
constexpr uint64_t kMaxRingBytes = 4ull << 30;  // the rings of one segment: its virtual size stays a few GiB
constexpr auto kSlice = std::chrono::milliseconds(25);  // longest futex sleep between checks of the peer

// Page 0 of a segment. Written once by the creator before the name is published, except the three words.
struct SegmentHeader {
    uint64_t magic;
    uint32_t version;
    uint32_t slots;
    uint64_t fifo_bytes;
    uint64_t total_bytes;
    int64_t owner_pid;
    uint64_t owner_start;  // the owner's start time (/proc/<pid>/stat field 22): a reused pid is not the owner
    int32_t owner_rank;
    int32_t nranks;
    std::atomic<uint32_t> aborted;  // 1: reason is set, the owner failed
    std::atomic<uint32_t> closed;   // 1: the owner freed its communicator
    char reason[kReasonBytes];
};
static_assert(sizeof(SegmentHeader) <= kPage, "the header fits its page");

// One stream's control block: each side's words on their own cache-line pair (no false sharing, even with the
// adjacent-line prefetcher).
struct SlotControl {
    // Written by the sender.
    alignas(128) std::atomic<uint64_t> tail;
    std::atomic<uint32_t> data_seq;         // futex word the receiver sleeps on; bumped after a publish
    std::atomic<uint32_t> writer_sleeping;  // the sender may sleep on space_seq
    // Written by the receiver.
    alignas(128) std::atomic<uint64_t> head;
    std::atomic<uint32_t> space_seq;        // futex word the sender sleeps on; bumped after a consume
    std::atomic<uint32_t> reader_sleeping;  // the receiver may sleep on data_seq
    // Written once by the side that claimed the slot.
    alignas(128) std::atomic<uint32_t> state;  // kPreparing, kReady or kFailed
    int32_t error;                             // kFailed: the errno of fallocate
};

constexpr uint32_t kPreparing = 0;
constexpr uint32_t kReady = 1;
constexpr uint32_t kFailed = 2;

struct Layout {
    uint64_t keys_offset = 0;
    uint64_t controls_offset = 0;
    uint64_t data_offset = 0;
    uint64_t total = 0;
};

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

Layout layout_for(uint32_t slots, uint64_t fifo_bytes) {
    Layout l;
    l.keys_offset = kPage;
    l.controls_offset = l.keys_offset + round_up(uint64_t(slots) * sizeof(uint64_t), kPage);
    l.data_offset = l.controls_offset + round_up(uint64_t(slots) * sizeof(SlotControl), kPage);
    l.total = l.data_offset + uint64_t(slots) * fifo_bytes;
    return l;
}

bool power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Enough slots for every stream a rank may receive in practice, while the rings stay within kMaxRingBytes.
uint32_t slots_for(int32_t nranks, uint64_t fifo_bytes) {
    uint64_t want = 256;
    while (want < uint64_t(nranks) * 16 && want < kMaxSlots) want *= 2;
    while (want > kMinSlots && want * fifo_bytes > kMaxRingBytes) want /= 2;
    return static_cast<uint32_t>(want);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

// FUTEX_WAIT / FUTEX_WAKE without _PRIVATE: the word is in memory shared with other processes.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& word, int count) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

// Bumps a futex word and wakes every sleeper: they re-check their condition (used by abort and close).
void kick(std::atomic<uint32_t>& word) {
    word.fetch_add(1, std::memory_order_release);
    futex_wake(word, INT_MAX);
}

// What /proc says about a process: its state letter and start time; false when it does not exist.
bool read_proc_stat(int64_t pid, char& state, uint64_t& start, int& error) {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error = errno;
        return false;
    }
    char text[1024];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) {
        error = n == 0 ? ESRCH : errno;
        return false;
    }
    text[n] = '\0';
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so fields count from the last ')'.
    const char* p = std::strrchr(text, ')');
    if (p == nullptr || p[1] != ' ') {
        error = EINVAL;
        return false;
    }
    p += 2;
    state = *p;
    start = 0;
    for (int field = 3; field < 22 && p != nullptr; ++field) {
        p = std::strchr(p, ' ');
        if (p != nullptr) ++p;
    }
    if (p != nullptr) start = std::strtoull(p, nullptr, 10);
    return true;
}

uint64_t own_start_time() {
    char state = 0;
    uint64_t start = 0;
    int error = 0;
    return read_proc_stat(::getpid(), state, start, error) ? start : 0;
}

// False only when the process is certainly gone: no such pid, a zombie, or another process under its pid.
bool process_alive(int64_t pid, uint64_t expected_start) {
    char state = 0;
    uint64_t start = 0;
    int error = 0;
    if (read_proc_stat(pid, state, start, error)) {
        if (state == 'Z' || state == 'X') return false;
        return expected_start == 0 || start == 0 || start == expected_start;
    }
    if (error == ENOENT || error == ESRCH) return false;
    // /proc is not readable here (hidepid, no /proc): the signal probe still tells a missing pid apart.
    return !(::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH);
}

std::string pid_namespace() {
    struct stat st {};
    if (::stat("/proc/self/ns/pid", &st) != 0) return "0";
    return std::to_string(static_cast<unsigned long long>(st.st_ino));
}

std::string random_hex() {
    std::random_device device;
    const uint64_t v = (uint64_t(device()) << 32) ^ device() ^ uint64_t(TransportClock::now().time_since_epoch().count());
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
    return text;
}

// A mapped segment (this rank's or a peer's).
struct Segment {
    int32_t owner = -1;
    std::byte* base = nullptr;
    uint64_t size = 0;
    int fd = -1;  // kept open: the side that claims a slot fallocate()s its ring through it
    SegmentHeader* header = nullptr;
    std::atomic<uint64_t>* keys = nullptr;
    SlotControl* controls = nullptr;
    std::byte* data = nullptr;
    uint32_t slots = 0;
    uint64_t fifo_bytes = 0;
    int64_t pid = 0;
    uint64_t start = 0;

    Segment() = default;
    Segment(const Segment&) = delete;
    Segment& operator=(const Segment&) = delete;
    ~Segment() {
        if (base != nullptr) ::munmap(base, size);
        if (fd >= 0) ::close(fd);
    }

    void bind(const Layout& l) {
        header = reinterpret_cast<SegmentHeader*>(base);
        keys = reinterpret_cast<std::atomic<uint64_t>*>(base + l.keys_offset);
        controls = reinterpret_cast<SlotControl*>(base + l.controls_offset);
        data = base + l.data_offset;
    }
    std::byte* ring(uint32_t slot) const { return data + uint64_t(slot) * fifo_bytes; }
};

uint64_t stream_key(int32_t sender, int32_t tag) { return uint64_t(sender) * uint64_t(kMaxTags) + uint64_t(tag) + 1; }

std::string stream_name(int32_t sender, int32_t receiver, int32_t tag) {
    return "the stream from rank " + std::to_string(sender) + " to rank " + std::to_string(receiver) + " tag " +
           std::to_string(tag);
}

}  // namespace

// ------------------------------------------------------------------------------------------ Impl

class ShmSendStream;
class ShmRecvStream;

struct ShmTransport::Impl : TransportState {
    ShmConfig config;
    std::string name;                               // this rank's shm name while it is linked
    std::vector<std::unique_ptr<Segment>> segments;  // by rank; [rank] is this rank's own
    std::map<uint64_t, std::unique_ptr<ShmSendStream>> sends;  // by stream_key(peer, tag); guarded by mutex
    std::map<uint64_t, std::unique_ptr<ShmRecvStream>> recvs;

    Segment& own() { return *segments[static_cast<size_t>(rank)]; }

    // ok while `peer` is healthy; else failed with why = what happened to it. `probe_process`: also ask the
    // kernel whether its process lives (a /proc read: only once a sleep found no progress, not on every wait).
    TransportWait check_peer(int32_t peer, std::string& why, bool probe_process = true) const;

    // Waits until ready() (spin, then futex sleeps on `seq` with `sleeping` raised), the deadline, this rank's
    // abort or the peer's failure. Data the peer published before it failed still counts as ready.
    template <typename Ready>
    TransportWait wait(Ready&& ready, std::atomic<uint32_t>& seq, std::atomic<uint32_t>& sleeping, int32_t peer,
                       TransportClock::time_point deadline, std::string& why);

    // The slot of stream (sender, tag) in the receiver's segment, claimed and prepared by whichever side comes
    // first.
    TransportWait slot_of(Segment& segment, int32_t sender, int32_t tag, int32_t peer,
                          TransportClock::time_point deadline, uint32_t& slot, std::string& why);
    void prepare_slot(Segment& segment, uint32_t slot);

    // send_stream and recv_stream, once (peer, tag) is checked: the stream of `streams` (this rank's ends to or
    // from `peer`), made on first use over the slot of stream (sender, tag) in the receiver's segment.
    template <typename Stream, typename End>
    TransportWait open_stream(std::map<uint64_t, std::unique_ptr<Stream>>& streams, Segment& receiver,
                              int32_t sender, int32_t peer, int32_t tag, End** out,
                              TransportClock::time_point deadline, std::string& why);

    void wake_everything();
    bool create_segment(bool named, std::string& why);
};

TransportWait ShmTransport::Impl::check_peer(int32_t peer, std::string& why, bool probe_process) const {
    if (peer == rank) return TransportWait::ok;
    const Segment& s = *segments[static_cast<size_t>(peer)];
    if (s.header->aborted.load(std::memory_order_acquire) != 0) {
        const size_t length = strnlen(s.header->reason, kReasonBytes);
        why = "rank " + std::to_string(peer) + " failed: " + std::string(s.header->reason, length);
        return TransportWait::failed;
    }
    if (s.header->closed.load(std::memory_order_acquire) != 0) {
        why = "rank " + std::to_string(peer) + " (pid " + std::to_string(s.pid) + ") closed its communicator";
        return TransportWait::failed;
    }
    if (probe_process && !process_alive(s.pid, s.start)) {
        why = "rank " + std::to_string(peer) + " (pid " + std::to_string(s.pid) + ") exited";
        return TransportWait::failed;
    }
    return TransportWait::ok;
}

template <typename Ready>
TransportWait ShmTransport::Impl::wait(Ready&& ready, std::atomic<uint32_t>& seq, std::atomic<uint32_t>& sleeping,
                                       int32_t peer, TransportClock::time_point deadline, std::string& why) {
    if (is_aborted.load(std::memory_order_relaxed)) return own_failure(why);
    if (ready()) return TransportWait::ok;
    // Spinning first: a busy peer usually answers within microseconds, far below a futex round trip.
    if (config.spin_us > 0) {
        const auto spin_end = std::min(deadline, TransportClock::now() + std::chrono::microseconds(config.spin_us));
        for (unsigned i = 1;; ++i) {
            cpu_relax();
            if (ready()) return TransportWait::ok;
            if (i % 64 == 0 && TransportClock::now() >= spin_end) break;
        }
    }
    for (bool slept = false;; slept = true) {
        if (is_aborted.load(std::memory_order_relaxed)) return own_failure(why);
        if (ready()) return TransportWait::ok;
        const TransportWait health = check_peer(peer, why, slept);
        if (health != TransportWait::ok) return ready() ? TransportWait::ok : health;
        const auto now = TransportClock::now();
        if (now >= deadline) return TransportWait::timeout;
        // The other side bumps `seq` only when `sleeping` is set: raise it, then re-check (the fences pair with
        // the other side's publish-then-check, so one of the two sees the other).
        sleeping.store(1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        const uint32_t seen = seq.load(std::memory_order_acquire);
        if (ready()) {
            sleeping.store(0, std::memory_order_relaxed);
            return TransportWait::ok;
        }
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
        futex_wait(seq, seen, std::min<std::chrono::nanoseconds>(left, kSlice));
        sleeping.store(0, std::memory_order_relaxed);
    }
}

void ShmTransport::Impl::prepare_slot(Segment& segment, uint32_t slot) {
    SlotControl& c = segment.controls[slot];
    int error = 0;
    if (segment.fd >= 0) {
        // Reserve the ring's pages now: a full /dev/shm is an error here rather than a SIGBUS on first touch.
        const auto offset = static_cast<off_t>(segment.ring(slot) - segment.base);
        if (::fallocate(segment.fd, 0, offset, static_cast<off_t>(segment.fifo_bytes)) != 0 &&
            errno != EOPNOTSUPP && errno != ENOSYS) {
            error = errno;
        }
    }
    c.error = error;
    c.state.store(error == 0 ? kReady : kFailed, std::memory_order_release);
    futex_wake(c.state, INT_MAX);
}

TransportWait ShmTransport::Impl::slot_of(Segment& segment, int32_t sender, int32_t tag, int32_t peer,
                                          TransportClock::time_point deadline, uint32_t& slot, std::string& why) {
    const uint64_t key = stream_key(sender, tag);
    const uint32_t mask = segment.slots - 1;
    uint32_t index = static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    bool found = false;
    for (uint32_t probe = 0; probe < segment.slots && !found; ++probe, index = (index + 1) & mask) {
        uint64_t seen = segment.keys[index].load(std::memory_order_acquire);
        if (seen == 0 && segment.keys[index].compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
            prepare_slot(segment, index);
            found = true;
        } else if (seen == key) {
            found = true;
        }
        if (found) slot = index;
    }
    if (!found) {
        why = "rank " + std::to_string(segment.owner) + "'s shared memory segment has no free slot for " +
              stream_name(sender, segment.owner, tag) + " (all " + std::to_string(segment.slots) +
              " slots are in use; a smaller shm_fifo_bytes gives more)";
        return TransportWait::failed;
    }
    SlotControl& c = segment.controls[slot];
    std::atomic<uint32_t> unused{0};  // the claimer always wakes the state word
    const TransportWait w = wait([&] { return c.state.load(std::memory_order_acquire) != kPreparing; }, c.state,
                                 unused, peer, deadline, why);
    if (w != TransportWait::ok) return w;
    if (c.state.load(std::memory_order_acquire) == kFailed) {
        why = "rank " + std::to_string(segment.owner) + "'s shared memory segment: cannot allocate the " +
              std::to_string(segment.fifo_bytes) + "-byte FIFO of " + stream_name(sender, segment.owner, tag) +
              " in /dev/shm: " + net::errno_text(c.error) + " (enlarge /dev/shm or lower shm_fifo_bytes)";
        return TransportWait::failed;
    }
    return TransportWait::ok;
}

// ------------------------------------------------------------------------------------------ streams

class ShmSendStream final : public SendStream {
public:
    ShmSendStream(ShmTransport::Impl& t, Segment& receiver, uint32_t slot, int32_t peer)
        : t_(t), c_(receiver.controls[slot]), ring_(receiver.ring(slot)), cap_(receiver.fifo_bytes), peer_(peer) {
        tail_ = c_.tail.load(std::memory_order_relaxed);
        head_ = c_.head.load(std::memory_order_acquire);
    }

    TransportWait reserve(size_t want, std::byte** data, size_t* size, TransportClock::time_point deadline,
                          std::string& why) override {
        if (t_.is_aborted.load(std::memory_order_relaxed)) return t_.own_failure(why);
        if (tail_ - head_ >= cap_) {
            auto has_space = [&] {
                head_ = c_.head.load(std::memory_order_acquire);
                return tail_ - head_ < cap_;
            };
            const TransportWait w = t_.wait(has_space, c_.space_seq, c_.writer_sleeping, peer_, deadline, why);
            if (w != TransportWait::ok) return w;
        }
        const uint64_t offset = tail_ & (cap_ - 1);
        const uint64_t span = std::min(cap_ - (tail_ - head_), cap_ - offset);
        reserved_ = static_cast<size_t>(std::min<uint64_t>(span, want));
        *data = ring_ + offset;
        *size = reserved_;
        return TransportWait::ok;
    }

    TransportWait commit(size_t n, std::string& why) override {
        if (t_.is_aborted.load(std::memory_order_relaxed)) return t_.own_failure(why);
        n = std::min(n, reserved_);
        reserved_ = 0;
        if (n == 0) return TransportWait::ok;
        tail_ += n;
        c_.tail.store(tail_, std::memory_order_release);
        std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the reader's raise-then-check
        if (c_.reader_sleeping.load(std::memory_order_relaxed) != 0) {
            c_.data_seq.fetch_add(1, std::memory_order_release);
            futex_wake(c_.data_seq, 1);
        }
        return TransportWait::ok;
    }

    SlotControl& control() { return c_; }

private:
    ShmTransport::Impl& t_;
    SlotControl& c_;
    std::byte* ring_;
    uint64_t cap_;
    int32_t peer_;
    uint64_t tail_ = 0;
    uint64_t head_ = 0;  // the reader's counter as last seen
    size_t reserved_ = 0;
};

class ShmRecvStream final : public RecvStream {
public:
    ShmRecvStream(ShmTransport::Impl& t, Segment& receiver, uint32_t slot, int32_t peer)
        : t_(t), c_(receiver.controls[slot]), ring_(receiver.ring(slot)), cap_(receiver.fifo_bytes), peer_(peer) {
        head_ = c_.head.load(std::memory_order_relaxed);
        tail_ = c_.tail.load(std::memory_order_acquire);
    }

    TransportWait peek(size_t want, const std::byte** data, size_t* size, TransportClock::time_point deadline,
                       std::string& why) override {
        if (t_.is_aborted.load(std::memory_order_relaxed)) return t_.own_failure(why);
        if (tail_ == head_) {
            auto has_data = [&] {
                tail_ = c_.tail.load(std::memory_order_acquire);
                return tail_ != head_;
            };
            const TransportWait w = t_.wait(has_data, c_.data_seq, c_.reader_sleeping, peer_, deadline, why);
            if (w != TransportWait::ok) return w;
        }
        const uint64_t offset = head_ & (cap_ - 1);
        const uint64_t span = std::min(tail_ - head_, cap_ - offset);
        peeked_ = static_cast<size_t>(std::min<uint64_t>(span, want));
        *data = ring_ + offset;
        *size = peeked_;
        return TransportWait::ok;
    }

    void consume(size_t n) override {
        n = std::min(n, peeked_);
        peeked_ = 0;
        if (n == 0) return;
        head_ += n;
        c_.head.store(head_, std::memory_order_release);
        std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with the writer's raise-then-check
        if (c_.writer_sleeping.load(std::memory_order_relaxed) != 0) {
            c_.space_seq.fetch_add(1, std::memory_order_release);
            futex_wake(c_.space_seq, 1);
        }
    }

private:
    ShmTransport::Impl& t_;
    SlotControl& c_;
    const std::byte* ring_;
    uint64_t cap_;
    int32_t peer_;
    uint64_t head_ = 0;
    uint64_t tail_ = 0;  // the writer's counter as last seen
    size_t peeked_ = 0;
};

void ShmTransport::Impl::wake_everything() {
    // Every sleeper on a stream of this rank: the receivers and senders of the own segment's slots, and the
    // peers' slots this rank sends on. Woken, they see the abort or close and return.
    Segment& s = own();
    for (uint32_t i = 0; i < s.slots; ++i) {
        if (s.keys[i].load(std::memory_order_acquire) == 0) continue;
        kick(s.controls[i].data_seq);
        kick(s.controls[i].space_seq);
        futex_wake(s.controls[i].state, INT_MAX);  // never bumped: it is the slot's state
    }
    for (auto& entry : sends) {
        kick(entry.second->control().data_seq);
        kick(entry.second->control().space_seq);
    }
}

// ------------------------------------------------------------------------------------------ segments

bool ShmTransport::Impl::create_segment(bool named, std::string& why) {
    auto segment = std::make_unique<Segment>();
    Segment& s = *segment;
    s.owner = rank;
    s.slots = slots_for(nranks, config.fifo_bytes);
    s.fifo_bytes = config.fifo_bytes;
    const Layout l = layout_for(s.slots, s.fifo_bytes);
    s.size = l.total;
    const std::string who = "rank " + std::to_string(rank);
    if (named) {
        const std::string prefix = "/" + shm_name_prefix(::getpid()) + pid_namespace() + "-";
        for (int attempt = 0; attempt < 8 && s.fd < 0; ++attempt) {
            name = prefix + random_hex();
            s.fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
            if (s.fd < 0 && errno != EEXIST) break;
        }
        if (s.fd < 0) {
            why = who + " cannot create the shared memory segment " + name + ": " + net::errno_text(errno);
            name.clear();
            return false;
        }
        if (::ftruncate(s.fd, static_cast<off_t>(l.total)) != 0 ||
            (::fallocate(s.fd, 0, 0, static_cast<off_t>(l.data_offset)) != 0 && errno != EOPNOTSUPP &&
             errno != ENOSYS)) {
            why = who + " cannot size the shared memory segment " + name + " (" + std::to_string(l.total) +
                  " bytes, sparse): " + net::errno_text(errno);
            return false;  // the caller's cleanup unlinks the name
        }
    }
    const int flags = MAP_SHARED | MAP_NORESERVE | (named ? 0 : MAP_ANONYMOUS);
    void* base = ::mmap(nullptr, l.total, PROT_READ | PROT_WRITE, flags, named ? s.fd : -1, 0);
    if (base == MAP_FAILED) {
        why = who + " cannot map its shared memory segment (" + std::to_string(l.total) + " bytes): " +
              net::errno_text(errno);
        return false;
    }
    s.base = static_cast<std::byte*>(base);
    s.bind(l);
    // The memory is zero-filled: every counter, key and state starts at 0; the header's fields are set here.
    auto* h = new (s.base) SegmentHeader{};
    h->version = kVersion;
    h->slots = s.slots;
    h->fifo_bytes = s.fifo_bytes;
    h->total_bytes = l.total;
    h->owner_pid = ::getpid();
    h->owner_start = own_start_time();
    h->owner_rank = rank;
    h->nranks = nranks;
    for (uint32_t i = 0; i < s.slots; ++i) new (&s.keys[i]) std::atomic<uint64_t>(0);
    for (uint32_t i = 0; i < s.slots; ++i) new (&s.controls[i]) SlotControl{};
    s.pid = h->owner_pid;
    s.start = h->owner_start;
    h->magic = kMagic;
    segments[static_cast<size_t>(rank)] = std::move(segment);
    return true;
}

// ------------------------------------------------------------------------------------------ ShmTransport

ShmTransport::ShmTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<ShmTransport> ShmTransport::create(int32_t rank, int32_t nranks, const ShmConfig& config, bool named,
                                                   std::string& why) {
    if (!power_of_two(config.fifo_bytes) || config.fifo_bytes < kShmMinFifo || config.fifo_bytes > kShmMaxFifo) {
        why = "shm_fifo_bytes=" + std::to_string(config.fifo_bytes) + " is not a power of two in [" +
              std::to_string(kShmMinFifo) + ", " + std::to_string(kShmMaxFifo) + "]";
        return nullptr;
    }
    if (named) remove_stale_shm_segments();
    auto impl = std::make_unique<Impl>();
    impl->rank = rank;
    impl->nranks = nranks;
    impl->config = config;
    impl->segments.resize(static_cast<size_t>(nranks));
    std::unique_ptr<ShmTransport> t(new ShmTransport(std::move(impl)));
    if (!t->impl_->create_segment(named, why)) return nullptr;  // ~ShmTransport unlinks a created name
    return t;
}

ShmTransport::~ShmTransport() {
    if (!impl_) return;
    Impl& t = *impl_;
    if (t.segments[static_cast<size_t>(t.rank)] != nullptr) {
        // Peers waiting on this rank learn that it is gone now, not at their deadline.
        t.own().header->closed.store(1, std::memory_order_release);
        t.wake_everything();
    }
    t.sends.clear();
    t.recvs.clear();
    unlink();
    t.segments.clear();
}

const std::string& ShmTransport::name() const { return impl_->name; }

void ShmTransport::unlink() {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->name.empty()) return;
    ::shm_unlink(impl_->name.c_str());
    impl_->name.clear();
}

bool ShmTransport::reaches(int32_t peer) const {
    return peer >= 0 && peer < impl_->nranks && impl_->segments[static_cast<size_t>(peer)] != nullptr;
}

bool ShmTransport::attach(int32_t peer, const std::string& name, int64_t pid, std::string& why) {
    Impl& t = *impl_;
    const std::string who = "rank " + std::to_string(t.rank) + " cannot map rank " + std::to_string(peer) +
                            "'s shared memory segment " + name;
    auto segment = std::make_unique<Segment>();
    Segment& s = *segment;
    s.owner = peer;
    s.fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (s.fd < 0) {
        why = who + ": " + net::errno_text(errno) + (errno == ENOENT ? " (did it fail, or is /dev/shm not shared?)" : "");
        return false;
    }
    struct stat st {};
    if (::fstat(s.fd, &st) != 0 || st.st_size < static_cast<off_t>(kPage)) {
        why = who + ": it is not a mlopt segment (size " + std::to_string(st.st_size) + ")";
        return false;
    }
    s.size = static_cast<uint64_t>(st.st_size);
    void* base = ::mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, s.fd, 0);
    if (base == MAP_FAILED) {
        why = who + ": " + net::errno_text(errno);
        return false;
    }
    s.base = static_cast<std::byte*>(base);
    const auto* h = reinterpret_cast<const SegmentHeader*>(s.base);
    const bool geometry = h->slots >= 1 && power_of_two(h->slots) && h->slots <= kMaxSlots &&
                          power_of_two(h->fifo_bytes) && h->fifo_bytes >= kShmMinFifo &&
                          h->fifo_bytes <= kShmMaxFifo && layout_for(h->slots, h->fifo_bytes).total == s.size;
    if (h->magic != kMagic || h->version != kVersion || !geometry) {
        why = who + ": not a mlopt segment of version " + std::to_string(kVersion);
        return false;
    }
    if (h->owner_pid != pid || h->owner_rank != peer || h->nranks != t.nranks) {
        why = who + ": it belongs to rank " + std::to_string(h->owner_rank) + " of " + std::to_string(h->nranks) +
              " (pid " + std::to_string(h->owner_pid) + "), expected pid " + std::to_string(pid);
        return false;
    }
    s.slots = h->slots;
    s.fifo_bytes = h->fifo_bytes;
    s.pid = h->owner_pid;
    s.start = h->owner_start;
    s.bind(layout_for(s.slots, s.fifo_bytes));
    std::lock_guard<std::mutex> lock(t.mutex);
    t.segments[static_cast<size_t>(peer)] = std::move(segment);
    return true;
}

int32_t ShmTransport::rank() const { return impl_->rank; }
int32_t ShmTransport::nranks() const { return impl_->nranks; }

const char* ShmTransport::peer_kind(int32_t peer) const {
    if (peer == impl_->rank) return "self";
    return reaches(peer) ? "shm" : nullptr;
}

template <typename Stream, typename End>
TransportWait ShmTransport::Impl::open_stream(std::map<uint64_t, std::unique_ptr<Stream>>& streams,
                                              Segment& receiver, int32_t sender, int32_t peer, int32_t tag,
                                              End** out, TransportClock::time_point deadline, std::string& why) {
    const uint64_t key = stream_key(peer, tag);
    {
        std::lock_guard<std::mutex> lock(mutex);
        const auto it = streams.find(key);
        if (it != streams.end()) {
            *out = it->second.get();
            return TransportWait::ok;
        }
    }
    uint32_t slot = 0;
    const TransportWait w = slot_of(receiver, sender, tag, peer, deadline, slot, why);
    if (w != TransportWait::ok) return w;
    std::lock_guard<std::mutex> lock(mutex);
    auto& stream = streams[key];
    if (!stream) stream = std::make_unique<Stream>(*this, receiver, slot, peer);
    *out = stream.get();
    return TransportWait::ok;
}

TransportWait ShmTransport::send_stream(int32_t peer, int32_t tag, SendStream** out,
                                        TransportClock::time_point deadline, std::string& why) {
    Impl& t = *impl_;
    if (t.is_aborted.load(std::memory_order_relaxed)) return t.own_failure(why);
    why = t.check_stream(peer, tag, reaches(peer), "through shared memory");
    if (!why.empty()) return TransportWait::failed;
    // This rank's stream to `peer` is in the peer's segment.
    return t.open_stream(t.sends, *t.segments[static_cast<size_t>(peer)], t.rank, peer, tag, out, deadline, why);
}

TransportWait ShmTransport::recv_stream(int32_t peer, int32_t tag, RecvStream** out,
                                        TransportClock::time_point deadline, std::string& why) {
    Impl& t = *impl_;
    if (t.is_aborted.load(std::memory_order_relaxed)) return t.own_failure(why);
    why = t.check_stream(peer, tag, reaches(peer), "through shared memory");
    if (!why.empty()) return TransportWait::failed;
    return t.open_stream(t.recvs, t.own(), peer, peer, tag, out, deadline, why);
}

void ShmTransport::abort(const std::string& reason) {
    Impl& t = *impl_;
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.is_aborted.load(std::memory_order_relaxed)) return;
    t.abort_reason = reason.empty() ? std::string("aborted") : reason;
    t.is_aborted.store(true, std::memory_order_release);
    SegmentHeader& h = *t.own().header;
    // One line for the peers' messages: the reason is cut at its first newline and at the buffer's size.
    const std::string line = t.abort_reason.substr(0, std::min(t.abort_reason.find('\n'), kReasonBytes - 1));
    std::memcpy(h.reason, line.data(), line.size());
    h.reason[line.size()] = '\0';
    h.aborted.store(1, std::memory_order_release);
    t.wake_everything();
}

std::string ShmTransport::aborted() const {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->is_aborted.load(std::memory_order_relaxed) ? impl_->abort_reason : std::string();
}

// ------------------------------------------------------------------------------------------ names

std::string shm_name_prefix(int64_t pid) {
    return "mlopt-" + std::to_string(static_cast<unsigned long>(::getuid())) + "-" + std::to_string(pid) + "-";
}

int remove_stale_shm_segments() {
    DIR* dir = ::opendir("/dev/shm");
    if (dir == nullptr) return 0;
    const std::string mine = "mlopt-" + std::to_string(static_cast<unsigned long>(::getuid())) + "-";
    const std::string ns = "-" + pid_namespace() + "-";
    int removed = 0;
    while (const dirent* entry = ::readdir(dir)) {
        const std::string file = entry->d_name;
        if (file.compare(0, mine.size(), mine) != 0) continue;
        // mlopt-<uid>-<pid>-<ns>-<random>: only names of this pid namespace say whether their process lives.
        char* end = nullptr;
        const long long pid = std::strtoll(file.c_str() + mine.size(), &end, 10);
        if (pid <= 0 || end == nullptr || std::string(end).compare(0, ns.size(), ns) != 0) continue;
        if (pid == ::getpid() || process_alive(pid, 0)) continue;
        if (::shm_unlink(("/" + file).c_str()) == 0) ++removed;
    }
    ::closedir(dir);
    return removed;
}

}  // namespace mlopt

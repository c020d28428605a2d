// The in-memory loopback transport (transport.hpp, MemoryTransportGroup): every rank of the group lives in this
// process, each (sender, receiver, tag) stream is a byte ring of fifo_bytes guarded by a mutex and a condition
// variable. Tests run one rank engine per thread over it; it has the real transports' semantics (bounded
// FIFOs, deadlines, abort) without processes.
//
// A ring keeps two counters, bytes written (`tail`) and bytes read (`head`); the writer owns [tail, head + size)
// and the reader [head, tail), so the data is copied outside the lock and the mutex only orders the counters.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "transport.hpp"

namespace mlopt {
namespace {

constexpr std::align_val_t kRingAlignment{64};

// One rank's health: set once by abort, read by every wait on a stream that rank is an end of.
struct RankHealth {
    std::atomic<bool> aborted{false};
    std::string reason;  // written once before `aborted` is set, read only after seeing it set
};

class Ring : public SendStream, public RecvStream {
public:
    Ring(int32_t from, int32_t to, int32_t tag, size_t bytes, RankHealth& from_health, RankHealth& to_health)
        : from_(from), to_(to), tag_(tag), size_(bytes), from_health_(from_health), to_health_(to_health),
          data_(static_cast<std::byte*>(::operator new(bytes, kRingAlignment))) {}
    ~Ring() override { ::operator delete(data_, kRingAlignment); }
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;

    TransportWait reserve(size_t want, std::byte** data, size_t* size, TransportClock::time_point deadline,
                          std::string& why) override {
        std::unique_lock<std::mutex> lock(mutex_);
        const TransportWait w = wait(lock, writer_waits_, deadline, why, to_, [&] { return tail_ - head_ < size_; });
        if (w != TransportWait::ok) return w;
        const size_t at = static_cast<size_t>(tail_ % size_);
        const size_t free = size_ - static_cast<size_t>(tail_ - head_);
        *data = data_ + at;
        *size = std::min({want, free, size_ - at});  // contiguous up to the end of the ring
        return TransportWait::ok;
    }

    TransportWait commit(size_t n, std::string& why) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (failed(why, to_)) return TransportWait::failed;
        tail_ += n;
        if (reader_waits_) changed_.notify_all();
        return TransportWait::ok;
    }

    TransportWait peek(size_t want, const std::byte** data, size_t* size, TransportClock::time_point deadline,
                       std::string& why) override {
        std::unique_lock<std::mutex> lock(mutex_);
        const TransportWait w = wait(lock, reader_waits_, deadline, why, from_, [&] { return tail_ > head_; });
        if (w != TransportWait::ok) return w;
        const size_t at = static_cast<size_t>(head_ % size_);
        *data = data_ + at;
        *size = std::min({want, static_cast<size_t>(tail_ - head_), size_ - at});
        return TransportWait::ok;
    }

    void consume(size_t n) override {
        std::lock_guard<std::mutex> lock(mutex_);
        head_ += n;
        if (writer_waits_) changed_.notify_all();
    }

    // Wakes both ends so that they see an abort.
    void wake() {
        std::lock_guard<std::mutex> lock(mutex_);
        changed_.notify_all();
    }

    bool touches(int32_t rank) const { return from_ == rank || to_ == rank; }

private:
    // Fails when either end aborted, naming the peer (the other end of this caller's side) or this rank.
    bool failed(std::string& why, int32_t peer) const {
        const int32_t self = peer == to_ ? from_ : to_;
        const RankHealth& peer_health = peer == to_ ? to_health_ : from_health_;
        const RankHealth& own_health = peer == to_ ? from_health_ : to_health_;
        if (peer_health.aborted.load(std::memory_order_acquire)) {
            why = "rank " + std::to_string(peer) + " aborted: " + peer_health.reason;
        } else if (own_health.aborted.load(std::memory_order_acquire)) {
            why = "this rank (" + std::to_string(self) + ") aborted: " + own_health.reason;
        } else {
            return false;
        }
        return true;
    }

    template <typename Ready>
    TransportWait wait(std::unique_lock<std::mutex>& lock, bool& waiting, TransportClock::time_point deadline,
                       std::string& why, int32_t peer, Ready&& ready) {
        while (true) {
            if (failed(why, peer)) return TransportWait::failed;
            if (ready()) return TransportWait::ok;
            if (TransportClock::now() >= deadline) {
                why = "timed out on the stream " + std::to_string(from_) + " -> " + std::to_string(to_) + " tag " +
                      std::to_string(tag_);
                return TransportWait::timeout;
            }
            waiting = true;
            changed_.wait_until(lock, deadline);
            waiting = false;
        }
    }

    const int32_t from_, to_, tag_;
    const size_t size_;
    const RankHealth& from_health_;
    const RankHealth& to_health_;
    std::byte* const data_;
    std::mutex mutex_;
    std::condition_variable changed_;  // data committed, space consumed, or an abort
    uint64_t head_ = 0;
    uint64_t tail_ = 0;
    bool reader_waits_ = false;
    bool writer_waits_ = false;
};

class Group;

class View : public Transport {
public:
    View(Group& group, int32_t rank) : group_(group), rank_(rank) {}
    int32_t rank() const override { return rank_; }
    int32_t nranks() const override;
    const char* peer_kind(int32_t peer) const override { return peer == rank_ ? "self" : "local"; }
    TransportWait send_stream(int32_t peer, int32_t tag, SendStream** out, TransportClock::time_point,
                              std::string& why) override;
    TransportWait recv_stream(int32_t peer, int32_t tag, RecvStream** out, TransportClock::time_point,
                              std::string& why) override;
    void abort(const std::string& reason) override;
    std::string aborted() const override;

private:
    Group& group_;
    const int32_t rank_;
};

class Group : public MemoryTransportGroup {
public:
    Group(int32_t nranks, size_t fifo_bytes) : fifo_bytes_(std::max<size_t>(fifo_bytes, 1)), health_(nranks) {
        for (int32_t r = 0; r < nranks; ++r) views_.push_back(std::make_unique<View>(*this, r));
    }
    Transport& rank_view(int32_t rank) override { return *views_.at(static_cast<size_t>(rank)); }
    int32_t nranks() const { return static_cast<int32_t>(views_.size()); }

    // The ring of (from, to, tag), made on first use by either end; NULL (and `why`) for a bad peer or tag.
    Ring* ring(int32_t from, int32_t to, int32_t tag, std::string& why) {
        if (from < 0 || from >= nranks() || to < 0 || to >= nranks()) {
            const int32_t bad = from < 0 || from >= nranks() ? from : to;
            why = "rank " + std::to_string(bad) + " is not in 0.." + std::to_string(nranks() - 1);
            return nullptr;
        }
        if (tag < 0 || tag >= kMaxTags) {
            why = "tag " + std::to_string(tag) + " is not in 0.." + std::to_string(kMaxTags - 1);
            return nullptr;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        auto& slot = rings_[{from, to, tag}];
        if (!slot) slot = std::make_unique<Ring>(from, to, tag, fifo_bytes_, health_[from], health_[to]);
        return slot.get();
    }

    void abort(int32_t rank, const std::string& reason) {
        std::vector<Ring*> touched;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            RankHealth& h = health_[rank];
            if (h.aborted.load(std::memory_order_relaxed)) return;  // idempotent: the first reason stays
            h.reason = reason;
            h.aborted.store(true, std::memory_order_release);
            for (auto& [_, ring] : rings_)
                if (ring->touches(rank)) touched.push_back(ring.get());
        }
        for (Ring* ring : touched) ring->wake();  // rings are never freed before the group
    }

    std::string aborted(int32_t rank) const {
        const RankHealth& h = health_[rank];
        return h.aborted.load(std::memory_order_acquire) ? h.reason : std::string();
    }

private:
    const size_t fifo_bytes_;
    std::vector<RankHealth> health_;
    std::vector<std::unique_ptr<View>> views_;
    std::mutex mutex_;  // guards rings_ and the abort reasons' writing
    std::map<std::tuple<int32_t, int32_t, int32_t>, std::unique_ptr<Ring>> rings_;
};

int32_t View::nranks() const { return group_.nranks(); }

TransportWait View::send_stream(int32_t peer, int32_t tag, SendStream** out, TransportClock::time_point,
                                std::string& why) {
    Ring* ring = group_.ring(rank_, peer, tag, why);
    if (ring == nullptr) return TransportWait::failed;
    *out = ring;
    return TransportWait::ok;
}

TransportWait View::recv_stream(int32_t peer, int32_t tag, RecvStream** out, TransportClock::time_point,
                                std::string& why) {
    Ring* ring = group_.ring(peer, rank_, tag, why);
    if (ring == nullptr) return TransportWait::failed;
    *out = ring;
    return TransportWait::ok;
}

void View::abort(const std::string& reason) { group_.abort(rank_, reason); }

std::string View::aborted() const { return group_.aborted(rank_); }

}  // namespace

std::unique_ptr<MemoryTransportGroup> make_memory_transport_group(int32_t nranks, size_t fifo_bytes) {
    return std::make_unique<Group>(std::max<int32_t>(nranks, 1), fifo_bytes);
}

}  // namespace mlopt

// The shared-memory transport between the processes of one host (transport.hpp; mlopt.h, "multi-process").
//
// Each rank owns ONE POSIX shm segment holding its INBOUND streams: a header (owner pid and start time, an
// `aborted` word with a reason text, a `closed` word), a key table and, per slot, a control block and a byte
// ring. A stream (sender, tag) claims a slot of the receiver's segment on first use by either side: a CAS on
// the key table (key = sender * kMaxTags + tag + 1, linear probing), so both sides find the same slot; the
// claimer fallocate()s the slot's ring (a full /dev/shm is then an error, never a SIGBUS later).
//
// Rings are single-producer single-consumer: 64-bit head/tail counters on their own cache lines, release on
// publish, acquire on observe. A waiting side spins for spin_us, then sleeps on a futex word (shared, not
// _PRIVATE: the processes share the memory) that the other side bumps only when a "sleeping" flag is set. Sleeps
// last at most 25 ms, so every wait re-checks its deadline, this rank's abort, and the peer's aborted/closed
// words and liveness (/proc/<pid>/stat: gone, zombie, or a different start time = exited).
//
// Names: "/mlopt-<uid>-<pid>-<pid namespace>-<random>". The creator unlinks its name once every peer mapped it
// (comm_mp.cpp's barrier) and on any failure; remove_stale_shm_segments() unlinks the names of dead processes
// of this user (a process killed between create and unlink).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport.hpp"

namespace mlopt {

struct ShmConfig {
    uint64_t fifo_bytes = 4u << 20;  // bytes of one stream's ring (a power of two in [kShmMinFifo, kShmMaxFifo])
    int32_t spin_us = 20;            // spinning before a futex sleep
};

constexpr uint64_t kShmMinFifo = 4096;
constexpr uint64_t kShmMaxFifo = 256ull << 20;

class ShmTransport : public Transport {
public:
    // Makes this rank's segment: named (for peers on this host) when `named`, else anonymous memory that only
    // carries the rank's streams to itself. False with a one-line `why` naming the rank.
    static std::unique_ptr<ShmTransport> create(int32_t rank, int32_t nranks, const ShmConfig& config, bool named,
                                                std::string& why);
    ~ShmTransport() override;

    // The segment's shm name ("" when anonymous or already unlinked).
    const std::string& name() const;
    // Maps `peer`'s segment, published under `name` by process `pid`; checks its header. False: `why`.
    bool attach(int32_t peer, const std::string& name, int64_t pid, std::string& why);
    // Removes this rank's segment name (mappings stay valid). Idempotent.
    void unlink();
    // Whether `peer`'s segment is mapped (always true for this rank itself).
    bool reaches(int32_t peer) const;

    int32_t rank() const override;
    int32_t nranks() const override;
    const char* peer_kind(int32_t peer) const override;
    TransportWait send_stream(int32_t peer, int32_t tag, SendStream** out, TransportClock::time_point deadline,
                              std::string& why) override;
    TransportWait recv_stream(int32_t peer, int32_t tag, RecvStream** out, TransportClock::time_point deadline,
                              std::string& why) override;
    void abort(const std::string& reason) override;
    std::string aborted() const override;

    struct Impl;

private:
    explicit ShmTransport(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Best effort: unlinks /dev/shm/mlopt-<uid>-<pid>-<ns>-* of this user whose process (in this pid namespace) is
// gone. Returns how many it removed.
int remove_stale_shm_segments();

// The shm name prefix of a process of this user, "mlopt-<uid>-<pid>-" (tests look for leftovers with it).
std::string shm_name_prefix(int64_t pid);

}  // namespace mlopt

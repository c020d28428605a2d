// What the shared-memory and TCP transports (transport_shm.*, transport_tcp.*) have in common: the state their
// Impls start from (this rank, whether and why it aborted) and the checks of a stream's peer and tag.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "transport.hpp"

namespace mlopt {

struct TransportState {
    int32_t rank = 0;
    int32_t nranks = 0;
    mutable std::mutex mutex;             // guards abort_reason, and the streams of the transport's Impl
    std::atomic<bool> is_aborted{false};  // set by abort(); this rank's waits then fail
    std::string abort_reason;             // guarded by mutex

    bool aborted_now() const { return is_aborted.load(std::memory_order_relaxed); }

    // Why this rank's own waits fail once it aborted. The caller holds `mutex`.
    std::string aborted_text() const { return "rank " + std::to_string(rank) + " aborted: " + abort_reason; }

    // failed, with `why` = aborted_text() (takes `mutex`).
    TransportWait own_failure(std::string& why) const {
        std::lock_guard<std::mutex> lock(mutex);
        why = aborted_text();
        return TransportWait::failed;
    }

    // "" when (peer, tag) names a stream of this transport, else what is wrong with it. `reachable`: whether the
    // transport reaches `peer` at all, `how` says how it would ("over TCP").
    std::string check_stream(int32_t peer, int32_t tag, bool reachable, const char* how) const {
        if (peer < 0 || peer >= nranks) {
            return "peer " + std::to_string(peer) + " is not a rank of the communicator (0.." +
                   std::to_string(nranks - 1) + ")";
        }
        if (tag < 0 || tag >= kMaxTags) {
            return "tag " + std::to_string(tag) + " is not in 0.." + std::to_string(kMaxTags - 1);
        }
        if (!reachable) return "rank " + std::to_string(peer) + " is not reachable " + how;
        return "";
    }
};

}  // namespace mlopt

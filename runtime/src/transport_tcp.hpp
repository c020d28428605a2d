// The TCP transport between ranks (transport.hpp; mlopt.h, "multi-process").
//
// Each rank listens on one socket. A stream (sender -> receiver, tag) is one TCP connection, opened by the
// sender on first use; it first writes a 32-byte hello (magic, communicator id, sender rank, tag, kind). The
// receiver's I/O thread accepts connections, reads hellos and registers streams by (sender, tag), waking
// recv_stream waiters.
//
// Sending: a per-stream ring (1 MiB). reserve() waits (with its deadline) for room in it; commit() publishes
// without blocking: it sends what the socket takes at once and leaves the rest to the I/O thread (POLLOUT), so a
// commit never stalls on a slow reader and every wait has a deadline. Receiving: peek() recv()s into a
// per-stream buffer; consume() advances in it. The destructor flushes what is still queued (while the peers keep
// reading) before it closes the sockets.
//
// Faults: EOF, ECONNRESET or EPIPE = "rank P closed its connection (it exited or failed)". abort(reason) first
// sends a "note" connection with the reason to every TCP peer (so they report "rank P failed: <reason>"), then
// shuts every socket down (peers see EOF at once) and stops the I/O thread. All waits poll in 50 ms slices that
// re-check the deadline and the abort flag; no signal is ever raised (MSG_NOSIGNAL).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport.hpp"

namespace mlopt {

class TcpTransport : public Transport {
public:
    // Listens on IPv4 address `host` (a name or dotted quad) at an ephemeral port. False: `why` names the rank.
    static std::unique_ptr<TcpTransport> listen(int32_t rank, int32_t nranks, const std::string& host,
                                                std::string& why);
    ~TcpTransport() override;

    // "a.b.c.d:port", what the peers connect to.
    std::string address() const;
    // Starts the I/O thread. peers[r]: rank r's address, "" for ranks not reached over TCP (and this rank).
    // Every rank of the communicator must pass the same comm_id (hellos with another id are refused).
    bool start(uint64_t comm_id, const std::vector<std::string>& peers, std::string& why);
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
    explicit TcpTransport(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace mlopt

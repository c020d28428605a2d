// The transports of multi-process communicators (mlopt.h, "multi-process"): reliable, ordered byte streams
// between the ranks of a communicator, one per (sender, receiver, tag). The rank engine (rank_engine.hpp) turns
// MSCCL-EF steps into writes and reads of these streams; the transports know nothing of programs.
//
// Tags: a threadblock's channel (0..kTagsPerChannelGroup-1), offset by the enforcer's channel group
// (tag = group * kTagsPerChannelGroup + chan), so that motifs running at once never share a stream.
//
// Waiting: every blocking call takes a deadline and returns TransportWait::timeout when it passes; the caller
// (the engine's watchdog) decides whether that is a deadlock. Calls also return promptly (within ~100 ms) with
// TransportWait::failed when the peer died or aborted, or this rank aborted (Transport::abort).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mlopt/mlopt.h"

namespace mlopt {

using TransportClock = std::chrono::steady_clock;

constexpr int32_t kTagsPerChannelGroup = 64;        // MSCCL-EF programs have at most 32 channels
constexpr int32_t kMaxTags = 64 * kTagsPerChannelGroup;  // 64 enforcer channels

enum class TransportWait : uint8_t {
    ok,       // done
    timeout,  // the deadline passed first: nothing was consumed or published
    failed    // the peer died, aborted or closed the stream, or this rank aborted; `why` says which (one line)
};

// The writing end of one stream. One thread at a time writes it.
class SendStream {
public:
    virtual ~SendStream() = default;
    // Waits until at least one byte can be written, then sets (*data, *size) to a writable span of at most
    // `want` (> 0) bytes. The span stays valid until commit.
    virtual TransportWait reserve(size_t want, std::byte** data, size_t* size, TransportClock::time_point deadline,
                                  std::string& why) = 0;
    // Publishes the first n (<= the reserved size) bytes of the reserved span to the reader, in order.
    virtual TransportWait commit(size_t n, std::string& why) = 0;
};

// The reading end of one stream. One thread at a time reads it.
class RecvStream {
public:
    virtual ~RecvStream() = default;
    // Waits until at least one byte is readable, then sets (*data, *size) to readable bytes (at most `want`,
    // > 0), in stream order. The span stays valid until consume.
    virtual TransportWait peek(size_t want, const std::byte** data, size_t* size,
                               TransportClock::time_point deadline, std::string& why) = 0;
    // Frees the first n (<= the peeked size) bytes of the peeked span for the writer.
    virtual void consume(size_t n) = 0;
};

// One rank's connections to the other ranks of its communicator. Streams are made on first use and owned by
// the transport (the pointers stay valid until it is destroyed); the peer's matching end may be made later.
class Transport {
public:
    virtual ~Transport() = default;
    virtual int32_t rank() const = 0;
    virtual int32_t nranks() const = 0;
    // "shm", "tcp" or "self" (peer == rank).
    virtual const char* peer_kind(int32_t peer) const = 0;
    virtual TransportWait send_stream(int32_t peer, int32_t tag, SendStream** out,
                                      TransportClock::time_point deadline, std::string& why) = 0;
    virtual TransportWait recv_stream(int32_t peer, int32_t tag, RecvStream** out,
                                      TransportClock::time_point deadline, std::string& why) = 0;
    // Marks this rank failed with a one-line reason: the peers' waits on it return failed, naming this rank
    // and the reason where the transport can carry it; this rank's own waits return failed too. Idempotent.
    virtual void abort(const std::string& reason) = 0;
    // The first abort reason, "" while healthy.
    virtual std::string aborted() const = 0;
};

// A loopback transport for tests: every rank of `nranks` is in this process, each rank gets a Transport view
// (rank_view(r)) whose streams are in-memory rings of `fifo_bytes`. Made in transport_memory.cpp.
class MemoryTransportGroup {
public:
    virtual ~MemoryTransportGroup() = default;
    virtual Transport& rank_view(int32_t rank) = 0;
};
std::unique_ptr<MemoryTransportGroup> make_memory_transport_group(int32_t nranks, size_t fifo_bytes);

}  // namespace mlopt

// The TCP transport (transport_tcp.hpp has the design).
#include "transport_tcp.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "socket_util.hpp"
#include "transport_common.hpp"

namespace mlopt {
namespace {

using net::Fd;

constexpr uint64_t kHelloMagic = 0x3143544f504c4d00ull;  // "\0MLOPTC1"
constexpr size_t kHelloBytes = 32;
constexpr uint32_t kKindStream = 1;
constexpr uint32_t kKindNote = 2;
constexpr uint32_t kMaxNoteBytes = 1024;
constexpr size_t kSendRingBytes = 1u << 20;
constexpr size_t kRecvBufferBytes = 1u << 20;
constexpr int kSliceMs = 50;
constexpr auto kHelloTimeout = std::chrono::seconds(10);       // a connection that never says hello is dropped
constexpr auto kNoteGrace = std::chrono::milliseconds(100);    // a closing peer's note may trail its EOF
constexpr auto kNoteSendTimeout = std::chrono::milliseconds(500);
constexpr auto kFlushIdleLimit = std::chrono::seconds(10);     // the destructor gives up on a peer that stopped reading

struct Hello {
    uint64_t magic = kHelloMagic;
    uint64_t comm_id = 0;
    int32_t sender = 0;
    int32_t tag = 0;
    uint32_t kind = kKindStream;
    uint32_t note_bytes = 0;  // kKindNote: the reason's length, the reason follows the hello
};

void put_le(unsigned char* p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void encode(const Hello& h, unsigned char* out) {
    put_le(out, h.magic, 8);
    put_le(out + 8, h.comm_id, 8);
    put_le(out + 16, static_cast<uint32_t>(h.sender), 4);
    put_le(out + 20, static_cast<uint32_t>(h.tag), 4);
    put_le(out + 24, h.kind, 4);
    put_le(out + 28, h.note_bytes, 4);
}

Hello decode(const unsigned char* in) {
    Hello h;
    h.magic = get_le(in, 8);
    h.comm_id = get_le(in + 8, 8);
    h.sender = static_cast<int32_t>(get_le(in + 16, 4));
    h.tag = static_cast<int32_t>(get_le(in + 20, 4));
    h.kind = static_cast<uint32_t>(get_le(in + 24, 4));
    h.note_bytes = static_cast<uint32_t>(get_le(in + 28, 4));
    return h;
}

uint64_t stream_key(int32_t peer, int32_t tag) { return uint64_t(peer) * uint64_t(kMaxTags) + uint64_t(tag); }

std::string closed_text(int32_t peer) {
    return "rank " + std::to_string(peer) + " closed its connection (it exited or failed)";
}

// A connection the I/O thread accepted and whose hello (and note) is still arriving.
struct Pending {
    Fd fd;
    unsigned char buffer[kHelloBytes + kMaxNoteBytes];
    size_t have = 0;
    size_t need = kHelloBytes;
    TransportClock::time_point deadline;
};

}  // namespace

class TcpSendStream;
class TcpRecvStream;

struct TcpTransport::Impl : TransportState {
    uint64_t comm_id = 0;
    sockaddr_in listen_address{};
    std::vector<sockaddr_in> peer_addresses;
    std::vector<bool> peer_reached;
    Fd listen_fd;
    Fd wake_fd;  // eventfd: wakes the I/O thread (new pending output, stop)
    std::thread io_thread;
    std::atomic<bool> stopping{false};
    std::vector<Pending*> pending;  // owned; the I/O thread's alone

    std::condition_variable changed;  // a stream registered, a note arrived, an abort
    std::map<uint64_t, std::unique_ptr<TcpRecvStream>> recvs;  // by stream_key(sender, tag)
    std::map<uint64_t, std::unique_ptr<TcpSendStream>> sends;  // by stream_key(receiver, tag)
    std::vector<std::string> notes;                            // by rank: the reason it aborted with
    bool abort_started = false;  // guarded by mutex: the first abort() sends the notes; is_aborted once they are out

    // "rank P failed: <its note>", or "" while no note from `peer` arrived. The caller holds `mutex`.
    std::string note_text(int32_t peer) const {
        const std::string& note = notes[static_cast<size_t>(peer)];
        return note.empty() ? std::string() : "rank " + std::to_string(peer) + " failed: " + note;
    }
    void wake_io() {
        const uint64_t one = 1;
        if (::write(wake_fd.get(), &one, sizeof one) < 0) {
            // Only EAGAIN at a counter near 2^64 is possible: the thread is being woken anyway.
        }
    }
    // Why `peer`'s stream ended: its note (waiting briefly for one), else that it closed the connection.
    TransportWait peer_closed(int32_t peer, std::string& why);

    void io_loop();
    void io_loop_safely();
    void accept_all();
    bool read_pending(Pending& p);  // false: done with it (registered or dropped)
    void register_connection(Pending& p);
    void send_notes(const std::string& reason);
    void flush_before_close();
};

// ------------------------------------------------------------------------------------------ streams

class TcpSendStream final : public SendStream {
public:
    TcpSendStream(TcpTransport::Impl& t, int32_t peer, Fd fd)
        : t_(t), peer_(peer), fd_(std::move(fd)), ring_(new std::byte[kSendRingBytes]) {}

    TransportWait reserve(size_t want, std::byte** data, size_t* size, TransportClock::time_point deadline,
                          std::string& why) override {
        for (;;) {
            if (t_.aborted_now()) return t_.own_failure(why);
            {
                std::lock_guard<std::mutex> lock(mutex_);
                flush_locked();
                if (closed_) break;
                if (tail_ - head_ < kSendRingBytes) {
                    const uint64_t offset = tail_ % kSendRingBytes;
                    reserved_ = static_cast<size_t>(
                        std::min<uint64_t>({kSendRingBytes - (tail_ - head_), kSendRingBytes - offset, want}));
                    *data = ring_.get() + offset;
                    *size = reserved_;
                    return TransportWait::ok;
                }
            }
            const net::IoResult r = net::wait_fd(fd_.get(), POLLOUT, deadline, kSliceMs,
                                                 [this] { return !t_.aborted_now(); }, why);
            if (r == net::IoResult::timeout) return TransportWait::timeout;
            if (r == net::IoResult::error) return TransportWait::failed;
        }
        return t_.peer_closed(peer_, why);
    }

    TransportWait commit(size_t n, std::string& why) override {
        if (t_.aborted_now()) return t_.own_failure(why);
        bool ask_io = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            tail_ += std::min(n, reserved_);
            reserved_ = 0;
            flush_locked();
            if (!closed_ && tail_ != head_ && !wants_pollout_) ask_io = wants_pollout_ = true;
        }
        if (ask_io) t_.wake_io();
        return closed() ? t_.peer_closed(peer_, why) : TransportWait::ok;
    }

    // Sends what the socket takes now. Called by the writer and by the I/O thread, under the stream's mutex.
    void flush_locked() {
        while (!closed_ && head_ != tail_) {
            const uint64_t offset = head_ % kSendRingBytes;
            const size_t span = static_cast<size_t>(std::min<uint64_t>(tail_ - head_, kSendRingBytes - offset));
            const ssize_t n = ::send(fd_.get(), ring_.get() + offset, span, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                head_ += static_cast<uint64_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                return;
            } else {
                closed_ = true;  // EPIPE, ECONNRESET, ...: the peer is gone
            }
        }
        if (head_ == tail_ || closed_) wants_pollout_ = false;
    }

    // The I/O thread's view.
    int fd() const { return fd_.get(); }
    std::mutex& mutex() { return mutex_; }
    bool wants_pollout() const { return wants_pollout_; }
    bool drained() const { return head_ == tail_ || closed_; }
    bool closed() {
        std::lock_guard<std::mutex> lock(mutex_);
        return closed_;
    }
    uint64_t sent() const { return head_; }
    void shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

private:
    TcpTransport::Impl& t_;
    int32_t peer_;
    Fd fd_;
    std::unique_ptr<std::byte[]> ring_;
    std::mutex mutex_;
    uint64_t head_ = 0;  // bytes sent
    uint64_t tail_ = 0;  // bytes committed
    size_t reserved_ = 0;
    bool closed_ = false;
    bool wants_pollout_ = false;
};

class TcpRecvStream final : public RecvStream {
public:
    TcpRecvStream(TcpTransport::Impl& t, int32_t peer, Fd fd)
        : t_(t), peer_(peer), fd_(std::move(fd)), buffer_(new std::byte[kRecvBufferBytes]) {}

    TransportWait peek(size_t want, const std::byte** data, size_t* size, TransportClock::time_point deadline,
                       std::string& why) override {
        if (t_.aborted_now()) return t_.own_failure(why);
        while (pos_ == end_) {
            // Everything the socket holds, not only `want`: one recv serves many small peeks.
            const ssize_t n = ::recv(fd_.get(), buffer_.get(), kRecvBufferBytes, MSG_DONTWAIT);
            if (n > 0) {
                pos_ = 0;
                end_ = static_cast<size_t>(n);
                break;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                return t_.aborted_now() ? t_.own_failure(why) : t_.peer_closed(peer_, why);
            }
            const net::IoResult r = net::wait_fd(fd_.get(), POLLIN, deadline, kSliceMs,
                                                 [this] { return !t_.aborted_now(); }, why);
            if (r == net::IoResult::timeout) return TransportWait::timeout;
            if (r == net::IoResult::stopped) return t_.own_failure(why);
            if (r == net::IoResult::error) return TransportWait::failed;
        }
        peeked_ = std::min(want, end_ - pos_);
        *data = buffer_.get() + pos_;
        *size = peeked_;
        return TransportWait::ok;
    }

    void consume(size_t n) override {
        pos_ += std::min(n, peeked_);
        peeked_ = 0;
    }

    void shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

private:
    TcpTransport::Impl& t_;
    int32_t peer_;
    Fd fd_;
    std::unique_ptr<std::byte[]> buffer_;
    size_t pos_ = 0;
    size_t end_ = 0;
    size_t peeked_ = 0;
};

// ------------------------------------------------------------------------------------------ Impl

TransportWait TcpTransport::Impl::peer_closed(int32_t peer, std::string& why) {
    std::unique_lock<std::mutex> lock(mutex);
    // An aborting peer sends its note before it shuts its sockets, but on another connection: allow it to land.
    changed.wait_for(lock, kNoteGrace, [&] { return !notes[static_cast<size_t>(peer)].empty() || is_aborted; });
    if (is_aborted) {
        why = aborted_text();
    } else {
        why = note_text(peer);
        if (why.empty()) why = closed_text(peer);
    }
    return TransportWait::failed;
}

void TcpTransport::Impl::register_connection(Pending& p) {
    const Hello h = decode(p.buffer);
    std::lock_guard<std::mutex> lock(mutex);
    if (h.kind == kKindNote) {
        auto& note = notes[static_cast<size_t>(h.sender)];
        if (note.empty()) {
            note.assign(reinterpret_cast<const char*>(p.buffer + kHelloBytes), h.note_bytes);
            if (note.empty()) note = "aborted";
        }
    } else {
        auto& stream = recvs[stream_key(h.sender, h.tag)];
        // A second connection for one stream is a bug or a stranger: the first one stays.
        if (!stream) stream = std::make_unique<TcpRecvStream>(*this, h.sender, std::move(p.fd));
    }
    changed.notify_all();
}

bool TcpTransport::Impl::read_pending(Pending& p) {
    while (p.have < p.need) {
        const ssize_t n = ::recv(p.fd.get(), p.buffer + p.have, p.need - p.have, MSG_DONTWAIT);
        if (n > 0) {
            p.have += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TransportClock::now() < p.deadline;
        return false;  // closed before its hello was complete
    }
    const Hello h = decode(p.buffer);
    const bool valid = h.magic == kHelloMagic && h.comm_id == comm_id && h.sender >= 0 && h.sender < nranks &&
                       h.sender != rank && (h.kind == kKindStream || h.kind == kKindNote) && h.tag >= 0 &&
                       h.tag < kMaxTags && h.note_bytes <= kMaxNoteBytes && (h.kind == kKindNote || h.note_bytes == 0);
    if (!valid) return false;
    if (h.kind == kKindNote && p.need == kHelloBytes && h.note_bytes > 0) {
        p.need += h.note_bytes;
        return read_pending(p);
    }
    register_connection(p);
    return false;
}

void TcpTransport::Impl::accept_all() {
    for (;;) {
        const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        net::tune_stream_socket(fd);
        auto* p = new Pending;
        p->fd.reset(fd);
        p->deadline = TransportClock::now() + kHelloTimeout;
        pending.push_back(p);
    }
}

void TcpTransport::Impl::io_loop() {
    std::vector<pollfd> fds;
    std::vector<TcpSendStream*> writers;
    while (!stopping.load()) {
        fds.clear();
        writers.clear();
        fds.push_back({wake_fd.get(), POLLIN, 0});
        fds.push_back({listen_fd.get(), POLLIN, 0});
        for (Pending* p : pending) fds.push_back({p->fd.get(), POLLIN, 0});
        {
            std::lock_guard<std::mutex> lock(mutex);
            for (auto& entry : sends) {
                std::lock_guard<std::mutex> stream_lock(entry.second->mutex());
                if (!entry.second->wants_pollout()) continue;
                writers.push_back(entry.second.get());
                fds.push_back({entry.second->fd(), POLLOUT, 0});
            }
        }
        if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
        if (stopping.load()) return;
        uint64_t drained = 0;
        if (fds[0].revents != 0 && ::read(wake_fd.get(), &drained, sizeof drained) < 0) {
            // EAGAIN: another wake already drained it.
        }
        for (size_t i = 0; i < pending.size(); ++i) {
            if ((fds[2 + i].revents != 0 || TransportClock::now() >= pending[i]->deadline) &&
                !read_pending(*pending[i])) {
                delete pending[i];
                pending[i] = nullptr;
            }
        }
        pending.erase(std::remove(pending.begin(), pending.end(), nullptr), pending.end());
        for (size_t i = 0; i < writers.size(); ++i) {
            // `sends` only grows while the thread runs: the pointers are still valid.
            std::lock_guard<std::mutex> stream_lock(writers[i]->mutex());
            writers[i]->flush_locked();
        }
        if (fds[1].revents != 0) accept_all();
    }
}

void TcpTransport::Impl::io_loop_safely() {
    try {
        io_loop();
    } catch (...) {
        // Out of memory: the streams still work without the thread, except for new connections.
    }
    for (Pending* p : pending) delete p;
    pending.clear();
    listen_fd.reset();  // peers connecting from now on are refused at once
}

void TcpTransport::Impl::send_notes(const std::string& reason) {
    unsigned char message[kHelloBytes + kMaxNoteBytes];
    Hello h;
    h.comm_id = comm_id;
    h.sender = rank;
    h.kind = kKindNote;
    h.note_bytes = static_cast<uint32_t>(std::min<size_t>(reason.size(), kMaxNoteBytes));
    encode(h, message);
    std::memcpy(message + kHelloBytes, reason.data(), h.note_bytes);
    const size_t size = kHelloBytes + h.note_bytes;
    // Connect to every peer at once, then write the note where the connection is up: one dead host does not
    // delay the others beyond the common deadline.
    const auto deadline = TransportClock::now() + kNoteSendTimeout;
    std::vector<Fd> sockets;
    std::vector<pollfd> fds;
    for (int32_t r = 0; r < nranks; ++r) {
        if (r == rank || !peer_reached[static_cast<size_t>(r)]) continue;
        Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!fd.valid()) continue;
        const auto* address = reinterpret_cast<const sockaddr*>(&peer_addresses[static_cast<size_t>(r)]);
        if (::connect(fd.get(), address, sizeof(sockaddr_in)) != 0 && errno != EINPROGRESS) continue;
        fds.push_back({fd.get(), POLLOUT, 0});
        sockets.push_back(std::move(fd));
    }
    size_t left = fds.size();
    while (left > 0) {
        const int timeout = net::poll_timeout_ms(deadline, 100);
        if (timeout == 0 || ::poll(fds.data(), fds.size(), timeout) < 0) break;
        for (pollfd& p : fds) {
            if (p.fd < 0 || p.revents == 0) continue;
            int error = 0;
            socklen_t length = sizeof error;
            getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &error, &length);
            // A fresh connection's send buffer takes the whole note at once.
            if (error == 0 && ::send(p.fd, message, size, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) error = errno;
            p.fd = -1;
            --left;
        }
    }
}

void TcpTransport::Impl::flush_before_close() {
    // A rank may free its communicator right after its last commit: what is queued still goes out while the
    // peers keep reading it.
    auto last_progress = TransportClock::now();
    uint64_t last_sent = 0;
    for (;;) {
        std::vector<pollfd> fds;
        uint64_t sent = 0;
        for (auto& entry : sends) {
            TcpSendStream& s = *entry.second;
            std::lock_guard<std::mutex> lock(s.mutex());
            s.flush_locked();
            sent += s.sent();
            if (!s.drained()) fds.push_back({s.fd(), POLLOUT, 0});
        }
        if (fds.empty() || aborted_now()) return;
        const auto now = TransportClock::now();
        if (sent != last_sent) {
            last_sent = sent;
            last_progress = now;
        } else if (now - last_progress > kFlushIdleLimit) {
            return;
        }
        ::poll(fds.data(), fds.size(), kSliceMs);
    }
}

// ------------------------------------------------------------------------------------------ TcpTransport

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<TcpTransport> TcpTransport::listen(int32_t rank, int32_t nranks, const std::string& host,
                                                   std::string& why) {
    auto impl = std::make_unique<Impl>();
    impl->rank = rank;
    impl->nranks = nranks;
    impl->notes.resize(static_cast<size_t>(nranks));
    sockaddr_in where{};
    const std::string who = "rank " + std::to_string(rank);
    if (!net::resolve_ipv4(host, 0, where, why)) {
        why = who + ": tcp_address: " + why;
        return nullptr;
    }
    if (!net::listen_tcp(where, 1024, impl->listen_fd, why) ||
        !net::local_address(impl->listen_fd.get(), impl->listen_address, why)) {
        why = who + ": " + why;
        return nullptr;
    }
    if (impl->listen_address.sin_addr.s_addr == htonl(INADDR_ANY)) {
        // Listening on every interface: peers connect to the hostname's address.
        char name[256] = "localhost";
        gethostname(name, sizeof name - 1);
        sockaddr_in public_address{};
        if (net::resolve_ipv4(name, 0, public_address, why)) impl->listen_address.sin_addr = public_address.sin_addr;
    }
    impl->wake_fd.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!impl->wake_fd.valid()) {
        why = who + " cannot make an eventfd: " + net::errno_text(errno);
        return nullptr;
    }
    return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

std::string TcpTransport::address() const { return net::to_string(impl_->listen_address); }

bool TcpTransport::start(uint64_t comm_id, const std::vector<std::string>& peers, std::string& why) {
    Impl& t = *impl_;
    t.comm_id = comm_id;
    t.peer_addresses.assign(static_cast<size_t>(t.nranks), sockaddr_in{});
    t.peer_reached.assign(static_cast<size_t>(t.nranks), false);
    for (int32_t r = 0; r < t.nranks; ++r) {
        const std::string& text = peers[static_cast<size_t>(r)];
        if (r == t.rank || text.empty()) continue;
        std::string host;
        uint16_t port = 0;
        if (!net::split_host_port(text, "rank " + std::to_string(r) + "'s tcp address", host, port, why) ||
            !net::resolve_ipv4(host, port, t.peer_addresses[static_cast<size_t>(r)], why)) {
            why = "rank " + std::to_string(t.rank) + ": " + why;
            return false;
        }
        t.peer_reached[static_cast<size_t>(r)] = true;
    }
    try {
        t.io_thread = std::thread([&t] { t.io_loop_safely(); });
    } catch (const std::system_error& e) {
        why = "rank " + std::to_string(t.rank) + " cannot start its TCP thread: " + e.what();
        return false;
    }
    return true;
}

TcpTransport::~TcpTransport() {
    Impl& t = *impl_;
    if (t.io_thread.joinable()) {
        if (!t.aborted_now()) t.flush_before_close();
        t.stopping.store(true);
        t.wake_io();
        t.io_thread.join();
    }
    t.sends.clear();
    t.recvs.clear();
}

bool TcpTransport::reaches(int32_t peer) const {
    return peer >= 0 && peer < impl_->nranks && peer != impl_->rank &&
           static_cast<size_t>(peer) < impl_->peer_reached.size() && impl_->peer_reached[static_cast<size_t>(peer)];
}

int32_t TcpTransport::rank() const { return impl_->rank; }
int32_t TcpTransport::nranks() const { return impl_->nranks; }
const char* TcpTransport::peer_kind(int32_t peer) const { return reaches(peer) ? "tcp" : nullptr; }

TransportWait TcpTransport::send_stream(int32_t peer, int32_t tag, SendStream** out,
                                        TransportClock::time_point deadline, std::string& why) {
    Impl& t = *impl_;
    if (t.aborted_now()) return t.own_failure(why);
    why = t.check_stream(peer, tag, reaches(peer), "over TCP");
    if (!why.empty()) return TransportWait::failed;
    const uint64_t key = stream_key(peer, tag);
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        const auto it = t.sends.find(key);
        if (it != t.sends.end()) {
            *out = it->second.get();
            return TransportWait::ok;
        }
        why = t.note_text(peer);
        if (!why.empty()) return TransportWait::failed;
    }
    const sockaddr_in& address = t.peer_addresses[static_cast<size_t>(peer)];
    const auto keep_going = [&t] { return !t.aborted_now(); };
    Fd fd;
    int error = 0;
    net::IoResult r = net::connect_tcp(address, deadline, keep_going, fd, error, why);
    if (r == net::IoResult::ok) {
        unsigned char hello[kHelloBytes];
        Hello h;
        h.comm_id = t.comm_id;
        h.sender = t.rank;
        h.tag = tag;
        encode(h, hello);
        r = net::send_all(fd.get(), hello, sizeof hello, deadline, keep_going, why);
    }
    if (r == net::IoResult::timeout) return TransportWait::timeout;
    if (r == net::IoResult::stopped || t.aborted_now()) return t.own_failure(why);
    if (r != net::IoResult::ok) {
        std::lock_guard<std::mutex> lock(t.mutex);
        const std::string note = t.note_text(peer);
        why = !note.empty() ? note
                            : "rank " + std::to_string(t.rank) + " cannot open a stream to rank " +
                                  std::to_string(peer) + " at " + net::to_string(address) +
                                  " (it exited or failed?): " + (error != 0 ? net::errno_text(error) : why);
        return TransportWait::failed;
    }
    std::lock_guard<std::mutex> lock(t.mutex);
    auto& stream = t.sends[key];
    if (!stream) stream = std::make_unique<TcpSendStream>(t, peer, std::move(fd));
    *out = stream.get();
    return TransportWait::ok;
}

TransportWait TcpTransport::recv_stream(int32_t peer, int32_t tag, RecvStream** out,
                                        TransportClock::time_point deadline, std::string& why) {
    Impl& t = *impl_;
    why = t.check_stream(peer, tag, reaches(peer), "over TCP");
    if (!why.empty()) return TransportWait::failed;
    const uint64_t key = stream_key(peer, tag);
    std::unique_lock<std::mutex> lock(t.mutex);
    for (;;) {
        if (t.is_aborted) {
            why = t.aborted_text();
            return TransportWait::failed;
        }
        const auto it = t.recvs.find(key);
        if (it != t.recvs.end()) {
            *out = it->second.get();
            return TransportWait::ok;
        }
        why = t.note_text(peer);
        if (!why.empty()) return TransportWait::failed;
        if (TransportClock::now() >= deadline) return TransportWait::timeout;
        t.changed.wait_until(lock, std::min(deadline, TransportClock::now() + std::chrono::milliseconds(kSliceMs)));
    }
}

void TcpTransport::abort(const std::string& reason) {
    Impl& t = *impl_;
    std::string line;
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        if (t.abort_started) return;
        t.abort_started = true;
        t.abort_reason = reason.empty() ? std::string("aborted") : reason;
        line = t.abort_reason.substr(0, t.abort_reason.find('\n'));
    }
    // The notes go out before anything is shut down: a peer that sees this rank's EOF finds the reason waiting.
    if (!t.peer_reached.empty()) t.send_notes(line);
    std::lock_guard<std::mutex> lock(t.mutex);
    t.is_aborted.store(true);
    for (auto& entry : t.sends) entry.second->shutdown();
    for (auto& entry : t.recvs) entry.second->shutdown();
    t.stopping.store(true);
    if (t.wake_fd.valid()) t.wake_io();
    t.changed.notify_all();
}

std::string TcpTransport::aborted() const {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->abort_started ? impl_->abort_reason : std::string();
}

}  // namespace mlopt

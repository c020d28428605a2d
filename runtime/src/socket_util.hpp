// Small POSIX socket helpers shared by the TCP transport (transport_tcp.cpp) and mlopt's TCP rendezvous store
// (bootstrap.cpp): IPv4 addresses, owned file descriptors, and connect/send/recv that wait with poll() in
// slices, so that every wait honours a deadline and a "keep going" check (abort flags). Errors are returned as
// one-line texts; nothing here throws except std::bad_alloc.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace mlopt {
namespace net {

using Clock = std::chrono::steady_clock;

// An owned file descriptor (closed by the destructor); move-only.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(other.release()) {}
    Fd& operator=(Fd&& other) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() { reset(); }

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release() {
        const int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd = -1);

private:
    int fd_ = -1;
};

// strerror of an errno value, thread-safe.
std::string errno_text(int error);

// "host:port" -> host and port (0..65535). False with a one-line `why` naming `what` (e.g. "address").
bool split_host_port(const std::string& text, const std::string& what, std::string& host, uint16_t& port,
                     std::string& why);
// An IPv4 address for `host` (dotted quad or a name resolved with getaddrinfo, preferring a non-loopback
// address when the name has several).
bool resolve_ipv4(const std::string& host, uint16_t port, sockaddr_in& out, std::string& why);
// "a.b.c.d:port".
std::string to_string(const sockaddr_in& address);

// A non-blocking listening socket bound to `address` (port 0: an ephemeral port).
bool listen_tcp(const sockaddr_in& address, int backlog, Fd& out, std::string& why);
// The address a bound socket has (its port when it was bound to port 0).
bool local_address(int fd, sockaddr_in& out, std::string& why);

bool set_nonblocking(int fd);
// TCP_NODELAY (small messages go out at once) and close-on-exec.
void tune_stream_socket(int fd);

// Milliseconds to poll for: at most `slice_ms`, and no later than the deadline (0 when it has passed).
int poll_timeout_ms(Clock::time_point deadline, int slice_ms);

// Outcome of the waiting helpers below.
enum class IoResult { ok, timeout, stopped, error };

// Waits until `fd` has one of `events` (or an error/hangup), polling in slices of `slice_ms` and calling
// keep_going() (may be empty) between slices. ok: ready; timeout: the deadline passed; stopped: keep_going()
// returned false; error: poll() failed (errno in `why`).
IoResult wait_fd(int fd, short events, Clock::time_point deadline, int slice_ms,
                 const std::function<bool()>& keep_going, std::string& why);

// Connects a new non-blocking socket to `address` before the deadline. A refused connection is an error
// (the caller decides whether to retry); `error` is the errno (ETIMEDOUT when the deadline passed).
IoResult connect_tcp(const sockaddr_in& address, Clock::time_point deadline, const std::function<bool()>& keep_going,
                     Fd& out, int& error, std::string& why);

// Sends / receives exactly `size` bytes on a non-blocking socket before the deadline (MSG_NOSIGNAL: a closed
// peer is an error, never SIGPIPE). recv_all: a clean EOF is an error with errno 0 ("closed").
IoResult send_all(int fd, const void* data, size_t size, Clock::time_point deadline,
                  const std::function<bool()>& keep_going, std::string& why);
IoResult recv_all(int fd, void* data, size_t size, Clock::time_point deadline, const std::function<bool()>& keep_going,
                  std::string& why);

}  // namespace net
}  // namespace mlopt

// Socket helpers for the TCP transport and the TCP rendezvous store (socket_util.hpp).
#include "socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mlopt {
namespace net {

Fd& Fd::operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
}

void Fd::reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

std::string errno_text(int error) {
    char buffer[256];
    buffer[0] = '\0';
    // The GNU strerror_r returns the text (maybe not in `buffer`); the XSI one fills `buffer`.
#if defined(_GNU_SOURCE) && !defined(__APPLE__)
    return std::string(strerror_r(error, buffer, sizeof buffer));
#else
    strerror_r(error, buffer, sizeof buffer);
    return std::string(buffer);
#endif
}

bool split_host_port(const std::string& text, const std::string& what, std::string& host, uint16_t& port,
                     std::string& why) {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        why = what + " \"" + text + "\" is not \"host:port\"";
        return false;
    }
    const std::string digits = text.substr(colon + 1);
    unsigned long value = 0;
    for (char c : digits) {
        if (c < '0' || c > '9' || value > 65535) {
            why = what + " \"" + text + "\": the port \"" + digits + "\" is not a number in 0..65535";
            return false;
        }
        value = value * 10 + static_cast<unsigned long>(c - '0');
    }
    if (value > 65535) {
        why = what + " \"" + text + "\": the port " + digits + " is not in 0..65535";
        return false;
    }
    host = text.substr(0, colon);
    port = static_cast<uint16_t>(value);
    return true;
}

bool resolve_ipv4(const std::string& host, uint16_t port, sockaddr_in& out, std::string& why) {
    std::memset(&out, 0, sizeof out);
    out.sin_family = AF_INET;
    out.sin_port = htons(port);
    if (inet_pton(AF_INET, host.c_str(), &out.sin_addr) == 1) return true;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc != 0 || found == nullptr) {
        why = "cannot resolve the host \"" + host + "\" to an IPv4 address: " + gai_strerror(rc);
        return false;
    }
    // A name often resolves to 127.0.1.1 and to the real address too: peers on other hosts need the latter.
    const addrinfo* chosen = found;
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) {
            chosen = a;
            break;
        }
    }
    out.sin_addr = reinterpret_cast<const sockaddr_in*>(chosen->ai_addr)->sin_addr;
    freeaddrinfo(found);
    return true;
}

std::string to_string(const sockaddr_in& address) {
    char text[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

bool set_nonblocking(int fd) {
    const int flags = fcntl(fd, F_GETFL, 0);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void tune_stream_socket(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
}

bool listen_tcp(const sockaddr_in& address, int backlog, Fd& out, std::string& why) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
        why = "cannot make a socket: " + errno_text(errno);
        return false;
    }
    // A rendezvous port reused right after a previous job must not wait out TIME_WAIT.
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
        why = "cannot listen on " + to_string(address) + ": " + errno_text(errno);
        return false;
    }
    if (::listen(fd.get(), backlog) != 0) {
        why = "cannot listen on " + to_string(address) + ": " + errno_text(errno);
        return false;
    }
    out = std::move(fd);
    return true;
}

bool local_address(int fd, sockaddr_in& out, std::string& why) {
    socklen_t size = sizeof out;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&out), &size) != 0) {
        why = "getsockname failed: " + errno_text(errno);
        return false;
    }
    return true;
}

int poll_timeout_ms(Clock::time_point deadline, int slice_ms) {
    const auto now = Clock::now();
    if (now >= deadline) return 0;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    return static_cast<int>(std::min<long long>(left, slice_ms));
}

IoResult wait_fd(int fd, short events, Clock::time_point deadline, int slice_ms,
                 const std::function<bool()>& keep_going, std::string& why) {
    for (;;) {
        if (keep_going && !keep_going()) return IoResult::stopped;
        pollfd p{fd, events, 0};
        const int timeout = poll_timeout_ms(deadline, slice_ms);
        const int rc = ::poll(&p, 1, timeout);
        if (rc > 0) return IoResult::ok;
        if (rc < 0 && errno != EINTR) {
            why = "poll failed: " + errno_text(errno);
            return IoResult::error;
        }
        if (timeout == 0 || Clock::now() >= deadline) return IoResult::timeout;
    }
}

IoResult connect_tcp(const sockaddr_in& address, Clock::time_point deadline, const std::function<bool()>& keep_going,
                     Fd& out, int& error, std::string& why) {
    error = 0;
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
        error = errno;
        why = "cannot make a socket: " + errno_text(error);
        return IoResult::error;
    }
    tune_stream_socket(fd.get());
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
        if (errno != EINPROGRESS) {
            error = errno;
            why = "cannot connect to " + to_string(address) + ": " + errno_text(error);
            return IoResult::error;
        }
        const IoResult waited = wait_fd(fd.get(), POLLOUT, deadline, 50, keep_going, why);
        if (waited == IoResult::timeout) error = ETIMEDOUT;
        if (waited != IoResult::ok) return waited;
        socklen_t size = sizeof error;
        if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
        if (error != 0) {
            why = "cannot connect to " + to_string(address) + ": " + errno_text(error);
            return IoResult::error;
        }
    }
    out = std::move(fd);
    return IoResult::ok;
}

IoResult send_all(int fd, const void* data, size_t size, Clock::time_point deadline,
                  const std::function<bool()>& keep_going, std::string& why) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            size -= static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            why = errno_text(errno);
            return IoResult::error;
        }
        const IoResult waited = wait_fd(fd, POLLOUT, deadline, 50, keep_going, why);
        if (waited != IoResult::ok) return waited;
    }
    return IoResult::ok;
}

IoResult recv_all(int fd, void* data, size_t size, Clock::time_point deadline, const std::function<bool()>& keep_going,
                  std::string& why) {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
        const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            size -= static_cast<size_t>(n);
            continue;
        }
        if (n == 0) {
            why = "the connection was closed";
            return IoResult::error;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            why = errno_text(errno);
            return IoResult::error;
        }
        const IoResult waited = wait_fd(fd, POLLIN, deadline, 50, keep_going, why);
        if (waited != IoResult::ok) return waited;
    }
    return IoResult::ok;
}

}  // namespace net
}  // namespace mlopt

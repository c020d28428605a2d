// Rendezvous helpers over the caller's key-value store, and mlopt's own TCP store (bootstrap.hpp).
#include "bootstrap.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace mlopt {
namespace {

constexpr int32_t kSliceMs = 200;                 // how often a waiting rank looks for another rank's failure
constexpr size_t kMaxKeyBytes = 4096;             // the TCP store refuses larger keys ...
constexpr uint64_t kMaxValueBytes = 64ull << 20;  // ... and values (a malformed client must not exhaust memory)
constexpr uint8_t kOpSet = 1;
constexpr uint8_t kOpGet = 2;
constexpr uint8_t kOpBye = 3;

int32_t ms_until(BootstrapClock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - BootstrapClock::now()).count();
    return static_cast<int32_t>(std::clamp<long long>(left, 0, INT32_MAX));
}

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
    return v;
}

}  // namespace

std::string rank_list(const std::vector<int32_t>& ranks) {
    std::string text = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
    return text;
}

// ------------------------------------------------------------------------------------------ BootstrapChannel

bool BootstrapChannel::put(const std::string& name, const std::string& value, std::string& why) {
    const std::string k = key(name);
    const int rc = store_.set(store_.ctx, k.c_str(), value.data(), value.size());
    if (rc != 0) {
        why = "rank " + std::to_string(rank_) + ": the bootstrap store failed to set \"" + k + "\" (set returned " +
              std::to_string(rc) + ")";
        return false;
    }
    return true;
}

BootstrapChannel::Got BootstrapChannel::get(const std::string& name, int32_t timeout_ms, std::string& value,
                                            std::string& why) {
    const std::string k = key(name);
    value.assign(256, '\0');
    for (int attempt = 0; attempt < 2; ++attempt) {
        size_t size = 0;
        const int rc = store_.get(store_.ctx, k.c_str(), &value[0], value.size(), &size, timeout_ms);
        if (rc == 1) return Got::timeout;
        if (rc != 0) {
            why = "rank " + std::to_string(rank_) + ": the bootstrap store failed to get \"" + k +
                  "\" (get returned " + std::to_string(rc) + ")";
            return Got::error;
        }
        if (size <= value.size()) {
            value.resize(size);
            return Got::ok;
        }
        // The value is larger than the first guess: it is set now, so the second get does not wait.
        value.assign(size, '\0');
        timeout_ms = 0;
    }
    why = "rank " + std::to_string(rank_) + ": the bootstrap store's value of \"" + k + "\" keeps changing size";
    return Got::error;
}

BootstrapChannel::Got BootstrapChannel::wait_rank(const std::string& name, int32_t r,
                                                  BootstrapClock::time_point deadline, std::string& value,
                                                  std::string& why) {
    const std::string rank_key = name + "/" + std::to_string(r);
    for (;;) {
        const int32_t slice = std::min(kSliceMs, ms_until(deadline));
        const Got got = get(rank_key, slice, value, why);
        if (got != Got::timeout) return got;
        std::string failure;
        const Got failed = get("abort", 0, failure, why);
        if (failed == Got::error) return failed;
        if (failed == Got::ok) {
            why = failure;
            return Got::error;
        }
        if (slice == 0 || BootstrapClock::now() >= deadline) return Got::timeout;
    }
}

bool BootstrapChannel::all_gather(const std::string& name, const std::string& mine, const std::string& what,
                                  BootstrapClock::time_point deadline, std::vector<std::string>& out,
                                  std::string& why) {
    if (!put(name + "/" + std::to_string(rank_), mine, why)) return false;
    out.assign(static_cast<size_t>(nranks_), std::string());
    out[static_cast<size_t>(rank_)] = mine;
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < nranks_; ++r) {
        if (r == rank_) continue;
        // Once one rank is late, the others are only looked at (they had the same time to arrive).
        const Got got = missing.empty() ? wait_rank(name, r, deadline, out[static_cast<size_t>(r)], why)
                                        : get(name + "/" + std::to_string(r), 0, out[static_cast<size_t>(r)], why);
        if (got == Got::error) return false;
        if (got == Got::timeout) missing.push_back(r);
    }
    if (missing.empty()) return true;
    why = rank_list(missing) + " did not " + what + " within " + std::to_string(timeout_ms_) + " ms";
    return false;
}

bool BootstrapChannel::barrier(const std::string& name, const std::string& what, BootstrapClock::time_point deadline,
                               std::string& why) {
    std::vector<std::string> ignored;
    return all_gather(name, std::string(), what, deadline, ignored, why);
}

void BootstrapChannel::publish_failure(const std::string& message) {
    std::string ignored;
    const std::string text = "rank " + std::to_string(rank_) + " failed: " + message;
    put("abort", text, ignored);
}

// ------------------------------------------------------------------------------------------ TcpStoreServer

struct TcpStoreServer::Client {
    net::Fd fd;
    std::string in;  // bytes of the request being received
    bool waiting = false;
    std::string wait_key;
    BootstrapClock::time_point wait_deadline;
};

bool TcpStoreServer::start(const std::string& address, std::string& why) {
    std::string host;
    uint16_t port = 0;
    sockaddr_in where{};
    if (!net::split_host_port(address, "the rendezvous address", host, port, why)) return false;
    if (!net::resolve_ipv4(host, port, where, why)) return false;
    if (!net::listen_tcp(where, 1024, listen_fd_, why)) {
        why = "rank 0 cannot serve the rendezvous: " + why;
        return false;
    }
    wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_fd_.valid()) {
        why = "rank 0 cannot make an eventfd for the rendezvous server: " + net::errno_text(errno);
        listen_fd_.reset();
        return false;
    }
    stopping_ = false;
    try {
        thread_ = std::thread([this] { serve_safely(); });
    } catch (const std::system_error& e) {
        why = std::string("rank 0 cannot start the rendezvous server thread: ") + e.what();
        listen_fd_.reset();
        wake_fd_.reset();
        return false;
    }
    return true;
}

void TcpStoreServer::wait_for_byes(int32_t count, BootstrapClock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    byes_changed_.wait_until(lock, deadline, [&] { return byes_ >= count; });
}

void TcpStoreServer::stop() {
    if (thread_.joinable()) {
        stopping_ = true;
        const uint64_t one = 1;
        if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
            // The eventfd counter cannot overflow here; poll's timeout notices `stopping_` anyway.
        }
        thread_.join();
    }
    for (Client* c : clients_) delete c;
    clients_.clear();
    listen_fd_.reset();
    wake_fd_.reset();
}

void TcpStoreServer::wake_waiters(const std::string& key) {
    for (Client* c : clients_) {
        if (c->fd.valid() && c->waiting && c->wait_key == key && !answer_get(*c, false)) c->fd.reset();
    }
}

bool TcpStoreServer::answer_get(Client& client, bool timed_out) {
    client.waiting = false;
    std::string reply;
    if (timed_out) {
        reply.push_back(static_cast<char>(1));
    } else {
        const auto it = store_.find(client.wait_key);
        reply.push_back(static_cast<char>(0));
        put_u64(reply, it->second.size());
        reply += it->second;
    }
    std::string why;
    // Replies are small and the client waits for them: a client that does not read within 5 s is dropped.
    const auto deadline = BootstrapClock::now() + std::chrono::seconds(5);
    return net::send_all(client.fd.get(), reply.data(), reply.size(), deadline, {}, why) == net::IoResult::ok;
}

// Parses and answers every complete request in client.in. False: drop the client (malformed or gone).
bool TcpStoreServer::handle_input(Client& client) {
    std::string& in = client.in;
    while (!in.empty() && !client.waiting) {
        const auto op = static_cast<uint8_t>(in[0]);
        if (op == kOpBye) {
            std::lock_guard<std::mutex> lock(mutex_);
            ++byes_;
            byes_changed_.notify_all();
            return false;
        }
        if ((op != kOpSet && op != kOpGet) || (in.size() >= 5 && get_le(&in[1], 4) > kMaxKeyBytes)) return false;
        if (in.size() < 5) return true;
        const size_t key_size = get_le(&in[1], 4);
        const size_t head = 5 + key_size + (op == kOpSet ? 8 : 4);
        if (in.size() < head) return true;
        std::string key = in.substr(5, key_size);
        if (op == kOpGet) {
            const auto timeout_ms = static_cast<int32_t>(get_le(&in[5 + key_size], 4));
            in.erase(0, head);
            client.waiting = true;
            client.wait_key = std::move(key);
            client.wait_deadline = BootstrapClock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
            if (store_.count(client.wait_key) != 0 && !answer_get(client, false)) return false;
            continue;
        }
        const uint64_t value_size = get_le(&in[5 + key_size], 8);
        if (value_size > kMaxValueBytes) return false;
        if (in.size() < head + value_size) return true;
        std::string value = in.substr(head, value_size);
        in.erase(0, head + value_size);
        store_[key] = std::move(value);
        const char ok = 0;
        std::string why;
        const auto deadline = BootstrapClock::now() + std::chrono::seconds(5);
        if (net::send_all(client.fd.get(), &ok, 1, deadline, {}, why) != net::IoResult::ok) return false;
        wake_waiters(key);
    }
    return true;
}

void TcpStoreServer::serve_safely() {
    try {
        serve();
    } catch (...) {
        // Out of memory: close every connection so that waiting clients fail now rather than at their timeout.
    }
    for (Client* c : clients_) c->fd.reset();
}

void TcpStoreServer::serve() {
    std::vector<pollfd> fds;
    while (!stopping_) {
        fds.clear();
        fds.push_back({listen_fd_.get(), POLLIN, 0});
        fds.push_back({wake_fd_.get(), POLLIN, 0});
        auto next_deadline = BootstrapClock::now() + std::chrono::seconds(1);
        for (Client* c : clients_) {
            fds.push_back({c->fd.get(), POLLIN, 0});
            if (c->waiting) next_deadline = std::min(next_deadline, c->wait_deadline);
        }
        if (::poll(fds.data(), fds.size(), net::poll_timeout_ms(next_deadline, 1000)) < 0 && errno != EINTR) break;
        if (stopping_) break;
        for (size_t i = 0; i < clients_.size(); ++i) {
            Client& c = *clients_[i];
            const short revents = fds[i + 2].revents;
            if (revents != 0 && c.fd.valid()) {
                char buffer[65536];
                const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                    c.fd.reset();
                } else if (n > 0) {
                    c.in.append(buffer, static_cast<size_t>(n));
                    if (!handle_input(c)) c.fd.reset();
                }
            }
            if (c.fd.valid() && c.waiting && BootstrapClock::now() >= c.wait_deadline && !answer_get(c, true)) {
                c.fd.reset();
            }
        }
        clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                      [](Client* c) {
                                          if (c->fd.valid()) return false;
                                          delete c;
                                          return true;
                                      }),
                       clients_.end());
        if (fds[0].revents != 0) {
            for (;;) {
                const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) break;
                net::tune_stream_socket(fd);
                auto* c = new Client;
                c->fd.reset(fd);
                clients_.push_back(c);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------ TcpStoreClient

namespace {

int client_set(void* ctx, const char* key, const void* value, size_t size) {
    try {
        return static_cast<TcpStoreClient*>(ctx)->set(key, value, size);
    } catch (...) {
        return 2;
    }
}

int client_get(void* ctx, const char* key, void* value, size_t capacity, size_t* size, int32_t timeout_ms) {
    try {
        return static_cast<TcpStoreClient*>(ctx)->get(key, value, capacity, size, timeout_ms);
    } catch (...) {
        return 2;
    }
}

}  // namespace

bool TcpStoreClient::connect(const std::string& address, BootstrapClock::time_point deadline, int32_t timeout_ms,
                             std::string& why) {
    address_ = address;
    std::string host;
    uint16_t port = 0;
    sockaddr_in where{};
    if (!net::split_host_port(address, "the rendezvous address", host, port, why)) return false;
    if (!net::resolve_ipv4(host, port, where, why)) return false;
    if (port == 0) {
        why = "the rendezvous address \"" + address + "\" needs a port (rank 0 listens on it, the others connect)";
        return false;
    }
    std::string last = "no answer";
    for (;;) {
        int error = 0;
        std::string detail;
        const net::IoResult r = net::connect_tcp(where, deadline, {}, fd_, error, detail);
        if (r == net::IoResult::ok) return true;
        if (error != 0) last = net::errno_text(error);
        if (r == net::IoResult::error && error != ECONNREFUSED && error != ECONNRESET && error != ENETUNREACH &&
            error != EHOSTUNREACH) {
            why = "cannot reach the rendezvous server at " + address + ": " + detail;
            return false;
        }
        if (BootstrapClock::now() + std::chrono::milliseconds(50) >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    why = "rank 0 did not join within " + std::to_string(timeout_ms) + " ms (no rendezvous server at " + address +
          ": " + last + ")";
    return false;
}

mlopt_bootstrap TcpStoreClient::bootstrap() {
    mlopt_bootstrap b{};
    b.struct_size = sizeof b;
    b.ctx = this;
    b.set = client_set;
    b.get = client_get;
    return b;
}

int TcpStoreClient::lost(const std::string& what) {
    if (failure_.empty()) {
        failure_ = "lost the rendezvous server at " + address_ + " (rank 0 exited or failed): " + what;
    }
    fd_.reset();
    return 2;
}

bool TcpStoreClient::send_request(const std::string& request) {
    std::string why;
    const auto deadline = BootstrapClock::now() + std::chrono::seconds(30);
    if (net::send_all(fd_.get(), request.data(), request.size(), deadline, {}, why) == net::IoResult::ok) return true;
    lost(why);
    return false;
}

int TcpStoreClient::set(const std::string& key, const void* value, size_t size) {
    if (!fd_.valid()) return 2;
    if (key.size() > kMaxKeyBytes || size > kMaxValueBytes) return 3;
    std::string request;
    request.push_back(static_cast<char>(kOpSet));
    put_u32(request, static_cast<uint32_t>(key.size()));
    request += key;
    put_u64(request, size);
    request.append(static_cast<const char*>(value), size);
    if (!send_request(request)) return 2;
    char status = 1;
    std::string why;
    const auto deadline = BootstrapClock::now() + std::chrono::seconds(30);
    if (net::recv_all(fd_.get(), &status, 1, deadline, {}, why) != net::IoResult::ok) return lost(why);
    return status == 0 ? 0 : lost("unexpected answer to a set");
}

int TcpStoreClient::get(const std::string& key, void* value, size_t capacity, size_t* size, int32_t timeout_ms) {
    if (!fd_.valid()) return 2;
    if (key.size() > kMaxKeyBytes) return 3;
    std::string request;
    request.push_back(static_cast<char>(kOpGet));
    put_u32(request, static_cast<uint32_t>(key.size()));
    request += key;
    put_u32(request, static_cast<uint32_t>(std::max(timeout_ms, 0)));
    if (!send_request(request)) return 2;
    // The server answers a timed-out get itself; the margin only covers a server that stopped answering.
    const auto deadline = BootstrapClock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0)) +
                          std::chrono::seconds(30);
    std::string why;
    char status = 2;
    char length[8];
    if (net::recv_all(fd_.get(), &status, 1, deadline, {}, why) != net::IoResult::ok) return lost(why);
    if (status == 1) return 1;
    if (status != 0) return lost("unexpected answer to a get");
    if (net::recv_all(fd_.get(), length, 8, deadline, {}, why) != net::IoResult::ok) return lost(why);
    const uint64_t full = get_le(length, 8);
    if (full > kMaxValueBytes) return lost("a value of " + std::to_string(full) + " bytes");
    std::string bytes(full, '\0');
    if (full > 0 && net::recv_all(fd_.get(), &bytes[0], full, deadline, {}, why) != net::IoResult::ok) {
        return lost(why);
    }
    if (capacity > 0) std::memcpy(value, bytes.data(), std::min<size_t>(capacity, full));
    *size = full;
    return 0;
}

void TcpStoreClient::bye() {
    if (!fd_.valid()) return;
    const std::string request(1, static_cast<char>(kOpBye));
    send_request(request);
    // Closing after the bye: the server counts byes, never waits for this connection's end.
    fd_.reset();
}

}  // namespace mlopt

// Rendezvous for multi-process communicators (mlopt.h, "multi-process"; used by comm_mp.cpp):
//
// - BootstrapChannel: put/get/all-gather/barrier over the caller's mlopt_bootstrap, every key under
//   "<key_prefix>/". A rank that fails during mlopt_comm_create publishes "<key_prefix>/abort" so that the
//   others stop waiting for it at once instead of at the init timeout.
// - TcpStoreServer / TcpStoreClient: mlopt's own key-value store for mlopt_comm_create_tcp. Rank 0 runs the
//   server (one thread) on "host:port"; every rank, rank 0 included, is a client over TCP. Protocol (all
//   integers little-endian, one request in flight per client):
//     set: u8 1, u32 key size, key, u64 value size, value      -> u8 0
//     get: u8 2, u32 key size, key, i32 timeout_ms             -> u8 0, u64 size, value | u8 1 (timed out)
//     bye: u8 3                                                -> (nothing; the client closes)
//   The server answers a get as soon as the key is set (or when its timeout passes), and stops once every
//   rank said bye after the communicator's final barrier (or at once when this rank's create failed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mlopt/mlopt.h"
#include "socket_util.hpp"

namespace mlopt {

using BootstrapClock = std::chrono::steady_clock;

class BootstrapChannel {
public:
    // `timeout_ms` is the caller's init_timeout_ms, quoted in messages about missing ranks.
    BootstrapChannel(const mlopt_bootstrap& store, std::string prefix, int32_t rank, int32_t nranks,
                     int32_t timeout_ms)
        : store_(store), prefix_(std::move(prefix)), rank_(rank), nranks_(nranks), timeout_ms_(timeout_ms) {}

    enum class Got { ok, timeout, error };

    bool put(const std::string& name, const std::string& value, std::string& why);
    // The value under "<prefix>/<name>", waiting up to timeout_ms (0: only looks).
    Got get(const std::string& name, int32_t timeout_ms, std::string& value, std::string& why);

    // Publishes `mine` as this rank's "<name>/<rank>" and collects every rank's, in rank order. At the deadline:
    // "ranks 2, 3 did not <what> within <timeout_ms> ms" (what: "join", ...). When another rank published its
    // failure: "rank 1 failed: <its message>".
    bool all_gather(const std::string& name, const std::string& mine, const std::string& what,
                    BootstrapClock::time_point deadline, std::vector<std::string>& out, std::string& why);
    bool barrier(const std::string& name, const std::string& what, BootstrapClock::time_point deadline,
                 std::string& why);

    // Best effort: tells the other ranks that this one failed (they are waiting in all_gather/barrier).
    void publish_failure(const std::string& message);

private:
    std::string key(const std::string& name) const { return prefix_ + "/" + name; }
    // Waits for rank r's "<name>/<r>" until the deadline, checking the abort key between slices.
    Got wait_rank(const std::string& name, int32_t r, BootstrapClock::time_point deadline, std::string& value,
                  std::string& why);

    mlopt_bootstrap store_;
    std::string prefix_;
    int32_t rank_;
    int32_t nranks_;
    int32_t timeout_ms_;
};

// "rank 3" / "ranks 2, 3".
std::string rank_list(const std::vector<int32_t>& ranks);

class TcpStoreServer {
public:
    TcpStoreServer() = default;
    TcpStoreServer(const TcpStoreServer&) = delete;
    TcpStoreServer& operator=(const TcpStoreServer&) = delete;
    ~TcpStoreServer() { stop(); }

    // Listens on `address` ("host:port") and starts the server thread.
    bool start(const std::string& address, std::string& why);
    // Waits until `count` clients said bye, or the deadline.
    void wait_for_byes(int32_t count, BootstrapClock::time_point deadline);
    // Stops the thread and closes every connection (clients still waiting see the connection close).
    void stop();

private:
    struct Client;
    void serve_safely();
    void serve();
    bool handle_input(Client& client);
    bool answer_get(Client& client, bool timed_out);
    void wake_waiters(const std::string& key);

    net::Fd listen_fd_;
    net::Fd wake_fd_;  // eventfd: stop() interrupts poll()
    std::thread thread_;
    std::atomic<bool> stopping_{false};
    std::vector<Client*> clients_;  // owned; only the server thread touches them
    std::map<std::string, std::string> store_;
    std::mutex mutex_;
    std::condition_variable byes_changed_;
    int32_t byes_ = 0;
};

class TcpStoreClient {
public:
    // Connects to the server, retrying refused connections until the deadline (rank 0 may start later).
    // Failure: "rank 0 did not join within <timeout_ms> ms (no rendezvous server at <address>: <reason>)".
    bool connect(const std::string& address, BootstrapClock::time_point deadline, int32_t timeout_ms,
                 std::string& why);
    // Callbacks over this client (ctx = this), valid while it lives.
    mlopt_bootstrap bootstrap();
    // Tells the server this rank is done with it, then closes the connection.
    void bye();
    // Why the connection to the server broke ("" while it works): the root cause of a store error.
    const std::string& failure() const { return failure_; }

    // The mlopt_bootstrap callbacks.
    int set(const std::string& key, const void* value, size_t size);
    int get(const std::string& key, void* value, size_t capacity, size_t* size, int32_t timeout_ms);

private:
    bool send_request(const std::string& request);
    int lost(const std::string& what);  // records the failure, closes, returns the callbacks' error code
    net::Fd fd_;
    std::string address_;
    std::string failure_;
};

}  // namespace mlopt

// Multi-process communicators (mlopt.h, "multi-process"): mlopt_comm_create over the caller's bootstrap store,
// mlopt_comm_create_tcp over mlopt's own TCP rendezvous (bootstrap.hpp), and the per-peer transport choice.
//
// Create, on every rank:
//   1. make this rank's shared-memory segment (named unless TCP is forced; anonymous memory for its streams to
//      itself otherwise, or when /dev/shm is unusable under AUTO);
//   2. all-gather {host id, pid, segment name, a communicator id} ("join": missing ranks are named at the
//      init timeout);
//   3. per pair: same host id and both have a segment -> shm, else tcp (SHM forced across hosts: unsupported);
//   4. map the peers' segments; if any pair uses TCP, every rank all-gathers its listening address;
//   5. barrier "ready": every peer has mapped this rank's segment, so its name is unlinked right away.
// A failing rank publishes its error on the store, so that the others stop waiting for it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "bootstrap.hpp"
#include "comm.hpp"
#include "handles.hpp"
#include "transport.hpp"
#include "transport_shm.hpp"
#include "transport_tcp.hpp"

namespace mlopt {
namespace {

constexpr int32_t kDefaultInitTimeoutMs = 30000;
constexpr int64_t kDefaultFifoBytes = 4 << 20;
constexpr int32_t kDefaultSpinUs = 20;
constexpr auto kByeWait = std::chrono::seconds(5);  // rank 0's server outlives create until the others left
constexpr auto kFailureLinger = std::chrono::milliseconds(500);  // ... and a failed create, briefly

enum class PeerKind : uint8_t { self, shm, tcp };

// The caller's options with the defaults filled in.
struct CommOptions {
    mlopt_transport transport = MLOPT_TRANSPORT_AUTO;
    int32_t init_timeout_ms = kDefaultInitTimeoutMs;
    uint64_t fifo_bytes = kDefaultFifoBytes;
    int32_t spin_us = kDefaultSpinUs;
    std::string host_id;  // "" = the default
    std::string tcp_address;
    std::string key_prefix = "mlopt";
};

mlopt_status read_comm_options(const mlopt_comm_options* given, CommOptions& out, mlopt_error* err) {
    mlopt_comm_options o;
    mlopt_comm_options_init(&o);
    if (given != nullptr) {
        const size_t known = offsetof(mlopt_comm_options, transport) + sizeof(given->transport);
        const mlopt_status status = read_sized(*given, known, "mlopt_comm_options_init", o, err);
        if (status != MLOPT_OK) return status;
    }
    // The caller's value may be any integer: read it as one (loading a bad enum value is undefined).
    int transport = 0;
    static_assert(sizeof transport == sizeof o.transport, "mlopt_transport is an int");
    std::memcpy(&transport, &o.transport, sizeof transport);
    if (transport != MLOPT_TRANSPORT_AUTO && transport != MLOPT_TRANSPORT_SHM && transport != MLOPT_TRANSPORT_TCP) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->transport=" + std::to_string(transport) + " is not a mlopt_transport");
    }
    if (o.shm_fifo_bytes > 0 &&
        ((o.shm_fifo_bytes & (o.shm_fifo_bytes - 1)) != 0 || uint64_t(o.shm_fifo_bytes) < kShmMinFifo ||
         uint64_t(o.shm_fifo_bytes) > kShmMaxFifo)) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->shm_fifo_bytes=" + std::to_string(o.shm_fifo_bytes) + " is not a power of two in [" +
                        std::to_string(kShmMinFifo) + ", " + std::to_string(kShmMaxFifo) +
                        "] (or <= 0 for the default, 4 MiB)");
    }
    out.transport = o.transport;
    out.init_timeout_ms = o.init_timeout_ms > 0 ? o.init_timeout_ms : kDefaultInitTimeoutMs;
    out.fifo_bytes = o.shm_fifo_bytes > 0 ? uint64_t(o.shm_fifo_bytes) : uint64_t(kDefaultFifoBytes);
    out.spin_us = o.spin_us < 0 ? 0 : (o.spin_us == 0 ? kDefaultSpinUs : o.spin_us);
    out.host_id = o.host_id != nullptr ? o.host_id : "";
    out.tcp_address = o.tcp_address != nullptr ? o.tcp_address : "";
    out.key_prefix = o.key_prefix != nullptr ? o.key_prefix : "mlopt";
    return MLOPT_OK;
}

mlopt_status check_rank(int32_t rank, int32_t nranks, mlopt_error* err) {
    if (nranks < 1) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "nranks=" + std::to_string(nranks) + ": a communicator needs at least one rank");
    }
    if (rank < 0 || rank >= nranks) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "rank=" + std::to_string(rank) + " is not in 0.." + std::to_string(nranks - 1));
    }
    return MLOPT_OK;
}

mlopt_status check_bootstrap(const mlopt_bootstrap* b, mlopt_error* err) {
    if (b == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "bootstrap is NULL");
    const size_t known = offsetof(mlopt_bootstrap, get) + sizeof(b->get);
    if (b->struct_size < known) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "bootstrap->struct_size=" + std::to_string(b->struct_size) + " is too small (sizeof(mlopt_bootstrap)=" +
                        std::to_string(sizeof(mlopt_bootstrap)) + ")");
    }
    if (b->set == nullptr || b->get == nullptr) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, std::string("bootstrap->") + (b->set ? "get" : "set") + " is NULL");
    }
    return MLOPT_OK;
}

// hostname + boot id + pid namespace: ranks that share memory and see each other's pids (needed for the
// liveness checks of the shared-memory transport). Containers with their own pid namespace talk over TCP.
std::string default_host_id() {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    std::string boot;
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::getline(file, boot);
    struct stat st {};
    const unsigned long long ns = ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    return std::string(name) + "/" + boot + "/pidns:" + std::to_string(ns);
}

// A few strings as one blob: "<size>:<bytes>" each.
std::string pack(const std::vector<std::string>& fields) {
    std::string out;
    for (const std::string& f : fields) out += std::to_string(f.size()) + ":" + f;
    return out;
}

bool unpack(const std::string& blob, size_t count, std::vector<std::string>& fields) {
    fields.clear();
    size_t at = 0;
    while (fields.size() < count) {
        const size_t colon = blob.find(':', at);
        if (colon == std::string::npos || colon == at || colon - at > 9) return false;
        size_t size = 0;
        for (size_t i = at; i < colon; ++i) {
            if (blob[i] < '0' || blob[i] > '9') return false;
            size = size * 10 + static_cast<size_t>(blob[i] - '0');
        }
        if (blob.size() - colon - 1 < size) return false;
        fields.push_back(blob.substr(colon + 1, size));
        at = colon + 1 + size;
    }
    return at == blob.size();
}

// What every rank publishes in the "join" all-gather.
struct RankInfo {
    std::string host_id;
    int64_t pid = 0;
    std::string shm_name;  // "" when the rank has no named segment
    uint64_t comm_id = 0;  // rank 0's is the communicator's
};

constexpr const char* kInfoVersion = "mlopt-comm-1";

std::string encode(const RankInfo& info) {
    return pack({kInfoVersion, info.host_id, std::to_string(info.pid), info.shm_name, std::to_string(info.comm_id)});
}

bool decode(const std::string& blob, RankInfo& info) {
    std::vector<std::string> f;
    if (!unpack(blob, 5, f) || f[0] != kInfoVersion) return false;
    info.host_id = f[1];
    info.shm_name = f[3];
    char* end = nullptr;
    info.pid = std::strtoll(f[2].c_str(), &end, 10);
    if (f[2].empty() || *end != '\0') return false;
    info.comm_id = std::strtoull(f[4].c_str(), &end, 10);
    return !f[4].empty() && *end == '\0';
}

// ------------------------------------------------------------------------------------------ MpTransport

// One rank's transport: each peer through shared memory ("self" too: the rank's own segment) or TCP.
class MpTransport final : public Transport {
public:
    MpTransport(int32_t rank, std::vector<PeerKind> kinds, std::unique_ptr<ShmTransport> shm,
                std::unique_ptr<TcpTransport> tcp)
        : rank_(rank), kinds_(std::move(kinds)), shm_(std::move(shm)), tcp_(std::move(tcp)) {}

    ~MpTransport() override {
        tcp_.reset();  // flushes what is queued for TCP peers, joins its thread
        shm_.reset();
    }

    int32_t rank() const override { return rank_; }
    int32_t nranks() const override { return static_cast<int32_t>(kinds_.size()); }

    const char* peer_kind(int32_t peer) const override {
        if (peer < 0 || peer >= nranks()) return nullptr;
        switch (kinds_[static_cast<size_t>(peer)]) {
            case PeerKind::self: return "self";
            case PeerKind::shm: return "shm";
            case PeerKind::tcp: return "tcp";
        }
        return nullptr;
    }

    TransportWait send_stream(int32_t peer, int32_t tag, SendStream** out, TransportClock::time_point deadline,
                              std::string& why) override {
        Transport* t = route(peer, why);
        return t == nullptr ? TransportWait::failed : t->send_stream(peer, tag, out, deadline, why);
    }

    TransportWait recv_stream(int32_t peer, int32_t tag, RecvStream** out, TransportClock::time_point deadline,
                              std::string& why) override {
        Transport* t = route(peer, why);
        return t == nullptr ? TransportWait::failed : t->recv_stream(peer, tag, out, deadline, why);
    }

    void abort(const std::string& reason) override {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!reason_.empty()) return;
            reason_ = reason.empty() ? std::string("aborted") : reason;
        }
        shm_->abort(reason_);
        if (tcp_) tcp_->abort(reason_);
    }

    std::string aborted() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return reason_;
    }

private:
    Transport* route(int32_t peer, std::string& why) const {
        if (peer < 0 || peer >= nranks()) {
            why = "peer " + std::to_string(peer) + " is not a rank of the communicator (0.." +
                  std::to_string(nranks() - 1) + ")";
            return nullptr;
        }
        if (kinds_[static_cast<size_t>(peer)] == PeerKind::tcp) return tcp_.get();
        return shm_.get();
    }

    int32_t rank_;
    std::vector<PeerKind> kinds_;
    std::unique_ptr<ShmTransport> shm_;  // always: it carries the rank's streams to itself
    std::unique_ptr<TcpTransport> tcp_;  // when some peer is reached over TCP
    mutable std::mutex mutex_;
    std::string reason_;
};

// ------------------------------------------------------------------------------------------ create

// One rank's create in progress. Members are released on failure by their destructors (the shm name with
// the ShmTransport, sockets and threads with the TcpTransport).
class Creator {
public:
    Creator(int32_t rank, int32_t nranks, const mlopt_bootstrap& store, const CommOptions& options)
        : rank_(rank),
          nranks_(nranks),
          options_(options),
          channel_(store, options.key_prefix, rank, nranks, options.init_timeout_ms),
          deadline_(BootstrapClock::now() + std::chrono::milliseconds(options.init_timeout_ms)) {}

    mlopt_status run(std::unique_ptr<MpTransport>& out, std::string& why);

private:
    mlopt_status make_segment(std::string& why);
    mlopt_status join(std::string& why);
    mlopt_status choose_kinds(std::string& why);
    mlopt_status connect_shm(std::string& why);
    mlopt_status connect_tcp(std::string& why);

    int32_t rank_;
    int32_t nranks_;
    CommOptions options_;
    BootstrapChannel channel_;
    BootstrapClock::time_point deadline_;
    std::string host_id_;
    std::unique_ptr<ShmTransport> shm_;
    std::unique_ptr<TcpTransport> tcp_;
    std::vector<RankInfo> infos_;
    std::vector<PeerKind> kinds_;
};

mlopt_status Creator::make_segment(std::string& why) {
    ShmConfig config;
    config.fifo_bytes = options_.fifo_bytes;
    config.spin_us = options_.spin_us;
    if (options_.transport != MLOPT_TRANSPORT_TCP && nranks_ > 1) {
        shm_ = ShmTransport::create(rank_, nranks_, config, true, why);
        if (shm_) return MLOPT_OK;
        // AUTO: a rank without a named segment talks to every peer over TCP (the peers see its empty name).
        if (options_.transport == MLOPT_TRANSPORT_SHM) return MLOPT_ERR_IO;
    }
    shm_ = ShmTransport::create(rank_, nranks_, config, false, why);
    return shm_ ? MLOPT_OK : MLOPT_ERR_NO_MEMORY;
}

mlopt_status Creator::join(std::string& why) {
    RankInfo mine;
    mine.host_id = options_.host_id.empty() ? default_host_id() : options_.host_id;
    host_id_ = mine.host_id;
    mine.pid = ::getpid();
    mine.shm_name = shm_->name();
    std::random_device device;
    mine.comm_id = (uint64_t(device()) << 32) ^ device() ^ uint64_t(BootstrapClock::now().time_since_epoch().count());
    std::vector<std::string> blobs;
    if (!channel_.all_gather("info", encode(mine), "join", deadline_, blobs, why)) return MLOPT_ERR_IO;
    infos_.resize(static_cast<size_t>(nranks_));
    for (int32_t r = 0; r < nranks_; ++r) {
        if (!decode(blobs[static_cast<size_t>(r)], infos_[static_cast<size_t>(r)])) {
            why = "rank " + std::to_string(r) + "'s rendezvous record \"" + options_.key_prefix + "/info/" +
                  std::to_string(r) + "\" is not from this mlopt version (or the key prefix is shared)";
            return MLOPT_ERR_IO;
        }
    }
    return MLOPT_OK;
}

mlopt_status Creator::choose_kinds(std::string& why) {
    // Every rank decides from the same records: the choice is symmetric and the errors the same everywhere.
    if (options_.transport == MLOPT_TRANSPORT_SHM) {
        for (int32_t r = 1; r < nranks_; ++r) {
            if (infos_[static_cast<size_t>(r)].host_id != infos_[0].host_id) {
                why = "MLOPT_TRANSPORT_SHM needs every rank on one host: rank 0 is on host \"" + infos_[0].host_id +
                      "\", rank " + std::to_string(r) + " on \"" + infos_[static_cast<size_t>(r)].host_id + "\"";
                return MLOPT_ERR_UNSUPPORTED;
            }
        }
    }
    kinds_.assign(static_cast<size_t>(nranks_), PeerKind::tcp);
    const RankInfo& me = infos_[static_cast<size_t>(rank_)];
    for (int32_t r = 0; r < nranks_; ++r) {
        const RankInfo& peer = infos_[static_cast<size_t>(r)];
        if (r == rank_) {
            kinds_[static_cast<size_t>(r)] = PeerKind::self;
        } else if (options_.transport != MLOPT_TRANSPORT_TCP && peer.host_id == me.host_id &&
                   !peer.shm_name.empty() && !me.shm_name.empty()) {
            kinds_[static_cast<size_t>(r)] = PeerKind::shm;
        }
    }
    return MLOPT_OK;
}

mlopt_status Creator::connect_shm(std::string& why) {
    for (int32_t r = 0; r < nranks_; ++r) {
        if (kinds_[static_cast<size_t>(r)] != PeerKind::shm) continue;
        const RankInfo& peer = infos_[static_cast<size_t>(r)];
        if (!shm_->attach(r, peer.shm_name, peer.pid, why)) return MLOPT_ERR_IO;
    }
    return MLOPT_OK;
}

mlopt_status Creator::connect_tcp(std::string& why) {
    // Whether ANY pair uses TCP: every rank must take part in the all-gather, or none.
    bool any_tcp = false;
    for (int32_t a = 0; a < nranks_ && !any_tcp; ++a) {
        for (int32_t b = a + 1; b < nranks_ && !any_tcp; ++b) {
            const RankInfo& x = infos_[static_cast<size_t>(a)];
            const RankInfo& y = infos_[static_cast<size_t>(b)];
            any_tcp = options_.transport == MLOPT_TRANSPORT_TCP || x.host_id != y.host_id || x.shm_name.empty() ||
                      y.shm_name.empty();
        }
    }
    if (!any_tcp) return MLOPT_OK;
    const bool mine = std::find(kinds_.begin(), kinds_.end(), PeerKind::tcp) != kinds_.end();
    std::string address;
    if (mine) {
        std::string host = options_.tcp_address;
        if (host.empty()) {
            const bool one_host = std::all_of(infos_.begin(), infos_.end(),
                                              [&](const RankInfo& i) { return i.host_id == host_id_; });
            char name[256] = "localhost";
            gethostname(name, sizeof name - 1);
            host = one_host ? "127.0.0.1" : name;
        }
        tcp_ = TcpTransport::listen(rank_, nranks_, host, why);
        if (!tcp_) return MLOPT_ERR_IO;
        address = tcp_->address();
    }
    std::vector<std::string> addresses;
    if (!channel_.all_gather("tcp", address, "publish a TCP address", deadline_, addresses, why)) return MLOPT_ERR_IO;
    if (!mine) return MLOPT_OK;
    for (int32_t r = 0; r < nranks_; ++r) {
        if (kinds_[static_cast<size_t>(r)] != PeerKind::tcp) addresses[static_cast<size_t>(r)].clear();
    }
    return tcp_->start(infos_[0].comm_id, addresses, why) ? MLOPT_OK : MLOPT_ERR_INTERNAL;
}

mlopt_status Creator::run(std::unique_ptr<MpTransport>& out, std::string& why) {
    mlopt_status status = make_segment(why);
    if (status != MLOPT_OK) {
        channel_.publish_failure(why);
        return status;
    }
    status = join(why);
    if (status == MLOPT_OK) status = choose_kinds(why);
    if (status == MLOPT_OK) status = connect_shm(why);
    if (status == MLOPT_OK) status = connect_tcp(why);
    if (status == MLOPT_OK && !channel_.barrier("ready", "finish connecting", deadline_, why)) status = MLOPT_ERR_IO;
    if (status != MLOPT_OK) {
        channel_.publish_failure(why);
        return status;  // ~ShmTransport unlinks the segment's name
    }
    // Every peer has mapped this rank's segment: no name is left behind, even if this process is killed now.
    shm_->unlink();
    out = std::make_unique<MpTransport>(rank_, std::move(kinds_), std::move(shm_), std::move(tcp_));
    return MLOPT_OK;
}

mlopt_status create_checked(int32_t rank, int32_t nranks, const mlopt_bootstrap& store, const CommOptions& options,
                            mlopt_comm* out, mlopt_error* err) {
    std::string why;
    std::unique_ptr<MpTransport> transport;
    Creator creator(rank, nranks, store, options);
    const mlopt_status status = creator.run(transport, why);
    if (status != MLOPT_OK) return fail(err, status, why);
    auto* comm = new mlopt_comm_s;
    comm->nranks = nranks;
    comm->rank = rank;
    comm->transport = std::move(transport);
    *out = comm;
    return succeed(err);
}

mlopt_status create_tcp_checked(const char* address, int32_t rank, int32_t nranks, const CommOptions& options,
                                mlopt_comm* out, mlopt_error* err) {
    const auto deadline = BootstrapClock::now() + std::chrono::milliseconds(options.init_timeout_ms);
    std::string why;
    TcpStoreServer server;
    if (rank == 0 && !server.start(address, why)) return fail(err, MLOPT_ERR_IO, why);
    // Rank 0 reaches its own server like the others; a wildcard listening address is reached through loopback.
    std::string target = address;
    if (target.compare(0, 8, "0.0.0.0:") == 0) target = "127.0.0.1:" + target.substr(8);
    TcpStoreClient client;
    if (!client.connect(target, deadline, options.init_timeout_ms, why)) {
        return fail(err, MLOPT_ERR_IO, "rank " + std::to_string(rank) + ": " + why);
    }
    const mlopt_bootstrap store = client.bootstrap();
    mlopt_error inner = nullptr;
    mlopt_status status = create_checked(rank, nranks, store, options, out, &inner);
    client.bye();
    if (status == MLOPT_OK) {
        // The server may stop only when no rank still needs it (the last ones may still read the barrier).
        if (rank == 0) server.wait_for_byes(nranks, std::max(deadline, BootstrapClock::now() + kByeWait));
        mlopt_error_free(inner);
        return succeed(err);
    }
    // The others learn of this failure from the store: keep serving them a moment before they lose it.
    if (rank == 0) server.wait_for_byes(nranks, BootstrapClock::now() + kFailureLinger);
    // A broken connection to the server is the root cause of whatever the store's failure looked like.
    std::string message = inner != nullptr ? inner->message : std::string("mlopt_comm_create_tcp failed");
    if (!client.failure().empty()) message = "rank " + std::to_string(rank) + " " + client.failure();
    mlopt_error_free(inner);
    return fail(err, status, message);
}

}  // namespace
}  // namespace mlopt

extern "C" {

MLOPT_API void mlopt_comm_options_init(mlopt_comm_options* options) {
    if (options == nullptr) return;
    std::memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->transport = MLOPT_TRANSPORT_AUTO;
    options->init_timeout_ms = mlopt::kDefaultInitTimeoutMs;
    options->shm_fifo_bytes = mlopt::kDefaultFifoBytes;
    options->spin_us = mlopt::kDefaultSpinUs;
    options->host_id = nullptr;
    options->tcp_address = nullptr;
    options->key_prefix = nullptr;
}

MLOPT_API mlopt_status mlopt_comm_create(int32_t rank, int32_t nranks, const mlopt_bootstrap* bootstrap,
                                         const mlopt_comm_options* options, mlopt_comm* out, mlopt_error* err) {
    try {
        if (out == nullptr) return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT, "out is NULL");
        *out = nullptr;
        mlopt_status status = mlopt::check_rank(rank, nranks, err);
        if (status == MLOPT_OK) status = mlopt::check_bootstrap(bootstrap, err);
        mlopt::CommOptions opts;
        if (status == MLOPT_OK) status = mlopt::read_comm_options(options, opts, err);
        if (status != MLOPT_OK) return status;
        return mlopt::create_checked(rank, nranks, *bootstrap, opts, out, err);
    } catch (const std::bad_alloc&) {
        return mlopt::fail(err, MLOPT_ERR_NO_MEMORY, "out of memory in mlopt_comm_create");
    } catch (...) {
        return mlopt::fail(err, MLOPT_ERR_INTERNAL, "unexpected error in mlopt_comm_create");
    }
}

MLOPT_API mlopt_status mlopt_comm_create_tcp(const char* address, int32_t rank, int32_t nranks,
                                             const mlopt_comm_options* options, mlopt_comm* out, mlopt_error* err) {
    try {
        if (out == nullptr) return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT, "out is NULL");
        *out = nullptr;
        if (address == nullptr) return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT, "address is NULL");
        mlopt_status status = mlopt::check_rank(rank, nranks, err);
        mlopt::CommOptions opts;
        if (status == MLOPT_OK) status = mlopt::read_comm_options(options, opts, err);
        if (status != MLOPT_OK) return status;
        return mlopt::create_tcp_checked(address, rank, nranks, opts, out, err);
    } catch (const std::bad_alloc&) {
        return mlopt::fail(err, MLOPT_ERR_NO_MEMORY, "out of memory in mlopt_comm_create_tcp");
    } catch (...) {
        return mlopt::fail(err, MLOPT_ERR_INTERNAL, "unexpected error in mlopt_comm_create_tcp");
    }
}

MLOPT_API int32_t mlopt_comm_rank(const mlopt_comm_s* comm) { return comm != nullptr ? comm->rank : -1; }

MLOPT_API const char* mlopt_comm_peer_transport(const mlopt_comm_s* comm, int32_t peer) {
    if (comm == nullptr || peer < 0 || peer >= comm->nranks) return nullptr;
    if (!comm->transport) return "local";
    return comm->transport->peer_kind(peer);
}

}  // extern "C"

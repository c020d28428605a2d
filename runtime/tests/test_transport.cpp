// Tests of the multi-process transports (src/transport_shm.*, src/transport_tcp.*, src/bootstrap.*,
// src/comm_mp.cpp): every rank is a child process forked by this test (the parent never starts a thread, so
// forking stays safe), rendezvousing through mlopt_comm_create_tcp or through a file store in a temporary
// directory (mlopt_comm_create). Ranks drive their communicator's streams directly (comm->transport).
//
// Covered for the shared-memory and the (forced) TCP transport: bytes arrive in order across ring wrap-around
// with random reserve/commit/peek/consume sizes (64 MiB through a 64 KiB FIFO), many tags and peers at once,
// streams to self; a peer killed with SIGKILL mid-stream makes the blocked reader and writer fail within ~1 s
// naming it; a peer's abort reason reaches the others; a rank that never joins makes create fail after
// init_timeout_ms naming it; mixed hosts (shm + tcp in one communicator); argument errors. At the end no
// /dev/shm name of any rank's process is left (the SIGKILL case included), and a stale name of a dead process
// is removed by the next create.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "comm.hpp"
#include "mlopt/mlopt.h"
#include "plans.hpp"
#include "transport.hpp"
#include "transport_shm.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using mlopt::RecvStream;
using mlopt::SendStream;
using mlopt::Transport;
using mlopt::TransportWait;
using mlopt_test::kAllreduce2;

// ------------------------------------------------------------------------------------------ processes

// Memory shared by the parent and every child (mapped before the first fork).
struct Shared {
    std::atomic<int64_t> killed_at_ns;  // steady_clock (system-wide monotonic) when the victim killed itself
};
Shared* g_shared = nullptr;
std::vector<pid_t> g_all_children;  // every rank process ever forked (for the /dev/shm check)

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// Forks one child per rank running body(rank) (its return value is the exit code), waits up to timeout_s and
// kills stragglers. Returns each rank's wait status (-1: had to be killed).
std::vector<int> run_ranks(int nranks, const std::function<int(int)>& body, int timeout_s = 40) {
    std::vector<pid_t> pids;
    for (int r = 0; r < nranks; ++r) {
        std::fflush(nullptr);
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(static_cast<unsigned>(timeout_s));  // safety net: a stuck child dies by itself
            check::failures() = 0;  // the parent's counts are not this rank's
            check::checks() = 0;
            const int rc = body(r);
            std::fflush(nullptr);
            std::exit(rc);
        }
        if (pid < 0) {
            std::perror("fork");
            std::exit(1);
        }
        pids.push_back(pid);
        g_all_children.push_back(pid);
    }
    std::vector<int> statuses(static_cast<size_t>(nranks), -1);
    std::vector<bool> done(static_cast<size_t>(nranks), false);
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s + 5);
    size_t left = pids.size();
    while (left > 0 && Clock::now() < deadline) {
        for (size_t i = 0; i < pids.size(); ++i) {
            int status = 0;
            if (!done[i] && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                done[i] = true;
                statuses[i] = status;
                --left;
            }
        }
        if (left > 0) usleep(5000);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        std::fprintf(stderr, "rank %zu (pid %d) did not finish: killed\n", i, static_cast<int>(pids[i]));
        kill(pids[i], SIGKILL);
        waitpid(pids[i], nullptr, 0);
    }
    return statuses;
}

bool exited_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// A loopback port nobody listens on right now (the rendezvous of one scenario). Chosen below the ephemeral range:
// the transports' listeners (port 0) of tests running beside this one cannot take it between now and the bind.
std::string free_address() {
    static std::mt19937 rng(static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(now_ns()));
    int low = 32768;
    if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
        if (std::fscanf(f, "%d", &low) != 1) low = 32768;
        std::fclose(f);
    }
    const int first = 10000, span = std::max(1000, low - first);
    for (int attempt = 0; attempt < 200; ++attempt) {
        const int port = first + static_cast<int>(rng() % static_cast<unsigned>(span));
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(port));
        const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        close(fd);
        if (free) return "127.0.0.1:" + std::to_string(port);
    }
    std::fprintf(stderr, "no free loopback port\n");
    std::exit(1);
}

// /dev/shm names of process `pid`'s segments.
std::vector<std::string> shm_names_of(pid_t pid) {
    std::vector<std::string> found;
    const std::string prefix = mlopt::shm_name_prefix(pid);
    if (DIR* dir = opendir("/dev/shm")) {
        while (const dirent* e = readdir(dir)) {
            if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(e->d_name);
        }
        closedir(dir);
    }
    return found;
}

// What a process holds that a communicator must give back when freed.
struct Resources {
    int fds = 0;
    int threads = 0;
    int shm_mappings = 0;  // /proc/self/maps lines of mlopt segments
};

int count_entries(const char* dir_path) {
    int n = 0;
    if (DIR* dir = opendir(dir_path)) {
        while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
        closedir(dir);
    }
    return n;
}

Resources resources() {
    Resources r;
    r.fds = count_entries("/proc/self/fd") - 1;  // minus the directory being read
    r.threads = count_entries("/proc/self/task");
    if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
        char line[4096];
        // The segments' path, not any "/mlopt-" (pytest builds this binary under .../mlopt-runtime/...).
        while (std::fgets(line, sizeof line, maps) != nullptr) r.shm_mappings += std::strstr(line, "/dev/shm/mlopt-") != nullptr;
        std::fclose(maps);
    }
    return r;
}

void check_released(const Resources& before) {
    const Resources after = resources();
    CHECK_EQ(after.fds, before.fds);
    CHECK_EQ(after.threads, before.threads);
    CHECK_EQ(after.shm_mappings, 0);
}

// ------------------------------------------------------------------------------------------ file store

// A bootstrap store in a directory: one file per key, written to a temporary name and renamed into place, so a
// reader sees either nothing or the whole value.
struct FileStore {
    std::string dir;
};

std::string key_path(const FileStore& s, const char* key) {
    std::string name;
    for (const char* p = key; *p != '\0'; ++p) name += (*p == '/') ? std::string("%2F") : std::string(1, *p);
    return s.dir + "/" + name;
}

int file_set(void* ctx, const char* key, const void* value, size_t size) {
    const auto& s = *static_cast<FileStore*>(ctx);
    const std::string path = key_path(s, key);
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return 2;
    const bool ok = std::fwrite(value, 1, size, f) == size;
    if (std::fclose(f) != 0 || !ok) return 2;
    return std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : 2;
}

int file_get(void* ctx, const char* key, void* value, size_t capacity, size_t* size, int32_t timeout_ms) {
    const auto& s = *static_cast<FileStore*>(ctx);
    const std::string path = key_path(s, key);
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        if (FILE* f = std::fopen(path.c_str(), "rb")) {
            std::string bytes;
            char buffer[4096];
            size_t n = 0;
            while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.append(buffer, n);
            std::fclose(f);
            std::memcpy(value, bytes.data(), std::min(capacity, bytes.size()));
            *size = bytes.size();
            return 0;
        }
        if (Clock::now() >= deadline) return 1;
        usleep(1000);
    }
}

mlopt_bootstrap file_bootstrap(FileStore& store) {
    mlopt_bootstrap b{};
    b.struct_size = sizeof b;
    b.ctx = &store;
    b.set = file_set;
    b.get = file_get;
    return b;
}

std::string make_temp_dir() {
    char path[] = "/tmp/mlopt-test-transport-XXXXXX";
    if (mkdtemp(path) == nullptr) {
        std::perror("mkdtemp");
        std::exit(1);
    }
    return path;
}

void remove_dir(const std::string& dir) {
    if (DIR* d = opendir(dir.c_str())) {
        while (const dirent* e = readdir(d)) {
            if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
                unlink((dir + "/" + e->d_name).c_str());
            }
        }
        closedir(d);
    }
    rmdir(dir.c_str());
}

// ------------------------------------------------------------------------------------------ streams

constexpr size_t kPatternPeriod = 1000003;  // prime: no chunk size lines up with it
constexpr size_t kMaxChunk = 256 << 10;

// Stream byte i of stream `seed` is pattern[(i + seed) % kPatternPeriod]; the buffer repeats its start so that
// any chunk up to kMaxChunk is one contiguous piece of it.
const std::vector<unsigned char>& pattern() {
    static const std::vector<unsigned char> bytes = [] {
        std::vector<unsigned char> b(kPatternPeriod + kMaxChunk);
        std::mt19937_64 rng(12345);
        for (size_t i = 0; i < kPatternPeriod; ++i) b[i] = static_cast<unsigned char>(rng());
        std::copy(b.begin(), b.begin() + kMaxChunk, b.begin() + kPatternPeriod);
        return b;
    }();
    return bytes;
}

const unsigned char* pattern_at(uint64_t seed, uint64_t offset) {
    return pattern().data() + (offset + seed) % kPatternPeriod;
}

uint64_t stream_seed(int sender, int receiver, int tag) { return uint64_t(sender) * 7919 + uint64_t(receiver) * 104729 + uint64_t(tag) * 31; }

// Failures seen by the threads of one rank, checked by its main thread (check.hpp is not thread-safe).
struct Errors {
    std::mutex mutex;
    std::vector<std::string> list;
    void add(const std::string& e) {
        std::lock_guard<std::mutex> lock(mutex);
        list.push_back(e);
    }
};

std::string label(const char* what, int sender, int receiver, int tag) {
    return std::string(what) + " " + std::to_string(sender) + "->" + std::to_string(receiver) + " tag " +
           std::to_string(tag);
}

// Writes `total` pattern bytes with random reserve sizes and random partial commits.
void send_pattern(Transport& t, int peer, int tag, uint64_t total, uint64_t rng_seed, Errors& errors) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    const std::string what = label("send", t.rank(), peer, tag);
    std::string why;
    SendStream* s = nullptr;
    if (t.send_stream(peer, tag, &s, deadline, why) != TransportWait::ok) return errors.add(what + ": " + why);
    std::mt19937_64 rng(rng_seed);
    const uint64_t seed = stream_seed(t.rank(), peer, tag);
    for (uint64_t sent = 0; sent < total;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(1 + rng() % kMaxChunk, total - sent));
        std::byte* data = nullptr;
        size_t size = 0;
        if (s->reserve(want, &data, &size, deadline, why) != TransportWait::ok) return errors.add(what + ": " + why);
        if (size == 0 || size > want) return errors.add(what + ": reserve gave " + std::to_string(size) + " bytes");
        const size_t n = (rng() % 4 == 0) ? 1 + static_cast<size_t>(rng() % size) : size;
        std::memcpy(data, pattern_at(seed, sent), n);
        if (s->commit(n, why) != TransportWait::ok) return errors.add(what + ": " + why);
        sent += n;
    }
}

// Reads `total` bytes with random peek sizes and partial consumes, comparing them with the pattern.
void recv_pattern(Transport& t, int peer, int tag, uint64_t total, uint64_t rng_seed, Errors& errors) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    const std::string what = label("recv", peer, t.rank(), tag);
    std::string why;
    RecvStream* s = nullptr;
    if (t.recv_stream(peer, tag, &s, deadline, why) != TransportWait::ok) return errors.add(what + ": " + why);
    std::mt19937_64 rng(rng_seed);
    const uint64_t seed = stream_seed(peer, t.rank(), tag);
    for (uint64_t got = 0; got < total;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(1 + rng() % kMaxChunk, total - got));
        const std::byte* data = nullptr;
        size_t size = 0;
        if (s->peek(want, &data, &size, deadline, why) != TransportWait::ok) return errors.add(what + ": " + why);
        if (size == 0 || size > want) return errors.add(what + ": peek gave " + std::to_string(size) + " bytes");
        const size_t n = (rng() % 4 == 0) ? 1 + static_cast<size_t>(rng() % size) : size;
        if (std::memcmp(data, pattern_at(seed, got), n) != 0) {
            return errors.add(what + ": wrong bytes at offset " + std::to_string(got));
        }
        s->consume(n);
        got += n;
    }
}

// ------------------------------------------------------------------------------------------ communicators

mlopt_comm_options comm_options(mlopt_transport transport, int32_t init_timeout_ms = 10000) {
    mlopt_comm_options o;
    mlopt_comm_options_init(&o);
    o.transport = transport;
    o.init_timeout_ms = init_timeout_ms;
    o.shm_fifo_bytes = 64 << 10;
    return o;
}

// Creates this rank's communicator over mlopt's TCP rendezvous; NULL (and a failed check) on error.
mlopt_comm create_tcp(const std::string& address, int rank, int nranks, const mlopt_comm_options& o) {
    mlopt_comm comm = nullptr;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_comm_create_tcp(address.c_str(), rank, nranks, &o, &comm, &err);
    if (!CHECK_EQ(status, MLOPT_OK)) {
        std::fprintf(stderr, "[rank %d] mlopt_comm_create_tcp: %s\n", rank, err ? mlopt_error_message(err) : "?");
    }
    mlopt_error_free(err);
    return comm;
}

const char* kind_name(mlopt_transport t) { return t == MLOPT_TRANSPORT_SHM ? "shm" : "tcp"; }

int finish_rank(int rank) {
    if (check::failures() != 0) std::fprintf(stderr, "[rank %d] %d check(s) failed\n", rank, check::failures());
    return check::failures() == 0 ? 0 : 1;
}

// ------------------------------------------------------------------------------------------ scenarios

// 3 ranks: 64 MiB 0->1 through a 64 KiB FIFO; 5 tags (0, 1, 63, 64, 4095) between every ordered pair; a stream
// to self. Every stream has its own thread on both ends.
int streams_rank(int rank, const std::string& address, mlopt_transport kind) {
    const Resources before = resources();
    mlopt_comm comm = create_tcp(address, rank, 3, comm_options(kind));
    if (comm == nullptr) return 1;
    CHECK_EQ(mlopt_comm_rank(comm), rank);
    CHECK_EQ(std::string(mlopt_comm_peer_transport(comm, rank)), "self");
    CHECK_EQ(std::string(mlopt_comm_peer_transport(comm, (rank + 1) % 3)), kind_name(kind));
    CHECK(mlopt_comm_peer_transport(comm, 3) == nullptr);
    CHECK(shm_names_of(getpid()).empty());  // unlinked before create returned
    Transport& t = *comm->transport;
    Errors errors;
    std::vector<std::thread> threads;
    const uint64_t big = 64ull << 20;
    if (rank == 0) threads.emplace_back([&] { send_pattern(t, 1, 7, big, 1, errors); });
    if (rank == 1) threads.emplace_back([&] { recv_pattern(t, 0, 7, big, 2, errors); });
    const int tags[] = {0, 1, 63, 64, mlopt::kMaxTags - 1};
    for (int peer = 0; peer < 3; ++peer) {
        if (peer == rank) continue;
        for (int tag : tags) {
            const uint64_t bytes = (1u << 20) + uint64_t(tag) * 97 + uint64_t(peer) * 13;
            threads.emplace_back([&, peer, tag, bytes] { send_pattern(t, peer, tag, bytes, 10 + tag, errors); });
            const uint64_t in_bytes = (1u << 20) + uint64_t(tag) * 97 + uint64_t(rank) * 13;
            threads.emplace_back([&, peer, tag, in_bytes] { recv_pattern(t, peer, tag, in_bytes, 20 + tag, errors); });
        }
    }
    if (rank == 2) {
        threads.emplace_back([&] { send_pattern(t, 2, 3, 3u << 20, 5, errors); });
        threads.emplace_back([&] { recv_pattern(t, 2, 3, 3u << 20, 6, errors); });
    }
    for (std::thread& th : threads) th.join();
    for (const std::string& e : errors.list) CHECK_EQ(e, "");
    CHECK_EQ(t.aborted(), "");
    CHECK(resources().shm_mappings > 0 || kind == MLOPT_TRANSPORT_TCP);
    mlopt_comm_free(comm);
    check_released(before);  // no fd, thread or mapping outlives the communicator
    return finish_rank(rank);
}

void test_streams(mlopt_transport kind) {
    const auto start = Clock::now();
    const std::string address = free_address();
    const std::vector<int> st = run_ranks(3, [&](int r) { return streams_rank(r, address, kind); });
    for (int s : st) CHECK(exited_ok(s));
    std::printf("  streams over %s: %.2f s\n", kind_name(kind), seconds_since(start));
}

// Rank 1 reads a little of 0->1, writes a little of 1->0, then SIGKILLs itself. Rank 0's writer (blocked on a
// full FIFO) and reader (blocked on an empty one) must fail within ~1 s naming rank 1.
int kill_rank(int rank, const std::string& address, mlopt_transport kind) {
    mlopt_comm comm = create_tcp(address, rank, 2, comm_options(kind));
    if (comm == nullptr) return 1;
    Transport& t = *comm->transport;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    std::string why;
    const size_t some = 100 << 10;
    if (rank == 1) {
        Errors errors;
        recv_pattern(t, 0, 1, some, 3, errors);
        send_pattern(t, 0, 2, some, 4, errors);
        usleep(200 * 1000);  // rank 0's threads are blocked by now
        g_shared->killed_at_ns.store(now_ns());
        raise(SIGKILL);
    }
    std::string writer_why, reader_why;
    int64_t writer_ns = 0, reader_ns = 0;
    std::thread writer([&] {
        SendStream* s = nullptr;
        std::string w;
        if (t.send_stream(1, 1, &s, deadline, w) != TransportWait::ok) return void(writer_why = "open: " + w);
        for (uint64_t sent = 0;;) {
            std::byte* data = nullptr;
            size_t size = 0;
            const TransportWait r = s->reserve(kMaxChunk, &data, &size, deadline, w);
            if (r == TransportWait::ok) {
                std::memcpy(data, pattern_at(stream_seed(0, 1, 1), sent), size);
                if (s->commit(size, w) == TransportWait::ok) {
                    sent += size;
                    continue;
                }
            }
            writer_ns = now_ns();
            writer_why = (r == TransportWait::timeout ? "timeout: " : "") + w;
            return;
        }
    });
    std::thread reader([&] {
        Errors errors;
        recv_pattern(t, 1, 2, some, 4, errors);
        if (!errors.list.empty()) return void(reader_why = "data: " + errors.list[0]);
        RecvStream* s = nullptr;
        const std::byte* data = nullptr;
        size_t size = 0;
        std::string w;
        t.recv_stream(1, 2, &s, deadline, w);
        const TransportWait r = s->peek(1, &data, &size, deadline, w);
        reader_ns = now_ns();
        reader_why = (r == TransportWait::failed ? "" : "not failed: ") + w;
    });
    writer.join();
    reader.join();
    const int64_t killed = g_shared->killed_at_ns.load();
    CHECK(killed != 0);
    CHECK_CONTAINS(writer_why, "rank 1");
    CHECK_CONTAINS(reader_why, "rank 1");
    const double writer_s = (writer_ns - killed) / 1e9, reader_s = (reader_ns - killed) / 1e9;
    CHECK(writer_s < 1.5);
    CHECK(reader_s < 1.5);
    std::printf("  kill over %s: writer failed after %.3f s (\"%s\"), reader after %.3f s (\"%s\")\n",
                kind_name(kind), writer_s, writer_why.c_str(), reader_s, reader_why.c_str());
    mlopt_comm_free(comm);
    return finish_rank(rank);
}

void test_kill(mlopt_transport kind) {
    g_shared->killed_at_ns.store(0);
    const std::string address = free_address();
    const std::vector<int> st = run_ranks(2, [&](int r) { return kill_rank(r, address, kind); });
    CHECK(exited_ok(st[0]));
    CHECK(st[1] != -1 && WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
}

// Rank 1 sends 10 bytes, then aborts with a reason: rank 0's reader of that stream and of a stream rank 1
// never opened fail with "rank 1 failed: <reason>"; rank 1's own waits fail with its reason.
int abort_rank(int rank, const std::string& address, mlopt_transport kind) {
    const Resources before = resources();
    mlopt_comm comm = create_tcp(address, rank, 2, comm_options(kind));
    if (comm == nullptr) return 1;
    Transport& t = *comm->transport;
    const std::string reason = "disk on fire at step 7";
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    std::string why;
    if (rank == 1) {
        Errors errors;
        send_pattern(t, 0, 5, 10, 1, errors);
        CHECK(errors.list.empty());
        usleep(300 * 1000);  // rank 0 waits for more by now
        const auto start = Clock::now();
        t.abort(reason);
        t.abort("a second reason is ignored");
        CHECK(seconds_since(start) < 1.0);
        CHECK_EQ(t.aborted(), reason);
        RecvStream* s = nullptr;
        CHECK(t.recv_stream(0, 5, &s, deadline, why) == TransportWait::failed);
        CHECK_CONTAINS(why, reason);
        usleep(300 * 1000);
        mlopt_comm_free(comm);
        check_released(before);
        return finish_rank(rank);
    }
    Errors errors;
    recv_pattern(t, 1, 5, 10, 2, errors);
    CHECK(errors.list.empty());
    RecvStream* s = nullptr;
    const std::byte* data = nullptr;
    size_t size = 0;
    CHECK(t.recv_stream(1, 5, &s, deadline, why) == TransportWait::ok);
    const auto start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    CHECK(s->peek(1, &data, &size, deadline, why) == TransportWait::failed);
    const double waited = seconds_since(start), cpu = thread_cpu_seconds() - cpu_start;
    CHECK_CONTAINS(why, "rank 1 failed: " + reason);
    CHECK(waited < 1.5);
    CHECK(cpu < 0.05 + 0.05 * waited);  // it slept (futex, poll), it did not spin
    std::printf("  abort over %s after %.3f s (%.4f s of CPU while waiting): \"%s\"\n", kind_name(kind), waited, cpu,
                why.c_str());
    // A stream rank 1 never opened: over TCP the wait for its connection ends with the note.
    RecvStream* unopened = nullptr;
    const TransportWait w = t.recv_stream(1, 9, &unopened, deadline, why);
    if (w == TransportWait::ok) {
        CHECK(unopened->peek(1, &data, &size, deadline, why) == TransportWait::failed);
    } else {
        CHECK(w == TransportWait::failed);
    }
    CHECK_CONTAINS(why, reason);
    if (kind == MLOPT_TRANSPORT_TCP) {  // a new connection to the aborted rank fails with its reason too
        SendStream* late = nullptr;
        CHECK(t.send_stream(1, 12, &late, deadline, why) == TransportWait::failed);
        CHECK_CONTAINS(why, "rank 1 failed: " + reason);
    }
    mlopt_comm_free(comm);
    check_released(before);
    return finish_rank(rank);
}

void test_abort(mlopt_transport kind) {
    const std::string address = free_address();
    const std::vector<int> st = run_ranks(2, [&](int r) { return abort_rank(r, address, kind); });
    for (int s : st) CHECK(exited_ok(s));
}

// The rank engine over these transports: a 2-rank allreduce (kAllreduce2) with mlopt_comm_run_rank, several runs
// in a row.
int run_rank_rank(int rank, const std::string& address, mlopt_transport kind) {
    mlopt_comm_options o = comm_options(kind);
    o.shm_fifo_bytes = 0;  // the default (4 MiB): each rank sends its whole slice before it reads
    mlopt_comm comm = create_tcp(address, rank, 2, o);
    if (comm == nullptr) return 1;
    mlopt_plan plan = nullptr;
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_plan_load_memory(kAllreduce2, std::strlen(kAllreduce2), "ar2.xml", &plan, &err), MLOPT_OK);
    mlopt_error_free(err);
    if (plan == nullptr) return 1;
    const size_t count = 1 << 18;
    std::vector<float> in(count), out(count);
    for (int run = 0; run < 3; ++run) {
        for (size_t i = 0; i < count; ++i) in[i] = float((rank + 1) * (run + 1)) + float(i % 7);
        mlopt_run_options ro;
        mlopt_run_options_init(&ro);
        ro.chunk_bytes = run == 2 ? 32 << 10 : 0;  // the last run in many loop iterations
        err = nullptr;
        if (!CHECK_EQ(mlopt_comm_run_rank(comm, plan, in.data(), out.data(), count, MLOPT_FLOAT32, MLOPT_SUM, &ro,
                                          &err),
                      MLOPT_OK)) {
            std::fprintf(stderr, "[rank %d] run %d: %s\n", rank, run, err ? mlopt_error_message(err) : "?");
        }
        mlopt_error_free(err);
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += out[i] != float(3 * (run + 1)) + 2.0f * float(i % 7);
        CHECK_EQ(wrong, size_t(0));
    }
    mlopt_plan_free(plan);
    mlopt_comm_free(comm);
    return finish_rank(rank);
}

void test_run_rank(mlopt_transport kind) {
    const auto start = Clock::now();
    const std::string address = free_address();
    const std::vector<int> st = run_ranks(2, [&](int r) { return run_rank_rank(r, address, kind); });
    for (int s : st) CHECK(exited_ok(s));
    std::printf("  mlopt_comm_run_rank over %s: %.2f s\n", kind_name(kind), seconds_since(start));
}

// Ranks that never join: create fails on the others after init_timeout_ms, naming them. Three cases at once:
// rank 2 of 3 missing with the TCP rendezvous and with a file store, and rank 0 (the TCP server) missing.
void test_never_joins() {
    const int32_t timeout_ms = 1500;
    const std::string tcp_a = free_address(), tcp_b = free_address();
    FileStore store{make_temp_dir()};
    const auto start = Clock::now();
    // Processes 0-2: TCP rendezvous without rank 2; 3-5: file store without rank 2; 6-7: ranks 1, 2 of a TCP
    // rendezvous without rank 0.
    const std::vector<int> st = run_ranks(8, [&](int p) {
        const int rank = p < 6 ? p % 3 : p - 5;
        if (p == 2 || p == 5) return 0;
        mlopt_comm_options o = comm_options(p < 3 || p >= 6 ? MLOPT_TRANSPORT_TCP : MLOPT_TRANSPORT_SHM, timeout_ms);
        mlopt_comm comm = nullptr;
        mlopt_error err = nullptr;
        const Resources before = resources();
        const auto begin = Clock::now();
        mlopt_status status = MLOPT_OK;
        if (p >= 3 && p < 6) {
            const mlopt_bootstrap b = file_bootstrap(store);
            status = mlopt_comm_create(rank, 3, &b, &o, &comm, &err);
        } else {
            status = mlopt_comm_create_tcp((p < 3 ? tcp_a : tcp_b).c_str(), rank, 3, &o, &comm, &err);
        }
        const double took = seconds_since(begin);
        check_released(before);
        const std::string message = err ? mlopt_error_message(err) : "";
        CHECK_EQ(status, MLOPT_ERR_IO);
        CHECK(comm == nullptr);
        CHECK_CONTAINS(message, p >= 6 ? "rank 0 did not join within 1500 ms" : "rank 2 did not join within 1500 ms");
        CHECK(took > 1.3 && took < 4.0);
        CHECK(shm_names_of(getpid()).empty());
        if (p == 0 || p == 3 || p == 6) std::printf("  never joins (%.2f s): %s\n", took, message.c_str());
        mlopt_error_free(err);
        return finish_rank(rank);
    });
    for (int s : st) CHECK(exited_ok(s));
    CHECK(seconds_since(start) < 6.0);
    remove_dir(store.dir);
}

// 4 ranks on two pretend hosts (host_id): shared memory within a host, TCP across; every pair exchanges data.
// Then the same with MLOPT_TRANSPORT_SHM: unsupported on every rank.
void test_mixed_hosts() {
    FileStore store{make_temp_dir()};
    std::vector<int> st = run_ranks(4, [&](int rank) {
        mlopt_comm_options o = comm_options(MLOPT_TRANSPORT_AUTO);
        const std::string host = rank < 2 ? "host-a" : "host-b";
        o.host_id = host.c_str();
        o.tcp_address = "127.0.0.1";
        o.key_prefix = "mixed";
        const mlopt_bootstrap b = file_bootstrap(store);
        mlopt_comm comm = nullptr;
        mlopt_error err = nullptr;
        if (!CHECK_EQ(mlopt_comm_create(rank, 4, &b, &o, &comm, &err), MLOPT_OK)) {
            std::fprintf(stderr, "[rank %d] %s\n", rank, err ? mlopt_error_message(err) : "?");
            mlopt_error_free(err);
            return 1;
        }
        for (int peer = 0; peer < 4; ++peer) {
            const char* expected = peer == rank ? "self" : ((peer < 2) == (rank < 2) ? "shm" : "tcp");
            CHECK_EQ(std::string(mlopt_comm_peer_transport(comm, peer)), expected);
        }
        Transport& t = *comm->transport;
        Errors errors;
        std::vector<std::thread> threads;
        for (int peer = 0; peer < 4; ++peer) {
            threads.emplace_back([&, peer] { send_pattern(t, peer, 2, 300000, 7, errors); });
            threads.emplace_back([&, peer] { recv_pattern(t, peer, 2, 300000, 8, errors); });
        }
        for (std::thread& th : threads) th.join();
        for (const std::string& e : errors.list) CHECK_EQ(e, "");
        mlopt_comm_free(comm);
        return finish_rank(rank);
    });
    for (int s : st) CHECK(exited_ok(s));
    st = run_ranks(2, [&](int rank) {
        mlopt_comm_options o = comm_options(MLOPT_TRANSPORT_SHM, 5000);
        o.host_id = rank == 0 ? "host-a" : "host-b";
        o.key_prefix = "shm-across-hosts";
        const mlopt_bootstrap b = file_bootstrap(store);
        mlopt_comm comm = nullptr;
        mlopt_error err = nullptr;
        CHECK_EQ(mlopt_comm_create(rank, 2, &b, &o, &comm, &err), MLOPT_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err ? mlopt_error_message(err) : "", "MLOPT_TRANSPORT_SHM needs every rank on one host");
        CHECK(shm_names_of(getpid()).empty());
        mlopt_error_free(err);
        return finish_rank(rank);
    });
    for (int s : st) CHECK(exited_ok(s));
    remove_dir(store.dir);
}

// One rank alone (file store): its streams to itself; mlopt_comm_create_tcp on a 1-rank job too.
void test_single_rank() {
    FileStore store{make_temp_dir()};
    const std::string address = free_address();
    const std::vector<int> st = run_ranks(1, [&](int rank) {
        mlopt_comm_options o = comm_options(MLOPT_TRANSPORT_AUTO);
        const mlopt_bootstrap b = file_bootstrap(store);
        mlopt_comm comm = nullptr;
        mlopt_error err = nullptr;
        CHECK_EQ(mlopt_comm_create(0, 1, &b, &o, &comm, &err), MLOPT_OK);
        if (comm == nullptr) return 1;
        CHECK_EQ(std::string(mlopt_comm_peer_transport(comm, 0)), "self");
        Errors errors;
        std::thread writer([&] { send_pattern(*comm->transport, 0, 11, 2u << 20, 1, errors); });
        recv_pattern(*comm->transport, 0, 11, 2u << 20, 2, errors);
        writer.join();
        for (const std::string& e : errors.list) CHECK_EQ(e, "");
        mlopt_comm_free(comm);
        mlopt_comm other = create_tcp(address, 0, 1, comm_options(MLOPT_TRANSPORT_TCP));
        CHECK(other != nullptr);
        mlopt_comm_free(other);
        return finish_rank(rank);
    });
    CHECK(exited_ok(st[0]));
    remove_dir(store.dir);
}

// A segment name left by a process killed inside the create window is removed by the next create.
std::string plant_stale_segment() {
    const pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, nullptr, 0);
    struct stat st {};
    stat("/proc/self/ns/pid", &st);
    const std::string name = "/" + mlopt::shm_name_prefix(dead) + std::to_string(static_cast<unsigned long long>(st.st_ino)) +
                             "-00000000deadbeef";
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    g_all_children.push_back(dead);
    return name;
}

// ------------------------------------------------------------------------------------------ arguments

void test_arguments() {
    mlopt_comm_options o;
    mlopt_comm_options_init(&o);
    CHECK_EQ(o.struct_size, sizeof o);
    CHECK_EQ(o.transport, MLOPT_TRANSPORT_AUTO);
    CHECK_EQ(o.init_timeout_ms, 30000);
    CHECK_EQ(o.shm_fifo_bytes, int64_t(4) << 20);
    CHECK_EQ(o.spin_us, 20);
    CHECK(o.host_id == nullptr && o.tcp_address == nullptr && o.key_prefix == nullptr);

    FileStore store{"/nonexistent"};
    mlopt_bootstrap b = file_bootstrap(store);
    mlopt_comm comm = nullptr;
    auto expect = [&](mlopt_status status, const std::string& text, const std::function<mlopt_status(mlopt_error*)>& call) {
        mlopt_error err = nullptr;
        CHECK_EQ(call(&err), status);
        CHECK_CONTAINS(err ? mlopt_error_message(err) : "", text);
        CHECK(comm == nullptr);
        mlopt_error_free(err);
    };
    const auto I = MLOPT_ERR_INVALID_ARGUMENT;
    expect(I, "out is NULL", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &b, nullptr, nullptr, e); });
    expect(I, "rank=2 is not in 0..1", [&](mlopt_error* e) { return mlopt_comm_create(2, 2, &b, nullptr, &comm, e); });
    expect(I, "nranks=0", [&](mlopt_error* e) { return mlopt_comm_create(0, 0, &b, nullptr, &comm, e); });
    expect(I, "bootstrap is NULL", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, nullptr, nullptr, &comm, e); });
    mlopt_bootstrap small = b;
    small.struct_size = 8;
    expect(I, "bootstrap->struct_size=8", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &small, nullptr, &comm, e); });
    mlopt_bootstrap no_get = b;
    no_get.get = nullptr;
    expect(I, "bootstrap->get is NULL", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &no_get, nullptr, &comm, e); });
    mlopt_comm_options bad = o;
    bad.struct_size = 4;
    expect(I, "options->struct_size=4", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &b, &bad, &comm, e); });
    bad = o;
    const int seven = 7;  // as a C caller could pass it (a C++ cast to the enum would be undefined)
    std::memcpy(&bad.transport, &seven, sizeof seven);
    expect(I, "options->transport=7", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &b, &bad, &comm, e); });
    bad = o;
    bad.shm_fifo_bytes = 5000;
    expect(I, "options->shm_fifo_bytes=5000", [&](mlopt_error* e) { return mlopt_comm_create(0, 2, &b, &bad, &comm, e); });
    expect(I, "address is NULL", [&](mlopt_error* e) { return mlopt_comm_create_tcp(nullptr, 0, 2, &o, &comm, e); });
    expect(MLOPT_ERR_IO, "\"nonsense\" is not \"host:port\"",
           [&](mlopt_error* e) { return mlopt_comm_create_tcp("nonsense", 0, 2, &o, &comm, e); });

    mlopt_comm local = nullptr;
    CHECK_EQ(mlopt_comm_create_local(2, &local, nullptr), MLOPT_OK);
    CHECK_EQ(mlopt_comm_rank(local), -1);
    CHECK_EQ(std::string(mlopt_comm_peer_transport(local, 1)), "local");
    CHECK(mlopt_comm_peer_transport(local, 2) == nullptr);
    CHECK(mlopt_comm_peer_transport(nullptr, 0) == nullptr);
    CHECK_EQ(mlopt_comm_rank(nullptr), -1);
    mlopt_comm_free(local);
}

}  // namespace

int main() {
    const auto start = Clock::now();
    void* shared = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    g_shared = new (shared) Shared{};
    if (access("/dev/shm", W_OK) != 0) {
        std::printf("test_transport: /dev/shm is not writable here: skipped\n");
        return 77;
    }
    pattern();  // built once here, inherited by every child

    test_arguments();
    const std::string stale = plant_stale_segment();
    for (mlopt_transport kind : {MLOPT_TRANSPORT_SHM, MLOPT_TRANSPORT_TCP}) {
        test_streams(kind);
        if (kind == MLOPT_TRANSPORT_SHM) {
            struct stat st {};
            CHECK(stat(("/dev/shm" + stale).c_str(), &st) != 0);  // the first create removed it
        }
        test_kill(kind);
        test_abort(kind);
        test_run_rank(kind);
    }
    test_never_joins();
    test_mixed_hosts();
    test_single_rank();

    for (pid_t pid : g_all_children) {
        for (const std::string& name : shm_names_of(pid)) CHECK_EQ("left in /dev/shm: " + name, "");
    }
    std::printf("test_transport: %.1f s\n", seconds_since(start));
    return check::finish("test_transport");
}

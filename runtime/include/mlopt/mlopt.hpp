// mlopt runtime: header-only C++17 wrapper over the C ABI (mlopt.h).
//
// RAII owners for the handles (mlopt::Plan, mlopt::Comm) and exceptions instead of status codes: every failing
// call throws mlopt::Error, which carries the status, the one-line message and the position in the input.
// Only the C functions are called, so this header works with the shared library as built (hidden internals).
//
//   mlopt::Plan plan = mlopt::Plan::load("ring.xml");
//   mlopt_program_info info = plan.program_info();
//   mlopt::Comm comm = mlopt::Comm::create_local(info.ngpus);
//   comm.run(plan, inputs, outputs, count, MLOPT_FLOAT32, MLOPT_SUM);
//
//   mlopt::Enforcer enforcer = mlopt::Enforcer::create(4);   // Syndicate's plan enforcer (docs/enforcer.md)
//   enforcer.add_motif(desc);  ...  enforcer.start();
//   enforcer.submit(rank, op, input, output);  enforcer.wait(rank, op);   // on each rank's thread
#ifndef MLOPT_MLOPT_HPP
#define MLOPT_MLOPT_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mlopt/mlopt.h"

namespace mlopt {

// Static text of a status ("ok", "parse error", ...).
inline const char* status_string(mlopt_status status) noexcept { return mlopt_status_string(status); }

struct Version {
    int major = 0;
    int minor = 0;
    int patch = 0;
};

// The version of the library loaded at run time (MLOPT_VERSION_* is the one compiled against).
inline Version library_version() noexcept {
    Version v;
    mlopt_version(&v.major, &v.minor, &v.patch);
    return v;
}

// A failed call: status, message ("<file>: <location>: <what>"), and where in the input (line/column 1-based,
// 0 when unknown; byte offset, -1 when unknown).
class Error : public std::runtime_error {
public:
    Error(mlopt_status status, const std::string& message, int64_t line = 0, int64_t column = 0, int64_t offset = -1)
        : std::runtime_error(message), status_(status), line_(line), column_(column), offset_(offset) {}

    mlopt_status status() const noexcept { return status_; }
    int64_t line() const noexcept { return line_; }
    int64_t column() const noexcept { return column_; }
    int64_t offset() const noexcept { return offset_; }

private:
    mlopt_status status_;
    int64_t line_;
    int64_t column_;
    int64_t offset_;
};

namespace detail {

// Takes ownership of `err`; throws Error when `status` is not MLOPT_OK. Call it after the C function returned
// (not as `throw_if_failed(f(&err), err)`: the argument order is unspecified, err could be read before f runs).
inline void throw_if_failed(mlopt_status status, mlopt_error err) {
    struct Owner {
        mlopt_error e;
        ~Owner() { mlopt_error_free(e); }
    } owner{err};
    if (status == MLOPT_OK) return;
    if (err == nullptr) throw Error(status, mlopt_status_string(status));  // no memory left for the details
    throw Error(status, mlopt_error_message(err), mlopt_error_line(err), mlopt_error_column(err),
                mlopt_error_offset(err));
}

}  // namespace detail

// Run options with the library's defaults (mlopt_run_options_init); change fields as needed.
inline mlopt_run_options default_run_options() noexcept {
    mlopt_run_options options;
    mlopt_run_options_init(&options);
    return options;
}

// A loaded plan: an MSCCL-EF program (XML) or a JSON plan envelope. Move-only.
class Plan {
public:
    // Reads and validates a plan file (XML or JSON, told by its first byte).
    static Plan load(const std::string& path) {
        mlopt_plan handle = nullptr;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_plan_load(path.c_str(), &handle, &err);
        detail::throw_if_failed(status, err);
        return Plan(handle);
    }

    // The same from memory; `name` is used in messages.
    static Plan from_memory(std::string_view data, const std::string& name = "<memory>") {
        mlopt_plan handle = nullptr;
        mlopt_error err = nullptr;
        // A non-NULL pointer even for empty data (NULL is an invalid argument).
        const char* bytes = data.data() != nullptr ? data.data() : "";
        const mlopt_status status =
            mlopt_plan_load_memory(bytes, data.size(), name.c_str(), &handle, &err);
        detail::throw_if_failed(status, err);
        return Plan(handle);
    }

    // Adopts a handle from the C API (may be NULL: an empty Plan).
    explicit Plan(mlopt_plan handle = nullptr) noexcept : handle_(handle) {}
    Plan(Plan&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Plan& operator=(Plan&& other) noexcept {
        if (this != &other) {
            mlopt_plan_free(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan() { mlopt_plan_free(handle_); }

    mlopt_plan_kind kind() const noexcept { return mlopt_plan_get_kind(handle_); }
    // JSON: the envelope's fields; XML: "msccl-ef", "", "collective". Valid as long as the plan.
    const char* format() const noexcept { return mlopt_plan_format(handle_); }
    const char* schema_version() const noexcept { return mlopt_plan_schema_version(handle_); }
    const char* planner() const noexcept { return mlopt_plan_planner(handle_); }

    // XML plans only (Error with MLOPT_ERR_INVALID_ARGUMENT otherwise). Strings live as long as the plan.
    mlopt_program_info program_info() const {
        mlopt_program_info info{};
        info.struct_size = sizeof info;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_plan_program_info(handle_, &info, &err);
        detail::throw_if_failed(status, err);
        return info;
    }

    // Output elements per rank for `count` input elements per rank (count must be a multiple of i_chunks).
    size_t output_count(size_t count) const {
        size_t out = 0;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_output_count(handle_, count, &out, &err);
        detail::throw_if_failed(status, err);
        return out;
    }

    const mlopt_plan_s* get() const noexcept { return handle_; }
    mlopt_plan release() noexcept { return std::exchange(handle_, nullptr); }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

private:
    mlopt_plan handle_;
};

// An in-process communicator (ranks are threads sharing memory). Move-only.
class Comm {
public:
    static Comm create_local(int32_t nranks) {
        mlopt_comm handle = nullptr;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_comm_create_local(nranks, &handle, &err);
        detail::throw_if_failed(status, err);
        return Comm(handle);
    }

    explicit Comm(mlopt_comm handle = nullptr) noexcept : handle_(handle) {}
    Comm(Comm&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Comm& operator=(Comm&& other) noexcept {
        if (this != &other) {
            mlopt_comm_free(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
    ~Comm() { mlopt_comm_free(handle_); }

    int32_t size() const noexcept { return mlopt_comm_size(handle_); }

    // Runs `plan` on every rank (blocking); inputs[r]/outputs[r] are rank r's buffers, `count` input elements.
    // `options` NULL: the library's defaults.
    void run(const Plan& plan, void* const* inputs, void* const* outputs, size_t count, mlopt_dtype dtype,
             mlopt_redop op, const mlopt_run_options* options = nullptr) {
        mlopt_error err = nullptr;
        const mlopt_status status =
            mlopt_comm_run(handle_, plan.get(), inputs, outputs, count, dtype, op, options, &err);
        detail::throw_if_failed(status, err);
    }

    void run(const Plan& plan, void* const* inputs, void* const* outputs, size_t count, mlopt_dtype dtype,
             mlopt_redop op, const mlopt_run_options& options) {
        run(plan, inputs, outputs, count, dtype, op, &options);
    }

    // Counters of the last run.
    mlopt_run_stats last_stats() const {
        mlopt_run_stats stats{};
        stats.struct_size = sizeof stats;
        const mlopt_status status = mlopt_comm_last_stats(handle_, &stats);
        if (status != MLOPT_OK) throw Error(status, std::string("mlopt_comm_last_stats: ") + status_string(status));
        return stats;
    }

    mlopt_comm get() const noexcept { return handle_; }
    mlopt_comm release() noexcept { return std::exchange(handle_, nullptr); }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

private:
    mlopt_comm handle_;
};

// Enforcer options with the library's defaults (mlopt_enforcer_options_init); change fields as needed.
inline mlopt_enforcer_options default_enforcer_options() noexcept {
    mlopt_enforcer_options options;
    mlopt_enforcer_options_init(&options);
    return options;
}

// One entry of a rank's issue log.
struct IssuedMotif {
    int32_t op = 0;
    int32_t index = 0;
    int32_t iteration = 0;
};

// Syndicate's plan enforcer over in-process ranks (mlopt.h, "enforcer"). Move-only.
class Enforcer {
public:
    // `options` NULL: the library's defaults.
    static Enforcer create(int32_t nranks, const mlopt_enforcer_options* options = nullptr) {
        mlopt_enforcer handle = nullptr;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_enforcer_create(nranks, options, &handle, &err);
        detail::throw_if_failed(status, err);
        return Enforcer(handle);
    }

    static Enforcer create(int32_t nranks, const mlopt_enforcer_options& options) { return create(nranks, &options); }

    explicit Enforcer(mlopt_enforcer handle = nullptr) noexcept : handle_(handle) {}
    Enforcer(Enforcer&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Enforcer& operator=(Enforcer&& other) noexcept {
        if (this != &other) {
            mlopt_enforcer_free(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Enforcer(const Enforcer&) = delete;
    Enforcer& operator=(const Enforcer&) = delete;
    ~Enforcer() { mlopt_enforcer_free(handle_); }

    // Copies the description (and its program): the caller's may go right after.
    void add_motif(const mlopt_motif_desc& motif) { call(mlopt_enforcer_add_motif, &motif); }
    void start() { call(mlopt_enforcer_start); }
    // Non-blocking; input and output (op_bytes each) stay valid until the submission completes.
    void submit(int32_t rank, int32_t op, const void* input, void* output) {
        call(mlopt_enforcer_submit, rank, op, input, output);
    }
    // Rank's latest submission of `op` (-1: all of the rank's) has completed; Error (MLOPT_ERR_DEADLOCK, ...)
    // when it never will.
    void wait(int32_t rank, int32_t op = -1) { call(mlopt_enforcer_wait, rank, op); }
    void drain() { call(mlopt_enforcer_drain); }

    mlopt_enforcer_stats stats(int32_t rank) const {
        mlopt_enforcer_stats stats{};
        stats.struct_size = sizeof stats;
        mlopt_error err = nullptr;
        const mlopt_status status = mlopt_enforcer_get_stats(handle_, rank, &stats, &err);
        detail::throw_if_failed(status, err);
        return stats;
    }

    // The rank's issued motifs in issue order (at most MLOPT_ENFORCER_LOG_CAPACITY, the first ones).
    std::vector<IssuedMotif> issue_log(int32_t rank) const {
        size_t count = 0;
        mlopt_error err = nullptr;
        mlopt_status status = mlopt_enforcer_issue_log(handle_, rank, nullptr, nullptr, nullptr, 0, &count, &err);
        detail::throw_if_failed(status, err);
        std::vector<int32_t> ops(count), indices(count), iterations(count);
        status = mlopt_enforcer_issue_log(handle_, rank, ops.data(), indices.data(), iterations.data(), count, &count,
                                          &err);
        detail::throw_if_failed(status, err);
        std::vector<IssuedMotif> out;
        for (size_t i = 0; i < count && i < ops.size(); ++i) out.push_back({ops[i], indices[i], iterations[i]});
        return out;
    }

    mlopt_enforcer get() const noexcept { return handle_; }
    mlopt_enforcer release() noexcept { return std::exchange(handle_, nullptr); }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

private:
    template <typename F, typename... Args>
    void call(F f, Args... args) {
        mlopt_error err = nullptr;
        const mlopt_status status = f(handle_, args..., &err);
        detail::throw_if_failed(status, err);
    }

    mlopt_enforcer handle_;
};

}  // namespace mlopt

#endif  // MLOPT_MLOPT_HPP

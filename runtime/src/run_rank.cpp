// mlopt_comm_run_rank: this process's rank of a program on a multi-process communicator. The argument checks
// are mlopt_comm_run's (run_checks.hpp) for this rank's buffers; the run is the rank engine's
// (rank_engine.hpp) over the communicator's transport.
#include <cstddef>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "comm.hpp"
#include "handles.hpp"
#include "rank_engine.hpp"
#include "run_checks.hpp"
#include "run_rank.hpp"

namespace mlopt {

mlopt_status comm_broken_error(const mlopt_comm_s& comm, mlopt_error* err) {
    return fail(err, comm.broken_status, "the communicator is broken by an earlier failed run: " + comm.broken);
}

void break_comm(mlopt_comm_s& comm, mlopt_status status, const std::string& message) {
    if (comm.broken_status != MLOPT_OK) return;
    comm.broken_status = status;
    comm.broken = message;
}

namespace {

class BorrowedTransport : public Transport {
public:
    explicit BorrowedTransport(Transport& target) : target_(target) {}
    int32_t rank() const override { return target_.rank(); }
    int32_t nranks() const override { return target_.nranks(); }
    const char* peer_kind(int32_t peer) const override { return target_.peer_kind(peer); }
    TransportWait send_stream(int32_t peer, int32_t tag, SendStream** out, TransportClock::time_point deadline,
                              std::string& why) override {
        return target_.send_stream(peer, tag, out, deadline, why);
    }
    TransportWait recv_stream(int32_t peer, int32_t tag, RecvStream** out, TransportClock::time_point deadline,
                              std::string& why) override {
        return target_.recv_stream(peer, tag, out, deadline, why);
    }
    void abort(const std::string& reason) override { target_.abort(reason); }
    std::string aborted() const override { return target_.aborted(); }

private:
    Transport& target_;
};

// The options of a rank run: mlopt_comm_run's, but the CPU backend only (checked first, so that a CUDA request
// gets this reason rather than the CUDA probe's).
mlopt_status read_rank_options(const mlopt_run_options* given, mlopt_run_options& out, mlopt_error* err) {
    const size_t known = offsetof(mlopt_run_options, backend) + sizeof(given->backend);
    if (given != nullptr && given->struct_size >= known && given->backend == MLOPT_BACKEND_CUDA) {
        return fail(err, MLOPT_ERR_UNSUPPORTED,
                    "mlopt_comm_run_rank: options->backend=MLOPT_BACKEND_CUDA, but multi-process communicators run "
                    "on the CPU backend only");
    }
    return read_options(given, out, err);
}

mlopt_status check_rank_run(const mlopt_comm_s* comm, const mlopt_plan_s* plan, const void* input,
                            const void* output, size_t count, mlopt_dtype dtype, mlopt_redop op, Layout& layout,
                            mlopt_error* err) {
    if (comm == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "comm is NULL");
    if (comm->rank < 0 || comm->transport == nullptr) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "mlopt_comm_run_rank: an in-process communicator (mlopt_comm_create_local): use mlopt_comm_run");
    }
    mlopt_status status = check_program_args(plan, dtype, op, comm->nranks, err);
    if (status == MLOPT_OK) status = check_count(*plan, count, dtype, layout, err);
    if (status != MLOPT_OK || count == 0) return status;
    status = check_rank_buffers(*plan, static_cast<size_t>(comm->rank), input, output, "input", "output", dtype,
                                layout, err);
    return status != MLOPT_OK ? status : check_declared(*plan, layout, err);
}

mlopt_status run_rank_checked(mlopt_comm_s* comm, const mlopt_plan_s* plan, const void* input, void* output,
                              size_t count, mlopt_dtype dtype, mlopt_redop op, const mlopt_run_options* options,
                              mlopt_error* err) {
    Layout layout;
    mlopt_status status = check_rank_run(comm, plan, input, output, count, dtype, op, layout, err);
    if (status != MLOPT_OK) return status;
    mlopt_run_options opts;
    status = read_rank_options(options, opts, err);
    if (status != MLOPT_OK) return status;

    std::unique_lock<std::mutex> busy(comm->busy, std::try_to_lock);
    if (!busy.owns_lock()) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "the communicator is already running a collective");
    }
    if (comm->broken_status != MLOPT_OK) return comm_broken_error(*comm, err);
    RankRunRequest request;
    request.position = comm->rank;
    // The engine only reads the input (the in-place layout makes it part of the output, which it writes).
    request.memory.input = static_cast<std::byte*>(const_cast<void*>(input));
    request.memory.output = static_cast<std::byte*>(output);
    request.chunk_elems = layout.chunk_elems;
    request.dtype = dtype;
    request.op = op;
    request.watchdog_ms = opts.watchdog_ms;
    request.chunk_bytes = opts.chunk_bytes;
    request.run = ++comm->runs;
    const RunResult result = run_rank_program(plan->program, request, *comm->transport, comm->workspace);
    comm->last_stats = result.stats;
    comm->last_stats.struct_size = sizeof(mlopt_run_stats);
    comm->last_stats.backend = MLOPT_BACKEND_CPU;
    if (result.status == MLOPT_OK) return succeed(err);
    const std::string message = prefixed(*plan, result.message);
    break_comm(*comm, result.status, message);
    return fail(err, result.status, message);
}

}  // namespace

std::unique_ptr<Transport> borrow_transport(Transport& target) { return std::make_unique<BorrowedTransport>(target); }

mlopt_comm make_comm_for_test(int32_t rank, int32_t nranks, std::unique_ptr<Transport> transport) {
    auto* comm = new (std::nothrow) mlopt_comm_s;
    if (comm == nullptr) return nullptr;
    comm->nranks = nranks;
    comm->rank = rank;
    comm->transport = std::move(transport);
    return comm;
}

}  // namespace mlopt

extern "C" {

MLOPT_API mlopt_status mlopt_comm_run_rank(mlopt_comm comm, const mlopt_plan_s* program, const void* input,
                                           void* output, size_t count, mlopt_dtype dtype, mlopt_redop op,
                                           const mlopt_run_options* options, mlopt_error* err) {
    try {
        return mlopt::run_rank_checked(comm, program, input, output, count, dtype, op, options, err);
    } catch (const std::bad_alloc&) {
        return mlopt::fail(err, MLOPT_ERR_NO_MEMORY, "mlopt_comm_run_rank: out of memory");
    } catch (...) {
        return mlopt::fail(err, MLOPT_ERR_INTERNAL, "unexpected error in mlopt_comm_run_rank");
    }
}

}  // extern "C"

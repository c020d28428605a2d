// In-process communicators and mlopt_comm_run: checks a program against the communicator and the caller's
// buffers (rank count, sizes, in-place layout, dtype/op), then hands it to the interpreter. The checks are
// shared with mlopt_comm_run_rank (run_checks.hpp, run_rank.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "comm.hpp"
#include "cuda_backend.hpp"
#include "handles.hpp"
#include "interpreter.hpp"
#include "reduce.hpp"
#include "run_checks.hpp"

namespace mlopt {

std::string prefixed(const mlopt_plan_s& plan, const std::string& message) {
    return plan.source.empty() ? message : plan.source + ": " + message;
}

// Copies the fields the caller's struct has (struct_size) over the defaults, so that an older caller's
// smaller struct still works.
mlopt_status read_options(const mlopt_run_options* given, mlopt_run_options& out, mlopt_error* err) {
    mlopt_run_options_init(&out);
    if (given == nullptr) return MLOPT_OK;
    const size_t known = offsetof(mlopt_run_options, backend) + sizeof(given->backend);
    const mlopt_status status = read_sized(*given, known, "mlopt_run_options_init", out, err);
    if (status != MLOPT_OK) return status;
    if (out.backend != MLOPT_BACKEND_CPU && out.backend != MLOPT_BACKEND_CUDA) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->backend=" + std::to_string(static_cast<int>(out.backend)) + " is not a mlopt_backend");
    }
    if (out.cuda_block_threads > 0 && (out.cuda_block_threads % 32 != 0 || out.cuda_block_threads > 512)) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->cuda_block_threads=" + std::to_string(out.cuda_block_threads) +
                        " must be a multiple of 32 up to 512 (or <= 0 for the default, 512)");
    }
    if (out.backend == MLOPT_BACKEND_CUDA) {
        std::string why;
        if (cuda_backend_available(why) != MLOPT_OK) return fail(err, MLOPT_ERR_UNSUPPORTED, why);
    }
    return MLOPT_OK;
}

namespace {

bool overlap(const std::byte* a, size_t a_bytes, const std::byte* b, size_t b_bytes) {
    if (a_bytes == 0 || b_bytes == 0) return false;
    const auto pa = reinterpret_cast<uintptr_t>(a);
    const auto pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

// In place, input and output are one buffer (symbolic.py): allgather's input is output chunks
// [r k, r k + k) (k = i_chunks), reducescatter's output is input chunks [r k, r k + k) (k = o_chunks), the
// other collectives' input is the output. Returns "" when rank r's pointers are that layout.
std::string check_inplace_layout(const Program& p, size_t r, const std::byte* in, const std::byte* out,
                                 size_t chunk_bytes, const std::string& in_name, const std::string& out_name) {
    const Gpu& gpu = p.gpus[r];
    if (p.coll == "allgather") {
        if (int64_t(r + 1) * gpu.i_chunks > gpu.o_chunks) {
            return "an in-place allgather needs o_chunks >= ngpus * i_chunks";
        }
        if (in != out + r * gpu.i_chunks * chunk_bytes) {
            return in_name + " overlaps " + out_name + " but is not the in-place allgather layout "
                   "(inputs[r] = outputs[r] + r * count elements)";
        }
    } else if (p.coll == "reducescatter") {
        if (int64_t(r + 1) * gpu.o_chunks > gpu.i_chunks) {
            return "an in-place reducescatter needs i_chunks >= ngpus * o_chunks";
        }
        if (out != in + r * gpu.o_chunks * chunk_bytes) {
            return out_name + " overlaps " + in_name + " but is not the in-place reducescatter "
                   "layout (outputs[r] = inputs[r] + r * output count elements)";
        }
    } else if (in != out) {
        return in_name + " overlaps " + out_name + " but is not equal to it (in-place " + p.coll + ": one buffer)";
    }
    return "";
}

}  // namespace

mlopt_status check_count(const mlopt_plan_s& plan, size_t count, mlopt_dtype dtype, Layout& layout,
                         mlopt_error* err) {
    const Program& p = plan.program;
    const size_t es = dtype_size(dtype);
    const auto i_chunks = static_cast<size_t>(p.gpus[0].i_chunks);
    if (count % i_chunks != 0) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    prefixed(plan, "count=" + std::to_string(count) + " is not a multiple of the program's i_chunks=" +
                                       std::to_string(i_chunks)));
    }
    layout.chunk_elems = count / i_chunks;
    size_t most_chunks = i_chunks;
    for (const Gpu& gpu : p.gpus) {
        most_chunks = std::max({most_chunks, static_cast<size_t>(gpu.o_chunks), static_cast<size_t>(gpu.s_chunks)});
    }
    if (layout.chunk_elems > SIZE_MAX / es / most_chunks) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "count=" + std::to_string(count) + " is too large");
    }
    return MLOPT_OK;
}

mlopt_status check_rank_buffers(const mlopt_plan_s& plan, size_t r, const void* input, const void* output,
                                const std::string& in_name, const std::string& out_name, mlopt_dtype dtype,
                                Layout& layout, mlopt_error* err) {
    const Program& p = plan.program;
    const size_t es = dtype_size(dtype);
    const size_t chunk_bytes = layout.chunk_elems * es;
    const auto* in = static_cast<const std::byte*>(input);
    const auto* out = static_cast<const std::byte*>(output);
    const size_t in_bytes = static_cast<size_t>(p.gpus[0].i_chunks) * chunk_bytes;
    const size_t out_bytes = static_cast<size_t>(p.gpus[r].o_chunks) * chunk_bytes;
    if (in == nullptr || (out == nullptr && out_bytes > 0)) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, in_name + " or " + out_name + " is NULL");
    }
    if (reinterpret_cast<uintptr_t>(in) % es != 0 || reinterpret_cast<uintptr_t>(out) % es != 0) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    in_name + " or " + out_name + " is not aligned to " + std::to_string(es) + " bytes (" +
                        dtype_name(dtype) + ")");
    }
    if (!overlap(in, in_bytes, out, out_bytes)) {
        layout.any_outofplace = true;
        return MLOPT_OK;
    }
    const std::string problem = check_inplace_layout(p, r, in, out, chunk_bytes, in_name, out_name);
    if (!problem.empty()) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, prefixed(plan, problem));
    layout.any_inplace = true;
    return MLOPT_OK;
}

mlopt_status check_declared(const mlopt_plan_s& plan, const Layout& layout, mlopt_error* err) {
    const Program& p = plan.program;
    if (layout.any_inplace && !p.inplace) {
        return fail(err, MLOPT_ERR_MISMATCH,
                    prefixed(plan, "in-place run (input and output buffers overlap) but the program does not "
                                   "declare inplace=1"));
    }
    if (layout.any_outofplace && !p.outofplace) {
        return fail(err, MLOPT_ERR_MISMATCH,
                    prefixed(plan, "out-of-place run of an in-place-only program (it declares inplace=1 "
                                   "outofplace=0): run it in place"));
    }
    return MLOPT_OK;
}

mlopt_status check_program_args(const mlopt_plan_s* plan, mlopt_dtype dtype, mlopt_redop op, int32_t nranks,
                                mlopt_error* err) {
    if (plan == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "plan is NULL");
    if (plan->kind != MLOPT_PLAN_MSCCL_XML) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    prefixed(*plan, "a JSON plan is not a runnable program (load an MSCCL-EF XML plan)"));
    }
    if (!is_valid_dtype(dtype)) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "dtype=" + std::to_string(static_cast<int>(dtype)) + " is not a mlopt_dtype");
    }
    if (!is_valid_redop(op)) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "op=" + std::to_string(static_cast<int>(op)) + " is not a mlopt_redop");
    }
    // The plan came through the loader, which validated it (program.hpp): the interpreter may index freely.
    if (plan->program.ngpus != nranks) {
        return fail(err, MLOPT_ERR_MISMATCH,
                    prefixed(*plan, "the program is for ngpus=" + std::to_string(plan->program.ngpus) +
                                        " ranks, the communicator has " + std::to_string(nranks)));
    }
    return MLOPT_OK;
}

namespace {

mlopt_status check_buffers(const mlopt_plan_s& plan, void* const* inputs, void* const* outputs, size_t count,
                           mlopt_dtype dtype, Layout& layout, mlopt_error* err) {
    mlopt_status status = check_count(plan, count, dtype, layout, err);
    if (status != MLOPT_OK || count == 0) return status;
    for (size_t r = 0; r < plan.program.gpus.size(); ++r) {
        const std::string rank = std::to_string(r);
        status = check_rank_buffers(plan, r, inputs[r], outputs[r], "inputs[" + rank + "]", "outputs[" + rank + "]",
                                    dtype, layout, err);
        if (status != MLOPT_OK) return status;
    }
    return check_declared(plan, layout, err);
}

mlopt_status check_run(const mlopt_comm_s* comm, const mlopt_plan_s* plan, void* const* inputs,
                       void* const* outputs, mlopt_dtype dtype, mlopt_redop op, mlopt_error* err) {
    if (comm == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "comm is NULL");
    if (comm->rank >= 0) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "mlopt_comm_run: the communicator is rank " + std::to_string(comm->rank) + " of a multi-process "
                    "communicator: use mlopt_comm_run_rank");
    }
    if (plan == nullptr) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "plan is NULL");
    if (inputs == nullptr || outputs == nullptr) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "inputs or outputs is NULL");
    }
    return check_program_args(plan, dtype, op, comm->nranks, err);
}

mlopt_status run_checked(mlopt_comm_s* comm, const mlopt_plan_s* plan, void* const* inputs, void* const* outputs,
                         size_t count, mlopt_dtype dtype, mlopt_redop op, const mlopt_run_options* options,
                         mlopt_error* err) {
    mlopt_status status = check_run(comm, plan, inputs, outputs, dtype, op, err);
    if (status != MLOPT_OK) return status;
    mlopt_run_options opts;
    status = read_options(options, opts, err);
    if (status != MLOPT_OK) return status;
    Layout layout;
    status = check_buffers(*plan, inputs, outputs, count, dtype, layout, err);
    if (status != MLOPT_OK) return status;

    RunRequest request;
    request.chunk_elems = layout.chunk_elems;
    request.dtype = dtype;
    request.op = op;
    request.watchdog_ms = opts.watchdog_ms;
    request.fifo_slots = opts.fifo_slots;
    request.chunk_bytes = opts.chunk_bytes;
    request.threads = opts.threads;
    request.cuda_stream = opts.cuda_stream;
    request.cuda_block_threads = opts.cuda_block_threads;
    request.ranks.resize(plan->program.gpus.size());
    for (size_t r = 0; r < request.ranks.size(); ++r) {
        request.ranks[r].input = static_cast<std::byte*>(inputs[r]);
        request.ranks[r].output = static_cast<std::byte*>(outputs[r]);
    }

    std::unique_lock<std::mutex> busy(comm->busy, std::try_to_lock);
    if (!busy.owns_lock()) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "the communicator is already running a collective");
    }
    RunResult result = opts.backend == MLOPT_BACKEND_CUDA
                           ? run_program_cuda(plan->program, request, comm->cuda_workspace)
                           : run_program(plan->program, request, comm->workspace);
    comm->last_stats = result.stats;
    comm->last_stats.struct_size = sizeof(mlopt_run_stats);
    comm->last_stats.backend = opts.backend;
    if (result.status != MLOPT_OK) return fail(err, result.status, prefixed(*plan, result.message));
    return succeed(err);
}

}  // namespace
}  // namespace mlopt

extern "C" {

MLOPT_API mlopt_status mlopt_comm_create_local(int32_t nranks, mlopt_comm* out, mlopt_error* err) {
    if (out == nullptr) return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (nranks < 1) {
        return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                           "nranks=" + std::to_string(nranks) + ": a communicator needs at least one rank");
    }
    auto* comm = new (std::nothrow) mlopt_comm_s;
    if (comm == nullptr) return mlopt::fail(err, MLOPT_ERR_NO_MEMORY, "out of memory for the communicator");
    comm->nranks = nranks;
    *out = comm;
    return mlopt::succeed(err);
}

MLOPT_API void mlopt_comm_free(mlopt_comm comm) { delete comm; }

MLOPT_API mlopt_status mlopt_backend_available(mlopt_backend backend, mlopt_error* err) {
    try {
        if (backend == MLOPT_BACKEND_CPU) return mlopt::succeed(err);
        if (backend != MLOPT_BACKEND_CUDA) {
            return mlopt::fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                               "backend=" + std::to_string(static_cast<int>(backend)) + " is not a mlopt_backend");
        }
        std::string why;
        const mlopt_status status = mlopt::cuda_backend_available(why);
        return status == MLOPT_OK ? mlopt::succeed(err) : mlopt::fail(err, status, why);
    } catch (...) {
        return mlopt::fail(err, MLOPT_ERR_INTERNAL, "unexpected error in mlopt_backend_available");
    }
}

MLOPT_API int32_t mlopt_comm_size(const mlopt_comm_s* comm) { return comm != nullptr ? comm->nranks : 0; }

MLOPT_API void mlopt_run_options_init(mlopt_run_options* options) {
    if (options == nullptr) return;
    std::memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->backend = MLOPT_BACKEND_CPU;
    options->watchdog_ms = 10000;
    options->fifo_slots = 0;
    options->chunk_bytes = 0;
    options->threads = 0;
    options->cuda_stream = nullptr;
    options->cuda_block_threads = 0;
}

MLOPT_API mlopt_status mlopt_comm_run(mlopt_comm comm, const mlopt_plan_s* program, void* const* inputs,
                                      void* const* outputs, size_t count, mlopt_dtype dtype, mlopt_redop op,
                                      const mlopt_run_options* options, mlopt_error* err) {
    try {
        return mlopt::run_checked(comm, program, inputs, outputs, count, dtype, op, options, err);
    } catch (const std::bad_alloc&) {
        return mlopt::fail(err, MLOPT_ERR_NO_MEMORY, "out of memory");
    } catch (...) {
        return mlopt::fail(err, MLOPT_ERR_INTERNAL, "unexpected error in mlopt_comm_run");
    }
}

MLOPT_API mlopt_status mlopt_comm_last_stats(const mlopt_comm_s* comm, mlopt_run_stats* out) {
    if (comm == nullptr || out == nullptr) return MLOPT_ERR_INVALID_ARGUMENT;
    return mlopt::copy_sized(comm->last_stats, out) ? MLOPT_OK : MLOPT_ERR_INVALID_ARGUMENT;
}

}  // extern "C"

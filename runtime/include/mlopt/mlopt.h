/* mlopt runtime: load mlopt plan files and execute MSCCL-EF collective algorithms.
 *
 * C ABI. Every object is an opaque handle created by a mlopt_<noun>_<verb> function and released by its
 * mlopt_<noun>_free (NULL is accepted and ignored). Functions that can fail return a mlopt_status and, when
 * `err` is not NULL, set *err to a new mlopt_error describing the failure (code, one-line message naming the
 * file and the field, and the position in the input when there is one); the caller frees it with
 * mlopt_error_free. On success *err is set to NULL. No function aborts the process on bad input.
 *
 * Thread safety: handles are not shared-mutable; a plan may be used by several threads at once once loaded;
 * one communicator runs one collective at a time.
 */
#ifndef MLOPT_MLOPT_H
#define MLOPT_MLOPT_H

#include <stddef.h>
#include <stdint.h>

#define MLOPT_VERSION_MAJOR 0
#define MLOPT_VERSION_MINOR 2
#define MLOPT_VERSION_PATCH 0
/* Plan envelope (JSON) schema major version this library reads; see mlopt/formats/plan.py. */
#define MLOPT_PLAN_SCHEMA_MAJOR 1

#if defined(_WIN32)
#define MLOPT_API __declspec(dllexport)
#else
#define MLOPT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ status */

typedef enum mlopt_status {
    MLOPT_OK = 0,
    MLOPT_ERR_INVALID_ARGUMENT = 1, /* NULL handle/pointer, bad enum value, count not a multiple of ... */
    MLOPT_ERR_IO = 2,               /* file cannot be opened or read */
    MLOPT_ERR_PARSE = 3,            /* malformed or truncated XML/JSON (position set) */
    MLOPT_ERR_SCHEMA = 4,           /* unknown format, unsupported major schema version, missing/unknown field */
    MLOPT_ERR_SEMANTIC = 5,         /* ranks, buffer sizes, offsets, peers, dependencies, executor limits */
    MLOPT_ERR_MISMATCH = 6,         /* plan and communicator/buffers disagree (rank count, sizes, dtype) */
    MLOPT_ERR_DEADLOCK = 7,         /* the watchdog saw no progress: message lists blocked ranks/tbs/steps */
    MLOPT_ERR_UNSUPPORTED = 8,      /* dtype/op/backend not available in this build or on this machine */
    MLOPT_ERR_NO_MEMORY = 9,
    MLOPT_ERR_INTERNAL = 10
} mlopt_status;

/* Static text for a status ("ok", "parse error", ...); never NULL. */
MLOPT_API const char* mlopt_status_string(mlopt_status status);
/* The library's version (compare with the MLOPT_VERSION_* macros the caller was compiled with). */
MLOPT_API void mlopt_version(int* major, int* minor, int* patch);

/* ------------------------------------------------------------------------------------------ errors */

typedef struct mlopt_error_s* mlopt_error;

MLOPT_API mlopt_status mlopt_error_status(const struct mlopt_error_s* err);
/* One line: "<file>: <location>: <what>", e.g. "ring.xml: algo/gpu[@id=3]/tb[@id=1]/step[@s=4]@dstoff (line 57):
 * offset 9 + cnt 1 is past o_chunks 8". Valid until mlopt_error_free. */
MLOPT_API const char* mlopt_error_message(const struct mlopt_error_s* err);
MLOPT_API int64_t mlopt_error_line(const struct mlopt_error_s* err);   /* 1-based; 0 when not about a position */
MLOPT_API int64_t mlopt_error_column(const struct mlopt_error_s* err); /* 1-based; 0 when unknown */
MLOPT_API int64_t mlopt_error_offset(const struct mlopt_error_s* err); /* byte offset; -1 when unknown */
MLOPT_API void mlopt_error_free(mlopt_error err);

/* ------------------------------------------------------------------------------------------ plans */

typedef struct mlopt_plan_s* mlopt_plan;

typedef enum mlopt_plan_kind {
    MLOPT_PLAN_NONE = 0,      /* what mlopt_plan_get_kind returns for a NULL plan */
    MLOPT_PLAN_MSCCL_XML = 1, /* an MSCCL-EF algorithm (executor or legacy dialect), runnable */
    MLOPT_PLAN_JSON = 2       /* an mlopt JSON plan envelope (memory, collective sidecar, threads, ...) */
} mlopt_plan_kind;

/* Reads and validates a plan file; the kind is detected from the content ('<' first: XML, '{': JSON). */
MLOPT_API mlopt_status mlopt_plan_load(const char* path, mlopt_plan* out, mlopt_error* err);
/* Same from memory; `name` is used in messages (may be NULL: "<memory>"). */
MLOPT_API mlopt_status mlopt_plan_load_memory(const char* data, size_t size, const char* name, mlopt_plan* out,
                                              mlopt_error* err);
MLOPT_API void mlopt_plan_free(mlopt_plan plan);

MLOPT_API mlopt_plan_kind mlopt_plan_get_kind(const struct mlopt_plan_s* plan);
/* JSON: the envelope's "format" / "schema_version" / "kind" (planner: "memory", "collective", ...).
 * XML: "msccl-ef" / "" / "collective". Strings live as long as the plan. */
MLOPT_API const char* mlopt_plan_format(const struct mlopt_plan_s* plan);
MLOPT_API const char* mlopt_plan_schema_version(const struct mlopt_plan_s* plan);
MLOPT_API const char* mlopt_plan_planner(const struct mlopt_plan_s* plan);

/* MSCCL-EF program summary (XML plans only; MLOPT_ERR_INVALID_ARGUMENT otherwise). */
typedef struct mlopt_program_info {
    size_t struct_size;   /* set by the caller to sizeof(mlopt_program_info): the library fills only what fits */
    const char* name;
    const char* coll;     /* allgather | reducescatter | allreduce | alltoall | broadcast | reduce */
    const char* proto;    /* Simple | LL | LL128 */
    int32_t ngpus;
    int32_t nchannels;
    int32_t nchunksperloop;
    int32_t inplace;      /* 0/1 */
    int32_t outofplace;   /* 0/1 */
    int64_t min_bytes;
    int64_t max_bytes;
    int32_t threadblocks; /* total over all gpus */
    int64_t steps;        /* total over all threadblocks */
    int32_t i_chunks;     /* chunks per rank of the input buffer (the same on every gpu) */
    int32_t o_chunks;     /* ... of the output buffer */
    int32_t s_chunks;     /* largest scratch buffer of any gpu, in chunks */
    int32_t root;         /* broadcast: the only rank that never receives, reduce: the only one that never
                             sends, else 0 (mlopt/sim/symbolic.py); -1 for the other collectives */
} mlopt_program_info;

MLOPT_API mlopt_status mlopt_plan_program_info(const struct mlopt_plan_s* plan, mlopt_program_info* out,
                                               mlopt_error* err);

/* ------------------------------------------------------------------------------------------ execution */

typedef enum mlopt_dtype {
    MLOPT_FLOAT32 = 0,
    MLOPT_FLOAT16 = 1,
    MLOPT_BFLOAT16 = 2,
    MLOPT_INT32 = 3
} mlopt_dtype;

typedef enum mlopt_redop { MLOPT_SUM = 0, MLOPT_PROD = 1, MLOPT_MAX = 2, MLOPT_MIN = 3 } mlopt_redop;

/* CPU: ranks are threads of this process, buffers are host memory. CUDA (builds with MLOPT_CUDA, see
 * mlopt_backend_available): one kernel launch on the calling thread's current GPU runs the whole program, one
 * CUDA block per threadblock of every rank; buffers are memory that GPU can address (cudaMalloc'd on it,
 * managed, or pinned host memory), and the call blocks until the kernel has finished. */
typedef enum mlopt_backend { MLOPT_BACKEND_CPU = 0, MLOPT_BACKEND_CUDA = 1 } mlopt_backend;

/* MLOPT_OK when `backend` can run here; else MLOPT_ERR_UNSUPPORTED with the reason in *err (not built with
 * CUDA, no GPU, driver too old). */
MLOPT_API mlopt_status mlopt_backend_available(mlopt_backend backend, mlopt_error* err);

/* An in-process communicator: ranks share this process's memory (threads of it on the CPU backend). */
typedef struct mlopt_comm_s* mlopt_comm;

MLOPT_API mlopt_status mlopt_comm_create_local(int32_t nranks, mlopt_comm* out, mlopt_error* err);
MLOPT_API void mlopt_comm_free(mlopt_comm comm);
MLOPT_API int32_t mlopt_comm_size(const struct mlopt_comm_s* comm);

typedef struct mlopt_run_options {
    size_t struct_size;       /* sizeof(mlopt_run_options): lets the struct grow compatibly */
    mlopt_backend backend;    /* MLOPT_BACKEND_CPU */
    int32_t watchdog_ms;      /* no progress for this long = MLOPT_ERR_DEADLOCK; <= 0: 10000 */
    int32_t fifo_slots;       /* messages in flight per (sender, receiver, channel); <= 0: unbounded */
    int64_t chunk_bytes;      /* most bytes one chunk covers in one loop iteration (the executor's slice);
                                 <= 0: the whole buffer in one iteration */
    int32_t threads;          /* worker threads of the CPU backend; <= 0: one per hardware thread */
    void* cuda_stream;        /* CUDA backend: the cudaStream_t to run on; NULL: the default stream */
    int32_t cuda_block_threads; /* CUDA backend: threads per CUDA block (32..512, a multiple of 32); <= 0: 512 */
} mlopt_run_options;

MLOPT_API void mlopt_run_options_init(mlopt_run_options* options);

/* Buffer sizes, as the MSCCL executor splits them (mlopt/sim/symbolic.py, "Chunks per rank"): `count` is the
 * number of elements of each rank's INPUT buffer (NCCL's sendcount); output elements per rank =
 * count * o_chunks / i_chunks (count must be a multiple of i_chunks). Each buffer is i_chunks / o_chunks /
 * s_chunks chunks of count / i_chunks elements; a loop iteration moves a slice of every chunk (at most
 * chunk_bytes of it, see mlopt_run_options), and the program repeats until every chunk is covered. */
MLOPT_API mlopt_status mlopt_output_count(const struct mlopt_plan_s* plan, size_t count, size_t* out_count,
                                          mlopt_error* err);

/* Runs the program on every rank of `comm` (blocking until all ranks finish). inputs[r] and outputs[r] are
 * rank r's buffers (outputs[r] == inputs[r] or overlapping as the executor's in-place layout: in-place run,
 * which the program must declare). The program's ngpus must equal the communicator's size. */
MLOPT_API mlopt_status mlopt_comm_run(mlopt_comm comm, const struct mlopt_plan_s* program, void* const* inputs,
                                      void* const* outputs, size_t count, mlopt_dtype dtype, mlopt_redop op,
                                      const mlopt_run_options* options, mlopt_error* err);

/* Counters of the last run on `comm` (for per-step overhead measurements). */
typedef struct mlopt_run_stats {
    size_t struct_size;      /* set by the caller to sizeof(mlopt_run_stats): the library fills only what fits */
    int64_t steps_executed;  /* over all ranks, threadblocks and loop iterations */
    int64_t messages;        /* FIFO messages pushed */
    int64_t bytes_moved;     /* bytes copied by sends/receives/copies */
    int64_t loop_iterations;
    double wall_us;          /* the run on the calling thread, from start to finish (CUDA: launch to completion) */
    double device_us;        /* CUDA: the kernel alone, by CUDA events; 0 on the CPU backend */
    int32_t backend;         /* mlopt_backend of the run */
} mlopt_run_stats;

/* out->struct_size must be set (sizeof(mlopt_run_stats), or a smaller size from an older header). */
MLOPT_API mlopt_status mlopt_comm_last_stats(const struct mlopt_comm_s* comm, mlopt_run_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* MLOPT_MLOPT_H */

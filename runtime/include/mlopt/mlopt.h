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
 *
 * 0.4 adds multi-process communicators (mlopt_comm_create, mlopt_comm_create_tcp, mlopt_comm_run_rank) and the
 * enforcer over them (mlopt_enforcer_create_comm).
 */
#ifndef MLOPT_MLOPT_H
#define MLOPT_MLOPT_H

#include <stddef.h>
#include <stdint.h>

#define MLOPT_VERSION_MAJOR 0
#define MLOPT_VERSION_MINOR 4
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
    MLOPT_ERR_SEMANTIC = 5,         /* ranks, buffer sizes, offsets, peers, dependencies, executor limits, a
                                       deadlock the program is certain to reach */
    MLOPT_ERR_MISMATCH = 6,         /* plan and communicator/buffers disagree (rank count, sizes, dtype) */
    MLOPT_ERR_DEADLOCK = 7,         /* the watchdog saw no progress: message lists blocked ranks/tbs/steps */
    MLOPT_ERR_UNSUPPORTED = 8,      /* dtype/op/backend not available in this build or on this machine; an
                                       input that is valid but that mlopt does not model (a collective it
                                       lacks, a program too large for its proof: docs/input-contract.md) */
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
    int32_t i_chunks;     /* chunks per rank of the input buffer (the same on every gpu); as the program
                             runs: an in-place-only program that declares 0 for the buffer it shares gets
                             that buffer's window here (e.g. an in-place allgather's i_chunks = its share) */
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

/* ------------------------------------------------------------------------------------------ multi-process */

/* A multi-process communicator: one process per rank (the way torchrun starts a training job). Each process
 * creates it with its own rank; every rank runs its part of a program with mlopt_comm_run_rank, and the ranks'
 * threadblocks talk through a transport chosen per pair of ranks: shared memory between processes of one host
 * (POSIX shm, one FIFO per (sender, receiver, channel)), TCP between hosts. The interpreter's semantics,
 * watchdog and step types are those of mlopt_comm_run.
 *
 * Faults: a rank that never joins makes mlopt_comm_create fail on the others after init_timeout_ms (naming the
 * missing ranks); a rank that dies or fails during a run makes the others' runs fail within watchdog_ms (its
 * death is seen within about 100 ms on shared memory and at once on TCP); ranks that call a run with different
 * programs, counts, dtypes or reduction ops fail with MLOPT_ERR_MISMATCH naming both sides. After a failed run
 * the communicator is broken: every later run returns the first failure; free it. Shared-memory segments have
 * no name left once mlopt_comm_create returns (they are unlinked as soon as every peer has mapped them), so a
 * killed process leaves nothing in /dev/shm. */

/* A key-value store every rank reaches, used only during mlopt_comm_create (torch.distributed's TCPStore or
 * FileStore from Python, or the caller's own). Keys are NUL-terminated; values are bytes. */
typedef struct mlopt_bootstrap {
    size_t struct_size; /* sizeof(mlopt_bootstrap) */
    void* ctx;          /* passed to both callbacks */
    /* Stores `size` bytes under `key`, visible to every rank. Returns 0 on success. */
    int (*set)(void* ctx, const char* key, const void* value, size_t size);
    /* Waits up to timeout_ms for `key` to be set, then copies min(capacity, value size) bytes into `value`
     * and the value's full size into *size. Returns 0 on success, 1 when it timed out, other values on error. */
    int (*get)(void* ctx, const char* key, void* value, size_t capacity, size_t* size, int32_t timeout_ms);
} mlopt_bootstrap;

typedef enum mlopt_transport {
    MLOPT_TRANSPORT_AUTO = 0, /* shared memory with ranks of the same host, TCP with the others */
    MLOPT_TRANSPORT_SHM = 1,  /* shared memory with every rank (all on one host, else MLOPT_ERR_UNSUPPORTED) */
    MLOPT_TRANSPORT_TCP = 2   /* TCP with every rank, also on one host */
} mlopt_transport;

typedef struct mlopt_comm_options {
    size_t struct_size;          /* sizeof(mlopt_comm_options): lets the struct grow compatibly */
    mlopt_transport transport;   /* MLOPT_TRANSPORT_AUTO */
    int32_t init_timeout_ms;     /* every rank joins within this; <= 0: 30000 */
    int64_t shm_fifo_bytes;      /* bytes of one shared-memory FIFO (a power of two in [4096, 256 MiB]); <= 0:
                                    4 MiB. Each stream's FIFO is reserved in /dev/shm when first used */
    int32_t spin_us;             /* a waiting thread spins this long before it sleeps on a futex; < 0: 0; 0: 20 */
    const char* host_id;         /* ranks with equal host ids share memory; NULL or "": hostname + boot id + pid
                                    namespace (containers that cannot see each other's pids use TCP) */
    const char* tcp_address;     /* IPv4 address this rank listens on for TCP peers; NULL or "": 127.0.0.1 when
                                    every rank is on this host, else the address of the hostname */
    const char* key_prefix;      /* prefix of bootstrap keys (several communicators on one store); NULL: "mlopt" */
} mlopt_comm_options;

MLOPT_API void mlopt_comm_options_init(mlopt_comm_options* options);

/* This process's rank `rank` of `nranks` (0 <= rank < nranks), rendezvousing through `bootstrap`. Blocks until
 * every rank has joined and every transport is connected (a collective call: every rank must make it).
 * MLOPT_ERR_IO when a rank does not join within init_timeout_ms ("ranks 2, 3 did not join within 30000 ms"), a
 * rank failed during its create ("rank 1 failed: ...", published on the store so the others stop waiting), or a
 * segment, socket or the store fails; MLOPT_ERR_UNSUPPORTED for MLOPT_TRANSPORT_SHM across hosts. Keys are
 * "<key_prefix>/info/<rank>", ".../tcp/<rank>", ".../ready/<rank>" and ".../abort", never deleted: each
 * communicator made on one store needs its own key_prefix. */
MLOPT_API mlopt_status mlopt_comm_create(int32_t rank, int32_t nranks, const mlopt_bootstrap* bootstrap,
                                         const mlopt_comm_options* options, mlopt_comm* out, mlopt_error* err);
/* The same with mlopt's own TCP rendezvous for users without a store: rank 0 listens on `address`
 * ("host:port"), the others connect to it. */
MLOPT_API mlopt_status mlopt_comm_create_tcp(const char* address, int32_t rank, int32_t nranks,
                                             const mlopt_comm_options* options, mlopt_comm* out, mlopt_error* err);
/* This process's rank; -1 for an in-process communicator. */
MLOPT_API int32_t mlopt_comm_rank(const struct mlopt_comm_s* comm);
/* How this rank reaches `peer`: "shm", "tcp", "self" (peer == rank) or "local" (in-process communicator);
 * NULL for a bad argument. Static strings. */
MLOPT_API const char* mlopt_comm_peer_transport(const struct mlopt_comm_s* comm, int32_t peer);

/* Runs this process's rank of `program` on a multi-process communicator (blocking until the rank's part is
 * done; other ranks may still be finishing). `input` and `output` are this rank's buffers, laid out as for
 * mlopt_comm_run (count elements of input; in place: the executor's layout). Every rank must call it with the
 * same program, count, dtype and op, in the same order of runs. options: backend must be MLOPT_BACKEND_CPU;
 * watchdog_ms, chunk_bytes as for mlopt_comm_run (fifo_slots and threads are ignored: the transport's FIFOs
 * bound what is in flight, and each threadblock of the rank has a thread). MLOPT_ERR_INVALID_ARGUMENT on an
 * in-process communicator (and mlopt_comm_run on a multi-process one); MLOPT_ERR_UNSUPPORTED for the CUDA backend.
 *
 * Messages stream through the FIFOs (no copy of a whole message is kept): a step blocks until its message has
 * gone through, so ranks that all send before they receive (a ring) deadlock when one message is larger than a
 * FIFO. chunk_bytes <= 0 therefore slices chunks here so that no message carries more than 1 MiB (every rank
 * derives the same slices from the program and dtype); an explicit chunk_bytes times the program's largest cnt,
 * plus a 112-byte header, should stay below shm_fifo_bytes.
 *
 * Failures of a run: MLOPT_ERR_MISMATCH when a peer runs another program, count, dtype, op or slicing, or another
 * run (it ran a collective this rank did not); the message names both sides ("rank 0 runs 'allreduce_ring'
 * count=1024 float32 sum ...; rank 1 sent for 'x' count=2048 ..."). MLOPT_ERR_SEMANTIC when a message does not
 * match its receiving step. MLOPT_ERR_DEADLOCK when nothing moved on this rank for watchdog_ms (the message lists
 * what each unfinished threadblock of the rank waits for), and also when a peer died or failed: the run cannot
 * complete ("peer failed: " and the transport's reason, e.g. "rank 0 (pid 123) exited"). A failed run aborts this
 * rank's transport, so that its peers fail at once rather than at their watchdogs, and breaks the communicator.
 * Argument errors (found before the run starts) break nothing and do not count as a run; the peers wait for this
 * rank up to their watchdog. */
MLOPT_API mlopt_status mlopt_comm_run_rank(mlopt_comm comm, const struct mlopt_plan_s* program, const void* input,
                                           void* output, size_t count, mlopt_dtype dtype, mlopt_redop op,
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

/* ------------------------------------------------------------------------------------------ enforcer */

/* Syndicate's plan enforcer (Pseudocode 2; docs/enforcer.md): every rank issues the motifs of a schedule
 * plan in one global order, whatever order its application submits the comm-ops in.
 *
 * A comm-op ("op", numbered 0..ops-1 = its FIFO submission index within a training iteration) is split into
 * motifs: smaller collectives over a subset of the ranks, each an MSCCL-EF program run on staging buffers
 * gathered from (and scattered back into) the op's per-rank buffers. Each motif has a sequence number (seq)
 * within the iteration; equal numbers are issued together. Ranks are in-process, as for mlopt_comm: each
 * rank's application thread calls submit/wait with its own rank (mlopt_enforcer_create); or one per process,
 * over a multi-process communicator (mlopt_enforcer_create_comm).
 *
 * Execution model (what makes the order matter, as NCCL communicators and streams do): every (rank,
 * channel) has a FIFO queue of issued motifs; a motif instance runs when it is at the head of every one of
 * its channel queues on every one of its ranks and its deps (motifs of the same op and iteration) have
 * completed. A running motif keeps its channels until it completes; motifs on disjoint channels overlap.
 *
 * enforce_order = 1: one progress thread per rank walks the rank's expected sequence numbers (the sorted
 * distinct seqs of the motifs involving it) and issues the motifs of the next one only once all of them
 * are submitted (for the current iteration), so every rank's queues follow the order (iteration, seq, op,
 * index). enforce_order = 0: a rank issues an op's motifs as soon as it submits the op (the baseline;
 * inconsistent submission orders then deadlock, reported by the watchdog).
 *
 * Thread safety: submit/wait/drain/get_stats/issue_log may be called from any thread once started
 * (typically each rank's application thread for its rank); create/add_motif/start/free from one thread,
 * with no other call in flight during free. */
typedef struct mlopt_enforcer_s* mlopt_enforcer;

typedef struct mlopt_enforcer_options {
    size_t struct_size;      /* sizeof(mlopt_enforcer_options): lets the struct grow compatibly */
    int32_t watchdog_ms;     /* nothing submitted, issued or completed for this long while some submitted op
                                is unfinished = MLOPT_ERR_DEADLOCK (longer than any compute gap between an
                                application's submissions); <= 0: 10000. Also each motif run's watchdog */
    double replan_threshold; /* replan_suggested when an iteration's wait time > this x its wall time; 0.05 */
    int32_t threads;         /* interpreter worker threads per motif run; <= 0: 1 */
    int32_t enforce_order;   /* 1: Pseudocode 2 (default); 0: issue on submission, in arrival order */
    int32_t executors;       /* threads running motifs (motifs on disjoint channels or ranks overlap); <= 0: 4 */
} mlopt_enforcer_options;

MLOPT_API void mlopt_enforcer_options_init(mlopt_enforcer_options* options);

/* Where a motif's staging input comes from: the op's output buffer (every collective but all-to-all works
 * in place: output starts as a copy of the input) or its input buffer (all-to-all). */
typedef enum mlopt_motif_source { MLOPT_MOTIF_FROM_OUTPUT = 0, MLOPT_MOTIF_FROM_INPUT = 1 } mlopt_motif_source;

/* length bytes between the op's buffer at op_offset and a program buffer (staging) at staging_offset. */
typedef struct mlopt_byte_range {
    uint64_t op_offset;
    uint64_t staging_offset;
    uint64_t length;
} mlopt_byte_range;

/* One program position's copies: gather (op buffer -> program input staging, before the run; staging bytes
 * no range covers are zero) and scatter (program output staging -> op OUTPUT buffer, after the run). */
typedef struct mlopt_motif_position {
    const mlopt_byte_range* gather;
    size_t gather_count;
    const mlopt_byte_range* scatter;
    size_t scatter_count;
} mlopt_motif_position;

/* One motif of one comm-op of a training iteration (every iteration repeats the table). Everything is copied
 * by mlopt_enforcer_add_motif (the program too: the caller may free it afterwards). */
typedef struct mlopt_motif_desc {
    size_t struct_size;        /* sizeof(mlopt_motif_desc) */
    const char* name;          /* for messages; may be NULL */
    int32_t op;                /* comm-op index within an iteration, 0..ops-1 (its FIFO submission index) */
    int32_t index;             /* motif index within the op, dense 0..k-1 */
    int32_t seq;               /* sequence number within the iteration, >= 0 */
    const struct mlopt_plan_s* program; /* MSCCL-EF XML plan, ngpus == nranks, outofplace="1" */
    int32_t nranks;            /* the motif's ranks; program position p is ranks[p] */
    const int32_t* ranks;      /* distinct global ranks in 0..enforcer nranks-1 */
    const int32_t* deps;       /* motif indices of the same op (each < index, seq <= this seq) completed first */
    size_t deps_count;
    uint64_t channel_mask;     /* bit c: channel c (0..63); a motif holds all its channels while it runs */
    mlopt_dtype dtype;
    mlopt_redop redop;
    size_t count;              /* elements of each position's program input, as for mlopt_comm_run */
    uint64_t op_bytes;         /* the op's buffer size on each rank (input and output alike) */
    mlopt_motif_source source; /* which op buffer gather ranges read */
    const mlopt_motif_position* positions; /* nranks entries */
} mlopt_motif_desc;

/* Per-rank counters (mlopt_enforcer_get_stats). An iteration's wait time is the time its progress thread
 * spent waiting for the next expected motif while some other submitted motif of the rank was queued (the
 * busy loop of Pseudocode 2 that ordering causes); wall time is from the rank's first submission of the
 * iteration to the completion of its last motif. */
typedef struct mlopt_enforcer_stats {
    size_t struct_size;        /* set by the caller: the library fills only what fits */
    int64_t iterations;        /* iterations whose every motif involving the rank has completed */
    int64_t motifs_issued;
    int64_t motifs_completed;  /* motif instances involving the rank that completed */
    double wait_us;            /* total over all iterations */
    double last_wait_us;       /* the last completed iteration's */
    double last_wall_us;
    int32_t replan_suggested;  /* last_wait_us > replan_threshold * last_wall_us */
} mlopt_enforcer_stats;

/* Most issue-log entries kept per rank (the first ones; motifs_issued counts them all). */
#define MLOPT_ENFORCER_LOG_CAPACITY (1u << 20)

MLOPT_API mlopt_status mlopt_enforcer_create(int32_t nranks, const mlopt_enforcer_options* options,
                                             mlopt_enforcer* out, mlopt_error* err);
/* The enforcer of one rank of a multi-process communicator: this process is rank mlopt_comm_rank(comm) and
 * submits/waits with that rank only. Every rank adds the same motif table (motifs without this rank are checked
 * and skipped); a motif runs its program with mlopt_comm_run_rank over `comm` (which the enforcer uses from then
 * on: run nothing else on it until the enforcer is freed, and free the enforcer before the communicator).
 * Motifs running at once use disjoint channels, each channel its own FIFOs, so their messages never mix.
 * A motif runs once it heads this rank's queues of its channels and its deps that involve this rank completed
 * (deps without this rank change none of its buffers; the messages from the ranks they involve wait for them);
 * the ranks agree because they issue in the same order. A motif run that fails fails the enforcer and breaks the
 * communicator; a peer running another motif on a shared channel (orders that differ, enforce_order = 0) is
 * MLOPT_ERR_DEADLOCK, as in process. Freeing the enforcer cancels a running motif (within ~100 ms), which leaves
 * the communicator broken. MLOPT_ERR_INVALID_ARGUMENT for an in-process or busy communicator; a broken one returns
 * its failure. */
MLOPT_API mlopt_status mlopt_enforcer_create_comm(mlopt_comm comm, const mlopt_enforcer_options* options,
                                                  mlopt_enforcer* out, mlopt_error* err);
/* Stops the threads (pending work is dropped; a running motif finishes first) and frees everything. */
MLOPT_API void mlopt_enforcer_free(mlopt_enforcer enforcer);
/* Adds one motif to the table (before start); MLOPT_ERR_INVALID_ARGUMENT naming the op, motif and field. */
MLOPT_API mlopt_status mlopt_enforcer_add_motif(mlopt_enforcer enforcer, const mlopt_motif_desc* motif,
                                                mlopt_error* err);
/* Freezes the table (ops 0..ops-1, motifs 0..k-1 of each) and starts the threads. */
MLOPT_API mlopt_status mlopt_enforcer_start(mlopt_enforcer enforcer, mlopt_error* err);
/* Rank `rank` submits `op` (non-blocking); its k-th submission belongs to iteration k. input and output are
 * op_bytes each, valid until the submission completes; when they differ and a motif of the op reads the
 * output, input is first copied to output. An op whose motifs read the input needs output != input. */
MLOPT_API mlopt_status mlopt_enforcer_submit(mlopt_enforcer enforcer, int32_t rank, int32_t op, const void* input,
                                             void* output, mlopt_error* err);
/* Blocks until rank's latest submission of `op` (op = -1: every submission of the rank) has completed;
 * MLOPT_ERR_DEADLOCK when the watchdog fired (message: what each rank is blocked on), or the error of a
 * failed motif run. After a failure every call returns that error: free the enforcer. */
MLOPT_API mlopt_status mlopt_enforcer_wait(mlopt_enforcer enforcer, int32_t rank, int32_t op, mlopt_error* err);
/* mlopt_enforcer_wait(rank, -1) for every rank. */
MLOPT_API mlopt_status mlopt_enforcer_drain(mlopt_enforcer enforcer, mlopt_error* err);
MLOPT_API mlopt_status mlopt_enforcer_get_stats(const struct mlopt_enforcer_s* enforcer, int32_t rank,
                                                mlopt_enforcer_stats* out, mlopt_error* err);
/* Rank's issued motifs in issue order: entry i is (ops[i], indices[i], iterations[i]); the first
 * min(capacity, *count) are written (arrays may be NULL when capacity is 0); *count = entries stored. */
MLOPT_API mlopt_status mlopt_enforcer_issue_log(const struct mlopt_enforcer_s* enforcer, int32_t rank, int32_t* ops,
                                                int32_t* indices, int32_t* iterations, size_t capacity,
                                                size_t* count, mlopt_error* err);

#ifdef __cplusplus
}
#endif

#endif /* MLOPT_MLOPT_H */

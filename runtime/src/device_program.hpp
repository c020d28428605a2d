// A validated Program flattened into the plain tables the CUDA backend's kernel reads (src/cuda/backend.cu),
// and the host-side parts of a GPU run that need no GPU: FIFO sizing, the run's counters, and the text of a
// deadlock or message-mismatch report read back from the kernel. Compiled into every build (g++ and nvcc
// both read this header), so that the flattening is unit-tested on machines without a GPU.
//
// Device-side protocol, one CUDA block per threadblock (see backend.cu): a connection (sender, receiver,
// channel) is a single-producer single-consumer ring of message slots; the sender publishes a message by
// raising `tail`, the receiver takes it by raising `taken` when its step starts (before the data moves). A
// FIFO of `capacity` messages, counted as the CPU backend counts them (sent and not yet taken), needs
// capacity + 1 slots: the receiver may still be reading the message it took, and it takes the next one only
// after it has finished with that. A threadblock that completes a hasdep step raises its flag to
// flag_value(iteration, step) (0: nothing signalled yet).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlopt/mlopt.h"
#include "program.hpp"

namespace mlopt {
namespace device {

// One step, as the kernel reads it (24 bytes).
struct Step {
    int32_t srcoff;
    int32_t dstoff;
    int32_t cnt;
    int32_t dep_tb;    // flat index (over all ranks) of the threadblock waited for; -1: none
    int32_t dep_step;  // step of that threadblock
    uint8_t type;      // StepType
    uint8_t srcbuf;    // Buffer
    uint8_t dstbuf;
    uint8_t signal;    // 1: raise this threadblock's flag after the step (hasdep, not a nop)
};

struct Threadblock {
    int32_t rank;
    int32_t id;
    int32_t first_step;  // index into the step table
    int32_t nsteps;
    int32_t send_conn;   // -1: none
    int32_t recv_conn;
};

struct Connection {
    int32_t from;
    int32_t to;
    int32_t chan;
    int32_t capacity;        // messages sent and not yet taken, at most (the FIFO's depth, >= 1)
    int32_t slots;           // message slots in the ring: capacity + 1
    int64_t slot_offset;     // bytes from the start of the FIFO area to slot 0
    int64_t slot_bytes;      // bytes per slot (a multiple of 16)
    int32_t meta_offset;     // index of slot 0's SlotMeta
    int32_t messages;        // messages per loop iteration
};

// What the sender wrote beside a message, so that the receiver can check it pairs up (as the CPU backend).
struct SlotMeta {
    int32_t cnt;
    int32_t iteration;
};

// Counters of one connection, each on its own 128-byte line: the sender spins on `taken`, the receiver on
// `tail`.
struct ConnectionSync {
    unsigned long long taken;
    unsigned long long pad_taken[15];
    unsigned long long tail;
    unsigned long long pad_tail[15];
};

// Where a threadblock stood when the kernel ended; read back by the host for reports.
enum ExitState : int32_t {
    kExitNotStarted = 0,
    kExitFinished = 1,
    kExitWaitDependency = 2,
    kExitWaitMessage = 3,
    kExitWaitSpace = 4,
    kExitBadMessage = 5,  // received a message whose cnt or iteration does not match the step
};

struct ThreadblockExit {
    int32_t state;
    int32_t pc;
    int64_t iteration;
    int32_t got_cnt;        // kExitBadMessage: what the message said
    int32_t got_iteration;
};

// Why the kernel stopped early; the first reason wins (0: it did not).
enum StopReason : int32_t { kStopNone = 0, kStopDeadlock = 1, kStopBadMessage = 2 };

// Per-rank buffers as the kernel sees them.
struct RankBuffers {
    unsigned char* input;
    unsigned char* output;
    unsigned char* scratch;
};

// Everything one launch needs; passed by value as the kernel's only argument.
struct KernelArgs {
    const Step* steps;
    const Threadblock* tbs;
    const Connection* conns;
    const RankBuffers* ranks;
    unsigned char* fifo;           // FIFO slot area
    SlotMeta* meta;                // one per slot of every connection
    ConnectionSync* sync;          // one per connection
    unsigned long long* flags;     // one per threadblock
    ThreadblockExit* exits;        // one per threadblock
    unsigned long long* progress;  // steps completed, over all threadblocks (the watchdog's clock)
    int32_t* stop;                 // StopReason
    int64_t chunk_elems;           // elements per chunk
    int64_t slice_elems;           // elements of each chunk per loop iteration
    int64_t iterations;
    unsigned long long watchdog_ns;
};

// Flag value a dependency waits for: the step `step` of loop iteration `iteration` completed (plus one, so
// that 0 means nothing signalled).
#ifdef __CUDACC__
#define MLOPT_HOST_DEVICE __host__ __device__
#else
#define MLOPT_HOST_DEVICE
#endif
MLOPT_HOST_DEVICE inline unsigned long long flag_value(int64_t iteration, int64_t step) {
    return (static_cast<unsigned long long>(iteration) << 32 | static_cast<unsigned long long>(step)) + 1ull;
}

// The host's view of one run: tables and the sizes of the device areas.
struct Layout {
    std::vector<Step> steps;
    std::vector<Threadblock> tbs;
    std::vector<Connection> conns;
    int32_t meta_slots = 0;        // SlotMeta entries
    int64_t fifo_bytes = 0;        // FIFO slot area
    std::vector<int64_t> scratch_bytes;  // per rank
    int64_t chunk_elems = 0;
    int64_t slice_elems = 0;
    int64_t iterations = 0;
};

// Flattens `program` for a run with `chunk_elems` elements per chunk of `elem_size` bytes. chunk_bytes and
// fifo_slots as in mlopt_run_options: chunk_bytes <= 0 moves whole chunks per iteration; fifo_slots <= 0
// gives every connection the capacity of the messages it carries in one loop iteration (the CPU backend's
// unbounded FIFO never holds more of one iteration, and the messages of the next wait for nothing the
// receiver needs to finish this one), else min(fifo_slots, that).
Layout make_layout(const Program& program, size_t chunk_elems, size_t elem_size, int64_t chunk_bytes,
                   int32_t fifo_slots);

// The counters a completed run reports (mlopt_run_stats), computed from the layout as the CPU backend counts
// them: steps over all iterations, FIFO messages, bytes copied by data steps.
mlopt_run_stats completed_stats(const Program& program, const Layout& layout, size_t elem_size);

// One line for a kernel that stopped early: "deadlock: no step completed for 200 ms: rank 0 tb 0 step 1 (r)
// waits for a message from rank 1 on channel 0; ..." or the mismatched message's receiver and sender.
std::string describe_stop(const Program& program, const Layout& layout, int32_t reason,
                          const std::vector<ThreadblockExit>& exits, int32_t watchdog_ms);

}  // namespace device
}  // namespace mlopt

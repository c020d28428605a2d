// The CUDA backend (cuda_backend.hpp): one kernel launch runs a whole MSCCL-EF program, one CUDA block per
// threadblock of every rank, all ranks' buffers addressable by the launching GPU.
//
// Each block walks its threadblock's steps, loop iteration by loop iteration, exactly as the CPU interpreter
// (interpreter.cpp) does, so that both backends compute the same bits: the same slices, the same operand
// order of every reduction (received message first), float16/bfloat16 reduced through float with the same
// round-to-nearest-even encoders (reduce.hpp), the same piece order when a step's source and destination
// overlap. Thread 0 of a block does the waiting; the whole block moves the data:
//   dependency: spin until the flag of the threadblock waited for reaches flag_value(iteration, step);
//   receive:    spin until the connection's tail passes the messages this block has taken, check the slot's
//               SlotMeta (cnt, iteration) as the CPU backend checks a message, and take it (raise `taken`:
//               on the CPU a received message leaves the FIFO when the step starts, too);
//   send:       spin until fewer than `capacity` messages are sent and not yet taken;
//   then every thread moves its part, all fence and meet at a barrier, and thread 0 publishes: release-store
//   the new tail (a message), the flag (hasdep), and counts one step of progress.
// Message payloads are copies in FIFO slots (device_program.hpp sizes them), so a sender may overwrite its
// buffers once its step is done, as on the CPU.
//
// Blocks wait on each other, so all of them must be resident at once: the launch is cooperative (the driver
// refuses a grid that cannot be co-resident) and the occupancy is checked first for a clear message. A waiting
// thread 0 watches a global progress counter: no step completed anywhere for watchdog_ms means a deadlock;
// every block then records where it stands and leaves, and the host writes the report the CPU backend would.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_backend.hpp"
#include "device_program.hpp"
#include "reduce.hpp"

namespace mlopt {

using device::KernelArgs;

namespace {

// ------------------------------------------------------------------------------------------------ memory order

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ int32_t load_relaxed(const int32_t* p) {
    int32_t v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ------------------------------------------------------------------------------------------------ elements

// The CPU backend's encoders (reduce.hpp), bit for bit.
__device__ __forceinline__ float half_to_float(uint16_t half) {
    const uint32_t magnitude = static_cast<uint32_t>(half & 0x7fffu) << 13;
    uint32_t bits = __float_as_uint(__uint_as_float(magnitude) * 0x1p112f);
    bits |= magnitude >= (0x7c00u << 13) ? 0x7f800000u : 0u;
    return __uint_as_float(bits | static_cast<uint32_t>(half & 0x8000u) << 16);
}

__device__ __forceinline__ uint16_t float_to_half(float value) {
    uint32_t bits = __float_as_uint(value);
    const uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    const uint32_t huge = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
    const uint32_t tiny = __float_as_uint(__fadd_rn(__uint_as_float(bits), 0.5f)) - 0x3f000000u;
    const uint32_t normal = (bits + 0xc8000fffu + ((bits >> 13) & 1u)) >> 13;
    const uint32_t half = bits >= 0x47800000u ? huge : (bits < 0x38800000u ? tiny : normal);
    return static_cast<uint16_t>(half | sign >> 16);
}

__device__ __forceinline__ float bfloat16_to_float(uint16_t value) {
    return __uint_as_float(static_cast<uint32_t>(value) << 16);
}

__device__ __forceinline__ uint16_t float_to_bfloat16(float value) {
    const uint32_t bits = __float_as_uint(value);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

template <int Op>
__device__ __forceinline__ float apply(float a, float b) {
    if (Op == MLOPT_SUM) return __fadd_rn(a, b);
    if (Op == MLOPT_PROD) return __fmul_rn(a, b);
    if (Op == MLOPT_MAX) return a > b ? a : b;
    return a < b ? a : b;
}

template <int Op>
__device__ __forceinline__ int32_t apply(int32_t a, int32_t b) {
    if (Op == MLOPT_SUM) return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
    if (Op == MLOPT_PROD) return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
    if (Op == MLOPT_MAX) return a > b ? a : b;
    return a < b ? a : b;
}

// Storage type and a op b for each mlopt_dtype.
template <int Dtype>
struct Element;

template <>
struct Element<MLOPT_FLOAT32> {
    using T = float;
    template <int Op>
    static __device__ __forceinline__ T combine(T a, T b) { return apply<Op>(a, b); }
};

template <>
struct Element<MLOPT_INT32> {
    using T = int32_t;
    template <int Op>
    static __device__ __forceinline__ T combine(T a, T b) { return apply<Op>(a, b); }
};

template <>
struct Element<MLOPT_FLOAT16> {
    using T = unsigned short;
    template <int Op>
    static __device__ __forceinline__ T combine(T a, T b) {
        return float_to_half(apply<Op>(half_to_float(a), half_to_float(b)));
    }
};

template <>
struct Element<MLOPT_BFLOAT16> {
    using T = unsigned short;
    template <int Op>
    static __device__ __forceinline__ T combine(T a, T b) {
        return float_to_bfloat16(apply<Op>(bfloat16_to_float(a), bfloat16_to_float(b)));
    }
};

// ------------------------------------------------------------------------------------------------ data moves

// What a piece does with its operands: a is the first operand (the received message or the source), b the
// second (the source of a reduction); results go to d, and also to e for the steps that keep and forward.
enum Move : int { kCopy, kCopyTwice, kReduce, kReduceTwice };

template <typename T>
union Vector {
    uint4 raw;
    T lanes[sizeof(uint4) / sizeof(T)];
};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// One piece of n elements by the whole block: 16-byte vectors where every pointer allows, element by element
// otherwise. Loads bypass L1 (__ldcg): other blocks wrote the data since this SM may last have cached it.
template <int Dtype, int Op, int M>
__device__ void move_piece(typename Element<Dtype>::T* d, typename Element<Dtype>::T* e,
                           const typename Element<Dtype>::T* a, const typename Element<Dtype>::T* b, int64_t n) {
    using E = Element<Dtype>;
    using T = typename E::T;
    constexpr int kLanes = sizeof(uint4) / sizeof(T);
    constexpr int kUnroll = 4;
    const int64_t stride = blockDim.x;
    int64_t vectors = 0;
    const bool reduces = M == kReduce || M == kReduceTwice;
    const bool twice = M == kCopyTwice || M == kReduceTwice;
    if (aligned16(d) && aligned16(a) && (!reduces || aligned16(b)) && (!twice || aligned16(e))) {
        vectors = n / kLanes;
        const uint4* va = reinterpret_cast<const uint4*>(a);
        const uint4* vb = reinterpret_cast<const uint4*>(b);
        uint4* vd = reinterpret_cast<uint4*>(d);
        uint4* ve = reinterpret_cast<uint4*>(e);
        for (int64_t base = threadIdx.x; base < vectors; base += stride * kUnroll) {
            Vector<T> x[kUnroll];
            Vector<T> y[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t i = base + u * stride;
                if (i < vectors) {
                    x[u].raw = __ldcg(va + i);
                    if (reduces) y[u].raw = __ldcg(vb + i);
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t i = base + u * stride;
                if (i >= vectors) continue;
                if (reduces) {
#pragma unroll
                    for (int l = 0; l < kLanes; ++l) {
                        x[u].lanes[l] = E::template combine<Op>(x[u].lanes[l], y[u].lanes[l]);
                    }
                }
                vd[i] = x[u].raw;
                if (twice) ve[i] = x[u].raw;
            }
        }
        vectors *= kLanes;
    }
    for (int64_t i = vectors + threadIdx.x; i < n; i += stride) {
        T x = __ldcg(a + i);
        if (reduces) x = E::template combine<Op>(x, __ldcg(b + i));
        d[i] = x;
        if (twice) e[i] = x;
    }
}

// The step's operands, as element pointers at the slice's first element of chunk 0 of the step.
template <typename T>
struct Operands {
    T* src = nullptr;  // buffer the step reads (s rrs rrc rrcs cpy re)
    T* dst = nullptr;  // buffer the step writes (r rcs rrc rrcs cpy re)
    T* in = nullptr;   // received message
    T* out = nullptr;  // message to send
};

template <int Dtype, int Op>
__device__ void move_pieces(StepType type, const Operands<typename Element<Dtype>::T>& o, int64_t pieces,
                            int64_t piece_elems, int64_t buffer_stride, int64_t first, int64_t step) {
    for (int64_t k = 0, p = first; k < pieces; ++k, p += step) {
        const int64_t at = p * buffer_stride;  // in the buffers
        const int64_t msg = p * piece_elems;   // in the messages
        switch (type) {
            case StepType::s: move_piece<Dtype, Op, kCopy>(o.out + msg, nullptr, o.src + at, nullptr, piece_elems); break;
            case StepType::r: move_piece<Dtype, Op, kCopy>(o.dst + at, nullptr, o.in + msg, nullptr, piece_elems); break;
            case StepType::rcs:
                move_piece<Dtype, Op, kCopyTwice>(o.dst + at, o.out + msg, o.in + msg, nullptr, piece_elems);
                break;
            case StepType::rrs:
                move_piece<Dtype, Op, kReduce>(o.out + msg, nullptr, o.in + msg, o.src + at, piece_elems);
                break;
            case StepType::rrc:
                move_piece<Dtype, Op, kReduce>(o.dst + at, nullptr, o.in + msg, o.src + at, piece_elems);
                break;
            case StepType::rrcs:
                move_piece<Dtype, Op, kReduceTwice>(o.dst + at, o.out + msg, o.in + msg, o.src + at, piece_elems);
                break;
            case StepType::cpy:
                if (o.dst != o.src) move_piece<Dtype, Op, kCopy>(o.dst + at, nullptr, o.src + at, nullptr, piece_elems);
                break;
            case StepType::re:
                move_piece<Dtype, Op, kReduce>(o.dst + at, nullptr, o.dst + at, o.src + at, piece_elems);
                break;
            case StepType::nop: break;
        }
        // Pieces may overlap (see execute): the next one starts after every thread finished this one.
        if (pieces > 1) __syncthreads();
    }
}

__device__ __forceinline__ bool reads_src(StepType t) {
    return t == StepType::s || t == StepType::rrs || t == StepType::rrc || t == StepType::rrcs ||
           t == StepType::cpy || t == StepType::re;
}

__device__ __forceinline__ bool writes_dst(StepType t) {
    return t == StepType::r || t == StepType::rcs || t == StepType::rrc || t == StepType::rrcs ||
           t == StepType::cpy || t == StepType::re;
}

__device__ __forceinline__ bool sends(StepType t) {
    return t == StepType::s || t == StepType::rcs || t == StepType::rrs || t == StepType::rrcs;
}

__device__ __forceinline__ bool receives(StepType t) {
    return t == StepType::r || t == StepType::rcs || t == StepType::rrs || t == StepType::rrc || t == StepType::rrcs;
}

__device__ __forceinline__ unsigned char* buffer_of(const device::RankBuffers& r, uint8_t b) {
    return b == static_cast<uint8_t>(Buffer::input) ? r.input
           : b == static_cast<uint8_t>(Buffer::output) ? r.output
                                                        : r.scratch;
}

// The data of one step over its slice [offset, offset + len) of each of its cnt chunks. Whole chunks are one
// contiguous run; slices are cnt pieces a chunk apart. When the source and destination runs overlap (same
// buffer at other chunks, or an in-place layout), the CPU backend's result depends on order, so the pieces go
// one chunk at a time in its order: its memmove of a whole run (backwards when the destination is above the
// source), its piece loop, and its element-order reductions all come out as this chunk order.
template <int Dtype, int Op>
__device__ void execute(const KernelArgs& a, const device::Step& st, const device::RankBuffers& rank,
                        unsigned char* in, unsigned char* out, int64_t offset, int64_t len) {
    using T = typename Element<Dtype>::T;
    const StepType type = static_cast<StepType>(st.type);
    if (st.cnt == 0 || type == StepType::nop) return;
    const int64_t chunk = a.chunk_elems;
    Operands<T> o;
    if (reads_src(type)) o.src = reinterpret_cast<T*>(buffer_of(rank, st.srcbuf)) + st.srcoff * chunk + offset;
    if (writes_dst(type)) o.dst = reinterpret_cast<T*>(buffer_of(rank, st.dstbuf)) + st.dstoff * chunk + offset;
    o.in = reinterpret_cast<T*>(in);
    o.out = reinterpret_cast<T*>(out);
    const bool contiguous = len == chunk;
    const int64_t span = (st.cnt - 1) * chunk + len;
    const bool overlapping = o.src != nullptr && o.dst != nullptr && o.src != o.dst && o.src < o.dst + span &&
                             o.dst < o.src + span;
    if (contiguous && !overlapping) {
        move_pieces<Dtype, Op>(type, o, 1, len * st.cnt, 0, 0, 1);
    } else if (overlapping && contiguous && type == StepType::cpy && o.dst > o.src) {
        move_pieces<Dtype, Op>(type, o, st.cnt, len, chunk, st.cnt - 1, -1);  // memmove: last chunk first
    } else {
        move_pieces<Dtype, Op>(type, o, st.cnt, len, chunk, 0, 1);
    }
}

// ------------------------------------------------------------------------------------------------ waiting

// Thread 0's patience while it waits: false when the run must stop (another block stopped it, or nothing
// progressed anywhere for the watchdog's time), after recording where this block stood.
struct Patience {
    unsigned long long started;
    unsigned long long seen;
    uint32_t spins = 0;

    __device__ explicit Patience(const KernelArgs& a) : started(now_ns()), seen(load_relaxed(a.progress)) {}

    __device__ bool wait(const KernelArgs& a, device::ThreadblockExit& exit, int32_t state, int32_t pc,
                         int64_t iteration) {
        bool stop = load_relaxed(a.stop) != device::kStopNone;
        if (!stop && (++spins & 63u) == 0) {
            const unsigned long long progress = load_relaxed(a.progress);
            const unsigned long long t = now_ns();
            if (progress != seen) {
                seen = progress;
                started = t;
            } else if (t - started > a.watchdog_ns) {
                atomicCAS(a.stop, device::kStopNone, device::kStopDeadlock);
                stop = true;
            }
        }
        if (stop) {
            exit.state = state;
            exit.pc = pc;
            exit.iteration = iteration;
            return false;
        }
        __nanosleep(64);
        return true;
    }
};

// Thread 0: everything the step needs before its data moves (the CPU backend's acquire, in its order).
__device__ bool acquire(const KernelArgs& a, int32_t g, const device::Step& st, int32_t pc, int64_t iteration,
                        bool rx, bool tx, unsigned long long received, unsigned long long sent) {
    const device::Threadblock& tb = a.tbs[g];
    device::ThreadblockExit& exit = a.exits[g];
    Patience patience(a);
    if (st.dep_tb >= 0) {
        const unsigned long long wanted = device::flag_value(iteration, st.dep_step);
        while (load_acquire(a.flags + st.dep_tb) < wanted) {
            if (!patience.wait(a, exit, device::kExitWaitDependency, pc, iteration)) return false;
        }
    }
    if (rx) {
        const device::Connection& c = a.conns[tb.recv_conn];
        while (load_acquire(&a.sync[tb.recv_conn].tail) <= received) {
            if (!patience.wait(a, exit, device::kExitWaitMessage, pc, iteration)) return false;
        }
        // The sender wrote the SlotMeta on another SM: read it from L2, not a line this SM may hold.
        const int2 bits = __ldcg(reinterpret_cast<const int2*>(a.meta + c.meta_offset + received % c.slots));
        const device::SlotMeta meta{bits.x, bits.y};
        if (meta.cnt != st.cnt || meta.iteration != static_cast<int32_t>(iteration)) {
            exit.state = device::kExitBadMessage;
            exit.pc = pc;
            exit.iteration = iteration;
            exit.got_cnt = meta.cnt;
            exit.got_iteration = meta.iteration;
            atomicCAS(a.stop, device::kStopNone, device::kStopBadMessage);
            return false;
        }
        // Taken: the sender may reuse the slot of the message before this one, which this block finished
        // reading (its step ended with a barrier) before it came here.
        store_release(&a.sync[tb.recv_conn].taken, received + 1);
    }
    if (tx) {
        const device::Connection& c = a.conns[tb.send_conn];
        while (sent - load_acquire(&a.sync[tb.send_conn].taken) >= static_cast<unsigned long long>(c.capacity)) {
            if (!patience.wait(a, exit, device::kExitWaitSpace, pc, iteration)) return false;
        }
    }
    return true;
}

// ------------------------------------------------------------------------------------------------ kernel

// Threads per block the kernel is compiled for. The bounds also ask for two blocks per SM (at most 64
// registers a thread), so that programs of up to twice the GPU's SM count in threadblocks stay resident.
constexpr int kMaxBlockThreads = 512;

template <int Dtype, int Op>
__global__ void __launch_bounds__(kMaxBlockThreads, 2) run_kernel(KernelArgs a) {
    __shared__ int go;
    const int32_t g = blockIdx.x;
    const device::Threadblock tb = a.tbs[g];
    const device::RankBuffers rank = a.ranks[tb.rank];
    const device::Connection* rc = tb.recv_conn >= 0 ? a.conns + tb.recv_conn : nullptr;
    const device::Connection* sc = tb.send_conn >= 0 ? a.conns + tb.send_conn : nullptr;
    unsigned long long received = 0;  // messages consumed from the receive connection
    unsigned long long sent = 0;      // messages published on the send connection
    for (int64_t iteration = 0; iteration < a.iterations; ++iteration) {
        const int64_t offset = iteration * a.slice_elems;
        const int64_t len = min(a.slice_elems, a.chunk_elems - offset);
        for (int32_t pc = 0; pc < tb.nsteps; ++pc) {
            const device::Step st = a.steps[tb.first_step + pc];
            const StepType type = static_cast<StepType>(st.type);
            const bool rx = st.cnt > 0 && receives(type);
            const bool tx = st.cnt > 0 && sends(type);
            if (threadIdx.x == 0) go = acquire(a, g, st, pc, iteration, rx, tx, received, sent) ? 1 : 0;
            __syncthreads();
            if (!go) return;
            unsigned char* in = rx ? a.fifo + rc->slot_offset + (received % rc->slots) * rc->slot_bytes : nullptr;
            unsigned char* out = tx ? a.fifo + sc->slot_offset + (sent % sc->slots) * sc->slot_bytes : nullptr;
            execute<Dtype, Op>(a, st, rank, in, out, offset, len);
            __threadfence();
            __syncthreads();  // every thread's data is written (and read) before thread 0 publishes
            if (threadIdx.x == 0) {
                if (tx) {
                    device::SlotMeta& meta = a.meta[sc->meta_offset + sent % sc->slots];
                    meta.cnt = st.cnt;
                    meta.iteration = static_cast<int32_t>(iteration);
                    store_release(&a.sync[tb.send_conn].tail, sent + 1);
                }
                if (st.signal) store_release(a.flags + g, device::flag_value(iteration, pc));
                atomicAdd(a.progress, 1ull);
            }
            received += rx ? 1 : 0;
            sent += tx ? 1 : 0;
        }
    }
    if (threadIdx.x == 0) a.exits[g].state = device::kExitFinished;
}

using Kernel = void (*)(KernelArgs);

template <int Dtype>
Kernel kernel_for_op(mlopt_redop op) {
    switch (op) {
        case MLOPT_SUM: return run_kernel<Dtype, MLOPT_SUM>;
        case MLOPT_PROD: return run_kernel<Dtype, MLOPT_PROD>;
        case MLOPT_MAX: return run_kernel<Dtype, MLOPT_MAX>;
        case MLOPT_MIN: return run_kernel<Dtype, MLOPT_MIN>;
    }
    return nullptr;
}

Kernel kernel_for(mlopt_dtype dtype, mlopt_redop op) {
    switch (dtype) {
        case MLOPT_FLOAT32: return kernel_for_op<MLOPT_FLOAT32>(op);
        case MLOPT_FLOAT16: return kernel_for_op<MLOPT_FLOAT16>(op);
        case MLOPT_BFLOAT16: return kernel_for_op<MLOPT_BFLOAT16>(op);
        case MLOPT_INT32: return kernel_for_op<MLOPT_INT32>(op);
    }
    return nullptr;
}

// ------------------------------------------------------------------------------------------------ host

constexpr int32_t kDefaultBlockThreads = kMaxBlockThreads;
constexpr size_t kArenaAlignment = 256;

size_t align_up(size_t value) { return (value + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

std::string cuda_text(cudaError_t error) {
    return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

RunResult failure(mlopt_status status, std::string message) {
    RunResult result;
    result.status = status;
    result.message = std::move(message);
    return result;
}

// Byte offsets of the parts of the device arena for one run.
struct ArenaPlan {
    size_t steps = 0, tbs = 0, conns = 0, ranks = 0;  // tables (uploaded)
    size_t control = 0, control_bytes = 0;            // zeroed each run: sync, flags, exits, progress, stop, meta
    size_t sync = 0, flags = 0, exits = 0, progress = 0, stop = 0, meta = 0;
    size_t fifo = 0;
    std::vector<size_t> scratch;
    size_t total = 0;
};

ArenaPlan plan_arena(const device::Layout& layout) {
    ArenaPlan p;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
        const size_t here = at;
        at = align_up(at + bytes);
        return here;
    };
    p.steps = take(layout.steps.size() * sizeof(device::Step));
    p.tbs = take(layout.tbs.size() * sizeof(device::Threadblock));
    p.conns = take(layout.conns.size() * sizeof(device::Connection));
    p.ranks = take(layout.scratch_bytes.size() * sizeof(device::RankBuffers));
    p.control = at;
    p.sync = take(layout.conns.size() * sizeof(device::ConnectionSync));
    p.flags = take(layout.tbs.size() * sizeof(unsigned long long));
    p.exits = take(layout.tbs.size() * sizeof(device::ThreadblockExit));
    p.progress = take(sizeof(unsigned long long));
    p.stop = take(sizeof(int32_t));
    p.meta = take(static_cast<size_t>(layout.meta_slots) * sizeof(device::SlotMeta));
    p.control_bytes = at - p.control;
    p.fifo = take(static_cast<size_t>(layout.fifo_bytes));
    for (int64_t bytes : layout.scratch_bytes) p.scratch.push_back(take(static_cast<size_t>(bytes)));
    p.total = at;
    return p;
}

template <typename T>
void put(std::vector<unsigned char>& image, size_t offset, const std::vector<T>& items) {
    if (!items.empty()) std::memcpy(image.data() + offset, items.data(), items.size() * sizeof(T));
}

// "" when `pointer` can be used by a kernel on `device`, else why not.
std::string check_pointer(const void* pointer, int device, const std::string& what) {
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it
        return what + " is not memory the GPU can address (" + cuda_text(error) + ")";
    }
    switch (attributes.type) {
        case cudaMemoryTypeDevice:
            if (attributes.device != device) {
                return what + " is on GPU " + std::to_string(attributes.device) + " but the run is on GPU " +
                       std::to_string(device) + " (the calling thread's current device)";
            }
            return "";
        case cudaMemoryTypeManaged: return "";
        case cudaMemoryTypeHost:
            if (attributes.devicePointer != pointer) {
                return what + " is pinned host memory mapped at another device address; pass the device pointer";
            }
            return "";
        default:
            return what + " is host memory the GPU cannot address (allocate it with cudaMalloc, or pin it with "
                          "cudaHostAlloc)";
    }
}

}  // namespace

struct CudaWorkspace {
    void* arena = nullptr;
    size_t capacity = 0;
    int device = -1;
    cudaEvent_t started = nullptr;
    cudaEvent_t finished = nullptr;

    ~CudaWorkspace() { release(); }

    void release() {
        if (arena != nullptr) cudaFree(arena);
        if (started != nullptr) cudaEventDestroy(started);
        if (finished != nullptr) cudaEventDestroy(finished);
        arena = nullptr;
        capacity = 0;
        started = finished = nullptr;
    }

    // At least `bytes` of device memory on `on` (kept and reused while big enough).
    cudaError_t reserve(size_t bytes, int on) {
        if (device != on) {
            release();
            device = on;
        }
        if (started == nullptr) {
            cudaError_t error = cudaEventCreate(&started);
            if (error == cudaSuccess) error = cudaEventCreate(&finished);
            if (error != cudaSuccess) return error;
        }
        if (capacity >= bytes) return cudaSuccess;
        if (arena != nullptr) cudaFree(arena);
        arena = nullptr;
        capacity = 0;
        const cudaError_t error = cudaMalloc(&arena, std::max<size_t>(bytes, 1));
        if (error == cudaSuccess) capacity = bytes;
        return error;
    }
};

void CudaWorkspaceDeleter::operator()(CudaWorkspace* workspace) const { delete workspace; }

mlopt_status cuda_backend_available(std::string& why) {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();
        why = "no CUDA device can be used (" + cuda_text(error) + ")";
        return MLOPT_ERR_UNSUPPORTED;
    }
    if (count == 0) {
        why = "no CUDA device";
        return MLOPT_ERR_UNSUPPORTED;
    }
    int device = 0;
    int cooperative = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess || !cooperative) {
        (void)cudaGetLastError();
        why = "CUDA device " + std::to_string(device) + " cannot launch cooperative kernels";
        return MLOPT_ERR_UNSUPPORTED;
    }
    return MLOPT_OK;
}

namespace {

RunResult run_on_gpu(const Program& program, const RunRequest& request, CudaWorkspacePtr& workspace) {
    using Clock = std::chrono::steady_clock;
    const auto started = Clock::now();
    std::string why;
    if (cuda_backend_available(why) != MLOPT_OK) return failure(MLOPT_ERR_UNSUPPORTED, why);
    const size_t elem_size = dtype_size(request.dtype);
    const device::Layout layout =
        device::make_layout(program, request.chunk_elems, elem_size, request.chunk_bytes, request.fifo_slots);
    RunResult result;
    result.stats.backend = MLOPT_BACKEND_CUDA;
    if (layout.tbs.empty() || layout.iterations == 0) {
        result.stats.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
        return result;
    }

    int device = 0;
    cudaGetDevice(&device);
    for (size_t r = 0; r < request.ranks.size(); ++r) {
        const std::string rank = std::to_string(r);
        std::string problem = check_pointer(request.ranks[r].input, device, "inputs[" + rank + "]");
        if (problem.empty() && program.gpus[r].o_chunks > 0) {
            problem = check_pointer(request.ranks[r].output, device, "outputs[" + rank + "]");
        }
        if (!problem.empty()) return failure(MLOPT_ERR_INVALID_ARGUMENT, problem);
    }

    const Kernel kernel = kernel_for(request.dtype, request.op);
    const int threads = request.cuda_block_threads > 0 ? request.cuda_block_threads : kDefaultBlockThreads;
    int per_sm = 0;
    int sms = 0;
    cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (error != cudaSuccess) return failure(MLOPT_ERR_INTERNAL, "cannot query the GPU: " + cuda_text(error));
    const int64_t resident = int64_t{per_sm} * sms;
    if (static_cast<int64_t>(layout.tbs.size()) > resident) {
        return failure(MLOPT_ERR_UNSUPPORTED,
                       "the program has " + std::to_string(layout.tbs.size()) + " threadblocks but GPU " +
                           std::to_string(device) + " holds at most " + std::to_string(resident) + " blocks of " +
                           std::to_string(threads) + " threads at once, and every threadblock must be resident "
                           "(fewer threads per block: cuda_block_threads)");
    }

    const ArenaPlan arena = plan_arena(layout);
    if (!workspace) workspace.reset(new CudaWorkspace);
    error = workspace->reserve(arena.total, device);
    if (error != cudaSuccess) {
        (void)cudaGetLastError();
        return failure(MLOPT_ERR_NO_MEMORY, "cannot allocate " + std::to_string(arena.total) +
                                                " bytes of GPU memory for tables, FIFO slots and scratch (" +
                                                cuda_text(error) + "; a smaller chunk_bytes or fifo_slots needs less)");
    }
    auto* base = static_cast<unsigned char*>(workspace->arena);
    std::vector<device::RankBuffers> ranks(request.ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
        ranks[r].input = reinterpret_cast<unsigned char*>(request.ranks[r].input);
        ranks[r].output = reinterpret_cast<unsigned char*>(request.ranks[r].output);
        ranks[r].scratch = base + arena.scratch[r];
    }
    std::vector<unsigned char> image(arena.control, 0);
    put(image, arena.steps, layout.steps);
    put(image, arena.tbs, layout.tbs);
    put(image, arena.conns, layout.conns);
    put(image, arena.ranks, ranks);

    KernelArgs args{};
    args.steps = reinterpret_cast<const device::Step*>(base + arena.steps);
    args.tbs = reinterpret_cast<const device::Threadblock*>(base + arena.tbs);
    args.conns = reinterpret_cast<const device::Connection*>(base + arena.conns);
    args.ranks = reinterpret_cast<const device::RankBuffers*>(base + arena.ranks);
    args.fifo = base + arena.fifo;
    args.meta = reinterpret_cast<device::SlotMeta*>(base + arena.meta);
    args.sync = reinterpret_cast<device::ConnectionSync*>(base + arena.sync);
    args.flags = reinterpret_cast<unsigned long long*>(base + arena.flags);
    args.exits = reinterpret_cast<device::ThreadblockExit*>(base + arena.exits);
    args.progress = reinterpret_cast<unsigned long long*>(base + arena.progress);
    args.stop = reinterpret_cast<int32_t*>(base + arena.stop);
    args.chunk_elems = layout.chunk_elems;
    args.slice_elems = layout.slice_elems;
    args.iterations = layout.iterations;
    const int32_t watchdog_ms = request.watchdog_ms > 0 ? request.watchdog_ms : 10000;
    args.watchdog_ns = static_cast<unsigned long long>(watchdog_ms) * 1000000ull;

    auto stream = static_cast<cudaStream_t>(request.cuda_stream);
    const auto launch_started = Clock::now();
    error = cudaMemcpyAsync(base, image.data(), image.size(), cudaMemcpyHostToDevice, stream);
    if (error == cudaSuccess) error = cudaMemsetAsync(base + arena.control, 0, arena.control_bytes, stream);
    if (error == cudaSuccess) error = cudaEventRecord(workspace->started, stream);
    if (error == cudaSuccess) {
        void* params[] = {&args};
        error = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(layout.tbs.size()),
                                            dim3(threads), params, 0, stream);
    }
    if (error == cudaSuccess) error = cudaEventRecord(workspace->finished, stream);
    if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
    const auto launch_finished = Clock::now();
    if (error == cudaErrorCooperativeLaunchTooLarge) {
        (void)cudaGetLastError();
        return failure(MLOPT_ERR_UNSUPPORTED, "the GPU cannot hold all " + std::to_string(layout.tbs.size()) +
                                                  " threadblocks at once (" + cuda_text(error) + ")");
    }
    if (error != cudaSuccess) return failure(MLOPT_ERR_INTERNAL, "the GPU run failed: " + cuda_text(error));

    int32_t reason = 0;
    std::vector<device::ThreadblockExit> exits(layout.tbs.size());
    error = cudaMemcpy(&reason, args.stop, sizeof reason, cudaMemcpyDeviceToHost);
    if (error == cudaSuccess) {
        error = cudaMemcpy(exits.data(), args.exits, exits.size() * sizeof(device::ThreadblockExit),
                           cudaMemcpyDeviceToHost);
    }
    if (error != cudaSuccess) return failure(MLOPT_ERR_INTERNAL, "cannot read the run's state: " + cuda_text(error));
    if (reason != device::kStopNone) {
        return failure(reason == device::kStopDeadlock ? MLOPT_ERR_DEADLOCK : MLOPT_ERR_SEMANTIC,
                       device::describe_stop(program, layout, reason, exits, watchdog_ms));
    }
    for (const device::ThreadblockExit& exit : exits) {
        if (exit.state != device::kExitFinished) {
            return failure(MLOPT_ERR_INTERNAL, "the GPU run ended with a threadblock unfinished");
        }
    }
    float device_ms = 0;
    cudaEventElapsedTime(&device_ms, workspace->started, workspace->finished);
    result.stats = device::completed_stats(program, layout, elem_size);
    result.stats.backend = MLOPT_BACKEND_CUDA;
    result.stats.device_us = static_cast<double>(device_ms) * 1e3;
    result.stats.wall_us = std::chrono::duration<double, std::micro>(launch_finished - launch_started).count();
    return result;
}

}  // namespace

RunResult run_program_cuda(const Program& program, const RunRequest& request, CudaWorkspacePtr& workspace) {
    try {
        return run_on_gpu(program, request, workspace);
    } catch (const std::bad_alloc&) {
        return failure(MLOPT_ERR_NO_MEMORY, "out of memory while setting up the GPU run");
    } catch (...) {
        return failure(MLOPT_ERR_INTERNAL, "unexpected error while setting up the GPU run");
    }
}

}  // namespace mlopt

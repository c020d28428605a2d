// Internal representation of a loaded plan, shared by the loaders (xml/json) and the interpreter.
// Mirrors mlopt/formats/msccl.py one to one; a Program that comes out of the loader has passed every
// structural and semantic check (validate_program), so the interpreter may index without re-checking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlopt/mlopt.h"

namespace mlopt {

enum class StepType : uint8_t { s, r, rcs, rrs, rrc, rrcs, cpy, re, nop };
enum class Buffer : uint8_t { input, output, scratch };

struct Step {
    int32_t s = 0;  // position in its threadblock
    StepType type = StepType::nop;
    Buffer srcbuf = Buffer::input;
    int32_t srcoff = 0;  // in chunks
    Buffer dstbuf = Buffer::output;
    int32_t dstoff = 0;
    int32_t cnt = 0;     // chunks moved
    int32_t depid = -1;  // threadblock (same gpu) this step waits for, -1: none
    int32_t deps = -1;   // step of that threadblock
    bool hasdep = false; // some other step waits for this one: signal after it
};

struct Threadblock {
    int32_t id = 0;
    int32_t send = -1;  // peer rank, -1: none
    int32_t recv = -1;
    int32_t chan = 0;
    std::vector<Step> steps;
};

struct Gpu {
    int32_t id = 0;
    int32_t i_chunks = 0;
    int32_t o_chunks = 0;
    int32_t s_chunks = 0;
    std::vector<Threadblock> tbs;  // sorted by id (0..n-1)
};

struct Program {
    std::string name;
    std::string proto;  // Simple | LL | LL128
    int32_t nchannels = 0;
    int32_t nchunksperloop = 0;
    int32_t ngpus = 0;
    std::string coll;  // allgather | reducescatter | allreduce | alltoall | broadcast | reduce
    bool inplace = false;
    bool outofplace = true;
    int64_t min_bytes = 0;
    int64_t max_bytes = 0;
    std::vector<Gpu> gpus;  // sorted by id (0..ngpus-1)
};

}  // namespace mlopt

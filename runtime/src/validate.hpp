// Semantic checks of an MSCCL-EF Program: what the executor would refuse or mis-run (mlopt/formats/msccl_xml.py
// check_limits) and the static part of mlopt/sim/symbolic.py's proof (chunk contract, operand bounds,
// dependencies, FIFO message matching). A Program that passes may be indexed by the interpreter without
// re-checking: ids equal positions, peers/channels/offsets/dependencies are in range.
#pragma once

#include <string>
#include <vector>

#include "program.hpp"
#include "source.hpp"
#include "xml.hpp"

namespace mlopt {

// Where each part of a Program was read from, for messages; indexed by position in the Program (gpus[g],
// tbs[g][t], steps[g][t][s]). Empty vectors (a Program built in code) give messages without line numbers.
struct ProgramSource {
    std::string file = "<program>";
    const XmlElement* algo = nullptr;
    std::vector<const XmlElement*> gpus;
    std::vector<std::vector<const XmlElement*>> tbs;
    std::vector<std::vector<std::vector<const XmlElement*>>> steps;
};

// Executor limits (msccl_struct.h of the executor; mlopt/formats/msccl.py and msccl_xml.py).
constexpr int32_t kMaxStepsPerThreadblock = 64;
constexpr int32_t kMaxChannels = 32;
constexpr int32_t kMaxStepCount = 72;  // cnt must be below this
constexpr int32_t kMaxTbsPerChannel = 32;
constexpr int32_t kMaxBufferChunks = 32768;  // offsets are int16_t in the executor (chunks 0..32767)
// ngpus x the chunks of every rank's buffers (msccl_contract.py PROOF_BUDGET): larger programs are refused
// with MLOPT_ERR_UNSUPPORTED, as the Python loader refuses them (its symbolic proof stays bounded).
constexpr int64_t kProofBudget = int64_t{1} << 25;

// Chunks per rank of the input and output buffers the collective needs (symbolic.py "Chunks per rank").
struct ChunkContract {
    int32_t input_chunks = 0;
    int32_t output_chunks = 0;
};

// The contract of `program`'s collective; throws LoadError (MLOPT_ERR_SEMANTIC) when it cannot be derived
// (e.g. an allgather whose nchunksperloop is not a multiple of ngpus).
ChunkContract chunk_contract(const Program& program, const ProgramSource& source);

// Throws LoadError naming the first problem found (MLOPT_ERR_SEMANTIC; MLOPT_ERR_UNSUPPORTED for a program
// over kProofBudget), in the order of mlopt/formats/msccl_contract.py, e.g.
// "ring.xml: algo/gpu[@id=3]/tb[@id=1]/step[@s=4]@dstoff (line 57): dstoff=9 cnt=1 is out of range for
// buffer o (8 chunks)".
void validate_program(const Program& program, const ProgramSource& source);

// A validated program as it runs: an in-place-only program (inplace=1 outofplace=0) may declare 0 chunks for
// the buffer that in place is a window of the other (allgather's input, reducescatter's output, either one
// for the others); here that buffer gets its window's size, so that counts and layouts need no special case.
Program effective_program(const Program& program, const ProgramSource& source);

// Names as written in the XML ("rrcs", "o").
const char* step_type_name(StepType type);
const char* buffer_name(Buffer buffer);

bool step_sends(StepType type);       // s rcs rrs rrcs
bool step_receives(StepType type);    // r rcs rrs rrc rrcs
bool step_reads_src(StepType type);   // s rrs rrc rrcs cpy re (r and rcs ignore src)
bool step_writes_dst(StepType type);  // r rcs rrc rrcs cpy re (s and rrs ignore dst)
// Copies a step makes of its data (into a message and/or a buffer): the run counters' bytes_moved per byte.
int step_copies(StepType type);        // rcs rrcs: 2, nop: 0, the rest: 1

}  // namespace mlopt

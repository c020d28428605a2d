// The motif table of the enforcer (mlopt.h, "enforcer"; docs/enforcer.md): motifs checked and copied out of
// the caller's mlopt_motif_desc, and the frozen table with every rank's issue order (Pseudocode 2's
// scheduling order S). The threads that enforce it live in enforcer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "handles.hpp"
#include "mlopt/mlopt.h"

namespace mlopt {
namespace enforcer {

constexpr int32_t kMaxChannels = 64;  // bits of mlopt_motif_desc::channel_mask

struct Range {
    uint64_t op_offset = 0;
    uint64_t staging_offset = 0;
    uint64_t length = 0;
};

// One program position's copies around a run.
struct PositionCopies {
    std::vector<Range> gather;   // op buffer -> program input staging
    std::vector<Range> scatter;  // program output staging -> op output buffer
};

struct Motif {
    std::string name;  // the caller's, may be empty
    int32_t op = 0;
    int32_t index = 0;
    int32_t seq = 0;
    // A copy of the caller's plan: the caller may free its own as soon as add_motif returns.
    std::shared_ptr<const mlopt_plan_s> program;
    std::vector<int32_t> ranks;     // program position p = ranks[p]
    std::vector<int32_t> deps;      // motif indices of the same op, each < index
    std::vector<int32_t> channels;  // from channel_mask, ascending
    mlopt_dtype dtype = MLOPT_FLOAT32;
    mlopt_redop redop = MLOPT_SUM;
    size_t count = 0;      // program input elements per position
    size_t in_bytes = 0;   // program input staging bytes per position
    size_t out_bytes = 0;  // program output staging bytes per position
    uint64_t op_bytes = 0;
    bool from_input = false;  // gather from the op's input buffer (all-to-all), else from its output
    std::vector<PositionCopies> positions;

    // "op 1 motif 2 ('rs')" for messages.
    std::string label() const;
};

// The motifs of one comm-op, by index.
struct Op {
    std::vector<Motif> motifs;
    std::vector<std::vector<int32_t>> of_rank;  // per rank: indices of the motifs involving it
    uint64_t op_bytes = 0;
    bool reads_output = false;  // some motif gathers from the output buffer: output starts as the input
    bool reads_input = false;   // some motif gathers from the input buffer: it must not be the output
};

// One entry of a rank's issue order: every motif involving the rank with this sequence number.
struct Step {
    int32_t seq = 0;
    std::vector<std::pair<int32_t, int32_t>> motifs;  // (op, index), ascending
};

struct Table {
    int32_t nranks = 0;
    int32_t nchannels = 0;  // highest channel used + 1
    std::vector<Op> ops;
    std::vector<std::vector<Step>> order;         // per rank: its distinct seqs, ascending
    std::vector<int64_t> motifs_per_iteration;    // per rank
};

// Motifs added so far: op -> index -> motif.
using Draft = std::map<int32_t, std::map<int32_t, Motif>>;

// Checks one motif description against an enforcer of `nranks` ranks and the motifs already in `draft`
// (duplicates, op_bytes), and copies it into `out`. Returns "" or the problem, naming the op, motif and field.
std::string read_motif(const mlopt_motif_desc& desc, int32_t nranks, const Draft& draft, Motif& out);

// Freezes `draft` into `out`: ops numbered 0..ops-1, motif indices 0..k-1 per op, deps issued no later than
// their dependants; derives every rank's issue order. Returns "" or the problem.
std::string build_table(Draft&& draft, int32_t nranks, Table& out);

}  // namespace enforcer
}  // namespace mlopt

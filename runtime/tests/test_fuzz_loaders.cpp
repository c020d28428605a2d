// A deterministic stand-in for a libFuzzer run of the plan loaders (no clang here): every fixture in data/ is
// mutated with a seeded generator (bit flips, byte edits, insertions of format tokens, deletions, duplicated
// ranges, splices with another fixture, truncation, and "interesting" integers written into attribute/number
// values to reach the semantic checks) and fed to mlopt_plan_load_memory. Every input must give MLOPT_OK with
// a usable plan, or an error status (never MLOPT_ERR_INTERNAL) with a one-line, non-empty message. Crashes,
// leaks and undefined behaviour are caught by running this under the sanitizer build (-DMLOPT_SANITIZE=ON).
//
// MLOPT_FUZZ_ITERATIONS (default 20000) sets the number of inputs, MLOPT_FUZZ_SEED (default 1) the seed.
// Inputs that load, or fail only in the semantic checks, join a small corpus that later mutations start from,
// so that the run does not stay at the surface of the parsers.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "mlopt/mlopt.h"

namespace {

const char* const kFixtures[] = {
    "msccl-scheduler_ncv4_ag_hier_4_LL.xml", "rccl_alltoall-8n-0-9kb.xml", "ring4_allgather.xml",
    "ring4_allreduce.xml", "ring4_alltoall.xml", "ring4_reducescatter_legacy.xml", "switch4_broadcast_legacy.xml",
    "ndv2_allreduce_tree.xml", "ndv2_allgather_taccl.xml", "handmade_nop_deps_2gpu.xml", "ring4_allgather.json",
    "switch4_broadcast_legacy.json", "ndv2_allgather_taccl.json", "fc2_memory.plan.json",
};

// Fragments of both formats: inserting them makes structurally interesting inputs far more often than
// random bytes do.
const char* const kTokens[] = {
    "<", ">", "/>", "</", "<step", "</tb>", "<tb id=\"0\" send=\"-1\" recv=\"-1\" chan=\"0\">", "</gpu>", "<gpu",
    "=\"", "\"", "'", "&amp;", "&lt;", "&#", "&#x", ";", "&#0;", "&#xD800;", "<!--", "-->", "--", "<![CDATA[",
    "]]>", "<?xml version=\"1.0\"?>", "<?pi ?>", "<!DOCTYPE a>", " hasdep=\"1\"", " depid=\"0\"", " deps=\"0\"",
    " type=\"nop\"", " type=\"rrcs\"", " cnt=\"71\"", " foo=\"1\"", " coll=\"reduce_scatter\"", " redop=\"sum\"",
    "{", "}", "[", "]", ",", ":", "\"\\u", "\\ud83d\\ude00", "\\ud800", "\\", "null", "true", "1e999", "-0",
    "1.5e-3", "\"schema_version\": \"2.0\",", "\"kind\": \"\",", "\xEF\xBB\xBF", "\xff", "\xc0\xaf", "\x00",
    "\r\n", "\t",
};  // "\x00" is the empty C string: inserted as one NUL byte

// Integers at the edges of what the checks accept.
const char* const kIntegers[] = {
    "0", "1", "-1", "-2", "2", "3", "7", "8", "31", "32", "33", "63", "64", "65", "71", "72", "255", "256",
    "2147483647", "2147483648", "-2147483649", "9223372036854775807", "9223372036854775808", "007", "+1",
    "1.0", "", " 1", "0x10",
};

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() {  // SplitMix64: tiny, fast, and the same on every platform
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
    bool chance(unsigned percent) { return below(100) < percent; }

private:
    uint64_t state_;
};

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

// runtime/tests/data: found through MLOPT_REPO (ctest sets it) or else relative to the working directory.
std::string data_dir() {
    const char* repo = std::getenv("MLOPT_REPO");
    return repo && *repo ? std::string(repo) + "/runtime/tests/data" : std::string("data");
}

int64_t env_int(const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return end && *end == '\0' && n >= 0 ? n : fallback;
}

// Replaces the value of a randomly chosen ="..." (XML attribute) or ": <number>" (JSON) with an interesting integer.
void mutate_number(std::string& s, Rng& rng) {
    if (s.empty()) return;
    const size_t start = rng.below(s.size());
    size_t at = s.find("=\"", start);
    if (at == std::string::npos) at = s.find("=\"");
    if (at != std::string::npos) {
        const size_t open = at + 2;
        const size_t close = s.find('"', open);
        if (close != std::string::npos) {
            s.replace(open, close - open, kIntegers[rng.below(std::size(kIntegers))]);
            return;
        }
    }
    at = s.find(": ", start);
    if (at != std::string::npos) {
        size_t end = at + 2;
        while (end < s.size() && s[end] != ',' && s[end] != '}' && s[end] != '\n') ++end;
        s.replace(at + 2, end - at - 2, kIntegers[rng.below(std::size(kIntegers))]);
    }
}

void mutate(std::string& s, const std::vector<std::string>& seeds, Rng& rng) {
    switch (rng.below(9)) {
        case 0:  // flip bits
            if (!s.empty())
                for (size_t k = 1 + rng.below(4); k > 0; --k) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
            break;
        case 1:  // overwrite a byte
            if (!s.empty()) s[rng.below(s.size())] = static_cast<char>(rng.below(256));
            break;
        case 2: {  // insert a token
            const std::string token = kTokens[rng.below(std::size(kTokens))];
            s.insert(rng.below(s.size() + 1), token.empty() ? std::string(1, '\0') : token);
            break;
        }
        case 3: {  // delete a range
            if (s.empty()) break;
            const size_t at = rng.below(s.size());
            s.erase(at, 1 + rng.below(rng.chance(80) ? 8 : 256));
            break;
        }
        case 4: {  // duplicate a range (repeated elements, attributes, members)
            if (s.empty()) break;
            const size_t at = rng.below(s.size());
            const std::string piece = s.substr(at, 1 + rng.below(200));
            s.insert(rng.below(s.size() + 1), piece);
            break;
        }
        case 5: {  // splice: this input's head, another fixture's tail
            const std::string& other = seeds[rng.below(seeds.size())];
            s = s.substr(0, rng.below(s.size() + 1)) + other.substr(rng.below(other.size() + 1));
            break;
        }
        case 6:  // truncate
            s.resize(rng.below(s.size() + 1));
            break;
        case 7:
        case 8:  // values at the edges of the checks (twice as likely: it reaches the semantic checks)
            mutate_number(s, rng);
            break;
    }
}

struct Tally {
    std::map<int, int64_t> by_status;
    int64_t bytes = 0;
};

// One input through the C ABI; checks the contract of the result. Returns the status.
mlopt_status run_one(const std::string& input, Tally& tally) {
    mlopt_plan plan = nullptr;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_plan_load_memory(input.data(), input.size(), "fuzz", &plan, &err);
    ++tally.by_status[status];
    tally.bytes += static_cast<int64_t>(input.size());
    CHECK(status != MLOPT_ERR_INTERNAL);
    if (status == MLOPT_OK) {
        CHECK(plan != nullptr && err == nullptr);
        if (mlopt_plan_get_kind(plan) == MLOPT_PLAN_MSCCL_XML) {
            mlopt_program_info info{};
            info.struct_size = sizeof info;
            CHECK_EQ(mlopt_plan_program_info(plan, &info, nullptr), MLOPT_OK);
            CHECK(info.ngpus >= 1 && info.i_chunks >= 1 && info.o_chunks >= 0);
            size_t out = 0;
            CHECK_EQ(mlopt_output_count(plan, static_cast<size_t>(info.i_chunks) * 3, &out, nullptr), MLOPT_OK);
        } else {
            CHECK_EQ(mlopt_plan_get_kind(plan), MLOPT_PLAN_JSON);
            CHECK(std::string(mlopt_plan_planner(plan)).size() > 0);
        }
    } else {
        CHECK(plan == nullptr);
        if (CHECK(err != nullptr)) {
            const std::string message = mlopt_error_message(err);
            CHECK(!message.empty() && message.find('\n') == std::string::npos);
            CHECK_EQ(mlopt_error_status(err), status);
            CHECK(status >= MLOPT_ERR_INVALID_ARGUMENT && status <= MLOPT_ERR_INTERNAL);
            const int64_t offset = mlopt_error_offset(err);
            CHECK(offset >= -1 && offset <= static_cast<int64_t>(input.size()));
        }
    }
    mlopt_error_free(err);
    mlopt_plan_free(plan);
    return status;
}

}  // namespace

int main() {
    const int64_t iterations = env_int("MLOPT_FUZZ_ITERATIONS", 20000);
    const auto seed = static_cast<uint64_t>(env_int("MLOPT_FUZZ_SEED", 1));
    std::vector<std::string> seeds;
    for (const char* name : kFixtures) {
        seeds.push_back(read_text(data_dir() + "/" + name));
        if (!CHECK(!seeds.back().empty())) std::fprintf(stderr, "  missing fixture %s/%s\n", data_dir().c_str(), name);
    }
    if (check::failures()) return check::finish("test_fuzz_loaders");

    Tally tally;
    for (const auto& s : seeds) CHECK_EQ(run_one(s, tally), MLOPT_OK);  // the seeds themselves are valid

    Rng rng(seed);
    std::vector<std::string> corpus;  // inputs that got past the parsers, to mutate further
    constexpr size_t kCorpusSize = 64;
    const auto started = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iterations; ++i) {
        std::string input = !corpus.empty() && rng.chance(40) ? corpus[rng.below(corpus.size())]
                                                               : seeds[rng.below(seeds.size())];
        for (size_t k = 1 + rng.below(rng.chance(70) ? 1 : 4); k > 0; --k) mutate(input, seeds, rng);
        const mlopt_status status = run_one(input, tally);
        if ((status == MLOPT_OK || status == MLOPT_ERR_SEMANTIC) && input.size() < (1u << 20)) {
            if (corpus.size() < kCorpusSize) corpus.push_back(std::move(input));
            else corpus[rng.below(kCorpusSize)] = std::move(input);
        }
        if (check::failures() > 20) break;  // enough to debug; do not flood the log
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    std::printf("test_fuzz_loaders: %lld inputs (seed %llu), %.1f MB in %.1f s; by status:",
                static_cast<long long>(iterations), static_cast<unsigned long long>(seed),
                static_cast<double>(tally.bytes) / 1e6, seconds);
    for (const auto& [status, count] : tally.by_status)
        std::printf(" %s=%lld", mlopt_status_string(static_cast<mlopt_status>(status)), static_cast<long long>(count));
    std::printf("\n");
    return check::finish("test_fuzz_loaders");
}

// The MSCCL-EF conformance corpus (tests/conformance/msccl_xml, docs/input-contract.md) through the C++ loader:
// every file of the manifest loads through mlopt_plan_load and gets the manifest's verdict, with the status
// and the field (the location the message starts with, line left out) and a message containing `message`.
// tests/formats/test_msccl_contract.py holds the Python loader to the same manifest, so both languages agree.
// "unproven" files must load here: their defect is found by mlopt validate's symbolic proof (Python only).
//
// The manifest is read with the runtime's own JSON parser (src/json.hpp). Files are found through MLOPT_REPO
// (ctest sets it) or else ../.. from the working directory; "@shared/..." names through
// MLOPT_SHARED_REFERENCE or else <repo>/../shared/reference, and are skipped where that folder is absent.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "json.hpp"  // internal: the runtime's JSON parser
#include "mlopt/mlopt.h"

namespace {

const std::string kShared = "@shared/";

std::string repo_dir() {
    const char* repo = std::getenv("MLOPT_REPO");
    return repo && *repo ? std::string(repo) : std::string("../..");
}

std::string corpus_dir() { return repo_dir() + "/tests/conformance/msccl_xml"; }

std::string shared_dir() {
    const char* shared = std::getenv("MLOPT_SHARED_REFERENCE");
    return shared && *shared ? std::string(shared) : repo_dir() + "/../shared/reference";
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

bool exists(const std::string& path) { return static_cast<bool>(std::ifstream(path)); }

// "" when the name is an @shared/ file that is not there.
std::string resolve(const std::string& name) {
    if (name.compare(0, kShared.size(), kShared) != 0) return corpus_dir() + "/" + name;
    const std::string path = shared_dir() + "/" + name.substr(kShared.size());
    return exists(path) ? path : "";
}

const char* status_word(mlopt_status status) {
    switch (status) {
        case MLOPT_ERR_PARSE: return "parse";
        case MLOPT_ERR_SCHEMA: return "schema";
        case MLOPT_ERR_SEMANTIC: return "semantic";
        case MLOPT_ERR_UNSUPPORTED: return "unsupported";
        default: return mlopt_status_string(status);
    }
}

// The location without its trailing "(line N)" or "(line N, column C)".
std::string field_of(std::string location) {
    const size_t at = location.rfind("(line ");
    if (at == std::string::npos || location.back() != ')') return location;
    location.erase(at);
    while (!location.empty() && location.back() == ' ') location.pop_back();
    return location;
}

struct Verdict {
    std::string verdict;  // accepted | refused
    std::string status, field, message;
};

// A loaded plan is also asked for its program and an output count, as a run would.
void check_loaded(mlopt_plan plan, const std::string& name) {
    mlopt_program_info info{};
    info.struct_size = sizeof info;
    CHECK_EQ(mlopt_plan_program_info(plan, &info, nullptr), MLOPT_OK);
    // In-place-only programs that leave a buffer out run with it sized as its window (effective_program).
    CHECK(info.i_chunks > 0 && info.o_chunks > 0);
    size_t out_count = 0;
    CHECK_EQ(mlopt_output_count(plan, static_cast<size_t>(info.i_chunks) * 3, &out_count, nullptr), MLOPT_OK);
    if (!CHECK_EQ(out_count, static_cast<size_t>(info.o_chunks) * 3)) std::fprintf(stderr, "  %s\n", name.c_str());
}

Verdict load(const std::string& path, const std::string& name) {
    mlopt_plan plan = nullptr;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_plan_load(path.c_str(), &plan, &err);
    if (status == MLOPT_OK) {
        check_loaded(plan, name);
        mlopt_plan_free(plan);
        return {"accepted", "", "", ""};
    }
    const std::string message = mlopt_error_message(err);
    mlopt_error_free(err);
    Verdict v{"refused", status_word(status), "", ""};
    const std::string prefix = path + ": ";
    if (!CHECK_EQ(message.compare(0, prefix.size(), prefix), 0)) return v;
    const std::string rest = message.substr(prefix.size());
    const size_t colon = rest.find(": ");
    v.field = field_of(rest.substr(0, colon));
    v.message = colon == std::string::npos ? "" : rest.substr(colon + 2);
    CHECK(message.find('\n') == std::string::npos);
    return v;
}

std::string member(const mlopt::JsonValue& entry, const char* key) {
    const mlopt::JsonValue* v = entry.find(key);
    return v && v->type == mlopt::JsonValue::Type::string ? v->string : "";
}

void check_entry(const std::string& name, const mlopt::JsonValue& entry, int& skipped) {
    const std::string path = resolve(name);
    if (path.empty()) {
        std::printf("skipped (shared reference folder absent): %s\n", name.c_str());
        ++skipped;
        return;
    }
    const std::string want = member(entry, "verdict");
    const Verdict got = load(path, name);
    bool ok = CHECK_EQ(got.verdict, want == "unproven" ? std::string("accepted") : want);
    if (want == "refused") {
        ok = CHECK_EQ(got.status, member(entry, "status")) && ok;
        ok = CHECK_EQ(got.field, member(entry, "field")) && ok;
        ok = CHECK_CONTAINS(got.message, member(entry, "message")) && ok;
    }
    if (!ok) std::fprintf(stderr, "  in %s: %s %s %s: %s\n", name.c_str(), got.verdict.c_str(), got.status.c_str(),
                          got.field.c_str(), got.message.c_str());
}

void test_corpus() {
    const std::string manifest_path = corpus_dir() + "/manifest.json";
    const std::string text = read_text(manifest_path);
    REQUIRE(!text.empty());
    const mlopt::JsonValue manifest = mlopt::parse_json(text, manifest_path);
    const mlopt::JsonValue* files = manifest.find("files");
    REQUIRE(files && files->type == mlopt::JsonValue::Type::object);
    int skipped = 0;
    for (const auto& m : files->members) check_entry(m.key, m.value, skipped);
    // The corpus is not empty and was read in full: every entry checked or skipped for a missing shared file.
    CHECK(files->members.size() >= 30);
    std::printf("%zu corpus files, %d skipped\n", files->members.size(), skipped);
}

// An in-place-only program runs in place; an out-of-place run is refused, saying so.
void test_in_place_only_runs_only_in_place() {
    const std::string path = corpus_dir() + "/ok/inplace_only_allgather.xml";
    mlopt_plan plan = nullptr;
    REQUIRE(mlopt_plan_load(path.c_str(), &plan, nullptr) == MLOPT_OK);
    mlopt_comm comm = nullptr;
    REQUIRE(mlopt_comm_create_local(2, &comm, nullptr) == MLOPT_OK);
    // count = 1 element per rank: rank r's input is element r of its 2-element output (the in-place layout).
    std::vector<float> buffers[2] = {{1.0f, 0.0f}, {0.0f, 2.0f}};
    void* inputs[2] = {buffers[0].data() + 0, buffers[1].data() + 1};
    void* outputs[2] = {buffers[0].data(), buffers[1].data()};
    mlopt_run_options options;
    mlopt_run_options_init(&options);
    CHECK_EQ(mlopt_comm_run(comm, plan, inputs, outputs, 1, MLOPT_FLOAT32, MLOPT_SUM, &options, nullptr), MLOPT_OK);
    for (const auto& b : buffers) CHECK(b[0] == 1.0f && b[1] == 2.0f);

    std::vector<float> in[2] = {{1.0f}, {2.0f}}, out[2] = {{0, 0}, {0, 0}};
    void* apart_in[2] = {in[0].data(), in[1].data()};
    void* apart_out[2] = {out[0].data(), out[1].data()};
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_comm_run(comm, plan, apart_in, apart_out, 1, MLOPT_FLOAT32, MLOPT_SUM, &options, &err),
             MLOPT_ERR_MISMATCH);
    if (err) {
        CHECK_CONTAINS(std::string(mlopt_error_message(err)), "out-of-place run of an in-place-only program");
        mlopt_error_free(err);
    }
    mlopt_comm_free(comm);
    mlopt_plan_free(plan);
}

}  // namespace

int main() try {
    test_corpus();
    test_in_place_only_runs_only_in_place();
    return check::finish("test_conformance");
} catch (const std::exception& e) {
    std::fprintf(stderr, "uncaught exception: %s\n", e.what());
    return 1;
}

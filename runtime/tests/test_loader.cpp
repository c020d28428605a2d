// Plan loading through the C ABI (and the C++ wrapper): every fixture loads; every rule of the MSCCL-EF loader
// and of the JSON envelope check, broken on purpose, gives the right status and a one-line message naming the
// location and line; truncated inputs give MLOPT_ERR_PARSE; NULL arguments give MLOPT_ERR_INVALID_ARGUMENT.
// Fixtures are read from $MLOPT_REPO/runtime/tests/data (ctest sets MLOPT_REPO), else from ./data.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "mlopt/mlopt.h"
#include "mlopt/mlopt.hpp"
#include "json.hpp"       // internal: number details
#include "msccl_xml.hpp"  // internal: explicit dialects, validate_program on programs built in code
#include "validate.hpp"
#include "xml.hpp"

namespace {

const char* const kXmlFixtures[] = {
    "msccl-scheduler_ncv4_ag_hier_4_LL.xml", "rccl_alltoall-8n-0-9kb.xml", "ring4_allgather.xml",
    "ring4_allreduce.xml", "ring4_alltoall.xml", "ring4_reducescatter_legacy.xml", "switch4_broadcast_legacy.xml",
    "ndv2_allreduce_tree.xml", "ndv2_allgather_taccl.xml", "handmade_nop_deps_2gpu.xml",
};
const char* const kJsonFixtures[] = {
    "ring4_allgather.json", "switch4_broadcast_legacy.json", "ndv2_allgather_taccl.json", "fc2_memory.plan.json",
};

// runtime/tests/data: found through MLOPT_REPO (ctest sets it) or else relative to the working directory.
std::string data_dir() {
    const char* repo = std::getenv("MLOPT_REPO");
    return repo && *repo ? std::string(repo) + "/runtime/tests/data" : std::string("data");
}

std::string data_path(const std::string& name) { return data_dir() + "/" + name; }

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

// The outcome of one load, with the error's fields copied out.
struct Outcome {
    mlopt_status status = MLOPT_OK;
    std::string message;
    int64_t line = 0, column = 0, offset = -1;
    mlopt::Plan plan;
};

Outcome outcome_of(mlopt_status status, mlopt_plan plan, mlopt_error err) {
    Outcome o;
    o.status = status;
    o.plan = mlopt::Plan(plan);
    if (err) {
        o.message = mlopt_error_message(err);
        o.line = mlopt_error_line(err);
        o.column = mlopt_error_column(err);
        o.offset = mlopt_error_offset(err);
        CHECK_EQ(mlopt_error_status(err), status);
        mlopt_error_free(err);
    }
    // The contract: a plan exactly on success, an error with a one-line, non-empty message otherwise.
    CHECK_EQ(status == MLOPT_OK, plan != nullptr);
    CHECK_EQ(status == MLOPT_OK, err == nullptr);
    CHECK(o.message.find('\n') == std::string::npos);
    if (status != MLOPT_OK) CHECK(!o.message.empty());
    return o;
}

Outcome load_text(const std::string& text, const char* name = "test.xml") {
    mlopt_plan plan = nullptr;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_plan_load_memory(text.data(), text.size(), name, &plan, &err);
    return outcome_of(status, plan, err);
}

Outcome load_file(const std::string& path) {
    mlopt_plan plan = nullptr;
    mlopt_error err = nullptr;
    const mlopt_status status = mlopt_plan_load(path.c_str(), &plan, &err);
    return outcome_of(status, plan, err);
}

int line_of(const std::string& text, size_t offset) {
    int line = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
    return line;
}

// ------------------------------------------------------------------------------------------------ edits

struct Edit {
    std::string find;
    std::string replace;
    int occurrence = 1;  // 1-based
};

// `text` with each edit applied in turn; the line of the first edit goes to *first_line. Fails the test (and
// returns "") when a `find` string does not occur often enough: the fixture changed under the test.
std::string apply(std::string text, const std::vector<Edit>& edits, int* first_line) {
    bool first = true;
    for (const auto& e : edits) {
        size_t at = std::string::npos;
        size_t from = 0;
        for (int k = 0; k < e.occurrence; ++k) {
            at = text.find(e.find, from);
            if (at == std::string::npos) break;
            from = at + 1;
        }
        if (!CHECK(at != std::string::npos)) {
            std::fprintf(stderr, "  edit target not found: %s\n", e.find.c_str());
            return "";
        }
        if (first && first_line) *first_line = line_of(text, at);
        first = false;
        text.replace(at, e.find.size(), e.replace);
    }
    return text;
}

// A broken (or deliberately odd but valid) variant of a fixture and what loading it must give.
struct Variant {
    const char* what;
    const char* fixture;
    std::vector<Edit> edits;
    mlopt_status status;
    std::string location;  // "algo/gpu[@id=0]@id": the message must contain "<location> (line N)"
    std::string message;   // a part of the message
    int line = 0;          // N; 0: the line of the first edit
};

const char* H = "handmade_nop_deps_2gpu.xml";
const char* RING_AG = "ring4_allgather.xml";
const char* LEGACY_RS = "ring4_reducescatter_legacy.xml";

// Lines of handmade_nop_deps_2gpu.xml used below: 5 algo, 6 gpu 0, 8 its tb 0's send, 11 tb 1's receive
// (hasdep=1), 13 tb 2, 14-16 tb 2's cpy/nop/cpy, 19 gpu 1, 21 its send, 24 its receive.
const std::string kG0Send = R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1")";
const std::string kG0Recv = R"(<step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>)";
const std::string kG0Tb2Cpy = R"(<step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1")";
const std::string kG0Nop = R"(<step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="1" deps="0" hasdep="0"/>)";
const std::string kG0AfterNop = R"(<step s="2" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="1" deps="0" hasdep="0"/>)";
const std::string kG1Send = R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1")";
const std::string kG1Recv = R"(<step s="0" type="r" srcbuf="o" srcoff="0" dstbuf="s" dstoff="0" cnt="1")";

std::vector<Variant> variants() {
    const auto S = MLOPT_ERR_SCHEMA;
    const auto M = MLOPT_ERR_SEMANTIC;
    const auto P = MLOPT_ERR_PARSE;
    const auto OK = MLOPT_OK;
    const std::string g0 = "algo/gpu[@id=0]";
    const std::string g1 = "algo/gpu[@id=1]";
    return {
        // ---- elements and attributes (schema)
        {"root element", H, {{"<algo ", "<algorithm "}, {"</algo>", "</algorithm>"}}, S, "algorithm",
         "root element is <algorithm>, expected <algo>"},
        {"missing step attribute", H, {{kG0Send + R"( depid="-1" deps="-1" hasdep="0"/>)", kG0Send + R"( depid="-1" deps="-1"/>)"}},
         S, g0 + "/tb[@id=0]/step[@s=0]@hasdep", "missing attribute 'hasdep' (executor dialect)"},
        {"missing tb attribute", H, {{R"(<tb id="0" send="1" recv="-1" chan="0">)", R"(<tb id="0" send="1" recv="-1">)"}}, S,
         g0 + "/tb[@id=0]@chan", "missing attribute 'chan'"},
        {"missing algo name", H, {{R"(name="allgather&#32;nop &amp; deps" )", ""}}, S, "algo@name",
         "missing attribute 'name' (executor dialect)"},
        // Attributes the executor does not read and unknown elements (with their content) are ignored, as it does.
        {"unknown attribute is ignored", H, {{kG0Send, kG0Send + R"( foo="1")"}}, OK, "", ""},
        {"legacy tb attribute in the executor dialect is ignored", H, {{R"(<tb id="0" send="1")", R"(<tb id="0" rtype="ib" send="1")"}},
         OK, "", ""},
        {"unknown element is skipped with its content", H, {{kG0Send, "<foo><step/><bar x=\"1\"/></foo>\n      " + kG0Send}},
         OK, "", ""},
        {"gpu inside gpu", H, {{R"(<tb id="0" send="1")", R"(<gpu/><tb id="0" send="1")"}}, S, g0 + "/gpu[1]",
         "unexpected element <gpu> inside <gpu> (expected <tb>; the executor would skip it)"},
        {"tb inside algo", H, {{R"(<gpu id="1")", R"(<tb id="0" send="-1" recv="-1" chan="0"/><gpu id="1")"}}, S,
         "algo/tb[@id=0]", "unexpected element <tb> inside <algo> (expected <gpu>; the executor would skip it)"},
        {"element inside a step", H, {{kG0Recv, R"(<step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"><x/></step>)"}},
         S, g0 + "/tb[@id=1]/step[@s=0]/x[1]", "unexpected element <x> inside <step> (the executor cannot read elements"},
        {"required attribute after the first 16", H,
         {{kG0Send, R"(<step a="0" b="0" c="0" d="0" e="0" f="0" g="0" s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1")"}},
         S, g0 + "/tb[@id=0]/step[@s=0]@hasdep", "attribute 'hasdep' comes after the first 16 attributes of <step>"},
        {"collective mlopt does not model", H, {{R"(coll="allgather")", R"(coll="alltoallv")"}}, MLOPT_ERR_UNSUPPORTED,
         "algo@coll", "mlopt does not support the collective 'alltoallv'"},
        {"decimal number", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="0.5" dstbuf="o" dstoff="1" cnt="1")"}}, S,
         g0 + "/tb[@id=0]/step[@s=0]@srcoff", "'0.5' is not an integer"},
        {"space in a number", H, {{R"(<gpu id="1" i_chunks="1")", R"(<gpu id="1" i_chunks=" 1")"}}, S, g1 + "@i_chunks",
         "' 1' is not an integer"},
        {"plus sign", H, {{R"(nchannels="1")", R"(nchannels="+1")"}}, S, "algo@nchannels", "'+1' is not an integer"},
        {"hex number", H, {{R"(ngpus="2")", R"(ngpus="0x2")"}}, S, "algo@ngpus", "'0x2' is not an integer"},
        {"negative cnt", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="-1")"}}, S,
         g0 + "/tb[@id=0]/step[@s=0]@cnt", "-1 is below the minimum 0"},
        {"zero channels", H, {{R"(nchannels="1")", R"(nchannels="0")"}}, S, "algo@nchannels", "0 is below the minimum 1"},
        {"depid below -1", H, {{kG0Nop, R"(<step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="-2" deps="0" hasdep="0"/>)"}},
         S, g0 + "/tb[@id=2]/step[@s=1]@depid", "-2 is below the minimum -1"},
        {"int32 overflow", H, {{R"(<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="1">)", R"(<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="4294967296">)"}},
         S, g0 + "@s_chunks", "4294967296 is out of range for a 32-bit integer (the executor reads it as an int)"},
        {"int32 overflow below", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="-000099999999999999999999" dstbuf="o" dstoff="1" cnt="1")"}},
         S, g0 + "/tb[@id=0]/step[@s=0]@srcoff", "-99999999999999999999 is out of range for a 32-bit integer"},
        // minBytes/maxBytes are read with strtoll by the executor, which saturates: so does the loader.
        {"int64 overflow saturates", H, {{R"(maxBytes="1048576")", R"(maxBytes="99999999999999999999")"}}, OK, "", ""},
        {"int64 underflow saturates, then is negative", H, {{R"(minBytes="0")", R"(minBytes="-99999999999999999999")"}}, S,
         "algo@minBytes", "-9223372036854775808 is below the minimum 0"},
        {"flag 2", H, {{kG0Recv, R"(<step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="2"/>)"}},
         S, g0 + "/tb[@id=1]/step[@s=0]@hasdep", "'2' must be 0 or 1"},
        {"flag yes", H, {{R"(inplace="0")", R"(inplace="yes")"}}, S, "algo@inplace", "'yes' must be 0 or 1"},
        {"step type", H, {{kG0Send, R"(<step s="0" type="send" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1")"}}, S,
         g0 + "/tb[@id=0]/step[@s=0]@type", "unknown step type 'send' (expected one of s, r, rcs, rrs, rrc, rrcs, cpy, re, nop)"},
        {"buffer", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="x" srcoff="0" dstbuf="o" dstoff="1" cnt="1")"}}, S,
         g0 + "/tb[@id=0]/step[@s=0]@srcbuf", "unknown buffer 'x' (expected one of i, o, s)"},
        {"protocol", H, {{R"(proto="Simple")", R"(proto="LL64")"}}, S, "algo@proto", "unknown protocol 'LL64'"},
        {"collective", H, {{R"(coll="allgather")", R"(coll="allgatherv")"}}, S, "algo@coll", "unknown collective 'allgatherv'"},
        {"text inside an element", H, {{kG0Send, "hello " + kG0Send}}, P, "", "malformed XML: unexpected text 'hello'"},
        {"CDATA text inside an element", H, {{kG0Send, "<![CDATA[x<y]]>" + kG0Send}}, P, "", "unexpected text 'x<y'"},
        {"whitespace CDATA is fine", H, {{kG0Send, "<![CDATA[  ]]>" + kG0Send}}, OK, "", ""},

        // ---- structure (semantic)
        {"gpu id out of range", H, {{R"(<gpu id="1")", R"(<gpu id="2")"}}, M, "algo/gpu[@id=2]@id",
         "gpu id 2 out of range 0..1 (ngpus=2)"},
        {"duplicate gpu id", H, {{"</algo>", R"(  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="1"/>)" "\n</algo>"}}, M,
         g0 + "@id", "duplicate gpu id 0"},
        {"missing gpu", H, {{R"(ngpus="2")", R"(ngpus="3")"}}, M, "algo@ngpus", "ngpus=3 but there is no <gpu> with id 2"},
        {"tb ids with a gap", H, {{R"(<tb id="2")", R"(<tb id="3")"}}, M, g0, "tb ids must be 0..2; missing 2", 6},
        {"duplicate tb id", H, {{R"(<tb id="1")", R"(<tb id="0")"}}, M, g0 + "/tb[@id=0]@id", "duplicate tb id 0 on gpu 0"},
        {"peer out of range", H, {{R"(<tb id="0" send="1")", R"(<tb id="0" send="2")"}}, M, g0 + "/tb[@id=0]@send",
         "peer 2 out of range (-1 or 0..1)"},
        {"peer is the gpu itself", H, {{R"(<tb id="0" send="1")", R"(<tb id="0" send="0")"}}, M, g0 + "/tb[@id=0]@send",
         "peer 0 is the gpu itself"},
        {"channel", H, {{R"(<tb id="0" send="1" recv="-1" chan="0">)", R"(<tb id="0" send="1" recv="-1" chan="1">)"}}, M,
         g0 + "/tb[@id=0]@chan", "channel 1 is not below nchannels=1"},
        {"step numbering", H, {{R"(<step s="2")", R"(<step s="3")"}}, M, g0 + "/tb[@id=2]/step[@s=3]@s",
         "s=3 but this is step 2 of its threadblock (steps are numbered by position)"},

        // ---- executor limits
        {"33 channels", H, {{R"(nchannels="1")", R"(nchannels="33")"}}, M, "algo@nchannels",
         "nchannels=33 exceeds the executor's 32 channels"},
        {"cnt 72", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="72")"}}, M,
         g0 + "/tb[@id=0]/step[@s=0]@cnt", "cnt=72, the executor needs cnt below 72"},
        {"send without a send peer", H, {{kG0Recv, R"(<step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>)"}},
         M, g0 + "/tb[@id=1]/step[@s=0]@type", "a s step sends but the threadblock has send=-1"},
        {"receive without a recv peer", H, {{kG0Send, R"(<step s="0" type="rcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1")"}}, M,
         g0 + "/tb[@id=0]/step[@s=0]@type", "a rcs step receives but the threadblock has recv=-1"},
        {"nop without a dependency", H, {{kG0Nop, R"(<step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="-1" deps="-1" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=1]@depid", "nop without a dependency"},
        {"nop with hasdep", H, {{kG0Nop, R"(<step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="1" deps="0" hasdep="1"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=1]@hasdep", "nop with hasdep=1"},
        {"step after a nop without its own dependency", H, {{kG0AfterNop, R"(<step s="2" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=2]@depid", "follows nop dependencies but has no dependency itself"},
        {"trailing nop", H, {{kG0AfterNop, ""}}, M, g0 + "/tb[@id=2]/step[@s=1]@type",
         "ends with nop dependencies that the executor drops", 15},
        {"two tbs on one connection", H, {{R"(<tb id="2" send="-1" recv="-1")", R"(<tb id="2" send="-1" recv="1")"}}, M,
         g0 + "/tb[@id=2]@recv", "tbs 1 and 2 both receive from gpu 1 on channel 0"},

        // ---- chunk contract
        {"different i_chunks", H, {{R"(<gpu id="1" i_chunks="1")", R"(<gpu id="1" i_chunks="2")"}}, M, g1 + "@i_chunks",
         "i_chunks=2 but gpu 0 has i_chunks=1; every gpu needs the same buffer sizes"},
        {"o_chunks not the allgather's", H, {{R"(o_chunks="2")", R"(o_chunks="3")"}, {R"(o_chunks="2")", R"(o_chunks="3")"}}, M,
         g0 + "@o_chunks", "i_chunks=1 o_chunks=3, the allgather needs 1 and 2", 6},
        {"nchunksperloop not a multiple of ngpus", RING_AG, {{R"(nchunksperloop="8")", R"(nchunksperloop="6")"}}, M,
         "algo@nchunksperloop", "cannot derive the collective: allgather: nchunksperloop=6 is not a multiple of ngpus=4"},

        // ---- operands: only those the step type uses
        {"dst of a receive past the scratch buffer", H, {{kG0Recv, R"(<step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>)"}},
         M, g0 + "/tb[@id=1]/step[@s=0]@dstoff", "dstoff=1 cnt=1 is out of range for buffer s (1 chunks)"},
        {"src of a copy past the input", H, {{kG0Tb2Cpy, R"(<step s="0" type="cpy" srcbuf="i" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1")"}},
         M, g0 + "/tb[@id=2]/step[@s=0]@srcoff", "srcoff=1 cnt=1 is out of range for buffer i (1 chunks)"},
        {"negative src of a send", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="1" cnt="1")"}}, M,
         g0 + "/tb[@id=0]/step[@s=0]@srcoff", "srcoff=-1 cnt=1 is out of range for buffer i (1 chunks)"},
        {"a send ignores dst", H, {{kG0Send, R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="9" cnt="1")"}}, OK, "", ""},
        {"a receive ignores src", H, {{kG0Recv, R"(<step s="0" type="r" srcbuf="i" srcoff="7" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>)"}},
         OK, "", ""},

        // ---- dependencies
        {"dependency on a missing tb", H, {{kG0AfterNop, R"(<step s="2" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="5" deps="0" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=2]@depid", "depends on tb 5, which does not exist on gpu 0"},
        {"dependency on a missing step", H, {{kG0AfterNop, R"(<step s="2" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="1" deps="3" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=2]@deps", "depends on step 3 of tb 1, which has 1 steps"},
        {"dependency on a step without hasdep", H, {{kG0Recv, R"(<step s="0" type="r" srcbuf="o" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=1]@deps",
         "depends on gpu 0 tb 1 step 0 (r), which is not marked hasdep=1 (the executor only signals hasdep steps)", 15},
        {"dependency on a later step of the same tb", H, {{kG0Tb2Cpy, R"(<step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="2" deps="1")"}},
         M, g0 + "/tb[@id=2]/step[@s=0]@deps", "depends on step 1 of its own threadblock, which runs later"},
        {"dependency on a nop", H, {{kG0AfterNop, R"(<step s="2" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="2" deps="1" hasdep="0"/>)"}},
         M, g0 + "/tb[@id=2]/step[@s=2]@deps", "depends on gpu 0 tb 2 step 1 (nop), a nop, which never signals"},

        // ---- FIFO matching per (sender, receiver, channel)
        {"receive cnt differs from the send", RING_AG,
         {{R"(<step s="3" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1")", R"(<step s="3" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="2")"}},
         M, g0 + "/tb[@id=1]/step[@s=3]@cnt", "receives cnt=2 but the matching send gpu 3 tb 1 step 2 (rcs) has cnt=1 (message 3 of gpu 3 -> gpu 0 on channel 0)"},
        {"unmatched send (the receive moves nothing)", H, {{kG1Recv, R"(<step s="0" type="r" srcbuf="o" srcoff="0" dstbuf="s" dstoff="0" cnt="0")"}},
         M, g0 + "/tb[@id=0]/step[@s=0]@type",
         "unmatched send: message 1 of gpu 0 -> gpu 1 on channel 0, but gpu 1 receives only 0 message(s)", 8},
        {"unmatched receive (the send moves nothing)", H, {{kG1Send, R"(<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="0")"}},
         M, g0 + "/tb[@id=1]/step[@s=0]@type",
         "unmatched receive: expects message 1 of gpu 1 -> gpu 0 on channel 0, but gpu 1 sends only 0 message(s)", 11},

        // ---- dialects
        {"no outofplace: read as legacy", H, {{R"(outofplace="1" )", ""}}, OK, "", ""},
        {"redop: read as legacy", H, {{R"(inplace="0")", R"(inplace="0" redop="sum")"}}, OK, "", ""},
        {"legacy: unknown attribute is ignored", LEGACY_RS, {{R"(inplace="0")", R"(inplace="0" foo="1")"}}, OK, "", ""},
        {"legacy: missing coll", LEGACY_RS, {{R"(coll="reduce_scatter" )", ""}}, S, "algo@coll",
         "missing attribute 'coll' (legacy dialect)"},
        {"legacy: bad redop", LEGACY_RS, {{R"(inplace="0")", R"(inplace="0" redop="avg")"}}, S, "algo@redop",
         "unknown reduction operator 'avg'"},
        {"legacy: bad nthreads", LEGACY_RS, {{R"(inplace="0")", R"(inplace="0" nthreads="-32")"}}, S, "algo@nthreads",
         "-32 is below the minimum 0"},
        {"legacy: tb connection types", LEGACY_RS, {{R"(<tb id="0")", R"(<tb rtype="nic" stype="shm" id="0")"}}, OK, "", ""},
        {"legacy: bad connection type", LEGACY_RS, {{R"(<tb id="0")", R"(<tb rtype="ib" id="0")"}}, S,
         "algo/gpu[@id=0]/tb[@id=0]@rtype", "unknown connection type 'ib'"},
    };
}

// MLOPT_LOADER_DUMP_DIR=<dir> writes every variant there (NN-<expected status>.xml), to cross-check the rules
// with the Python loader and checker (mlopt.formats.msccl_xml.load_program, mlopt.sim.symbolic.check_program).
void dump_variant(size_t index, const Variant& v, const std::string& text) {
    const char* dir = std::getenv("MLOPT_LOADER_DUMP_DIR");
    if (!dir) return;
    const std::string path = std::string(dir) + "/" + (index < 10 ? "0" : "") + std::to_string(index) + "-" +
                             std::to_string(static_cast<int>(v.status)) + ".xml";
    std::ofstream(path, std::ios::binary) << text;
}

void test_variants() {
    const std::vector<Variant> all = variants();
    for (size_t index = 0; index < all.size(); ++index) {
        const Variant& v = all[index];
        int edit_line = 0;
        const std::string text = apply(read_text(data_path(v.fixture)), v.edits, &edit_line);
        if (text.empty()) continue;
        dump_variant(index, v, text);
        const Outcome o = load_text(text, v.fixture);
        const bool ok = CHECK_EQ(o.status, v.status);
        if (v.status == MLOPT_OK) {
            if (!ok) std::fprintf(stderr, "  variant '%s': %s\n", v.what, o.message.c_str());
            continue;
        }
        const int line = v.line ? v.line : edit_line;
        const std::string prefix = std::string(v.fixture) + ": ";
        CHECK_EQ(o.message.compare(0, prefix.size(), prefix), 0);
        if (v.status == MLOPT_ERR_PARSE) {
            CHECK_CONTAINS(o.message, "(line " + std::to_string(line) + ", column ");
        } else {
            CHECK_CONTAINS(o.message, prefix + v.location + " (line " + std::to_string(line) + "): ");
        }
        CHECK_CONTAINS(o.message, v.message);
        CHECK_EQ(o.line, line);
        CHECK(o.column >= 1);
        CHECK(o.offset >= 0 && o.offset < static_cast<int64_t>(text.size()));
        if (!ok || o.message.find(v.message) == std::string::npos) std::fprintf(stderr, "  variant '%s'\n", v.what);
    }
}

// The error's offset points at the attribute it names.
void test_error_position_points_at_the_attribute() {
    const std::string text = apply(read_text(data_path(H)), {{R"(<tb id="0" send="1")", R"(<tb id="0"   send="7")"}}, nullptr);
    const Outcome o = load_text(text, H);
    CHECK_EQ(o.status, MLOPT_ERR_SEMANTIC);
    if (!CHECK(o.offset >= 0)) return;
    const auto offset = static_cast<size_t>(o.offset);
    CHECK_EQ(text.substr(offset, 8), std::string("send=\"7\""));
    CHECK_EQ(o.line, 7);
    CHECK_EQ(o.column, static_cast<int64_t>(offset - text.rfind('\n', offset)));  // bytes since the line start, 1-based
    CHECK_EQ(o.column, 18);  // '    <tb id="0"   ' is 17 bytes
}

// ------------------------------------------------------------------------------------------------ fixtures

void test_every_fixture_loads() {
    for (const char* name : kXmlFixtures) {
        const Outcome o = load_file(data_path(name));
        if (!CHECK_EQ(o.status, MLOPT_OK)) {
            std::fprintf(stderr, "  %s: %s\n", name, o.message.c_str());
            continue;
        }
        CHECK_EQ(mlopt_plan_get_kind(o.plan.get()), MLOPT_PLAN_MSCCL_XML);
        CHECK_EQ(std::string(mlopt_plan_format(o.plan.get())), "msccl-ef");
        CHECK_EQ(std::string(mlopt_plan_schema_version(o.plan.get())), "");
        CHECK_EQ(std::string(mlopt_plan_planner(o.plan.get())), "collective");
        mlopt_program_info info{};
        info.struct_size = sizeof info;
        CHECK_EQ(mlopt_plan_program_info(o.plan.get(), &info, nullptr), MLOPT_OK);
        CHECK(info.ngpus >= 2 && info.threadblocks >= info.ngpus && info.steps > 0);
        CHECK(info.i_chunks >= 1 && info.o_chunks >= 1);
    }
    for (const char* name : kJsonFixtures) {
        const Outcome o = load_file(data_path(name));
        if (!CHECK_EQ(o.status, MLOPT_OK)) {
            std::fprintf(stderr, "  %s: %s\n", name, o.message.c_str());
            continue;
        }
        CHECK_EQ(o.plan.kind(), MLOPT_PLAN_JSON);
        CHECK_EQ(std::string(o.plan.format()), "mlopt.plan");
        CHECK_EQ(std::string(o.plan.schema_version()), "1.0");
        const std::string planner = o.plan.planner();
        CHECK(planner == "collective" || planner == "memory");
        CHECK_EQ(planner == "memory", std::string(name) == "fc2_memory.plan.json");
    }
}

// The fixtures copied from /work/shared/reference are the reference files (when that folder is there).
void test_reference_copies_are_identical() {
    const char* repo = std::getenv("MLOPT_REPO");
    if (!repo) return;
    for (const char* name : {"msccl-scheduler_ncv4_ag_hier_4_LL.xml", "rccl_alltoall-8n-0-9kb.xml"}) {
        const std::string reference = std::string(repo) + "/../shared/reference/msccl-xml/" + name;
        if (!std::ifstream(reference).good()) continue;
        CHECK(read_text(reference) == read_text(data_path(name)));
        const Outcome o = load_file(reference);
        CHECK_EQ(o.status, MLOPT_OK);
    }
}

void test_reference_program_info() {
    {
        const mlopt::Plan plan = mlopt::Plan::load(data_path("msccl-scheduler_ncv4_ag_hier_4_LL.xml"));
        const mlopt_program_info i = plan.program_info();
        CHECK_EQ(std::string(i.name), "allgather_hierarchical");
        CHECK_EQ(std::string(i.coll), "allgather");
        CHECK_EQ(std::string(i.proto), "LL");
        CHECK_EQ(i.ngpus, 4);
        CHECK_EQ(i.nchannels, 4);
        CHECK_EQ(i.nchunksperloop, 16);
        CHECK_EQ(i.inplace, 0);
        CHECK_EQ(i.outofplace, 1);
        CHECK_EQ(i.min_bytes, 64);
        CHECK_EQ(i.max_bytes, 792576);
        CHECK_EQ(i.threadblocks, 48);
        CHECK_EQ(i.steps, 96);
        CHECK_EQ(i.i_chunks, 4);
        CHECK_EQ(i.o_chunks, 16);
        CHECK_EQ(i.s_chunks, 0);
        CHECK_EQ(plan.output_count(4096), size_t{16384});
    }
    {
        const mlopt::Plan plan = mlopt::Plan::load(data_path("rccl_alltoall-8n-0-9kb.xml"));
        const mlopt_program_info i = plan.program_info();
        CHECK_EQ(std::string(i.name), "alltoall_llm");
        CHECK_EQ(std::string(i.coll), "alltoall");
        CHECK_EQ(i.ngpus, 8);
        CHECK_EQ(i.nchannels, 1);
        CHECK_EQ(i.nchunksperloop, 8);
        CHECK_EQ(i.min_bytes, 0);
        CHECK_EQ(i.max_bytes, 9216);
        CHECK_EQ(i.steps, 120);
        CHECK_EQ(i.i_chunks, 8);
        CHECK_EQ(i.o_chunks, 8);
        CHECK_EQ(plan.output_count(800), size_t{800});
    }
}

void test_legacy_dialect() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path(LEGACY_RS));
    const mlopt_program_info i = plan.program_info();
    CHECK_EQ(std::string(i.coll), "reducescatter");  // spelled reduce_scatter in the file
    CHECK_EQ(i.inplace, 0);
    CHECK_EQ(i.outofplace, 1);  // absent: not inplace
    CHECK_EQ(i.min_bytes, 0);   // absent: 0
    CHECK_EQ(i.i_chunks, 8);
    CHECK_EQ(i.o_chunks, 2);
    CHECK_EQ(plan.output_count(80), size_t{20});

    // proto and maxBytes absent: Simple and 2^27, as the first MSCCL runtime assumed.
    std::string text = read_text(data_path(LEGACY_RS));
    text = apply(text, {{R"(proto="Simple" )", ""}, {R"( maxBytes="1099511627776")", ""}}, nullptr);
    const Outcome o = load_text(text);
    REQUIRE(o.status == MLOPT_OK);
    const mlopt_program_info d = o.plan.program_info();
    CHECK_EQ(std::string(d.proto), "Simple");
    CHECK_EQ(d.max_bytes, int64_t{1} << 27);

    const mlopt::Plan broadcast = mlopt::Plan::load(data_path("switch4_broadcast_legacy.xml"));
    CHECK_EQ(std::string(broadcast.program_info().proto), "LL");
    CHECK_EQ(std::string(broadcast.program_info().coll), "broadcast");
}

void test_explicit_dialects() {
    // The executor dialect wants 'reducescatter' (auto reads this file as legacy).
    const std::string text = read_text(data_path(LEGACY_RS));
    const mlopt::XmlDocument doc = mlopt::parse_xml(text, LEGACY_RS);
    CHECK(mlopt::detect_msccl_dialect(doc.root()) == mlopt::MscclDialect::legacy);
    mlopt::ProgramSource where;
    where.file = LEGACY_RS;
    try {
        mlopt::read_msccl_program(doc, where, mlopt::MscclDialect::executor);
        CHECK(!"the executor dialect accepted a legacy file");
    } catch (const mlopt::LoadError& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_SCHEMA);
        // The first attribute the executor dialect misses is outofplace.
        CHECK_CONTAINS(e.message(), "algo@outofplace (line 1): missing attribute 'outofplace' (executor dialect)");
    }
    const std::string executor_spelling = apply(
        text, {{R"(inplace="0")", R"(inplace="0" outofplace="1" minBytes="0")"}}, nullptr);
    const mlopt::XmlDocument doc2 = mlopt::parse_xml(executor_spelling, LEGACY_RS);
    CHECK(mlopt::detect_msccl_dialect(doc2.root()) == mlopt::MscclDialect::legacy);  // still reduce_scatter
    try {
        mlopt::read_msccl_program(doc2, where, mlopt::MscclDialect::executor);
        CHECK(!"the executor dialect accepted reduce_scatter");
    } catch (const mlopt::LoadError& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_SCHEMA);
        CHECK_CONTAINS(e.message(), "algo@coll (line 1): 'reduce_scatter' is the legacy spelling");
    }
    // The legacy dialect reads executor files too.
    const std::string ring = read_text(data_path(RING_AG));
    const mlopt::XmlDocument doc3 = mlopt::parse_xml(ring, RING_AG);
    CHECK(mlopt::detect_msccl_dialect(doc3.root()) == mlopt::MscclDialect::executor);
    const mlopt::Program p = mlopt::read_msccl_program(doc3, where, mlopt::MscclDialect::legacy);
    CHECK_EQ(p.ngpus, 4);
}

void test_handmade_fixture_details() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path(H));
    const mlopt_program_info i = plan.program_info();
    CHECK_EQ(std::string(i.name), "allgather nop & deps");  // &#32; and &amp; decoded
    CHECK_EQ(i.s_chunks, 1);
    CHECK_EQ(i.steps, 10);
    CHECK_EQ(i.threadblocks, 6);
}

void test_output_count() {
    const mlopt::Plan plan = mlopt::Plan::load(data_path(RING_AG));  // i_chunks 2, o_chunks 8
    size_t out = 0;
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_output_count(plan.get(), 6, &out, &err), MLOPT_OK);
    CHECK_EQ(out, size_t{24});
    CHECK(err == nullptr);
    CHECK_EQ(mlopt_output_count(plan.get(), 0, &out, nullptr), MLOPT_OK);
    CHECK_EQ(out, size_t{0});
    CHECK_EQ(mlopt_output_count(plan.get(), 5, &out, &err), MLOPT_ERR_INVALID_ARGUMENT);
    REQUIRE(err != nullptr);
    CHECK_CONTAINS(mlopt_error_message(err), "count 5 is not a multiple of i_chunks=2");
    mlopt_error_free(err);
    // count * o_chunks / i_chunks must fit in size_t.
    const size_t huge = (static_cast<size_t>(-1) / 2) * 2;
    CHECK_EQ(mlopt_output_count(plan.get(), huge, &out, nullptr), MLOPT_ERR_INVALID_ARGUMENT);

    const mlopt::Plan json = mlopt::Plan::load(data_path("ring4_allgather.json"));
    CHECK_EQ(mlopt_output_count(json.get(), 6, &out, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    mlopt_program_info info{};
    info.struct_size = sizeof info;
    CHECK_EQ(mlopt_plan_program_info(json.get(), &info, &err), MLOPT_ERR_INVALID_ARGUMENT);
    REQUIRE(err != nullptr);
    CHECK_CONTAINS(mlopt_error_message(err), "has no MSCCL-EF program");
    mlopt_error_free(err);
}

// ------------------------------------------------------------------------------------------------ JSON envelope

std::string json_plan(const std::string& version = "1.0", const std::string& extra = "",
                      const std::string& status = "\"heuristic\"", const std::string& kind = "\"collective\"") {
    return "{\n"
           "  \"format\": \"mlopt.plan\",\n"
           "  \"schema_version\": \"" + version + "\",\n"
           "  \"kind\": " + kind + ",\n" + extra +
           "  \"provenance\": {\n"
           "    \"mlopt_version\": \"0.1.0\", \"inputs\": {\"topology\": \"" + std::string(64, 'a') + "\"},\n"
           "    \"solver\": {\"name\": \"none\", \"version\": \"\"}, \"status\": " + status + ",\n"
           "    \"objective\": 1.5e1, \"best_bound\": null, \"gap\": 0, \"options\": {}\n"
           "  },\n"
           "  \"payload\": {\"nested\": [1, -2.5e-3, true, false, null, \"\\u00e9\\ud83d\\ude00\"]}\n"
           "}\n";
}

void expect_json_error(const std::string& text, mlopt_status status, const std::string& part, int line = 0) {
    const Outcome o = load_text(text, "plan.json");
    CHECK_EQ(o.status, status);
    CHECK_CONTAINS(o.message, part);
    CHECK_EQ(o.message.compare(0, 11, "plan.json: "), 0);
    if (line) CHECK_EQ(o.line, line);
}

void test_json_envelope() {
    {
        const Outcome o = load_text(json_plan(), "plan.json");
        CHECK_EQ(o.status, MLOPT_OK);
    }
    {
        // A surrogate pair in a \u escape comes out as one UTF-8 character.
        const Outcome o = load_text(json_plan("1.0", "", "\"heuristic\"", "\"x\\ud83d\\ude00\""), "plan.json");
        REQUIRE(o.status == MLOPT_OK);
        CHECK_EQ(std::string(o.plan.planner()), "x\xF0\x9F\x98\x80");
    }
    // Versions: any minor of major 1; another major is refused with a clear message.
    CHECK_EQ(load_text(json_plan("1.7")).status, MLOPT_OK);
    expect_json_error(json_plan("2.0"), MLOPT_ERR_SCHEMA,
                      "plan.json: $.schema_version (line 3): mlopt.plan major version 2 is not supported (this "
                      "runtime reads 1.x); upgrade the mlopt runtime to read it", 3);
    expect_json_error(json_plan("0.9"), MLOPT_ERR_SCHEMA, "major version 0 is not supported (this runtime reads 1.x)");
    expect_json_error(json_plan("10.0"), MLOPT_ERR_SCHEMA, "major version 10 is not supported");
    expect_json_error(json_plan("1"), MLOPT_ERR_SCHEMA, "'1' is not of the form MAJOR.MINOR");
    expect_json_error(json_plan("1.0.1"), MLOPT_ERR_SCHEMA, "is not of the form MAJOR.MINOR");
    expect_json_error(json_plan("01.0"), MLOPT_ERR_SCHEMA, "does not match");
    // Unknown fields: an error in the minor this runtime knows, tolerated in newer minors (optional additions).
    expect_json_error(json_plan("1.0", "  \"extra\": 1,\n"), MLOPT_ERR_SCHEMA, "$ (line 5): unknown field 'extra'", 5);
    CHECK_EQ(load_text(json_plan("1.3", "  \"extra\": 1,\n")).status, MLOPT_OK);
    // Format and required fields, with their types.
    {
        std::string t = json_plan();
        t.replace(t.find("mlopt.plan"), 10, "mlopt.plan-index");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.format (line 2): expected 'mlopt.plan', found format 'mlopt.plan-index'");
    }
    {
        std::string t = json_plan();
        t.replace(t.find("\"format\": \"mlopt.plan\","), 23, "");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.format (line 1): expected 'mlopt.plan', found no `format` field");
    }
    {
        std::string t = json_plan();
        t.replace(t.find("\"payload\""), 9, "\"payloads\"");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.payload (line 1): missing required field");
    }
    expect_json_error(json_plan("1.0", "", "\"heuristic\"", "3"), MLOPT_ERR_SCHEMA,
                      "$.kind (line 4): expected a string, found a number");
    expect_json_error(json_plan("1.0", "", "\"heuristic\"", "\"\""), MLOPT_ERR_SCHEMA, "$.kind (line 4): must not be empty");
    expect_json_error(json_plan("1.0", "", "\"bogus\""), MLOPT_ERR_SCHEMA,
                      "$.provenance.status (line 7): 'bogus' is not one of: optimal, feasible, heuristic");
    {
        std::string t = json_plan();
        t.replace(t.find("\"gap\": 0"), 8, "\"gap\": -1");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.provenance.gap (line 8): must be >= 0");
    }
    {
        std::string t = json_plan();
        t.replace(t.find(std::string(64, 'a')), 64, "xyz");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.provenance.inputs.topology (line 6): 'xyz' is not a sha256 hex digest");
    }
    {
        std::string t = json_plan();
        t.replace(t.find("\"options\": {}"), 13, "\"options\": []");
        expect_json_error(t, MLOPT_ERR_SCHEMA, "$.provenance.options (line 8): expected an object, found an array");
    }
    expect_json_error("{\"format\": \"mlopt.plan\"}", MLOPT_ERR_SCHEMA, "$.schema_version (line 1): missing or not a string");

    // Malformed JSON: MLOPT_ERR_PARSE with line and column.
    expect_json_error("{\n  \"a\": 1,\n}", MLOPT_ERR_PARSE, "$: malformed JSON at line 3 column 1: expected a string key", 3);
    expect_json_error("{\"a\": NaN}", MLOPT_ERR_PARSE, "malformed JSON at line 1 column 7: expected a value");
    expect_json_error("{\"a\": 01}", MLOPT_ERR_PARSE, "leading zeros");
    expect_json_error("{\"a\": 1e999}", MLOPT_ERR_PARSE, "too large for a double");
    expect_json_error("{\"a\": 1, \"a\": 2}", MLOPT_ERR_PARSE, "line 1 column 10: duplicate key 'a'");
    expect_json_error("{\"a\": \"\\ud800\"}", MLOPT_ERR_PARSE, "without a low surrogate");
    expect_json_error("{\"a\": \"\\udc00\"}", MLOPT_ERR_PARSE, "lone low surrogate");
    expect_json_error("{\"a\": \"\\x\"}", MLOPT_ERR_PARSE, "invalid escape");
    expect_json_error("{\"a\": \"tab\there\"}", MLOPT_ERR_PARSE, "control character");
    expect_json_error("{\"a\": \"\xff\"}", MLOPT_ERR_PARSE, "invalid UTF-8");
    expect_json_error("{\"a\": \"\xc0\xaf\"}", MLOPT_ERR_PARSE, "invalid UTF-8");  // overlong '/'
    expect_json_error("{\"a\": 1} x", MLOPT_ERR_PARSE, "extra data");
    expect_json_error("\xEF\xBB\xBF{}", MLOPT_ERR_PARSE, "byte order mark");
    expect_json_error("{\"a\": [1, 2,]}", MLOPT_ERR_PARSE, "expected a value");
    expect_json_error("{\"a\": tru}", MLOPT_ERR_PARSE, "expected a value");
    expect_json_error("{\"a\": -}", MLOPT_ERR_PARSE, "expected a digit");
    expect_json_error("{\"a\": 1.}", MLOPT_ERR_PARSE, "expected a digit after '.'");
    {
        // Nesting: 256 levels of containers in all are fine, more are refused before the stack is at risk.
        const std::string deep = std::string(254, '[') + std::string(254, ']');
        std::string t = json_plan();
        t.replace(t.find("\"payload\": {"), 12, "\"payload\": {\"deep\": " + deep + ",");
        CHECK_EQ(load_text(t).status, MLOPT_OK);
        const std::string deeper = std::string(100000, '[');
        expect_json_error("{\"a\": " + deeper, MLOPT_ERR_PARSE, "nested deeper than 256 levels");
    }
    {
        // Numbers: exact int64 when integral; underflow rounds to 0.
        const mlopt::JsonValue v = mlopt::parse_json(
            "[9007199254740993, -9223372036854775808, 1.0, 1e3, 0.5, 1e-400, 18446744073709551616]", "n.json");
        REQUIRE(v.items.size() == 7);
        CHECK(v.items[0].is_int64 && v.items[0].integer == 9007199254740993LL);
        CHECK(v.items[1].is_int64 && v.items[1].integer == INT64_MIN);
        CHECK(v.items[2].is_int64 && v.items[2].integer == 1);
        CHECK(v.items[3].is_int64 && v.items[3].integer == 1000);
        CHECK(!v.items[4].is_int64 && v.items[4].number == 0.5);
        CHECK(v.items[5].number == 0.0);
        CHECK(!v.items[6].is_int64 && v.items[6].number == 18446744073709551616.0);
    }
}

// ------------------------------------------------------------------------------------------------ XML syntax

void expect_xml_error(const std::string& text, const std::string& part, int line, int column) {
    const Outcome o = load_text(text, "bad.xml");
    CHECK_EQ(o.status, MLOPT_ERR_PARSE);
    CHECK_CONTAINS(o.message, "bad.xml: (line " + std::to_string(line) + ", column " + std::to_string(column) +
                                  "): malformed XML: " + part);
    CHECK_EQ(o.line, line);
    CHECK_EQ(o.column, column);
}

void test_xml_syntax_errors() {
    expect_xml_error("<algo>\n  <gpu>\n</algo>", "mismatched tag: </algo> closes <gpu> (line 2)", 3, 1);
    expect_xml_error("<algo>\n  <gpu>", "unexpected end of input: <gpu> (line 2) is not closed", 2, 8);
    expect_xml_error("<algo a=\"1\" a=\"2\"/>", "duplicate attribute 'a'", 1, 13);
    expect_xml_error("<algo a=1/>", "attribute value must be quoted", 1, 9);
    expect_xml_error("<algo a=\"1\"b=\"2\"/>", "expected whitespace before an attribute", 1, 12);
    expect_xml_error("<algo a=\"&nbsp;\"/>", "undefined entity &nbsp;", 1, 10);
    expect_xml_error("<algo a=\"&#0;\"/>", "character reference to a character not allowed in XML", 1, 10);
    expect_xml_error("<algo a=\"&#xD800;\"/>", "character reference to a character not allowed in XML", 1, 10);
    expect_xml_error("<algo a=\"&#99999999999;\"/>", "character reference to a character not allowed in XML", 1, 10);
    expect_xml_error("<algo a=\"&amp\"/>", "malformed entity reference", 1, 10);
    expect_xml_error("<algo a=\"<\"/>", "'<' inside an attribute value", 1, 10);
    expect_xml_error("<algo a=\"1/>", "unterminated attribute value", 1, 9);
    expect_xml_error("<!DOCTYPE algo>\n<algo/>", "DOCTYPE declarations are not allowed", 1, 1);
    expect_xml_error("<algo/>\n<algo/>", "second root element <algo>", 2, 1);
    expect_xml_error("<algo/>\nx", "junk after the root element", 2, 1);
    expect_xml_error("<algo>]]></algo>", "']]>' in character data", 1, 7);
    expect_xml_error("<algo><!-- a -- b --></algo>", "'--' inside a comment", 1, 14);
    expect_xml_error("<algo><!-- a </algo>", "unterminated comment", 1, 7);
    expect_xml_error("<algo><![CDATA[ a </algo>", "unterminated CDATA section", 1, 7);
    expect_xml_error("<algo><?pi x </algo>", "unterminated processing instruction", 1, 7);
    expect_xml_error("<algo/>\n<?xml version=\"1.0\"?>", "XML declaration not at the start of the document", 2, 1);
    expect_xml_error("<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><algo/>", "unsupported encoding 'ISO-8859-1'", 1, 30);
    expect_xml_error("<?xml encoding=\"UTF-8\"?><algo/>", "the XML declaration needs a version", 1, 1);
    expect_xml_error("<algo a=\"\xff\"/>", "invalid UTF-8 (byte 0xff)", 1, 10);
    expect_xml_error("<algo a=\"\xed\xa0\x80\"/>", "invalid UTF-8", 1, 10);  // an encoded surrogate
    expect_xml_error("<algo a=\"\x01\"/>", "character U+0001 is not allowed in XML", 1, 10);
    expect_xml_error("<algo>\n<1/></algo>", "expected an element name", 2, 2);
    expect_xml_error("<algo", "unexpected end of input in a start tag", 1, 6);
    expect_xml_error("<!-- only a comment -->", "no root element", 1, 24);
    {
        // Nesting is bounded: a deep document is refused with a parse error, not a stack overflow.
        std::string deep;
        for (int i = 0; i < 100000; ++i) deep += "<a>";
        const Outcome o = load_text(deep, "deep.xml");
        CHECK_EQ(o.status, MLOPT_ERR_PARSE);
        CHECK_CONTAINS(o.message, "elements nested deeper than 256");
    }
    {
        // Accepted: declaration, byte order mark, PIs and comments around the root, both quote styles,
        // numeric references, CR LF line ends; the legacy dialect's attributes in single quotes.
        const std::string fine = apply(read_text(data_path(H)), {{"<algo name=", "<?pi data?>\r\n<algo name="},
                                                                  {R"(ngpus="2")", "ngpus='&#x32;'"}},
                                       nullptr);
        const Outcome o = load_text("\xEF\xBB\xBF" + fine + "<!-- trailing -->\r\n<?pi?>\n", "fine.xml");
        CHECK_EQ(o.status, MLOPT_OK);
        if (o.status != MLOPT_OK) std::fprintf(stderr, "  %s\n", o.message.c_str());
    }
    {
        // Attribute values are normalised as XML says: a literal newline or tab is a space, &#10; stays.
        const mlopt::XmlDocument d = mlopt::parse_xml("<a x=\"1\n2\t3&#10;4\r\n5\" y='\"'/>", "n.xml");
        CHECK_EQ(d.root().attribute("x")->value, std::string("1 2 3\n4 5"));
        CHECK_EQ(d.root().attribute("y")->value, std::string("\""));
        CHECK_EQ(d.root().attribute("y")->at.line, int64_t{3});  // after the value's LF and CR LF
        CHECK_EQ(d.root().attribute("y")->at.column, int64_t{4});
    }
}

// Every prefix that cuts into the document is malformed: MLOPT_ERR_PARSE, never a crash.
void test_truncated_inputs() {
    std::vector<std::string> names(std::begin(kXmlFixtures), std::end(kXmlFixtures));
    names.insert(names.end(), std::begin(kJsonFixtures), std::end(kJsonFixtures));
    int loads = 0;
    for (const std::string& name : names) {
        const std::string text = read_text(data_path(name));
        const size_t last = text.find_last_not_of(" \t\r\n");
        for (size_t cut = 0; cut < text.size(); cut += 37) {
            const Outcome o = load_text(text.substr(0, cut), name.c_str());
            ++loads;
            if (cut <= last) {
                if (!CHECK_EQ(o.status, MLOPT_ERR_PARSE)) std::fprintf(stderr, "  %s cut at %zu\n", name.c_str(), cut);
                CHECK(o.line >= 1 && o.column >= 1);
            }
        }
    }
    CHECK(loads > 1000);
}

// ------------------------------------------------------------------------------------------------ C ABI edges

void test_kind_detection_and_io() {
    expect_json_error("", MLOPT_ERR_PARSE, "empty input");
    expect_json_error(" \n\t ", MLOPT_ERR_PARSE, "empty input");
    expect_json_error("hello", MLOPT_ERR_PARSE, "not an MSCCL-EF XML or mlopt JSON plan: starts with 'hello'");
    expect_json_error("[1]", MLOPT_ERR_PARSE, "starts with '[1]' (expected '<' or '{')");
    expect_json_error("\x1f\x8b\x08\x00", MLOPT_ERR_UNSUPPORTED, "gzip-compressed plans are not supported");
    CHECK_EQ(load_text("\n\n   " + read_text(data_path(RING_AG))).status, MLOPT_OK);
    // ... but nothing may precede an XML declaration (XML 1.0; expat agrees).
    expect_json_error("\n" + read_text(data_path(H)), MLOPT_ERR_PARSE, "XML declaration not at the start of the document");
    CHECK_EQ(load_text("  \r\n" + json_plan()).status, MLOPT_OK);
    {
        const Outcome o = load_file("data/no-such-plan.xml");
        CHECK_EQ(o.status, MLOPT_ERR_IO);
        CHECK_CONTAINS(o.message, "data/no-such-plan.xml: cannot open: No such file or directory");
        CHECK_EQ(o.line, 0);
        CHECK_EQ(o.offset, -1);
    }
    {
        const Outcome o = load_file(data_dir());
        CHECK_EQ(o.status, MLOPT_ERR_IO);
        CHECK_CONTAINS(o.message, "Is a directory");
    }
    {
        // Name in messages: "<memory>" without one.
        mlopt_plan plan = nullptr;
        mlopt_error err = nullptr;
        CHECK_EQ(mlopt_plan_load_memory("<algo/>", 7, nullptr, &plan, &err), MLOPT_ERR_SCHEMA);
        REQUIRE(err != nullptr);
        CHECK_CONTAINS(mlopt_error_message(err), "<memory>: algo@name (line 1): missing attribute 'name'");
        mlopt_error_free(err);
    }
    {
        // Not NUL-terminated: only `size` bytes are read.
        const std::string text = read_text(data_path(H));
        std::vector<char> exact(text.begin(), text.end());
        mlopt_plan plan = nullptr;
        CHECK_EQ(mlopt_plan_load_memory(exact.data(), exact.size(), "exact.xml", &plan, nullptr), MLOPT_OK);
        mlopt_plan_free(plan);
    }
}

void test_null_arguments() {
    mlopt_plan plan = reinterpret_cast<mlopt_plan>(0x1);  // must be overwritten with NULL
    mlopt_error err = nullptr;
    CHECK_EQ(mlopt_plan_load(nullptr, &plan, &err), MLOPT_ERR_INVALID_ARGUMENT);
    CHECK(plan == nullptr);
    REQUIRE(err != nullptr);
    CHECK_CONTAINS(mlopt_error_message(err), "path is NULL");
    mlopt_error_free(err);
    CHECK_EQ(mlopt_plan_load(data_path(H).c_str(), nullptr, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    CHECK_EQ(mlopt_plan_load_memory(nullptr, 10, "x", &plan, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    CHECK_EQ(mlopt_plan_load_memory("<algo/>", 7, "x", nullptr, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    // err may be NULL: the status alone.
    CHECK_EQ(mlopt_plan_load(nullptr, nullptr, nullptr), MLOPT_ERR_INVALID_ARGUMENT);
    CHECK_EQ(mlopt_plan_load("data/no-such-plan.xml", &plan, nullptr), MLOPT_ERR_IO);
    mlopt_program_info info{};
    info.struct_size = sizeof info;
    CHECK_EQ(mlopt_plan_program_info(nullptr, &info, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    size_t out = 0;
    CHECK_EQ(mlopt_output_count(nullptr, 4, &out, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    const mlopt::Plan good = mlopt::Plan::load(data_path(H));
    CHECK_EQ(mlopt_plan_program_info(good.get(), nullptr, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    mlopt_program_info unset{};
    CHECK_EQ(mlopt_plan_program_info(good.get(), &unset, &err), MLOPT_ERR_INVALID_ARGUMENT);
    REQUIRE(err != nullptr);
    CHECK_CONTAINS(mlopt_error_message(err), "struct_size");
    mlopt_error_free(err);
    // An older caller's struct, ending before `root`, gets what it has and nothing past it.
    mlopt_program_info older;
    std::memset(&older, 0x5a, sizeof older);
    older.struct_size = offsetof(mlopt_program_info, root);
    CHECK_EQ(mlopt_plan_program_info(good.get(), &older, &err), MLOPT_OK);
    CHECK_EQ(older.ngpus, good.program_info().ngpus);
    CHECK_EQ(older.root, 0x5a5a5a5a);
    CHECK_EQ(mlopt_output_count(good.get(), 4, nullptr, &err), MLOPT_ERR_INVALID_ARGUMENT);
    mlopt_error_free(err);
    // Queries on NULL: no crash, "" and kind 0.
    CHECK_EQ(static_cast<int>(mlopt_plan_get_kind(nullptr)), 0);
    CHECK_EQ(std::string(mlopt_plan_format(nullptr)), "");
    CHECK_EQ(std::string(mlopt_plan_schema_version(nullptr)), "");
    CHECK_EQ(std::string(mlopt_plan_planner(nullptr)), "");
    mlopt_plan_free(nullptr);
}

void test_cpp_wrapper() {
    try {
        mlopt::Plan::load("data/no-such-plan.xml");
        CHECK(!"no exception");
    } catch (const mlopt::Error& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_IO);
        CHECK_CONTAINS(e.what(), "No such file");
    }
    try {
        mlopt::Plan::from_memory("<algo>\n<gpu>", "broken.xml");
        CHECK(!"no exception");
    } catch (const mlopt::Error& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_PARSE);
        CHECK_EQ(e.line(), int64_t{2});
        CHECK_EQ(e.column(), int64_t{6});
        CHECK_EQ(e.offset(), int64_t{12});
    }
    try {
        mlopt::Plan::from_memory(std::string_view(), "empty");
        CHECK(!"no exception");
    } catch (const mlopt::Error& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_PARSE);
    }
    mlopt::Plan a = mlopt::Plan::load(data_path(RING_AG));
    mlopt::Plan b = std::move(a);
    CHECK(!a && b);
    CHECK_EQ(b.output_count(2), size_t{8});
    try {
        b.output_count(3);
        CHECK(!"no exception");
    } catch (const mlopt::Error& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_INVALID_ARGUMENT);
    }
    mlopt_plan raw = b.release();
    CHECK(!b && raw != nullptr);
    mlopt::Plan c(raw);
    CHECK_EQ(c.kind(), MLOPT_PLAN_MSCCL_XML);
    CHECK_EQ(std::string(mlopt::status_string(MLOPT_ERR_SCHEMA)), "schema error");
    const mlopt::Version v = mlopt::library_version();
    CHECK_EQ(v.major, MLOPT_VERSION_MAJOR);
    CHECK_EQ(v.minor, MLOPT_VERSION_MINOR);
}

// ------------------------------------------------------------------------------------------------ built in code

// validate_program also serves programs built in code (no source positions): messages then have no line.
void test_validate_program_built_in_code() {
    mlopt::Program p;
    p.name = "many peers";
    p.proto = "Simple";
    p.nchannels = 1;
    p.nchunksperloop = 1;
    p.ngpus = 40;
    p.coll = "broadcast";
    p.gpus.resize(40);
    for (int32_t g = 0; g < 40; ++g) {
        p.gpus[static_cast<size_t>(g)].id = g;
        p.gpus[static_cast<size_t>(g)].i_chunks = 1;
        p.gpus[static_cast<size_t>(g)].o_chunks = 1;
    }
    mlopt::ProgramSource none;
    none.file = "code";
    mlopt::validate_program(p, none);  // no threadblocks: fine
    // 33 threadblocks of gpu 0 sending to 33 peers on one channel: over the executor's 32.
    for (int32_t t = 0; t < 33; ++t) {
        mlopt::Threadblock tb;
        tb.id = t;
        tb.send = t + 1;
        p.gpus[0].tbs.push_back(tb);
    }
    try {
        mlopt::validate_program(p, none);
        CHECK(!"accepted 33 threadblocks on a channel");
    } catch (const mlopt::LoadError& e) {
        CHECK_EQ(e.status(), MLOPT_ERR_SEMANTIC);
        CHECK_CONTAINS(e.message(), "code: algo/gpu[@id=0]/tb[@id=32]@send: more than 32 threadblocks send to peers on channel 0");
        CHECK_EQ(e.at().line, int64_t{0});
    }
    // 65 steps in one threadblock (64 are fine).
    p.gpus[0].tbs.resize(1);
    mlopt::Step copy;
    copy.type = mlopt::StepType::cpy;
    copy.cnt = 1;
    copy.srcbuf = mlopt::Buffer::input;
    copy.dstbuf = mlopt::Buffer::output;
    for (int32_t s = 0; s < 64; ++s) {
        copy.s = s;
        p.gpus[0].tbs[0].steps.push_back(copy);
    }
    mlopt::validate_program(p, none);
    copy.s = 64;
    p.gpus[0].tbs[0].steps.push_back(copy);
    try {
        mlopt::validate_program(p, none);
        CHECK(!"accepted 65 steps");
    } catch (const mlopt::LoadError& e) {
        CHECK_CONTAINS(e.message(), "code: algo/gpu[@id=0]/tb[@id=0]: 65 steps, the executor allows at most 64 per threadblock");
    }
    // ngpus and the gpu list disagree.
    p.gpus[0].tbs[0].steps.resize(1);
    p.ngpus = 41;
    try {
        mlopt::validate_program(p, none);
        CHECK(!"accepted ngpus=41 with 40 gpus");
    } catch (const mlopt::LoadError& e) {
        CHECK_CONTAINS(e.message(), "code: algo@ngpus: ngpus=41 but the program has 40 gpus");
    }
}

// 65 steps in an XML threadblock: the limit is reported at the threadblock with its line.
void test_step_limit_in_xml() {
    std::string steps;
    for (int s = 0; s < 65; ++s)
        steps += "      <step s=\"" + std::to_string(s) +
                 "\" type=\"cpy\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"0\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n";
    const std::string text = apply(read_text(data_path(H)), {{"      " + kG0Tb2Cpy + R"( hasdep="0"/>)" + "\n", ""},
                                                             {"      " + kG0Nop + "\n", ""},
                                                             {"      " + kG0AfterNop + "\n", steps}},
                                   nullptr);
    const Outcome o = load_text(text, H);
    CHECK_EQ(o.status, MLOPT_ERR_SEMANTIC);
    CHECK_CONTAINS(o.message, "algo/gpu[@id=0]/tb[@id=2] (line 13): 65 steps, the executor allows at most 64 per threadblock");
}

}  // namespace

int main() try {
    test_every_fixture_loads();
    test_reference_copies_are_identical();
    test_reference_program_info();
    test_legacy_dialect();
    test_explicit_dialects();
    test_handmade_fixture_details();
    test_output_count();
    test_variants();
    test_error_position_points_at_the_attribute();
    test_json_envelope();
    test_xml_syntax_errors();
    test_truncated_inputs();
    test_kind_detection_and_io();
    test_null_arguments();
    test_cpp_wrapper();
    test_validate_program_built_in_code();
    test_step_limit_in_xml();
    return check::finish("test_loader");
} catch (const std::exception& e) {  // e.g. mlopt::Error from the C++ wrapper when a fixture is missing
    CHECK(!"uncaught exception");
    std::fprintf(stderr, "uncaught exception: %s\n", e.what());
    return check::finish("test_loader");
}

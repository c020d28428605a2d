// MSCCL-EF XML -> Program (see msccl_xml.hpp). Check for check, message for message a port of
// mlopt/formats/msccl_xml.py parse_program/_parse_gpu/_parse_tb/_parse_step; keep the two in step.
#include "msccl_xml.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace mlopt {
namespace {

using Names = std::vector<std::string_view>;

const Names kAlgoAttrs = {"name", "proto", "nchannels", "nchunksperloop", "ngpus",
                          "coll", "inplace", "outofplace", "minBytes", "maxBytes"};
const Names kGpuAttrs = {"id", "i_chunks", "o_chunks", "s_chunks"};
const Names kTbAttrs = {"id", "send", "recv", "chan"};
const Names kStepAttrs = {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"};

// Legacy dialect (msccl_xml.py module docstring).
const Names kLegacyOptionalAlgo = {"proto", "outofplace", "minBytes", "maxBytes"};
const Names kLegacyIgnoredAlgo = {"redop", "nthreads"};
const Names kLegacyIgnoredTb = {"rtype", "stype"};
constexpr const char* kLegacyDefaultProto = "Simple";
constexpr int64_t kLegacyDefaultMinBytes = 0;
constexpr int64_t kLegacyDefaultMaxBytes = int64_t{1} << 27;

const Names kProtocols = {"Simple", "LL", "LL128"};
const Names kCollectives = {"allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce"};
const Names kStepTypes = {"s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop"};  // StepType order
const Names kBuffers = {"i", "o", "s"};                                                // Buffer order
const Names kRedops = {"sum", "prod", "max", "min", "nop"};
const Names kConnectionTypes = {"p2p", "shm", "nic"};
// Collectives the executor runs but mlopt does not model: refused with MLOPT_ERR_UNSUPPORTED.
const Names kUnsupportedCollectives = {"send", "recv", "gather", "scatter", "alltoallv"};
// The parser of the executor (and RCCL's) keeps the first 16 attributes of an element (MSCCL_MAX_ATTR_COUNT).
constexpr size_t kMaxAttributes = 16;

// The one child element each level reads ("" for <step>: none); any other known element there is refused,
// unknown ones are skipped with their content, as the executor's parser does.
const char* child_element(const std::string& tag) {
    if (tag == "algo") return "gpu";
    if (tag == "gpu") return "tb";
    if (tag == "tb") return "step";
    return "";
}

bool is_msccl_element(const std::string& tag) {
    return tag == "algo" || tag == "gpu" || tag == "tb" || tag == "step";
}

bool contains(const Names& names, std::string_view name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

std::string join(const Names& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + std::string(names[i]);
    return out;
}

// -?[0-9]+ exactly (the Python loader's _INT).
bool is_plain_integer(std::string_view raw) {
    size_t i = raw.size() > 0 && raw[0] == '-' ? 1 : 0;
    if (i == raw.size()) return false;
    for (; i < raw.size(); ++i)
        if (raw[i] < '0' || raw[i] > '9') return false;
    return true;
}

// What Python's int(raw) prints for a plain integer of any size: no leading zeros, no "-0".
std::string canonical_integer(std::string_view raw) {
    const bool negative = raw[0] == '-';
    std::string_view digits = raw.substr(negative ? 1 : 0);
    while (digits.size() > 1 && digits[0] == '0') digits.remove_prefix(1);
    if (digits == "0") return "0";
    return (negative ? "-" : "") + std::string(digits);
}

// "tb[@id=3]" when the key attribute is an integer, else the 1-based position among its siblings: "tb[2]".
std::string label(const XmlElement& e, const char* key, size_t position) {
    const XmlAttribute* a = e.attribute(key);
    if (a && is_plain_integer(a->value)) return e.tag + "[@" + key + "=" + canonical_integer(a->value) + "]";
    return e.tag + "[" + std::to_string(position + 1) + "]";
}

// At most the first 8 of the ids in [0, n) missing from `present` (distinct, all in [0, n)), and how many.
std::pair<std::vector<int64_t>, int64_t> missing_ids(std::vector<int32_t> present, int64_t n) {
    std::sort(present.begin(), present.end());
    std::vector<int64_t> shown;
    int64_t expected = 0;
    for (size_t i = 0; i <= present.size() && shown.size() < 8; ++i) {
        const int64_t next = i < present.size() ? present[i] : n;
        for (; expected < next && shown.size() < 8; ++expected) shown.push_back(expected);
        expected = next + 1;
    }
    return {shown, n - static_cast<int64_t>(present.size())};
}

std::string ids_text(const std::pair<std::vector<int64_t>, int64_t>& missing) {
    std::string out;
    for (size_t i = 0; i < missing.first.size(); ++i) out += (i ? ", " : "") + std::to_string(missing.first[i]);
    if (missing.second > 8) out += " (and " + std::to_string(missing.second - 8) + " more)";
    return out;
}

// An element with its XPath-like location ("algo/gpu[@id=3]/tb[@id=1]").
struct Node {
    const XmlElement& e;
    std::string path;
};

class Reader {
public:
    Reader(const XmlDocument& doc, ProgramSource& source, MscclDialect dialect)
        : doc_(doc), source_(source), dialect_(dialect) {}

    Program read() {
        check_no_text();
        const XmlElement& root_element = doc_.root();
        const Node root{root_element, root_element.tag};
        if (dialect_ == MscclDialect::automatic) dialect_ = detect_msccl_dialect(root_element);
        if (root.e.tag != "algo") error(root, nullptr, "root element is <" + root.e.tag + ">, expected <algo>");

        if (executor()) {
            check_attrs(root, kAlgoAttrs);
        } else {
            Names required;
            for (auto name : kAlgoAttrs)
                if (!contains(kLegacyOptionalAlgo, name)) required.push_back(name);
            Names optional = kLegacyOptionalAlgo;
            optional.insert(optional.end(), kLegacyIgnoredAlgo.begin(), kLegacyIgnoredAlgo.end());
            check_attrs(root, required, optional);
        }

        Program p;
        p.name = value(root, "name");
        p.proto = has(root, "proto") ? enum_attr(root, "proto", kProtocols, "protocol") : kLegacyDefaultProto;
        p.nchannels = int32_attr(root, "nchannels", 1);
        p.nchunksperloop = int32_attr(root, "nchunksperloop", 1);
        p.ngpus = int32_attr(root, "ngpus", 1);
        p.coll = read_coll(root);
        p.inplace = flag_attr(root, "inplace");
        p.outofplace = has(root, "outofplace") ? flag_attr(root, "outofplace") : !p.inplace;
        p.min_bytes = has(root, "minBytes") ? int64_attr(root, "minBytes", 0) : kLegacyDefaultMinBytes;
        p.max_bytes = has(root, "maxBytes") ? int64_attr(root, "maxBytes", 0) : kLegacyDefaultMaxBytes;
        if (!executor() && has(root, "redop")) enum_attr(root, "redop", kRedops, "reduction operator");
        if (!executor() && has(root, "nthreads")) int32_attr(root, "nthreads", 0);

        read_gpus(root, p);
        source_.algo = &root_element;
        return p;
    }

private:
    bool executor() const { return dialect_ == MscclDialect::executor; }

    std::string read_coll(const Node& root) const {
        const std::string& coll = value(root, "coll");
        if (!executor() && coll == "reduce_scatter") return "reducescatter";
        if (coll == "reduce_scatter")
            error(root, "coll", "'reduce_scatter' is the legacy spelling; the executor dialect wants 'reducescatter'");
        if (contains(kUnsupportedCollectives, coll))
            error(root, "coll", "mlopt does not support the collective " + quoted(coll) +
                                    " (the MSCCL executor runs it; mlopt models " + join(kCollectives) + ")",
                  MLOPT_ERR_UNSUPPORTED);
        return enum_attr(root, "coll", kCollectives, "collective");
    }
    const char* dialect_name() const { return executor() ? "executor" : "legacy"; }

    // "<file>: <path>@<attr> (line L): <what>", positioned at the attribute (or the element without one).
    [[noreturn]] void error(const Node& node, const char* attr, const std::string& what,
                            mlopt_status status = MLOPT_ERR_SCHEMA) const {
        const XmlAttribute* a = attr ? node.e.attribute(attr) : nullptr;
        const Position at = a ? a->at : node.e.at;
        const std::string location = node.path + (attr ? std::string("@") + attr : "") + " " +
                                     describe_position(at, /*with_column=*/false);
        throw LoadError(status, source_.file + ": " + location + ": " + what, at);
    }

    [[noreturn]] void structure_error(const Node& node, const char* attr, const std::string& what) const {
        error(node, attr, what, MLOPT_ERR_SEMANTIC);
    }

    // The Python loader rejects any non-whitespace character data while parsing, as malformed XML; the first one
    // in the document is reported.
    void check_no_text() const {
        const XmlElement* first = nullptr;
        for (const auto& e : doc_.elements)
            if (e.text_at.line > 0 && (!first || e.text_at.offset < first->text_at.offset)) first = &e;
        if (!first) return;
        // Python shows the stripped text of the chunk; chunks are not kept apart here, so this is the element's
        // text, stripped.
        std::string_view text = first->text;
        text.remove_prefix(text.find_first_not_of(" \t\r\n"));
        text.remove_suffix(text.size() - 1 - text.find_last_not_of(" \t\r\n"));
        throw LoadError(MLOPT_ERR_PARSE,
                        source_.file + ": " + describe_position(first->text_at) + ": malformed XML: unexpected text " +
                            quoted(text, 20),
                        first->text_at);
    }

    static bool has(const Node& node, const char* name) { return node.e.attribute(name) != nullptr; }
    static const std::string& value(const Node& node, const char* name) { return node.e.attribute(name)->value; }

    // Required attributes among the first kMaxAttributes (all the executor keeps); others that are neither
    // required nor optional are ignored, as the executor looks attributes up by name.
    void check_attrs(const Node& node, const Names& required, const Names& optional = {}) const {
        (void)optional;  // read where they matter; listed for the reader
        for (auto name : required) {
            const std::string attr(name);  // named in the location
            const auto& all = node.e.attributes;
            const size_t kept = std::min(all.size(), kMaxAttributes);
            const auto at = std::find_if(all.begin(), all.end(), [&](const XmlAttribute& a) { return a.name == attr; });
            if (at == all.end())
                error(node, attr.c_str(), "missing attribute '" + attr + "' (" + dialect_name() + " dialect)");
            if (static_cast<size_t>(at - all.begin()) >= kept)
                error(node, attr.c_str(), "attribute '" + attr + "' comes after the first " +
                                              std::to_string(kMaxAttributes) + " attributes of <" + node.e.tag +
                                              ">, the only ones the executor reads");
        }
    }

    // A plain decimal integer read as the executor does: bits 32 must fit an int (strtol into an int), bits 64
    // saturate to int64 (strtoll); then at least `minimum`.
    int64_t int_attr(const Node& node, const char* name, std::optional<int64_t> minimum, int bits) const {
        const std::string& raw = value(node, name);
        if (!is_plain_integer(raw)) error(node, name, quoted(raw) + " is not an integer");
        int64_t v = 0;
        const auto r = std::from_chars(raw.data(), raw.data() + raw.size(), v);
        const bool in_int64 = r.ec == std::errc() && r.ptr == raw.data() + raw.size();
        if (bits == 64 && !in_int64)
            v = raw[0] == '-' ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
        if (bits == 32 && (!in_int64 || v > std::numeric_limits<int32_t>::max() ||
                           v < std::numeric_limits<int32_t>::min()))
            error(node, name, canonical_integer(raw) + " is out of range for a 32-bit integer (the executor reads it "
                                                       "as an int)");
        if (minimum && v < *minimum)
            error(node, name, std::to_string(v) + " is below the minimum " + std::to_string(*minimum));
        return v;
    }

    int32_t int32_attr(const Node& node, const char* name, std::optional<int64_t> minimum = std::nullopt) const {
        return static_cast<int32_t>(int_attr(node, name, minimum, 32));
    }

    int64_t int64_attr(const Node& node, const char* name, std::optional<int64_t> minimum) const {
        return int_attr(node, name, minimum, 64);
    }

    bool flag_attr(const Node& node, const char* name) const {
        const std::string& raw = value(node, name);
        if (raw != "0" && raw != "1") error(node, name, quoted(raw) + " must be 0 or 1");
        return raw == "1";
    }

    // The value, which must be one of `allowed`.
    std::string enum_attr(const Node& node, const char* name, const Names& allowed, const char* what) const {
        const std::string& raw = value(node, name);
        if (!contains(allowed, raw))
            error(node, name, std::string("unknown ") + what + " " + quoted(raw) + " (expected one of " +
                                  join(allowed) + ")");
        return raw;
    }

    size_t enum_index(const Node& node, const char* name, const Names& allowed, const char* what) const {
        const std::string raw = enum_attr(node, name, allowed, what);
        return static_cast<size_t>(std::find(allowed.begin(), allowed.end(), raw) - allowed.begin());
    }

    // The children the executor reads (child_element), each labelled by `key`. Unknown elements are skipped
    // with their content, as the executor does; a known element in the wrong place is an error (the executor
    // would drop it silently), and so is any element inside <step> (the executor's parser crashes there).
    std::vector<Node> children(const Node& parent, const char* key) const {
        const std::string tag = child_element(parent.e.tag);
        std::vector<Node> out;
        for (size_t i = 0; i < parent.e.children.size(); ++i) {
            const XmlElement& child = doc_.child(parent.e, i);
            const Node node{child, parent.path + "/" + label(child, key, i)};
            if (!tag.empty() && child.tag == tag) {
                out.push_back(node);
            } else if (tag.empty()) {
                error(node, nullptr, "unexpected element <" + child.tag + "> inside <" + parent.e.tag +
                                         "> (the executor cannot read elements inside <" + parent.e.tag + ">)");
            } else if (is_msccl_element(child.tag)) {
                error(node, nullptr, "unexpected element <" + child.tag + "> inside <" + parent.e.tag +
                                         "> (expected <" + tag + ">; the executor would skip it)");
            }
        }
        return out;
    }

    struct ParsedTb {
        Threadblock tb;
        const XmlElement* element;
        std::vector<const XmlElement*> steps;
    };

    void read_gpus(const Node& root, Program& p) {
        std::vector<Gpu> gpus;
        std::vector<const XmlElement*> elements;
        std::vector<std::vector<ParsedTb>> tbs;
        std::set<int32_t> seen;
        for (const Node& node : children(root, "id")) {
            std::vector<ParsedTb> gpu_tbs;
            Gpu gpu = read_gpu(node, p, gpu_tbs);
            if (!seen.insert(gpu.id).second)
                structure_error(node, "id", "duplicate gpu id " + std::to_string(gpu.id));
            gpus.push_back(std::move(gpu));
            elements.push_back(&node.e);
            tbs.push_back(std::move(gpu_tbs));
        }
        if (static_cast<int64_t>(gpus.size()) != p.ngpus) {
            std::vector<int32_t> ids;
            for (const auto& g : gpus) ids.push_back(g.id);
            structure_error(root, "ngpus", "ngpus=" + std::to_string(p.ngpus) + " but there is no <gpu> with id " +
                                               ids_text(missing_ids(ids, p.ngpus)));
        }
        // Ids are now exactly 0..ngpus-1: put every gpu (and where it came from) at its id.
        p.gpus.resize(gpus.size());
        source_.gpus.assign(gpus.size(), nullptr);
        source_.tbs.assign(gpus.size(), {});
        source_.steps.assign(gpus.size(), {});
        for (size_t i = 0; i < gpus.size(); ++i) {
            const auto g = static_cast<size_t>(gpus[i].id);
            source_.gpus[g] = elements[i];
            for (auto& parsed : tbs[i]) {
                gpus[i].tbs.push_back(std::move(parsed.tb));
                source_.tbs[g].push_back(parsed.element);
                source_.steps[g].push_back(std::move(parsed.steps));
            }
            p.gpus[g] = std::move(gpus[i]);
        }
    }

    Gpu read_gpu(const Node& node, const Program& p, std::vector<ParsedTb>& parsed) {
        check_attrs(node, kGpuAttrs);
        Gpu gpu;
        gpu.id = int32_attr(node, "id", 0);
        if (gpu.id >= p.ngpus)
            structure_error(node, "id", "gpu id " + std::to_string(gpu.id) + " out of range 0.." +
                                            std::to_string(p.ngpus - 1) + " (ngpus=" + std::to_string(p.ngpus) + ")");
        gpu.i_chunks = int32_attr(node, "i_chunks", 0);
        gpu.o_chunks = int32_attr(node, "o_chunks", 0);
        gpu.s_chunks = int32_attr(node, "s_chunks", 0);
        std::set<int32_t> seen;
        for (const Node& tnode : children(node, "id")) {
            ParsedTb tb = read_tb(tnode, gpu.id, p);
            if (!seen.insert(tb.tb.id).second)
                structure_error(tnode, "id", "duplicate tb id " + std::to_string(tb.tb.id) + " on gpu " +
                                                 std::to_string(gpu.id));
            parsed.push_back(std::move(tb));
        }
        std::vector<int32_t> ids;
        for (const auto& t : parsed) ids.push_back(t.tb.id);
        const auto n = static_cast<int64_t>(parsed.size());
        if (std::any_of(ids.begin(), ids.end(), [n](int32_t id) { return id >= n; }))
            structure_error(node, nullptr, "tb ids must be 0.." + std::to_string(n - 1) + "; missing " +
                                               ids_text(missing_ids(in_range(ids, n), n)));
        std::sort(parsed.begin(), parsed.end(), [](const ParsedTb& a, const ParsedTb& b) { return a.tb.id < b.tb.id; });
        return gpu;
    }

    static std::vector<int32_t> in_range(const std::vector<int32_t>& ids, int64_t n) {
        std::vector<int32_t> out;
        for (int32_t id : ids)
            if (id < n) out.push_back(id);
        return out;
    }

    ParsedTb read_tb(const Node& node, int32_t gid, const Program& p) {
        check_attrs(node, kTbAttrs, executor() ? Names{} : kLegacyIgnoredTb);
        ParsedTb parsed;
        parsed.element = &node.e;
        Threadblock& tb = parsed.tb;
        tb.id = int32_attr(node, "id", 0);
        for (const char* attr : {"send", "recv"}) {
            const int32_t peer = int32_attr(node, attr, -1);
            if (peer >= p.ngpus)
                structure_error(node, attr, "peer " + std::to_string(peer) + " out of range (-1 or 0.." +
                                                std::to_string(p.ngpus - 1) + ")");
            if (peer == gid) structure_error(node, attr, "peer " + std::to_string(peer) + " is the gpu itself");
            (attr[0] == 's' ? tb.send : tb.recv) = peer;
        }
        tb.chan = int32_attr(node, "chan", 0);
        if (tb.chan >= p.nchannels)
            structure_error(node, "chan", "channel " + std::to_string(tb.chan) + " is not below nchannels=" +
                                              std::to_string(p.nchannels));
        for (auto attr : kLegacyIgnoredTb) {
            const std::string name(attr);
            if (!executor() && has(node, name.c_str()))
                enum_attr(node, name.c_str(), kConnectionTypes, "connection type");
        }
        const std::vector<Node> step_nodes = children(node, "s");
        for (size_t position = 0; position < step_nodes.size(); ++position) {
            tb.steps.push_back(read_step(step_nodes[position], position));
            parsed.steps.push_back(&step_nodes[position].e);
        }
        return parsed;
    }

    Step read_step(const Node& node, size_t position) const {
        check_attrs(node, kStepAttrs);
        children(node, "");  // none allowed
        const int64_t s = int32_attr(node, "s");
        if (s != static_cast<int64_t>(position))
            structure_error(node, "s", "s=" + std::to_string(s) + " but this is step " + std::to_string(position) +
                                           " of its threadblock (steps are numbered by position)");
        Step st;
        st.s = static_cast<int32_t>(s);
        st.type = static_cast<StepType>(enum_index(node, "type", kStepTypes, "step type"));
        st.srcbuf = static_cast<Buffer>(enum_index(node, "srcbuf", kBuffers, "buffer"));
        st.srcoff = int32_attr(node, "srcoff", -1);
        st.dstbuf = static_cast<Buffer>(enum_index(node, "dstbuf", kBuffers, "buffer"));
        st.dstoff = int32_attr(node, "dstoff", -1);
        st.cnt = int32_attr(node, "cnt", 0);
        st.depid = int32_attr(node, "depid", -1);
        st.deps = int32_attr(node, "deps", -1);
        st.hasdep = flag_attr(node, "hasdep");
        return st;
    }

    const XmlDocument& doc_;
    ProgramSource& source_;
    MscclDialect dialect_;
};

}  // namespace

MscclDialect detect_msccl_dialect(const XmlElement& root) {
    for (const char* name : {"outofplace", "minBytes", "maxBytes"})
        if (!root.attribute(name)) return MscclDialect::legacy;
    const XmlAttribute* coll = root.attribute("coll");
    if (coll && coll->value == "reduce_scatter") return MscclDialect::legacy;
    for (auto name : kLegacyIgnoredAlgo)
        if (root.attribute(name)) return MscclDialect::legacy;
    return MscclDialect::executor;
}

Program read_msccl_program(const XmlDocument& doc, ProgramSource& source, MscclDialect dialect) {
    return Reader(doc, source, dialect).read();
}

}  // namespace mlopt

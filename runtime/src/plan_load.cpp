// The plan functions of the C ABI: reading a file, telling XML from JSON, checking a JSON plan envelope
// (mlopt/formats/plan.py, document.py, schemas/plan.schema.json), loading and validating an MSCCL-EF program,
// and the queries on a loaded plan. Every entry point catches everything: loaders throw LoadError, which
// becomes the mlopt_error; std::bad_alloc becomes MLOPT_ERR_NO_MEMORY.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>

#include "handles.hpp"
#include "json.hpp"
#include "msccl_xml.hpp"
#include "source.hpp"
#include "validate.hpp"
#include "xml.hpp"

namespace mlopt {
namespace {

constexpr const char* kPlanFormat = "mlopt.plan";
// The newest minor version of the envelope this runtime knows: fields unknown to it are errors in files of
// this minor or older, and tolerated in newer ones (which may only add optional fields: document.py).
constexpr int64_t kKnownPlanMinor = 0;

// ---------------------------------------------------------------------------------------------------- envelope

class EnvelopeChecker {
public:
    EnvelopeChecker(const JsonValue& doc, const std::string& source) : doc_(doc), source_(source) {}

    void check() const {
        if (doc_.type != JsonValue::Type::object)
            fail("$", doc_, std::string("expected a JSON object (") + kPlanFormat + "), found " + a(doc_.type));
        check_header();
        const bool strict = minor_version() <= kKnownPlanMinor;
        check_object("$", doc_, {"format", "schema_version", "kind", "provenance", "payload"}, {}, strict);
        const JsonValue& kind = *doc_.find("kind");
        expect_type("$.kind", kind, JsonValue::Type::string);
        if (kind.string.empty()) fail("$.kind", kind, "must not be empty");
        check_provenance(*doc_.find("provenance"), strict);
        expect_type("$.payload", *doc_.find("payload"), JsonValue::Type::object);
    }

private:
    static std::string a(JsonValue::Type type) {
        const std::string name = json_type_name(type);
        return (type == JsonValue::Type::array || type == JsonValue::Type::object ? "an " : "a ") + name;
    }

    [[noreturn]] void fail(const std::string& path, const JsonValue& at, const std::string& what) const {
        throw LoadError(MLOPT_ERR_SCHEMA,
                        source_ + ": " + path + " " + describe_position(at.at, /*with_column=*/false) + ": " + what,
                        at.at);
    }

    // Format first, then the version, so that a file of another kind or a newer major says so plainly.
    void check_header() const {
        const JsonValue* format = doc_.find("format");
        if (!format || format->type != JsonValue::Type::string || format->string != kPlanFormat) {
            std::string found = "no `format` field";
            if (format) found = format->type == JsonValue::Type::string ? "format " + quoted(format->string)
                                                                          : "format " + a(format->type);
            fail("$.format", format ? *format : doc_, std::string("expected '") + kPlanFormat + "', found " + found);
        }
        const JsonValue* version = doc_.find("schema_version");
        if (!version || version->type != JsonValue::Type::string)
            fail("$.schema_version", version ? *version : doc_, "missing or not a string like \"1.0\"");
        const std::string& v = version->string;
        const size_t dot = v.find('.');
        const auto all_digits = [](std::string_view s) {
            return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
        };
        if (dot == std::string::npos || !all_digits(std::string_view(v).substr(0, dot)) ||
            !all_digits(std::string_view(v).substr(dot + 1)))
            fail("$.schema_version", *version, quoted(v) + " is not of the form MAJOR.MINOR");
        std::string_view major = std::string_view(v).substr(0, dot);
        while (major.size() > 1 && major[0] == '0') major.remove_prefix(1);
        if (major != std::to_string(MLOPT_PLAN_SCHEMA_MAJOR)) {
            const bool newer = major.size() > 1 || major[0] > '0' + MLOPT_PLAN_SCHEMA_MAJOR;
            fail("$.schema_version", *version,
                 std::string(kPlanFormat) + " major version " + std::string(major) +
                     " is not supported (this runtime reads " + std::to_string(MLOPT_PLAN_SCHEMA_MAJOR) + ".x); " +
                     (newer ? "upgrade the mlopt runtime to read it" : "regenerate it with this mlopt"));
        }
        if (dot != std::to_string(MLOPT_PLAN_SCHEMA_MAJOR).size())  // "01.0": the schema's pattern is ^1\.[0-9]+$
            fail("$.schema_version", *version, quoted(v) + " does not match '^1\\.[0-9]+$'");
    }

    int64_t minor_version() const {
        const std::string& v = doc_.find("schema_version")->string;
        std::string_view minor = std::string_view(v).substr(v.find('.') + 1);
        while (minor.size() > 1 && minor[0] == '0') minor.remove_prefix(1);
        if (minor.size() > 9) return std::numeric_limits<int64_t>::max();
        return std::stoll(std::string(minor));
    }

    void expect_type(const std::string& path, const JsonValue& v, JsonValue::Type type) const {
        if (v.type != type) fail(path, v, "expected " + a(type) + ", found " + a(v.type));
    }

    void expect_number_or_null(const std::string& path, const JsonValue& v, bool non_negative) const {
        if (v.type == JsonValue::Type::null) return;
        if (v.type != JsonValue::Type::number) fail(path, v, "expected a number or null, found " + a(v.type));
        if (non_negative && v.number < 0) fail(path, v, "must be >= 0, found " + std::to_string(v.number));
    }

    // Required members present (reported in `required` order), and no unknown ones when `strict`.
    void check_object(const std::string& path, const JsonValue& v, std::initializer_list<const char*> required,
                      std::initializer_list<const char*> optional, bool strict) const {
        expect_type(path, v, JsonValue::Type::object);
        for (const char* name : required)
            if (!v.find(name)) fail(path + "." + name, v, "missing required field");
        if (!strict) return;
        for (const auto& m : v.members) {
            const auto known = [&](std::initializer_list<const char*> names) {
                return std::any_of(names.begin(), names.end(), [&](const char* n) { return m.key == n; });
            };
            if (!known(required) && !known(optional)) {
                Position at = m.key_at;
                throw LoadError(MLOPT_ERR_SCHEMA,
                                source_ + ": " + path + " " + describe_position(at, false) + ": unknown field " +
                                    quoted(m.key),
                                at);
            }
        }
    }

    static bool is_sha256_hex(const std::string& s) {
        return s.size() == 64 &&
               std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    }

    void check_provenance(const JsonValue& prov, bool strict) const {
        const std::string p = "$.provenance";
        check_object(p, prov,
                     {"mlopt_version", "inputs", "solver", "status", "objective", "best_bound", "gap", "options"},
                     {"wall_time_s"}, strict);
        expect_type(p + ".mlopt_version", *prov.find("mlopt_version"), JsonValue::Type::string);
        const JsonValue& inputs = *prov.find("inputs");
        expect_type(p + ".inputs", inputs, JsonValue::Type::object);
        for (const auto& m : inputs.members) {
            const std::string path = p + ".inputs." + m.key;
            expect_type(path, m.value, JsonValue::Type::string);
            if (!is_sha256_hex(m.value.string)) fail(path, m.value, quoted(m.value.string) + " is not a sha256 hex digest");
        }
        const JsonValue& solver = *prov.find("solver");
        check_object(p + ".solver", solver, {"name", "version"}, {}, strict);
        expect_type(p + ".solver.name", *solver.find("name"), JsonValue::Type::string);
        expect_type(p + ".solver.version", *solver.find("version"), JsonValue::Type::string);
        const JsonValue& status = *prov.find("status");
        if (status.type != JsonValue::Type::string ||
            (status.string != "optimal" && status.string != "feasible" && status.string != "heuristic"))
            fail(p + ".status", status,
                 (status.type == JsonValue::Type::string ? quoted(status.string) : a(status.type)) +
                     " is not one of: optimal, feasible, heuristic");
        expect_number_or_null(p + ".objective", *prov.find("objective"), false);
        expect_number_or_null(p + ".best_bound", *prov.find("best_bound"), false);
        expect_number_or_null(p + ".gap", *prov.find("gap"), true);
        if (const JsonValue* wall = prov.find("wall_time_s")) {
            expect_type(p + ".wall_time_s", *wall, JsonValue::Type::number);
            if (wall->number < 0) fail(p + ".wall_time_s", *wall, "must be >= 0");
        }
        expect_type(p + ".options", *prov.find("options"), JsonValue::Type::object);
    }

    const JsonValue& doc_;
    const std::string& source_;
};

// ---------------------------------------------------------------------------------------------------- loading

void load_json_plan(std::string_view text, mlopt_plan_s& plan) {
    const JsonValue doc = parse_json(text, plan.source);
    EnvelopeChecker(doc, plan.source).check();
    plan.kind = MLOPT_PLAN_JSON;
    plan.format = doc.find("format")->string;
    plan.schema_version = doc.find("schema_version")->string;
    plan.planner = doc.find("kind")->string;
    plan.text = std::string(text);
}

void load_xml_plan(std::string_view text, mlopt_plan_s& plan) {
    const XmlDocument doc = parse_xml(text, plan.source);
    ProgramSource where;
    where.file = plan.source;
    Program program = read_msccl_program(doc, where);
    validate_program(program, where);
    plan.kind = MLOPT_PLAN_MSCCL_XML;
    plan.format = "msccl-ef";
    plan.schema_version = "";
    plan.planner = "collective";
    plan.program = effective_program(program, where);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The kind is told by the first byte that is not whitespace (after a UTF-8 byte order mark): '<' XML, '{' JSON.
std::unique_ptr<mlopt_plan_s> load_plan(std::string_view text, const std::string& source) {
    auto plan = std::make_unique<mlopt_plan_s>();
    plan->source = source;
    size_t first = text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
    while (first < text.size() && is_space(text[first])) ++first;
    if (first == text.size()) {
        const Position at = LineIndex(text).at(first);
        throw LoadError(MLOPT_ERR_PARSE, source + ": " + describe_position(at) +
                                             ": empty input, expected an MSCCL-EF XML or mlopt JSON plan", at);
    }
    if (text[first] == '<') {
        load_xml_plan(text, *plan);
    } else if (text[first] == '{') {
        load_json_plan(text, *plan);
    } else if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
               static_cast<unsigned char>(text[1]) == 0x8b) {
        throw LoadError(MLOPT_ERR_UNSUPPORTED,
                        source + ": gzip-compressed plans are not supported by the runtime; gunzip it first");
    } else {
        const Position at = LineIndex(text).at(first);
        throw LoadError(MLOPT_ERR_PARSE, source + ": " + describe_position(at) +
                                             ": not an MSCCL-EF XML or mlopt JSON plan: starts with " +
                                             quoted(text.substr(first), 8) + " (expected '<' or '{')",
                        at);
    }
    return plan;
}

std::string read_file(const char* path) {
    errno = 0;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path, "rb"), &std::fclose);
    if (!file)
        throw LoadError(MLOPT_ERR_IO, std::string(path) + ": cannot open: " + std::generic_category().message(errno));
    std::string data;
    char buffer[1 << 16];
    for (;;) {
        const size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
        data.append(buffer, n);
        if (n < sizeof buffer) {
            if (std::ferror(file.get()))
                throw LoadError(MLOPT_ERR_IO,
                                std::string(path) + ": cannot read: " + std::generic_category().message(errno));
            return data;
        }
    }
}

// Runs `body`; any exception becomes the status and *err (nothing escapes into C).
template <typename Body>
mlopt_status guarded(mlopt_error* err, Body&& body) noexcept {
    try {
        try {
            return body();
        } catch (const LoadError& e) {
            return fail(err, e.status(), e.message(), e.at());
        } catch (const std::bad_alloc&) {
            return fail(err, MLOPT_ERR_NO_MEMORY, "out of memory");
        } catch (const std::exception& e) {
            return fail(err, MLOPT_ERR_INTERNAL, std::string("internal error: ") + e.what());
        } catch (...) {
            return fail(err, MLOPT_ERR_INTERNAL, "internal error: unknown exception");
        }
    } catch (...) {
        // Building the report itself failed: that can only be an allocation.
        if (err) *err = nullptr;
        return MLOPT_ERR_NO_MEMORY;
    }
}

mlopt_status require_program(const mlopt_plan_s* plan, const char* function, mlopt_error* err) {
    if (!plan) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, std::string(function) + ": plan is NULL");
    if (plan->kind != MLOPT_PLAN_MSCCL_XML)
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    plan->source + ": " + function + ": a JSON " + plan->planner +
                        " plan has no MSCCL-EF program (load the XML)");
    return MLOPT_OK;
}

}  // namespace
}  // namespace mlopt

using mlopt::fail;
using mlopt::guarded;

namespace mlopt {

// The root of a broadcast (the only rank with no receiving step of cnt > 0) or a reduce (no sending step),
// else 0, as mlopt/sim/symbolic.py `_root` defines it; -1 for collectives without a root.
int32_t collective_root(const Program& p) {
    const bool reduce = p.coll == "reduce";
    if (!reduce && p.coll != "broadcast") return -1;
    std::vector<int32_t> candidates;
    for (const auto& gpu : p.gpus) {
        bool moves = false;
        for (const auto& tb : gpu.tbs)
            for (const auto& st : tb.steps)
                moves = moves || (st.cnt > 0 && (reduce ? step_sends(st.type) : step_receives(st.type)));
        if (!moves) candidates.push_back(gpu.id);
    }
    return candidates.size() == 1 ? candidates.front() : 0;
}

}  // namespace mlopt

extern "C" {

MLOPT_API mlopt_status mlopt_plan_load(const char* path, mlopt_plan* out, mlopt_error* err) {
    if (out) *out = nullptr;
    return guarded(err, [&] {
        if (!path) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_plan_load: path is NULL");
        if (!out) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_plan_load: out is NULL");
        const std::string text = mlopt::read_file(path);
        *out = mlopt::load_plan(text, path).release();
        return mlopt::succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_plan_load_memory(const char* data, size_t size, const char* name, mlopt_plan* out,
                                              mlopt_error* err) {
    if (out) *out = nullptr;
    return guarded(err, [&] {
        if (!data) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_plan_load_memory: data is NULL");
        if (!out) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_plan_load_memory: out is NULL");
        *out = mlopt::load_plan(std::string_view(data, size), name ? name : "<memory>").release();
        return mlopt::succeed(err);
    });
}

MLOPT_API void mlopt_plan_free(mlopt_plan plan) { delete plan; }

MLOPT_API mlopt_plan_kind mlopt_plan_get_kind(const mlopt_plan_s* plan) {
    return plan ? plan->kind : MLOPT_PLAN_NONE;
}

MLOPT_API const char* mlopt_plan_format(const mlopt_plan_s* plan) { return plan ? plan->format.c_str() : ""; }

MLOPT_API const char* mlopt_plan_schema_version(const mlopt_plan_s* plan) {
    return plan ? plan->schema_version.c_str() : "";
}

MLOPT_API const char* mlopt_plan_planner(const mlopt_plan_s* plan) { return plan ? plan->planner.c_str() : ""; }

MLOPT_API mlopt_status mlopt_plan_program_info(const mlopt_plan_s* plan, mlopt_program_info* out, mlopt_error* err) {
    return guarded(err, [&] {
        const mlopt_status status = mlopt::require_program(plan, "mlopt_plan_program_info", err);
        if (status != MLOPT_OK) return status;
        if (!out) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_plan_program_info: out is NULL");
        const mlopt::Program& p = plan->program;
        mlopt_program_info info{};
        info.name = p.name.c_str();
        info.coll = p.coll.c_str();
        info.proto = p.proto.c_str();
        info.ngpus = p.ngpus;
        info.nchannels = p.nchannels;
        info.nchunksperloop = p.nchunksperloop;
        info.inplace = p.inplace ? 1 : 0;
        info.outofplace = p.outofplace ? 1 : 0;
        info.min_bytes = p.min_bytes;
        info.max_bytes = p.max_bytes;
        for (const auto& gpu : p.gpus) {
            info.threadblocks += static_cast<int32_t>(gpu.tbs.size());
            for (const auto& tb : gpu.tbs) info.steps += static_cast<int64_t>(tb.steps.size());
            info.s_chunks = std::max(info.s_chunks, gpu.s_chunks);
        }
        // validate_program made i_chunks/o_chunks the same on every gpu, and ngpus >= 1.
        info.i_chunks = p.gpus.front().i_chunks;
        info.o_chunks = p.gpus.front().o_chunks;
        info.root = mlopt::collective_root(p);
        if (!mlopt::copy_sized(info, out)) {
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        "mlopt_plan_program_info: out->struct_size=" + std::to_string(out->struct_size) +
                            " (set it to sizeof(mlopt_program_info))");
        }
        return mlopt::succeed(err);
    });
}

MLOPT_API mlopt_status mlopt_output_count(const mlopt_plan_s* plan, size_t count, size_t* out_count,
                                          mlopt_error* err) {
    return guarded(err, [&] {
        const mlopt_status status = mlopt::require_program(plan, "mlopt_output_count", err);
        if (status != MLOPT_OK) return status;
        if (!out_count) return fail(err, MLOPT_ERR_INVALID_ARGUMENT, "mlopt_output_count: out_count is NULL");
        const mlopt::Program& p = plan->program;
        const auto i_chunks = static_cast<size_t>(p.gpus.front().i_chunks);
        const auto o_chunks = static_cast<size_t>(p.gpus.front().o_chunks);
        if (i_chunks == 0 || count % i_chunks != 0)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        plan->source + ": mlopt_output_count: count " + std::to_string(count) +
                            " is not a multiple of i_chunks=" + std::to_string(i_chunks) +
                            " (each rank's input is i_chunks chunks of equal size)");
        const size_t chunk = count / i_chunks;
        if (o_chunks != 0 && chunk > std::numeric_limits<size_t>::max() / o_chunks)
            return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                        plan->source + ": mlopt_output_count: count " + std::to_string(count) +
                            " gives an output count too large for size_t");
        *out_count = chunk * o_chunks;
        return mlopt::succeed(err);
    });
}

}  // extern "C"

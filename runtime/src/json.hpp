// A small, strict RFC 8259 JSON parser for plan envelopes.
//
// Strict where Python's json module is lenient, so that what the runtime accepts is a subset of what the
// Python tools accept: no NaN/Infinity, no trailing commas, no byte order mark, no lone surrogates in \u
// escapes, UTF-8 only, and no duplicate object keys (Python keeps the last; a plan never has any).
// Numbers are kept as a double and, when the value is integral and fits, as an exact int64 too.
// Every value records its position. Nesting is bounded by kMaxJsonDepth (the recursion depth of the parser).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "source.hpp"

namespace mlopt {

constexpr size_t kMaxJsonDepth = 256;

struct JsonMember;

struct JsonValue {
    enum class Type { null, boolean, number, string, array, object };

    Type type = Type::null;
    bool boolean = false;
    double number = 0.0;
    bool is_int64 = false;  // number is integral and exactly representable as int64 (then `integer` holds it)
    int64_t integer = 0;
    std::string string;              // decoded UTF-8
    std::vector<JsonValue> items;    // arrays
    std::vector<JsonMember> members; // objects, in document order, keys unique
    Position at;                     // of the value's first byte

    // NULL when this is not an object or has no such key.
    const JsonValue* find(std::string_view key) const;
    const JsonMember* find_member(std::string_view key) const;
};

struct JsonMember {
    std::string key;
    Position key_at;
    JsonValue value;
};

inline const JsonMember* JsonValue::find_member(std::string_view key) const {
    for (const auto& m : members)
        if (m.key == key) return &m;
    return nullptr;
}

inline const JsonValue* JsonValue::find(std::string_view key) const {
    const JsonMember* m = find_member(key);
    return m ? &m->value : nullptr;
}

// "object", "array", "string", "number", "true"/"false" as "boolean", "null".
const char* json_type_name(JsonValue::Type type);

// Parses one JSON text. `source` names the input in messages. Throws LoadError (MLOPT_ERR_PARSE) with a message
// "<source>: $: malformed JSON at line L column C: <what>" (the Python loader's wording).
JsonValue parse_json(std::string_view text, const std::string& source);

}  // namespace mlopt

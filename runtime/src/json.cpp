// The JSON parser behind json.hpp: recursive descent, recursion bounded by kMaxJsonDepth.
#include "json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <system_error>

namespace mlopt {

const char* json_type_name(JsonValue::Type type) {
    switch (type) {
        case JsonValue::Type::null: return "null";
        case JsonValue::Type::boolean: return "boolean";
        case JsonValue::Type::number: return "number";
        case JsonValue::Type::string: return "string";
        case JsonValue::Type::array: return "array";
        case JsonValue::Type::object: return "object";
    }
    return "value";
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Bytes of the well-formed UTF-8 sequence starting at text[i] (0: not one: bad lead or continuation bytes,
// overlong, surrogate, past U+10FFFF, truncated).
size_t utf8_sequence_length(std::string_view text, size_t i) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) return 1;
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
    else return 0;
    if (i + len > text.size()) return 0;
    for (size_t k = 1; k < len; ++k) {
        const auto b = static_cast<unsigned char>(text[i + k]);
        if ((b & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

// Roughly floor(log10(|x|)) of a well-formed, non-zero JSON number literal: negative for |x| < 1. Used only to
// tell overflow from underflow.
int64_t decimal_exponent(std::string_view literal) {
    size_t i = literal[0] == '-' ? 1 : 0;
    int64_t estimate = 0;
    if (literal[i] != '0') {
        const size_t digits_start = i;
        while (i < literal.size() && is_digit(literal[i])) ++i;
        estimate = static_cast<int64_t>(i - digits_start) - 1;
    } else {
        ++i;  // "0"
        int64_t zeros = 0;
        if (i < literal.size() && literal[i] == '.') {
            ++i;
            while (i < literal.size() && literal[i] == '0') ++i, ++zeros;
        }
        estimate = -(zeros + 1);
    }
    while (i < literal.size() && literal[i] != 'e' && literal[i] != 'E') ++i;
    if (i < literal.size()) {
        ++i;
        const bool negative = literal[i] == '-';
        if (literal[i] == '+' || literal[i] == '-') ++i;
        int64_t exponent = 0;
        for (; i < literal.size(); ++i) exponent = std::min<int64_t>(exponent * 10 + (literal[i] - '0'), 1000000000);
        estimate += negative ? -exponent : exponent;
    }
    return estimate;
}

class JsonParser {
public:
    JsonParser(std::string_view text, const std::string& source) : text_(text), source_(source), lines_(text) {}

    JsonValue parse() {
        if (text_.size() >= 3 && text_.compare(0, 3, "\xEF\xBB\xBF") == 0)
            fail(0, "unexpected UTF-8 byte order mark");  // as Python's json.loads
        skip_space();
        JsonValue value = parse_value(0);
        skip_space();
        if (pos_ < text_.size()) fail(pos_, "extra data after the JSON value");
        return value;
    }

private:
    [[noreturn]] void fail(size_t offset, const std::string& what) const {
        const Position at = lines_.at(offset);
        throw LoadError(MLOPT_ERR_PARSE,
                        source_ + ": $: malformed JSON at line " + std::to_string(at.line) + " column " +
                            std::to_string(at.column) + ": " + what,
                        at);
    }

    [[noreturn]] void fail_unexpected(const char* expected) const {
        if (pos_ >= text_.size()) fail(pos_, std::string("unexpected end of input, expected ") + expected);
        fail(pos_, std::string("expected ") + expected + ", found " + describe_byte(pos_));
    }

    std::string describe_byte(size_t offset) const {
        const auto c = static_cast<unsigned char>(text_[offset]);
        if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", c);
        return std::string("byte ") + hex;
    }

    void skip_space() {
        while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
    }

    bool consume(char c) {
        if (pos_ < text_.size() && text_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }

    JsonValue parse_value(size_t depth) {
        if (pos_ >= text_.size()) fail_unexpected("a value");
        JsonValue value;
        value.at = lines_.at(pos_);
        const char c = text_[pos_];
        if (c == '{' || c == '[') {
            if (depth >= kMaxJsonDepth) fail(pos_, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
            if (c == '{') parse_object(value, depth + 1);
            else parse_array(value, depth + 1);
        } else if (c == '"') {
            value.type = JsonValue::Type::string;
            value.string = parse_string();
        } else if (c == '-' || is_digit(c)) {
            parse_number(value);
        } else if (parse_literal("true")) {
            value.type = JsonValue::Type::boolean;
            value.boolean = true;
        } else if (parse_literal("false")) {
            value.type = JsonValue::Type::boolean;
        } else if (parse_literal("null")) {
            value.type = JsonValue::Type::null;
        } else {
            fail_unexpected("a value");
        }
        return value;
    }

    bool parse_literal(std::string_view word) {
        if (text_.size() - pos_ >= word.size() && text_.compare(pos_, word.size(), word) == 0) {
            pos_ += word.size();
            return true;
        }
        return false;
    }

    void parse_object(JsonValue& value, size_t depth) {
        value.type = JsonValue::Type::object;
        ++pos_;  // '{'
        skip_space();
        if (consume('}')) return;
        for (;;) {
            skip_space();
            if (pos_ >= text_.size() || text_[pos_] != '"') fail_unexpected("a string key");
            JsonMember member;
            member.key_at = lines_.at(pos_);
            member.key = parse_string();
            skip_space();
            if (!consume(':')) fail_unexpected("':' after an object key");
            skip_space();
            member.value = parse_value(depth);
            value.members.push_back(std::move(member));
            skip_space();
            if (consume('}')) break;
            if (!consume(',')) fail_unexpected("',' or '}' in an object");
        }
        check_unique_keys(value);
    }

    // Sorting keeps this O(n log n) for objects with many keys; the error names the second occurrence.
    void check_unique_keys(const JsonValue& object) const {
        if (object.members.size() < 2) return;
        std::vector<const JsonMember*> sorted;
        sorted.reserve(object.members.size());
        for (const auto& m : object.members) sorted.push_back(&m);
        std::sort(sorted.begin(), sorted.end(), [](const JsonMember* a, const JsonMember* b) {
            return a->key != b->key ? a->key < b->key : a->key_at.offset < b->key_at.offset;
        });
        const JsonMember* duplicate = nullptr;
        for (size_t i = 1; i < sorted.size(); ++i)
            if (sorted[i]->key == sorted[i - 1]->key && (!duplicate || sorted[i]->key_at.offset < duplicate->key_at.offset))
                duplicate = sorted[i];
        if (duplicate) fail(static_cast<size_t>(duplicate->key_at.offset), "duplicate key " + quoted(duplicate->key));
    }

    void parse_array(JsonValue& value, size_t depth) {
        value.type = JsonValue::Type::array;
        ++pos_;  // '['
        skip_space();
        if (consume(']')) return;
        for (;;) {
            skip_space();
            value.items.push_back(parse_value(depth));
            skip_space();
            if (consume(']')) break;
            if (!consume(',')) fail_unexpected("',' or ']' in an array");
        }
    }

    uint32_t parse_hex4(size_t escape_start) {
        if (text_.size() - pos_ < 4) fail(escape_start, "truncated \\u escape");
        uint32_t v = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = text_[pos_ + k];
            uint32_t d;
            if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') d = static_cast<uint32_t>(c - 'A' + 10);
            else fail(escape_start, "invalid \\u escape");
            v = v * 16 + d;
        }
        pos_ += 4;
        return v;
    }

    // \uXXXX after the backslash and 'u' were consumed; a high surrogate must be followed by a low one.
    uint32_t parse_unicode_escape(size_t escape_start) {
        const uint32_t first = parse_hex4(escape_start);
        if (first >= 0xDC00 && first <= 0xDFFF) fail(escape_start, "lone low surrogate in a \\u escape");
        if (first < 0xD800 || first > 0xDBFF) return first;
        if (!(text_.size() - pos_ >= 2 && text_[pos_] == '\\' && text_[pos_ + 1] == 'u'))
            fail(escape_start, "high surrogate in a \\u escape without a low surrogate after it");
        const size_t second_start = pos_;
        pos_ += 2;
        const uint32_t second = parse_hex4(second_start);
        if (second < 0xDC00 || second > 0xDFFF)
            fail(second_start, "high surrogate in a \\u escape without a low surrogate after it");
        return 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
    }

    std::string parse_string() {
        const size_t open = pos_;
        ++pos_;  // '"'
        std::string out;
        for (;;) {
            if (pos_ >= text_.size()) fail(open, "unterminated string");
            const char c = text_[pos_];
            const auto u = static_cast<unsigned char>(c);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (u < 0x20) fail(pos_, "control character " + describe_byte(pos_) + " in a string (escape it)");
            if (c == '\\') {
                const size_t escape_start = pos_;
                ++pos_;
                if (pos_ >= text_.size()) fail(open, "unterminated string");
                const char e = text_[pos_++];
                switch (e) {
                    case '"': out += '"'; break;
                    case '\\': out += '\\'; break;
                    case '/': out += '/'; break;
                    case 'b': out += '\b'; break;
                    case 'f': out += '\f'; break;
                    case 'n': out += '\n'; break;
                    case 'r': out += '\r'; break;
                    case 't': out += '\t'; break;
                    case 'u': append_utf8(out, parse_unicode_escape(escape_start)); break;
                    default: fail(escape_start, "invalid escape '\\" + std::string(1, e) + "'");
                }
                continue;
            }
            const size_t len = utf8_sequence_length(text_, pos_);
            if (len == 0) fail(pos_, "invalid UTF-8 (" + describe_byte(pos_) + ")");
            out.append(text_.data() + pos_, len);
            pos_ += len;
        }
    }

    // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    void parse_number(JsonValue& value) {
        const size_t start = pos_;
        bool integral_literal = true;
        consume('-');
        if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_unexpected("a digit");
        if (text_[pos_] == '0') {
            ++pos_;
            if (pos_ < text_.size() && is_digit(text_[pos_])) fail(start, "leading zeros are not allowed in numbers");
        } else {
            while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
        }
        if (consume('.')) {
            integral_literal = false;
            if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_unexpected("a digit after '.'");
            while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
        }
        if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
            integral_literal = false;
            ++pos_;
            if (!consume('+')) consume('-');
            if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail_unexpected("a digit in the exponent");
            while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
        }
        const char* first = text_.data() + start;
        const char* last = text_.data() + pos_;
        value.type = JsonValue::Type::number;

        if (integral_literal) {
            int64_t exact = 0;
            const auto r = std::from_chars(first, last, exact);
            if (r.ec == std::errc() && r.ptr == last) {
                value.is_int64 = true;
                value.integer = exact;
            }
        }
        double number = 0.0;
        const auto r = std::from_chars(first, last, number);
        if (r.ec == std::errc::result_out_of_range) {
            // Too small rounds to zero (as Python does); too large has no double (Python would say inf).
            const std::string_view literal(first, static_cast<size_t>(last - first));
            if (decimal_exponent(literal) >= 0)
                fail(start, "number " + quoted(literal) + " is too large for a double");
            number = *first == '-' ? -0.0 : 0.0;
        } else if (r.ec != std::errc() || r.ptr != last) {
            fail(start, "malformed number");
        }
        value.number = number;
        // 1.0 and 1e3 are integers too (JSON Schema's "integer" agrees); -2^63 <= n < 2^63 is exact in int64.
        if (!value.is_int64 && std::nearbyint(number) == number && number >= -9223372036854775808.0 &&
            number < 9223372036854775808.0) {
            value.is_int64 = true;
            value.integer = static_cast<int64_t>(number);
        }
    }

    std::string_view text_;
    const std::string& source_;
    LineIndex lines_;
    size_t pos_ = 0;
};

}  // namespace

JsonValue parse_json(std::string_view text, const std::string& source) { return JsonParser(text, source).parse(); }

}  // namespace mlopt

// Shared by the plan loaders (xml, json, msccl_xml, validate, plan_load): where in an input a byte is, the
// exception that carries a load failure to the C ABI boundary, and quoting of input text inside messages.
//
// Loaders throw LoadError; only plan_load.cpp catches it (and std::bad_alloc) and turns it into an
// mlopt_error, so no exception ever crosses the C ABI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "handles.hpp"

namespace mlopt {

// Code point -> UTF-8 bytes (both parsers decode character references / \u escapes into UTF-8 text).
inline void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// A failure while loading a plan: the status, the one-line message ("<file>: <location>: <what>") and the
// position of the offending byte (or none).
class LoadError : public std::exception {
public:
    LoadError(mlopt_status status, std::string message, Position at = {})
        : status_(status), message_(std::move(message)), at_(at) {}
    const char* what() const noexcept override { return message_.c_str(); }
    mlopt_status status() const noexcept { return status_; }
    const std::string& message() const noexcept { return message_; }
    const Position& at() const noexcept { return at_; }

private:
    mlopt_status status_;
    std::string message_;
    Position at_;
};

// Byte offset -> 1-based line and column. Lines end at "\n", "\r\n" or a lone "\r" (as XML normalises them);
// columns count bytes, so they stay O(1) to compute on inputs with very long lines.
class LineIndex {
public:
    explicit LineIndex(std::string_view text) {
        line_starts_.push_back(0);
        for (size_t i = 0; i < text.size(); ++i) {
            const bool lone_cr = text[i] == '\r' && (i + 1 >= text.size() || text[i + 1] != '\n');
            if (text[i] == '\n' || lone_cr) line_starts_.push_back(i + 1);
        }
    }

    Position at(size_t offset) const {
        // The last line start at or before offset.
        auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
        const size_t line = static_cast<size_t>(it - line_starts_.begin());  // >= 1: line_starts_[0] == 0
        Position p;
        p.line = static_cast<int64_t>(line);
        p.column = static_cast<int64_t>(offset - line_starts_[line - 1]) + 1;
        p.offset = static_cast<int64_t>(offset);
        return p;
    }

private:
    std::vector<size_t> line_starts_;
};

// "(line 3, column 7)"; "(line 3)" without a column; "" without a position.
inline std::string describe_position(const Position& at, bool with_column = true) {
    if (at.line <= 0) return "";
    std::string out = "(line " + std::to_string(at.line);
    if (with_column && at.column > 0) out += ", column " + std::to_string(at.column);
    return out + ")";
}

// Input text inside a message, Python-repr style: 'text' with control characters and quotes escaped (so the
// message stays one line) and at most `limit` bytes shown, then "...".
inline std::string quoted(std::string_view text, size_t limit = 40) {
    static const char hex[] = "0123456789abcdef";
    std::string out = "'";
    size_t shown = std::min(text.size(), limit);
    // Never cut a UTF-8 sequence in two (messages stay valid UTF-8 when the input is).
    while (shown > 0 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80) --shown;
    for (size_t i = 0; i < shown; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\\': out += "\\\\"; break;
            case '\'': out += "\\'"; break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    out += "\\x";
                    out += hex[c >> 4];
                    out += hex[c & 15];
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    out += "'";
    if (shown < text.size()) out += "...";
    return out;
}

}  // namespace mlopt

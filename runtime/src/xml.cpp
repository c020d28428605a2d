// The XML parser behind xml.hpp. One pass over the input with an explicit stack of open elements (so the depth
// of the C++ stack never depends on the input), after a first pass that checks the bytes are UTF-8 and XML
// characters (as expat, which the Python loader uses, rejects anything else).
#include "xml.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>

namespace mlopt {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool is_name_start(char c) {
    const auto u = static_cast<unsigned char>(c);
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || u >= 0x80;
}

bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

bool is_xml_char(uint32_t cp) {
    if (cp < 0x20) return cp == 0x9 || cp == 0xA || cp == 0xD;
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    if (cp == 0xFFFE || cp == 0xFFFF) return false;
    return cp <= 0x10FFFF;
}

// Length of the well-formed UTF-8 sequence at text[i] and its code point; nullopt when it is not one
// (overlong forms, surrogates and values past U+10FFFF are not UTF-8 either).
std::optional<std::pair<size_t, uint32_t>> decode_utf8(std::string_view text, size_t i) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) return std::make_pair(size_t{1}, uint32_t{b0});
    size_t len = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
    else return std::nullopt;
    if (i + len > text.size()) return std::nullopt;
    for (size_t k = 1; k < len; ++k) {
        const auto b = static_cast<unsigned char>(text[i + k]);
        if ((b & 0xC0) != 0x80) return std::nullopt;
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    return std::make_pair(len, cp);
}

bool starts_with(std::string_view text, size_t pos, std::string_view prefix) {
    return text.size() - pos >= prefix.size() && text.compare(pos, prefix.size(), prefix) == 0;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
        if (x != y) return false;
    }
    return true;
}

class XmlParser {
public:
    XmlParser(std::string_view text, const std::string& source) : text_(text), source_(source), lines_(text) {}

    XmlDocument parse() {
        if (starts_with(text_, 0, "\xEF\xBB\xBF")) pos_ = 3;  // byte order mark
        declaration_offset_ = pos_;
        check_characters();
        if (starts_with(text_, pos_, "<?xml") && pos_ + 5 < text_.size() &&
            (is_space(text_[pos_ + 5]) || text_[pos_ + 5] == '?'))
            parse_declaration();
        parse_misc(/*after_root=*/false);
        if (pos_ >= text_.size()) fail(pos_, "no root element");
        if (!(text_[pos_] == '<' && pos_ + 1 < text_.size() && is_name_start(text_[pos_ + 1])))
            fail(pos_, text_[pos_] == '<' ? "expected an element name after '<'" : "text before the root element");
        parse_root();
        parse_misc(/*after_root=*/true);
        if (pos_ < text_.size()) {
            if (text_[pos_] == '<' && pos_ + 1 < text_.size() && is_name_start(text_[pos_ + 1])) {
                const size_t name_start = pos_ + 1;
                fail(pos_, "second root element <" + std::string(scan_name_at(name_start)) + ">");
            }
            fail(pos_, "junk after the root element");
        }
        return std::move(doc_);
    }

private:
    [[noreturn]] void fail(size_t offset, const std::string& what) const {
        const Position at = lines_.at(offset);
        throw LoadError(MLOPT_ERR_PARSE, source_ + ": " + describe_position(at) + ": malformed XML: " + what, at);
    }

    bool at_end() const { return pos_ >= text_.size(); }

    // Every byte must be part of a UTF-8 encoded XML character.
    void check_characters() const {
        for (size_t i = pos_; i < text_.size();) {
            const auto decoded = decode_utf8(text_, i);
            if (!decoded) {
                char hex[8];
                std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text_[i]));
                fail(i, std::string("invalid UTF-8 (byte ") + hex + ")");
            }
            if (!is_xml_char(decoded->second)) {
                char cp[16];
                std::snprintf(cp, sizeof cp, "U+%04X", static_cast<unsigned>(decoded->second));
                fail(i, std::string("character ") + cp + " is not allowed in XML");
            }
            i += decoded->first;
        }
    }

    std::string_view scan_name_at(size_t start) const {
        size_t end = start;
        while (end < text_.size() && is_name_char(text_[end])) ++end;
        return text_.substr(start, end - start);
    }

    std::string_view parse_name(const char* what) {
        if (at_end() || !is_name_start(text_[pos_])) fail(pos_, std::string("expected ") + what);
        const std::string_view name = scan_name_at(pos_);
        pos_ += name.size();
        return name;
    }

    bool skip_space() {
        const size_t start = pos_;
        while (!at_end() && is_space(text_[pos_])) ++pos_;
        return pos_ > start;
    }

    void expect(std::string_view token, const char* what) {
        if (!starts_with(text_, pos_, token)) fail(pos_, at_end() ? std::string("unexpected end of input, expected ") + what
                                                                  : std::string("expected ") + what);
        pos_ += token.size();
    }

    // `&...;` at pos_, appended to `out` decoded.
    void parse_reference(std::string& out) {
        const size_t amp = pos_;
        ++pos_;
        if (!at_end() && text_[pos_] == '#') {
            ++pos_;
            const bool hex = !at_end() && text_[pos_] == 'x';
            if (hex) ++pos_;
            uint32_t cp = 0;
            size_t digits = 0;
            while (!at_end() && text_[pos_] != ';') {
                const char c = text_[pos_];
                int d = -1;
                if (c >= '0' && c <= '9') d = c - '0';
                else if (hex && c >= 'a' && c <= 'f') d = c - 'a' + 10;
                else if (hex && c >= 'A' && c <= 'F') d = c - 'A' + 10;
                if (d < 0) fail(amp, "malformed character reference");
                if (cp <= 0x10FFFF) cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);  // stops growing past the range
                ++digits;
                ++pos_;
            }
            if (at_end()) fail(amp, "unterminated character reference");
            if (digits == 0) fail(amp, "malformed character reference");
            if (!is_xml_char(cp)) fail(amp, "character reference to a character not allowed in XML");
            ++pos_;  // ';'
            append_utf8(out, cp);
            return;
        }
        static const struct { const char* name; char value; } kEntities[] = {
            {"lt", '<'}, {"gt", '>'}, {"amp", '&'}, {"quot", '"'}, {"apos", '\''}};
        const size_t name_start = pos_;
        while (!at_end() && is_name_char(text_[pos_])) ++pos_;
        const std::string_view name = text_.substr(name_start, pos_ - name_start);
        if (at_end()) fail(amp, "unterminated entity reference");
        if (name.empty() || text_[pos_] != ';') fail(amp, "malformed entity reference");
        for (const auto& e : kEntities) {
            if (name == e.name) {
                ++pos_;
                out += e.value;
                return;
            }
        }
        fail(amp, "undefined entity &" + std::string(name) + ";");
    }

    // A quoted attribute value at pos_: references decoded, literal tab/newline/CR (CR LF as one) become spaces.
    std::string parse_attribute_value() {
        if (at_end()) fail(pos_, "unexpected end of input in a start tag");
        const char quote = text_[pos_];
        if (quote != '"' && quote != '\'') fail(pos_, "attribute value must be quoted");
        const size_t open = pos_;
        ++pos_;
        std::string value;
        for (;;) {
            if (at_end()) fail(open, "unterminated attribute value");
            const char c = text_[pos_];
            if (c == quote) break;
            if (c == '<') fail(pos_, "'<' inside an attribute value");
            if (c == '&') {
                parse_reference(value);
                continue;
            }
            if (c == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n') ++pos_;
            value += (c == '\t' || c == '\n' || c == '\r') ? ' ' : c;
            ++pos_;
        }
        ++pos_;  // closing quote
        return value;
    }

    // Attributes up to '>' or '/>' of a start tag (or up to '?>' of the XML declaration).
    // Returns true when the tag closes itself ("/>").
    bool parse_attributes(std::vector<XmlAttribute>& attributes, bool declaration) {
        for (;;) {
            const bool spaced = skip_space();
            if (at_end()) fail(pos_, "unexpected end of input in a start tag");
            if (declaration) {
                if (starts_with(text_, pos_, "?>")) { pos_ += 2; return false; }
            } else {
                if (text_[pos_] == '>') { ++pos_; return false; }
                if (starts_with(text_, pos_, "/>")) { pos_ += 2; return true; }
            }
            if (!spaced) fail(pos_, "expected whitespace before an attribute");
            XmlAttribute attribute;
            attribute.at = lines_.at(pos_);
            attribute.name = std::string(parse_name("an attribute name"));
            skip_space();
            expect("=", "'=' after an attribute name");
            skip_space();
            attribute.value_at = lines_.at(pos_);
            attribute.value = parse_attribute_value();
            attributes.push_back(std::move(attribute));
        }
    }

    // Names must be unique; the error points at the second occurrence. Sorting keeps this O(n log n) even for
    // a (hostile) tag with very many attributes.
    void check_unique_attributes(const std::vector<XmlAttribute>& attributes) const {
        if (attributes.size() < 2) return;
        std::vector<const XmlAttribute*> sorted;
        sorted.reserve(attributes.size());
        for (const auto& a : attributes) sorted.push_back(&a);
        std::sort(sorted.begin(), sorted.end(), [](const XmlAttribute* a, const XmlAttribute* b) {
            return a->name != b->name ? a->name < b->name : a->at.offset < b->at.offset;
        });
        const XmlAttribute* first_duplicate = nullptr;
        for (size_t i = 1; i < sorted.size(); ++i) {
            if (sorted[i]->name == sorted[i - 1]->name &&
                (first_duplicate == nullptr || sorted[i]->at.offset < first_duplicate->at.offset))
                first_duplicate = sorted[i];
        }
        if (first_duplicate != nullptr)
            fail(static_cast<size_t>(first_duplicate->at.offset), "duplicate attribute '" + first_duplicate->name + "'");
    }

    void parse_declaration() {
        const size_t start = pos_;
        pos_ += 5;  // "<?xml"
        std::vector<XmlAttribute> pseudo;
        parse_attributes(pseudo, /*declaration=*/true);
        check_unique_attributes(pseudo);
        if (pseudo.empty() || pseudo[0].name != "version") fail(start, "the XML declaration needs a version");
        for (const auto& a : pseudo) {
            if (a.name == "version") {
                if (!(a.value.size() >= 3 && a.value.compare(0, 2, "1.") == 0))
                    fail(static_cast<size_t>(a.value_at.offset), "unsupported XML version '" + a.value + "'");
            } else if (a.name == "encoding") {
                // The bytes were checked as UTF-8; another declared encoding would mean another decoding.
                if (!iequals(a.value, "UTF-8") && !iequals(a.value, "UTF8") && !iequals(a.value, "US-ASCII"))
                    fail(static_cast<size_t>(a.value_at.offset),
                         "unsupported encoding " + quoted(a.value) + " (plans are read as UTF-8)");
            } else if (a.name == "standalone") {
                if (a.value != "yes" && a.value != "no")
                    fail(static_cast<size_t>(a.value_at.offset), "standalone must be 'yes' or 'no'");
            } else {
                fail(static_cast<size_t>(a.at.offset), "unexpected '" + a.name + "' in the XML declaration");
            }
        }
    }

    void parse_comment() {
        const size_t start = pos_;
        pos_ += 4;  // "<!--"
        const size_t dashes = text_.find("--", pos_);
        if (dashes == std::string_view::npos) fail(start, "unterminated comment");
        if (dashes + 2 >= text_.size()) fail(start, "unterminated comment");
        if (text_[dashes + 2] != '>') fail(dashes, "'--' inside a comment");
        pos_ = dashes + 3;
    }

    void parse_processing_instruction() {
        const size_t start = pos_;
        pos_ += 2;  // "<?"
        const std::string_view target = parse_name("a processing instruction target");
        if (iequals(target, "xml"))
            fail(start, start == declaration_offset_ ? "malformed XML declaration"
                                                     : "XML declaration not at the start of the document");
        if (!at_end() && !is_space(text_[pos_]) && !starts_with(text_, pos_, "?>"))
            fail(pos_, "malformed processing instruction");
        const size_t end = text_.find("?>", pos_);
        if (end == std::string_view::npos) fail(start, "unterminated processing instruction");
        pos_ = end + 2;
    }

    // Whitespace, comments and processing instructions (before and after the root element).
    void parse_misc(bool after_root) {
        for (;;) {
            skip_space();
            if (starts_with(text_, pos_, "<!--")) {
                parse_comment();
            } else if (starts_with(text_, pos_, "<?")) {
                parse_processing_instruction();
            } else if (starts_with(text_, pos_, "<!DOCTYPE")) {
                fail(pos_, "DOCTYPE declarations are not allowed");
            } else if (starts_with(text_, pos_, "<!")) {
                fail(pos_, after_root ? "junk after the root element" : "unexpected markup before the root element");
            } else {
                return;
            }
        }
    }

    // '<' name attributes ('>' | '/>') at pos_: a new element, appended as a child of `parent` (npos: root).
    // Returns whether it closed itself.
    bool parse_start_tag(size_t parent) {
        XmlElement element;
        element.at = lines_.at(pos_);
        ++pos_;  // '<'
        element.tag = std::string(parse_name("an element name"));
        const bool self_closing = parse_attributes(element.attributes, /*declaration=*/false);
        check_unique_attributes(element.attributes);
        const size_t index = doc_.elements.size();
        doc_.elements.push_back(std::move(element));
        if (parent != SIZE_MAX) doc_.elements[parent].children.push_back(index);
        if (!self_closing) open_.push_back(index);
        return self_closing;
    }

    void parse_end_tag() {
        const size_t start = pos_;
        pos_ += 2;  // "</"
        const std::string_view name = parse_name("an element name after '</'");
        skip_space();
        expect(">", "'>' to close the end tag");
        const XmlElement& open = doc_.elements[open_.back()];
        if (name != open.tag)
            fail(start, "mismatched tag: </" + std::string(name) + "> closes <" + open.tag + "> " +
                            describe_position(open.at, false));
        open_.pop_back();
    }

    void add_text(size_t element, std::string_view decoded, size_t raw_start) {
        XmlElement& e = doc_.elements[element];
        if (e.text_at.line == 0) {
            for (size_t i = 0; i < decoded.size(); ++i) {
                if (!is_space(decoded[i])) {
                    // The raw offset of the first non-space byte (references start with '&', never a space).
                    size_t raw = raw_start;
                    while (raw < text_.size() && is_space(text_[raw])) ++raw;
                    e.text_at = lines_.at(raw);
                    break;
                }
            }
        }
        e.text += decoded;
    }

    // Character data up to the next '<' (line ends normalised to "\n").
    void parse_char_data(size_t element) {
        const size_t start = pos_;
        std::string decoded;
        while (!at_end() && text_[pos_] != '<') {
            const char c = text_[pos_];
            if (c == '&') {
                parse_reference(decoded);
                continue;
            }
            if (c == ']' && starts_with(text_, pos_, "]]>")) fail(pos_, "']]>' in character data");
            if (c == '\r') {
                if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n') ++pos_;
                decoded += '\n';
            } else {
                decoded += c;
            }
            ++pos_;
        }
        add_text(element, decoded, start);
    }

    void parse_cdata(size_t element) {
        const size_t start = pos_;
        pos_ += 9;  // "<![CDATA["
        const size_t end = text_.find("]]>", pos_);
        if (end == std::string_view::npos) fail(start, "unterminated CDATA section");
        add_text(element, text_.substr(pos_, end - pos_), pos_);
        pos_ = end + 3;
    }

    void parse_root() {
        if (parse_start_tag(SIZE_MAX)) return;
        while (!open_.empty()) {
            const size_t current = open_.back();
            if (at_end()) {
                const XmlElement& e = doc_.elements[current];
                fail(pos_, "unexpected end of input: <" + e.tag + "> " + describe_position(e.at, false) +
                               " is not closed");
            }
            if (text_[pos_] != '<') {
                parse_char_data(current);
            } else if (starts_with(text_, pos_, "</")) {
                parse_end_tag();
            } else if (starts_with(text_, pos_, "<!--")) {
                parse_comment();
            } else if (starts_with(text_, pos_, "<![CDATA[")) {
                parse_cdata(current);
            } else if (starts_with(text_, pos_, "<?")) {
                parse_processing_instruction();
            } else if (starts_with(text_, pos_, "<!DOCTYPE")) {
                fail(pos_, "DOCTYPE declarations are not allowed");
            } else if (starts_with(text_, pos_, "<!")) {
                fail(pos_, "unexpected markup");
            } else {
                if (open_.size() >= kMaxXmlDepth)
                    fail(pos_, "elements nested deeper than " + std::to_string(kMaxXmlDepth));
                parse_start_tag(current);
            }
        }
    }

    std::string_view text_;
    const std::string& source_;
    LineIndex lines_;
    size_t pos_ = 0;
    size_t declaration_offset_ = 0;  // where an <?xml ...?> declaration may be: 0, or 3 after a byte order mark
    XmlDocument doc_;
    std::vector<size_t> open_;  // indices of the elements not closed yet, outermost first
};

}  // namespace

XmlDocument parse_xml(std::string_view text, const std::string& source) { return XmlParser(text, source).parse(); }

}  // namespace mlopt

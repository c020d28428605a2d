// A small, strict XML 1.0 parser for plan files: elements, attributes (' or " quoted), the five predefined
// entities and numeric character references, comments, processing instructions, CDATA sections and the
// <?xml ...?> declaration. No DTDs (a DOCTYPE is an error, as in mlopt/formats/msccl_xml.py), no namespaces
// processing (a ':' is just a name character), UTF-8 only.
//
// Every element and attribute records its position (line, column, byte offset), so later checks can point
// at the exact attribute. Anything malformed or truncated is a LoadError with MLOPT_ERR_PARSE and the position
// of the offending byte. The parser is iterative; nesting is bounded by kMaxXmlDepth.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "source.hpp"

namespace mlopt {

constexpr size_t kMaxXmlDepth = 256;

struct XmlAttribute {
    std::string name;
    std::string value;  // references decoded, whitespace normalised as XML requires
    Position at;        // of the name
    Position value_at;  // of the opening quote
};

struct XmlElement {
    std::string tag;
    Position at;  // of the '<'
    std::vector<XmlAttribute> attributes;  // document order, names unique
    std::vector<size_t> children;          // indices into XmlDocument::elements, document order
    std::string text;                      // all character data directly inside, concatenated
    Position text_at;                      // first non-whitespace character of `text`; line 0 if none

    // NULL when the element has no such attribute.
    const XmlAttribute* attribute(std::string_view name) const {
        for (const auto& a : attributes)
            if (a.name == name) return &a;
        return nullptr;
    }
};

struct XmlDocument {
    std::vector<XmlElement> elements;  // elements[0] is the root; never resized after parsing
    const XmlElement& root() const { return elements.front(); }
    const XmlElement& child(const XmlElement& parent, size_t i) const { return elements[parent.children[i]]; }
};

// Parses `text` (UTF-8, optionally with a byte order mark). `source` names the input in messages.
// Throws LoadError (MLOPT_ERR_PARSE) with a message "<source>: (line L, column C): malformed XML: <what>".
XmlDocument parse_xml(std::string_view text, const std::string& source);

}  // namespace mlopt

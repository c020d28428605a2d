// MSCCL-EF XML documents -> Program, mirroring mlopt/formats/msccl_xml.py parse_program: the executor and the
// legacy dialects (auto-detected), the same required/optional attributes and defaults; what the real parsers
// ignore is ignored (attributes they do not read, unknown elements with their content); known elements in the
// wrong place, elements inside <step>, a required attribute after the first 16, numbers that are not plain
// decimal ints (minBytes/maxBytes: int64, saturated as strtoll does) and flags other than 0/1 are errors, and
// the structural rules (gpu ids 0..ngpus-1 each once, tb ids 0..n-1, s = position, chan < nchannels, peers -1
// or another gpu). Collectives the executor runs but mlopt does not model: MLOPT_ERR_UNSUPPORTED. Semantic
// checks are validate_program's (validate.hpp). docs/input-contract.md has the whole contract.
#pragma once

#include <string>

#include "program.hpp"
#include "validate.hpp"
#include "xml.hpp"

namespace mlopt {

enum class MscclDialect { automatic, executor, legacy };

// The dialect `automatic` reads `root` in: legacy when the algo element lacks one of outofplace/minBytes/
// maxBytes, spells coll="reduce_scatter" or carries a legacy-only attribute (redop, nthreads); else executor.
MscclDialect detect_msccl_dialect(const XmlElement& root);

// Reads the program of `doc`. `source.file` names the input in messages; the element of every part of the
// program is recorded in `source` (which then points into `doc`). Throws LoadError: MLOPT_ERR_SCHEMA for a
// missing, misplaced or mistyped attribute or element, MLOPT_ERR_SEMANTIC for broken structure (ids, peers,
// channels), MLOPT_ERR_PARSE for text between elements (as the Python loader: "malformed XML").
Program read_msccl_program(const XmlDocument& doc, ProgramSource& source,
                           MscclDialect dialect = MscclDialect::automatic);

}  // namespace mlopt

// MSCCL-EF XML documents -> Program, mirroring mlopt/formats/msccl_xml.py parse_program: the executor and the
// legacy dialects (auto-detected), the same required/optional attributes and defaults, unknown attributes and
// elements are errors, plain decimal integers, flags 0/1, and the structural rules (gpu ids 0..ngpus-1 each
// once, tb ids 0..n-1, s = position, chan < nchannels, peers -1 or another gpu). Semantic checks are
// validate_program's (validate.hpp).
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
// missing, unknown or mistyped attribute or element, MLOPT_ERR_SEMANTIC for broken structure (ids, peers,
// channels), MLOPT_ERR_PARSE for text between elements (as the Python loader: "malformed XML").
Program read_msccl_program(const XmlDocument& doc, ProgramSource& source,
                           MscclDialect dialect = MscclDialect::automatic);

}  // namespace mlopt

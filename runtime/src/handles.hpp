// The structs behind the C ABI's opaque handles, and the error helper every entry point uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "mlopt/mlopt.h"
#include "program.hpp"

struct mlopt_error_s {
    mlopt_status status = MLOPT_OK;
    std::string message;  // one line: "<file>: <location>: <what>"
    int64_t line = 0;
    int64_t column = 0;
    int64_t offset = -1;
};

struct mlopt_plan_s {
    mlopt_plan_kind kind = MLOPT_PLAN_MSCCL_XML;
    std::string source;  // file name used in messages
    std::string format;  // JSON "format"; "msccl-ef" for XML
    std::string schema_version;
    std::string planner;  // JSON "kind"; "collective" for XML
    std::string text;     // the JSON document as read (JSON plans)
    mlopt::Program program;  // XML plans: validated program
};

namespace mlopt {

// Where in an input a problem is; line/column 1-based (0 = unknown), offset in bytes (-1 = unknown).
struct Position {
    int64_t line = 0;
    int64_t column = 0;
    int64_t offset = -1;
};

// Sets *err (when err is not NULL) to a new error and returns `status`; never throws.
mlopt_status fail(mlopt_error* err, mlopt_status status, const std::string& message, Position at = {});

// Clears *err (when err is not NULL) and returns MLOPT_OK.
mlopt_status succeed(mlopt_error* err);

// Copies `value` into a caller's struct whose first field is struct_size: only the bytes the caller's struct
// has (an older header's smaller struct), leaving out->struct_size as it was. False when struct_size does not
// even cover the first field after it (the caller did not set it).
template <typename T>
bool copy_sized(const T& value, T* out) {
    const size_t given = out->struct_size;
    if (given <= sizeof(size_t)) return false;
    std::memcpy(out, &value, given < sizeof(T) ? given : sizeof(T));
    out->struct_size = given;
    return true;
}

// The other direction, for the options structs callers pass in: copies `given` over `out` (already set to the
// defaults) as far as the caller's struct goes (an older header's smaller struct), then sets out.struct_size
// to sizeof(T). Fails (MLOPT_ERR_INVALID_ARGUMENT) when given.struct_size does not cover the first `known`
// bytes: the caller did not initialise the options with `init`, which the message names.
template <typename T>
mlopt_status read_sized(const T& given, size_t known, const char* init, T& out, mlopt_error* err) {
    if (given.struct_size < known) {
        return fail(err, MLOPT_ERR_INVALID_ARGUMENT,
                    "options->struct_size=" + std::to_string(given.struct_size) +
                        " is too small: initialise the options with " + init);
    }
    std::memcpy(&out, &given, given.struct_size < sizeof(T) ? given.struct_size : sizeof(T));
    out.struct_size = sizeof(T);
    return MLOPT_OK;
}

}  // namespace mlopt

// Status codes, version and error objects of the C ABI.
#include <new>

#include "handles.hpp"

namespace mlopt {

mlopt_status fail(mlopt_error* err, mlopt_status status, const std::string& message, Position at) {
    if (err == nullptr) return status;
    *err = nullptr;
    try {
        auto* e = new mlopt_error_s;
        e->status = status;
        e->message = message;
        e->line = at.line;
        e->column = at.column;
        e->offset = at.offset;
        *err = e;
    } catch (...) {
        // Out of memory while reporting: the status alone still says what happened.
    }
    return status;
}

mlopt_status succeed(mlopt_error* err) {
    if (err != nullptr) *err = nullptr;
    return MLOPT_OK;
}

}  // namespace mlopt

extern "C" {

MLOPT_API const char* mlopt_status_string(mlopt_status status) {
    switch (status) {
        case MLOPT_OK: return "ok";
        case MLOPT_ERR_INVALID_ARGUMENT: return "invalid argument";
        case MLOPT_ERR_IO: return "i/o error";
        case MLOPT_ERR_PARSE: return "parse error";
        case MLOPT_ERR_SCHEMA: return "schema error";
        case MLOPT_ERR_SEMANTIC: return "invalid plan";
        case MLOPT_ERR_MISMATCH: return "plan and buffers do not match";
        case MLOPT_ERR_DEADLOCK: return "deadlock";
        case MLOPT_ERR_UNSUPPORTED: return "unsupported";
        case MLOPT_ERR_NO_MEMORY: return "out of memory";
        case MLOPT_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

MLOPT_API void mlopt_version(int* major, int* minor, int* patch) {
    if (major) *major = MLOPT_VERSION_MAJOR;
    if (minor) *minor = MLOPT_VERSION_MINOR;
    if (patch) *patch = MLOPT_VERSION_PATCH;
}

MLOPT_API mlopt_status mlopt_error_status(const mlopt_error_s* err) { return err ? err->status : MLOPT_OK; }
MLOPT_API const char* mlopt_error_message(const mlopt_error_s* err) { return err ? err->message.c_str() : ""; }
MLOPT_API int64_t mlopt_error_line(const mlopt_error_s* err) { return err ? err->line : 0; }
MLOPT_API int64_t mlopt_error_column(const mlopt_error_s* err) { return err ? err->column : 0; }
MLOPT_API int64_t mlopt_error_offset(const mlopt_error_s* err) { return err ? err->offset : -1; }
MLOPT_API void mlopt_error_free(mlopt_error err) { delete err; }

}  // extern "C"

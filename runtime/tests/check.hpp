// Minimal assertions for the runtime's plain test executables (no test framework: exit status 0 = pass).
//
//   CHECK(cond)            records a failure (file:line and the expression) and goes on
//   CHECK_EQ(a, b)         same, printing both values (anything with operator<<)
//   CHECK_CONTAINS(s, sub) `sub` occurs in the string `s`
//   REQUIRE(cond)          like CHECK, then returns from the (void) test function when it failed
//   return check::finish("test_name");   at the end of main: prints a summary, returns the exit status
//
// Header-only; the failure counter is a function-local static so every test executable gets its own.
#pragma once

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

namespace check {

inline int& failures() {
    static int count = 0;
    return count;
}

inline int& checks() {
    static int count = 0;
    return count;
}

inline bool record(bool ok, const char* file, int line, const std::string& what) {
    ++checks();
    if (!ok) {
        ++failures();
        std::cerr << file << ":" << line << ": FAILED: " << what << std::endl;
    }
    return ok;
}

template <typename A, typename B>
bool record_eq(const A& a, const B& b, const char* expr_a, const char* expr_b, const char* file, int line) {
    const bool ok = a == b;
    if (ok) return record(true, file, line, "");
    std::ostringstream what;
    what << expr_a << " == " << expr_b << " (" << a << " vs " << b << ")";
    return record(false, file, line, what.str());
}

inline bool record_contains(const std::string& haystack, const std::string& needle, const char* expr, const char* file,
                            int line) {
    const bool ok = haystack.find(needle) != std::string::npos;
    return record(ok, file, line, std::string(expr) + " contains \"" + needle + "\" (it is \"" + haystack + "\")");
}

inline int finish(const char* name) {
    std::printf("%s: %d checks, %d failed\n", name, checks(), failures());
    return failures() == 0 ? 0 : 1;
}

}  // namespace check

#define CHECK(cond) ::check::record(static_cast<bool>(cond), __FILE__, __LINE__, #cond)
#define CHECK_EQ(a, b) ::check::record_eq((a), (b), #a, #b, __FILE__, __LINE__)
#define CHECK_CONTAINS(haystack, needle) \
    ::check::record_contains(std::string(haystack), std::string(needle), #haystack, __FILE__, __LINE__)
#define REQUIRE(cond)                                                                 \
    do {                                                                              \
        if (!::check::record(static_cast<bool>(cond), __FILE__, __LINE__, #cond)) return; \
    } while (0)

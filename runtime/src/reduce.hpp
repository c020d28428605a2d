// Element types and reduction operators of the CPU backend: sizes, names, float16/bfloat16 conversions and the
// element-wise kernels the interpreter's reducing steps (rrs, rrc, rrcs, re) run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mlopt/mlopt.h"

namespace mlopt {

// Bytes per element; 0 for a value outside the enum.
size_t dtype_size(mlopt_dtype dtype);
bool is_valid_dtype(mlopt_dtype dtype);
bool is_valid_redop(mlopt_redop op);
const char* dtype_name(mlopt_dtype dtype);  // "float32", ...; "?" when invalid
const char* redop_name(mlopt_redop op);     // "sum", ...; "?" when invalid

// IEEE 754 binary16 and bfloat16 <-> binary32. Widening is exact; narrowing rounds to nearest, ties to even,
// overflows to infinity and keeps NaN a (quiet) NaN. Inline and branch-free so that the block loops in
// reduce.cpp vectorise.
inline uint32_t float_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

inline float bits_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline float half_to_float(uint16_t half) {
    // Exponent and mantissa moved into float position, then scaled by 2^(127-15): exact for normal and
    // subnormal halves alike. Infinity and NaN (exponent 31) get the float's all-ones exponent.
    const uint32_t magnitude = static_cast<uint32_t>(half & 0x7fffu) << 13;
    uint32_t bits = float_bits(bits_float(magnitude) * 0x1p112f);
    bits |= magnitude >= (0x7c00u << 13) ? 0x7f800000u : 0u;
    return bits_float(bits | static_cast<uint32_t>(half & 0x8000u) << 16);
}

inline uint16_t float_to_half(float value) {
    // F. Giesen's float_to_half_fast3_rtne, written with selects.
    uint32_t bits = float_bits(value);
    const uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    // |value| >= 65536 (after rounding always infinity) or NaN.
    const uint32_t huge = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
    // |value| < 2^-14: the half is subnormal; adding 0.5 lets the FPU round the mantissa into the low bits.
    const uint32_t tiny = float_bits(bits_float(bits) + 0.5f) - 0x3f000000u;
    // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
    const uint32_t normal = (bits + 0xc8000fffu + ((bits >> 13) & 1u)) >> 13;
    const uint32_t half = bits >= 0x47800000u ? huge : (bits < 0x38800000u ? tiny : normal);
    return static_cast<uint16_t>(half | sign >> 16);
}

inline float bfloat16_to_float(uint16_t value) { return bits_float(static_cast<uint32_t>(value) << 16); }

inline uint16_t float_to_bfloat16(float value) {
    const uint32_t bits = float_bits(value);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// dst[i] = a[i] op b[i] for i < n (a first: the executor's "recv + src"). dst may be a, b or disjoint from
// both; a partial overlap runs element by element in index order. int32 sums and products wrap around.
// Preconditions (checked by the caller): valid dtype and op, pointers aligned to the element size.
void reduce(mlopt_dtype dtype, mlopt_redop op, void* dst, const void* a, const void* b, size_t n);

// a[i] = dst[i] = a[i] op b[i]: the result both forwarded (a: a received message, disjoint from the others)
// and stored (dst: disjoint from a; equal to b or disjoint from it). One pass instead of reduce + memcpy.
void reduce_keep(mlopt_dtype dtype, mlopt_redop op, void* dst, void* a, const void* b, size_t n);

}  // namespace mlopt

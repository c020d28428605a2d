// Element-wise reduction kernels. float32 and int32 run straight loops over restrict pointers (one version per
// aliasing case, so the compiler vectorises without run-time overlap checks); float16 and bfloat16 go through
// float in blocks that stay in L1 (decode a and b, combine, encode), as the GPU kernels do, with AVX2/F16C
// conversions when the CPU has them.
#include "reduce.hpp"

#include <algorithm>
#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define MLOPT_X86_CODECS 1
#else
#define MLOPT_X86_CODECS 0
#endif

namespace mlopt {

size_t dtype_size(mlopt_dtype dtype) {
    switch (dtype) {
        case MLOPT_FLOAT32: return 4;
        case MLOPT_FLOAT16: return 2;
        case MLOPT_BFLOAT16: return 2;
        case MLOPT_INT32: return 4;
    }
    return 0;
}

bool is_valid_dtype(mlopt_dtype dtype) { return dtype_size(dtype) != 0; }

bool is_valid_redop(mlopt_redop op) {
    return op == MLOPT_SUM || op == MLOPT_PROD || op == MLOPT_MAX || op == MLOPT_MIN;
}

const char* dtype_name(mlopt_dtype dtype) {
    switch (dtype) {
        case MLOPT_FLOAT32: return "float32";
        case MLOPT_FLOAT16: return "float16";
        case MLOPT_BFLOAT16: return "bfloat16";
        case MLOPT_INT32: return "int32";
    }
    return "?";
}

const char* redop_name(mlopt_redop op) {
    switch (op) {
        case MLOPT_SUM: return "sum";
        case MLOPT_PROD: return "prod";
        case MLOPT_MAX: return "max";
        case MLOPT_MIN: return "min";
    }
    return "?";
}

namespace {

// Operators on float and int32. The int32 ones compute in uint32 so that overflow wraps (as on the GPU)
// instead of being undefined behaviour.
struct Sum {
    static float apply(float a, float b) { return a + b; }
    static int32_t apply(int32_t a, int32_t b) {
        return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
    }
};
struct Prod {
    static float apply(float a, float b) { return a * b; }
    static int32_t apply(int32_t a, int32_t b) {
        return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
    }
};
struct Max {
    template <typename T>
    static T apply(T a, T b) { return a > b ? a : b; }
};
struct Min {
    template <typename T>
    static T apply(T a, T b) { return a < b ? a : b; }
};

template <typename T, typename Op>
void combine_disjoint(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void combine_into_a(T* __restrict a, const T* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) a[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void combine_into_b(const T* __restrict a, T* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) b[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void combine_overlapping(T* dst, const T* a, const T* b, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

bool disjoint(const void* x, const void* y, size_t bytes) {
    auto px = reinterpret_cast<uintptr_t>(x);
    auto py = reinterpret_cast<uintptr_t>(y);
    return px + bytes <= py || py + bytes <= px;
}

template <typename T, typename Op>
void combine(void* dst_, const void* a_, const void* b_, size_t n) {
    T* dst = static_cast<T*>(dst_);
    const T* a = static_cast<const T*>(a_);
    const T* b = static_cast<const T*>(b_);
    const size_t bytes = n * sizeof(T);
    if (a == b) {
        combine_overlapping<T, Op>(dst, a, b, n);  // x op x: rare (a step reducing a chunk with itself)
    } else if (dst == a && disjoint(a, b, bytes)) {
        combine_into_a<T, Op>(dst, b, n);
    } else if (dst == b && disjoint(a, b, bytes)) {
        combine_into_b<T, Op>(a, dst, n);
    } else if (disjoint(dst, a, bytes) && disjoint(dst, b, bytes)) {
        combine_disjoint<T, Op>(dst, a, b, n);
    } else {
        combine_overlapping<T, Op>(dst, a, b, n);
    }
}

template <typename T, typename Op>
void keep_disjoint(T* __restrict dst, T* __restrict a, const T* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const T value = Op::apply(a[i], b[i]);
        a[i] = value;
        dst[i] = value;
    }
}

template <typename T, typename Op>
void keep_into_b(T* __restrict a, T* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const T value = Op::apply(a[i], b[i]);
        a[i] = value;
        b[i] = value;
    }
}

template <typename T, typename Op>
void keep(void* dst_, void* a_, const void* b_, size_t n) {
    T* dst = static_cast<T*>(dst_);
    T* a = static_cast<T*>(a_);
    const T* b = static_cast<const T*>(b_);
    const size_t bytes = n * sizeof(T);
    if (!disjoint(a, b, bytes) || !disjoint(a, dst, bytes)) {
        combine_overlapping<T, Op>(dst, a, b, n);  // outside the contract: element by element, then the copy
        std::memmove(a, dst, bytes);
    } else if (dst == b) {
        keep_into_b<T, Op>(a, dst, n);
    } else if (disjoint(dst, b, bytes)) {
        keep_disjoint<T, Op>(dst, a, b, n);
    } else {
        combine_overlapping<T, Op>(dst, a, b, n);
        std::memcpy(a, dst, bytes);
    }
}

// Block codecs for the 16-bit floats: decode n values to float, encode n floats back.
struct HalfCodec {
    static void decode(const uint16_t* in, float* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
    }
    static void encode(const float* in, uint16_t* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
    }
};

struct BFloatCodec {
    static void decode(const uint16_t* in, float* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float(in[i]);
    }
    static void encode(const float* in, uint16_t* out, size_t n) {
        for (size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
    }
};

#if MLOPT_X86_CODECS
// The same with AVX2 (and F16C for float16), chosen at run time when the CPU has them: built for the baseline
// x86-64 instruction set, the portable loops barely vectorise (no unsigned compares, packs or half
// conversions), and 16-bit reductions would run at a tenth of the float32 speed. Same results: F16C rounds to
// nearest even like float_to_half (NaNs stay NaN, payload bits may differ).
struct HalfCodecF16C {
    __attribute__((target("avx2,f16c"))) static void decode(const uint16_t* in, float* out, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
        }
        HalfCodec::decode(in + i, out + i, n - i);
    }
    __attribute__((target("avx2,f16c"))) static void encode(const float* in, uint16_t* out, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
        }
        HalfCodec::encode(in + i, out + i, n - i);
    }
};

struct BFloatCodecAvx2 {
    __attribute__((target("avx2"))) static void decode(const uint16_t* in, float* out, size_t n) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
        }
        BFloatCodec::decode(in + i, out + i, n - i);
    }
    // float_to_bfloat16, eight at a time.
    __attribute__((target("avx2"))) static void encode(const float* in, uint16_t* out, size_t n) {
        const __m256i one = _mm256_set1_epi32(1);
        const __m256i bias = _mm256_set1_epi32(0x7fff);
        const __m256i quiet_bit = _mm256_set1_epi32(0x40);
        const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
        const __m256i infinity = _mm256_set1_epi32(0x7f800000);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(in + i));
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, bias), odd), 16);
            const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet_bit);
            const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), infinity);
            const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
            // Pack to 16 bits (within each 128-bit lane), then gather the two lanes' low halves.
            const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
        }
        BFloatCodec::encode(in + i, out + i, n - i);
    }
};

bool cpu_has_avx2() {
    static const bool has = __builtin_cpu_supports("avx2");
    return has;
}

bool cpu_has_avx2_f16c() {
    static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return has;
}
#endif

// 16-bit floats: each block of a and b is decoded before any of dst is written, so dst may alias either.
// Always inlined, so that each caller below compiles it for its own instruction set.
constexpr size_t kBlock16 = 256;

template <typename Codec, typename Op>
__attribute__((always_inline)) inline void combine_16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
    float fa[kBlock16];
    float fb[kBlock16];
    for (size_t start = 0; start < n; start += kBlock16) {
        const size_t len = std::min(kBlock16, n - start);
        Codec::decode(a + start, fa, len);
        Codec::decode(b + start, fb, len);
        for (size_t i = 0; i < len; ++i) fa[i] = Op::apply(fa[i], fb[i]);
        Codec::encode(fa, dst + start, len);
    }
}

// The same for reduce_keep: the encoded block goes to both a and dst.
template <typename Codec, typename Op>
__attribute__((always_inline)) inline void keep_16(uint16_t* dst, uint16_t* a, const uint16_t* b, size_t n) {
    float fa[kBlock16];
    float fb[kBlock16];
    uint16_t encoded[kBlock16];
    for (size_t start = 0; start < n; start += kBlock16) {
        const size_t len = std::min(kBlock16, n - start);
        Codec::decode(a + start, fa, len);
        Codec::decode(b + start, fb, len);
        for (size_t i = 0; i < len; ++i) fa[i] = Op::apply(fa[i], fb[i]);
        Codec::encode(fa, encoded, len);
        std::memcpy(a + start, encoded, len * sizeof(uint16_t));
        std::memcpy(dst + start, encoded, len * sizeof(uint16_t));
    }
}

template <typename Codec, typename Op>
struct Portable16 {
    static void combine(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
        combine_16<Codec, Op>(dst, a, b, n);
    }
    static void keep(uint16_t* dst, uint16_t* a, const uint16_t* b, size_t n) { keep_16<Codec, Op>(dst, a, b, n); }
};

#if MLOPT_X86_CODECS
template <typename Op>
struct HalfF16C {
    __attribute__((target("avx2,f16c"))) static void combine(uint16_t* dst, const uint16_t* a, const uint16_t* b,
                                                              size_t n) {
        combine_16<HalfCodecF16C, Op>(dst, a, b, n);
    }
    __attribute__((target("avx2,f16c"))) static void keep(uint16_t* dst, uint16_t* a, const uint16_t* b, size_t n) {
        keep_16<HalfCodecF16C, Op>(dst, a, b, n);
    }
};

template <typename Op>
struct BFloatAvx2 {
    __attribute__((target("avx2"))) static void combine(uint16_t* dst, const uint16_t* a, const uint16_t* b,
                                                         size_t n) {
        combine_16<BFloatCodecAvx2, Op>(dst, a, b, n);
    }
    __attribute__((target("avx2"))) static void keep(uint16_t* dst, uint16_t* a, const uint16_t* b, size_t n) {
        keep_16<BFloatCodecAvx2, Op>(dst, a, b, n);
    }
};
#endif

// reduce() and reduce_keep() for the 16-bit dtypes, with the fastest codec the CPU supports.
template <typename Op>
void combine_16bit(mlopt_dtype dtype, void* dst, const void* a, const void* b, size_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    const auto* x = static_cast<const uint16_t*>(a);
    const auto* y = static_cast<const uint16_t*>(b);
#if MLOPT_X86_CODECS
    if (dtype == MLOPT_FLOAT16 && cpu_has_avx2_f16c()) return HalfF16C<Op>::combine(d, x, y, n);
    if (dtype == MLOPT_BFLOAT16 && cpu_has_avx2()) return BFloatAvx2<Op>::combine(d, x, y, n);
#endif
    if (dtype == MLOPT_FLOAT16) return Portable16<HalfCodec, Op>::combine(d, x, y, n);
    Portable16<BFloatCodec, Op>::combine(d, x, y, n);
}

template <typename Op>
void keep_16bit(mlopt_dtype dtype, void* dst, void* a, const void* b, size_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    auto* x = static_cast<uint16_t*>(a);
    const auto* y = static_cast<const uint16_t*>(b);
#if MLOPT_X86_CODECS
    if (dtype == MLOPT_FLOAT16 && cpu_has_avx2_f16c()) return HalfF16C<Op>::keep(d, x, y, n);
    if (dtype == MLOPT_BFLOAT16 && cpu_has_avx2()) return BFloatAvx2<Op>::keep(d, x, y, n);
#endif
    if (dtype == MLOPT_FLOAT16) return Portable16<HalfCodec, Op>::keep(d, x, y, n);
    Portable16<BFloatCodec, Op>::keep(d, x, y, n);
}

template <typename Op>
void keep_with(mlopt_dtype dtype, void* dst, void* a, const void* b, size_t n) {
    switch (dtype) {
        case MLOPT_FLOAT32: keep<float, Op>(dst, a, b, n); return;
        case MLOPT_INT32: keep<int32_t, Op>(dst, a, b, n); return;
        case MLOPT_FLOAT16:
        case MLOPT_BFLOAT16: keep_16bit<Op>(dtype, dst, a, b, n); return;
    }
}

template <typename Op>
void reduce_with(mlopt_dtype dtype, void* dst, const void* a, const void* b, size_t n) {
    switch (dtype) {
        case MLOPT_FLOAT32: combine<float, Op>(dst, a, b, n); return;
        case MLOPT_INT32: combine<int32_t, Op>(dst, a, b, n); return;
        case MLOPT_FLOAT16:
        case MLOPT_BFLOAT16: combine_16bit<Op>(dtype, dst, a, b, n); return;
    }
}

}  // namespace

void reduce_keep(mlopt_dtype dtype, mlopt_redop op, void* dst, void* a, const void* b, size_t n) {
    if (n == 0) return;
    switch (op) {
        case MLOPT_SUM: keep_with<Sum>(dtype, dst, a, b, n); return;
        case MLOPT_PROD: keep_with<Prod>(dtype, dst, a, b, n); return;
        case MLOPT_MAX: keep_with<Max>(dtype, dst, a, b, n); return;
        case MLOPT_MIN: keep_with<Min>(dtype, dst, a, b, n); return;
    }
}

void reduce(mlopt_dtype dtype, mlopt_redop op, void* dst, const void* a, const void* b, size_t n) {
    if (n == 0) return;
    switch (op) {
        case MLOPT_SUM: reduce_with<Sum>(dtype, dst, a, b, n); return;
        case MLOPT_PROD: reduce_with<Prod>(dtype, dst, a, b, n); return;
        case MLOPT_MAX: reduce_with<Max>(dtype, dst, a, b, n); return;
        case MLOPT_MIN: reduce_with<Min>(dtype, dst, a, b, n); return;
    }
}

}  // namespace mlopt

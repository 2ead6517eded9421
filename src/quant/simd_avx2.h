// Internal: AVX2 building blocks for the quantized dot products. Include only
// from *_avx2.cpp / *_avx512.cpp files (compiled with AVX2+FMA+F16C). The
// per-block kernels here are static inline so multi-row / multi-token matmul
// kernels can reuse them on the same data layouts.
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "simd_avx2.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/common.h"

namespace glm5::quant::avx2 {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

// Sum of a[i]*b[i] over 32 int8 pairs as 8 int32 lanes (a signed, b signed).
// maddubs needs an unsigned first operand: move a's sign onto b.
inline __m256i dot_i8x32(__m256i a, __m256i b) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// Same with an unsigned first operand (values < 128 so pair sums fit int16).
inline __m256i dot_u8i8x32(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 32 4-bit values of a legacy block: low nibbles are elements 0-15, high
// nibbles 16-31.
inline __m256i unpack_nibbles_32(const uint8_t* qs) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The fifth bits of a Q5 block (32 bits, one per element) as 0x10 / 0x00 bytes.
inline __m256i expand_bits_32(const uint8_t* qh4) {
    uint32_t bits;
    std::memcpy(&bits, qh4, 4);
    // Byte k of the result takes bit k: broadcast the right source byte to
    // each output byte, then test its bit.
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bitsel = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bitsel), bitsel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

inline __m256 fp16x8_to_ps(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline float fp16_scalar(uint16_t h) {
    return _cvtsh_ss(h);
}

}  // namespace glm5::quant::avx2

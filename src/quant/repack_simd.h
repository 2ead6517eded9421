// What the repacked K-quant GEMMs of the VNNI kernels (repack_avx512.cpp) and
// the AMX ones (repack_amx.cpp) share: the float finish (both must end every
// block with the same operations for the same bits), the Q4_K mins and the
// Q6_K levels and scales.
// Inline AVX-512 code: only files built with AVX-512 flags may include it.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "quant/repack_kernels.h"

namespace glm5::quant::repacked {

// The compiler may not contract a product through this into an FMA.
inline __m512 unfused(__m512 v) {
    asm("" : "+v"(v));
    return v;
}

// sum = sum + (dx*dy * isum - mx*dy * summs) in 16 lanes, as the reference.
inline __m512 finish(__m512 sum, __m512 dx, __m512 mx, float dy, __m512i isum, __m512i summs) {
    const __m512 d = _mm512_set1_ps(dy);
    const __m512 p1 = unfused(_mm512_mul_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(isum)));
    const __m512 p2 = unfused(_mm512_mul_ps(_mm512_mul_ps(mx, d), _mm512_cvtepi32_ps(summs)));
    return _mm512_add_ps(sum, _mm512_sub_ps(p1, p2));
}

inline __m512 finish(__m512 sum, __m512 dx, float dy, __m512i isum) {
    const __m512 p =
        unfused(_mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(isum)));
    return _mm512_add_ps(sum, p);
}

// A Q4_K group block's mins as int16 pairs: mp[i] word 2r + e = min of
// sub-block 2i + e of row r.
inline void q4k_mins(const Q4KGroupBlock& g, __m512i* mp) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
        mp[i] =
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.mins[i])));
}

// summs = sum_j min_j * B_j of the 16 rows against one token's 32-value sums,
// given as the int16 pairs (B[2i], B[2i+1]) in pairs[i].
inline __m512i q4k_summs(const __m512i* mp, const int32_t* pairs) {
    __m512i sm = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], _mm512_set1_epi32(pairs[0]));
    sm = _mm512_dpwssd_epi32(sm, mp[1], _mm512_set1_epi32(pairs[1]));
    sm = _mm512_dpwssd_epi32(sm, mp[2], _mm512_set1_epi32(pairs[2]));
    return _mm512_dpwssd_epi32(sm, mp[3], _mm512_set1_epi32(pairs[3]));
}

// The int16 pairs of a Q8_K block's 32-value sums B[j] = bsums[2j] + bsums[2j+1]
// (|B| <= 32 * 127: no saturation), as q4k_summs takes them.
inline void q4k_pairs(const BlockQ8_K& y, int32_t* pairs) {
    const __m256i v = _mm256_madd_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), _mm256_set1_epi16(1));
    const __m256i p = _mm256_packs_epi32(v, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
}

// Q6_K levels u6 = low nibble | top bits << 4 of row j (0..3) of a chunk of
// the repacked layout, from l = its ql (j even) or ql1 (j odd) vector and qh.
template <int J>
inline __m512i q6k_level(__m512i l, __m512i qh) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    if constexpr (J == 0)
        return _mm512_ternarylogic_epi32(_mm512_and_si512(l, low4), _mm512_slli_epi16(qh, 4), top2,
                                         0xD8);
    else if constexpr (J == 1)
        return _mm512_ternarylogic_epi32(_mm512_and_si512(l, low4), _mm512_slli_epi16(qh, 2), top2,
                                         0xD8);
    else if constexpr (J == 2)
        return _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4), qh, top2,
                                         0xD8);
    else
        return _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                         _mm512_srli_epi16(qh, 2), top2, 0xD8);
}

// Scale of Q6_K sub-block 8h + 2j + ch in the 16 lanes: word ch of each row's pair.
inline __m512i q6k_scale(const Q6KGroupBlock& g, int h, int j, int ch) {
    const __m512i pair = _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.scales[4 * h + j])));
    return ch == 0 ? _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16)
                   : _mm512_srai_epi32(pair, 16);
}

}  // namespace glm5::quant::repacked

// Internal: AVX-512 (BW/VL/DQ/VNNI) kernels of one k-quant super-block
// against one Q8_K block; same contract as kq_avx2.h (exact integer parts,
// finished in float by kq_finish, so results are bit-identical to the scalar
// reference). 64 values per register: u8 levels x s8 activations with
// vpmaddubsw, then vpdpwssd applies the 16-bit sub-block scales and
// accumulates. Include only from *_avx512.cpp files.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "kq_avx512.h needs -mavx512f -mavx512bw -mavx512vnni"
#endif

#include "quant/kq_avx2.h"

namespace glm5::quant::avx512 {

using avx2::KSums;

inline __m512i load512(const void* p) {
    return _mm512_loadu_si512(p);
}
inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16-bit scale vector for four 16-value sub-blocks j0..j0+3 (one per 128-bit
// lane, 8 int16 each) from 16 int8 scales in s.
inline __m512i scales_x4(__m128i s, int j0) {
    const __m256i both = _mm256_broadcastsi128_si256(s);
    const __m256i idx = _mm256_setr_epi8(j0, j0, j0, j0, j0, j0, j0, j0, j0 + 1, j0 + 1, j0 + 1,
                                         j0 + 1, j0 + 1, j0 + 1, j0 + 1, j0 + 1, j0 + 2, j0 + 2,
                                         j0 + 2, j0 + 2, j0 + 2, j0 + 2, j0 + 2, j0 + 2, j0 + 3,
                                         j0 + 3, j0 + 3, j0 + 3, j0 + 3, j0 + 3, j0 + 3, j0 + 3);
    return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(both, idx));
}

// Same for two 32-value sub-blocks a (lanes 0-1) and b (lanes 2-3) from 8
// unsigned scales in the low bytes of s.
inline __m512i scales_x2(__m128i s, int a, int b) {
    const __m128i idx = _mm_setr_epi8(a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a);
    const __m128i idy = _mm_setr_epi8(b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b);
    const __m256i bytes = _mm256_set_m128i(_mm_shuffle_epi8(s, idy), _mm_shuffle_epi8(s, idx));
    return _mm512_cvtepu8_epi16(bytes);
}

// Fold a 512-bit int32 accumulator to 256 bits (for avx2::hsum_pair).
inline __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// Levels x activations, scaled and accumulated.
inline __m512i mac(__m512i acc, __m512i u8, __m512i s8, __m512i scales) {
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u8, s8), scales);
}

template <bool kFive, typename Block>
inline KSums q45_K_block(const Block& x, const BlockQ8_K& y) {
    uint32_t sc[2], mn[2];
    avx2::k4_scales_mins(x.scales, sc, mn);
    const __m128i s8 = _mm_set_epi32(0, 0, int(sc[1]), int(sc[0]));
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i qh = _mm512_setzero_si512();
    if constexpr (kFive) qh = _mm512_broadcast_i64x4(load256(x.qh));
    __m512i acc = _mm512_setzero_si512();
    // 128 values per step: qs bytes 64p..64p+63 hold sub-blocks 4p, 4p+2 in the
    // low nibbles and 4p+1, 4p+3 in the high nibbles.
    for (int p = 0; p < 2; ++p) {
        const __m512i q = load512(x.qs + 64 * p);
        __m512i lo = _mm512_and_si512(q, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
        if constexpr (kFive) {
            // Fifth bits: bit j of qh[l] for sub-block j, set with a masked byte
            // add (the bit is clear; AVX-512BW has no byte-masked OR).
            const __m512i blo = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * p))),
                                                   _mm256_set1_epi8(char(1 << (4 * p + 2))), 1);
            const __m512i bhi = _mm512_inserti64x4(_mm512_set1_epi8(char(2 << (4 * p))),
                                                   _mm256_set1_epi8(char(2 << (4 * p + 2))), 1);
            const __m512i sixteen = _mm512_set1_epi8(16);
            lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bhi), hi, sixteen);
        }
        const __m512i y0 = load512(y.qs + 128 * p);       // sub-blocks 4p, 4p+1
        const __m512i y1 = load512(y.qs + 128 * p + 64);  // sub-blocks 4p+2, 4p+3
        const __m512i ylo = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i yhi = _mm512_shuffle_i64x2(y0, y1, _MM_SHUFFLE(3, 2, 3, 2));
        acc = mac(acc, lo, ylo, scales_x2(s8, 4 * p, 4 * p + 2));
        acc = mac(acc, hi, yhi, scales_x2(s8, 4 * p + 1, 4 * p + 3));
    }
    return avx2::hsum_pair(fold(acc), avx2::mins_times_bsums(mn, y.bsums));
}

inline KSums q4_K_block(const BlockQ4_K& x, const BlockQ8_K& y) {
    return q45_K_block<false>(x, y);
}
inline KSums q5_K_block(const BlockQ5_K& x, const BlockQ8_K& y) {
    return q45_K_block<true>(x, y);
}

// Per 128-value half of Q2_K/Q3_K: the four 2-bit fields of qs as two
// registers, [bits 0-1 | bits 2-3] (values 0-63) and [bits 4-5 | bits 6-7].
inline void two_bit_fields(const uint8_t* qs, __m512i* a, __m512i* b) {
    const __m512i q = _mm512_broadcast_i64x4(load256(qs));
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i sh_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh_b = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    *a = _mm512_and_si512(_mm512_srlv_epi16(q, sh_a), three);
    *b = _mm512_and_si512(_mm512_srlv_epi16(q, sh_b), three);
}

inline KSums q2_K_block(const BlockQ2_K& x, const BlockQ8_K& y) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m128i sc = _mm_and_si128(raw, nib);
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), nib));
    const __m256i summs = _mm256_madd_epi16(load256(y.bsums), mn16);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
        __m512i a, b;
        two_bit_fields(x.qs + 32 * h, &a, &b);
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc, 8 * h + 4));
    }
    return avx2::hsum_pair(fold(acc), summs);
}

// Q3_K: u3 = low2 | hbit<<2, q = u3 - 4 (see kq_avx2.h).
inline KSums q3_K_block(const BlockQ3_K& x, const BlockQ8_K& y) {
    __m256i sc16;
    avx2::q3k_scales16(x.scales, &sc16);
    const __m256i corr = _mm256_madd_epi16(load256(y.bsums), sc16);
    // The same 16 scales as int8 for scales_x4.
    const __m128i sc8 =
        _mm_packs_epi16(_mm256_castsi256_si128(sc16), _mm256_extracti128_si256(sc16, 1));
    const __m512i hm = _mm512_broadcast_i64x4(load256(x.hmask));
    const __m512i four = _mm512_set1_epi8(4);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
        __m512i a, b;
        two_bit_fields(x.qs + 32 * h, &a, &b);
        // Third bits: bit 4h+s of hmask[l] for field s.
        const __m512i ba = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * h))),
                                              _mm256_set1_epi8(char(1 << (4 * h + 1))), 1);
        const __m512i bb = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (4 * h + 2))),
                                              _mm256_set1_epi8(char(1 << (4 * h + 3))), 1);
        a = _mm512_mask_add_epi8(a, _mm512_test_epi8_mask(hm, ba), a, four);
        b = _mm512_mask_add_epi8(b, _mm512_test_epi8_mask(hm, bb), b, four);
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc8, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc8, 8 * h + 4));
    }
    const KSums s = avx2::hsum_pair(fold(acc), corr);
    return {s.isum - 4 * s.summs, 0};
}

// Q6_K: u6 = low4 | top2<<4, q = u6 - 32.
inline KSums q6_K_block(const BlockQ6_K& x, const BlockQ8_K& y) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m256i corr = _mm256_madd_epi16(load256(y.bsums), _mm256_cvtepi8_epi16(sc8));
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i top2 = _mm512_set1_epi8(0x30);
    // Per half: fields s=0,1 take qh bits 0-1 / 2-3 (shift left 4 / 2), fields
    // s=2,3 take bits 4-5 / 6-7 (shift right 0 / 2).
    const __m512i sh_a = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
        const __m512i l = load512(x.ql + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(load256(x.qh + 32 * h));
        const __m512i a = _mm512_or_si512(_mm512_and_si512(l, low4),
                                          _mm512_and_si512(_mm512_sllv_epi16(qh, sh_a), top2));
        const __m512i b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), top2));
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc8, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc8, 8 * h + 4));
    }
    const KSums s = avx2::hsum_pair(fold(acc), corr);
    return {s.isum - 32 * s.summs, 0};
}

}  // namespace glm5::quant::avx512

// Internal: AVX-512 (BW/VL/DQ/VNNI) kernels of one k-quant super-block
// against one Q8_K block, with the contract of kq_avx2.h (exact integer parts
// as KVec lanes, reduced and scaled like the scalar reference, so results are
// bit-identical to it). 64 values per register: u8 levels x s8 activations
// with vpmaddubsw, then vpdpwssd applies the 16-bit sub-block scales and
// accumulates. Include only from *_avx512.cpp files.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "kq_avx512.h needs -mavx512f -mavx512bw -mavx512vnni"
#endif

#include "quant/kq_avx2.h"

namespace glm5::quant::avx512 {

using avx2::KSums;
using avx2::KVec;

inline __m512i load512(const void* p) {
    return _mm512_loadu_si512(p);
}
inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16-bit scale vector for four 16-value sub-blocks j0..j0+3 (8 int16 lanes
// each, one per 128-bit lane) from 16 int16 scales.
inline __m512i scales_x4(__m256i sc16, int j0) {
    const __m512i idx =
        _mm512_add_epi16(_mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1,
                                          1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                         _mm512_set1_epi16(short(j0)));
    return _mm512_permutexvar_epi16(idx, _mm512_zextsi256_si512(sc16));
}

// The same for two 32-value sub-blocks a (lanes 0-1) and b (lanes 2-3) from 8
// int16 scales.
inline __m512i scales_x2(__m128i sc16, int a, int b) {
    const __m512i idx =
        _mm512_inserti64x4(_mm512_set1_epi16(short(a)), _mm256_set1_epi16(short(b)), 1);
    return _mm512_permutexvar_epi16(idx, _mm512_zextsi128_si512(sc16));
}

// v | (bit b0 of each byte of src moved to bit `to`, in the low 256 bits; bit
// b1 in the high 256 bits). 16-bit shifts are safe: after the mask each result
// bit comes from its own byte.
template <int b0, int b1, int to>
inline __m512i or_moved_bits(__m512i v, __m512i src) {
    constexpr bool right = b0 >= to && b1 >= to;
    static_assert(right || (b0 <= to && b1 <= to), "both bits must move the same way");
    const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16(right ? b0 - to : to - b0),
                                           _mm256_set1_epi16(right ? b1 - to : to - b1), 1);
    const __m512i moved = right ? _mm512_srlv_epi16(src, cnt) : _mm512_sllv_epi16(src, cnt);
    return _mm512_ternarylogic_epi32(v, moved, _mm512_set1_epi8(char(1 << to)),
                                     0xF8);  // v | (moved & bit)
}

// Fold a 512-bit int32 accumulator to 256 bits (for avx2::hsum_pair).
inline __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// Levels x activations, scaled and accumulated.
inline __m512i mac(__m512i acc, __m512i u8, __m512i s8, __m512i scales) {
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u8, s8), scales);
}

// Q4_K / Q5_K keep the AVX2 layout (one 32-byte load of levels covers two
// sub-blocks) with 256-bit VNNI: vpdpwssd applies the scale and accumulates in
// one instruction. A 512-bit version needed extra shuffles of the activations
// and measured slower where 512-bit ops are double-pumped (Zen 4).
template <bool kFive, typename Block>
inline KVec q45_K_block(const Block& x, const BlockQ8_K& y) {
    uint32_t sc[2], mn[2];
    avx2::k4_scales_mins(x.scales, sc, mn);
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(sc[1]), int(sc[0])));
    const __m256i scales = _mm256_broadcastsi128_si256(sc16);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load256(x.qh);
    __m256i acc = _mm256_setzero_si256();
    auto step = [&]<int k>() {
        const __m256i q = load256(x.qs + 32 * k);
        __m256i lo = _mm256_and_si256(q, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if constexpr (kFive) {
            lo = _mm256_or_si256(lo, avx2::move_bit<2 * k, 4>(qh));
            hi = _mm256_or_si256(hi, avx2::move_bit<2 * k + 1, 4>(qh));
        }
        acc = _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(lo, load256(y.qs + 64 * k)),
                                  _mm256_shuffle_epi8(scales, avx2::scale_one_mask(2 * k)));
        acc = _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(hi, load256(y.qs + 64 * k + 32)),
                                  _mm256_shuffle_epi8(scales, avx2::scale_one_mask(2 * k + 1)));
    };
    step.template operator()<0>();
    step.template operator()<1>();
    step.template operator()<2>();
    step.template operator()<3>();
    return {acc, avx2::mins_times_bsums(mn, y.bsums)};
}

inline KVec q4_K_block(const BlockQ4_K& x, const BlockQ8_K& y) {
    return q45_K_block<false>(x, y);
}
inline KVec q5_K_block(const BlockQ5_K& x, const BlockQ8_K& y) {
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

inline KVec q2_K_block(const BlockQ2_K& x, const BlockQ8_K& y) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, nib));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), nib));
    const __m256i summs = _mm256_madd_epi16(load256(y.bsums), mn16);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
        __m512i a, b;
        two_bit_fields(x.qs + 32 * h, &a, &b);
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc16, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc16, 8 * h + 4));
    }
    return {fold(acc), summs};
}

// Q3_K: u3 = low2 | hbit<<2, q = u3 - 4 (see kq_avx2.h).
inline KVec q3_K_block(const BlockQ3_K& x, const BlockQ8_K& y) {
    __m256i sc16;
    avx2::q3k_scales16(x.scales, &sc16);
    const __m256i corr = _mm256_madd_epi16(load256(y.bsums), sc16);
    const __m512i hm = _mm512_broadcast_i64x4(load256(x.hmask));
    __m512i acc = _mm512_setzero_si512();
    auto half = [&]<int h>() {
        __m512i a, b;
        two_bit_fields(x.qs + 32 * h, &a, &b);
        // Third bits: bit 4h+s of hmask[l] for field s.
        a = or_moved_bits<4 * h, 4 * h + 1, 2>(a, hm);
        b = or_moved_bits<4 * h + 2, 4 * h + 3, 2>(b, hm);
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc16, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc16, 8 * h + 4));
    };
    half.template operator()<0>();
    half.template operator()<1>();
    // sum(u*q8) - 4*sum(q8), per sub-block scale: exact in int32.
    return {_mm256_sub_epi32(fold(acc), _mm256_slli_epi32(corr, 2)), _mm256_setzero_si256()};
}

// Q6_K: u6 = low4 | top2<<4, q = u6 - 32.
inline KVec q6_K_block(const BlockQ6_K& x, const BlockQ8_K& y) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m256i corr = _mm256_madd_epi16(load256(y.bsums), sc16);
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
        acc = mac(acc, a, load512(y.qs + 128 * h), scales_x4(sc16, 8 * h));
        acc = mac(acc, b, load512(y.qs + 128 * h + 64), scales_x4(sc16, 8 * h + 4));
    }
    // sum(u*q8) - 32*sum(q8), per sub-block scale: exact in int32.
    return {_mm256_sub_epi32(fold(acc), _mm256_slli_epi32(corr, 5)), _mm256_setzero_si256()};
}

}  // namespace glm5::quant::avx512

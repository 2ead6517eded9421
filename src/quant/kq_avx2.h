// Internal: AVX2 kernels of one k-quant super-block against one Q8_K block.
// Each returns the exact integer parts of the block's dot product as two
// vectors of 8 int32 lanes (KVec) whose lane sums are
//   isum  = sum over sub-blocks of scale * sum(q * q8)
//   summs = sum over sub-blocks of min * sum(q8)   (0 for formats without mins)
// The caller reduces them and scales them in float exactly as the scalar
// reference in kquants.cpp does (kq_finish), so every ISA returns
// bit-identical dot products. Include only from files compiled with AVX2 (see
// simd_avx2.h); matmul kernels may reuse the per-block functions.
#pragma once

#include <algorithm>

#include "quant/simd_avx2.h"

namespace glm5::quant::avx2 {

struct KSums {
    int isum;
    int summs;
};

struct KVec {
    __m256i isum;
    __m256i summs;
};

// Both horizontal sums at once.
inline KSums hsum_pair(__m256i a, __m256i b) {
    const __m256i t = _mm256_hadd_epi32(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    s = _mm_hadd_epi32(s, s);  // A B A B
    return {_mm_cvtsi128_si32(s), _mm_extract_epi32(s, 1)};
}

inline KSums reduce(const KVec& v) {
    return hsum_pair(v.isum, v.summs);
}

// Lane sums of four vectors: {sum a, sum b, sum c, sum d}.
inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

// sum += (d * isum) - (dmin * summs), two roundings per product, no FMA:
// the same float operations as the scalar reference.
inline float kq_finish(float acc, float d, int isum, float dmin, int summs) {
    return acc + (unfused(d * float(isum)) - unfused(dmin * float(summs)));
}
inline float kq_finish(float acc, float d, int isum) {
    return acc + unfused(d * float(isum));
}

// Shuffle masks that spread 16-bit scales over 16-value sub-blocks: for group
// g (32 values = sub-blocks 2g, 2g+1 of an 8-scale set), the low 128-bit lane
// gets scale 2g, the high lane scale 2g+1 (8 int16 lanes each).
inline __m256i scale_pair_mask(int g) {
    const int a = 4 * g, b = 4 * g + 2;
    return _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                            a + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b,
                            b + 1, b, b + 1);
}

// For 32-value sub-blocks (Q4_K/Q5_K): all 16 int16 lanes get scale j.
inline __m256i scale_one_mask(int j) {
    const int a = 2 * j;
    return _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                            a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                            a + 1, a, a + 1);
}

// Scales 8h..8h+7 of 16 int16 scales, in both 128-bit lanes.
inline __m256i scales_of_half(__m256i sc16, int h) {
    return h ? _mm256_permute4x64_epi64(sc16, 0xEE) : _mm256_permute4x64_epi64(sc16, 0x44);
}

// Bit `bit` of every byte moved to bit position `to` (other bits cleared).
// 16-bit shifts are safe: after the mask each result bit comes from its own byte.
template <int bit, int to>
inline __m256i move_bit(__m256i v) {
    const __m256i m = _mm256_set1_epi8(char(1 << to));
    if constexpr (bit > to)
        return _mm256_and_si256(_mm256_srli_epi16(v, bit - to), m);
    else if constexpr (bit < to)
        return _mm256_and_si256(_mm256_slli_epi16(v, to - bit), m);
    else
        return _mm256_and_si256(v, m);
}

// Q4_K / Q5_K scales and mins: 8 x 6 bits each from 12 bytes (see common.h).
inline void k4_scales_mins(const uint8_t* packed, uint32_t sc[2], uint32_t mn[2]) {
    uint32_t u[3];
    std::memcpy(u, packed, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    sc[0] = u[0] & m6;
    mn[0] = u[1] & m6;
    sc[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    mn[1] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
}

// sum over j of m[j] * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes.
inline __m256i mins_times_bsums(const uint32_t mn[2], const int16_t* bsums) {
    const __m128i m8 = _mm_set_epi32(0, 0, int(mn[1]), int(mn[0]));
    const __m128i dup =
        _mm_shuffle_epi8(m8, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    const __m256i m16 = _mm256_cvtepu8_epi16(dup);
    return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)), m16);
}

template <bool kFive, typename Block>
inline KVec q45_K_block(const Block& x, const BlockQ8_K& y) {
    uint32_t sc[2], mn[2];
    k4_scales_mins(x.scales, sc, mn);
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(sc[1]), int(sc[0])));
    const __m256i scales = _mm256_broadcastsi128_si256(sc16);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh));
    __m256i acc = _mm256_setzero_si256();
    auto step = [&]<int k>() {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
        __m256i lo = _mm256_and_si256(q, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if constexpr (kFive) {
            lo = _mm256_or_si256(lo, move_bit<2 * k, 4>(qh));
            hi = _mm256_or_si256(hi, move_bit<2 * k + 1, 4>(qh));
        }
        const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * k));
        const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * k + 32));
        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0),
                                             _mm256_shuffle_epi8(scales, scale_one_mask(2 * k)));
        const __m256i p1 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, y1), _mm256_shuffle_epi8(scales, scale_one_mask(2 * k + 1)));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    };
    step.template operator()<0>();
    step.template operator()<1>();
    step.template operator()<2>();
    step.template operator()<3>();
    return {acc, mins_times_bsums(mn, y.bsums)};
}

inline KVec q4_K_block(const BlockQ4_K& x, const BlockQ8_K& y) {
    return q45_K_block<false>(x, y);
}
inline KVec q5_K_block(const BlockQ5_K& x, const BlockQ8_K& y) {
    return q45_K_block<true>(x, y);
}

// Q2_K: 2-bit q in [0, 3], 4-bit scale (low nibble) and min (high nibble) per
// 16 values.
inline KVec q2_K_block(const BlockQ2_K& x, const BlockQ8_K& y) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, nib));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), nib));
    const __m256i summs =
        _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), mn16);
    const __m256i two = _mm256_set1_epi8(3);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
        const __m256i sc = scales_of_half(sc16, h);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h));
        const int8_t* q8 = y.qs + 128 * h;
        auto group = [&](__m256i v, int g) {
            const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g));
            return _mm256_madd_epi16(_mm256_maddubs_epi16(v, yv),
                                     _mm256_shuffle_epi8(sc, scale_pair_mask(g)));
        };
        const __m256i p0 = group(_mm256_and_si256(q, two), 0);
        const __m256i p1 = group(_mm256_and_si256(_mm256_srli_epi16(q, 2), two), 1);
        const __m256i p2 = group(_mm256_and_si256(_mm256_srli_epi16(q, 4), two), 2);
        const __m256i p3 = group(_mm256_and_si256(_mm256_srli_epi16(q, 6), two), 3);
        acc = _mm256_add_epi32(
            acc, _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
    }
    return {acc, summs};
}

// Q3_K: q = low2 + 4*hbit - 4, so sum(q*q8) = sum(u3*q8) - 4*bsum with
// u3 = low2 | hbit<<2 in [0, 7]; the -4*bsum parts come from the Q8_K sums.
inline void q3k_scales16(const uint8_t* packed, __m256i* sc16) {
    uint32_t u[3];
    std::memcpy(u, packed, 12);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i s = _mm_setr_epi32(int((u[0] & m4) | ((u[2] & m2) << 4)),
                                     int((u[1] & m4) | (((u[2] >> 2) & m2) << 4)),
                                     int(((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4)),
                                     int(((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4)));
    *sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(s, _mm_set1_epi8(32)));
}

inline KVec q3_K_block(const BlockQ3_K& x, const BlockQ8_K& y) {
    __m256i sc16;
    q3k_scales16(x.scales, &sc16);
    // 4 * sum_j scale_j * bsums_j, subtracted at the end.
    const __m256i corr =
        _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), sc16);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask));
    const __m256i two = _mm256_set1_epi8(3);
    __m256i acc = _mm256_setzero_si256();
    auto half = [&]<int h>() {
        const __m256i sc = scales_of_half(sc16, h);
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h));
        const int8_t* q8 = y.qs + 128 * h;
        auto group = [&](__m256i v, int g) {
            const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g));
            return _mm256_madd_epi16(_mm256_maddubs_epi16(v, yv),
                                     _mm256_shuffle_epi8(sc, scale_pair_mask(g)));
        };
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(q, two), move_bit<4 * h + 0, 2>(hm));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2), two),
                                           move_bit<4 * h + 1, 2>(hm));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), two),
                                           move_bit<4 * h + 2, 2>(hm));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 6), two),
                                           move_bit<4 * h + 3, 2>(hm));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_add_epi32(group(u0, 0), group(u1, 1)),
                                                     _mm256_add_epi32(group(u2, 2), group(u3, 3))));
    };
    half.template operator()<0>();
    half.template operator()<1>();
    // sum(u*q8) - 4*sum(q8), per sub-block scale: exact in int32.
    return {_mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 2)), _mm256_setzero_si256()};
}

// Q6_K: q = u6 - 32 with u6 in [0, 63]; sum(q*q8) = sum(u6*q8) - 32*bsum.
inline KVec q6_K_block(const BlockQ6_K& x, const BlockQ8_K& y) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m256i corr =
        _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)), sc16);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i top2 = _mm256_set1_epi8(0x30);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
        const __m256i sc = scales_of_half(sc16, h);
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h));
        const int8_t* q8 = y.qs + 128 * h;
        auto group = [&](__m256i v, int g) {
            const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g));
            return _mm256_madd_epi16(_mm256_maddubs_epi16(v, yv),
                                     _mm256_shuffle_epi8(sc, scale_pair_mask(g)));
        };
        const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
        const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                           _mm256_and_si256(qh, top2));
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_add_epi32(group(u0, 0), group(u1, 1)),
                                                     _mm256_add_epi32(group(u2, 2), group(u3, 3))));
    }
    // sum(u*q8) - 32*sum(q8), per sub-block scale: exact in int32.
    return {_mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 5)), _mm256_setzero_si256()};
}

// One row: super-blocks in pairs share one reduction. Per super-block the
// float steps are the reference's: d = fp16(x.d) * y.d, then
// sum += d * isum - dmin * summs (each product rounded, no FMA), in order.
template <typename Block, KVec (*Kernel)(const Block&, const BlockQ8_K&), bool kMins>
inline float kq_dot_row(int64_t n, const Block* x, const BlockQ8_K* y) {
    const int64_t nb = n / QK_K;
    float sum = 0;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const KVec a = Kernel(x[i], y[i]), b = Kernel(x[i + 1], y[i + 1]);
        if constexpr (kMins) {
            const __m128i s = hsum4(a.isum, a.summs, b.isum, b.summs);
            const __m128 dx =
                _mm_cvtph_ps(_mm_setr_epi16(short(x[i].d), short(x[i].dmin), short(x[i + 1].d),
                                            short(x[i + 1].dmin), 0, 0, 0, 0));
            const __m128 dy = _mm_setr_ps(y[i].d, y[i].d, y[i + 1].d, y[i + 1].d);
            const __m128 p = _mm_mul_ps(_mm_mul_ps(dx, dy), _mm_cvtepi32_ps(s));
            const __m128 t = _mm_hsub_ps(p, p);  // d*isum - dmin*summs of both blocks
            sum = sum + _mm_cvtss_f32(t);
            sum = sum + _mm_cvtss_f32(_mm_movehdup_ps(t));
        } else {
            const __m128i s = hsum4(a.isum, b.isum, a.isum, b.isum);
            const __m128 dx =
                _mm_cvtph_ps(_mm_setr_epi16(short(x[i].d), short(x[i + 1].d), 0, 0, 0, 0, 0, 0));
            const __m128 dy = _mm_setr_ps(y[i].d, y[i + 1].d, 0, 0);
            const __m128 p = _mm_mul_ps(_mm_mul_ps(dx, dy), _mm_cvtepi32_ps(s));
            sum = sum + _mm_cvtss_f32(p);
            sum = sum + _mm_cvtss_f32(_mm_movehdup_ps(p));
        }
    }
    if (i < nb) {
        const KSums s = reduce(Kernel(x[i], y[i]));
        if constexpr (kMins)
            sum = kq_finish(sum, fp16_scalar(x[i].d) * y[i].d, s.isum,
                            fp16_scalar(x[i].dmin) * y[i].d, s.summs);
        else
            sum = kq_finish(sum, fp16_scalar(x[i].d) * y[i].d, s.isum);
    }
    return sum;
}

// ---- several activation rows against one weight row (prefill) ----------
// A super-block decoded once: the unsigned quant bytes of its eight 32-value
// groups and the int16 scale of each group's lanes, plus what the activation
// side's correction needs (Q4_K/Q5_K mins, Q6_K scales). Every activation
// row then costs only its multiplies; the integer sums are exact, so they
// equal the single-row kernel's whatever the order of the additions.
struct KDecoded {
    __m256i q[8];
    __m256i sc[8];
    __m256i sc16;
    uint32_t mn[2];
};

template <bool kFive, typename Block>
inline void decode_q45_K(const Block& x, KDecoded& d) {
    uint32_t sc[2];
    k4_scales_mins(x.scales, sc, d.mn);
    const __m256i scales =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(sc[1]), int(sc[0]))));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh));
    auto step = [&]<int k>() {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * k));
        __m256i lo = _mm256_and_si256(q, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if constexpr (kFive) {
            lo = _mm256_or_si256(lo, move_bit<2 * k, 4>(qh));
            hi = _mm256_or_si256(hi, move_bit<2 * k + 1, 4>(qh));
        }
        d.q[2 * k] = lo;
        d.q[2 * k + 1] = hi;
        d.sc[2 * k] = _mm256_shuffle_epi8(scales, scale_one_mask(2 * k));
        d.sc[2 * k + 1] = _mm256_shuffle_epi8(scales, scale_one_mask(2 * k + 1));
    };
    step.template operator()<0>();
    step.template operator()<1>();
    step.template operator()<2>();
    step.template operator()<3>();
}
inline void decode_q4_K(const BlockQ4_K& x, KDecoded& d) {
    decode_q45_K<false>(x, d);
}
inline void decode_q5_K(const BlockQ5_K& x, KDecoded& d) {
    decode_q45_K<true>(x, d);
}

inline void decode_q6_K(const BlockQ6_K& x, KDecoded& d) {
    d.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i top2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
        const __m256i sc = scales_of_half(d.sc16, h);
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h));
        d.q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
        d.q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
        d.q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                         _mm256_and_si256(qh, top2));
        d.q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
        for (int g = 0; g < 4; ++g) d.sc[4 * h + g] = _mm256_shuffle_epi8(sc, scale_pair_mask(g));
    }
}

// The KVec of a decoded block against one Q8_K block: Q4_K/Q5_K with their
// mins, Q6_K with its -32 offset taken from the activation sums.
template <bool kSix>
inline KVec apply_decoded(const KDecoded& d, const BlockQ8_K& y) {
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 32 * g));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(d.q[g], yv), d.sc[g]));
    }
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
    if constexpr (kSix)
        return {_mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(bsums, d.sc16), 5)),
                _mm256_setzero_si256()};
    else
        return {acc, mins_times_bsums(d.mn, y.bsums)};
}

// apply_decoded for two activation rows at once: each decoded vector is
// loaded once for both.
template <bool kSix>
inline void apply_decoded2(const KDecoded& d, const BlockQ8_K& y0, const BlockQ8_K& y1, KVec& r0,
                           KVec& r1) {
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m256i q = d.q[g], sc = d.sc[g];
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y0.qs + 32 * g));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y1.qs + 32 * g));
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(q, v0), sc));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(q, v1), sc));
    }
    auto finish = [&](__m256i acc, const BlockQ8_K& y) -> KVec {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
        if constexpr (kSix)
            return {_mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(bsums, d.sc16), 5)),
                    _mm256_setzero_si256()};
        else
            return {acc, mins_times_bsums(d.mn, y.bsums)};
    };
    r0 = finish(a0, y0);
    r1 = finish(a1, y1);
}

// kq_dot_row for n_act activation rows `stride` bytes apart: each weight
// super-block decoded once, then per row the integer sums and exactly
// kq_dot_row's float steps (pairs of super-blocks, the same roundings).
template <typename Block, void (*Decode)(const Block&, KDecoded&), bool kMins>
inline void kq_dot_multi(int64_t n, const Block* x, const uint8_t* a, size_t stride, int64_t n_act,
                         float* out) {
    const int64_t nb = n / QK_K;
    auto act = [&](int64_t t) {
        return reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * stride);
    };
    for (int64_t t = 0; t < n_act; ++t) out[t] = 0.0f;
    KDecoded da, db;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        Decode(x[i], da);
        Decode(x[i + 1], db);
        for (int64_t t0 = 0; t0 < n_act; t0 += 2) {
            KVec kv[2][2];
            const int64_t nt = std::min<int64_t>(2, n_act - t0);
            if (nt == 2) {
                apply_decoded2<!kMins>(da, act(t0)[i], act(t0 + 1)[i], kv[0][0], kv[1][0]);
                apply_decoded2<!kMins>(db, act(t0)[i + 1], act(t0 + 1)[i + 1], kv[0][1], kv[1][1]);
            } else {
                kv[0][0] = apply_decoded<!kMins>(da, act(t0)[i]);
                kv[0][1] = apply_decoded<!kMins>(db, act(t0)[i + 1]);
            }
            for (int64_t t = t0; t < t0 + nt; ++t) {
                const BlockQ8_K* y = act(t);
                const KVec ka = kv[t - t0][0], kb = kv[t - t0][1];
                float sum = out[t];
                if constexpr (kMins) {
                    const __m128i s = hsum4(ka.isum, ka.summs, kb.isum, kb.summs);
                    const __m128 dx = _mm_cvtph_ps(
                        _mm_setr_epi16(short(x[i].d), short(x[i].dmin), short(x[i + 1].d),
                                       short(x[i + 1].dmin), 0, 0, 0, 0));
                    const __m128 dy = _mm_setr_ps(y[i].d, y[i].d, y[i + 1].d, y[i + 1].d);
                    const __m128 p = _mm_mul_ps(_mm_mul_ps(dx, dy), _mm_cvtepi32_ps(s));
                    const __m128 h = _mm_hsub_ps(p, p);
                    sum = sum + _mm_cvtss_f32(h);
                    sum = sum + _mm_cvtss_f32(_mm_movehdup_ps(h));
                } else {
                    const __m128i s = hsum4(ka.isum, kb.isum, ka.isum, kb.isum);
                    const __m128 dx = _mm_cvtph_ps(
                        _mm_setr_epi16(short(x[i].d), short(x[i + 1].d), 0, 0, 0, 0, 0, 0));
                    const __m128 dy = _mm_setr_ps(y[i].d, y[i + 1].d, 0, 0);
                    const __m128 p = _mm_mul_ps(_mm_mul_ps(dx, dy), _mm_cvtepi32_ps(s));
                    sum = sum + _mm_cvtss_f32(p);
                    sum = sum + _mm_cvtss_f32(_mm_movehdup_ps(p));
                }
                out[t] = sum;
            }
        }
    }
    if (i < nb) {
        Decode(x[i], da);
        for (int64_t t = 0; t < n_act; ++t) {
            const BlockQ8_K* y = act(t);
            const KSums s = reduce(apply_decoded<!kMins>(da, y[i]));
            if constexpr (kMins)
                out[t] = kq_finish(out[t], fp16_scalar(x[i].d) * y[i].d, s.isum,
                                   fp16_scalar(x[i].dmin) * y[i].d, s.summs);
            else
                out[t] = kq_finish(out[t], fp16_scalar(x[i].d) * y[i].d, s.isum);
        }
    }
}

}  // namespace glm5::quant::avx2

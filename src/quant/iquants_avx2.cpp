// AVX2 dot products of the i-quant formats against their activation rows.
// Same integer sums as the scalar references (iq1.cpp ... iq4.cpp); only the
// float accumulation order differs (per-lane partial sums, one horizontal sum).
//
// Building blocks: grid points are fetched with scalar loads into vector lanes
// (the grids are 1-16 KB, too large for in-register shuffles); signs become a
// byte mask applied to the activations with vpsignb; unsigned grid bytes times
// signed activations go through vpmaddubsw (no int16 overflow: |grid| <= 62)
// and the sub-block scale through vpmaddwd.
//
// Only intrinsics and data are used here: no inline functions shared with the
// baseline build (they could be emitted with AVX2 code and picked by the linker
// for baseline callers).
#include <immintrin.h>

#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_kernels.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

inline float fp16(uint16_t h) {
    return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline uint32_t load32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t load64(const void* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

// Four groups of 7 sign bits (bits 7k..7k+6) -> four sign bytes, each with an
// eighth bit that makes its count of set bits even (the ksigns_iq2xs rule).
inline uint32_t expand_signs7x4(uint32_t bits28) {
    const uint32_t v = _pdep_u32(bits28, 0x7f7f7f7fu);
    uint32_t p = v ^ (v >> 4);  // bit 0 of each byte ends up as the byte's parity
    p ^= p >> 2;
    p ^= p >> 1;
    return v | ((p & 0x01010101u) << 7);
}

// Sign bytes s0..s3 (one per 8 values) -> a vector that is -1 where the bit
// is set and +1 elsewhere, for vpsignb.
inline __m256i sign_vector(uint32_t s4) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0101010101010101, 0x0000000000000000);
    const __m256i bits = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(s4)), spread);
    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits);
    return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

inline __m256i grid8x4(const uint64_t* grid, int i0, int i1, int i2, int i3) {
    return _mm256_set_epi64x(int64_t(grid[i3]), int64_t(grid[i2]), int64_t(grid[i1]),
                             int64_t(grid[i0]));
}

inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// grid (u8) . (q8 with signs) -> 16 int16 pair sums, times a 16-bit scale per
// half (low 16 values: s_lo, high 16: s_hi) -> 8 int32.
inline __m256i dot32(__m256i grid, __m256i q8, __m256i sign, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(q8, sign)), scale16);
}

inline __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(int16_t(hi)), _mm_set1_epi16(int16_t(lo)));
}

}  // namespace

float dot_iq2_xxs_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_XXS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* q2 = reinterpret_cast<const uint8_t*>(x[i].qs);
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, q2 += 16, q8 += 64) {
            const uint32_t g1 = load32(q2), w1 = load32(q2 + 4);
            const uint32_t g2 = load32(q2 + 8), w2 = load32(q2 + 12);
            const __m256i grid1 =
                grid8x4(iq2xxs_grid, g1 & 255, (g1 >> 8) & 255, (g1 >> 16) & 255, g1 >> 24);
            const __m256i grid2 =
                grid8x4(iq2xxs_grid, g2 & 255, (g2 >> 8) & 255, (g2 >> 16) & 255, g2 >> 24);
            const int ls1 = 2 * int(w1 >> 28) + 1, ls2 = 2 * int(w2 >> 28) + 1;
            s1 = _mm256_add_epi32(
                s1, dot32(grid1, load256(q8), sign_vector(expand_signs7x4(w1 & 0x0fffffff)),
                          _mm256_set1_epi16(int16_t(ls1))));
            s2 = _mm256_add_epi32(
                s2, dot32(grid2, load256(q8 + 32), sign_vector(expand_signs7x4(w2 & 0x0fffffff)),
                          _mm256_set1_epi16(int16_t(ls2))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return 0.125f * hsum(acc);
}

float dot_iq2_xs_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_XS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint16_t* q2 = x[i].qs;
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, q2 += 8, q8 += 64) {
            const uint64_t w1 = load64(q2), w2 = load64(q2 + 4);
            const __m256i grid1 =
                grid8x4(iq2xs_grid, q2[0] & 511, q2[1] & 511, q2[2] & 511, q2[3] & 511);
            const __m256i grid2 =
                grid8x4(iq2xs_grid, q2[4] & 511, q2[5] & 511, q2[6] & 511, q2[7] & 511);
            // The 7 sign bits sit in bits 9..15 of each 16-bit entry.
            const uint32_t sg1 = expand_signs7x4(uint32_t(_pext_u64(w1, 0xfe00fe00fe00fe00ull)));
            const uint32_t sg2 = expand_signs7x4(uint32_t(_pext_u64(w2, 0xfe00fe00fe00fe00ull)));
            const uint8_t sc1 = x[i].scales[ib], sc2 = x[i].scales[ib + 1];
            s1 = _mm256_add_epi32(s1, dot32(grid1, load256(q8), sign_vector(sg1),
                                            scale_pair(2 * (sc1 & 15) + 1, 2 * (sc1 >> 4) + 1)));
            s2 = _mm256_add_epi32(s2, dot32(grid2, load256(q8 + 32), sign_vector(sg2),
                                            scale_pair(2 * (sc2 & 15) + 1, 2 * (sc2 >> 4) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return 0.125f * hsum(acc);
}

float dot_iq2_s_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].qs + QK_K / 8;
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, qs += 8, signs += 8, q8 += 64) {
            const int h1 = x[i].qh[ib], h2 = x[i].qh[ib + 1];
            const __m256i grid1 =
                grid8x4(iq2s_grid, qs[0] | ((h1 << 8) & 0x300), qs[1] | ((h1 << 6) & 0x300),
                        qs[2] | ((h1 << 4) & 0x300), qs[3] | ((h1 << 2) & 0x300));
            const __m256i grid2 =
                grid8x4(iq2s_grid, qs[4] | ((h2 << 8) & 0x300), qs[5] | ((h2 << 6) & 0x300),
                        qs[6] | ((h2 << 4) & 0x300), qs[7] | ((h2 << 2) & 0x300));
            const uint8_t sc1 = x[i].scales[ib], sc2 = x[i].scales[ib + 1];
            s1 = _mm256_add_epi32(s1, dot32(grid1, load256(q8), sign_vector(load32(signs)),
                                            scale_pair(2 * (sc1 & 15) + 1, 2 * (sc1 >> 4) + 1)));
            s2 = _mm256_add_epi32(s2, dot32(grid2, load256(q8 + 32), sign_vector(load32(signs + 4)),
                                            scale_pair(2 * (sc2 & 15) + 1, 2 * (sc2 >> 4) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return 0.125f * hsum(acc);
}

namespace {

inline __m256i grid4x8(const uint32_t* grid, const int* idx) {
    return _mm256_set_epi32(int(grid[idx[7]]), int(grid[idx[6]]), int(grid[idx[5]]),
                            int(grid[idx[4]]), int(grid[idx[3]]), int(grid[idx[2]]),
                            int(grid[idx[1]]), int(grid[idx[0]]));
}

}  // namespace

float dot_iq3_xxs_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ3_XXS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* q3 = x[i].qs;
        const uint8_t* sas = x[i].qs + QK_K / 4;
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, q3 += 16, sas += 8, q8 += 64) {
            int idx[16];
            for (int k = 0; k < 16; ++k) idx[k] = q3[k];
            const uint32_t w1 = load32(sas), w2 = load32(sas + 4);
            s1 = _mm256_add_epi32(s1, dot32(grid4x8(iq3xxs_grid, idx), load256(q8),
                                            sign_vector(expand_signs7x4(w1 & 0x0fffffff)),
                                            _mm256_set1_epi16(int16_t(2 * (w1 >> 28) + 1))));
            s2 = _mm256_add_epi32(s2, dot32(grid4x8(iq3xxs_grid, idx + 8), load256(q8 + 32),
                                            sign_vector(expand_signs7x4(w2 & 0x0fffffff)),
                                            _mm256_set1_epi16(int16_t(2 * (w2 >> 28) + 1))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return 0.25f * hsum(acc);
}

float dot_iq3_s_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ3_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].signs;
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2, qs += 16, signs += 8, q8 += 64) {
            int idx[16];
            for (int k = 0; k < 8; ++k) idx[k] = qs[k] | (((x[i].qh[ib] >> k) & 1) << 8);
            for (int k = 0; k < 8; ++k)
                idx[8 + k] = qs[8 + k] | (((x[i].qh[ib + 1] >> k) & 1) << 8);
            const uint8_t sc = x[i].scales[ib / 2];
            s1 = _mm256_add_epi32(
                s1, dot32(grid4x8(iq3s_grid, idx), load256(q8), sign_vector(load32(signs)),
                          _mm256_set1_epi16(int16_t(2 * (sc & 15) + 1))));
            s2 = _mm256_add_epi32(s2, dot32(grid4x8(iq3s_grid, idx + 8), load256(q8 + 32),
                                            sign_vector(load32(signs + 4)),
                                            _mm256_set1_epi16(int16_t(2 * (sc >> 4) + 1))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return hsum(acc);
}

// IQ1: the reconstruction g + delta (g in {-1,0,1}, delta = +-1/8) is handled
// exactly in integers as (8g + e)/8 with e = +-1, so one signed byte product
// per value: |8g+e| * sign(q8, 8g+e).
namespace {

inline __m256i iq1_values(__m256i g, __m256i e) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), e);
}

inline __m256i iq1_dot32(__m256i v, __m256i q8, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(q8, v)),
                             scale16);
}

}  // namespace

float dot_iq1_s_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ1_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const int8_t* q8 = a[i].qs;
        __m256i s = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, q8 += 32) {
            const uint16_t qh = x[i].qh[ib];
            const __m256i g =
                grid8x4(iq1s_grid, qs[0] | ((qh << 8) & 0x700), qs[1] | ((qh << 5) & 0x700),
                        qs[2] | ((qh << 2) & 0x700), qs[3] | ((qh >> 1) & 0x700));
            const __m256i e = _mm256_set1_epi8(qh & 0x8000 ? -1 : 1);
            s = _mm256_add_epi32(s,
                                 iq1_dot32(iq1_values(g, e), load256(q8),
                                           _mm256_set1_epi16(int16_t(2 * ((qh >> 12) & 7) + 1))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    return 0.125f * hsum(acc);
}

float dot_iq1_m_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ1_M*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sc[4];
        std::memcpy(sc, x[i].scales, 8);
        const uint16_t dbits = uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                        ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = fp16(dbits) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const uint8_t* qh = x[i].qh;
        const int8_t* q8 = a[i].qs;
        __m256i s = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, qh += 2, q8 += 32) {
            const int h0 = qh[0], h1 = qh[1];
            const __m256i g =
                grid8x4(iq1s_grid, qs[0] | ((h0 << 8) & 0x700), qs[1] | ((h0 << 4) & 0x700),
                        qs[2] | ((h1 << 8) & 0x700), qs[3] | ((h1 << 4) & 0x700));
            // Per group of 8: bytes of +1, or -1 (all bits set) for a negative delta.
            constexpr int64_t kPlus = 0x0101010101010101, kMinus = -1;
            const __m256i e =
                _mm256_set_epi64x(h1 & 0x80 ? kMinus : kPlus, h1 & 0x08 ? kMinus : kPlus,
                                  h0 & 0x80 ? kMinus : kPlus, h0 & 0x08 ? kMinus : kPlus);
            const int shift = 6 * (ib % 2);
            const int ls1 = 2 * ((sc[ib / 2] >> shift) & 7) + 1,
                      ls2 = 2 * ((sc[ib / 2] >> (shift + 3)) & 7) + 1;
            s = _mm256_add_epi32(s, iq1_dot32(iq1_values(g, e), load256(q8), scale_pair(ls1, ls2)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    return 0.125f * hsum(acc);
}

// IQ4: the 16 levels fit one vpshufb table; the signed level times the signed
// activation goes through vpmaddubsw as |level| * sign(q8, level).
namespace {

inline __m256i signed_dot32(__m256i v, __m256i q8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(q8, v)),
                             _mm256_set1_epi16(1));
}

// 16 packed bytes -> 32 level bytes: values 0..15 from the low nibbles, 16..31
// from the high nibbles.
inline __m256i unpack_iq4(const uint8_t* qs, __m256i table) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i nib =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(table, nib);
}

}  // namespace

float dot_iq4_nl_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_NL*>(vw);
    const auto* a = static_cast<const BlockQ8_0*>(va);
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    const int64_t nb = n / QK;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m256i p1 = signed_dot32(unpack_iq4(x[i].qs, table), load256(a[i].qs));
        const __m256i p2 = signed_dot32(unpack_iq4(x[i + 1].qs, table), load256(a[i + 1].qs));
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(a[i].d) * fp16(x[i].d)), _mm256_cvtepi32_ps(p1),
                               acc1);
        acc2 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(a[i + 1].d) * fp16(x[i + 1].d)),
                               _mm256_cvtepi32_ps(p2), acc2);
    }
    if (i < nb) {
        const __m256i p = signed_dot32(unpack_iq4(x[i].qs, table), load256(a[i].qs));
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(a[i].d) * fp16(x[i].d)), _mm256_cvtepi32_ps(p),
                               acc1);
    }
    return hsum(_mm256_add_ps(acc1, acc2));
}

float dot_iq4_xs_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_XS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl)));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const int8_t* q8 = a[i].qs;
        __m256i s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
        uint32_t h = x[i].scales_h;
        for (int ib = 0; ib < QK_K / 32; ib += 2, qs += 32, q8 += 64, h >>= 4) {
            const uint8_t sl = x[i].scales_l[ib / 2];
            const int ls1 = int((sl & 0xf) | ((h << 4) & 0x30)) - 32;
            const int ls2 = int((sl >> 4) | ((h << 2) & 0x30)) - 32;
            const __m256i v1 = unpack_iq4(qs, table), v2 = unpack_iq4(qs + 16, table);
            const __m256i p1 =
                _mm256_maddubs_epi16(_mm256_abs_epi8(v1), _mm256_sign_epi8(load256(q8), v1));
            const __m256i p2 =
                _mm256_maddubs_epi16(_mm256_abs_epi8(v2), _mm256_sign_epi8(load256(q8 + 32), v2));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, _mm256_set1_epi16(int16_t(ls1))));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(p2, _mm256_set1_epi16(int16_t(ls2))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s1, s2)), acc);
    }
    return hsum(acc);
}

}  // namespace glm5::quant::iq

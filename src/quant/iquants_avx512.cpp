// AVX-512 (F/BW/VL/DQ + VNNI; VBMI where present) dot products for the i-quant formats on the
// decode hot path: IQ2_XXS (the benchmark model's experts), IQ4_XS and IQ4_NL.
// 64 values per zmm. Signs become a 64-bit mask that negates activation bytes
// (AVX-512 has no vpsignb); byte products go through vpdpbusd (u8 x s8 -> s32)
// or vpmaddubsw + vpdpwssd when a 16-bit sub-block scale can ride along.
//
// Like the AVX2 file, only intrinsics and data: no inline functions shared with
// the baseline build.
#include <immintrin.h>

// GCC 12's AVX-512 headers seed pass-through operands with a self-initialised
// "undefined" vector, which -Wuninitialized reports at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_kernels.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

// 128-bit quarter k of v. The intrinsic takes an immediate only; with the
// callers' loops unrolled the switch folds to one extract (clang, unlike gcc,
// refuses a loop counter as the immediate even then).
inline __m128i quarter(__m512i v, int k) {
    switch (k) {
        case 0:
            return _mm512_extracti32x4_epi32(v, 0);
        case 1:
            return _mm512_extracti32x4_epi32(v, 1);
        case 2:
            return _mm512_extracti32x4_epi32(v, 2);
        default:
            return _mm512_extracti32x4_epi32(v, 3);
    }
}

inline float fp16(uint16_t h) {
    return _cvtsh_ss(h);
}

inline uint32_t load32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Eight groups of 7 sign bits -> a 64-bit mask of sign bytes, each completed
// with the even-parity eighth bit (see expand_signs7x4 in the AVX2 file).
inline __mmask64 signs7x8(uint64_t bits56) {
    const uint64_t v = _pdep_u64(bits56, 0x7f7f7f7f7f7f7f7full);
    uint64_t p = v ^ (v >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return _cvtu64_mask64(v | ((p & 0x0101010101010101ull) << 7));
}

}  // namespace

// IQ2_XXS. The grid lookup is done in registers: each of the 256 grid points
// is 8 magnitudes from {8, 25, 43}, i.e. a 16-bit code of 2-bit levels, and
// the 256 codes fit 8 zmm. Per super-block, the 32 indices are looked up with
// four vpermt2w (64 entries each) and a blend on index bits 6 and 7. Each code
// is then replicated to the 4 words of its group, shifted so that word w holds
// the levels of values 2w and 2w+1 in its low nibble, and mapped to magnitudes
// by vpshufb (even bytes take level 2w, odd bytes level 2w+1).
namespace {

struct Iq2xxsTables {
    alignas(64) uint16_t codes[256];
    alignas(64) uint16_t replicate[4][32];  // word -> code of its group, per 64-value chunk
    alignas(64) uint16_t scale_of[4][32];   // word -> scale lane (dword of its sub-block)
    alignas(64) uint16_t shift[32];         // 4 * (word within group)
    alignas(16) int8_t even[16], odd[16];   // nibble (l_even | l_odd << 2) -> magnitude
};

constexpr int iq2_level(int byte) {
    return byte == 8 ? 0 : byte == 25 ? 1 : 2;
}

constexpr Iq2xxsTables make_iq2xxs_tables() {
    Iq2xxsTables t{};
    for (int g = 0; g < 256; ++g) {
        int code = 0;
        for (int j = 0; j < 8; ++j)
            code |= iq2_level(int((iq2xxs_grid[g] >> (8 * j)) & 0xff)) << (2 * j);
        t.codes[g] = uint16_t(code);
    }
    for (int k = 0; k < 4; ++k)
        for (int w = 0; w < 32; ++w) {
            t.replicate[k][w] = uint16_t(8 * k + w / 4);
            t.scale_of[k][w] = uint16_t(2 * (2 * k + w / 16));
        }
    for (int w = 0; w < 32; ++w) t.shift[w] = uint16_t(4 * (w % 4));
    constexpr int8_t mag[4] = {8, 25, 43, 0};
    for (int m = 0; m < 16; ++m) t.even[m] = mag[m & 3], t.odd[m] = mag[m >> 2];
    return t;
}

constexpr Iq2xxsTables kIq2xxs = make_iq2xxs_tables();

inline __m512i load512(const void* p) {
    return _mm512_load_si512(p);
}

// The 32 grid codes of a super-block (raw = its 64 bytes of qs).
inline __m512i iq2xxs_codes(const __m512i* T, __m512i raw) {
    const __m512i idx = _mm512_cvtepu8_epi16(_mm512_cvtepi64_epi32(raw));
    const __m512i r0 = _mm512_permutex2var_epi16(T[0], idx, T[1]);
    const __m512i r1 = _mm512_permutex2var_epi16(T[2], idx, T[3]);
    const __m512i r2 = _mm512_permutex2var_epi16(T[4], idx, T[5]);
    const __m512i r3 = _mm512_permutex2var_epi16(T[6], idx, T[7]);
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1),
                                   _mm512_mask_blend_epi16(b6, r2, r3));
}

// The 8 sub-block scales 2s+1 as dwords (s is the top nibble of each sign word).
inline __m512i iq2xxs_scales(__m512i raw) {
    const __m512i words = _mm512_zextsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64(raw, 32)));
    return _mm512_or_si512(_mm512_slli_epi32(_mm512_srli_epi32(words, 28), 1),
                           _mm512_set1_epi32(1));
}

// The negated bytes of the 64 values of the chunk at q2: its two sign words'
// 7-bit groups through signs7x8.
inline __mmask64 iq2xxs_neg(const uint8_t* q2) {
    const uint32_t w1 = load32(q2 + 4), w2 = load32(q2 + 12);
    return signs7x8((w1 & 0x0fffffffull) | (uint64_t(w2 & 0x0fffffff) << 28));
}

// 64 values given their magnitudes and negated bytes: times the activations,
// scaled per 32 and accumulated.
inline __m512i iq2xxs_finish(__m512i grid, __mmask64 neg, const int8_t* q8, __m512i scale,
                             __m512i acc) {
    const __m512i act = _mm512_loadu_si512(q8);
    const __m512i prod =
        _mm512_maddubs_epi16(grid, _mm512_mask_sub_epi8(act, neg, _mm512_setzero_si512(), act));
    return _mm512_dpwssd_epi32(acc, prod, scale);
}

// Magnitudes of chunk k (groups 8k..8k+7) with AVX-512BW only.
inline __m512i iq2xxs_expand_bw(__m512i codes, __m512i replicate, __m512i shift, __m512i even,
                                __m512i odd) {
    __m512i t = _mm512_srlv_epi16(_mm512_permutexvar_epi16(replicate, codes), shift);
    t = _mm512_and_si512(t, _mm512_set1_epi16(0x000f));
    t = _mm512_or_si512(t, _mm512_slli_epi16(t, 8));
    const __m512i grid = _mm512_shuffle_epi8(even, t);
    return _mm512_mask_shuffle_epi8(grid, _cvtu64_mask64(0xaaaaaaaaaaaaaaaaull), odd, t);
}

}  // namespace

float dot_iq2_xxs_avx512bw(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_XXS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    const Iq2xxsTables& tb = kIq2xxs;
    __m512i T[8];
    for (int k = 0; k < 8; ++k) T[k] = load512(tb.codes + 32 * k);
    __m512i rep[4], sel[4];
    for (int k = 0; k < 4; ++k) rep[k] = load512(tb.replicate[k]), sel[k] = load512(tb.scale_of[k]);
    const __m512i shift = load512(tb.shift);
    const __m512i even =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tb.even)));
    const __m512i odd =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tb.odd)));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t* q2 = reinterpret_cast<const uint8_t*>(x[i].qs);
        const int8_t* q8 = a[i].qs;
        const __m512i raw = _mm512_loadu_si512(q2);
        const __m512i codes = iq2xxs_codes(T, raw);
        const __m512i ls = iq2xxs_scales(raw);
        __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k)
            s[k & 1] = iq2xxs_finish(iq2xxs_expand_bw(codes, rep[k], shift, even, odd),
                                     iq2xxs_neg(q2 + 16 * k), q8 + 64 * k,
                                     _mm512_permutexvar_epi16(sel[k], ls), s[k & 1]);
        const float d = fp16(x[i].d) * a[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_add_epi32(s[0], s[1])),
                              acc);
    }
    return 0.125f * _mm512_reduce_add_ps(acc);
}

float dot_iq2_xxs_avx512(int64_t n, const void* vw, const void* va) {
    static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
    return vbmi ? dot_iq2_xxs_avx512vbmi(n, vw, va) : dot_iq2_xxs_avx512bw(n, vw, va);
}

namespace {

// With AVX512-VBMI (Ice Lake, Zen 4 and later) the expansion is one
// vpmultishiftqb: each byte of a group's qword takes the 8 bits at offset 2j
// of the code, whose low 2 bits are level j; vpshufb maps them to magnitudes.
// NT tokens against one row: each 64-value chunk's magnitudes, sign mask and
// scales are made once and every token's bytes go through them; one token is
// the single-row dot. A token's four chunk sums land in one int32 (the
// AVX-512BW kernel splits them over two: the same exact integer), then the
// same float steps as there, so the same bits.
template <int NT>
__attribute__((target("avx512vbmi"))) void iq2xxs_tokens(int64_t n, const BlockIQ2_XXS* x,
                                                         const uint8_t* a, size_t stride,
                                                         float* out) {
    const Iq2xxsTables& tb = kIq2xxs;
    __m512i T[8];
    for (int k = 0; k < 8; ++k) T[k] = load512(tb.codes + 32 * k);
    __m512i sel[4];
    for (int k = 0; k < 4; ++k) sel[k] = load512(tb.scale_of[k]);
    const __m512i mags =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(tb.even)));
    const __m512i offsets = _mm512_set1_epi64(0x0e0c0a0806040200ll);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    auto act = [&](int t) { return reinterpret_cast<const BlockQ8_K*>(a + size_t(t) * stride); };
    __m512 acc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t* q2 = reinterpret_cast<const uint8_t*>(x[i].qs);
        const __m512i raw = _mm512_loadu_si512(q2);
        const __m512i codes = iq2xxs_codes(T, raw);
        const __m512i ls = iq2xxs_scales(raw);
        __m512i s[NT];
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) s[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const __m512i bits =
                _mm512_multishift_epi64_epi8(offsets, _mm512_cvtepu16_epi64(quarter(codes, k)));
            const __m512i grid = _mm512_shuffle_epi8(mags, _mm512_and_si512(bits, low4));
            const __mmask64 neg = iq2xxs_neg(q2 + 16 * k);
            const __m512i scale = _mm512_permutexvar_epi16(sel[k], ls);
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t)
                s[t] = iq2xxs_finish(grid, neg, act(t)[i].qs + 64 * k, scale, s[t]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            const float d = fp16(x[i].d) * act(t)[i].d;
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(s[t]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) out[t] = 0.125f * _mm512_reduce_add_ps(acc[t]);
}

}  // namespace

__attribute__((target("avx512vbmi"))) float dot_iq2_xxs_avx512vbmi(int64_t n, const void* vw,
                                                                   const void* va) {
    float out;
    iq2xxs_tokens<1>(n, static_cast<const BlockIQ2_XXS*>(vw), static_cast<const uint8_t*>(va), 0,
                     &out);
    return out;
}

// Passes of 8 tokens, then 4, 2 and 1. Without VBMI, one row dot per token.
void dot_iq2_xxs_multi_avx512(int64_t n, const void* vw, const void* va, size_t stride,
                              int64_t n_act, float* out) {
    static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
    const auto* x = static_cast<const BlockIQ2_XXS*>(vw);
    const auto* a = static_cast<const uint8_t*>(va);
    int64_t t = 0;
    if (!vbmi) {
        for (; t < n_act; ++t) out[t] = dot_iq2_xxs_avx512bw(n, vw, a + size_t(t) * stride);
        return;
    }
    for (; t + 8 <= n_act; t += 8) iq2xxs_tokens<8>(n, x, a + size_t(t) * stride, stride, out + t);
    if (n_act - t >= 4) {
        iq2xxs_tokens<4>(n, x, a + size_t(t) * stride, stride, out + t);
        t += 4;
    }
    if (n_act - t >= 2) {
        iq2xxs_tokens<2>(n, x, a + size_t(t) * stride, stride, out + t);
        t += 2;
    }
    if (t < n_act) iq2xxs_tokens<1>(n, x, a + size_t(t) * stride, stride, out + t);
}

namespace {

// 16 packed bytes of two IQ4 blocks of 32 (p0, p1) -> 64 nibbles in value
// order: lanes 0-15 low nibbles of p0, 16-31 its high nibbles, then p1's.
inline __m512i iq4_nibbles(__m128i p0, __m128i p1) {
    __m512i z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(p0), 0xff00, p1);
    z = _mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4);  // second and fourth 128-bit lanes
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

inline __m512i table512(const int8_t* t16) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t16)));
}

}  // namespace

float dot_iq4_nl_avx512(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_NL*>(vw);
    const auto* a = static_cast<const BlockQ8_0*>(va);
    // |level| table; levels 0..7 are the negative ones.
    alignas(16) int8_t mag[16];
    for (int k = 0; k < 16; ++k)
        mag[k] = int8_t(kvalues_iq4nl[k] < 0 ? -kvalues_iq4nl[k] : kvalues_iq4nl[k]);
    const __m512i tmag = table512(mag);
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    const int64_t nb = n / QK;
    auto pair = [&](int64_t i, __m512 acc) {
        const __m512i nib =
            iq4_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs)),
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i + 1].qs)));
        const __mmask64 neg = _mm512_cmplt_epu8_mask(nib, eight);
        const __m512i act = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i + 1].qs)), 1);
        const __m512i dot = _mm512_dpbusd_epi32(zero, _mm512_shuffle_epi8(tmag, nib),
                                                _mm512_mask_sub_epi8(act, neg, zero, act));
        const float d0 = fp16(a[i].d) * fp16(x[i].d), d1 = fp16(a[i + 1].d) * fp16(x[i + 1].d);
        const __m512 d = _mm512_mask_mov_ps(_mm512_set1_ps(d0), 0xff00, _mm512_set1_ps(d1));
        return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc);
    };
    int64_t i = 0;
    for (; i + 3 < nb; i += 4) {
        acc1 = pair(i, acc1);
        acc2 = pair(i + 2, acc2);
    }
    for (; i + 1 < nb; i += 2) acc1 = pair(i, acc1);
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc1, acc2));
    if (i < nb) {  // odd tail: one block
        int32_t s = 0;
        for (int j = 0; j < QK / 2; ++j)
            s += a[i].qs[j] * kvalues_iq4nl[x[i].qs[j] & 0xf] +
                 a[i].qs[j + 16] * kvalues_iq4nl[x[i].qs[j] >> 4];
        sum += fp16(a[i].d) * fp16(x[i].d) * float(s);
    }
    return sum;
}

float dot_iq4_xs_avx512(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_XS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    // Levels shifted by +128 are unsigned, so vpdpbusd takes them directly;
    // the shift is removed per block with the activation sums (bsums).
    alignas(16) int8_t shifted[16];
    for (int k = 0; k < 16; ++k) shifted[k] = int8_t(kvalues_iq4nl[k] + 128);
    const __m512i table = table512(shifted);
    const __m256i nib_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i hi_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16(x[i].d) * a[i].d;
        // The 8 six-bit sub-block scales, minus 32, as int32 lanes.
        const __m256i lo = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(int32_t(load32(x[i].scales_l))), nib_shift),
            _mm256_set1_epi32(0xf));
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(x[i].scales_h), hi_shift), _mm256_set1_epi32(3));
        const __m256i ls =
            _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        const __m512i ls512 = _mm512_zextsi256_si512(ls);
        const uint8_t* qs = x[i].qs;
        const int8_t* q8 = a[i].qs;
        __m512i sum = zero;
        for (int k = 0; k < 4; ++k, qs += 32, q8 += 64) {
            const __m512i nib =
                iq4_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)),
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
            const __m512i dot =
                _mm512_dpbusd_epi32(zero, _mm512_shuffle_epi8(table, nib), _mm512_loadu_si512(q8));
            // Lanes 0-7 belong to sub-block 2k, lanes 8-15 to 2k+1.
            const __m512i sel = _mm512_set_epi32(2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1,
                                                 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k,
                                                 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k);
            sum = _mm512_add_epi32(sum,
                                   _mm512_mullo_epi32(dot, _mm512_permutexvar_epi32(sel, ls512)));
        }
        // Remove the +128: 128 * sum_ib ls_ib * (sum of its 32 activations).
        const __m256i ls16 = _mm256_and_si256(ls, _mm256_set1_epi32(0xffff));
        const __m256i corr =
            _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].bsums)),
                              _mm256_or_si256(ls16, _mm256_slli_epi32(ls16, 16)));
        sum = _mm512_sub_epi32(sum, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 7)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sum), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

}  // namespace glm5::quant::iq

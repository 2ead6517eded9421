// AVX-512 (BW/VL/DQ/VNNI) dot products of the legacy formats: two 32-value
// blocks per 512-bit register, integer sums with vpdpbusd, per-block scaling
// accumulated in float lanes (results differ from the scalar reference only by
// float summation order).
// GCC 12 warns about the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics headers (GCC bug 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

namespace glm5::quant::kernels {

namespace {

inline float fp16_product(uint16_t a, uint16_t b) {
    return _cvtsh_ss(a) * _cvtsh_ss(b);
}

// Scales of two consecutive blocks, each repeated over its 8 int32 lanes.
inline __m512 pair_scale(float d0, float d1) {
    return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

inline __m512i load_pair(const int8_t* a, const int8_t* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                              _mm256_loadu_si256((const __m256i*)b), 1);
}

// Nibbles of two legacy blocks: per block, low nibbles are elements 0-15 and
// high nibbles 16-31.
inline __m512i nibbles_pair(const uint8_t* qa, const uint8_t* qb) {
    const __m256i both =
        _mm256_set_m128i(_mm_loadu_si128((const __m128i*)qb), _mm_loadu_si128((const __m128i*)qa));
    const __m512i v = _mm512_shuffle_i64x2(_mm512_castsi256_si512(both),
                                           _mm512_castsi256_si512(both), _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_and_si512(v, mask);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    return _mm512_mask_blend_epi64(0xCC, lo, hi);
}

inline __m256i nibbles_one(const uint8_t* q) {
    const __m128i b = _mm_loadu_si128((const __m128i*)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// The fifth bits of two Q5 blocks as 0x10 bytes.
inline __m512i high_bits_pair(const uint8_t* qha, const uint8_t* qhb) {
    uint32_t a, b;
    std::memcpy(&a, qha, 4);
    std::memcpy(&b, qhb, 4);
    return _mm512_maskz_mov_epi8((uint64_t(b) << 32) | a, _mm512_set1_epi8(0x10));
}

inline __m256i high_bits_one(const uint8_t* qh) {
    uint32_t a;
    std::memcpy(&a, qh, 4);
    return _mm256_maskz_mov_epi8(a, _mm256_set1_epi8(0x10));
}

// sum(a*b) per 4 bytes for signed a, b: move a's sign onto b, |a| is unsigned.
inline __m512i dot_ss(__m512i a, __m512i b) {
    const __m512i nb = _mm512_mask_sub_epi8(b, _mm512_movepi8_mask(a), _mm512_setzero_si512(), b);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(a), nb);
}
inline __m256i dot_ss(__m256i a, __m256i b) {
    const __m256i nb = _mm256_sign_epi8(b, a);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), nb);
}

inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Shared loop: `pair(i)` gives the int32 sums of blocks i, i+1 (512 bits),
// `one(i)` those of block i (256 bits); `scale(i)` the block's float scale.
template <typename Pair, typename One, typename Scale>
float accumulate(int64_t nb, Pair pair, One one, Scale scale) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2)
        acc = _mm512_fmadd_ps(pair_scale(scale(i), scale(i + 1)), _mm512_cvtepi32_ps(pair(i)), acc);
    float sum = _mm512_reduce_add_ps(acc);
    // One fused multiply-add, written out: GCC contracts `sum += a * b` only
    // from -O2, and the repacked GEMM (repack_avx512.cpp) matches the fused form.
    if (i < nb) sum = std::fma(scale(i), hsum256(_mm256_cvtepi32_ps(one(i))), sum);
    return sum;
}

}  // namespace

float dot_q8_0_avx512(int64_t n, const void* w, const void* a) {
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    return accumulate(
        n / QK,
        [&](int64_t i) {
            return dot_ss(load_pair(x[i].qs, x[i + 1].qs), load_pair(y[i].qs, y[i + 1].qs));
        },
        [&](int64_t i) {
            return dot_ss(_mm256_loadu_si256((const __m256i*)x[i].qs),
                          _mm256_loadu_si256((const __m256i*)y[i].qs));
        },
        [&](int64_t i) { return fp16_product(x[i].d, y[i].d); });
}

// Q4_0: sum((q - 8) * y) = sum(q * y) - sum(8 * y), both unsigned x signed.
float dot_q4_0_avx512(int64_t n, const void* w, const void* a) {
    const BlockQ4_0* x = static_cast<const BlockQ4_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    return accumulate(
        n / QK,
        [&](int64_t i) {
            const __m512i yv = load_pair(y[i].qs, y[i + 1].qs);
            const __m512i zero = _mm512_setzero_si512();
            return _mm512_sub_epi32(
                _mm512_dpbusd_epi32(zero, nibbles_pair(x[i].qs, x[i + 1].qs), yv),
                _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), yv));
        },
        [&](int64_t i) {
            const __m256i yv = _mm256_loadu_si256((const __m256i*)y[i].qs);
            const __m256i zero = _mm256_setzero_si256();
            return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, nibbles_one(x[i].qs), yv),
                                    _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(8), yv));
        },
        [&](int64_t i) { return fp16_product(x[i].d, y[i].d); });
}

float dot_q5_0_avx512(int64_t n, const void* w, const void* a) {
    const BlockQ5_0* x = static_cast<const BlockQ5_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    return accumulate(
        n / QK,
        [&](int64_t i) {
            const __m512i yv = load_pair(y[i].qs, y[i + 1].qs);
            const __m512i q = _mm512_or_si512(nibbles_pair(x[i].qs, x[i + 1].qs),
                                              high_bits_pair(x[i].qh, x[i + 1].qh));
            const __m512i zero = _mm512_setzero_si512();
            return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, yv),
                                    _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), yv));
        },
        [&](int64_t i) {
            const __m256i yv = _mm256_loadu_si256((const __m256i*)y[i].qs);
            const __m256i q = _mm256_or_si256(nibbles_one(x[i].qs), high_bits_one(x[i].qh));
            const __m256i zero = _mm256_setzero_si256();
            return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, q, yv),
                                    _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(16), yv));
        },
        [&](int64_t i) { return fp16_product(x[i].d, y[i].d); });
}

// Offset formats add m * s per block (s = dy * sum(qy), stored by Q8_1). One
// block per step in 256 bits: pairing blocks measured slower.
template <typename Block, typename Levels>
float dot_offset(int64_t n, const Block* x, const BlockQ8_1* y, Levels levels) {
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), levels(x[i]),
                                              _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s),
                              acc);
        offsets += fp16_product(x[i].m, y[i].s);
    }
    return hsum256(acc) + offsets;
}

float dot_q4_1_avx512(int64_t n, const void* w, const void* a) {
    return dot_offset(n, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a),
                      [](const BlockQ4_1& b) { return nibbles_one(b.qs); });
}

float dot_q5_1_avx512(int64_t n, const void* w, const void* a) {
    return dot_offset(
        n, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a),
        [](const BlockQ5_1& b) { return _mm256_or_si256(nibbles_one(b.qs), high_bits_one(b.qh)); });
}

}  // namespace glm5::quant::kernels

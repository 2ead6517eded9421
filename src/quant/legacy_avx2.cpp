// AVX2 kernels of the legacy formats: Q8_0 / Q8_1 activation quantization
// (bit-identical to the scalar versions in legacy.cpp) and the dot products
// against Q8_0 / Q8_1. Each block's integer sum is exact; the per-block scaling
// is accumulated in 8 float lanes, so results differ from the scalar reference
// only by float summation order.
#include "quant/kernels.h"
#include "quant/simd_avx2.h"

namespace glm5::quant::kernels {

using namespace avx2;

namespace {

// Quantizes one 32-value block to int8 as llama.cpp's x86 backend does and
// returns the 8 int32 partial sums of the levels (for Q8_1's s).
inline __m256i quantize_block_q8(const float* x, uint16_t* d_out, int8_t* qs, float* d_float) {
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.f;
    *d_out = fp32_to_fp16(d);
    *d_float = d;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), kRound));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), kRound));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), kRound));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), kRound));
    // Saturating packs interleave 128-bit lanes; the permute restores order.
    const __m256i p16a = _mm256_packs_epi32(i0, i1), p16b = _mm256_packs_epi32(i2, i3);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
    return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}

inline float fp16_product(uint16_t a, uint16_t b) {
    return fp16_scalar(a) * fp16_scalar(b);
}

}  // namespace

void act_q8_0_avx2(const float* x, void* dst, int64_t n) {
    BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
    float d;
    for (int64_t ib = 0; ib < n / QK; ++ib) quantize_block_q8(x + ib * QK, &y[ib].d, y[ib].qs, &d);
}

void act_q8_1_avx2(const float* x, void* dst, int64_t n) {
    BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib) {
        float d;
        const int sum = hsum_i32(quantize_block_q8(x + ib * QK, &y[ib].d, y[ib].qs, &d));
        y[ib].s = fp32_to_fp16(d * float(sum));
    }
}

float dot_q8_0_avx2(int64_t n, const void* w, const void* a) {
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i s0 = dot_i8x32(_mm256_loadu_si256((const __m256i*)x[i].qs),
                                     _mm256_loadu_si256((const __m256i*)y[i].qs));
        const __m256i s1 = dot_i8x32(_mm256_loadu_si256((const __m256i*)x[i + 1].qs),
                                     _mm256_loadu_si256((const __m256i*)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s0),
                               acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i + 1].d, y[i + 1].d)),
                               _mm256_cvtepi32_ps(s1), acc1);
    }
    for (; i < nb; ++i) {
        const __m256i s0 = dot_i8x32(_mm256_loadu_si256((const __m256i*)x[i].qs),
                                     _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s0),
                               acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_q4_0_avx2(int64_t n, const void* w, const void* a) {
    const BlockQ4_0* x = static_cast<const BlockQ4_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i q0 = _mm256_sub_epi8(unpack_nibbles_32(x[i].qs), eight);
        const __m256i q1 = _mm256_sub_epi8(unpack_nibbles_32(x[i + 1].qs), eight);
        const __m256i s0 = dot_i8x32(q0, _mm256_loadu_si256((const __m256i*)y[i].qs));
        const __m256i s1 = dot_i8x32(q1, _mm256_loadu_si256((const __m256i*)y[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s0),
                               acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i + 1].d, y[i + 1].d)),
                               _mm256_cvtepi32_ps(s1), acc1);
    }
    for (; i < nb; ++i) {
        const __m256i q0 = _mm256_sub_epi8(unpack_nibbles_32(x[i].qs), eight);
        const __m256i s0 = dot_i8x32(q0, _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s0),
                               acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_q5_0_avx2(int64_t n, const void* w, const void* a) {
    const BlockQ5_0* x = static_cast<const BlockQ5_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK;
    const __m256i sixteen = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const __m256i q = _mm256_sub_epi8(
            _mm256_or_si256(unpack_nibbles_32(x[i].qs), expand_bits_32(x[i].qh)), sixteen);
        const __m256i s = dot_i8x32(q, _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s),
                              acc);
    }
    return hsum(acc);
}

// Offset formats: sum((d*q + m) * dy*qy) = d*dy*sum(q*qy) + m*s.
float dot_q4_1_avx2(int64_t n, const void* w, const void* a) {
    const BlockQ4_1* x = static_cast<const BlockQ4_1*>(w);
    const BlockQ8_1* y = static_cast<const BlockQ8_1*>(a);
    const int64_t nb = n / QK;
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0;
    for (int64_t i = 0; i < nb; ++i) {
        const __m256i s =
            dot_u8i8x32(unpack_nibbles_32(x[i].qs), _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s),
                              acc);
        offsets += fp16_product(x[i].m, y[i].s);
    }
    return hsum(acc) + offsets;
}

float dot_q5_1_avx2(int64_t n, const void* w, const void* a) {
    const BlockQ5_1* x = static_cast<const BlockQ5_1*>(w);
    const BlockQ8_1* y = static_cast<const BlockQ8_1*>(a);
    const int64_t nb = n / QK;
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0;
    for (int64_t i = 0; i < nb; ++i) {
        const __m256i q = _mm256_or_si256(unpack_nibbles_32(x[i].qs), expand_bits_32(x[i].qh));
        const __m256i s = dot_u8i8x32(q, _mm256_loadu_si256((const __m256i*)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_product(x[i].d, y[i].d)), _mm256_cvtepi32_ps(s),
                              acc);
        offsets += fp16_product(x[i].m, y[i].s);
    }
    return hsum(acc) + offsets;
}

}  // namespace glm5::quant::kernels

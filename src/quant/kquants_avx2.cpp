// AVX2 dot products of the k-quants against Q8_K, and the Q8_K activation
// quantizer. The dot products are bit-identical to the scalar references (see
// kq_avx2.h); the quantizer is bit-identical to act_q8_K_scalar.
#include "quant/kernels.h"
#include "quant/kq_avx2.h"

namespace glm5::quant::kernels {

using namespace avx2;

float dot_q2_K_avx2(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ2_K, avx2::q2_K_block, true>(n, static_cast<const BlockQ2_K*>(w),
                                                               static_cast<const BlockQ8_K*>(a));
}
float dot_q3_K_avx2(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ3_K, avx2::q3_K_block, false>(n, static_cast<const BlockQ3_K*>(w),
                                                                static_cast<const BlockQ8_K*>(a));
}
float dot_q4_K_avx2(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ4_K, avx2::q4_K_block, true>(n, static_cast<const BlockQ4_K*>(w),
                                                               static_cast<const BlockQ8_K*>(a));
}
float dot_q5_K_avx2(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ5_K, avx2::q5_K_block, true>(n, static_cast<const BlockQ5_K*>(w),
                                                               static_cast<const BlockQ8_K*>(a));
}
float dot_q6_K_avx2(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ6_K, avx2::q6_K_block, false>(n, static_cast<const BlockQ6_K*>(w),
                                                                static_cast<const BlockQ8_K*>(a));
}

void dot_q4_K_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                         float* out) {
    avx2::kq_dot_multi<BlockQ4_K, avx2::decode_q4_K, true>(
        n, static_cast<const BlockQ4_K*>(w), static_cast<const uint8_t*>(a), stride, n_act, out);
}
void dot_q5_K_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                         float* out) {
    avx2::kq_dot_multi<BlockQ5_K, avx2::decode_q5_K, true>(
        n, static_cast<const BlockQ5_K*>(w), static_cast<const uint8_t*>(a), stride, n_act, out);
}
void dot_q6_K_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                         float* out) {
    avx2::kq_dot_multi<BlockQ6_K, avx2::decode_q6_K, false>(
        n, static_cast<const BlockQ6_K*>(w), static_cast<const uint8_t*>(a), stride, n_act, out);
}

// Q8_K activations: iscale = -127 / (the signed element of largest magnitude,
// first on ties), q = min(127, round-half-even(iscale * x)), d = 1 / iscale.
void act_q8_K_avx2(const float* x, void* dst, int64_t n) {
    BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!amax) {
            std::memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        // The sign comes from the first element whose magnitude is amax.
        const __m256 target = _mm256_set1_ps(amax);
        float max = amax;
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            const int hit =
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), target, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz(unsigned(hit))];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 64) {
            __m256i v[8];
            for (int k = 0; k < 8; ++k)
                v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs));
            // int8 levels; signed saturation clamps at 127 like min(127, .).
            for (int k = 0; k < 8; k += 4) {
                const __m256i p16a = _mm256_packs_epi32(v[k], v[k + 1]);
                const __m256i p16b = _mm256_packs_epi32(v[k + 2], v[k + 3]);
                const __m256i p8 = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j + 8 * k), p8);
            }
            // Sums of each 16 (= two vectors), from the saturated levels.
            for (int k = 0; k < 8; ++k)
                v[k] = _mm256_max_epi32(_mm256_min_epi32(v[k], _mm256_set1_epi32(127)),
                                        _mm256_set1_epi32(-128));
            const __m256i t =
                _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            const __m256i u =
                _mm256_hadd_epi32(_mm256_add_epi32(v[4], v[5]), _mm256_add_epi32(v[6], v[7]));
            const __m256i w4 = _mm256_hadd_epi32(t, u);
            const __m128i s =
                _mm_add_epi32(_mm256_castsi256_si128(w4), _mm256_extracti128_si256(w4, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(y[i].bsums + j / 16),
                             _mm_packs_epi32(s, s));
        }
        y[i].d = 1 / iscale;
    }
}

}  // namespace glm5::quant::kernels

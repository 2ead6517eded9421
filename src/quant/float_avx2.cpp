// AVX2 kernels of the float formats: F32/F16/BF16 dot products and the F16
// activation conversion (F16C rounds to nearest even like fp32_to_fp16).
#include "quant/kernels.h"
#include "quant/simd_avx2.h"

namespace glm5::quant::kernels {

using namespace avx2;

namespace {

// Four independent accumulators hide the FMA latency; `load` widens 8
// elements of the stored type to floats.
template <typename T, typename Load, typename Scalar>
float dot_generic(int64_t n, const T* x, const T* y, Load load, Scalar scalar) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
        acc1 = _mm256_fmadd_ps(load(x + i + 8), load(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load(x + i + 16), load(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load(x + i + 24), load(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; ++i) sum += scalar(x[i]) * scalar(y[i]);
    return sum;
}

}  // namespace

float dot_f32_avx2(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const float*>(w), static_cast<const float*>(a),
        [](const float* p) { return _mm256_loadu_ps(p); }, [](float v) { return v; });
}

float dot_f16_avx2(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
        [](const uint16_t* p) { return fp16x8_to_ps(p); },
        [](uint16_t h) { return fp16_scalar(h); });
}

float dot_bf16_avx2(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
        [](const uint16_t* p) {
            const __m256i v =
                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
            return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        },
        [](uint16_t h) { return bf16_to_fp32(h); });
}

void act_f16_avx2(const float* x, void* dst, int64_t n) {
    uint16_t* h = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), v);
    }
    for (; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}

}  // namespace glm5::quant::kernels

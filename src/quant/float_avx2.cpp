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

// dot_generic for two activation rows at once: each weight vector is loaded
// (and widened) once for both, and each row's accumulators, their order and
// the scalar tail are dot_generic's, so every result has its bits.
template <typename T, typename Load, typename Scalar>
void dot_pair(int64_t n, const T* x, const T* y0, const T* y1, Load load, Scalar scalar,
              float* out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 w0 = load(x + i), w1 = load(x + i + 8), w2 = load(x + i + 16),
                     w3 = load(x + i + 24);
        a0 = _mm256_fmadd_ps(w0, load(y0 + i), a0);
        a1 = _mm256_fmadd_ps(w1, load(y0 + i + 8), a1);
        a2 = _mm256_fmadd_ps(w2, load(y0 + i + 16), a2);
        a3 = _mm256_fmadd_ps(w3, load(y0 + i + 24), a3);
        b0 = _mm256_fmadd_ps(w0, load(y1 + i), b0);
        b1 = _mm256_fmadd_ps(w1, load(y1 + i + 8), b1);
        b2 = _mm256_fmadd_ps(w2, load(y1 + i + 16), b2);
        b3 = _mm256_fmadd_ps(w3, load(y1 + i + 24), b3);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w = load(x + i);
        a0 = _mm256_fmadd_ps(w, load(y0 + i), a0);
        b0 = _mm256_fmadd_ps(w, load(y1 + i), b0);
    }
    float s0 = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float s1 = hsum(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    for (; i < n; ++i) {
        s0 += scalar(x[i]) * scalar(y0[i]);
        s1 += scalar(x[i]) * scalar(y1[i]);
    }
    out[0] = s0;
    out[1] = s1;
}

template <typename T, typename Load, typename Scalar>
void dot_multi_generic(int64_t n, const T* x, const uint8_t* a, size_t stride, int64_t n_act,
                       float* out, Load load, Scalar scalar) {
    auto row = [&](int64_t t) { return reinterpret_cast<const T*>(a + size_t(t) * stride); };
    int64_t t = 0;
    for (; t + 2 <= n_act; t += 2) dot_pair(n, x, row(t), row(t + 1), load, scalar, out + t);
    if (t < n_act) out[t] = dot_generic(n, x, row(t), load, scalar);
}

inline __m256 load_f32(const float* p) {
    return _mm256_loadu_ps(p);
}
inline float scalar_f32(float v) {
    return v;
}
inline __m256 load_f16(const uint16_t* p) {
    return fp16x8_to_ps(p);
}
inline float scalar_f16(uint16_t h) {
    return fp16_scalar(h);
}
inline __m256 load_bf16(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline float scalar_bf16(uint16_t h) {
    return bf16_to_fp32(h);
}

}  // namespace

void dot_f32_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                        float* out) {
    dot_multi_generic(n, static_cast<const float*>(w), static_cast<const uint8_t*>(a), stride,
                      n_act, out, load_f32, scalar_f32);
}

void dot_f16_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                        float* out) {
    dot_multi_generic(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), stride,
                      n_act, out, load_f16, scalar_f16);
}

void dot_bf16_multi_avx2(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                         float* out) {
    dot_multi_generic(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), stride,
                      n_act, out, load_bf16, scalar_bf16);
}

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

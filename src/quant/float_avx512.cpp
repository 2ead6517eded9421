// AVX-512 dot products of the float formats.
// GCC 12 warns about the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics headers (GCC bug 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "core/fp16.h"
#include "quant/kernels.h"

namespace glm5::quant::kernels {

namespace {

// One weight row against NT activation rows (a + t * stride): per token four
// 16-lane accumulators over 64-value steps, then 16-value steps into the
// first, one fixed reduction and a scalar tail. Each weight vector is loaded
// once for the NT tokens; every token's sums run the same way whatever NT,
// so the single-row dot (NT = 1) and the multi kernel give the same bits.
template <int NT, typename T, typename Load, typename Scalar, typename A = T, typename LoadA = Load,
          typename ScalarA = Scalar>
void dot_tokens(int64_t n, const T* x, const uint8_t* a, size_t stride, float* out, Load load,
                Scalar scalar, LoadA load_a, ScalarA scalar_a) {
    __m512 acc[NT][4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc[t][k] = _mm512_setzero_ps();
    auto y = [&](int t) { return reinterpret_cast<const A*>(a + size_t(t) * stride); };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512 w[4] = {load(x + i), load(x + i + 16), load(x + i + 32), load(x + i + 48)};
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k)
                acc[t][k] = _mm512_fmadd_ps(w[k], load_a(y(t) + i + 16 * k), acc[t][k]);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 w = load(x + i);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[t][0] = _mm512_fmadd_ps(w, load_a(y(t) + i), acc[t][0]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]),
                                                       _mm512_add_ps(acc[t][2], acc[t][3])));
        for (int64_t j = i; j < n; ++j) sum += scalar(x[j]) * scalar_a(y(t)[j]);
        out[t] = sum;
    }
}

template <typename T, typename A, typename Load, typename Scalar, typename LoadA, typename ScalarA>
void dot_multi(int64_t n, const T* x, const uint8_t* a, size_t stride, int64_t n_act, float* out,
               Load load, Scalar scalar, LoadA load_a, ScalarA scalar_a) {
    int64_t t = 0;
    for (; t + 4 <= n_act; t += 4)
        dot_tokens<4, T, Load, Scalar, A>(n, x, a + size_t(t) * stride, stride, out + t, load,
                                          scalar, load_a, scalar_a);
    if (n_act - t >= 2) {
        dot_tokens<2, T, Load, Scalar, A>(n, x, a + size_t(t) * stride, stride, out + t, load,
                                          scalar, load_a, scalar_a);
        t += 2;
    }
    if (t < n_act)
        dot_tokens<1, T, Load, Scalar, A>(n, x, a + size_t(t) * stride, stride, out + t, load,
                                          scalar, load_a, scalar_a);
}

const auto load_f32 = [](const float* p) { return _mm512_loadu_ps(p); };
const auto load_f16 = [](const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
};
const auto load_bf16 = [](const uint16_t* p) {
    const __m512i v =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
};
const auto scalar_f32 = [](float v) { return v; };
const auto scalar_f16 = [](uint16_t h) { return fp16_to_fp32(h); };
const auto scalar_bf16 = [](uint16_t h) { return bf16_to_fp32(h); };

}  // namespace

float dot_f32_avx512(int64_t n, const void* w, const void* a) {
    float out;
    dot_tokens<1>(n, static_cast<const float*>(w), static_cast<const uint8_t*>(a), 0, &out,
                  load_f32, scalar_f32, load_f32, scalar_f32);
    return out;
}

float dot_f16_avx512(int64_t n, const void* w, const void* a) {
    float out;
    dot_tokens<1>(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), 0, &out,
                  load_f16, scalar_f16, load_f16, scalar_f16);
    return out;
}

float dot_bf16_avx512(int64_t n, const void* w, const void* a) {
    float out;
    dot_tokens<1>(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), 0, &out,
                  load_bf16, scalar_bf16, load_bf16, scalar_bf16);
    return out;
}

void dot_f32_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                          float* out) {
    dot_multi<float, float>(n, static_cast<const float*>(w), static_cast<const uint8_t*>(a), stride,
                            n_act, out, load_f32, scalar_f32, load_f32, scalar_f32);
}

void dot_f16_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                          float* out) {
    dot_multi<uint16_t, uint16_t>(n, static_cast<const uint16_t*>(w),
                                  static_cast<const uint8_t*>(a), stride, n_act, out, load_f16,
                                  scalar_f16, load_f16, scalar_f16);
}

void dot_bf16_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                           float* out) {
    dot_multi<uint16_t, uint16_t>(n, static_cast<const uint16_t*>(w),
                                  static_cast<const uint8_t*>(a), stride, n_act, out, load_bf16,
                                  scalar_bf16, load_bf16, scalar_bf16);
}

void dot_bf16_f32act_multi_avx512(int64_t n, const void* w, const void* a, size_t stride,
                                  int64_t n_act, float* out) {
    dot_multi<uint16_t, float>(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a),
                               stride, n_act, out, load_bf16, scalar_bf16, load_f32, scalar_f32);
}

}  // namespace glm5::quant::kernels

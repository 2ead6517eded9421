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

template <typename T, typename Load, typename Scalar>
float dot_generic(int64_t n, const T* x, const T* y, Load load, Scalar scalar) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(load(x + i), load(y + i), acc0);
        acc1 = _mm512_fmadd_ps(load(x + i + 16), load(y + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(load(x + i + 32), load(y + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(load(x + i + 48), load(y + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load(x + i), load(y + i), acc0);
    float sum =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
    for (; i < n; ++i) sum += scalar(x[i]) * scalar(y[i]);
    return sum;
}

// dot_generic of one weight row against n_act activation rows (a + t *
// stride), NT at a time: each weight vector is loaded once for NT tokens,
// and every token's sums run exactly as in dot_generic (same lanes, same
// order, same reduction), so each result has its bits.
template <int NT, typename T, typename Load, typename Scalar>
void dot_tokens(int64_t n, const T* x, const uint8_t* a, size_t stride, float* out, Load load,
                Scalar scalar) {
    __m512 acc[NT][4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc[t][k] = _mm512_setzero_ps();
    auto y = [&](int t) { return reinterpret_cast<const T*>(a + size_t(t) * stride); };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512 w[4] = {load(x + i), load(x + i + 16), load(x + i + 32), load(x + i + 48)};
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k)
                acc[t][k] = _mm512_fmadd_ps(w[k], load(y(t) + i + 16 * k), acc[t][k]);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 w = load(x + i);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[t][0] = _mm512_fmadd_ps(w, load(y(t) + i), acc[t][0]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]),
                                                       _mm512_add_ps(acc[t][2], acc[t][3])));
        for (int64_t j = i; j < n; ++j) sum += scalar(x[j]) * scalar(y(t)[j]);
        out[t] = sum;
    }
}

template <typename T, typename Load, typename Scalar>
void dot_multi(int64_t n, const T* x, const uint8_t* a, size_t stride, int64_t n_act, float* out,
               Load load, Scalar scalar) {
    int64_t t = 0;
    for (; t + 4 <= n_act; t += 4)
        dot_tokens<4>(n, x, a + size_t(t) * stride, stride, out + t, load, scalar);
    if (n_act - t >= 2) {
        dot_tokens<2>(n, x, a + size_t(t) * stride, stride, out + t, load, scalar);
        t += 2;
    }
    if (t < n_act) dot_tokens<1>(n, x, a + size_t(t) * stride, stride, out + t, load, scalar);
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
    return dot_generic(n, static_cast<const float*>(w), static_cast<const float*>(a), load_f32,
                       scalar_f32);
}

float dot_f16_avx512(int64_t n, const void* w, const void* a) {
    return dot_generic(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
                       load_f16, scalar_f16);
}

float dot_bf16_avx512(int64_t n, const void* w, const void* a) {
    return dot_generic(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
                       load_bf16, scalar_bf16);
}

void dot_f32_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                          float* out) {
    dot_multi(n, static_cast<const float*>(w), static_cast<const uint8_t*>(a), stride, n_act, out,
              load_f32, scalar_f32);
}

void dot_f16_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                          float* out) {
    dot_multi(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), stride, n_act,
              out, load_f16, scalar_f16);
}

void dot_bf16_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                           float* out) {
    dot_multi(n, static_cast<const uint16_t*>(w), static_cast<const uint8_t*>(a), stride, n_act,
              out, load_bf16, scalar_bf16);
}

}  // namespace glm5::quant::kernels

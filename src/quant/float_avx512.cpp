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

}  // namespace

float dot_f32_avx512(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const float*>(w), static_cast<const float*>(a),
        [](const float* p) { return _mm512_loadu_ps(p); }, [](float v) { return v; });
}

float dot_f16_avx512(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
        [](const uint16_t* p) {
            return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        },
        [](uint16_t h) { return fp16_to_fp32(h); });
}

float dot_bf16_avx512(int64_t n, const void* w, const void* a) {
    return dot_generic(
        n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
        [](const uint16_t* p) {
            const __m512i v =
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
            return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        },
        [](uint16_t h) { return bf16_to_fp32(h); });
}

}  // namespace glm5::quant::kernels

// Row helpers of the CPU backend's attention and indexer, picked once at run
// time: AVX2+FMA+F16C when the CPU has them, plain C++ otherwise. Each is a
// fixed function of its inputs on a given machine (no dependence on threads
// or batching).
#pragma once

#include <cstdint>

namespace glm5::backend::cpu {

struct SimdOps {
    // y[i] += a * x[i]
    void (*axpy_f32)(int64_t n, float a, const float* x, float* y);
    // y[i] += a * float(x[i]) for binary16 x
    void (*axpy_f16)(int64_t n, float a, const uint16_t* x, float* y);
    // dst[i] = float(src[i])
    void (*f16_to_f32)(int64_t n, const uint16_t* src, float* dst);
    // sum of a[i] * b[i] (float a, binary16 b)
    float (*dot_f32_f16)(int64_t n, const float* a, const uint16_t* b);
};

const SimdOps& simd();

// Implementations (cpu_simd.cpp, cpu_simd_avx2.cpp).
namespace scalar {
void axpy_f32(int64_t n, float a, const float* x, float* y);
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y);
void f16_to_f32(int64_t n, const uint16_t* src, float* dst);
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b);
}  // namespace scalar
namespace avx2 {
void axpy_f32(int64_t n, float a, const float* x, float* y);
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y);
void f16_to_f32(int64_t n, const uint16_t* src, float* dst);
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b);
}  // namespace avx2

}  // namespace glm5::backend::cpu

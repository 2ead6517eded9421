// Internal: the per-ISA entry points of the float, legacy and k-quant families.
// The dispatch tables (float.cpp, legacy.cpp, kquants.cpp) pick among them and
// the tests call each variant directly to compare it with the scalar reference.
// *_avx2 functions need AVX2+FMA+F16C, *_avx512 ones AVX-512 F/BW/VL/DQ/VNNI:
// check cpu_has_avx2() / cpu_has_avx512() before calling them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace glm5::quant::kernels {

// Activation quantizers. The scalar versions are portable and bit-identical to
// the SIMD ones; all of them round as llama.cpp's x86 CPU backend does.
void act_q8_0_scalar(const float* x, void* dst, int64_t n);
void act_q8_1_scalar(const float* x, void* dst, int64_t n);
void act_q8_K_scalar(const float* x, void* dst, int64_t n);
void act_f16_scalar(const float* x, void* dst, int64_t n);
void act_q8_0_avx2(const float* x, void* dst, int64_t n);
void act_q8_1_avx2(const float* x, void* dst, int64_t n);
void act_q8_K_avx2(const float* x, void* dst, int64_t n);
void act_f16_avx2(const float* x, void* dst, int64_t n);

// Dot products: weight row (n values) against its activation row.
#define GLM5_QUANT_DOT_DECL(isa)                                   \
    float dot_f32_##isa(int64_t n, const void* w, const void* a);  \
    float dot_f16_##isa(int64_t n, const void* w, const void* a);  \
    float dot_bf16_##isa(int64_t n, const void* w, const void* a); \
    float dot_q4_0_##isa(int64_t n, const void* w, const void* a); \
    float dot_q4_1_##isa(int64_t n, const void* w, const void* a); \
    float dot_q5_0_##isa(int64_t n, const void* w, const void* a); \
    float dot_q5_1_##isa(int64_t n, const void* w, const void* a); \
    float dot_q8_0_##isa(int64_t n, const void* w, const void* a); \
    float dot_q2_K_##isa(int64_t n, const void* w, const void* a); \
    float dot_q3_K_##isa(int64_t n, const void* w, const void* a); \
    float dot_q4_K_##isa(int64_t n, const void* w, const void* a); \
    float dot_q5_K_##isa(int64_t n, const void* w, const void* a); \
    float dot_q6_K_##isa(int64_t n, const void* w, const void* a);

GLM5_QUANT_DOT_DECL(avx2)
GLM5_QUANT_DOT_DECL(avx512)
#undef GLM5_QUANT_DOT_DECL

// One weight row against several activation rows (quant.h VecDotMultiFn).
#define GLM5_QUANT_MULTI_DECL(type, isa)                                                    \
    void dot_##type##_multi_##isa(int64_t n, const void* w, const void* a, size_t a_stride, \
                                  int64_t n_act, float* out);
GLM5_QUANT_MULTI_DECL(f32, avx2)
GLM5_QUANT_MULTI_DECL(f16, avx2)
GLM5_QUANT_MULTI_DECL(bf16, avx2)
GLM5_QUANT_MULTI_DECL(f32, avx512)
GLM5_QUANT_MULTI_DECL(f16, avx512)
GLM5_QUANT_MULTI_DECL(bf16, avx512)
GLM5_QUANT_MULTI_DECL(q4_K, avx2)
GLM5_QUANT_MULTI_DECL(q5_K, avx2)
GLM5_QUANT_MULTI_DECL(q6_K, avx2)
GLM5_QUANT_MULTI_DECL(q4_K, avx512)
GLM5_QUANT_MULTI_DECL(q5_K, avx512)
#undef GLM5_QUANT_MULTI_DECL
// BF16 weights against activation rows already expanded to float (BF16
// values): the bits of dot_bf16_multi_avx512 on the BF16 rows.
void dot_bf16_f32act_multi_avx512(int64_t n, const void* w, const void* a, size_t a_stride,
                                  int64_t n_act, float* out);

}  // namespace glm5::quant::kernels

// Plain float formats: F32, F16 and BF16. Each is its own activation format
// (an F16 weight row is dotted with an F16 activation row, as in ggml).
#include <cstring>

#include "core/fp16.h"
#include "quant/kernels.h"
#include "quant/ops.h"

namespace glm5::quant {

namespace {

// ---- F32 ----

void f32_copy(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, size_t(n) * 4);
}

size_t f32_quantize(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
    const size_t bytes = size_t(n_rows * n_per_row) * 4;
    std::memcpy(dst, src, bytes);
    return bytes;
}

void f32_activation(const float* x, void* dst, int64_t n) {
    std::memcpy(dst, x, size_t(n) * 4);
}

// ggml's scalar dot rounds each product to float and sums in double.
float f32_dot_ref(int64_t n, const void* w, const void* a) {
    const float* x = static_cast<const float*>(w);
    const float* y = static_cast<const float*>(a);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(x[i] * y[i]);
    return float(sum);
}

// ---- F16 ----

void f16_dequantize(const void* src, float* dst, int64_t n) {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

size_t f16_quantize(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
    const int64_t n = n_rows * n_per_row;
    kernels::act_f16_scalar(src, dst, n);
    return size_t(n) * 2;
}

void f16_activation(const float* x, void* dst, int64_t n) {
    if (cpu_has_avx2())
        kernels::act_f16_avx2(x, dst, n);
    else
        kernels::act_f16_scalar(x, dst, n);
}

// Products of two binary16 values are exact in float; the sum is in double.
float f16_dot_ref(int64_t n, const void* w, const void* a) {
    const uint16_t* x = static_cast<const uint16_t*>(w);
    const uint16_t* y = static_cast<const uint16_t*>(a);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
    return float(sum);
}

// ---- BF16 ----

void bf16_dequantize(const void* src, float* dst, int64_t n) {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

void bf16_activation(const float* x, void* dst, int64_t n) {
    uint16_t* h = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(x[i]);
}

size_t bf16_quantize(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
    const int64_t n = n_rows * n_per_row;
    bf16_activation(src, dst, n);
    return size_t(n) * 2;
}

float bf16_dot_ref(int64_t n, const void* w, const void* a) {
    const uint16_t* x = static_cast<const uint16_t*>(w);
    const uint16_t* y = static_cast<const uint16_t*>(a);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
    return float(sum);
}

// The multi kernels read a weight row once for several tokens (the MoE
// router and F16 models' products in batched decode).
const FormatOps kF32 = {f32_copy,
                        f32_quantize,
                        f32_activation,
                        f32_dot_ref,
                        kernels::dot_f32_avx2,
                        kernels::dot_f32_avx512,
                        kernels::dot_f32_multi_avx2,
                        kernels::dot_f32_multi_avx512};
const FormatOps kF16 = {f16_dequantize,
                        f16_quantize,
                        f16_activation,
                        f16_dot_ref,
                        kernels::dot_f16_avx2,
                        kernels::dot_f16_avx512,
                        kernels::dot_f16_multi_avx2,
                        kernels::dot_f16_multi_avx512};
const FormatOps kBF16 = {bf16_dequantize,
                         bf16_quantize,
                         bf16_activation,
                         bf16_dot_ref,
                         kernels::dot_bf16_avx2,
                         kernels::dot_bf16_avx512,
                         kernels::dot_bf16_multi_avx2,
                         kernels::dot_bf16_multi_avx512};

}  // namespace

void kernels::act_f16_scalar(const float* x, void* dst, int64_t n) {
    uint16_t* h = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}

const FormatOps* float_ops(Type t) {
    switch (t) {
        case Type::F32:
            return &kF32;
        case Type::F16:
            return &kF16;
        case Type::BF16:
            return &kBF16;
        default:
            return nullptr;
    }
}

}  // namespace glm5::quant

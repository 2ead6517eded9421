#include "backend/cpu_simd.h"

#include "core/fp16.h"
#include "quant/ops.h"

namespace glm5::backend::cpu {

namespace scalar {

void axpy_f32(int64_t n, float a, const float* x, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}
void f16_to_f32(int64_t n, const uint16_t* src, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * fp16_to_fp32(b[i + k]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * fp16_to_fp32(b[i]);
    return s;
}

}  // namespace scalar

const SimdOps& simd() {
    static const SimdOps ops =
        quant::cpu_has_avx2()
            ? SimdOps{avx2::axpy_f32, avx2::axpy_f16, avx2::f16_to_f32, avx2::dot_f32_f16}
            : SimdOps{scalar::axpy_f32, scalar::axpy_f16, scalar::f16_to_f32, scalar::dot_f32_f16};
    return ops;
}

}  // namespace glm5::backend::cpu

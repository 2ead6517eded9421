// Functions that compile for the host and for a GPU: nvcc marks them __host__
// __device__, a host compiler sees plain inline functions. The arithmetic a GPU's
// kernels are written in lives in such functions, so that the CPU test suite runs it.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define GLM5_HD __host__ __device__ __forceinline__
#else
#define GLM5_HD inline
#endif

namespace glm5 {

// a * b rounded once: never fused into a neighbouring add (nvcc contracts a * b + c into
// one FMA unless told not to; the host build compiles ISO C++, which does not), so that
// the two compilations of one function round alike.
GLM5_HD float hd_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

// 1 / (1 + e^-x), as both backends compute it (their expf agree to an ulp or two).
GLM5_HD float hd_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

}  // namespace glm5

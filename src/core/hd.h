// Functions that compile for the host and for a GPU: nvcc marks them __host__
// __device__, a host compiler sees plain inline functions. The arithmetic a GPU's
// kernels are written in lives in such functions, so that the CPU test suite runs it.
#pragma once

#if defined(__CUDACC__)
#define GLM5_HD __host__ __device__ __forceinline__
#else
#define GLM5_HD inline
#endif

// How the backend's kernels are written, so that one source serves nvcc and the simulation
// build (GLM5_CUDA_SIM: the host compiler and src/cudasim/, which runs them on the CPU):
// - shared memory is declared with GLM5_SHARED (an array), GLM5_SHARED_VAR (one value) and
//   GLM5_DYNAMIC_SHARED (the launch's dynamic part), never with __shared__ itself;
// - kernels are launched with GLM5_LAUNCH(kernel, grid, block, shared bytes, stream, args...),
//   which is kernel<<<grid, block, shared, stream>>>(args...) under nvcc, then checks the
//   launch (and, with GLM5_CUDA_SYNC=1, waits for the kernel, so a fault names it).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#if defined(GLM5_CUDA_SIM)
#define GLM5_SHARED(T, name, n)        \
    static const char name##_key_ = 0; \
    T* const name = ::cudasim::shared_array<T>(&name##_key_, (n))
#define GLM5_SHARED_VAR(T, name)       \
    static const char name##_key_ = 0; \
    T& name = *::cudasim::shared_array<T>(&name##_key_, 1)
#define GLM5_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::cudasim::dynamic_shared())
#else
#define GLM5_SHARED(T, name, n) __shared__ T name[n]
#define GLM5_SHARED_VAR(T, name) __shared__ T name
#define GLM5_DYNAMIC_SHARED(T, name)                                      \
    extern __shared__ __align__(16) unsigned char glm5_dynamic_shared_[]; \
    T* const name = reinterpret_cast<T*>(glm5_dynamic_shared_)
#endif

namespace glm5::backend::cuda {

// Throws glm5::Error naming the kernel when its launch failed; with GLM5_CUDA_SYNC=1 it waits
// for the kernel too, so that a fault is reported by the kernel that caused it rather than
// by a later call.
void launched(const char* kernel, cudaStream_t s);

template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared,
            cudaStream_t s, A&&... args) {
#if defined(GLM5_CUDA_SIM)
    ::cudasim::launch(name, kernel, grid, block, shared, s, std::forward<A>(args)...);
#else
    // clang-format off
    kernel<<<grid, block, shared, s>>>(std::forward<A>(args)...);
    // clang-format on
#endif
    launched(name, s);
}

}  // namespace glm5::backend::cuda

#define GLM5_LAUNCH(kernel, grid, block, shared, stream, ...) \
    ::glm5::backend::cuda::launch(#kernel, kernel, grid, block, shared, stream, __VA_ARGS__)

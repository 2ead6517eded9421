// How the backend's kernels are written, so that one source serves nvcc and the simulation
// build (GLM5_CUDA_SIM: the host compiler and src/cudasim/, which runs them on the CPU):
// - shared memory is declared with GLM5_SHARED (an array), GLM5_SHARED_VAR (one value) and
//   GLM5_DYNAMIC_SHARED (the launch's dynamic part), never with __shared__ itself;
// - kernels are launched with GLM5_LAUNCH(kernel, grid, block, shared bytes, stream, args...),
//   which is kernel<<<grid, block, shared, stream>>>(args...) under nvcc, then checks the
//   launch (and, with GLM5_CUDA_SYNC=1, waits for the kernel, so a fault names it); in a
//   step being recorded as a graph the launch is kept until the step's end instead.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

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
// by a later call. `counted`: the launch adds to its device's count (a recorded launch was
// counted when it was recorded).
void launched(const char* kernel, cudaStream_t s, bool counted = true);

// A step being recorded (Device::begin_graph): the work queued on its stream is kept, in
// order, to run at the step's end as one CUDA graph, with a key of everything that work was
// given (kernels, launch sizes, argument bytes, copies' addresses and sizes). Two steps of
// equal keys queue the same work: the second replays the first's graph.
class StepRecorder {
  public:
    template <class T>
    void key(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        // Padding bytes hold anything: a key of them would differ between equal launches.
        static_assert(std::has_unique_object_representations_v<T> || std::is_floating_point_v<T>,
                      "a launch argument with padding cannot be part of a step's key");
        const auto* p = reinterpret_cast<const unsigned char*>(&v);
        key_.insert(key_.end(), p, p + sizeof(T));
    }
    void add(std::function<void()> op) { ops_.push_back(std::move(op)); }
    // The recorded work and its key, taken (the recorder starts empty again).
    struct Work {
        std::vector<unsigned char> key;
        std::vector<std::function<void()>> ops;
    };
    Work take() { return {std::exchange(key_, {}), std::exchange(ops_, {})}; }

  private:
    std::vector<unsigned char> key_;
    std::vector<std::function<void()>> ops_;
};

// The recorder of the step being recorded on s, or null (the work is queued as it comes).
StepRecorder* recorder_of(cudaStream_t s);
// A launch on s, counted as its device's.
void count_launch(cudaStream_t s);

template <class... P, class... A>
void start_kernel(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared,
                  cudaStream_t s, A&&... args) {
#if defined(GLM5_CUDA_SIM)
    ::cudasim::launch(name, kernel, grid, block, shared, s, std::forward<A>(args)...);
#else
    (void)name;
    // clang-format off
    kernel<<<grid, block, shared, s>>>(std::forward<A>(args)...);
    // clang-format on
#endif
}

template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared,
            cudaStream_t s, A&&... args) {
    if (StepRecorder* r = recorder_of(s)) {
        count_launch(s);
        // The arguments as the kernel takes them, so that the key holds what it will read.
        auto keep = [&](std::decay_t<P>... a) {
            r->key(reinterpret_cast<uintptr_t>(kernel));
            r->key(grid);
            r->key(block);
            r->key(shared);
            (r->key(a), ...);
            r->add([=] {
                start_kernel(name, kernel, grid, block, shared, s, a...);
                launched(name, s, false);
            });
        };
        keep(std::forward<A>(args)...);
        return;
    }
    start_kernel(name, kernel, grid, block, shared, s, std::forward<A>(args)...);
    launched(name, s);
}

}  // namespace glm5::backend::cuda

#define GLM5_LAUNCH(kernel, grid, block, shared, stream, ...) \
    ::glm5::backend::cuda::launch(#kernel, kernel, grid, block, shared, stream, __VA_ARGS__)

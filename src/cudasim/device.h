// What a kernel sees in the simulation build: CUDA's keywords, the built-in indices, the
// block's barrier, the warp's collectives, atomics and the rounding intrinsics, and the
// launch that runs a kernel on a simulated device.
//
// Each CUDA thread of a block is a fiber of its own (to ThreadSanitizer too: a missing
// barrier between two threads' accesses is a race it reports). A block's fibers run in
// turn on the stream's thread until each finishes or waits in a collective; a collective
// completes when every thread it names has arrived. A barrier some threads of a block never
// reach, a warp collective a named lane never calls, or lanes that disagree on it stop the
// kernel with a fault naming the kernel, the block and the threads (runtime.h: fault()).
// Blocks run one at a time.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cudasim/runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict

namespace cudasim {

struct ThreadIds {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
namespace detail {
extern thread_local const ThreadIds* tl_ids;
}  // namespace detail

// ---- collectives (the running block's; called from kernels only) ---------------------------
using Where = std::source_location;
void syncthreads(const Where& at);
void syncwarp(unsigned mask, const Where& at);
enum class Shuffle { Idx, Up, Down, Xor };
uint64_t shuffle(Shuffle kind, unsigned mask, uint64_t bits, int arg, int width, const Where& at);
enum class Vote { Ballot, Any, All };
unsigned vote(Vote kind, unsigned mask, bool pred, const Where& at);
// The block's shared memory: a static array (key: its declaration) of `bytes`, the same
// for every thread of the block, and the launch's dynamic shared memory.
void* block_shared(const void* key, size_t bytes, size_t align);
void* dynamic_shared();
template <class T>
T* shared_array(const void* key, size_t n) {
    return static_cast<T*>(block_shared(key, n * sizeof(T), alignof(T)));
}

// ---- launches ------------------------------------------------------------------------------
struct Kernel {
    const char* name = "";
    const void* fn = nullptr;
    dim3 grid, block;
    size_t shared = 0;
    std::function<void()> body;  // one CUDA thread's run
    // The pointer arguments (argument number, value): each must point into the device's
    // memory (or memory pinned for it), as on a GPU, where a host address faults.
    std::vector<std::pair<int, const void*>> pointers;
};
cudaError_t launch_kernel(std::shared_ptr<const Kernel> k, cudaStream_t s);

// For tests of what runs at once: called on a stream's own thread as each kernel begins
// (with its name), before it runs. It may block, which holds that stream alone, as a busy
// device holds it. An empty function removes it.
void set_kernel_start_hook(std::function<void(const char* kernel)> hook);

template <class T>
void note_pointer(Kernel& k, int i, const T& v) {
    if constexpr (std::is_pointer_v<T>) k.pointers.emplace_back(i, static_cast<const void*>(v));
}

// kernel<<<grid, block, shared, s>>>(args...): the arguments are converted to the
// kernel's parameter types and kept by value, as CUDA does.
template <class... P, class... A>
cudaError_t launch(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t shared,
                   cudaStream_t s, A&&... a) {
    auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
    auto k = std::make_shared<Kernel>();
    k->name = name;
    k->fn = reinterpret_cast<const void*>(fn);
    k->grid = grid;
    k->block = block;
    k->shared = shared;
    std::apply(
        [&](const auto&... v) {
            int i = 0;
            (note_pointer(*k, i++, v), ...);
        },
        *args);
    k->body = [fn, args] { std::apply(fn, *args); };
    return launch_kernel(std::move(k), s);
}

// ---- stream-ordered notes on memory a program carves from its own allocations -------------
// carve: [p, p + bytes) may be read and written from here on in s's order (AddressSanitizer
// watches the rest); release: it is filled with NaN and watched again, so a read of memory
// released, or of a neighbour's past its end, is reported with the kernel's line.
void carve(cudaStream_t s, const void* p, size_t bytes);
void release(cudaStream_t s, const void* p, size_t bytes);

}  // namespace cudasim

// ---- CUDA's built-ins ------------------------------------------------------------------------
#define threadIdx (::cudasim::detail::tl_ids->thread)
#define blockIdx (::cudasim::detail::tl_ids->block)
#define blockDim (::cudasim::detail::tl_ids->block_dim)
#define gridDim (::cudasim::detail::tl_ids->grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads(const cudasim::Where& at = cudasim::Where::current()) {
    cudasim::syncthreads(at);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       const cudasim::Where& at = cudasim::Where::current()) {
    cudasim::syncwarp(mask, at);
}

namespace cudasim::detail {
template <class T>
uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a shuffle moves 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
}  // namespace cudasim::detail

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32,
              const cudasim::Where& at = cudasim::Where::current()) {
    return cudasim::detail::from_bits<T>(
        cudasim::shuffle(cudasim::Shuffle::Idx, mask, cudasim::detail::to_bits(v), src, width, at));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 const cudasim::Where& at = cudasim::Where::current()) {
    return cudasim::detail::from_bits<T>(cudasim::shuffle(
        cudasim::Shuffle::Up, mask, cudasim::detail::to_bits(v), int(delta), width, at));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   const cudasim::Where& at = cudasim::Where::current()) {
    return cudasim::detail::from_bits<T>(cudasim::shuffle(
        cudasim::Shuffle::Down, mask, cudasim::detail::to_bits(v), int(delta), width, at));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  const cudasim::Where& at = cudasim::Where::current()) {
    return cudasim::detail::from_bits<T>(cudasim::shuffle(
        cudasim::Shuffle::Xor, mask, cudasim::detail::to_bits(v), lane_mask, width, at));
}
inline unsigned __ballot_sync(unsigned mask, int pred,
                              const cudasim::Where& at = cudasim::Where::current()) {
    return cudasim::vote(cudasim::Vote::Ballot, mask, pred != 0, at);
}
inline int __any_sync(unsigned mask, int pred,
                      const cudasim::Where& at = cudasim::Where::current()) {
    return int(cudasim::vote(cudasim::Vote::Any, mask, pred != 0, at));
}
inline int __all_sync(unsigned mask, int pred,
                      const cudasim::Where& at = cudasim::Where::current()) {
    return int(cudasim::vote(cudasim::Vote::All, mask, pred != 0, at));
}

// Atomics: relaxed, as a GPU's are (ThreadSanitizer sees them as atomics).
template <class T>
T atomicAdd(T* p, T v) {
    if constexpr (std::is_floating_point_v<T>) {
        T old, next;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do {
            next = old + v;
        } while (
            !__atomic_compare_exchange(p, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
}
template <class T>
T atomicSub(T* p, T v) {
    return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
template <class T>
T atomicExch(T* p, T v) {
    T old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
template <class T>
T atomicCAS(T* p, T compare, T v) {
    __atomic_compare_exchange(p, &compare, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
template <class T>
T atomicMax(T* p, T v) {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange(p, &old, &v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
T atomicMin(T* p, T v) {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    while (v < old &&
           !__atomic_compare_exchange(p, &old, &v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
T atomicOr(T* p, T v) {
    return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
template <class T>
T atomicAnd(T* p, T v) {
    return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);
}
inline void __threadfence() {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void __threadfence_block() {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// Intrinsics with CUDA's rounding: the simulation build compiles with -ffp-contract=off, so
// a product or sum is rounded on its own and fmaf rounds once, as the GPU's.
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __frcp_rn(float a) {
    return 1.0f / a;
}
inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
inline float __fmaf_rn(float a, float b, float c) {
    return __builtin_fmaf(a, b, c);
}
inline double __dmul_rn(double a, double b) {
    return a * b;
}
inline double __dadd_rn(double a, double b) {
    return a + b;
}
inline double __fma_rn(double a, double b, double c) {
    return __builtin_fma(a, b, c);
}
inline float __uint_as_float(unsigned u) {
    return cudasim::detail::from_bits<float>(u);
}
inline unsigned __float_as_uint(float f) {
    return unsigned(cudasim::detail::to_bits(f));
}
inline float __int_as_float(int i) {
    return cudasim::detail::from_bits<float>(uint32_t(i));
}
inline int __float_as_int(float f) {
    return int(uint32_t(cudasim::detail::to_bits(f)));
}
inline long long __double_as_longlong(double d) {
    return (long long)cudasim::detail::to_bits(d);
}
inline double __longlong_as_double(long long v) {
    return cudasim::detail::from_bits<double>(uint64_t(v));
}
inline int __popc(unsigned v) {
    return __builtin_popcount(v);
}
inline int __popcll(unsigned long long v) {
    return __builtin_popcountll(v);
}
inline int __clz(int v) {
    return v == 0 ? 32 : __builtin_clz(unsigned(v));
}
inline int __ffs(int v) {
    return __builtin_ffs(v);
}
template <class T>
T __ldg(const T* p) {
    return *p;
}

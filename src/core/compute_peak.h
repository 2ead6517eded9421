// The machine's measured float32 FMA throughput on every thread of a pool:
// the denominator of "share of the compute peak" in `glm5 bench --mmproj`
// (the vision tower is compute-bound, unlike decode).
#pragma once

namespace glm5 {

class ThreadPool;

// Best of `reps` runs of independent vector FMA chains (the widest the CPU
// has: AVX-512, AVX2+FMA, else scalar), in 1e9 float operations per second
// (an FMA counts two).
double measure_fma_peak(ThreadPool& pool, int reps = 3);

namespace detail {
// Floating-point operations done by `iters` rounds of the kernels.
double fma_chains_avx2(long iters);
double fma_chains_avx512(long iters);
}  // namespace detail

}  // namespace glm5

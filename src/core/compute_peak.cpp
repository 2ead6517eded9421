#include "core/compute_peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/thread_pool.h"

namespace glm5 {

namespace {

double scalar_chains(long iters) {
    float a[12];
    for (int i = 0; i < 12; ++i) a[i] = float(i) * 1e-3f;
    for (long it = 0; it < iters; ++it)
        for (int i = 0; i < 12; ++i) a[i] = a[i] * 0.999999f + 1e-7f;
    volatile float sink = a[0] + a[11];
    (void)sink;
    return double(iters) * 12 * 2;
}

}  // namespace

double measure_fma_peak(ThreadPool& pool, int reps) {
    __builtin_cpu_init();
    double (*chains)(long) = scalar_chains;
    if (__builtin_cpu_supports("avx512f"))
        chains = detail::fma_chains_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        chains = detail::fma_chains_avx2;
    constexpr long kIters = 20'000'000;  // ~0.1 s per thread on a 3 GHz core
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        std::atomic<double> flops{0};
        const auto t0 = std::chrono::steady_clock::now();
        pool.run([&](int, int) {
            const double f = chains(kIters);
            double cur = flops.load();
            while (!flops.compare_exchange_weak(cur, cur + f)) {
            }
        });
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, flops.load() / s * 1e-9);
    }
    return best;
}

}  // namespace glm5

#include "core/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace glm5 {

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
    bytes = bytes / 4096 * 4096;
    auto* buf = static_cast<uint64_t*>(std::aligned_alloc(4096, bytes));
    if (!buf) throw ResourceError("cannot allocate the bandwidth test buffer");
    const size_t n = bytes / sizeof(uint64_t);
    // Fill from every thread so pages are spread as the reads will be.
    pool.run([&](int ith, int nt) {
        const size_t b = n / size_t(nt) * size_t(ith),
                     e = ith == nt - 1 ? n : n / size_t(nt) * size_t(ith + 1);
        for (size_t i = b; i < e; ++i) buf[i] = i;
    });
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.run([&](int ith, int nt) {
            const size_t b = n / size_t(nt) * size_t(ith),
                         e = ith == nt - 1 ? n : n / size_t(nt) * size_t(ith + 1);
            uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
            size_t i = b;
            for (; i + 8 <= e; i += 8) {
                a0 += buf[i];
                a1 += buf[i + 1];
                a2 += buf[i + 2];
                a3 += buf[i + 3];
                a4 += buf[i + 4];
                a5 += buf[i + 5];
                a6 += buf[i + 6];
                a7 += buf[i + 7];
            }
            for (; i < e; ++i) a0 += buf[i];
            sink += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
        });
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(bytes) / s / 1e9);
    }
    std::free(buf);
    return {best, bytes};
}

}  // namespace glm5

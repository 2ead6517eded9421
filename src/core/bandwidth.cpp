#include "core/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/error.h"
#include "core/thread_pool.h"

namespace glm5 {

namespace {
// Each thread asks for the line 4 KiB ahead of the one it reads, as the
// weight kernels prefetch their blocks: the hardware prefetchers alone
// measured about 14 GB/s on a host where prefetched streams read 18 (and
// where decode then reached 108-113% of that lower "roofline").
constexpr size_t kAheadWords = 4096 / sizeof(uint64_t);

inline void prefetch_line(const uint64_t* p) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p)));
#else
    __builtin_prefetch(p);
#endif
}

// Thread ith's share [b, e) of n words.
void share(size_t n, int ith, int nt, size_t& b, size_t& e) {
    b = n / size_t(nt) * size_t(ith);
    e = ith == nt - 1 ? n : n / size_t(nt) * size_t(ith + 1);
}
}  // namespace

ReadBandwidth::ReadBandwidth(ThreadPool& pool, size_t bytes)
    : pool_(pool), bytes_(std::max<size_t>(bytes / 4096 * 4096, 4096)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw ResourceError("cannot allocate the bandwidth test buffer");
    ::madvise(p, bytes_, MADV_HUGEPAGE);
    buf_ = static_cast<uint64_t*>(p);
    // Fill from every thread so pages are spread as the reads will be.
    const size_t n = bytes_ / sizeof(uint64_t);
    pool_.run([&](int ith, int nt) {
        size_t b, e;
        share(n, ith, nt, b, e);
        for (size_t i = b; i < e; ++i) buf_[i] = i;
    });
}

ReadBandwidth::~ReadBandwidth() {
    ::munmap(buf_, bytes_);
}

double ReadBandwidth::measure(int reps) {
    const size_t n = bytes_ / sizeof(uint64_t);
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pool_.run([&](int ith, int nt) {
            size_t b, e;
            share(n, ith, nt, b, e);
            uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
            size_t i = b;
            for (; i + 8 <= e; i += 8) {
                // Past the end of the share is still inside the buffer or harmless.
                prefetch_line(buf_ + std::min(i + kAheadWords, n - 1));
                a0 += buf_[i];
                a1 += buf_[i + 1];
                a2 += buf_[i + 2];
                a3 += buf_[i + 3];
                a4 += buf_[i + 4];
                a5 += buf_[i + 5];
                a6 += buf_[i + 6];
                a7 += buf_[i + 7];
            }
            for (; i < e; ++i) a0 += buf_[i];
            sink += a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
        });
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(bytes_) / s / 1e9);
    }
    return best;
}

}  // namespace glm5

#include "core/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/error.h"
#include "core/thread_pool.h"

namespace glm5 {

namespace {
// Each thread reads its share as four streams side by side, 512 bytes of
// each in turn, and asks for the line 4 KiB ahead of the one it reads in
// each: the weight kernels read a matrix that way (repack_avx512.cpp), and
// it is the fastest pattern measured (four interleaved streams read about a
// quarter faster than one, and far faster than the hardware prefetchers
// alone).
constexpr size_t kStreams = 4;
constexpr size_t kPieceWords = 512 / sizeof(uint64_t);
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

// Sum of words [b, e) read as kStreams interleaved streams.
uint64_t read_streams(const uint64_t* buf, size_t b, size_t e, size_t n) {
    const size_t len = (e - b) / kStreams / kPieceWords * kPieceWords;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i < len; i += kPieceWords)
        for (size_t s = 0; s < kStreams; ++s) {
            const size_t p0 = b + s * len + i;
            for (size_t j = p0; j < p0 + kPieceWords; j += 8) {
                // Past the end of the stream is still inside the buffer or harmless.
                prefetch_line(buf + std::min(j + kAheadWords, n - 1));
                a0 += buf[j];
                a1 += buf[j + 1];
                a2 += buf[j + 2];
                a3 += buf[j + 3];
                a4 += buf[j + 4];
                a5 += buf[j + 5];
                a6 += buf[j + 6];
                a7 += buf[j + 7];
            }
        }
    for (size_t j = b + kStreams * len; j < e; ++j) a0 += buf[j];
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
// Sum of words [b, e), front to back.
uint64_t read_plain(const uint64_t* buf, size_t b, size_t e) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t j = b;
    for (; j + 4 <= e; j += 4) {
        a0 += buf[j];
        a1 += buf[j + 1];
        a2 += buf[j + 2];
        a3 += buf[j + 3];
    }
    for (; j < e; ++j) a0 += buf[j];
    return a0 + a1 + a2 + a3;
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
    return run(reps, false);
}

double ReadBandwidth::measure_plain(int reps) {
    return run(reps, true);
}

double ReadBandwidth::run(int reps, bool plain) {
    const size_t n = bytes_ / sizeof(uint64_t);
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pool_.run([&](int ith, int nt) {
            size_t b, e;
            share(n, ith, nt, b, e);
            sink += plain ? read_plain(buf_, b, e) : read_streams(buf_, b, e, n);
        });
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(bytes_) / s / 1e9);
    }
    return best;
}

}  // namespace glm5

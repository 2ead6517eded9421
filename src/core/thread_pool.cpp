#include "core/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define GLM5_PAUSE() _mm_pause()
#else
#define GLM5_PAUSE() ((void)0)
#endif

namespace glm5 {

namespace {
// Busy-wait briefly between ops (decode issues them back to back), then
// yield the core, then sleep. Yielding matters when the machine is
// oversubscribed: a spinning worker must not hold the core its caller needs.
constexpr int kSpinIterations = 1 << 12;
constexpr int kYieldIterations = 64;

template <class Pred>
void spin_then_yield(Pred done) {
    for (int i = 0; i < kSpinIterations; ++i) {
        if (done()) return;
        GLM5_PAUSE();
    }
    for (int i = 0; i < kYieldIterations; ++i) {
        if (done()) return;
        sched_yield();
    }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    threads_.reserve(size_t(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        spin_then_yield([&] { return generation_.load(std::memory_order_acquire) != seen; });
        const uint64_t g = generation_.load(std::memory_order_acquire);
        if (g == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            continue;
        }
        seen = g;
        if (stop_.load(std::memory_order_acquire)) return;
        (*job_)(ith, n_threads_);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    fn(0, n_threads_);
    spin_then_yield([&] { return pending_.load(std::memory_order_acquire) == 0; });
    int left = pending_.load(std::memory_order_acquire);
    while (left != 0) {
        pending_.wait(left, std::memory_order_acquire);
        left = pending_.load(std::memory_order_acquire);
    }
    job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n, 0);
        return;
    }
    std::atomic<int64_t> next{0};
    run([&](int ith, int) {
        for (;;) {
            const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
            if (b >= n) break;
            fn(b, std::min(n, b + grain), ith);
        }
    });
}

void ThreadPool::parallel_for_guided(int64_t n, int64_t min_grain,
                                     const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    min_grain = std::max<int64_t>(1, min_grain);
    if (n_threads_ == 1 || n <= min_grain) {
        fn(0, n, 0);
        return;
    }
    const int64_t div = 2 * int64_t(n_threads_);
    std::atomic<int64_t> next{0};
    run([&](int ith, int) {
        int64_t b = next.load(std::memory_order_relaxed);
        for (;;) {
            if (b >= n) break;
            const int64_t len = std::max(min_grain, (n - b + div - 1) / div);
            if (!next.compare_exchange_weak(b, b + len, std::memory_order_relaxed)) continue;
            fn(b, std::min(n, b + len), ith);
            b = next.load(std::memory_order_relaxed);
        }
    });
}

int ThreadPool::default_threads() {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = int(std::thread::hardware_concurrency());
    return std::max(1, n);
}

}  // namespace glm5

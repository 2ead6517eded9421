#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#define GLM5_PAUSE() _mm_pause()
#else
#define GLM5_PAUSE() ((void)0)
#endif

namespace glm5 {

namespace {

using Clock = std::chrono::steady_clock;

// Outside a step a worker spins this long after an op before it yields, then sleeps;
// inside a step (hold()) it spins this long before it starts yielding the core between
// checks (a step's serial host work between ops can be long; the core is given up, the
// thread stays awake). The caller of an op waiting for its last chunks spins as long
// before it yields.
constexpr auto kIdleSpin = std::chrono::microseconds(50);
constexpr int kIdleYields = 64;
constexpr auto kHeldSpin = std::chrono::milliseconds(2);
constexpr auto kWaitSpin = std::chrono::microseconds(100);
constexpr uint32_t kClosed = 0xFFFFFFFFu;

uint64_t pack(uint32_t epoch, uint32_t pos) {
    return uint64_t(epoch) << 32 | pos;
}

// Pauses, checking the clock only now and then (it costs more than a pause).
struct Spinner {
    Clock::time_point start = Clock::now();
    int n = 0;
    bool within(Clock::duration limit) {
        GLM5_PAUSE();
        if (++n % 64) return true;
        return Clock::now() - start < limit;
    }
    void restart() {
        start = Clock::now();
        n = 0;
    }
};

int read_int(const std::string& path) {
    std::ifstream f(path);
    int v = -1;
    f >> v;
    return f ? v : -1;
}

// The CPUs of the affinity mask, one of each physical core first (by package and core
// id; a CPU whose core is unknown counts as a core of its own), then their siblings;
// `physical` is how many come first.
struct Cpus {
    std::vector<int> ordered;
    int physical = 0;
};

Cpus affinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    std::set<std::pair<int, int>> cores;
    Cpus out;
    std::vector<int> rest;
    for (int c : cpus) {
        const std::string t = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        const std::pair<int, int> core{read_int(t + "physical_package_id"),
                                       read_int(t + "core_id")};
        if (core.second < 0 || cores.insert(core).second)
            out.ordered.push_back(c);
        else
            rest.push_back(c);
    }
    out.physical = int(out.ordered.size());
    out.ordered.insert(out.ordered.end(), rest.begin(), rest.end());
    return out;
}

int physical_or_all(const Cpus& c) {
    return c.physical > 0 ? c.physical : std::max(1, int(std::thread::hardware_concurrency()));
}

}  // namespace

std::vector<int> ThreadPool::affinity_cpus() {
    return affinity().ordered;
}

int ThreadPool::default_threads() {
    return physical_or_all(affinity());
}

ThreadPool::ThreadPool(const PoolOptions& opt) : n_threads_(std::max(1, opt.n_threads)) {
    const Cpus c = affinity();
    const std::vector<int>& cpus = c.ordered;
    pinned_ = n_threads_ > 1 && !cpus.empty() &&
              (opt.pin == 1 || (opt.pin == -1 && n_threads_ >= physical_or_all(c)));
    threads_.reserve(size_t(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) {
        threads_.emplace_back([this, i] { worker(i); });
        if (pinned_) {
            // The caller keeps its own CPU (the first); worker i takes the i-th.
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[size_t(i) % cpus.size()], &one);
            pthread_setaffinity_np(threads_.back().native_handle(), sizeof(one), &one);
        }
    }
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_seq_cst);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::hold() {
    if (holds_.fetch_add(1, std::memory_order_seq_cst) == 0 && sleepers_.load() > 0) {
        // Wake the sleepers so that the step's first op finds them awake: a change
        // of the word they sleep on, with no op behind it.
        epoch_.fetch_add(0, std::memory_order_seq_cst);
        epoch_.notify_all();
    }
}

void ThreadPool::release() {
    holds_.fetch_sub(1, std::memory_order_seq_cst);
}

void ThreadPool::worker(int ith) {
    // No op was published before the pool existed; one published before this thread
    // got going is still to be taken up (a run() needs every worker).
    uint32_t seen = 0;
    Spinner spin;
    int yields = 0;
    for (;;) {
        const uint32_t e = epoch_.load(std::memory_order_acquire);
        if (stop_.load(std::memory_order_acquire)) return;
        if (e == seen) {
            if (holds_.load(std::memory_order_relaxed) > 0) {
                if (!spin.within(kHeldSpin)) sched_yield();
                continue;
            }
            if (spin.within(kIdleSpin)) continue;
            if (yields++ < kIdleYields) {
                sched_yield();
                continue;
            }
            // Sleep until an op or a hold: the count is raised before the word is read
            // again, so a publisher either sees the sleeper or the sleeper the op.
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            if (epoch_.load(std::memory_order_seq_cst) == seen &&
                holds_.load(std::memory_order_seq_cst) == 0 && !stop_.load())
                epoch_.wait(seen, std::memory_order_seq_cst);
            sleepers_.fetch_sub(1, std::memory_order_seq_cst);
            spin.restart();
            yields = 0;
            continue;
        }
        seen = e;
        if (gate_) gate_(ith);
        if (each_epoch_.load(std::memory_order_acquire) == e) {
            (*each_.load(std::memory_order_acquire))(ith, n_threads_);
            each_pending_.fetch_sub(1, std::memory_order_acq_rel);
        } else {
            work(e, ith);
        }
        spin.restart();
        yields = 0;
    }
}

void ThreadPool::work(uint32_t epoch, int ith) {
    for (;;) {
        uint64_t w = claim_.load(std::memory_order_acquire);
        if (uint32_t(w >> 32) != epoch) return;
        const uint32_t pos = uint32_t(w);
        // The op's parameters: this op's, if the claim below succeeds. The next op's
        // are stored (release) after this one is closed, so a thread that reads them
        // (acquire) sees the close, and its claim fails.
        const int64_t n = n_.load(std::memory_order_acquire);
        if (int64_t(pos) >= n) return;
        const int64_t g = grain_.load(std::memory_order_acquire);
        int64_t len = g;
        if (guided_.load(std::memory_order_acquire)) {
            const int64_t div = 2 * int64_t(n_threads_);
            len = std::max(g, (n - int64_t(pos) + div - 1) / div);
        }
        len = std::min(len, n - int64_t(pos));
        if (!claim_.compare_exchange_weak(w, pack(epoch, uint32_t(pos + len)),
                                          std::memory_order_acq_rel, std::memory_order_acquire))
            continue;
        (*fn_.load(std::memory_order_acquire))(pos, pos + len, ith);
        done_.fetch_add(len, std::memory_order_release);
    }
}

void ThreadPool::wait_done(int64_t n) {
    Spinner spin;
    while (done_.load(std::memory_order_acquire) < n)
        if (!spin.within(kWaitSpin)) sched_yield();
}

void ThreadPool::dispatch(const RangeFn& fn, int64_t n, int64_t grain, bool guided) {
    const uint32_t e = ++next_epoch_;
    fn_.store(&fn, std::memory_order_release);
    n_.store(n, std::memory_order_release);
    grain_.store(grain, std::memory_order_release);
    guided_.store(guided, std::memory_order_release);
    done_.store(0, std::memory_order_relaxed);
    claim_.store(pack(e, 0), std::memory_order_release);
    epoch_.store(e, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
    work(e, 0);
    wait_done(n);
    // Closed: a thread that arrives now claims nothing.
    claim_.store(pack(e, kClosed), std::memory_order_release);
    ops_.fetch_add(1, std::memory_order_relaxed);
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    const uint32_t e = ++next_epoch_;
    each_.store(&fn, std::memory_order_relaxed);
    each_pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    each_epoch_.store(e, std::memory_order_release);
    claim_.store(pack(e, kClosed), std::memory_order_release);
    epoch_.store(e, std::memory_order_seq_cst);
    epoch_.notify_all();  // every worker runs its part: the sleepers too
    fn(0, n_threads_);
    Spinner spin;
    while (each_pending_.load(std::memory_order_acquire) > 0)
        if (!spin.within(kWaitSpin)) sched_yield();
    ops_.fetch_add(1, std::memory_order_relaxed);
    rendezvous_.fetch_add(1, std::memory_order_relaxed);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n, 0);
        return;
    }
    dispatch(fn, n, grain, false);
}

void ThreadPool::parallel_for_guided(int64_t n, int64_t min_grain,
                                     const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    min_grain = std::max<int64_t>(1, min_grain);
    if (n_threads_ == 1 || n <= min_grain) {
        fn(0, n, 0);
        return;
    }
    dispatch(fn, n, min_grain, true);
}

}  // namespace glm5

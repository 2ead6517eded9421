// A persistent pool of worker threads. Work is handed out per call with no thread
// creation. An op is done when its work is done: its chunks are claimed from a counter
// that carries the op's epoch, so a thread that arrives late (descheduled, slow to
// wake) finds the op over and claims nothing, and a late thread delays an op by at most
// the one chunk it holds, never by having to check in. Between ops workers spin; while
// a step holds the pool (hold() / release(): a forward's many short ops) they stay awake
// however long the caller's serial work between ops takes (yielding the core after a
// while), otherwise they sleep on a futex after a short spin.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace glm5 {

struct PoolOptions {
    int n_threads = 1;  // counts the calling thread: 1 runs everything inline
    // Pin each worker to its own CPU of the process's affinity mask (one per physical
    // core first): -1 when the threads fill the mask's physical cores, 0 never, 1 always.
    int pin = -1;
};

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads) : ThreadPool(PoolOptions{n_threads, -1}) {}
    explicit ThreadPool(const PoolOptions& opt);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(ith, nth) once on every thread (the caller is ith 0), all at the same
    // time, and returns when all have finished: a rendezvous, for measurements that
    // need every thread (bandwidth, FMA peak). Not re-entrant.
    void run(const std::function<void(int ith, int nth)>& fn);

    // Splits [0, n) into chunks of `grain` handed out dynamically; each chunk goes to
    // exactly one thread as fn(begin, end, ith). Which thread runs a chunk varies, so fn
    // must write disjoint outputs in a fixed order. Returns when every chunk is done.
    void parallel_for(int64_t n, int64_t grain,
                      const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

    // As parallel_for, with chunks that shrink as the work runs out: each grab takes
    // half of a thread's share of what is left (at least min_grain), so the first chunks
    // are long (one memory stream each in a GEMV) and the last ones short, and the
    // threads finish close together.
    void parallel_for_guided(int64_t n, int64_t min_grain,
                             const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

    // A step: the workers stay awake between ops until release() (nested holds count).
    void hold();
    void release();

    // Threads to use when the user does not say: the physical cores of the process's
    // affinity mask (hyperthreads of one core share its units: decode is memory-bound).
    static int default_threads();
    // The CPUs of the affinity mask, one per physical core first, then their siblings.
    static std::vector<int> affinity_cpus();

    // Ops handed to the workers, and those that waited for every thread (run()).
    struct Stats {
        uint64_t ops = 0, rendezvous = 0;
    };
    Stats stats() const { return {ops_.load(), rendezvous_.load()}; }
    // Tests: called by a worker each time it takes up an op, before it claims a chunk.
    // Set before the first op.
    void set_worker_gate(std::function<void(int ith)> gate) { gate_ = std::move(gate); }
    // Whether worker i (1 .. size()-1) was pinned to a CPU.
    bool pinned() const { return pinned_; }

  private:
    using RangeFn = std::function<void(int64_t, int64_t, int)>;
    void worker(int ith);
    void dispatch(const RangeFn& fn, int64_t n, int64_t grain, bool guided);
    // Claims and runs chunks of op `epoch` until none is left (or the op is another's).
    void work(uint32_t epoch, int ith);
    void wait_done(int64_t n);

    int n_threads_;
    bool pinned_ = false;
    std::vector<std::thread> threads_;
    std::function<void(int)> gate_;

    // The op being run: its parameters (read by the workers after they see its epoch;
    // atomics, since a late reader may overlap the next op's writer, and a chunk claim
    // validates them), and the counters, each on a cache line of its own.
    std::atomic<const RangeFn*> fn_{nullptr};
    std::atomic<const std::function<void(int, int)>*> each_{nullptr};  // run()'s
    std::atomic<int64_t> n_{0}, grain_{0};
    std::atomic<bool> guided_{false};
    alignas(64) std::atomic<uint64_t> claim_{0};  // epoch << 32 | next index
    alignas(64) std::atomic<int64_t> done_{0};    // items finished
    alignas(64) std::atomic<uint32_t> epoch_{0};  // the newest op; workers wait on it
    alignas(64) std::atomic<int> sleepers_{0};
    alignas(64) std::atomic<int> holds_{0};
    alignas(64) std::atomic<int> each_pending_{0};
    std::atomic<uint32_t> each_epoch_{0};  // the newest run() op
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> ops_{0}, rendezvous_{0};
    uint32_t next_epoch_ = 0;
};

}  // namespace glm5

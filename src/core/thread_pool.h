// A persistent pool of worker threads. Work is handed out per call with no
// thread creation; workers spin briefly between calls (decode issues many
// small ops back to back) and then sleep on a futex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace glm5 {

class ThreadPool {
  public:
    // n_threads counts the calling thread: ThreadPool(1) runs everything inline.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(ith, nth) once on every thread (the caller is ith 0) and
    // returns when all have finished. Not re-entrant.
    void run(const std::function<void(int ith, int nth)>& fn);

    // Splits [0, n) into chunks of `grain` handed out dynamically; each chunk
    // goes to exactly one thread as fn(begin, end, ith). Which thread runs a
    // chunk varies, so fn must write disjoint outputs in a fixed order.
    void parallel_for(int64_t n, int64_t grain,
                      const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

    // As parallel_for, with chunks that shrink as the work runs out: each
    // grab takes half of a thread's share of what is left (at least
    // min_grain), so the first chunks are long (one memory stream each in a
    // GEMV) and the last ones short, and the threads finish close together.
    void parallel_for_guided(int64_t n, int64_t min_grain,
                             const std::function<void(int64_t begin, int64_t end, int ith)>& fn);

    // Threads to use when the user does not say: the physical cores we may run on.
    static int default_threads();

  private:
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace glm5

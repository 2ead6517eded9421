// The thread pool's work splitting: every index of [0, n) goes to exactly one
// call, for any thread count; guided chunks honour the minimum and shrink
// from the first to the last, so the first are long and the tail is fine. An op
// ends when its work is done, whether or not every worker came: a thread held
// up (descheduled, slow to wake) costs an op at most the one chunk it holds.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

using glm5::ThreadPool;

namespace {

struct Chunks {
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> list;
    void add(int64_t b, int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        list.emplace_back(b, e);
    }
    // The chunks tile [0, n) without gap or overlap.
    void expect_tiling(int64_t n) {
        std::sort(list.begin(), list.end());
        int64_t at = 0;
        for (const auto& [b, e] : list) {
            EXPECT_EQ(b, at);
            EXPECT_GT(e, b);
            at = e;
        }
        EXPECT_EQ(at, n);
    }
};

}  // namespace

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t n : {1, 7, 64, 1000}) {
            Chunks c;
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            pool.parallel_for(n, 5, [&](int64_t b, int64_t e, int ith) {
                EXPECT_LT(ith, threads);
                c.add(b, e);
                for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
            });
            for (auto& h : hits) ASSERT_EQ(h.load(), 1);
            c.expect_tiling(n);
        }
    }
}

TEST(ThreadPool, GuidedChunksShrinkAndHonourTheMinimum) {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t n : {1, 3, 17, 128, 5000})
            for (int64_t min_grain : {1, 4}) {
                Chunks c;
                std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                pool.parallel_for_guided(n, min_grain, [&](int64_t b, int64_t e, int) {
                    c.add(b, e);
                    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
                });
                for (auto& h : hits) ASSERT_EQ(h.load(), 1);
                c.expect_tiling(n);
                // In index order the chunks never grow, and only the last one
                // (cut by the end) may be shorter than the minimum.
                for (size_t k = 0; k < c.list.size(); ++k) {
                    const int64_t len = c.list[k].second - c.list[k].first;
                    if (k + 1 < c.list.size()) {
                        EXPECT_GE(len, min_grain);
                        EXPECT_GE(len, c.list[k + 1].second - c.list[k + 1].first);
                    }
                }
                if (threads > 1 && n >= 128) {
                    // Long first chunks, a fine tail.
                    EXPECT_GE(c.list.front().second, n / (4 * threads));
                    EXPECT_LE(c.list.back().second - c.list.back().first, min_grain);
                }
            }
    }
}

namespace {

// Waits for `cond` up to a minute, so that a broken pool fails the test instead of
// hanging it (a correct pool never waits that long).
template <class F>
bool wait_for(F cond) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!cond())
        if (std::chrono::steady_clock::now() > end)
            return false;
        else
            std::this_thread::yield();
    return true;
}

}  // namespace

TEST(ThreadPool, AnOpEndsWithoutAWorkerThatNeverCame) {
    // Worker 1 is held at the door of the first op: the op is done by the others,
    // and when worker 1 comes in late it finds the op over and runs none of it.
    ThreadPool pool(3);
    std::atomic<bool> open{false};
    std::atomic<int> entered{0};
    std::atomic<bool> gate_timed_out{false};
    pool.set_worker_gate([&](int ith) {
        if (ith != 1) return;
        if (entered.fetch_add(1) == 0 && !wait_for([&] { return open.load(); }))
            gate_timed_out = true;
    });
    std::vector<std::atomic<int>> hits(256);
    std::atomic<int> by_late{0};
    std::atomic<bool> waited{false}, never_held{false};
    const std::function<void(int64_t, int64_t, int)> first = [&](int64_t b, int64_t e, int ith) {
        if (ith == 1) by_late++;
        // The first chunk waits until worker 1 is at the door of this op.
        if (!waited.exchange(true) && !wait_for([&] { return entered.load() >= 1; }))
            never_held = true;
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    };
    pool.parallel_for(256, 1, first);
    EXPECT_FALSE(never_held.load());
    EXPECT_FALSE(gate_timed_out.load()) << "the op waited for the held worker";
    open = true;
    // Later ops see worker 1 take part again once it has passed the gate.
    ASSERT_TRUE(wait_for([&] {
        pool.parallel_for(64, 1, [](int64_t, int64_t, int) {});
        return entered.load() >= 2;
    }));
    EXPECT_EQ(by_late.load(), 0);
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ASlowChunkDelaysItsOpByItselfAlone) {
    // The thread that runs chunk 0 stops there until every other chunk is done: the
    // other threads finish the rest of the op around it.
    for (int threads : {2, 3, 4}) {
        ThreadPool pool(threads);
        const int64_t n = 200;
        std::atomic<int64_t> others{0};
        std::atomic<bool> stuck{false};
        pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
            if (b == 0) {
                if (!wait_for([&] { return others.load() == n - 1; })) stuck = true;
                return;
            }
            others += e - b;
        });
        EXPECT_FALSE(stuck.load()) << threads << " threads";
        EXPECT_EQ(others.load(), n - 1);
    }
}

TEST(ThreadPool, ThousandsOfTinyOpsEachCoverTheirRange) {
    // Short ops, fewer chunks than threads, inside and outside a held step, and the
    // rendezvous among them: every index once, in every op.
    ThreadPool pool(4);
    const ThreadPool::Stats before = pool.stats();
    uint64_t handed = 0, met = 0;
    for (int round = 0; round < 4000; ++round) {
        const bool held = round % 2 == 0;
        if (held) pool.hold();
        const int64_t n = 1 + round % 7;  // 1 .. 7 items for 4 threads
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        auto count = [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        };
        if (round % 3 == 0)
            pool.parallel_for_guided(n, 1, count);
        else
            pool.parallel_for(n, 1, count);
        handed += n > 1;
        for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "round " << round;
        if (round % 100 == 0) {
            std::atomic<int> each{0};
            pool.run([&](int, int nth) {
                EXPECT_EQ(nth, 4);
                each++;
            });
            ASSERT_EQ(each.load(), 4);
            ++met;
        }
        if (held) pool.release();
    }
    const ThreadPool::Stats after = pool.stats();
    EXPECT_EQ(after.ops - before.ops, handed + met);
    EXPECT_EQ(after.rendezvous - before.rendezvous, met);
}

TEST(ThreadPool, PinningGivesEachWorkerOneCpu) {
    const std::vector<int> cpus = ThreadPool::affinity_cpus();
    ASSERT_FALSE(cpus.empty());
    EXPECT_EQ(std::set<int>(cpus.begin(), cpus.end()).size(), cpus.size());
    EXPECT_GE(ThreadPool::default_threads(), 1);
    EXPECT_LE(size_t(ThreadPool::default_threads()), cpus.size());
    for (int pin : {0, 1}) {
        ThreadPool pool(glm5::PoolOptions{3, pin});
        EXPECT_EQ(pool.pinned(), pin == 1);
        std::vector<int> allowed(3, 0);
        pool.run([&](int ith, int) {
            cpu_set_t set;
            CPU_ZERO(&set);
            pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
            allowed[size_t(ith)] = CPU_COUNT(&set);
        });
        for (int ith = 1; ith < 3; ++ith)
            if (pin == 1)
                EXPECT_EQ(allowed[size_t(ith)], 1) << "worker " << ith;
            else
                EXPECT_EQ(size_t(allowed[size_t(ith)]), cpus.size()) << "worker " << ith;
    }
}

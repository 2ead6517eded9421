// The thread pool's work splitting: every index of [0, n) goes to exactly one
// call, for any thread count; guided chunks honour the minimum and shrink
// from the first to the last, so the first are long and the tail is fine.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
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

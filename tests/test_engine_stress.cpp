// The engine under concurrent submit/cancel traffic (run under ThreadSanitizer
// and AddressSanitizer in CI), and its bounded queue.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/engine.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

runtime::RequestParams tiny_request(int seed, int max_tokens) {
    runtime::RequestParams p;
    p.prompt = {int32_t(1 + seed % 300), int32_t(2 + seed % 200)};
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0.0f;
    return p;
}

struct EngineStress : ::testing::Test {
    TestModel m{data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 1};
};

// Cancelled queued requests are finished while the engine's lock is released;
// submits in that window must not disturb the queue walk. Several threads
// submit and cancel at once, some right away, some after a moment, so the
// engine sees cancellations while queued, while admitted and while decoding.
TEST_F(EngineStress, TenThousandSubmitCancelPairsFromSeveralThreads) {
    runtime::EngineOptions o;
    o.n_parallel = 4;
    o.n_ctx = 64;
    o.ubatch = 16;
    o.cache_budget_bytes = size_t(1) << 20;
    runtime::Engine e(*m.model, o);

    constexpr int kThreads = 4, kPerThread = 2500;
    std::atomic<uint64_t> cancelled{0}, completed{0}, other{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937 rng(uint32_t(t) * 7919u + 1u);
            std::vector<std::shared_ptr<runtime::Request>> open;
            auto drain = [&] {
                for (auto& r : open) {
                    const runtime::RequestResult res = r->wait();
                    if (res.finish_reason == "cancelled")
                        ++cancelled;
                    else if (res.finish_reason == "length" || res.finish_reason == "stop")
                        ++completed;
                    else
                        ++other;
                }
                open.clear();
            };
            for (int i = 0; i < kPerThread; ++i) {
                auto r = e.submit(tiny_request(t * kPerThread + i, 1 + int(rng() % 3)));
                if (rng() % 8 == 0) std::this_thread::yield();
                r->cancel();
                open.push_back(std::move(r));
                if (open.size() >= 64) drain();
            }
            drain();
        });
    }
    for (auto& th : threads) th.join();

    const uint64_t n = uint64_t(kThreads) * kPerThread;
    EXPECT_EQ(cancelled + completed, n);
    EXPECT_EQ(other.load(), 0u);
    EXPECT_GT(cancelled.load(), 0u);
    const runtime::EngineStats s = e.stats();
    EXPECT_EQ(s.requests_total, n);
    EXPECT_EQ(s.requests_done, n);
    EXPECT_EQ(s.requests_cancelled, cancelled.load());
    EXPECT_EQ(s.queue_depth, 0);
    EXPECT_EQ(s.busy_slots, 0);
    // Still serving, with the same tokens as a fresh engine.
    const auto after = e.submit(tiny_request(5, 4))->wait();
    runtime::EngineOptions fresh_o = o;
    fresh_o.prefix_cache = false;
    runtime::Engine fresh(*m.model, fresh_o);
    EXPECT_EQ(after.tokens, fresh.submit(tiny_request(5, 4))->wait().tokens);
}

// While the only slot is held, max_queue requests wait and the next is
// refused with QueueFull (counted), not queued; a slot freeing up lets
// requests in again.
TEST_F(EngineStress, FullQueueRefusesWithQueueFull) {
    runtime::EngineOptions o;
    o.n_parallel = 1;
    o.n_ctx = 64;
    o.max_queue = 3;
    runtime::Engine e(*m.model, o);

    std::mutex mu;
    std::condition_variable cv;
    bool holding = false, release = false;
    auto blocker = e.submit(tiny_request(1, 2), [&](int32_t) {
        std::unique_lock<std::mutex> lk(mu);
        holding = true;
        cv.notify_all();
        cv.wait(lk, [&] { return release; });
        return true;
    });
    {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return holding; });
    }
    std::vector<std::shared_ptr<runtime::Request>> queued;
    for (int i = 0; i < 3; ++i) queued.push_back(e.submit(tiny_request(10 + i, 2)));
    EXPECT_THROW(e.submit(tiny_request(20, 2)), runtime::QueueFull);
    EXPECT_THROW(e.submit(tiny_request(21, 2)), runtime::QueueFull);
    EXPECT_EQ(e.stats().requests_refused, 2u);
    EXPECT_EQ(e.stats().queue_depth, 3);
    {
        std::lock_guard<std::mutex> lk(mu);
        release = true;
    }
    cv.notify_all();
    EXPECT_EQ(blocker->wait().finish_reason, "length");
    for (auto& r : queued) EXPECT_EQ(r->wait().finish_reason, "length");
    EXPECT_EQ(e.submit(tiny_request(22, 2))->wait().finish_reason, "length");
    EXPECT_EQ(e.stats().requests_refused, 2u);
    EXPECT_EQ(e.stats().requests_total, 5u);
}

}  // namespace

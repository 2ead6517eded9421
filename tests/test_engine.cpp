// The serving engine: batched slots give the same tokens as alone, queueing
// beyond n_parallel, retained prefixes, cancellation, stops and refusals.
#include <future>
#include <thread>

#include "runtime/engine.h"
#include "text/tokenizer.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

std::vector<int32_t> prompt_of(int seed, int n) {
    std::vector<int32_t> p;
    uint32_t x = uint32_t(seed) * 2654435761u + 12345u;
    for (int i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        p.push_back(int32_t(x % 700));
    }
    return p;
}

runtime::RequestParams request(const std::vector<int32_t>& prompt, int max_tokens, float temp,
                               uint64_t seed) {
    runtime::RequestParams p;
    p.prompt = prompt;
    p.max_tokens = max_tokens;
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    return p;
}

struct EngineTest : ::testing::Test {
    TestModel m{data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16};
    runtime::EngineOptions opts(int parallel, bool prefix = true) {
        runtime::EngineOptions o;
        o.n_parallel = parallel;
        o.n_ctx = 256;
        o.ubatch = 32;
        o.prefix_cache = prefix;
        return o;
    }
};

TEST_F(EngineTest, BatchedRequestsEqualRequestsServedAlone) {
    std::vector<std::vector<int32_t>> alone;
    {
        runtime::Engine e(*m.model, opts(1, false));
        for (int i = 0; i < 6; ++i)
            alone.push_back(
                e.submit(request(prompt_of(i, 10 + 7 * i), 12, i % 2 ? 0.9f : 0.0f, 100 + i))
                    ->wait()
                    .tokens);
    }
    runtime::Engine e(*m.model, opts(4, false));
    std::vector<std::shared_ptr<runtime::Request>> reqs;
    for (int i = 0; i < 6; ++i)
        reqs.push_back(
            e.submit(request(prompt_of(i, 10 + 7 * i), 12, i % 2 ? 0.9f : 0.0f, 100 + i)));
    for (int i = 0; i < 6; ++i) {
        const runtime::RequestResult r = reqs[size_t(i)]->wait();
        EXPECT_EQ(r.finish_reason, "length");
        EXPECT_EQ(r.tokens, alone[size_t(i)]) << "request " << i;
    }
    const runtime::EngineStats s = e.stats();
    EXPECT_EQ(s.requests_done, 6u);
    // Fewer forwards than tokens: slots really shared forwards.
    EXPECT_LT(s.forwards, 6u * 12u);
}

TEST_F(EngineTest, RequestsBeyondParallelQueue) {
    runtime::Engine e(*m.model, opts(2));
    std::atomic<int> max_busy{0};
    std::vector<std::shared_ptr<runtime::Request>> reqs;
    for (int i = 0; i < 5; ++i)
        reqs.push_back(e.submit(request(prompt_of(i, 8), 6, 0.0f, 0), [&](int32_t) {
            max_busy = std::max(max_busy.load(), e.stats().busy_slots);
            return true;
        }));
    for (auto& r : reqs) EXPECT_EQ(r->wait().tokens.size(), 6u);
    EXPECT_LE(max_busy.load(), 2);
    EXPECT_EQ(e.stats().queue_depth, 0);
}

TEST_F(EngineTest, RetainedPrefixIsAdoptedAndGivesTheSameTokens) {
    const auto base = prompt_of(7, 40);
    auto extended = base;
    for (int32_t t : prompt_of(8, 10)) extended.push_back(t);
    std::vector<int32_t> uncached_tokens;
    {
        runtime::Engine cold(*m.model, opts(1, false));
        uncached_tokens = cold.submit(request(extended, 8, 0.0f, 0))->wait().tokens;
        EXPECT_EQ(cold.submit(request(extended, 8, 0.0f, 0))->wait().cached_tokens, 0);
    }
    runtime::Engine e(*m.model, opts(1));
    const auto first = e.submit(request(base, 4, 0.0f, 0))->wait();
    EXPECT_EQ(first.cached_tokens, 0);
    // The retained entry holds base + 3 evaluated reply tokens; the new prompt
    // shares base and diverges 3 tokens before its end: a short rewind.
    const auto second = e.submit(request(extended, 8, 0.0f, 0))->wait();
    EXPECT_EQ(second.cached_tokens, int64_t(base.size()));
    EXPECT_EQ(second.tokens, uncached_tokens);
    EXPECT_GE(e.stats().retained_entries, 1);
}

// A request that shares only the start of a retained entry (a sub-agent sharing
// its main agent's system prompt) copies that prefix and leaves the entry for
// the main agent's next request; one that diverges near the entry's end takes
// it. Both give the tokens of a cold run.
TEST_F(EngineTest, AnEarlyDivergenceCopiesThePrefixAndKeepsTheEntry) {
    const auto base = prompt_of(9, 60);
    auto early = std::vector<int32_t>(base.begin(), base.begin() + 30);  // 31 back
    early.push_back(5);
    auto near = std::vector<int32_t>(base.begin(), base.begin() + 50);  // 11 back
    near.push_back(5);
    std::vector<int32_t> cold_early, cold_near;
    {
        runtime::Engine cold(*m.model, opts(1, false));
        cold_early = cold.submit(request(early, 6, 0.0f, 0))->wait().tokens;
        cold_near = cold.submit(request(near, 6, 0.0f, 0))->wait().tokens;
    }
    runtime::Engine e(*m.model, opts(1));
    e.submit(request(base, 2, 0.0f, 0))->wait();
    const auto r1 = e.submit(request(early, 6, 0.0f, 0))->wait();
    EXPECT_EQ(r1.cached_tokens, 30);
    EXPECT_EQ(r1.tokens, cold_early);
    EXPECT_EQ(e.stats().retained_entries, 2);  // base's entry was copied from, not taken
    const auto r2 = e.submit(request(near, 6, 0.0f, 0))->wait();
    EXPECT_EQ(r2.cached_tokens, 50);
    EXPECT_EQ(r2.tokens, cold_near);
    EXPECT_EQ(e.stats().retained_entries, 2);  // base's entry was taken
}

// The copy itself: the rows below n of another sequence, which stays as it was.
TEST_F(EngineTest, CopyPrefixOfAPositionalStateEqualsTheFreshRows) {
    const auto tokens = prompt_of(4, 40);
    const size_t V = size_t(m.n_vocab());
    const auto plain = m.batch_logits(tokens, true);
    auto src = m.model->new_state(64);
    model::SeqInput a{src.get(), tokens, false};
    std::vector<float> lg;
    m.model->forward({&a, 1}, lg);
    auto dst = m.model->new_state(64);
    EXPECT_FALSE(dst->copy_prefix(*src, 41, nullptr));  // more than it holds
    ASSERT_TRUE(dst->copy_prefix(*src, 25, nullptr));
    EXPECT_EQ(dst->n_past(), 25);
    model::SeqInput b{dst.get(), std::span<const int32_t>(tokens).subspan(25), true};
    m.model->forward({&b, 1}, lg);
    EXPECT_TRUE(bitwise_equal(lg, std::vector<float>(plain.begin() + long(25 * V), plain.end())));
    EXPECT_EQ(src->n_past(), 40);
}

// glm5next's recurrent state resumes from checkpoints taken before each message
// start (here token 3) as the prompt is evaluated.
TEST(EngineCheckpoints, ARecurrentStateResumesFromTheLatestMessageStart) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F32, 1);
    static constexpr int32_t kStart = 3;
    auto message = [](int seed, int n) {
        auto p = prompt_of(seed, n);
        for (auto& t : p) t = 4 + t % 300;  // within the tiny vocabulary, never kStart
        p.insert(p.begin(), kStart);
        return p;
    };
    auto join = [](std::initializer_list<std::vector<int32_t>> parts) {
        std::vector<int32_t> r;
        for (const auto& p : parts) r.insert(r.end(), p.begin(), p.end());
        return r;
    };
    const auto sys = message(1, 20), user = message(2, 15), tail = message(3, 10);
    const std::vector<int32_t> reply_start = {kStart};
    const auto first = join({sys, user, tail, reply_start});    // ends where the reply starts
    const auto sub = join({sys, message(4, 12), reply_start});  // shares the first message
    runtime::EngineOptions o;
    o.n_parallel = 1;
    o.n_ctx = 256;
    o.ubatch = 32;
    o.checkpoint_tokens = {kStart};
    o.checkpoint_spacing = {1, 1};  // (a tiny prompt)
    std::vector<int32_t> cold_first, cold_sub;
    {
        auto c = o;
        c.prefix_cache = false;
        runtime::Engine cold(*m.model, c);
        cold_first = cold.submit(request(first, 5, 0.0f, 0))->wait().tokens;
        cold_sub = cold.submit(request(sub, 5, 0.0f, 0))->wait().tokens;
        ASSERT_EQ(cold_first.size(), 5u);
        ASSERT_EQ(cold_sub.size(), 5u);
    }
    runtime::Engine e(*m.model, o);
    const auto r0 = e.submit(request(first, 5, 0.0f, 0))->wait();
    ASSERT_EQ(r0.finish_reason, "length") << r0.error;
    EXPECT_EQ(r0.cached_tokens, 0);
    // A sub-agent: the first message comes from its checkpoint, copied.
    const auto r1 = e.submit(request(sub, 5, 0.0f, 0))->wait();
    EXPECT_EQ(r1.cached_tokens, int64_t(sys.size()));
    EXPECT_EQ(r1.tokens, cold_sub);
    // The same request again (a retry): all but the reply's start token.
    const auto r2 = e.submit(request(first, 5, 0.0f, 0))->wait();
    EXPECT_EQ(r2.cached_tokens, int64_t(first.size()) - 1);
    EXPECT_EQ(r2.tokens, cold_first);
}

TEST_F(EngineTest, PrefixCacheOffReusesNothing) {
    runtime::Engine e(*m.model, opts(1, false));
    const auto base = prompt_of(3, 20);
    e.submit(request(base, 2, 0.0f, 0))->wait();
    EXPECT_EQ(e.submit(request(base, 2, 0.0f, 0))->wait().cached_tokens, 0);
    EXPECT_EQ(e.stats().retained_entries, 0);
}

TEST_F(EngineTest, CancelFreesTheSlot) {
    runtime::Engine e(*m.model, opts(1));
    // The engine thread may emit before submit() has returned the handle: it
    // takes the handle through a future (ThreadSanitizer saw the plain variable race).
    std::promise<std::shared_ptr<runtime::Request>> handle;
    std::shared_future<std::shared_ptr<runtime::Request>> got = handle.get_future().share();
    std::atomic<int> seen{0};
    const auto r = e.submit(request(prompt_of(1, 8), 200, 0.8f, 1), [&](int32_t) {
        if (++seen == 3) got.get()->cancel();
        return true;
    });
    handle.set_value(r);
    const auto res = r->wait();
    EXPECT_EQ(res.finish_reason, "cancelled");
    EXPECT_LT(res.tokens.size(), 10u);
    // The engine goes on serving.
    EXPECT_EQ(e.submit(request(prompt_of(2, 8), 3, 0.0f, 0))->wait().tokens.size(), 3u);
    EXPECT_EQ(e.stats().busy_slots, 0);
}

TEST_F(EngineTest, StopTokenEndsWithoutBeingEmitted) {
    runtime::Engine e(*m.model, opts(1));
    const auto p = prompt_of(4, 12);
    const auto free_run = e.submit(request(p, 5, 0.0f, 0))->wait().tokens;
    ASSERT_EQ(free_run.size(), 5u);
    auto rp = request(p, 5, 0.0f, 0);
    rp.stop_ids = {free_run[2]};
    const auto stopped = e.submit(std::move(rp))->wait();
    EXPECT_EQ(stopped.finish_reason, "stop");
    EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + 2));
}

// Generation ends at <|observation|> (eom), so the model never writes the
// tool's result itself: the tokenizer's stop set holds it and the engine stops
// there without emitting it. A constraint forces the model to pick it.
TEST_F(EngineTest, StopsAtObservationToken) {
    auto tok = text::Tokenizer::from_gguf(*m.file);
    const int32_t eom = tok->find("<|observation|>");
    ASSERT_GE(eom, 0);
    const auto stops = tok->stop_ids();
    ASSERT_NE(std::find(stops.begin(), stops.end(), eom), stops.end());
    struct OnlyEom : runtime::TokenConstraint {
        int32_t eom;
        explicit OnlyEom(int32_t e) : eom(e) {}
        bool allows(int32_t t) const override { return t == eom; }
        void accept(int32_t) override {}
    };
    runtime::Engine e(*m.model, opts(1));
    auto rp = request(prompt_of(5, 10), 8, 0.7f, 3);
    rp.stop_ids.insert(stops.begin(), stops.end());
    rp.constraint = std::make_unique<OnlyEom>(eom);
    const auto r = e.submit(std::move(rp))->wait();
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_TRUE(r.tokens.empty());
}

TEST_F(EngineTest, ImpossibleRequestsAreRefused) {
    runtime::Engine e(*m.model, opts(1));
    EXPECT_THROW(e.submit(request({}, 4, 0.0f, 0)), Error);
    EXPECT_THROW(e.submit(request(prompt_of(1, 300), 4, 0.0f, 0)), Error);
    EXPECT_THROW(e.submit(request(prompt_of(1, 4), 0, 0.0f, 0)), Error);
}

TEST_F(EngineTest, ShutdownFinishesInFlightWork) {
    auto e = std::make_unique<runtime::Engine>(*m.model, opts(2));
    std::vector<std::shared_ptr<runtime::Request>> reqs;
    for (int i = 0; i < 3; ++i) reqs.push_back(e->submit(request(prompt_of(i, 6), 4, 0.0f, 0)));
    e->shutdown(true);
    for (auto& r : reqs) EXPECT_EQ(r->wait().finish_reason, "length");
    EXPECT_THROW(e->submit(request(prompt_of(1, 4), 2, 0.0f, 0)), Error);
}

}  // namespace

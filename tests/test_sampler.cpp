// The sampler's bias and penalties, as llama.cpp applies them: logit_bias first (a ban
// leaves a token out), then over the last repeat_last_n tokens the repetition penalty,
// then frequency (per occurrence) and presence (once) subtracted; and the raw logprobs
// the server reports.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/sampler.h"

using glm5::runtime::Sampler;
using glm5::runtime::SamplerParams;

namespace {

SamplerParams greedy() {
    SamplerParams p;
    p.temperature = 0;
    return p;
}

}  // namespace

TEST(Sampler, LogitBiasMovesAndBansTokens) {
    const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
    SamplerParams p = greedy();
    EXPECT_EQ(Sampler(p).sample(logits, {}), 1);
    p.logit_bias = {{2, 1.5f}};
    EXPECT_EQ(Sampler(p).sample(logits, {}), 2);
    p.logit_bias = {{1, -INFINITY}};
    EXPECT_EQ(Sampler(p).sample(logits, {}), 2);
    // A ban of everything allowed still picks one (the grammar's choice wins).
    p.logit_bias = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}, {3, -INFINITY}};
    EXPECT_EQ(Sampler(p).sample(logits, {}, [](int32_t t) { return t == 3; }), 3);
    // At a temperature the banned token is never drawn.
    p = SamplerParams{};
    p.temperature = 5;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.logit_bias = {{1, -INFINITY}};
    Sampler s(p);
    for (int i = 0; i < 500; ++i) EXPECT_NE(s.sample(logits, {}), 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesOverTheWindow) {
    const std::vector<float> logits = {2.0f, 2.6f, 1.0f};
    const std::vector<int32_t> history = {1, 1, 1, 0};
    SamplerParams p = greedy();
    EXPECT_EQ(Sampler(p).sample(logits, history), 1);
    // Token 1 seen three times: 2.6 - 3 * 0.5 = 1.1 < 2.0 - 0.5.
    p.frequency_penalty = 0.5f;
    EXPECT_EQ(Sampler(p).sample(logits, history), 0);
    // Presence once each: 2.6 - 0.5 against 2.0 - 0.5.
    p.frequency_penalty = 0;
    p.presence_penalty = 0.5f;
    EXPECT_EQ(Sampler(p).sample(logits, history), 1);
    // Outside the window (the last token only) token 1 is not penalised.
    p.presence_penalty = 0;
    p.frequency_penalty = 0.5f;
    p.repeat_last_n = 1;
    EXPECT_EQ(Sampler(p).sample(logits, history), 1);
    p.repeat_last_n = 0;
    EXPECT_EQ(Sampler(p).sample(logits, history), 1);
    // Negative penalties favour repeats.
    p.repeat_last_n = -1;
    p.frequency_penalty = -1;
    const std::vector<float> close = {3.0f, 2.6f, 1.0f};
    EXPECT_EQ(Sampler(p).sample(close, history), 1);
}

TEST(Sampler, TokenLogprobIsTheRawLogSoftmax) {
    const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
    double z = 0;
    for (float l : logits) z += std::exp(double(l));
    const auto r = glm5::runtime::token_logprob(logits, 2, 3);
    EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-6);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].first, 1);  // ties to the lower id
    EXPECT_EQ(r.top[1].first, 3);
    EXPECT_EQ(r.top[2].first, 2);
    EXPECT_NEAR(r.top[2].second, r.logprob, 1e-7);
    EXPECT_TRUE(glm5::runtime::token_logprob(logits, 0, 0).top.empty());
}

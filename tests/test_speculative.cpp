// Speculative decoding changes nothing but speed: with every drafter, the
// emitted ids and every emitted token's logits equal plain decoding's, for
// greedy and sampled output, for glm-dsa and glm5next (whose rollbacks cost a
// restore and no extra forward), alone and batched.
#include <cstring>
#include <optional>

#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "text/tokenizer.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

struct Output {
    runtime::RequestResult r;
    std::vector<std::vector<float>> logits;  // per emitted token
};

std::vector<int32_t> repeated_prompt() {
    std::vector<int32_t> p;
    for (int rep = 0; rep < 3; ++rep)
        for (int32_t t : {5, 6, 7, 8, 9, 41, 42}) p.push_back(t);
    return p;
}

// Greedy with a repetition *bonus* (penalty below 1): random-weight models
// then fall into loops, which the n-gram drafter can predict.
runtime::SamplerParams looping() {
    runtime::SamplerParams s;
    s.temperature = 0;
    s.repeat_penalty = 0.2f;
    return s;
}

runtime::SpecParams fixed(runtime::DraftType t, int k) {
    runtime::SpecParams s;
    s.type = t;
    s.draft_max = k;
    s.adaptive = false;
    return s;
}

Output generate(model::Model& m, const std::vector<int32_t>& prompt, int n,
                const runtime::SamplerParams& sp, std::optional<runtime::SpecParams> spec,
                std::unique_ptr<runtime::TokenConstraint> constraint = nullptr,
                const std::vector<int32_t>& stops = {}) {
    runtime::EngineOptions eo;
    eo.n_parallel = 1;
    eo.n_ctx = 512;
    eo.prefix_cache = false;
    runtime::Engine e(m, eo);
    runtime::RequestParams p;
    p.prompt = prompt;
    p.max_tokens = n;
    p.sampling = sp;
    runtime::SpecParams off;
    p.spec = spec ? *spec : off;
    p.constraint = std::move(constraint);
    p.stop_ids.insert(stops.begin(), stops.end());
    Output run;
    p.on_logits = [&](int32_t, std::span<const float> lg) {
        run.logits.emplace_back(lg.begin(), lg.end());
    };
    run.r = e.submit(std::move(p))->wait();
    EXPECT_NE(run.r.finish_reason, "error") << run.r.error;
    return run;
}

// Bitwise: the same ids, and every emitted token sampled from the same row.
void expect_same(const Output& plain, const Output& spec) {
    ASSERT_EQ(spec.r.tokens, plain.r.tokens);
    ASSERT_EQ(spec.logits.size(), plain.logits.size());
    for (size_t i = 0; i < plain.logits.size(); ++i)
        ASSERT_EQ(0, std::memcmp(spec.logits[i].data(), plain.logits[i].data(),
                                 plain.logits[i].size() * sizeof(float)))
            << "logits of emitted token " << i << " differ";
    EXPECT_EQ(spec.r.finish_reason, plain.r.finish_reason);
}

// Proposes the plain run's continuation, wrong in its last token: every
// window ends in a rejection after its other drafts were accepted.
runtime::SpecParams oracle(const std::vector<int32_t>& ref, size_t prompt_len, int64_t n_vocab,
                           bool wrong_last) {
    runtime::SpecParams s = fixed(runtime::DraftType::External, 4);
    s.external = [=](std::span<const int32_t> h, int k) {
        std::vector<int32_t> d;
        // h ends with the pending token, the reply's (h.size() - prompt_len)th.
        for (size_t i = h.size() - prompt_len; i < ref.size() && int(d.size()) < k; ++i)
            d.push_back(ref[i]);
        if (wrong_last && !d.empty()) d.back() = int32_t((d.back() + 1) % n_vocab);
        return d;
    };
    return s;
}

TEST(Speculative, NgramDraftsTheLongestRecentMatch) {
    const std::vector<int32_t> h = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3};
    // The last 3 tokens (1 2 3) occurred last at index 4: what followed is 7 8 5...
    EXPECT_EQ(runtime::ngram_draft(h, 3, 3, 2), (std::vector<int32_t>{7, 8, 5}));
    EXPECT_EQ(runtime::ngram_draft(h, 2, 4, 2), (std::vector<int32_t>{7, 8}));
    EXPECT_TRUE(runtime::ngram_draft(std::vector<int32_t>{4, 5, 6}, 3, 3, 2).empty());
    // The continuation stops at the end of the text.
    EXPECT_EQ(runtime::ngram_draft(std::vector<int32_t>{4, 5, 4, 5}, 5, 2, 2),
              (std::vector<int32_t>{4, 5}));
}

TEST(Speculative, GovernorParksADrafterThatIsNeverRight) {
    runtime::SpecParams sp;
    sp.draft_max = 8;
    runtime::WindowGovernor g(sp);
    runtime::VerifyCost cost;
    for (int r = 1; r <= 9; ++r) cost.record(r, 0.010 * (1.0 + 0.27 * (r - 1)));
    int drafted = 0;
    for (int step = 0; step < 200; ++step) {
        const int k = g.choose(cost, 0.0);
        drafted += k;
        if (k) g.record(k, 0);
    }
    // A few probes, not a window per step.
    EXPECT_LT(drafted, 40);
    EXPECT_GT(drafted, 0);
    // A drafter that is always right gets the widest window.
    runtime::WindowGovernor good(sp);
    for (int step = 0; step < 50; ++step) good.record(good.choose(cost, 0.0), 8);
    EXPECT_EQ(good.choose(cost, 0.0), 8);
}

struct SpecDsa : ::testing::Test {
    TestModel m{data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 2, /*spec=*/true};
};

TEST_F(SpecDsa, NextNBlockChangesNoTrunkLogits) {
    TestModel plain(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 2, false);
    const auto p = repeated_prompt();
    const auto a = plain.chunked_logits(p, 5), b = m.chunked_logits(p, 5);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST_F(SpecDsa, MtpGreedyEqualsPlain) {
    const auto p = repeated_prompt();
    const Output plain = generate(*m.model, p, 40, looping(), std::nullopt);
    const Output spec = generate(*m.model, p, 40, looping(), fixed(runtime::DraftType::Mtp, 3));
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_n, 0);
    EXPECT_LT(spec.r.draft_accepted, spec.r.draft_n);
    EXPECT_EQ(spec.r.forwards, plain.r.forwards - spec.r.draft_accepted);
}

TEST_F(SpecDsa, NgramGreedyEqualsPlain) {
    const auto p = repeated_prompt();
    const Output plain = generate(*m.model, p, 60, looping(), std::nullopt);
    const Output spec = generate(*m.model, p, 60, looping(), fixed(runtime::DraftType::Ngram, 4));
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
    EXPECT_LT(spec.r.draft_accepted, spec.r.draft_n);
    EXPECT_EQ(spec.r.forwards, plain.r.forwards - spec.r.draft_accepted);
}

TEST_F(SpecDsa, DrafterWrongAtTheEndOfEveryWindow) {
    const auto p = repeated_prompt();
    runtime::SamplerParams greedy;
    greedy.temperature = 0;
    const Output plain = generate(*m.model, p, 30, greedy, std::nullopt);
    const Output spec =
        generate(*m.model, p, 30, greedy, oracle(plain.r.tokens, p.size(), m.n_vocab(), true));
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
    EXPECT_LT(spec.r.draft_accepted, spec.r.draft_n);
}

TEST_F(SpecDsa, SampledOutputWithTheSameSeedEqualsPlain) {
    const auto p = repeated_prompt();
    runtime::SamplerParams sp;
    sp.temperature = 0.9f;
    sp.top_p = 0.9f;
    sp.top_k = 50;
    sp.repeat_penalty = 1.3f;
    sp.seed = 1234;
    const Output plain = generate(*m.model, p, 40, sp, std::nullopt);
    for (bool wrong_last : {false, true}) {
        const Output spec = generate(*m.model, p, 40, sp,
                                     oracle(plain.r.tokens, p.size(), m.n_vocab(), wrong_last));
        expect_same(plain, spec);
        EXPECT_GT(spec.r.draft_accepted, 0);
    }
    const Output ngram = generate(*m.model, p, 40, sp, fixed(runtime::DraftType::Ngram, 3));
    expect_same(plain, ngram);
}

TEST_F(SpecDsa, JsonSchemaOutputEqualsPlain) {
    auto tok = text::Tokenizer::from_gguf(*m.file);
    auto jv = std::make_shared<const runtime::JsonVocab>(*tok);
    const auto g = runtime::compile_json_schema(
        nlohmann::ordered_json::parse(
            R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["name","n"]})"),
        {});
    const std::vector<int32_t> p =
        tok->encode("[gMASK]<sop><|user|>JSON please.<|assistant|><think></think>");
    runtime::SamplerParams sp;
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 7;
    const Output plain = generate(*m.model, p, 60, sp, std::nullopt,
                                  runtime::make_json_constraint(g, jv, false), tok->stop_ids());
    const Output spec =
        generate(*m.model, p, 60, sp, oracle(plain.r.tokens, p.size(), m.n_vocab(), true),
                 runtime::make_json_constraint(g, jv, false), tok->stop_ids());
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
}

TEST_F(SpecDsa, BatchedWindowsEqualRequestsServedAlone) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
        auto p = repeated_prompt();
        p.push_back(100 + i);
        prompts.push_back(p);
    }
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts)
        alone.push_back(generate(*m.model, p, 30, looping(), std::nullopt).r.tokens);
    runtime::EngineOptions eo;
    eo.n_parallel = 4;
    eo.n_ctx = 512;
    eo.spec = fixed(runtime::DraftType::Ngram, 4);
    runtime::Engine e(*m.model, eo);
    std::vector<runtime::RequestParams> ps;
    for (const auto& p : prompts) {
        runtime::RequestParams rp;
        rp.prompt = p;
        rp.max_tokens = 30;
        rp.sampling = looping();
        ps.push_back(std::move(rp));
    }
    const auto reqs = e.submit_group(std::move(ps));
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(reqs[i]->wait().tokens, alone[i]) << i;
    const runtime::EngineStats s = e.stats();
    EXPECT_GT(s.draft_accepted, 0u);
    EXPECT_GT(s.shared_verifies, 0u);  // windows of several slots in one forward
    ASSERT_FALSE(s.drafted_at.empty());
    EXPECT_GE(s.drafted_at[0], s.accepted_at[0]);
}

TEST(SpecGlm5next, NgramRollbacksRestoreAndCostNoExtraForward) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F32, 2);
    const auto p = repeated_prompt();
    const Output plain = generate(*m.model, p, 40, looping(), std::nullopt);
    runtime::EngineOptions eo;
    eo.n_parallel = 1;
    eo.n_ctx = 512;
    eo.prefix_cache = false;
    eo.spec = fixed(runtime::DraftType::Ngram, 4);
    runtime::Engine e(*m.model, eo);
    runtime::RequestParams rp;
    rp.prompt = p;
    rp.max_tokens = 40;
    rp.sampling = looping();
    Output spec;
    rp.on_logits = [&](int32_t, std::span<const float> lg) {
        spec.logits.emplace_back(lg.begin(), lg.end());
    };
    spec.r = e.submit(std::move(rp))->wait();
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
    EXPECT_LT(spec.r.draft_accepted, spec.r.draft_n);
    // Every partial rejection restored the recurrent state once, and its
    // kept rows rode along with the next forward: no forward was added.
    EXPECT_GT(e.stats().rollbacks, 0u);
    EXPECT_EQ(spec.r.forwards, plain.r.forwards - spec.r.draft_accepted);
}

TEST(SpecGlm5next, WrongAtTheEndOfEveryWindow) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F32, 2);
    const auto p = repeated_prompt();
    runtime::SamplerParams greedy;
    greedy.temperature = 0;
    const Output plain = generate(*m.model, p, 24, greedy, std::nullopt);
    const Output spec =
        generate(*m.model, p, 24, greedy, oracle(plain.r.tokens, p.size(), m.n_vocab(), true));
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
}

TEST(SpecGlm5next, MtpIsRefused) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F32, 1);
    runtime::EngineOptions eo;
    runtime::Engine e(*m.model, eo);
    runtime::RequestParams rp;
    rp.prompt = {1, 2, 3};
    rp.spec = fixed(runtime::DraftType::Mtp, 2);
    EXPECT_THROW(e.submit(std::move(rp)), Error);
}

}  // namespace

namespace {

// The trained default model's NextN head really predicts: its drafts are
// accepted, and the output is still plain decoding's, id for id and logit
// for logit.
TEST(SpecTrained, MtpDraftsAreAcceptedAndChangeNothing) {
    TestModel m(std::string(GLM5_SOURCE_DIR) + "/models/kjv-mini.gguf", backend::CacheType::F16, 2,
                /*spec=*/true);
    auto tok = text::Tokenizer::from_gguf(*m.file);
    const std::vector<int32_t> p = tok->encode(
        "[gMASK]<sop><|user|>Continue this verse: In the beginning God "
        "created<|assistant|><think></think>");
    runtime::SamplerParams greedy;
    greedy.temperature = 0;
    const Output plain = generate(*m.model, p, 40, greedy, std::nullopt);
    const Output spec = generate(*m.model, p, 40, greedy, fixed(runtime::DraftType::Mtp, 3));
    expect_same(plain, spec);
    EXPECT_GT(spec.r.draft_accepted, 0);
    EXPECT_LT(spec.r.draft_accepted, spec.r.draft_n);
    EXPECT_EQ(spec.r.forwards, plain.r.forwards - spec.r.draft_accepted);
}

}  // namespace

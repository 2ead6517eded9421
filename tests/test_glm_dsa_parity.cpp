// glm-dsa against llama.cpp's goldens (tests/data/glm-dsa/*.golden.json),
// through the same kernels generation uses, plus the batching invariants the
// CPU path promises (bitwise).
#include <cstdio>

#include "backend/cpu.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

struct Fixture {
    const char* name;
    double tol_last;  // last-position logits vs llama.cpp
    bool quantized;   // tolerance and greedy rules for 8-bit activations
};

const Fixture kFixtures[] = {
    {"tiny", 1e-3, false},        {"small", 3e-2, false},    {"small-q8_0", 1.0, true},
    {"small-q4_k_m", 1.0, true},  {"small-q2_k", 1.0, true}, {"small-iq4_xs", 1.0, true},
    {"small-iq2_xxs", 1.0, true},
};

class Parity : public ::testing::TestWithParam<Fixture> {
  protected:
    static std::string model_path(const Fixture& f) {
        return data_path(std::string("glm-dsa/") + f.name + ".gguf");
    }
    static nlohmann::json golden(const Fixture& f) {
        return load_json(data_path(std::string("glm-dsa/") + f.name + ".golden.json"));
    }
};

// The goldens' greedy continuations are exact for an engine that matches
// llama.cpp bit for bit; on quantized weights a correct engine may round one
// 8-bit activation differently, so compare tokens while llama.cpp's own
// top-1/top-2 margin is more than twice the logit difference we measured.
void expect_greedy(const Fixture& f, const nlohmann::json& p, const std::vector<int32_t>& ours,
                   double diff) {
    const auto want = to_ids(p["greedy"]);
    const auto margins = p["greedy_top1_top2_margins"].get<std::vector<double>>();
    ASSERT_EQ(ours.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        if (f.quantized && !(margins[i] > 2 * diff)) {
            std::printf("  %s/%s: greedy compared for %zu of 16 steps (margin %.3g vs diff %.3g)\n",
                        f.name, p["name"].get<std::string>().c_str(), i, margins[i], diff);
            return;
        }
        ASSERT_EQ(ours[i], want[i]) << f.name << " prompt " << p["name"] << " step " << i;
    }
}

TEST_P(Parity, LastLogitsAndGreedy) {
    const Fixture& f = GetParam();
    TestModel m(model_path(f));
    const auto g = golden(f);
    const int64_t V = m.n_vocab();
    ASSERT_EQ(V, g["n_vocab"].get<int64_t>());
    for (const auto& p : g["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const auto lg = m.batch_logits(tokens, false);
        ASSERT_EQ(int64_t(lg.size()), V);
        const double d = max_abs_diff(lg.data(), to_floats(p["logits_last"]));
        std::printf("  %s/%s: last-position max |d| = %.3g\n", f.name,
                    p["name"].get<std::string>().c_str(), d);
        EXPECT_LE(d, f.tol_last) << f.name << " prompt " << p["name"];
        expect_greedy(f, p, m.greedy(tokens, 16), d);
    }
}

TEST_P(Parity, EveryPositionOf24TokenPrompt) {
    const Fixture& f = GetParam();
    TestModel m(model_path(f));
    const auto g = golden(f);
    const int64_t V = m.n_vocab();
    for (const auto& p : g["prompts"]) {
        if (!p.contains("logits_all")) continue;
        const auto tokens = to_ids(p["tokens"]);
        const auto lg = m.batch_logits(tokens, true);
        ASSERT_EQ(lg.size(), tokens.size() * size_t(V));
        int within = 0;
        double worst = 0;
        for (size_t t = 0; t < tokens.size(); ++t) {
            const double d = max_abs_diff(lg.data() + t * size_t(V), to_floats(p["logits_all"][t]));
            worst = std::max(worst, d);
            within += d <= f.tol_last;
        }
        std::printf("  %s: all positions: %d/%zu within %.3g, worst %.3g\n", f.name, within,
                    tokens.size(), f.tol_last, worst);
        if (f.quantized)
            EXPECT_GE(within, 20);  // a flipped expert/indexer choice may move a few positions
        else
            EXPECT_EQ(within, int(tokens.size()));
    }
}

// Prefill in one batch, token by token, and in chunks of 7 give bitwise the
// same logits at every position.
TEST_P(Parity, BatchingDoesNotChangeLogits) {
    const Fixture& f = GetParam();
    TestModel m(model_path(f));
    const auto g = golden(f);
    for (const auto& p : g["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const auto batch = m.batch_logits(tokens, true);
        EXPECT_TRUE(bitwise_equal(batch, m.chunked_logits(tokens, 1)))
            << f.name << " token by token";
        EXPECT_TRUE(bitwise_equal(batch, m.chunked_logits(tokens, 7))) << f.name << " chunks of 7";
    }
}

INSTANTIATE_TEST_SUITE_P(GlmDsa, Parity, ::testing::ValuesIn(kFixtures), [](const auto& info) {
    std::string n = info.param.name;
    for (char& c : n)
        if (c == '-') c = '_';
    return n;
});

// With llama.cpp's default F16 caches (MLA latent and indexer keys).
TEST(GlmDsaCache, F16CacheMatchesKvF16Goldens) {
    for (const char* name : {"tiny", "small"}) {
        TestModel m(data_path(std::string("glm-dsa/") + name + ".gguf"), backend::CacheType::F16);
        const auto g = load_json(data_path(std::string("glm-dsa/") + name + ".golden.json"));
        const double tol = std::string(name) == "tiny" ? 2e-2 : 5e-2;
        for (const auto& p : g["prompts"]) {
            const auto tokens = to_ids(p["tokens"]);
            const auto& kv = p["kv_f16"];
            const auto lg = m.batch_logits(tokens, false);
            const double d = max_abs_diff(lg.data(), to_floats(kv["logits_last"]));
            std::printf("  %s/%s f16 cache: last max |d| = %.3g\n", name,
                        p["name"].get<std::string>().c_str(), d);
            EXPECT_LE(d, tol);
            EXPECT_EQ(m.greedy(tokens, 16), to_ids(kv["greedy"])) << name << " " << p["name"];
        }
    }
}

// A prompt longer than top_k goes through the sparse path: attending densely
// instead gives different logits, and the sparse result is the golden one.
TEST(GlmDsaSparse, SelectionReallyDropsTokens) {
    const std::string path = data_path("glm-dsa/tiny.gguf");
    const auto g = load_json(data_path("glm-dsa/tiny.golden.json"));
    const auto& p = g["prompts"][3];  // 40 tokens, top_k 8
    const auto tokens = to_ids(p["tokens"]);
    ASSERT_GT(tokens.size(), 8u);
    TestModel sparse(path);
    const auto want = to_floats(p["logits_last"]);
    const auto lg = sparse.batch_logits(tokens, false);
    EXPECT_LE(max_abs_diff(lg.data(), want), 1e-3);

    auto file = gguf::File::open(path);
    auto be = backend::make_cpu_backend({});
    model::LoadOptions lo;
    lo.cache_type = backend::CacheType::F32;
    lo.dense_attention = true;
    auto dense = model::load_model(*file, *be, lo);
    auto st = dense->new_state(64);
    std::vector<float> dl;
    model::SeqInput in{st.get(), tokens, false};
    dense->forward({&in, 1}, dl);
    const double dd = max_abs_diff(dl.data(), want);
    std::printf("  dense attention differs from the sparse golden by %.3g\n", dd);
    EXPECT_GT(dd, 0.05);
}

// Sequences sharing a forward get exactly the logits they get alone.
TEST(GlmDsaBatch, MultiSequenceBatchIsBitwiseEqual) {
    for (const char* name : {"tiny", "small-q4_k_m"}) {
        TestModel m(data_path(std::string("glm-dsa/") + name + ".gguf"), backend::CacheType::F16);
        const auto g = load_json(data_path(std::string("glm-dsa/") + name + ".golden.json"));
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& p : g["prompts"]) prompts.push_back(to_ids(p["tokens"]));
        expect_batch_invariant(m, prompts, {5, 6, 7, 8}, name);
    }
}

TEST(GlmDsaBatch, ThreadCountDoesNotChangeLogits) {
    const auto g = load_json(data_path("glm-dsa/small-q4_k_m.golden.json"));
    const auto tokens = to_ids(g["prompts"][3]["tokens"]);
    TestModel one(data_path("glm-dsa/small-q4_k_m.gguf"), backend::CacheType::F16, 1);
    TestModel two(data_path("glm-dsa/small-q4_k_m.gguf"), backend::CacheType::F16, 2);
    EXPECT_TRUE(bitwise_equal(one.batch_logits(tokens), two.batch_logits(tokens)));
}

// --no-mmap copies the weights into memory; the logits are the same bits.
TEST(GlmDsaWeights, InMemoryCopyGivesTheSameLogits) {
    const std::string path = data_path("glm-dsa/small-q4_k_m.gguf");
    const auto g = load_json(data_path("glm-dsa/small-q4_k_m.golden.json"));
    const auto tokens = to_ids(g["prompts"][3]["tokens"]);
    TestModel mapped(path, backend::CacheType::F16);
    auto file = gguf::File::open(path);
    auto be = backend::make_cpu_backend({});
    model::LoadOptions lo;
    lo.in_memory = true;
    auto copied = model::load_model(*file, *be, lo);
    auto st = copied->new_state(64);
    std::vector<float> lg;
    model::SeqInput in{st.get(), tokens, true};
    copied->forward({&in, 1}, lg);
    EXPECT_TRUE(bitwise_equal(lg, mapped.batch_logits(tokens, true)));
}

TEST(GlmDsaState, RewindThenReforwardEqualsPlainDecode) {
    TestModel m(data_path("glm-dsa/tiny.gguf"));
    const auto g = load_json(data_path("glm-dsa/tiny.golden.json"));
    const auto tokens = to_ids(g["prompts"][2]["tokens"]);
    const auto want = m.batch_logits(tokens, false);
    auto st = m.model->new_state(64);
    std::vector<float> lg;
    std::vector<int32_t> junk = {1, 2, 3, 4, 5};
    model::SeqInput a{st.get(), std::span<const int32_t>(tokens.data(), 20), false};
    m.model->forward({&a, 1}, lg);
    model::SeqInput b{st.get(), junk, false};
    m.model->forward({&b, 1}, lg);
    ASSERT_TRUE(st->rewind(20));
    EXPECT_FALSE(st->rewind(21));
    model::SeqInput c{st.get(), std::span<const int32_t>(tokens.data() + 20, tokens.size() - 20),
                      false};
    m.model->forward({&c, 1}, lg);
    EXPECT_TRUE(bitwise_equal(lg, want));
}

}  // namespace

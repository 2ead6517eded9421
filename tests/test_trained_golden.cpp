// The engine against the trainer's PyTorch reference (train/goldens.py): an
// implementation of glm-dsa independent of llama.cpp, on exported F32 files
// with F32 caches. The goldens carry their own float32 bound (4x the measured
// float32-vs-float64 distance of the reference) and, per position, the
// indexer's top-k gap and the expert-selection gap: a position is compared only
// when every decision at and before it is further from a tie than gap_bound
// (a flipped pick changes that token's state, which later tokens read), and
// the positions left out are counted and printed, never passed silently.
#include <algorithm>
#include <cstdio>

#include "text/tokenizer.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

struct Golden {
    const char* golden;  // under tests/data/
    const char* model;   // under the source tree
};

const Golden kGoldens[] = {
    // The embedded default model, trained by train/train.sh.
    {"trainer/kjv-mini.golden.json", "models/kjv-mini.gguf"},
    // A random-init export of another shape (train/random_model.py).
    {"trainer/random-mini.golden.json", "tests/data/trainer/random-mini.gguf"},
};

std::string source_path(const std::string& rel) {
    return std::string(GLM5_SOURCE_DIR) + "/" + rel;
}

// The first position whose decisions (or an earlier one's) sit within gap_bound of a tie.
size_t first_excluded(const nlohmann::json& p, double gap_bound) {
    const auto& ig = p["indexer_gap"];
    const auto& eg = p["expert_gap"];
    for (size_t t = 0; t < ig.size(); ++t) {
        const bool near = (!ig[t].is_null() && ig[t].get<double>() <= gap_bound) ||
                          (!eg[t].is_null() && eg[t].get<double>() <= gap_bound);
        if (near) return t;
    }
    return ig.size();
}

class TrainedGolden : public ::testing::TestWithParam<Golden> {
  protected:
    void SetUp() override {
        g_ = load_json(data_path(GetParam().golden));
        path_ = source_path(GetParam().model);
        bound_ = g_["bound"].get<double>();
        gap_bound_ = g_["gap_bound"].get<double>();
    }
    nlohmann::json g_;
    std::string path_;
    double bound_ = 0, gap_bound_ = 0;
};

TEST_P(TrainedGolden, FileIsTheOneTheGoldensCameFrom) {
    auto f = gguf::File::open(path_);
    std::ifstream in(path_, std::ios::binary | std::ios::ate);
    EXPECT_EQ(int64_t(in.tellg()), g_["file_size"].get<int64_t>()) << path_;
    // The bound must be a float32 bound, not a loose one that would hide a bug.
    EXPECT_GT(bound_, 0);
    EXPECT_LE(bound_, 5e-3);
}

TEST_P(TrainedGolden, TokenizerMatchesTheTrainers) {
    auto f = gguf::File::open(path_);
    auto tok = text::Tokenizer::from_gguf(*f);
    int checked = 0;
    for (const auto& p : g_["prompts"]) {
        if (p["text"].is_null()) continue;
        const auto ids = tok->encode(p["text"].get<std::string>(), true);
        EXPECT_EQ(ids, to_ids(p["tokens"])) << p["name"];
        ++checked;
    }
    if (g_["prompts"][0]["text"].is_null()) return;  // random-token prompts carry no text
    EXPECT_GE(checked, 3);
}

TEST_P(TrainedGolden, LastLogitsAndGreedy) {
    TestModel m(path_);
    const int64_t V = m.n_vocab();
    ASSERT_EQ(V, g_["n_vocab"].get<int64_t>());
    int compared = 0, excluded = 0;
    size_t greedy_equal = 0, greedy_total = 0;
    for (const auto& p : g_["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const std::string name = p["name"];
        const size_t first_bad = first_excluded(p, gap_bound_);
        const auto lg = m.batch_logits(tokens, false);
        ASSERT_EQ(int64_t(lg.size()), V);
        const double d = max_abs_diff(lg.data(), to_floats(p["logits_last"]));
        if (first_bad < tokens.size()) {
            std::printf(
                "  %s: last position excluded (a decision at %zu is within %.3g of a tie), "
                "|d| = %.3g\n",
                name.c_str(), first_bad, gap_bound_, d);
            ++excluded;
            continue;
        }
        std::printf("  %s (%zu tokens): last-position max |d| = %.3g (bound %.3g)\n", name.c_str(),
                    tokens.size(), d, bound_);
        EXPECT_LE(d, bound_) << name;
        ++compared;
        // Greedy: compare while the reference's choice is clear (top-1/top-2 margin over
        // twice the bound, every decision of the step further than gap_bound from a tie).
        const auto want = to_ids(p["greedy"]);
        const auto margins = p["greedy_top1_top2_margins"].get<std::vector<double>>();
        const auto gaps = p["greedy_decision_gaps"].get<std::vector<double>>();
        const auto ours = m.greedy(tokens, int(want.size()));
        size_t i = 0;
        for (; i < want.size() && margins[i] > 2 * bound_ && gaps[i] > gap_bound_; ++i)
            ASSERT_EQ(ours[i], want[i]) << name << " greedy step " << i;
        std::printf("  %s: greedy equal for %zu of %zu steps (then a margin is within the bound)\n",
                    name.c_str(), i, want.size());
        greedy_equal += i;
        greedy_total += want.size();
    }
    std::printf("  last positions: %d compared, %d excluded; greedy steps compared: %zu of %zu\n",
                compared, excluded, greedy_equal, greedy_total);
    EXPECT_GE(compared, 3);
    // Near-ties end a comparison early, but most steps must be checked.
    EXPECT_GE(2 * greedy_equal, greedy_total);
}

// Every position of the long prompt (longer than the indexer's top_k, so the sparse
// path is what most positions run), at the stored vocabulary entries.
TEST_P(TrainedGolden, EveryPositionOfTheLongPrompt) {
    TestModel m(path_);
    const int64_t V = m.n_vocab();
    const int64_t top_k = g_["idx_top_k"].get<int64_t>();
    int prompts = 0;
    for (const auto& p : g_["prompts"]) {
        if (!p.contains("logits_all")) continue;
        ++prompts;
        const auto tokens = to_ids(p["tokens"]);
        ASSERT_GT(int64_t(tokens.size()), top_k);
        const size_t first_bad = first_excluded(p, gap_bound_);
        const auto lg = m.batch_logits(tokens, true);
        double worst = 0;
        size_t t = 0;
        for (; t < first_bad; ++t) {
            const auto& row = p["logits_all"][t];
            const auto ids = to_ids(row["ids"]);
            const auto want = to_floats(row["logits"]);
            for (size_t k = 0; k < ids.size(); ++k)
                worst = std::max(
                    worst, std::fabs(double(lg[t * size_t(V) + size_t(ids[k])]) - double(want[k])));
        }
        std::printf(
            "  %s: %zu of %zu positions compared (%zu excluded from position %zu on), "
            "worst |d| %.3g (bound %.3g)\n",
            p["name"].get<std::string>().c_str(), t, tokens.size(), tokens.size() - t, first_bad,
            worst, bound_);
        EXPECT_LE(worst, bound_);
        // The sparse path must really be checked: positions past top_k are compared.
        EXPECT_GT(int64_t(t), top_k + 4);
    }
    EXPECT_EQ(prompts, 1);
}

// The NextN/MTP draft head (--spec): the engine's one-token draft after each
// prompt prefix against the reference's draft rows (row p: the prompt's token p
// with the trunk's hidden state at p - 1, a zero row at p = 0, as llama.cpp's
// drafter lays them out). Compared while the reference's top-1/top-2 margin is
// over twice the bound and no trunk or NextN decision up to p is near a tie.
TEST_P(TrainedGolden, NextNDraftsMatchTheReference) {
    TestModel m(path_, backend::CacheType::F32, 2, /*spec=*/true);
    ASSERT_TRUE(m.model->can_draft());
    for (const auto& p : g_["prompts"]) {
        if (!p.contains("nextn_logits")) continue;
        const auto tokens = to_ids(p["tokens"]);
        const auto& rows = p["nextn_logits"];
        ASSERT_EQ(rows.size(), tokens.size());
        size_t last = first_excluded(p, gap_bound_);
        const auto& ng = p["nextn_expert_gap"];
        for (size_t t = 0; t < last; ++t)
            if (ng[t].get<double>() <= gap_bound_) last = t;
        auto st = m.model->new_state(int64_t(tokens.size()) + 8);
        std::vector<float> lg;
        int compared = 0, equal = 0, hits = 0;
        for (size_t t = 0; t < tokens.size(); ++t) {
            model::DraftRequest r{st.get(), tokens[t], 1, 0.0f, {}};
            m.model->draft({&r, 1});
            ASSERT_EQ(r.out.size(), 1u) << "position " << t;
            // The engine's draft against the held-out text (the token after t).
            if (t + 1 < tokens.size()) hits += r.out[0] == tokens[t + 1];
            const auto ids = to_ids(rows[t]["ids"]);
            const auto v = to_floats(rows[t]["logits"]);
            std::vector<size_t> o(ids.size());
            for (size_t k = 0; k < o.size(); ++k) o[k] = k;
            std::sort(o.begin(), o.end(), [&](size_t a, size_t b) { return v[a] > v[b]; });
            if (t<last&& double(v[o[0]]) - double(v[o[1]])> 2 * bound_) {
                ++compared;
                equal += r.out[0] == ids[o[0]];
                EXPECT_EQ(r.out[0], ids[o[0]]) << "draft at position " << t;
            }
            model::SeqInput in{st.get(), std::span<const int32_t>(&tokens[t], 1), false};
            m.model->forward({&in, 1}, lg);
        }
        std::printf(
            "  %s: NextN drafts equal to the reference at %d of %d compared positions "
            "(%zu of %zu before a near-tie); engine drafts agree with the held-out text at "
            "%d of %zu positions (%.1f%%; the reference: %.1f%%)\n",
            p["name"].get<std::string>().c_str(), equal, compared, last, tokens.size(), hits,
            tokens.size() - 1, 100.0 * hits / double(tokens.size() - 1),
            100.0 * p["nextn_top1_agreement_with_prompt"].get<double>());
        EXPECT_GE(compared, int(last) * 3 / 4);
        EXPECT_GT(compared, 50);
    }
}

INSTANTIATE_TEST_SUITE_P(Trainer, TrainedGolden, ::testing::ValuesIn(kGoldens),
                         [](const auto& info) {
                             std::string n = info.param.golden;
                             n = n.substr(n.find('/') + 1);
                             n = n.substr(0, n.find('.'));
                             for (char& c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

}  // namespace

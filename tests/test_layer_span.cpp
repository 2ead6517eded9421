// A forward split by layers (the contract a layer split across processes
// builds on): running the trunk's layers in two or three spans, passing the
// residual rows between them, gives bitwise the logits of the whole forward,
// for both architectures, in prefill and decode, and keeps doing so on the
// states it leaves; a bad span is refused without touching the states.
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

// One step for two sequences at once: their inputs, logits for every row.
std::vector<model::SeqInput> step(std::vector<std::unique_ptr<model::SequenceState>>& st,
                                  const std::vector<std::vector<int32_t>>& toks) {
    std::vector<model::SeqInput> in;
    for (size_t i = 0; i < st.size(); ++i) in.push_back({st[i].get(), toks[i], true, true});
    return in;
}

// The forward as `cuts` splits it: spans [0, c1), [c1, c2), ..., [ck, end).
void split_forward(model::Model& m, std::span<const model::SeqInput> in, std::vector<float>& lg,
                   const std::vector<int64_t>& cuts) {
    std::vector<float> h, next;
    int64_t first = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
        model::LayerSpan s;
        s.first = first;
        s.end = i < cuts.size() ? cuts[i] : -1;
        s.hidden_in = h;
        s.hidden_out = &next;
        s.commit = i == cuts.size();
        m.forward(in, lg, s);
        h.swap(next);
        first = s.end;
    }
}

}  // namespace

TEST(LayerSpan, SplitForwardsAreBitwiseTheWholeForward) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"})
        for (bool spec : {false, true}) {
            TestModel m(data_path(path), backend::CacheType::F16, 2, spec);
            const int64_t L = m.model->info().n_layer, V = m.n_vocab();
            ASSERT_GE(L, 3) << path;
            std::vector<std::vector<int64_t>> splits;
            std::vector<int64_t> all;
            for (int64_t c = 1; c < L; ++c)
                if (m.model->can_split_before(c)) {
                    splits.push_back({c});
                    all.push_back(c);
                }
            ASSERT_GE(all.size(), 2u) << path;
            splits.push_back(all);  // every cut at once
            for (const auto& cuts : splits) {
                std::vector<std::unique_ptr<model::SequenceState>> whole, parts;
                for (int i = 0; i < 2; ++i) {
                    whole.push_back(m.model->new_state(256));
                    parts.push_back(m.model->new_state(256));
                }
                // A prefill of two prompts (one past the indexer's dense
                // limit of the tiny models), then decode steps.
                std::vector<std::vector<int32_t>> toks = {random_ids(1, 150, V),
                                                          random_ids(2, 37, V)};
                for (int t = 0; t < 4; ++t) {
                    std::vector<float> a, b;
                    const auto ia = step(whole, toks);
                    const auto ib = step(parts, toks);
                    m.model->forward(ia, a);
                    split_forward(*m.model, ib, b, cuts);
                    ASSERT_EQ(a.size(), b.size());
                    for (size_t k = 0; k < a.size(); ++k)
                        ASSERT_EQ(a[k], b[k]) << path << " cut at " << cuts[0] << " step " << t;
                    for (size_t i = 0; i < 2; ++i) {
                        EXPECT_EQ(whole[i]->n_past(), parts[i]->n_past());
                        // The next token: the greedy pick of the row's last logits.
                        const size_t rows_before = i == 0 ? 0 : toks[0].size();
                        const float* row =
                            a.data() + (rows_before + toks[i].size() - 1) * size_t(V);
                        toks[i] = {int32_t(std::max_element(row, row + V) - row)};
                    }
                }
            }
        }
}

TEST(LayerSpan, BadSpansAreRefusedWithoutTouchingTheStates) {
    for (const char* path : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        TestModel m(data_path(path), backend::CacheType::F32, 2);
        const int64_t L = m.model->info().n_layer, W = m.model->hidden_width();
        auto st = m.model->new_state(64);
        const auto toks = random_ids(3, 5, m.n_vocab());
        model::SeqInput in{st.get(), toks, false, true};
        std::vector<float> lg, out, wrong(size_t(4 * W));
        const model::LayerSpan bad[] = {
            {L, -1, {}, &out, true},        // past the trunk
            {2, 1, wrong, &out, true},      // empty
            {1, -1, wrong, &out, true},     // 4 rows of hidden input for 5 tokens
            {0, L - 1, {}, nullptr, true},  // ends before the head, nowhere to write
        };
        for (const auto& s : bad) {
            EXPECT_THROW(m.model->forward({&in, 1}, lg, s), Error) << path << " " << s.first;
            EXPECT_EQ(st->n_past(), 0);
        }
        // glm-dsa: a span cannot start at a shared-indexer layer.
        for (int64_t l = 1; l < L; ++l)
            if (!m.model->can_split_before(l)) {
                std::vector<float> h(size_t(5 * W));
                EXPECT_THROW(
                    m.model->forward({&in, 1}, lg, model::LayerSpan{l, -1, h, nullptr, true}),
                    Error);
                EXPECT_EQ(st->n_past(), 0);
            }
        // A span that does not commit leaves the position where it was.
        m.model->forward({&in, 1}, lg, model::LayerSpan{0, 1, {}, &out, false});
        EXPECT_EQ(st->n_past(), 0);
        EXPECT_EQ(out.size(), size_t(5 * W));
    }
}

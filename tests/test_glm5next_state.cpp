// glm5next per-sequence state (docs/glm5next-format.md sections 7-8): the
// recurrent KDA state cannot be rewound by position, so rewind only goes to
// 0 or stays put; speculative rollback is snapshot / restore / re-forward and
// must equal a plain decode bitwise, in the sparse regime too, where a stale
// pool key must never be used.
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

const std::string kModel = "glm5next/tiny.gguf";

std::vector<int32_t> p40() {
    const auto g = load_json(data_path("glm5next/tiny.golden.json"));
    return to_ids(g["prompts"][3]["tokens"]);
}

std::span<const int32_t> part(const std::vector<int32_t>& t, size_t from, size_t n) {
    return {t.data() + from, n};
}

std::vector<float> forward(model::Model& m, model::SequenceState& st, std::span<const int32_t> t,
                           bool all = true) {
    std::vector<float> lg;
    model::SeqInput in{&st, t, all};
    m.forward({&in, 1}, lg);
    return lg;
}

std::vector<float> rows(const std::vector<float>& lg, size_t V, size_t from, size_t n) {
    return {lg.begin() + long(from * V), lg.begin() + long((from + n) * V)};
}

TEST(Glm5NextState, RewindOnlyToZeroOrInPlace) {
    TestModel m(data_path(kModel), backend::CacheType::F32, 1);
    const auto tokens = p40();
    const size_t V = size_t(m.n_vocab());
    const auto plain = m.batch_logits(tokens, true);

    auto st = m.model->new_state(64);
    forward(*m.model, *st, part(tokens, 0, 25));
    EXPECT_TRUE(st->can_rewind(25));
    EXPECT_TRUE(st->can_rewind(0));
    EXPECT_FALSE(st->can_rewind(20));
    EXPECT_TRUE(st->rewind(25));  // nothing to undo
    EXPECT_EQ(st->n_past(), 25);
    // A rewind into the middle would leave the KDA state advanced: refused,
    // and the state is untouched (decoding on equals the plain run).
    EXPECT_FALSE(st->rewind(20));
    EXPECT_FALSE(st->rewind(1));
    EXPECT_FALSE(st->rewind(24));
    EXPECT_EQ(st->n_past(), 25);
    auto lg = forward(*m.model, *st, part(tokens, 25, 15));
    EXPECT_TRUE(bitwise_equal(lg, rows(plain, V, 25, 15)));

    // Rewinding to 0 starts over with a zero state.
    EXPECT_TRUE(st->rewind(0));
    EXPECT_EQ(st->n_past(), 0);
    lg = forward(*m.model, *st, tokens);
    EXPECT_TRUE(bitwise_equal(lg, plain));

    st->reset();
    EXPECT_EQ(st->n_past(), 0);
    lg = forward(*m.model, *st, tokens);
    EXPECT_TRUE(bitwise_equal(lg, plain));
}

// Verify windows of drafts, some rejected, in the sparse regime (more than 19
// visible cells) with windows that cross pool boundaries: the state after
// restore + re-forward of the accepted tokens equals a plain decode, and so
// does every later logit.
TEST(Glm5NextState, SnapshotRestoreReforwardEqualsPlainDecode) {
    TestModel m(data_path(kModel), backend::CacheType::F32, 1);
    const auto tokens = p40();
    const size_t V = size_t(m.n_vocab());
    const auto plain = m.batch_logits(tokens, true);
    const std::vector<int32_t> junk = {11, 200, 13, 14, 300, 16, 17};

    auto st = m.model->new_state(64);
    std::vector<float> ours = forward(*m.model, *st, part(tokens, 0, 17));
    size_t n = 17;
    // (accepted drafts, window length): partial accepts and one full accept.
    const std::pair<size_t, size_t> rounds[] = {{1, 5}, {0, 4}, {3, 6}, {2, 2}, {2, 7}, {4, 4}};
    for (auto [accepted, k] : rounds) {
        if (n + 1 + accepted > tokens.size()) break;
        // Window [last, d_1..d_k]: the first `accepted` drafts are right.
        std::vector<int32_t> window = {tokens[n]};
        for (size_t i = 0; i < k; ++i)
            window.push_back(i < accepted ? tokens[n + 1 + i] : junk[(n + i) % junk.size()]);
        auto snap = st->snapshot();
        EXPECT_EQ(snap->n_past(), int64_t(n));
        auto verify = forward(*m.model, *st, window);
        // The verify rows of the right tokens equal the plain ones already.
        EXPECT_TRUE(
            bitwise_equal(rows(verify, V, 0, accepted + 1), rows(plain, V, n, accepted + 1)))
            << "verify at " << n;
        if (accepted < k) {
            st->restore(*snap);
            EXPECT_EQ(st->n_past(), int64_t(n));
            auto re = forward(*m.model, *st, part(tokens, n, accepted + 1));
            ours.insert(ours.end(), re.begin(), re.end());
        } else {
            ours.insert(ours.end(), verify.begin(), verify.begin() + long((accepted + 1) * V));
        }
        n += accepted + 1;
    }
    ASSERT_LT(n, tokens.size());
    auto rest = forward(*m.model, *st, part(tokens, n, tokens.size() - n));
    ours.insert(ours.end(), rest.begin(), rest.end());
    EXPECT_TRUE(bitwise_equal(ours, plain));
}

TEST(Glm5NextState, RestoreRefusesForeignOrResetSnapshots) {
    TestModel m(data_path(kModel), backend::CacheType::F32, 1);
    const auto tokens = p40();
    auto a = m.model->new_state(64);
    auto b = m.model->new_state(64);
    forward(*m.model, *a, part(tokens, 0, 10));
    forward(*m.model, *b, part(tokens, 0, 10));
    auto snap = a->snapshot();
    EXPECT_THROW(b->restore(*snap), Error);
    a->reset();
    EXPECT_THROW(a->restore(*snap), Error);
    auto a2 = a->snapshot();
    forward(*m.model, *a, part(tokens, 0, 3));
    EXPECT_TRUE(a->rewind(0));
    EXPECT_THROW(a->restore(*a2), Error);  // rewinding to 0 is a reset
}

// A prefix another request shares: the positional rows copied and the KDA
// state taken from a snapshot at its end; decoding on from the copy equals the
// plain run bit for bit, and the source is unchanged. A snapshot at another
// position, of another state, or from before a reset is refused.
TEST(Glm5NextState, CopyPrefixFromASnapshotEqualsPlainDecode) {
    TestModel m(data_path(kModel), backend::CacheType::F32, 1);
    const auto tokens = p40();
    const size_t V = size_t(m.n_vocab());
    const auto plain = m.batch_logits(tokens, true);

    auto src = m.model->new_state(64);
    forward(*m.model, *src, part(tokens, 0, 21));  // past a pool boundary
    auto at21 = src->snapshot();
    forward(*m.model, *src, part(tokens, 21, 9));
    auto other = m.model->new_state(64);
    forward(*m.model, *other, part(tokens, 0, 21));
    auto foreign = other->snapshot();

    auto dst = m.model->new_state(64);
    EXPECT_FALSE(dst->copy_prefix(*src, 21, nullptr));        // recurrent state needs one
    EXPECT_FALSE(dst->copy_prefix(*src, 20, at21.get()));     // taken at another position
    EXPECT_FALSE(dst->copy_prefix(*src, 21, foreign.get()));  // of another state
    EXPECT_EQ(dst->n_past(), 0);
    ASSERT_TRUE(dst->copy_prefix(*src, 21, at21.get()));
    EXPECT_EQ(dst->n_past(), 21);
    auto lg = forward(*m.model, *dst, part(tokens, 21, tokens.size() - 21));
    EXPECT_TRUE(bitwise_equal(lg, rows(plain, V, 21, tokens.size() - 21)));

    // Where the source stands, its own state is the snapshot.
    auto whole = m.model->new_state(64);
    ASSERT_TRUE(whole->copy_prefix(*src, 30, nullptr));
    lg = forward(*m.model, *whole, part(tokens, 30, tokens.size() - 30));
    EXPECT_TRUE(bitwise_equal(lg, rows(plain, V, 30, tokens.size() - 30)));
    lg = forward(*m.model, *src, part(tokens, 30, tokens.size() - 30));  // src unchanged
    EXPECT_TRUE(bitwise_equal(lg, rows(plain, V, 30, tokens.size() - 30)));

    src->reset();
    auto late = m.model->new_state(64);
    EXPECT_FALSE(late->copy_prefix(*src, 21, at21.get()));
}

TEST(Glm5NextState, MemoryAndContextLimit) {
    TestModel m(data_path(kModel), backend::CacheType::F32, 1);
    const auto tokens = p40();
    auto st = m.model->new_state(30);
    const size_t held = st->memory_bytes();
    // 6 KDA layers of 4 heads x 16: tails 3*3*64 + state 4*16*16 floats each,
    // twice (a forward writes the other block).
    EXPECT_GE(held, size_t(2 * 6 * (3 * 3 * 64 + 4 * 16 * 16) * 4));
    EXPECT_EQ(held, m.model->state_cost().bytes(30));
    // The caches are allocated once for the whole context: a forward adds nothing.
    forward(*m.model, *st, part(tokens, 0, 20));
    EXPECT_EQ(st->memory_bytes(), held);
    std::vector<float> lg;
    model::SeqInput in{st.get(), part(tokens, 20, 11), false};
    EXPECT_THROW(m.model->forward({&in, 1}, lg), Error);
    EXPECT_EQ(st->n_past(), 20);  // a refused forward changes nothing
}

}  // namespace

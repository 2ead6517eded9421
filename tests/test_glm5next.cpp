// glm5next (GLM-5.3-Flash) against the float64 reference's goldens
// (tests/data/glm5next/tiny.golden.json, docs/glm5next-format.md section 13),
// the batching invariants the CPU path promises (bitwise), and the pooled
// indexer's sparse selection.
#include <cstdio>
#include <map>

#include "backend/cpu.h"
#include "model/glm5next.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

const std::string kModel = "glm5next/tiny.gguf";
// One thread keeps the suite quick on a shared machine; the thread-count and
// multi-sequence tests run two.
constexpr int kThreads = 1;

const nlohmann::json& golden() {
    static const nlohmann::json g = load_json(data_path("glm5next/tiny.golden.json"));
    return g;
}

double tolerance() {
    return golden()["tolerance"]["logits_max_abs_diff"].get<double>();
}

std::vector<int32_t> prompt_tokens(const std::string& name) {
    for (const auto& p : golden()["prompts"])
        if (p["name"] == name) return to_ids(p["tokens"]);
    throw std::runtime_error("no prompt " + name);
}

// Max |d| of every row of `lg` against the golden rows.
double max_rows_diff(const std::vector<float>& lg, const nlohmann::json& rows, int64_t V) {
    EXPECT_EQ(lg.size(), rows.size() * size_t(V));
    double d = 0;
    for (size_t r = 0; r < rows.size() && (r + 1) * size_t(V) <= lg.size(); ++r)
        d = std::max(d, max_abs_diff(lg.data() + r * size_t(V), to_floats(rows[r])));
    return d;
}

TEST(Glm5NextGolden, LoadsWithTheFixtureShape) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    const auto& info = m.model->info();
    EXPECT_EQ(info.arch, "glm5next");
    EXPECT_EQ(info.n_vocab, golden()["n_vocab"].get<int64_t>());
    EXPECT_EQ(info.n_embd, golden()["hparams"]["n_embd"].get<int64_t>());
    EXPECT_EQ(info.n_layer, golden()["hparams"]["n_layer"].get<int64_t>());
    EXPECT_TRUE(info.has_nextn);
    EXPECT_FALSE(info.nextn_loaded);
    auto* next = dynamic_cast<model::Glm5NextModel*>(m.model.get());
    ASSERT_NE(next, nullptr);
    std::vector<int64_t> mla;
    for (int64_t il = 0; il < next->hparams().n_layer; ++il)
        if (next->hparams().is_mla[size_t(il)]) mla.push_back(il);
    EXPECT_EQ(mla, golden()["hparams"]["mla_layers"].get<std::vector<int64_t>>());
    EXPECT_EQ(next->hparams().idx_top_k, golden()["hparams"]["indexer_top_k"].get<int64_t>());
    EXPECT_EQ(next->hparams().idx_pool, golden()["hparams"]["pool"].get<int64_t>());
}

TEST(Glm5NextGolden, LastLogitsAndGreedy) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    const int64_t V = m.n_vocab();
    for (const auto& p : golden()["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const auto lg = m.batch_logits(tokens, false);
        ASSERT_EQ(int64_t(lg.size()), V);
        const double d = max_abs_diff(lg.data(), to_floats(p["last_logits"]));
        std::printf("  last_logits %s: max |d| = %.3g\n", p["name"].get<std::string>().c_str(), d);
        EXPECT_LE(d, tolerance()) << p["name"];
        EXPECT_EQ(m.greedy(tokens, 16), to_ids(p["greedy"])) << p["name"];
    }
}

TEST(Glm5NextGolden, AllLogitsOfOneBatch) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    const auto& g = golden()["all_logits"];
    const auto tokens = prompt_tokens(g["prompt"]);
    const double d = max_rows_diff(m.batch_logits(tokens, true), g["logits"], m.n_vocab());
    std::printf("  all_logits (%zu rows): max |d| = %.3g\n", tokens.size(), d);
    EXPECT_LE(d, tolerance());
}

TEST(Glm5NextGolden, DecodeLogitsTokenByToken) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    const auto& g = golden()["decode_logits"];
    const auto tokens = prompt_tokens(g["prompt"]);
    const double d = max_rows_diff(m.chunked_logits(tokens, 1), g["logits"], m.n_vocab());
    std::printf("  decode_logits (%zu rows): max |d| = %.3g\n", tokens.size(), d);
    EXPECT_LE(d, tolerance());
}

// The 40-token prompt passes the dense limit (19 visible cells): the pooled
// selection must drop cells. Attending to every cell instead gives the
// golden's dense ablation, several logits away from the sparse result.
TEST(Glm5NextSparse, SelectionReallyDropsPools) {
    const auto tokens = prompt_tokens(golden()["dense_ablation"]["prompt"]);
    ASSERT_GT(int64_t(tokens.size()),
              golden()["hparams"]["dense_max_visible_cells"].get<int64_t>());
    TestModel sparse(data_path(kModel), backend::CacheType::F32, kThreads);
    const auto sl = sparse.batch_logits(tokens, false);

    auto file = gguf::File::open(data_path(kModel));
    auto be = backend::make_cpu_backend({kThreads});
    model::LoadOptions lo;
    lo.cache_type = backend::CacheType::F32;
    lo.dense_attention = true;
    auto dense = model::load_model(*file, *be, lo);
    auto st = dense->new_state(64);
    std::vector<float> dl;
    model::SeqInput in{st.get(), tokens, false};
    dense->forward({&in, 1}, dl);

    const double d_dense =
        max_abs_diff(dl.data(), to_floats(golden()["dense_ablation"]["last_logits"]));
    const double d_apart = max_abs_diff(dl.data(), sl);
    std::printf("  dense_ablation: max |d| = %.3g; dense vs sparse differ by %.3g (golden %.3g)\n",
                d_dense, d_apart,
                golden()["diagnostics"]["dense_vs_sparse_p40_last_max_abs_diff"].get<double>());
    EXPECT_LE(d_dense, tolerance());
    EXPECT_GT(d_apart, 1.0);
}

// The pools each query past the dense limit picks, per trunk MLA layer, equal
// the reference's (ascending pool indices).
TEST(Glm5NextSparse, PickedPoolsMatchTheReference) {
    const auto& g = golden()["indexer_selection"];
    const auto tokens = prompt_tokens(g["prompt"]);
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    auto* next = dynamic_cast<model::Glm5NextModel*>(m.model.get());
    ASSERT_NE(next, nullptr);
    std::map<int64_t, std::vector<std::pair<int32_t, std::vector<int32_t>>>> seen;
    next->set_selection_hook([&](int64_t layer, int32_t pos, std::span<const int32_t> pools) {
        seen[layer].push_back({pos, std::vector<int32_t>(pools.begin(), pools.end())});
    });
    m.batch_logits(tokens, false);
    next->set_selection_hook(nullptr);

    size_t compared = 0;
    ASSERT_EQ(seen.size(), g["layers"].size());
    for (const auto& [layer, picks] : g["layers"].items()) {
        const auto& ours = seen[std::stoll(layer)];
        ASSERT_EQ(ours.size(), picks.size()) << "layer " << layer;
        for (size_t i = 0; i < picks.size(); ++i) {
            EXPECT_EQ(ours[i].first, picks[i]["pos"].get<int32_t>()) << "layer " << layer;
            EXPECT_EQ(ours[i].second, to_ids(picks[i]["pools"]))
                << "layer " << layer << " pos " << ours[i].first;
            ++compared;
        }
    }
    std::printf("  indexer_selection: %zu queries compared\n", compared);
    EXPECT_GT(compared, 0u);
}

// One batch, token by token and chunks of 3 and 7 give bitwise the same
// logits at every position (dense and sparse regimes, pools completing inside
// and across chunks).
TEST(Glm5NextBatching, PrefillDecodeAndChunksAreBitwiseEqual) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    for (const auto& p : golden()["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const auto batch = m.batch_logits(tokens, true);
        EXPECT_TRUE(bitwise_equal(batch, m.chunked_logits(tokens, 1)))
            << p["name"] << " token by token";
        EXPECT_TRUE(bitwise_equal(batch, m.chunked_logits(tokens, 3)))
            << p["name"] << " chunks of 3";
        EXPECT_TRUE(bitwise_equal(batch, m.chunked_logits(tokens, 7)))
            << p["name"] << " chunks of 7";
    }
}

// Sequences sharing a forward get exactly the logits they get alone, in a
// prefill and in a fused decode step, with F32 and F16 caches.
TEST(Glm5NextBatching, MultiSequenceBatchIsBitwiseEqual) {
    for (auto ct : {backend::CacheType::F32, backend::CacheType::F16}) {
        TestModel m(data_path(kModel), ct, ct == backend::CacheType::F16 ? 2 : kThreads);
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& p : golden()["prompts"]) prompts.push_back(to_ids(p["tokens"]));
        expect_batch_invariant(m, prompts, {5, 60, 7, 300},
                               ct == backend::CacheType::F16 ? "f16" : "f32");
    }
}

// Prompt chunks that ask for no logits advance the state all the same.
TEST(Glm5NextBatching, ChunksWithoutLogits) {
    TestModel m(data_path(kModel), backend::CacheType::F32, kThreads);
    const auto tokens = prompt_tokens("p40");
    const auto want = m.batch_logits(tokens, false);
    auto st = m.model->new_state(64);
    std::vector<float> lg;
    for (size_t i = 0; i < tokens.size(); i += 9) {
        const size_t n = std::min<size_t>(9, tokens.size() - i);
        model::SeqInput in{st.get(), {tokens.data() + i, n}, false, i + n == tokens.size()};
        m.model->forward({&in, 1}, lg);
        if (i + n < tokens.size()) {
            EXPECT_TRUE(lg.empty());
        }
    }
    EXPECT_EQ(st->n_past(), int64_t(tokens.size()));
    EXPECT_TRUE(bitwise_equal(lg, want));
}

TEST(Glm5NextBatching, ThreadCountDoesNotChangeLogits) {
    const auto tokens = prompt_tokens("p40");
    TestModel one(data_path(kModel), backend::CacheType::F32, 1);
    TestModel two(data_path(kModel), backend::CacheType::F32, 2);
    EXPECT_TRUE(bitwise_equal(one.batch_logits(tokens), two.batch_logits(tokens)));
}

// The default F16 caches stay close to the F32 goldens and keep the greedy
// continuation of the sparse prompt.
TEST(Glm5NextCache, F16CacheStaysNearTheGoldens) {
    TestModel m(data_path(kModel), backend::CacheType::F16, kThreads);
    for (const auto& p : golden()["prompts"]) {
        const auto lg = m.batch_logits(to_ids(p["tokens"]), false);
        const double d = max_abs_diff(lg.data(), to_floats(p["last_logits"]));
        std::printf("  f16 cache %s: max |d| = %.3g\n", p["name"].get<std::string>().c_str(), d);
        EXPECT_LE(d, 0.1);
    }
}

// ---- the CLI goes through the same loader -------------------------------

std::string run_cli(const std::string& args, int* rc) {
    const std::string cmd = std::string(GLM5_BINARY) + " " + args + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    *rc = pclose(p);
    return out;
}

std::string join(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s;
}

TEST(Glm5NextCli, LogitsRunAndInspect) {
    const std::string model = data_path(kModel);
    const auto& p = golden()["prompts"][3];
    int rc = 0;
    const auto out = run_cli(
        "logits --model " + model + " --cache-type f32 -t 1 --tokens " + join(to_ids(p["tokens"])),
        &rc);
    ASSERT_EQ(rc, 0);
    const auto j = nlohmann::json::parse(out);
    EXPECT_LE(max_abs_diff(to_floats(j["logits"][0]).data(), to_floats(p["last_logits"])),
              tolerance());

    const auto ids = run_cli("run --model " + model +
                                 " --cache-type f32 -t 1 --temp 0 -n 16 --ignore-eos --print-ids "
                                 "--tokens " +
                                 join(to_ids(p["tokens"])),
                             &rc);
    ASSERT_EQ(rc, 0);
    std::string want;
    for (int32_t t : to_ids(p["greedy"])) want += (want.empty() ? "" : " ") + std::to_string(t);
    EXPECT_EQ(ids, want + "\n");

    const auto report = run_cli("inspect " + model, &rc);
    ASSERT_EQ(rc, 0);
    EXPECT_NE(report.find("glm5next"), std::string::npos);
}

}  // namespace

// The glm5next bench preset (glm5 make-model --arch glm5next --preset bench):
// GLM-5.3-Flash's layout proportions, checked on the full preset's plan (no
// file is written); the weight bytes decode reads per token against glm-dsa's
// bench preset; and a reduced copy (narrow, 16 experts, but the preset's layer
// pattern, streams and per-head dims) that is generated as the preset is
// (Q4_K_M, pooled blocks), loads, runs, keeps the batching invariant and whose
// kernels read the bytes decode_bytes_per_token predicts.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "model/glm5next.h"
#include "synth/generator.h"
#include "util_cli.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;
namespace fs = std::filesystem;

namespace {

synth::GenOptions bench_options() {
    synth::GenOptions o;
    o.arch = synth::Arch::Glm5Next;
    o.preset = "bench";
    o.glm5next = synth::Glm5NextHParams::preset("bench");
    o.type = synth::Glm5NextHParams::preset_default_type("bench");
    o.blocks = synth::BlockSource::Pool;
    return o;
}

// What the tensors of a plan say about each block.
struct BlockShape {
    bool kda = false, mla = false, pooled_indexer = false, lightning_indexer = false;
    bool nextn = false, moe = false;
    int64_t experts = 0, n_ff_exp = 0, hc_in = 0, hc_out = 0, kv_a_width = 0;
};

std::map<int, BlockShape> shapes(const synth::ModelPlan& p) {
    std::map<int, BlockShape> m;
    for (const auto& t : p.tensors) {
        int b = -1;
        if (std::sscanf(t.name.c_str(), "blk.%d.", &b) != 1) continue;
        BlockShape& s = m[b];
        const std::string n = t.name.substr(t.name.find('.', 4) + 1);
        if (n == "ssm_a") s.kda = true;
        if (n == "attn_k_b.weight") s.mla = true;
        if (n == "indexer_compressor_kv.weight") s.pooled_indexer = true;
        if (n == "indexer.attn_k.weight") s.lightning_indexer = true;
        if (n == "nextn.eh_proj.weight") s.nextn = true;
        if (n == "attn_kv_a_mqa.weight") s.kv_a_width = t.ne[1];
        if (n == "hc_attn_fn.weight") {
            s.hc_in = t.ne[0];
            s.hc_out = t.ne[1];
        }
        if (n == "ffn_gate_exps.weight") {
            s.moe = true;
            s.n_ff_exp = t.ne[1];
            s.experts = t.ne[2];
        }
    }
    return m;
}

TEST(Glm5NextBenchPreset, HasFlashProportions) {
    const synth::GenOptions o = bench_options();
    const synth::Glm5NextHParams& h = o.glm5next;
    const synth::ModelPlan p = synth::plan(o);
    EXPECT_EQ(p.arch, "glm5next");
    const auto m = shapes(p);
    ASSERT_GE(h.n_layer, 16);
    ASSERT_EQ(int64_t(m.size()), h.n_layer + 1);  // the trunk and one NextN block

    int kda = 0, mla = 0;
    for (int il = 0; il < h.n_layer; ++il) {
        const BlockShape& s = m.at(il);
        // MLA every fourth layer as in Flash (3, 7, 11, ...), KDA elsewhere.
        const bool want_mla = il % 4 == 3;
        EXPECT_EQ(s.mla, want_mla) << il;
        EXPECT_EQ(s.kda, !want_mla) << il;
        kda += s.kda;
        mla += s.mla;
        // NoPE MLA (the latent alone, no rope tail) with the pooled indexer.
        if (s.mla) {
            EXPECT_TRUE(s.pooled_indexer) << il;
            EXPECT_EQ(s.kv_a_width, 512) << il;
        }
        EXPECT_FALSE(s.lightning_indexer) << il;
        EXPECT_FALSE(s.nextn) << il;
        // 4 streams: the mixing logits read 4E values and give (2+4)*4 mixes.
        EXPECT_EQ(s.hc_in, 4 * h.n_embd) << il;
        EXPECT_EQ(s.hc_out, 24) << il;
        // Many small experts on every layer past the dense ones.
        EXPECT_EQ(s.moe, il >= h.n_dense) << il;
        if (s.moe) {
            EXPECT_EQ(s.experts, 72) << il;
            EXPECT_EQ(s.n_ff_exp % 256, 0) << il;  // whole K-quant blocks
            EXPECT_LE(3 * s.n_ff_exp, h.n_embd) << il;
        }
    }
    EXPECT_EQ(kda, 3 * mla);
    const BlockShape& nn = m.at(int(h.n_layer));
    EXPECT_TRUE(nn.nextn && nn.mla && nn.moe);
    EXPECT_EQ(h.n_expert_used, 8);

    // Flash's per-head and per-cell dims, clamp and streams.
    EXPECT_EQ(h.kda_dim, 128);
    EXPECT_EQ(h.kv_lora, 512);
    EXPECT_EQ(h.k_mla, 256);
    EXPECT_EQ(h.v_mla, 256);
    EXPECT_EQ(h.idx_pool, 4);
    EXPECT_EQ(h.idx_top_k, 2048);
    EXPECT_EQ(h.conv_k, 4);
    EXPECT_EQ(h.hc, 4);
    EXPECT_EQ(h.clamp_exp, 10.0f);
    EXPECT_EQ(h.clamp_shexp, 10.0f);
    EXPECT_EQ(h.clamp_step, 0.0f);

    // The Q4_K_M mix, with the tensors the format keeps in F32 left in F32.
    EXPECT_EQ(o.type, "Q4_K_M");
    std::map<std::string, quant::Type> ty;
    for (const auto& t : p.tensors) ty[t.name] = t.type;
    EXPECT_EQ(ty["blk.5.ffn_gate_exps.weight"], quant::Type::Q4_K);
    EXPECT_EQ(ty["blk.4.attn_q.weight"], quant::Type::Q4_K);
    EXPECT_EQ(ty["output.weight"], quant::Type::Q6_K);
    for (const char* n : {"blk.4.hc_attn_fn.weight", "blk.4.hc_ffn_fn.weight",
                          "blk.4.ssm_conv1d_q.weight", "blk.7.indexer_compressor_ape.weight"})
        EXPECT_EQ(ty[n], quant::Type::F32) << n;
    // A file of the glm-dsa bench model's order of size.
    EXPECT_GT(p.tensor_bytes, 2ull << 30);
    EXPECT_LT(p.tensor_bytes, 4ull << 30);
}

TEST(Glm5NextBenchPreset, DecodeReadsAboutAsManyBytesAsGlmDsaBench) {
    synth::GenOptions dsa;
    dsa.glm_dsa = synth::GlmDsaHParams::preset("bench");
    dsa.preset = "bench";
    dsa.type = synth::GlmDsaHParams::preset_default_type("bench");
    const synth::DecodeBytes a = synth::decode_bytes_per_token(dsa);
    const synth::DecodeBytes b = synth::decode_bytes_per_token(bench_options());
    const double ratio = double(b.total()) / double(a.total());
    std::printf("decode bytes per token: glm5next bench %.2f MB, glm-dsa bench %.2f MB (%.3f)\n",
                double(b.total()) * 1e-6, double(a.total()) * 1e-6, ratio);
    EXPECT_GT(ratio, 0.75);
    EXPECT_LT(ratio, 1.25);
    EXPECT_GT(a.routed, 0u);
    EXPECT_GT(b.shared, 0u);

    // The routed share is n_used of n_expert: the expert tensors of the plan's
    // trunk MoE layers times 8/72, counted here independently.
    const synth::ModelPlan p = synth::plan(bench_options());
    const int64_t n_layer = bench_options().glm5next.n_layer;
    uint64_t exps = 0;
    for (const auto& t : p.tensors) {
        int blk = -1;
        if (std::sscanf(t.name.c_str(), "blk.%d.", &blk) != 1 || blk >= n_layer) continue;
        if (t.name.find("_exps.") == std::string::npos) continue;
        exps += quant::row_size(t.type, t.ne[0]) * uint64_t(t.ne[1] * t.ne[2]);
    }
    EXPECT_EQ(b.routed, exps / 72 * 8);
}

class Glm5NextBenchReduced : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("glm5next_bench_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // The preset with a narrow width and 16 experts; the layer pattern,
    // streams, clamps and per-head dims stay. top_k 8 so that a 32-token
    // prompt takes the indexer's sparse path.
    static synth::GenOptions reduced() {
        synth::GenOptions o = bench_options();
        synth::Glm5NextHParams& h = o.glm5next;
        h.n_vocab = 768;
        h.n_embd = 256;
        h.n_ff = 768;
        h.n_expert = 16;
        h.n_ff_exp = 256;
        h.kda_heads = 2;
        h.mla_heads = 2;
        h.q_lora = 256;
        h.idx_heads = 2;
        h.idx_top_k = 8;
        return o;
    }
    fs::path dir_;
};

TEST_F(Glm5NextBenchReduced, LoadsRunsAndReadsThePredictedBytes) {
    const synth::GenOptions o = reduced();
    const std::string path = (dir_ / "bench-reduced.gguf").string();
    synth::generate(o, path);

    TestModel m(path, backend::CacheType::F32, 2);
    EXPECT_EQ(m.model->info().arch, "glm5next");
    EXPECT_EQ(m.model->info().n_layer, o.glm5next.n_layer);
    const auto h = model::Glm5NextHParams::from_gguf(*m.file);
    int kda = 0, mla = 0;
    for (int64_t il = 0; il < h.n_layer; ++il) (h.is_mla[size_t(il)] ? mla : kda)++;
    EXPECT_EQ(kda, 3 * mla);
    EXPECT_TRUE(h.is_mla[3] && h.is_mla[7] && !h.is_mla[4]);
    EXPECT_EQ(h.hc_streams, 4);
    EXPECT_EQ(h.n_expert, 16);
    EXPECT_EQ(h.n_expert_used, 8);
    EXPECT_EQ(h.n_nextn, 1);
    for (float c : h.clamp_exp) EXPECT_EQ(c, 10.0f);
    for (float c : h.clamp_shexp) EXPECT_EQ(c, 10.0f);

    // A forward past top_k: finite logits with a spread, the same bitwise
    // fed in one batch or token by token.
    const auto prompt = random_ids(11, 32, m.n_vocab());
    const auto lg = m.batch_logits(prompt, true);
    ASSERT_EQ(lg.size(), prompt.size() * size_t(m.n_vocab()));
    double sum = 0, sum2 = 0;
    for (float v : lg) {
        ASSERT_TRUE(std::isfinite(v));
        sum += v;
        sum2 += double(v) * v;
    }
    const double mean = sum / double(lg.size());
    const double sd = std::sqrt(sum2 / double(lg.size()) - mean * mean);
    EXPECT_GT(sd, 0.3);
    EXPECT_LT(sd, 30.0);
    EXPECT_TRUE(bitwise_equal(lg, m.chunked_logits(prompt, 1)));

    // One decoded token reads what decode_bytes_per_token predicts, less
    // what the kernels do not count (vectors, the embedding row).
    auto st = m.model->new_state(64);
    std::vector<float> out;
    model::SeqInput pre{st.get(), prompt, false};
    m.model->forward({&pre, 1}, out);
    m.be->reset_counters();
    const std::vector<int32_t> one{prompt[0]};
    model::SeqInput step{st.get(), one, false};
    m.model->forward({&step, 1}, out);
    const double counted = double(m.be->counters().weight_bytes);
    const double predicted = double(synth::decode_bytes_per_token(o).total());
    std::printf("reduced preset: kernels read %.0f bytes for one token, predicted %.0f\n", counted,
                predicted);
    EXPECT_LE(counted, predicted);
    EXPECT_GT(counted, 0.97 * predicted);
}

TEST(Glm5NextBenchPresetCli, DryRunUsesThePresetPooled) {
    const CliResult r = run_glm5("make-model --arch glm5next --preset bench --dry-run");
    ASSERT_EQ(r.code, 0) << r.err;
    // The preset's default type and pooled blocks (--blocks auto), and the figure.
    EXPECT_NE(r.out.find("blk.3.attn_k_b.weight"), std::string::npos);
    EXPECT_NE(r.out.find("blk.23.attn_k_b.weight"), std::string::npos);
    EXPECT_NE(r.out.find("blk.24.nextn.eh_proj.weight"), std::string::npos);
    EXPECT_NE(r.out.find("Q4_K     [1536, 512, 72] pooled"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("; decode reads "), std::string::npos);
    // glm-dsa's preset names are not glm5next's.
    const CliResult bad = run_glm5("make-model --arch glm5next --preset small --dry-run");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("tiny, bench"), std::string::npos) << bad.err;
}

// Of the dimension flags glm5next takes the heads (KDA and MLA) and the expert
// width, the shapes tensor parallelism cuts; the others are refused.
TEST(Glm5NextBenchPresetCli, HeadsAndExpertWidthOnly) {
    const CliResult r = run_glm5("make-model --arch glm5next --n-head 6 --n-ff-exp 48 --dry-run");
    ASSERT_EQ(r.code, 0) << r.err;
    // Tiny's KDA projections (6 heads x 16) and decay per head, experts 48 wide.
    auto has = [&](const std::string& name, const std::string& shape) {
        const size_t at = r.out.find(name + " ");
        return at != std::string::npos &&
               r.out.compare(r.out.find('[', at), shape.size(), shape) == 0;
    };
    EXPECT_TRUE(has("blk.0.attn_q.weight", "[64, 96]")) << r.out;
    EXPECT_TRUE(has("blk.0.ssm_a", "[1, 6]")) << r.out;
    EXPECT_TRUE(has("blk.1.ffn_gate_exps.weight", "[64, 48, 16]")) << r.out;
    const CliResult bad = run_glm5("make-model --arch glm5next --n-embd 128 --dry-run");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("glm5next takes --n-head and --n-ff-exp"), std::string::npos) << bad.err;
}

}  // namespace

// glm5next loading: every refusal rule of docs/glm5next-format.md section 3
// (and missing / mis-shaped tensors of section 4) on minimal malformed copies
// of the fixture, written with the GGUF writer; and the variants that must
// load (trunk-only file, per-block head-count arrays).
#include <filesystem>
#include <functional>

#include "backend/cpu.h"
#include "gguf/writer.h"
#include "model/glm5next.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

namespace fs = std::filesystem;

const std::string kModel = "glm5next/tiny.gguf";

class Glm5NextLoad : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        src_ = gguf::File::open(data_path(kModel)).release();
        dir_ = new fs::path(fs::temp_directory_path() /
                            ("glm5next_refuse_" + std::to_string(::getpid())));
        fs::create_directories(*dir_);
    }
    static void TearDownTestSuite() {
        delete src_;
        fs::remove_all(*dir_);
        delete dir_;
    }

    struct TensorEdit {
        bool drop = false;
        std::vector<int64_t> ne;  // empty: keep the shape
    };
    using KvEdit = std::function<void(gguf::Writer&)>;
    using TensorFilter = std::function<TensorEdit(const gguf::TensorInfo&)>;

    // The fixture with its metadata edited by `kv` and its tensors by `tensors`.
    static std::string write_variant(const std::string& name, const KvEdit& kv,
                                     const TensorFilter& tensors = nullptr) {
        gguf::Writer w;
        for (const auto& [k, v] : src_->metadata()) w.set(k, v);
        if (kv) kv(w);
        for (const auto& t : src_->tensors()) {
            TensorEdit e = tensors ? tensors(t) : TensorEdit{};
            if (e.drop) continue;
            std::vector<int64_t> ne = e.ne;
            if (ne.empty()) ne.assign(t.ne.begin(), t.ne.begin() + t.n_dims);
            int64_t n = 1;
            for (int64_t d : ne) n *= d;
            // A reshaped tensor keeps (a prefix of, or zero-padded) the original values.
            std::vector<uint8_t> bytes(size_t(n) * sizeof(float), 0);
            std::memcpy(bytes.data(), t.data, std::min(bytes.size(), t.nbytes));
            if (t.type != quant::Type::F32) throw std::runtime_error("fixture tensor not F32");
            w.add_tensor_bytes(t.name, t.type, ne, bytes.data(), bytes.size());
        }
        const std::string path = (*dir_ / (name + ".gguf")).string();
        w.write(path);
        return path;
    }

    static std::unique_ptr<model::Model> load(const std::string& path,
                                              std::unique_ptr<gguf::File>& file,
                                              std::unique_ptr<backend::Backend>& be,
                                              bool nextn = false) {
        file = gguf::File::open(path);
        be = backend::make_cpu_backend({1});
        model::LoadOptions lo;
        lo.cache_type = backend::CacheType::F32;
        lo.load_nextn = nextn;
        return model::load_model(*file, *be, lo);
    }

    // Loading must fail with an error whose message contains every `needles`.
    static void expect_refused(const std::string& path, std::vector<std::string> needles) {
        std::unique_ptr<gguf::File> file;
        std::unique_ptr<backend::Backend> be;
        try {
            load(path, file, be);
            ADD_FAILURE() << path << " loaded, expected a refusal";
        } catch (const Error& e) {
            const std::string msg = e.what();
            std::printf("  refused: %s\n", msg.c_str());
            for (const auto& n : needles)
                EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
        }
    }

    static std::vector<float> logits(const std::string& path, const std::vector<int32_t>& tokens,
                                     bool nextn = false, model::ModelInfo* info = nullptr) {
        std::unique_ptr<gguf::File> file;
        std::unique_ptr<backend::Backend> be;
        auto m = load(path, file, be, nextn);
        if (info) *info = m->info();
        auto st = m->new_state(64);
        std::vector<float> lg;
        model::SeqInput in{st.get(), tokens, true};
        m->forward({&in, 1}, lg);
        return lg;
    }

    static gguf::File* src_;
    static fs::path* dir_;
};

gguf::File* Glm5NextLoad::src_ = nullptr;
fs::path* Glm5NextLoad::dir_ = nullptr;

const std::vector<int32_t> kTokens = {322, 324, 327, 87, 104, 97, 116, 310, 32, 50, 328, 341};

TEST_F(Glm5NextLoad, UnchangedCopyLoadsAndMatches) {
    const auto path = write_variant("copy", nullptr);
    EXPECT_TRUE(bitwise_equal(logits(path, kTokens), logits(data_path(kModel), kTokens)));
}

TEST_F(Glm5NextLoad, RopeDimensionMustBeZero) {
    expect_refused(
        write_variant("rope",
                      [](gguf::Writer& w) { w.set_u32("glm5next.rope.dimension_count", 16); }),
        {"rope.dimension_count", "NoPE"});
}

TEST_F(Glm5NextLoad, LayerKindMustBeKdaOrMla) {
    expect_refused(
        write_variant(
            "kind2",
            [](gguf::Writer& w) {
                w.set_array_i32("glm5next.attention.head_count_kv", {0, 0, 2, 1, 0, 0, 0, 1, 1});
            }),
        {"head_count_kv[2]", "0 (KDA) or 1 (MLA)"});
    expect_refused(
        write_variant(
            "kind_neg",
            [](gguf::Writer& w) {
                w.set_array_i32("glm5next.attention.head_count_kv", {0, 0, 0, 1, -1, 0, 0, 1, 1});
            }),
        {"head_count_kv[4]"});
    expect_refused(
        write_variant("kind_scalar",
                      [](gguf::Writer& w) { w.set_u32("glm5next.attention.head_count_kv", 1); }),
        {"head_count_kv", "array"});
}

TEST_F(Glm5NextLoad, RouterMustBeSigmoid) {
    expect_refused(
        write_variant("softmax_router",
                      [](gguf::Writer& w) { w.set_u32("glm5next.expert_gating_func", 1); }),
        {"expert_gating_func", "sigmoid"});
}

TEST_F(Glm5NextLoad, TopKMustBeAMultipleOfThePoolSize) {
    expect_refused(
        write_variant("topk",
                      [](gguf::Writer& w) { w.set_u32("glm5next.attention.indexer.top_k", 18); }),
        {"top_k", "block_size", "multiple"});
}

TEST_F(Glm5NextLoad, GateLowerBoundMustBeNegative) {
    for (float lb : {0.0f, 2.0f}) {
        expect_refused(write_variant("gate_lb",
                                     [lb](gguf::Writer& w) {
                                         w.set_f32("glm5next.kda.gate_lower_bound", lb);
                                     }),
                       {"kda.gate_lower_bound", "negative"});
    }
}

TEST_F(Glm5NextLoad, NextnMustLeaveATrunk) {
    for (uint32_t n : {9u, 12u})
        expect_refused(
            write_variant("nextn",
                          [n](gguf::Writer& w) { w.set_u32("glm5next.nextn_predict_layers", n); }),
            {"nextn_predict_layers", "block_count"});
}

TEST_F(Glm5NextLoad, MissingTensorsAreRefused) {
    for (const char* name : {"blk.2.ssm_conv1d_k.weight", "blk.3.indexer_compressor_norm.weight",
                             "blk.5.hc_ffn_base.weight", "blk.7.attn_v_b.weight", "blk.0.ssm_a",
                             "output_norm.weight"}) {
        expect_refused(write_variant("missing", nullptr,
                                     [name](const gguf::TensorInfo& t) {
                                         return TensorEdit{t.name == name, {}};
                                     }),
                       {"missing tensor", name});
    }
}

TEST_F(Glm5NextLoad, MisShapedTensorsAreRefused) {
    const std::pair<const char*, std::vector<int64_t>> cases[] = {
        {"blk.3.attn_kv_a_mqa.weight", {64, 48}},          // a rope tail: not NoPE
        {"blk.1.ssm_conv1d_q.weight", {3, 1, 64}},         // wrong kernel
        {"blk.4.hc_attn_fn.weight", {256, 20}},            // not (2+S)*S mixes
        {"blk.7.indexer_compressor_ape.weight", {16, 3}},  // not one row per pool slot
        {"blk.6.ssm_norm.weight", {32}},                   // not the head size
        {"blk.2.ffn_gate_exps.weight", {64, 32, 8}},       // not expert_count
    };
    for (const auto& [name, ne] : cases) {
        expect_refused(
            write_variant(
                "shape", nullptr,
                [&](const gguf::TensorInfo& t) {
                    return TensorEdit{false, t.name == name ? ne : std::vector<int64_t>{}};
                }),
            {name, "shape"});
    }
}

// A file that declares the NextN block but does not ship it loads, with the
// trunk's logits unchanged; with --spec it loads too (nothing to draft with).
TEST_F(Glm5NextLoad, TrunkOnlyFileLoads) {
    const auto path = write_variant("trunk_only", nullptr, [](const gguf::TensorInfo& t) {
        return TensorEdit{t.name.rfind("blk.8.", 0) == 0, {}};
    });
    model::ModelInfo info;
    const auto lg = logits(path, kTokens, false, &info);
    EXPECT_FALSE(info.has_nextn);
    EXPECT_TRUE(bitwise_equal(lg, logits(data_path(kModel), kTokens)));
    logits(path, kTokens, true, &info);
    EXPECT_FALSE(info.nextn_loaded);
    // The full fixture loads its NextN block on request.
    logits(data_path(kModel), kTokens, true, &info);
    EXPECT_TRUE(info.has_nextn);
    EXPECT_TRUE(info.nextn_loaded);
}

// Head counts may be a per-block array; each block's count sets the shapes it must have.
TEST_F(Glm5NextLoad, PerBlockHeadCounts) {
    const auto same = write_variant("heads_array", [](gguf::Writer& w) {
        w.set_array_u32("glm5next.attention.head_count", std::vector<uint32_t>(9, 4));
    });
    EXPECT_TRUE(bitwise_equal(logits(same, kTokens), logits(data_path(kModel), kTokens)));

    // Block 1 (KDA) declared with 2 heads: its 64-wide projections no longer fit.
    expect_refused(
        write_variant(
            "heads_kda",
            [](gguf::Writer& w) {
                w.set_array_u32("glm5next.attention.head_count", {4, 2, 4, 4, 4, 4, 4, 4, 4});
            }),
        {"blk.1.attn_q.weight", "shape"});
    // Block 7 (MLA) with 8 query heads.
    expect_refused(
        write_variant(
            "heads_mla",
            [](gguf::Writer& w) {
                w.set_array_u32("glm5next.attention.head_count", {4, 4, 4, 4, 4, 4, 4, 8, 4});
            }),
        {"blk.7.attn_q_b.weight", "shape"});
    // An array must have one entry per block.
    expect_refused(write_variant("heads_short",
                                 [](gguf::Writer& w) {
                                     w.set_array_u32("glm5next.attention.head_count", {4, 4, 4});
                                 }),
                   {"attention.head_count", "one per block"});
}

// Scalar clamp limits apply to every block and change the result; an absent
// shared-expert limit falls back to the routed one.
TEST_F(Glm5NextLoad, ClampKeysScalarOrArray) {
    const auto base = logits(data_path(kModel), kTokens);
    const auto wide = write_variant("clamp_wide", [](gguf::Writer& w) {
        w.set_f32("glm5next.swiglu_clamp_exp", 1000.0f);
        w.set_f32("glm5next.swiglu_clamp_shexp", 1000.0f);
    });
    const auto none = write_variant("clamp_none", [](gguf::Writer& w) {
        w.set_f32("glm5next.swiglu_clamp_exp", 0.0f);
        w.set_f32("glm5next.swiglu_clamp_shexp", 0.0f);
    });
    const auto lw = logits(wide, kTokens), ln = logits(none, kTokens);
    // Limits far above every activation equal no clamp; the fixture's small ones bite.
    EXPECT_TRUE(bitwise_equal(lw, ln));
    EXPECT_GT(max_abs_diff(base.data(), ln), 1e-2);
}

}  // namespace

namespace {

// Hyperparameters past 2^31 - 1 are refused when read, before any product of
// two of them could overflow (2^32 heads x a head size would wrap int64 math in
// the shape checks); a block count above the tensor count before anything is
// sized by it.
TEST_F(Glm5NextLoad, HugeHyperparametersAreRefusedBeforeUse) {
    expect_refused(write_variant("huge_heads",
                                 [](gguf::Writer& w) {
                                     w.set_u64("glm5next.attention.indexer.head_count", uint64_t(1)
                                                                                            << 33);
                                 }),
                   {"attention.indexer.head_count", "more than the limit of 2147483647"});
    expect_refused(write_variant("huge_kda",
                                 [](gguf::Writer& w) {
                                     w.set_u64("glm5next.kda.head_dim", ~uint64_t(0) - 5);
                                 }),
                   {"kda.head_dim", "more than the limit"});
    expect_refused(write_variant("huge_blocks",
                                 [](gguf::Writer& w) {
                                     w.set_u64("glm5next.block_count", uint64_t(1) << 30);
                                 }),
                   {"block_count", "but the file holds only"});
}

// The tokenizer's vocabulary and the embedding / output rows must agree.
TEST_F(Glm5NextLoad, VocabularyMustMatchTheEmbeddingRows) {
    const gguf::Value* toks = src_->find("tokenizer.ggml.tokens");
    ASSERT_TRUE(toks && toks->is_array());
    std::vector<std::string> fewer;
    for (size_t i = 0; i + 1 < toks->size(); ++i) fewer.emplace_back(*toks->string_at(i));
    expect_refused(
        write_variant("vocab_short",
                      [&](gguf::Writer& w) { w.set_array_string("tokenizer.ggml.tokens", fewer); }),
        {"the tokenizer has " + std::to_string(fewer.size()) + " tokens",
         "token_embd.weight has " + std::to_string(toks->size()) + " rows"});
}

}  // namespace

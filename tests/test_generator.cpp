// The synthetic model generator against the fixtures llama.cpp's tools made:
// same metadata keys and value types as tiny.gguf, same tensors and shapes,
// and per-tensor types equal to what llama-quantize chose for small-*.gguf.
// Plus determinism, weight statistics, importance vectors and the vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "text/chat.h"

#include "core/error.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quantize/mix.h"
#include "synth/generator.h"
#include "synth/random.h"
#include "synth/vocab.h"

namespace fs = std::filesystem;
using namespace glm5::synth;
using namespace glm5::quantize;
using glm5::quant::Type;

namespace {

const std::string kData = std::string(GLM5_TEST_DATA) + "/glm-dsa/";

class TempDir {
  public:
    TempDir() {
        path_ = fs::temp_directory_path() / ("glm5-gen-test-" + std::to_string(getpid()));
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

  private:
    fs::path path_;
};

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

GenOptions preset_options(const std::string& preset, const std::string& type) {
    GenOptions o;
    o.preset = preset;
    o.glm_dsa = GlmDsaHParams::preset(preset);
    o.type = type;
    return o;
}

std::vector<float> dequantize(const glm5::gguf::TensorInfo& t) {
    std::vector<float> v(size_t(t.nelements()));
    for (int64_t r = 0; r < t.nrows(); ++r)
        glm5::quant::dequantize_row(t.type, t.data + size_t(r) * t.row_bytes(),
                                    v.data() + size_t(r * t.ne[0]), t.ne[0]);
    return v;
}

struct Moments {
    double mean, sd;
};
Moments moments(const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x;
    const double m = s / double(v.size());
    for (float x : v) s2 += (x - m) * (x - m);
    return {m, std::sqrt(s2 / double(v.size()))};
}

// The sample std of n Irwin–Hall(12) values (excess kurtosis -0.1) has a
// relative standard error of sqrt((kurtosis - 1) / (4 n)) = 0.69/sqrt(n);
// allow six of them.
double sd_tolerance(size_t n) {
    return 6.0 * 0.69 / std::sqrt(double(n));
}

std::string value_signature(const glm5::gguf::Value& v) {
    std::string s = glm5::gguf::value_type_name(v.type());
    if (v.is_array()) s += std::string("[") + glm5::gguf::value_type_name(v.array_type()) + "]";
    return s;
}

// Exact equality of two metadata values, arrays element by element.
bool same_value(const glm5::gguf::Value& a, const glm5::gguf::Value& b) {
    using glm5::gguf::ValueType;
    if (a.type() != b.type()) return false;
    switch (a.type()) {
        case ValueType::ARRAY:
            if (a.array_type() != b.array_type() || a.size() != b.size()) return false;
            for (size_t i = 0; i < a.size(); ++i)
                if (!same_value(a[i], b[i])) return false;
            return true;
        case ValueType::STRING:
            return *a.as_string() == *b.as_string();
        case ValueType::BOOL:
            return *a.as_bool() == *b.as_bool();
        case ValueType::F32:
        case ValueType::F64:
            return *a.as_float() == *b.as_float();
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64:
            return *a.as_int() == *b.as_int();
        default:
            return *a.as_uint() == *b.as_uint();
    }
}

}  // namespace

TEST(GeneratorRandom, IrwinHallMoments) {
    // Mean 0, variance 1 - 2^-32, |z| <= 6: the sampler's stated properties.
    const uint64_t seed = stream_seed(7, "moments");
    const int n = 1 << 20;
    double s = 0, s2 = 0, s4 = 0;
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < n; ++i) {
        const int32_t z = normal_fixed(seed, uint64_t(i));
        lo = std::min(lo, z);
        hi = std::max(hi, z);
        const double x = double(z) / 65536.0;
        s += x;
        s2 += x * x;
        s4 += x * x * x * x;
    }
    EXPECT_NEAR(s / n, 0.0, 6.0 / std::sqrt(double(n)));
    EXPECT_NEAR(s2 / n, 1.0, 6.0 * std::sqrt(2.0 / n));
    EXPECT_NEAR(s4 / n, 2.9, 0.05);  // kurtosis of Irwin–Hall(12): 3 - 1.2/12
    EXPECT_GE(lo, -6 * 65535);
    EXPECT_LE(hi, 6 * 65535);
    // Different names give unrelated streams.
    EXPECT_NE(stream_seed(1, "a.weight"), stream_seed(1, "b.weight"));
    EXPECT_NE(stream_seed(1, "a.weight"), stream_seed(2, "a.weight"));
}

TEST(GeneratorVocab, BaseMatchesFixtureJson) {
    std::ifstream f(kData + "vocab.json");
    const auto j = nlohmann::json::parse(f);
    const Vocab v = make_vocab(768);
    ASSERT_EQ(v.tokens.size(), j["tokens"].size());
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        EXPECT_EQ(v.tokens[i], j["tokens"][i].get<std::string>()) << i;
        EXPECT_EQ(v.types[i], j["token_types"][i].get<int>()) << i;
    }
    ASSERT_EQ(v.merges.size(), j["merges"].size());
    for (size_t i = 0; i < v.merges.size(); ++i)
        EXPECT_EQ(v.merges[i], j["merges"][i].get<std::string>());
    EXPECT_EQ(v.bos, j["special_ids"]["[gMASK]"].get<int>());
    EXPECT_EQ(v.eos, j["special_ids"]["<|endoftext|>"].get<int>());
    EXPECT_EQ(v.eot, j["special_ids"]["<|user|>"].get<int>());
    EXPECT_EQ(v.eom, j["special_ids"]["<|observation|>"].get<int>());
    EXPECT_THROW(make_vocab(767), glm5::Error);
}

TEST(GeneratorVocab, PaddingKeepsBaseAndAddsUnreachableNormalTokens) {
    const Vocab base = make_vocab(768);
    const Vocab v = make_vocab(40000);
    ASSERT_EQ(v.tokens.size(), 40000u);
    ASSERT_EQ(v.types.size(), 40000u);
    EXPECT_EQ(v.merges, base.merges);
    std::set<std::string> seen;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        EXPECT_TRUE(seen.insert(v.tokens[i]).second) << "duplicate token " << v.tokens[i];
        if (i < 768) {
            EXPECT_EQ(v.tokens[i], base.tokens[i]);
            EXPECT_EQ(v.types[i], base.types[i]);
            continue;
        }
        EXPECT_EQ(v.types[i], kTokenNormal);
        // Spelled in byte-level characters only: "Ġ" then ASCII letters.
        ASSERT_GE(v.tokens[i].size(), 3u);
        EXPECT_EQ(v.tokens[i].substr(0, 2), "\xc4\xa0");
        for (size_t k = 2; k < v.tokens[i].size(); ++k)
            EXPECT_TRUE(std::islower((unsigned char)v.tokens[i][k]));
    }
    // Every merge result is a base token, so no merge can produce a filler.
    std::set<std::string> base_set(base.tokens.begin(), base.tokens.end());
    for (const auto& m : v.merges) {
        const auto sp = m.find(' ');
        ASSERT_NE(sp, std::string::npos);
        EXPECT_TRUE(base_set.count(m.substr(0, sp) + m.substr(sp + 1))) << m;
    }
}

TEST(GeneratorPlan, PresetsValidateAndRefuseBadShapes) {
    for (const auto& p : GlmDsaHParams::preset_names())
        EXPECT_NO_THROW(GlmDsaHParams::preset(p).validate());
    EXPECT_THROW(GlmDsaHParams::preset("huge"), glm5::Error);
    auto bad = [](auto edit) {
        GlmDsaHParams h = GlmDsaHParams::preset("tiny");
        edit(h);
        EXPECT_THROW(h.validate(), glm5::Error);
    };
    bad([](GlmDsaHParams& h) { h.idx_head = 96; });  // not a power of two
    bad([](GlmDsaHParams& h) { h.idx_head = 32; });  // below 64
    bad([](GlmDsaHParams& h) { h.qk_rope = 128; });  // rope beyond the indexer key
    bad([](GlmDsaHParams& h) { h.indexer_full = {false, true, false, true, false, false}; });
    bad([](GlmDsaHParams& h) { h.indexer_full = {true, true}; });  // wrong length
    bad([](GlmDsaHParams& h) { h.n_expert_used = 17; });
    bad([](GlmDsaHParams& h) { h.n_dense = 7; });
    bad([](GlmDsaHParams& h) { h.n_vocab = 100; });
    EXPECT_FALSE(parse_scheme("Q9_K").has_value());
}

TEST(GeneratorPlan, TinyMatchesFixtureTensorsAndShapes) {
    const auto fx = glm5::gguf::File::open(kData + "tiny.gguf");
    const ModelPlan p = plan(preset_options("tiny", "F32"));
    ASSERT_EQ(p.tensors.size(), fx->tensors().size());
    for (size_t i = 0; i < p.tensors.size(); ++i) {
        const auto& ft = fx->tensors()[i];
        EXPECT_EQ(p.tensors[i].name, ft.name) << "tensor order differs at " << i;
        const auto* t = fx->find_tensor(p.tensors[i].name);
        ASSERT_NE(t, nullptr) << p.tensors[i].name;
        ASSERT_EQ(int(p.tensors[i].ne.size()), t->n_dims) << t->name;
        for (int d = 0; d < t->n_dims; ++d)
            EXPECT_EQ(p.tensors[i].ne[size_t(d)], t->ne[size_t(d)]) << t->name;
        EXPECT_EQ(p.tensors[i].type, Type::F32);
    }
}

// llama-quantize made these files from small.gguf; our rules must agree
// tensor by tensor (the IQ2_XXS file kept its NextN block at Q4_K).
TEST(GeneratorPlan, MixTypesMatchLlamaQuantizeFixtures) {
    const std::pair<const char*, const char*> cases[] = {
        {"small.gguf", "F16"},           {"small-q8_0.gguf", "Q8_0"},
        {"small-q4_k_m.gguf", "Q4_K_M"}, {"small-q2_k.gguf", "Q2_K"},
        {"small-iq4_xs.gguf", "IQ4_XS"}, {"small-iq2_xxs.gguf", "IQ2_XXS"},
    };
    for (const auto& [file, type] : cases) {
        SCOPED_TRACE(file);
        const auto fx = glm5::gguf::File::open(kData + file);
        const ModelPlan p = plan(preset_options("small", type));
        ASSERT_EQ(p.tensors.size(), fx->tensors().size());
        for (const auto& t : p.tensors) {
            const auto* ft = fx->find_tensor(t.name);
            ASSERT_NE(ft, nullptr) << t.name;
            EXPECT_EQ(glm5::quant::name(t.type), std::string(glm5::quant::name(ft->type)))
                << t.name;
        }
        EXPECT_EQ(p.file_type, fx->get_uint("general.file_type"));
    }
}

TEST(GeneratorPlan, QuantRulesOnTheBenchShape) {
    // Q4_K_M: attn_k_b rows of qk_nope=192 cannot hold a 256-block -> Q5_0;
    // routed/shared down projections get Q6_K on llama.cpp's "more bits"
    // layers (first and last eighth of the 17 blocks, every third between).
    const ModelPlan p = plan(preset_options("bench", "Q4_K_M"));
    std::map<std::string, Type> ty;
    for (const auto& t : p.tensors) ty[t.name] = t.type;
    EXPECT_EQ(ty["blk.0.attn_k_b.weight"], Type::Q5_0);
    EXPECT_EQ(ty["blk.5.attn_q_b.weight"], Type::Q4_K);
    EXPECT_EQ(ty["output.weight"], Type::Q6_K);
    EXPECT_EQ(ty["token_embd.weight"], Type::Q4_K);
    EXPECT_EQ(ty["blk.5.ffn_norm.weight"], Type::F32);
    EXPECT_EQ(ty["blk.5.ffn_gate_inp.weight"], Type::F32);
    EXPECT_EQ(ty["blk.5.exp_probs_b.bias"], Type::F32);
    EXPECT_EQ(ty["blk.0.indexer.k_norm.weight"], Type::F32);
    EXPECT_EQ(ty["blk.0.indexer.k_norm.bias"], Type::F32);
    const int n = 17;
    for (int il = 0; il < n; ++il) {
        const bool more = il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
        const std::string down = il < 3 ? ".ffn_down.weight" : ".ffn_down_exps.weight";
        EXPECT_EQ(ty["blk." + std::to_string(il) + down], more ? Type::Q6_K : Type::Q4_K) << il;
    }
    EXPECT_FALSE(p.imatrix);
    // 2–4 GB, as the bench preset promises.
    EXPECT_GT(p.tensor_bytes, 2ull << 30);
    EXPECT_LT(p.tensor_bytes, 4ull << 30);

    // IQ2_XXS: the first n/8 = 2 ffn_down tensors in loader order go to Q2_K,
    // the embedding to Q2_K, the LM head to Q5_K, the NextN block to Q4_K.
    const ModelPlan q = plan(preset_options("bench", "IQ2_XXS"));
    std::map<std::string, const TensorPlan*> tq;
    for (const auto& t : q.tensors) tq[t.name] = &t;
    EXPECT_TRUE(q.imatrix);
    EXPECT_EQ(tq["blk.0.ffn_down.weight"]->type, Type::Q2_K);
    EXPECT_EQ(tq["blk.1.ffn_down.weight"]->type, Type::Q2_K);
    EXPECT_EQ(tq["blk.2.ffn_down.weight"]->type, Type::IQ2_XXS);
    EXPECT_EQ(tq["token_embd.weight"]->type, Type::Q2_K);
    EXPECT_EQ(tq["output.weight"]->type, Type::Q5_K);
    EXPECT_EQ(tq["blk.0.attn_k_b.weight"]->type, Type::IQ4_NL);
    EXPECT_EQ(tq["blk.16.ffn_up_exps.weight"]->type, Type::Q4_K);
    EXPECT_EQ(tq["blk.16.attn_k_b.weight"]->type, Type::Q5_0);
    EXPECT_TRUE(tq["blk.3.ffn_up_exps.weight"]->uses_imatrix);
    EXPECT_FALSE(tq["token_embd.weight"]->uses_imatrix);
}

TEST(GeneratorPlan, PureAndSingleTypes) {
    auto o = preset_options("small", "Q4_K");
    const ModelPlan p = plan(o);  // Q4_K is a single type, not llama-quantize's Q4_K_M alias
    for (const auto& t : p.tensors) {
        if (!is_quantizable(t.name, t.ne))
            EXPECT_EQ(t.type, Type::F32) << t.name;
        else if (t.ne[0] % 256 != 0)
            EXPECT_EQ(t.type, Type::Q5_0) << t.name;
        else
            EXPECT_EQ(t.type, Type::Q4_K) << t.name;
    }
    EXPECT_EQ(p.file_type, uint32_t(FileType::MOSTLY_Q4_K_S));
    o.type = "Q2_K";
    o.pure = true;
    for (const auto& t : plan(o).tensors) {
        if (is_quantizable(t.name, t.ne)) {
            EXPECT_EQ(t.type, t.ne[0] % 256 ? Type::Q4_0 : Type::Q2_K) << t.name;
        }
    }
    o.type = "IQ2_XXS";
    o.imatrix = ImatrixMode::Off;
    o.pure = false;
    EXPECT_THROW(plan(o), glm5::Error);  // llama-quantize refuses it too
}

TEST(GeneratorImatrix, DerivedFromNormWeights) {
    const GenOptions o = preset_options("tiny", "IQ2_XXS");
    auto norm = [&](const std::string& name, int64_t n) {
        std::vector<float> w(static_cast<size_t>(n));
        sample_rows(o, name, 0, 1, w.data());
        return w;
    };
    const auto attn_norm = norm("blk.1.attn_norm.weight", 64);
    const auto q_a = importance_vector(o, "blk.1.attn_q_a.weight");
    ASSERT_EQ(q_a.size(), 64u);
    for (size_t j = 0; j < 64; ++j) EXPECT_EQ(q_a[j], attn_norm[j] * attn_norm[j]);
    const auto q_norm = norm("blk.1.attn_q_a_norm.weight", 32);
    const auto q_b = importance_vector(o, "blk.1.indexer.attn_q_b.weight");
    for (size_t j = 0; j < 32; ++j) EXPECT_EQ(q_b[j], q_norm[j] * q_norm[j]);
    const auto en = norm("blk.6.nextn.enorm.weight", 64), hn = norm("blk.6.nextn.hnorm.weight", 64);
    const auto eh = importance_vector(o, "blk.6.nextn.eh_proj.weight");
    ASSERT_EQ(eh.size(), 128u);
    for (size_t j = 0; j < 64; ++j) {
        EXPECT_EQ(eh[j], en[j] * en[j]);
        EXPECT_EQ(eh[64 + j], hn[j] * hn[j]);
    }
    for (float x : importance_vector(o, "blk.3.ffn_down_exps.weight")) EXPECT_EQ(x, 1.0f);
    EXPECT_THROW(importance_vector(o, "token_embd.weight"), glm5::Error);
}

TEST(GeneratorWrite, TinyIsDeterministicAndCarriesTheFixtureMetadata) {
    TempDir dir;
    GenOptions o = preset_options("tiny", "F32");
    o.n_threads = 1;
    generate(o, dir.file("a.gguf"));
    o.n_threads = 2;
    const GenResult r = generate(o, dir.file("b.gguf"));
    const auto a = read_bytes(dir.file("a.gguf"));
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == read_bytes(dir.file("b.gguf"))) << "thread count changed the bytes";
    EXPECT_EQ(r.file_bytes, a.size());
    o.seed += 1;
    generate(o, dir.file("c.gguf"));
    EXPECT_FALSE(a == read_bytes(dir.file("c.gguf"))) << "the seed changed nothing";

    const auto fx = glm5::gguf::File::open(kData + "tiny.gguf");
    const auto g = glm5::gguf::File::open(dir.file("a.gguf"));
    std::map<std::string, std::string> want, got;
    for (const auto& [k, v] : fx->metadata()) want[k] = value_signature(v);
    for (const auto& [k, v] : g->metadata()) got[k] = value_signature(v);
    EXPECT_EQ(got, want);
    // Same key order, and the same values apart from the name and the chat
    // template (generated models carry the GLM-5 layout the engine renders).
    ASSERT_EQ(g->metadata().size(), fx->metadata().size());
    for (size_t i = 0; i < fx->metadata().size(); ++i) {
        const auto& [k, v] = fx->metadata()[i];
        EXPECT_EQ(g->metadata()[i].first, k);
        if (k == "general.name" || k == "tokenizer.chat_template") continue;
        EXPECT_TRUE(same_value(g->metadata()[i].second, v))
            << k << ": " << g->metadata()[i].second.to_display() << " vs " << v.to_display();
    }
    const std::string tmpl = g->get_string("tokenizer.chat_template");
    EXPECT_EQ(glm5::text::check_chat_template(tmpl), "")
        << "generated template differs from the renderer";
    // Tensors: names, shapes, types as the fixture.
    ASSERT_EQ(g->tensors().size(), fx->tensors().size());
    for (const auto& t : fx->tensors()) {
        const auto* m = g->find_tensor(t.name);
        ASSERT_NE(m, nullptr) << t.name;
        EXPECT_EQ(m->ne, t.ne) << t.name;
        EXPECT_EQ(m->type, t.type) << t.name;
    }
}

TEST(GeneratorWrite, WeightStatistics) {
    TempDir dir;
    GenOptions o = preset_options("tiny", "F32");
    generate(o, dir.file("t.gguf"));
    const auto g = glm5::gguf::File::open(dir.file("t.gguf"));
    const ModelPlan p = plan(o);
    for (const auto& tp : p.tensors) {
        SCOPED_TRACE(tp.name);
        const auto* t = g->find_tensor(tp.name);
        ASSERT_NE(t, nullptr);
        const auto v = dequantize(*t);
        const Moments m = moments(v);
        // std = gain/sqrt(fan_in) for matrices, 0.05 around 1 for norms.
        EXPECT_NEAR(m.sd / tp.stddev, 1.0, sd_tolerance(v.size()));
        EXPECT_NEAR(m.mean, tp.mean, 6.0 * tp.stddev / std::sqrt(double(v.size())));
        // And the bytes are exactly the library's samples.
        std::vector<float> s(v.size());
        sample_rows(o, tp.name, 0, t->nrows(), s.data());
        EXPECT_TRUE(s == v);
    }
    // Spot-check the stated scales (fixture gains) independently of the plan.
    auto sd_of = [&](const std::string& n) { return moments(dequantize(*g->find_tensor(n))).sd; };
    EXPECT_NEAR(sd_of("blk.2.attn_q_a.weight") * std::sqrt(64.0), 1.0, sd_tolerance(64 * 32));
    EXPECT_NEAR(sd_of("blk.2.ffn_down_exps.weight") * std::sqrt(32.0), 0.5,
                0.5 * sd_tolerance(32 * 64 * 16));
    EXPECT_NEAR(sd_of("output.weight") * std::sqrt(64.0), 2.5, 2.5 * sd_tolerance(64 * 768));
    EXPECT_NEAR(sd_of("token_embd.weight"), 1.0, sd_tolerance(64 * 768));
}

TEST(GeneratorWrite, QuantizedSmallFollowsTheMixAndKeepsTheScale) {
    TempDir dir;
    GenOptions o = preset_options("small", "Q4_K_M");
    o.n_threads = 2;
    generate(o, dir.file("q.gguf"));
    o.n_threads = 1;
    generate(o, dir.file("q1.gguf"));
    EXPECT_TRUE(read_bytes(dir.file("q.gguf")) == read_bytes(dir.file("q1.gguf")));

    const auto g = glm5::gguf::File::open(dir.file("q.gguf"));
    const auto fx = glm5::gguf::File::open(kData + "small-q4_k_m.gguf");
    std::map<std::string, int> counts, want;
    for (const auto& t : g->tensors()) ++counts[glm5::quant::name(t.type)];
    for (const auto& t : fx->tensors()) ++want[glm5::quant::name(t.type)];
    EXPECT_EQ(counts, want);  // 45 Q4_K, 5 Q6_K, 4 Q5_0, 30 F32
    EXPECT_EQ(g->get_uint("general.file_type"), 15u);

    // Dequantized weights are the samples plus quantization noise: their
    // relative RMS error is bounded per format, and the std stays within the
    // sampling tolerance plus the variance the noise adds.
    const std::pair<const char*, double> checks[] = {
        {"blk.0.attn_q_b.weight", 0.15},       // Q4_K
        {"blk.2.ffn_down_exps.weight", 0.05},  // Q6_K
        {"blk.1.attn_k_b.weight", 0.10},       // Q5_0 (fallback)
        {"output.weight", 0.05},               // Q6_K
    };
    const ModelPlan p = plan(o);
    for (const auto& [name, max_rel] : checks) {
        SCOPED_TRACE(name);
        const auto* t = g->find_tensor(name);
        ASSERT_NE(t, nullptr);
        const auto v = dequantize(*t);
        std::vector<float> s(v.size());
        sample_rows(o, name, 0, t->nrows(), s.data());
        double e2 = 0, s2 = 0;
        for (size_t i = 0; i < v.size(); ++i) {
            e2 += double(v[i] - s[i]) * double(v[i] - s[i]);
            s2 += double(s[i]) * double(s[i]);
        }
        const double rel = std::sqrt(e2 / s2);
        EXPECT_LT(rel, max_rel);
        EXPECT_GT(rel, 0.0);  // really quantized
        double want_sd = 0;
        for (const auto& tp : p.tensors)
            if (tp.name == name) want_sd = tp.stddev;
        EXPECT_NEAR(moments(v).sd / want_sd, 1.0, sd_tolerance(v.size()) + max_rel * max_rel);
    }
}

TEST(GeneratorWrite, IQuantsExactAndPooled) {
    TempDir dir;
    for (BlockSource mode : {BlockSource::Exact, BlockSource::Pool}) {
        const bool pooled = mode == BlockSource::Pool;
        SCOPED_TRACE(pooled ? "pooled blocks" : "exact");
        GenOptions o = preset_options("small", "IQ2_XXS");
        o.blocks = mode;
        const std::string path = dir.file(pooled ? "p.gguf" : "e.gguf");
        const GenResult res = generate(o, path);
        const auto g = glm5::gguf::File::open(path);
        const auto fx = glm5::gguf::File::open(kData + "small-iq2_xxs.gguf");
        for (const auto& t : fx->tensors())
            EXPECT_EQ(g->find_tensor(t.name)->type, t.type) << t.name;
        EXPECT_TRUE(g->find("quantize.imatrix.entries_count") != nullptr);
        for (const auto& tp : res.plan.tensors) {
            const bool q = glm5::quant::traits(tp.type).quantized;
            EXPECT_EQ(tp.pooled, pooled && q) << tp.name;
            EXPECT_EQ(tp.uses_imatrix, !pooled && q && tp.name != "token_embd.weight") << tp.name;
            if (tp.type != Type::IQ2_XXS && tp.type != Type::Q4_K) continue;
            const auto v = dequantize(*g->find_tensor(tp.name));
            // 2-bit lattice codes cannot follow the samples closely, but the
            // scale must survive: within 15% for IQ2_XXS, 2% for Q4_K.
            const double tol = tp.type == Type::IQ2_XXS ? 0.15 : 0.02;
            EXPECT_NEAR(moments(v).sd / tp.stddev, 1.0, tol + sd_tolerance(v.size())) << tp.name;
            EXPECT_NEAR(moments(v).mean, 0.0, 6.0 * tp.stddev / std::sqrt(double(v.size())))
                << tp.name;
        }
    }
}

TEST(GeneratorWrite, PooledBlocksAreDeterministic) {
    TempDir dir;
    GenOptions o = preset_options("small", "Q4_K_M");
    o.blocks = BlockSource::Pool;
    o.n_threads = 1;
    generate(o, dir.file("p1.gguf"));
    o.n_threads = 2;
    generate(o, dir.file("p2.gguf"));
    const auto a = read_bytes(dir.file("p1.gguf"));
    EXPECT_TRUE(a == read_bytes(dir.file("p2.gguf"))) << "thread count changed the bytes";
    o.blocks = BlockSource::Exact;
    generate(o, dir.file("e.gguf"));
    const auto e = read_bytes(dir.file("e.gguf"));
    EXPECT_EQ(a.size(), e.size());  // same layout and types, other blocks
    EXPECT_FALSE(a == e);
}

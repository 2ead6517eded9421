// The file quantizer (src/quantize/): llama-quantize's bytes on the glm-dsa fixtures it
// made, importance matrices in both of llama.cpp's file forms, the dynamic preset's
// rule, refusals with their reasons, streaming pieces.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quantize/imatrix.h"
#include "quantize/quantize_file.h"

using namespace glm5;
using namespace glm5::quantize;
namespace fs = std::filesystem;

namespace {

std::string data(const std::string& rel) {
    return std::string(GLM5_TEST_DATA) + "/" + rel;
}

fs::path tmp_dir() {
    fs::path d = fs::temp_directory_path() /
                 ("glm5-quantize-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(d);
    return d;
}

std::vector<std::string> quantize_file(const std::string& in, const std::string& out,
                                       QuantizeOptions o) {
    const auto f = gguf::File::open(in);
    const QuantizePlan p = plan_quantize(*f, o);
    return write_quantized(*f, p, o, out, nullptr);
}

// Every tensor of `a` in `b` with the same type and bytes; the count of tensors compared.
size_t expect_same_tensors(const std::string& a, const std::string& b) {
    const auto fa = gguf::File::open(a), fb = gguf::File::open(b);
    EXPECT_EQ(fa->tensors().size(), fb->tensors().size());
    size_t same = 0;
    for (const gguf::TensorInfo& t : fb->tensors()) {
        const gguf::TensorInfo* u = fa->find_tensor(t.name);
        if (!u) {
            ADD_FAILURE() << t.name << " missing";
            continue;
        }
        EXPECT_EQ(quant::name(u->type), std::string(quant::name(t.type))) << t.name;
        if (u->type != t.type || u->nbytes != t.nbytes) continue;
        if (std::memcmp(u->data, t.data, t.nbytes) == 0)
            ++same;
        else
            ADD_FAILURE() << t.name << ": bytes differ from llama-quantize's";
    }
    return same;
}

}  // namespace

// small.gguf is F16; llama-quantize made the fixtures from it. Our mixes give every tensor
// the same type, and our quantizers the same bytes.
TEST(QuantizeFile, MixesAreLlamaQuantizesBytes) {
    const fs::path d = tmp_dir();
    for (const char* mix : {"Q8_0", "Q4_K_M", "Q2_K", "IQ4_XS"}) {
        SCOPED_TRACE(mix);
        std::string lower = mix;
        for (char& c : lower) c = char(std::tolower((unsigned char)c));
        const std::string out = (d / (lower + ".gguf")).string();
        QuantizeOptions o;
        o.scheme = mix;
        o.n_threads = 2;
        quantize_file(data("glm-dsa/small.gguf"), out, o);
        const std::string ref = data("glm-dsa/small-" + lower + ".gguf");
        EXPECT_EQ(expect_same_tensors(out, ref), gguf::File::open(ref)->tensors().size());
        EXPECT_EQ(gguf::File::open(out)->get_uint("general.file_type"),
                  gguf::File::open(ref)->get_uint("general.file_type"));
    }
    fs::remove_all(d);
}

// The pieces a large tensor is written in do not change its bytes, nor the thread count.
TEST(QuantizeFile, PiecesAndThreadsDoNotChangeTheBytes) {
    const fs::path d = tmp_dir();
    QuantizeOptions o;
    o.scheme = "Q4_K_M";
    o.n_threads = 1;
    quantize_file(data("glm-dsa/small.gguf"), (d / "one.gguf").string(), o);
    o.n_threads = 3;
    o.piece_bytes = 4096;     // many pieces a tensor, each one row at least
    o.split.max_tensors = 7;  // several shards, read back as one model
    const auto paths = quantize_file(data("glm-dsa/small.gguf"), (d / "split").string(), o);
    EXPECT_GT(paths.size(), size_t(1));
    EXPECT_EQ(expect_same_tensors(paths.front(), (d / "one.gguf").string()),
              gguf::File::open((d / "one.gguf").string())->tensors().size());
    fs::remove_all(d);
}

TEST(QuantizeFile, RefusesWhatItCannotDoWell) {
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    QuantizeOptions o;
    o.scheme = "IQ2_XXS";
    try {
        plan_quantize(*f, o);
        FAIL() << "IQ2_XXS without an importance matrix was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs an importance matrix"), std::string::npos)
            << e.what();
    }
    const auto q = gguf::File::open(data("glm-dsa/small-q8_0.gguf"));
    o.scheme = "Q4_K_M";
    try {
        plan_quantize(*q, o);
        FAIL() << "requantizing was accepted without --allow-requantize";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--allow-requantize"), std::string::npos) << e.what();
    }
    o.allow_requantize = true;
    EXPECT_NO_THROW(plan_quantize(*q, o));
    o.scheme = "Q9_K";
    EXPECT_THROW(plan_quantize(*f, o), Error);
}

// --tensor-type: the first matching pattern wins, and only where the mix quantizes;
// the output and embedding types apply before the mix.
TEST(QuantizeFile, UserTypesComeFirst) {
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    QuantizeOptions o;
    o.scheme = "Q4_K_M";
    o.tensor_types.push_back(parse_type_override("ffn_down_exps=q8_0"));
    o.tensor_types.push_back(parse_type_override("ffn_.*_exps=Q5_K"));
    o.output_type = quant::Type::Q8_0;
    o.embedding_type = quant::Type::Q4_K;
    const QuantizePlan p = plan_quantize(*f, o);
    int n_down = 0, n_exps = 0;
    for (const TensorPlan& t : p.tensors) {
        const std::string& n = t.in->name;
        if (n.find("ffn_down_exps") != std::string::npos) {
            EXPECT_EQ(t.type, quant::Type::Q8_0) << n;
            ++n_down;
        } else if (n.find("_exps.") != std::string::npos) {
            EXPECT_EQ(t.type, quant::Type::Q5_K) << n;
            ++n_exps;
        }
        if (n == "output.weight") {
            EXPECT_EQ(t.type, quant::Type::Q8_0);
        }
        if (n == "token_embd.weight") {
            EXPECT_EQ(t.type, quant::Type::Q4_K);
        }
        if (n.find("_norm.") != std::string::npos) {
            EXPECT_EQ(t.type, quant::Type::F32) << n;
        }
    }
    EXPECT_EQ(n_down, 2);
    EXPECT_EQ(n_exps, 4);
    EXPECT_THROW(parse_type_override("no-equals"), Error);
    EXPECT_THROW(parse_type_override("x=Q9_K"), Error);
    EXPECT_THROW(parse_type_override("(=q4_k"), Error);
}

// DYN-<type>: routed experts low (down one step up), everything else high.
TEST(QuantizeFile, DynamicPresetKeepsAllButTheExpertsHigh) {
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    QuantizeOptions o;
    o.scheme = "DYN-Q2_K";
    const QuantizePlan p = plan_quantize(*f, o);
    EXPECT_TRUE(p.scheme.dynamic);
    for (const TensorPlan& t : p.tensors) {
        const std::string& n = t.in->name;
        const bool nextn = n.rfind("blk.3.", 0) == 0;  // small.gguf: 3 trunk blocks + NextN
        quant::Type want = t.in->type;
        if (!is_quantizable(n, {t.in->ne[0], t.in->ne[1], t.in->ne[2]})) {
        } else if (n == "token_embd.weight" || n == "output.weight") {
            want = quant::Type::Q6_K;
        } else if (n.find("ffn_down_exps") != std::string::npos) {
            want = nextn ? quant::Type::Q4_K : quant::Type::Q3_K;
        } else if (n.find("_exps.") != std::string::npos) {
            want = nextn ? quant::Type::Q4_K : quant::Type::Q2_K;
        } else if (!nextn && (n.find("_shexp.") != std::string::npos ||
                              n.find("ffn_gate.") != std::string::npos ||
                              n.find("ffn_up.") != std::string::npos ||
                              n.find("ffn_down.") != std::string::npos)) {
            want = quant::Type::Q6_K;
        } else {
            want = quant::Type::Q8_0;
        }
        if (quant::traits(want).quantized) want = block_fallback(want, t.in->ne[0]);
        EXPECT_EQ(quant::name(t.type), std::string(quant::name(want))) << n;
    }
}

namespace {

// An importance matrix over small.gguf's matrices with random positive statistics.
Imatrix random_imatrix(const gguf::File& f, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.01, 4.0);
    Imatrix m;
    m.datasets = {"calibration.txt"};
    m.chunk_count = 3;
    m.chunk_size = 512;
    for (const gguf::TensorInfo& t : f.tensors()) {
        if (t.name.rfind("blk.", 0) != 0 || !is_quantizable(t.name, {t.ne[0], t.ne[1], t.ne[2]}))
            continue;
        ImatrixEntry e;
        e.cols = t.ne[0];
        const bool experts = t.name.find("_exps.") != std::string::npos;
        for (int64_t i = 0; i < t.ne[0] * t.ne[2]; ++i) e.sums.push_back(u(rng) * 1536);
        if (experts)
            for (int64_t s = 0; s < t.ne[2]; ++s) e.counts.push_back(int64_t(s == 1 ? 0 : 300 + s));
        else
            e.counts = {1536};
        m.entries[t.name] = std::move(e);
    }
    return m;
}

}  // namespace

// Both file forms carry the weights quantization uses, and the GGUF form merges (a resumed
// collection adds its sums and counts).
TEST(Imatrix, GgufAndLegacyFilesGiveTheSameWeights) {
    const fs::path d = tmp_dir();
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    const Imatrix m = random_imatrix(*f, 7);
    m.write_gguf((d / "m.gguf").string());
    m.write_legacy((d / "m.dat").string());
    const Imatrix g = Imatrix::read((d / "m.gguf").string());
    const Imatrix l = Imatrix::read((d / "m.dat").string());
    EXPECT_FALSE(g.legacy);
    EXPECT_TRUE(l.legacy);
    EXPECT_EQ(g.datasets, m.datasets);
    EXPECT_EQ(l.datasets, m.datasets);
    EXPECT_EQ(g.chunk_count, 3u);
    EXPECT_EQ(l.chunk_count, 3u);
    ASSERT_EQ(g.entries.size(), m.entries.size());
    for (const auto& [name, e] : m.entries) {
        const auto wm = *m.weights(name), wg = *g.weights(name), wl = *l.weights(name);
        ASSERT_EQ(wg.size(), wm.size());
        ASSERT_EQ(wl.size(), wm.size());
        for (size_t i = 0; i < wm.size(); ++i) {
            EXPECT_FLOAT_EQ(wg[i], wm[i]) << name << " " << i;
            EXPECT_NEAR(wl[i], wm[i], 1e-5 * wm[i]) << name << " " << i;
        }
        // An expert no row reached weighs 1.
        if (e.counts.size() > 1) {
            EXPECT_EQ(wm[size_t(e.cols)], 1.0f) << name;
        }
    }
    Imatrix twice = g;
    twice.merge(g);
    EXPECT_EQ(twice.chunk_count, 6u);
    const std::string any = m.entries.begin()->first;
    EXPECT_EQ(twice.entries[any].counts[0], 2 * g.entries.at(any).counts[0]);
    EXPECT_FLOAT_EQ((*twice.weights(any))[0], (*g.weights(any))[0]);
    EXPECT_THROW(twice.merge(l), Error);
    fs::remove_all(d);
}

TEST(Imatrix, RefusesFilesItCannotRead) {
    const fs::path d = tmp_dir();
    std::ofstream((d / "junk.dat").string()) << "this is not an importance matrix";
    EXPECT_THROW(Imatrix::read((d / "junk.dat").string()), Error);
    EXPECT_THROW(Imatrix::read((d / "missing.dat").string()), Error);
    // A model is a GGUF but no importance matrix.
    try {
        Imatrix::read(data("glm-dsa/tiny.gguf"));
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("in_sum2"), std::string::npos) << e.what();
    }
    fs::remove_all(d);
}

// With an importance matrix, IQ2_XXS and Q2_K are quantized with it (and a size mismatch is
// refused); the NextN block, which no collection reaches, falls back to Q4_K.
TEST(QuantizeFile, ImatrixSteersTheLowBitTypes) {
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    Imatrix m = random_imatrix(*f, 11);
    for (auto it = m.entries.begin(); it != m.entries.end();)
        it = it->first.rfind("blk.3.", 0) == 0 ? m.entries.erase(it) : std::next(it);
    QuantizeOptions o;
    o.scheme = "IQ2_XXS";
    o.imatrix = &m;
    const QuantizePlan p = plan_quantize(*f, o);
    int with = 0, nextn = 0;
    for (const TensorPlan& t : p.tensors) {
        if (t.imatrix) ++with;
        if (t.in->name.rfind("blk.3.", 0) == 0 && is_quantizable(t.in->name, {t.in->ne[0], 2})) {
            EXPECT_FALSE(t.imatrix);
            if (t.type == quant::Type::Q4_K) {
                ++nextn;
                EXPECT_FALSE(t.note.empty());
            }
        }
    }
    EXPECT_GT(with, 20);
    EXPECT_GT(nextn, 5);
    m.entries.begin()->second.sums.pop_back();
    EXPECT_THROW(plan_quantize(*f, o), Error);
}

// The file quantizer (src/quantize/): llama-quantize's bytes on the glm-dsa fixtures it
// made, importance matrices in both of llama.cpp's file forms, the dynamic preset's
// rule, refusals with their reasons, streaming pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/sha256.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quantize/imatrix.h"
#include "quantize/quantize_file.h"
#include "util_cli.h"
#include "util_model.h"

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

std::string file_sha256(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return to_hex(sha256({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
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
// the same type, our quantizers the same bytes, and the files are the same files.
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
        // And the whole file: metadata in llama-quantize's order, tensors in its order.
        EXPECT_EQ(file_sha256(out), file_sha256(ref));
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
    // A pattern does not reach what the rules never quantize: a vision tower's patch
    // convolution (4-D) stays as stored.
    const auto tower = gguf::File::open(data("glm5next/mmproj-tiny.gguf"));
    QuantizeOptions v;
    v.scheme = "Q8_0";
    v.tensor_types.push_back(parse_type_override("patch_embd=q8_0"));
    for (const TensorPlan& t : plan_quantize(*tower, v).tensors)
        if (t.in->name.find("patch_embd") != std::string::npos) {
            EXPECT_EQ(t.type, t.in->type) << t.in->name;
        }
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

namespace {

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
}

// The weights of every entry of `a` against `b`'s: the relative L1 distance, the largest.
double imatrix_distance(const Imatrix& a, const Imatrix& b) {
    double worst = 0;
    EXPECT_EQ(a.entries.size(), b.entries.size());
    for (const auto& [name, e] : b.entries) {
        const auto wa = a.weights(name);
        if (!wa) {
            ADD_FAILURE() << name << " missing";
            continue;
        }
        const auto wb = *b.weights(name);
        EXPECT_EQ(wa->size(), wb.size()) << name;
        double num = 0, den = 0;
        for (size_t i = 0; i < std::min(wa->size(), wb.size()); ++i)
            num += std::fabs((*wa)[i] - wb[i]), den += std::fabs(wb[i]);
        worst = std::max(worst, num / std::max(den, 1e-30));
    }
    return worst;
}

}  // namespace

// llama-quantize's files made with llama-imatrix's matrix: ours from the same matrix are the
// same bytes (goldens: tensor hashes, since CI has no llama.cpp).
TEST(QuantizeFile, WithLlamaImatrixGivesLlamaQuantizesBytes) {
    const nlohmann::json g = read_json(data("glm-dsa/small-imatrix-quants.golden.json"));
    ASSERT_EQ(file_sha256(data("glm-dsa/small.gguf")), g["model_sha256"].get<std::string>());
    ASSERT_EQ(file_sha256(data("glm-dsa/small.imatrix.gguf")),
              g["imatrix_sha256"].get<std::string>());
    const Imatrix im = Imatrix::read(data("glm-dsa/small.imatrix.gguf"));
    const fs::path d = tmp_dir();
    for (const char* type : {"IQ2_XXS", "Q2_K"}) {
        SCOPED_TRACE(type);
        QuantizeOptions o;
        o.scheme = type;
        o.imatrix = &im;
        for (const auto& p : g[type]["tensor_types"])
            o.tensor_types.push_back(parse_type_override(p.get<std::string>()));
        const std::string out = (d / (std::string(type) + ".gguf")).string();
        quantize_file(data("glm-dsa/small.gguf"), out, o);
        const auto f = gguf::File::open(out);
        size_t same = 0;
        for (const auto& [name, want] : g[type]["tensors"].items()) {
            const gguf::TensorInfo* t = f->find_tensor(name);
            ASSERT_NE(t, nullptr) << name;
            EXPECT_EQ(quant::name(t->type), want[0].get<std::string>()) << name;
            if (to_hex(sha256({t->data, t->nbytes})) == want[1].get<std::string>())
                ++same;
            else
                ADD_FAILURE() << name << ": bytes differ from llama-quantize's";
        }
        EXPECT_EQ(same, f->tensors().size());
    }
    fs::remove_all(d);
}

// llama-imatrix's two forms of the same run give the same weights.
TEST(Imatrix, ReadsLlamaImatrixInBothForms) {
    const Imatrix g = Imatrix::read(data("glm-dsa/small.imatrix.gguf"));
    const Imatrix l = Imatrix::read(data("glm-dsa/small.imatrix.dat"));
    EXPECT_EQ(g.chunk_size, 128u);
    EXPECT_EQ(g.chunk_count, 26u);
    EXPECT_EQ(l.chunk_count, 26u);
    EXPECT_EQ(g.entries.size(), 37u);
    EXPECT_LT(imatrix_distance(l, g), 1e-6);
}

// The importance matrix lowers the importance-weighted error of the 2-bit types, against
// the F16 weights: on every blk matrix whose rows hold whole 256-value blocks.
TEST(Imatrix, LowersTheWeightedErrorOfTwoBitTypes) {
    const auto f = gguf::File::open(data("glm-dsa/small.gguf"));
    const Imatrix im = Imatrix::read(data("glm-dsa/small.imatrix.gguf"));
    for (quant::Type type : {quant::Type::IQ2_XXS, quant::Type::Q2_K}) {
        int better = 0, n = 0;
        double with_sum = 0, without_sum = 0;
        for (const gguf::TensorInfo& t : f->tensors()) {
            const auto w = im.weights(t.name);
            if (!w || t.ne[0] % 256 != 0 || t.type != quant::Type::F16) continue;
            const int64_t cols = t.ne[0], rows = t.ne[1] * t.ne[2];
            std::vector<float> x(size_t(cols * rows)), back(x.size());
            quant::dequantize_row(t.type, t.data, x.data(), cols * rows);
            std::vector<uint8_t> q(quant::row_size(type, cols) * size_t(rows));
            double err[2] = {0, 0};
            for (int use = 0; use < 2; ++use) {
                for (int64_t r = 0; r < rows; ++r) {
                    const float* iw = use ? w->data() + (r / t.ne[1]) * cols : nullptr;
                    quant::quantize_rows(type, x.data() + r * cols,
                                         q.data() + size_t(r) * quant::row_size(type, cols), 1,
                                         cols, iw);
                }
                quant::dequantize_row(type, q.data(), back.data(), cols * rows);
                for (int64_t i = 0; i < cols * rows; ++i) {
                    const double d = double(x[size_t(i)]) - double(back[size_t(i)]);
                    err[use] +=
                        double((*w)[size_t((i / cols / t.ne[1]) * cols + i % cols)]) * d * d;
                }
            }
            ++n;
            if (err[1] < err[0]) ++better;
            with_sum += err[1];
            without_sum += err[0];
        }
        SCOPED_TRACE(quant::name(type));
        EXPECT_GE(n, 30);
        EXPECT_EQ(better, n);
        // (On this random-weight model the inputs' scales vary little, so the gain is small:
        // 1.4% for IQ2_XXS, 19% for Q2_K.)
        EXPECT_LT(with_sum, without_sum);
    }
}

// glm5 imatrix over the text llama-imatrix read gives its matrix (the model's numerics
// differ a little, and a token near a routing tie may pick another expert); resumed
// after 10 chunks, the same as in one run.
TEST(ImatrixCli, MatchesLlamaImatrixAndResumes) {
    const fs::path d = tmp_dir();
    const std::string base = test::glm5_binary() + " imatrix -m " + data("glm-dsa/small.gguf") +
                             " -f " + data("text/genesis.txt") + " -c 128 --threads 2 -o ";
    const std::string whole = (d / "whole.gguf").string(), part = (d / "part.gguf").string();
    auto r = test::run_shell(base + whole);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("Final estimate: PPL = "), std::string::npos) << r.err;
    const Imatrix ours = Imatrix::read(whole);
    const Imatrix llama = Imatrix::read(data("glm-dsa/small.imatrix.gguf"));
    EXPECT_EQ(ours.chunk_count, llama.chunk_count);
    EXPECT_EQ(ours.chunk_size, llama.chunk_size);
    EXPECT_LT(imatrix_distance(ours, llama), 0.02);
    for (const auto& [name, e] : llama.entries)
        if (e.counts.size() == 1) {
            EXPECT_EQ(ours.entries.at(name).counts, e.counts) << name;
        }

    // --process-output: output.weight's inputs from every row, as the trunk's matrices.
    const std::string with_output = (d / "output.gguf").string();
    r = test::run_shell(base + with_output + " --chunks 4 --no-ppl --process-output");
    ASSERT_EQ(r.code, 0) << r.err;
    const Imatrix wo = Imatrix::read(with_output);
    ASSERT_NE(wo.find("output.weight"), nullptr);
    EXPECT_EQ(wo.find("output.weight")->counts, wo.find("blk.0.attn_q_a.weight")->counts);
    EXPECT_EQ(wo.find("output.weight")->counts, std::vector<int64_t>{4 * 128});
    EXPECT_EQ(ours.find("output.weight"), nullptr);

    r = test::run_shell(base + part + " --chunks 10 --no-ppl");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(Imatrix::read(part).chunk_count, 10u);
    r = test::run_shell(base + part + " --resume --no-ppl");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("resuming"), std::string::npos) << r.err;
    const Imatrix resumed = Imatrix::read(part);
    EXPECT_EQ(resumed.chunk_count, 26u);
    EXPECT_EQ(resumed.datasets.size(), 1u);
    EXPECT_LT(imatrix_distance(resumed, ours), 1e-6);

    // A resume from another text, and a GPU backend, are refused with the reason.
    r = test::run_shell(test::glm5_binary() + " imatrix -m " + data("glm-dsa/small.gguf") + " -f " +
                        data("glm-dsa/vocab.json") + " -c 128 --resume -o " + part);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("was not made from"), std::string::npos) << r.err;
    fs::remove_all(d);
}

namespace {

// Per row of logits [rows][V]: the RMS of the difference over the RMS spread of `a`'s row.
std::vector<double> relative_rms(const std::vector<float>& a, const std::vector<float>& b,
                                 int64_t V) {
    std::vector<double> r;
    for (size_t row = 0; row + size_t(V) <= a.size(); row += size_t(V)) {
        double mean = 0, var = 0, d2 = 0;
        for (int64_t i = 0; i < V; ++i) mean += a[row + size_t(i)];
        mean /= double(V);
        for (int64_t i = 0; i < V; ++i) {
            var += (a[row + size_t(i)] - mean) * (a[row + size_t(i)] - mean);
            d2 += (a[row + size_t(i)] - b[row + size_t(i)]) *
                  (a[row + size_t(i)] - b[row + size_t(i)]);
        }
        r.push_back(std::sqrt(d2 / var));
    }
    return r;
}

// A quantized matrix decodes to within its type's error of the F32 one (relative RMS).
double type_bound(quant::Type t) {
    switch (t) {
        case quant::Type::F16:
            return 1e-3;
        case quant::Type::Q8_0:
            return 0.01;
        case quant::Type::Q6_K:
            return 0.03;
        case quant::Type::Q5_0:
        case quant::Type::Q5_1:
        case quant::Type::Q5_K:
            return 0.06;
        case quant::Type::Q4_K:
            return 0.12;
        default:
            return 0.0;
    }
}

}  // namespace

// GLM-5.3-Flash's tiny fixture, F32 -> F16 and -> Q4_K_M. Its router sits within 1.4e-4 of
// a tie (the golden's diagnostics), so any rounding coarser than F16 flips experts and moves
// the logits by about their own spread (measured: BF16 0.05-0.25, Q8_0 0.1-0.7, Q4_K_M
// 0.8-1.1 of a row's spread); the round trip is therefore held to F16 end to end (measured
// 0.003), and at Q4_K_M to every matrix decoding within its type's error of the F32 one,
// the F32-only tensors kept, and the file loading and giving finite logits.
TEST(QuantizeFile, Glm5NextRoundTrips) {
    const fs::path d = tmp_dir();
    const std::string src = data("glm5next/tiny.gguf");
    const std::vector<int32_t> prompt = {322, 324, 327, 87, 104, 97, 116, 310, 32, 50, 328, 341};
    test::TestModel ref(src);
    const std::vector<float> want = ref.batch_logits(prompt);
    const int64_t V = ref.n_vocab();
    for (const char* type : {"F16", "Q4_K_M"}) {
        SCOPED_TRACE(type);
        QuantizeOptions o;
        o.scheme = type;
        const std::string out = (d / (std::string(type) + ".gguf")).string();
        quantize_file(src, out, o);
        const auto fi = gguf::File::open(src), fo = gguf::File::open(out);
        int checked = 0;
        for (const gguf::TensorInfo& t : fo->tensors()) {
            const gguf::TensorInfo& s = *fi->find_tensor(t.name);
            if (glm5next_keeps_f32(t.name)) {
                EXPECT_EQ(t.type, quant::Type::F32) << t.name;
            }
            if (t.type == s.type) continue;
            std::vector<float> a(size_t(s.nelements())), b(a.size());
            quant::dequantize_row(s.type, s.data, a.data(), s.nelements());
            quant::dequantize_row(t.type, t.data, b.data(), t.nelements());
            double e2 = 0, n2 = 0;
            for (size_t i = 0; i < a.size(); ++i)
                e2 += (a[i] - b[i]) * (a[i] - b[i]), n2 += a[i] * a[i];
            EXPECT_LE(std::sqrt(e2 / n2), type_bound(t.type))
                << t.name << " " << quant::name(t.type);
            ++checked;
        }
        EXPECT_GT(checked, 100);
        test::TestModel q(out);
        const std::vector<float> got = q.batch_logits(prompt);
        ASSERT_EQ(got.size(), want.size());
        for (float v : got) ASSERT_TRUE(std::isfinite(v));
        if (std::string(type) == "F16") {
            for (double r : relative_rms(want, got, V)) EXPECT_LT(r, 0.01);
        }
    }
    fs::remove_all(d);
}

namespace {

std::string glm5_cmd(const std::string& args) {
    return test::glm5_binary() + " " + args;
}

}  // namespace

// The command streams: a model several times the working memory it states is quantized
// within it (the peak the command reports: getrusage's maximum resident size).
TEST(QuantizeCli, StreamsInBoundedMemory) {
    const fs::path d = tmp_dir();
    const std::string in = (d / "f16.gguf").string(), out = (d / "q8.gguf").string();
    auto r =
        test::run_shell(glm5_cmd("make-model --preset small --n-expert 64 --n-ff-exp 512 "
                                 "--n-layer 6 --type F16 --quiet -o " +
                                 in));
    ASSERT_EQ(r.code, 0) << r.err;
    const uint64_t in_bytes = fs::file_size(in);
    EXPECT_GT(in_bytes, uint64_t(250) << 20);
    r = test::run_shell(glm5_cmd("quantize --threads 2 " + in + " " + out + " Q8_0"));
    ASSERT_EQ(r.code, 0) << r.err;
    const size_t at = r.err.find("peak memory ");
    ASSERT_NE(at, std::string::npos) << r.err;
    const double mib = std::stod(r.err.substr(at + 12));
    EXPECT_LT(mib, 128.0) << r.err;  // 32 MiB of output, 4 MiB a thread, the program
    EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, out + "\n");
    const auto f = gguf::File::open(out);
    EXPECT_EQ(f->get_uint("general.file_type"), 7u);
    fs::remove_all(d);
}

TEST(QuantizeCli, DryRunSplitsAndRefusals) {
    const fs::path d = tmp_dir();
    const std::string small = data("glm-dsa/small.gguf");
    auto r = test::run_shell(glm5_cmd("quantize --dry-run " + small + " x.gguf DYN-IQ2_XXS"));
    EXPECT_EQ(r.code, 2) << r.err;  // the experts need an importance matrix
    EXPECT_NE(r.err.find("needs an importance matrix"), std::string::npos) << r.err;
    r = test::run_shell(glm5_cmd("quantize --dry-run --imatrix " +
                                 data("glm-dsa/small.imatrix.gguf") + " " + small +
                                 " x.gguf DYN-IQ2_XXS"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("blk.2.ffn_up_exps.weight"), std::string::npos);
    EXPECT_NE(r.out.find("-> IQ2_XXS"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("# 84 tensors"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists("x.gguf"));

    const std::string split = (d / "split").string();
    r = test::run_shell(
        glm5_cmd("quantize --quiet --split-max-tensors 30 " + small + " " + split + " Q8_0"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, split + "-00001-of-00003.gguf\n" + split + "-00002-of-00003.gguf\n" + split +
                         "-00003-of-00003.gguf\n");
    const std::string kept = (d / "kept").string();
    r = test::run_shell(glm5_cmd("quantize --quiet --keep-split --allow-requantize " + split +
                                 "-00001-of-00003.gguf " + kept + " Q4_K_M"));
    ASSERT_EQ(r.code, 0) << r.err;
    for (int i = 1; i <= 3; ++i) {
        const auto a = gguf::File::open(split + "-0000" + std::to_string(i) + "-of-00003.gguf",
                                        {.load_splits = false});
        const auto b = gguf::File::open(kept + "-0000" + std::to_string(i) + "-of-00003.gguf",
                                        {.load_splits = false});
        ASSERT_EQ(a->tensors().size(), b->tensors().size()) << i;
        for (size_t t = 0; t < a->tensors().size(); ++t)
            EXPECT_EQ(a->tensors()[t].name, b->tensors()[t].name);
    }
    r = test::run_shell(glm5_cmd("quantize " + split + "-00001-of-00003.gguf x.gguf Q4_K_M"));
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--allow-requantize"), std::string::npos) << r.err;
    r = test::run_shell(glm5_cmd("quantize " + small + " x.gguf Q9_K"));
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("unknown type or mix"), std::string::npos) << r.err;
    r = test::run_shell(glm5_cmd("quantize " + data("glm-dsa/vocab.json") + " x.gguf Q8_0"));
    EXPECT_EQ(r.code, 2);
    fs::remove_all(d);
}

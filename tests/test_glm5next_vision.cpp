// The glm5next vision tower (docs/glm5next-format.md 12.1, 12.4) against the
// float64 reference's goldens (tests/data/glm5next/vision.golden.json): the
// embeddings computed from the golden pixels, F16/BF16 copies of the
// matrices, batching and thread invariance, the tiled attention op against a
// direct computation, and every refusal the loader makes.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

#include "backend/cpu.h"
#include "backend/cpu_memory.h"
#include "core/fp16.h"
#include "gguf/writer.h"
#include "model/glm5next_vision.h"
#include "quant/quant.h"
#include "quantize/quantize_file.h"
#include "synth/mmproj.h"
#include "util_backend.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

namespace fs = std::filesystem;

const nlohmann::json& golden() {
    static const nlohmann::json g = load_json(data_path("glm5next/vision.golden.json"));
    return g;
}

struct Tower {
    TestModel text;
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<model::VisionTower> tower;
    explicit Tower(const std::string& mmproj = data_path("glm5next/mmproj-tiny.gguf"),
                   int threads = 1, const std::string& model = "glm5next/tiny.gguf")
        : text(data_path(model), backend::CacheType::F32, threads) {
        file = gguf::File::open(mmproj);
        tower = model::load_vision_tower(*file, *text.be, *text.model, {});
    }
    std::vector<float> encode(const std::vector<const nlohmann::json*>& images) {
        std::vector<std::vector<float>> px;
        std::vector<model::VisionTower::Image> in;
        for (const auto* g : images) px.push_back((*g)["pixels"].get<std::vector<float>>());
        for (size_t i = 0; i < images.size(); ++i)
            in.push_back({px[i].data(), (*images[i])["canvas"][0].get<int64_t>(),
                          (*images[i])["canvas"][1].get<int64_t>()});
        std::vector<float> rows;
        tower->encode(in, rows);
        return rows;
    }
};

// max |a - golden| / max |golden|
double rel_err(const std::vector<float>& a, const std::vector<double>& want) {
    double d = 0, m = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        d = std::max(d, std::fabs(double(a[i]) - want[i]));
        m = std::max(m, std::fabs(want[i]));
    }
    return d / m;
}

}  // namespace

TEST(VisionTower, EmbeddingsFromTheGoldenPixels) {
    Tower t;
    EXPECT_EQ(t.tower->hparams().out, t.text.model->info().n_embd);
    for (const auto& g : golden()["images"]) {
        const auto rows = t.encode({&g});
        const auto want = g["embeddings"].get<std::vector<double>>();
        ASSERT_EQ(rows.size(), want.size());
        ASSERT_EQ(int64_t(rows.size()), g["tokens"].get<int64_t>() * t.tower->hparams().out);
        const double e = rel_err(rows, want);
        std::printf("  %s: %zu rows, max |d| / max |golden| = %.3g\n",
                    g["file"].get<std::string>().c_str(),
                    rows.size() / size_t(t.tower->hparams().out), e);
        EXPECT_LE(e, 1e-4) << g["file"];
    }
}

// Two images in one call: each attends only to itself, so its rows are the
// bits it gets alone; and two threads give the bits of one.
TEST(VisionTower, BatchedImagesAndThreadsChangeNoBit) {
    const auto& ims = golden()["images"];
    Tower one(data_path("glm5next/mmproj-tiny.gguf"), 1);
    Tower two(data_path("glm5next/mmproj-tiny.gguf"), 2);
    const auto a = one.encode({&ims[0]});
    const auto b = one.encode({&ims[1]});
    auto ab = a;
    ab.insert(ab.end(), b.begin(), b.end());
    EXPECT_TRUE(bitwise_equal(one.encode({&ims[0], &ims[1]}), ab));
    EXPECT_TRUE(bitwise_equal(two.encode({&ims[0], &ims[1]}), ab));
}

// The tiled running-softmax attention against a direct double computation,
// over sizes that leave partial query and key tiles, for head widths on the
// vector path (multiples of 8) and off it.
TEST(VisionTower, TiledAttentionMatchesDirectSoftmax) {
    auto be = backend::make_cpu_backend({2});
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t D : {12, 16, 64})
        for (int64_t n : {1, 37, 150}) {
            const int64_t H = 3, W = H * D;
            std::vector<float> q(size_t(n * W)), k(q.size()), v(q.size()), out(q.size());
            for (auto* x : {&q, &k, &v})
                for (float& f : *x) f = 2.0f * nd(rng);
            using backend::cpu::dev;
            backend::VisionOps::FullAttentionSeq s{dev(q.data()), dev(k.data()), dev(v.data()),
                                                   dev(out.data()), n};
            const float scale = 1.0f / std::sqrt(float(D));
            test::vision_ops(*be).attention_full({&s, 1}, H, D, W, scale);
            double worst = 0;
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < n; ++i) {
                    std::vector<double> p(static_cast<size_t>(n));
                    double mx = -1e300, sum = 0;
                    for (int64_t j = 0; j < n; ++j) {
                        double dot = 0;
                        for (int64_t c = 0; c < D; ++c)
                            dot +=
                                double(q[size_t(i * W + h * D + c)]) * k[size_t(j * W + h * D + c)];
                        p[size_t(j)] = dot * scale;
                        mx = std::max(mx, p[size_t(j)]);
                    }
                    for (double& x : p) sum += (x = std::exp(x - mx));
                    for (int64_t c = 0; c < D; ++c) {
                        double o = 0;
                        for (int64_t j = 0; j < n; ++j)
                            o += p[size_t(j)] * v[size_t(j * W + h * D + c)];
                        worst =
                            std::max(worst, std::fabs(o / sum - out[size_t(i * W + h * D + c)]));
                    }
                }
            EXPECT_LE(worst, 2e-5) << "D " << D << " n " << n;
        }
}

namespace {

class VisionLoad : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        src_ = gguf::File::open(data_path("glm5next/mmproj-tiny.gguf")).release();
        dir_ = new fs::path(fs::temp_directory_path() /
                            ("glm5next_vision_" + std::to_string(::getpid())));
        fs::create_directories(*dir_);
    }
    static void TearDownTestSuite() {
        delete src_;
        fs::remove_all(*dir_);
        delete dir_;
    }
    using KvEdit = std::function<void(gguf::Writer&)>;
    // What to write for a tensor: its type (F32 unless changed), its ne
    // (empty: the same), or nothing.
    struct Edit {
        bool drop = false;
        quant::Type type = quant::Type::F32;
        std::vector<int64_t> ne;
    };
    using TensorEdit = std::function<Edit(const gguf::TensorInfo&)>;

    static std::string variant(const std::string& name, const KvEdit& kv,
                               const TensorEdit& te = nullptr) {
        gguf::Writer w;
        for (const auto& [key, v] : src_->metadata()) w.set(key, v);
        if (kv) kv(w);
        for (const auto& t : src_->tensors()) {
            Edit e = te ? te(t) : Edit{};
            if (e.drop) continue;
            std::vector<int64_t> ne = e.ne;
            if (ne.empty()) ne.assign(t.ne.begin(), t.ne.begin() + t.n_dims);
            int64_t n = 1;
            for (int64_t x : ne) n *= x;
            std::vector<float> f(size_t(n), 0.0f);
            std::memcpy(f.data(), t.data, std::min(f.size() * 4, t.nbytes));
            std::vector<uint8_t> bytes(quant::row_size(e.type, ne[0]) * size_t(n / ne[0]));
            quant::quantize_rows(e.type, f.data(), bytes.data(), n / ne[0], ne[0], nullptr);
            w.add_tensor_bytes(t.name, e.type, ne, bytes.data(), bytes.size());
        }
        const std::string path = (*dir_ / (name + ".gguf")).string();
        w.write(path);
        return path;
    }
    static void expect_refused(const std::string& path, std::vector<std::string> needles,
                               const std::string& model = "glm5next/tiny.gguf") {
        try {
            Tower t(path, 1, model);
            ADD_FAILURE() << "loaded " << path;
        } catch (const Error& e) {
            const std::string m = e.what();
            std::printf("  refused: %s\n", m.c_str());
            for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << m;
        }
    }
    static bool is_matrix(const gguf::TensorInfo& t) {
        return t.n_dims == 2 && t.name.find("weight") != std::string::npos;
    }
    static inline gguf::File* src_ = nullptr;
    static inline fs::path* dir_ = nullptr;
};

}  // namespace

TEST_F(VisionLoad, RefusesEveryRuleBroken) {
    expect_refused(
        variant("proj", [](gguf::Writer& w) { w.set_string("clip.projector_type", "glm4v"); }),
        {"clip.projector_type", "glm4v"});
    expect_refused(
        variant("dim", [](gguf::Writer& w) { w.set_u32("clip.vision.projection_dim", 32); }),
        {"projection_dim", "32", "64"});
    expect_refused(
        variant("patch", [](gguf::Writer& w) { w.set_u32("clip.vision.patch_size", 16); }),
        {"patch_size", "16", "14"});
    expect_refused(
        variant("merge", [](gguf::Writer& w) { w.set_u32("clip.vision.spatial_merge_size", 3); }),
        {"spatial_merge_size", "3", "2"});
    expect_refused(
        variant("arch", [](gguf::Writer& w) { w.set_string("general.architecture", "llama"); }),
        {"general.architecture", "clip"});
    expect_refused(variant("missing", nullptr,
                           [](const gguf::TensorInfo& t) {
                               Edit e;
                               e.drop = t.name == "v.blk.1.attn_out.weight";
                               return e;
                           }),
                   {"missing tensor v.blk.1.attn_out.weight"});
    expect_refused(variant("shape", nullptr,
                           [](const gguf::TensorInfo& t) {
                               Edit e;
                               if (t.name == "mm.model.fc.weight") e.ne = {t.ne[0], t.ne[1] - 1};
                               return e;
                           }),
                   {"mm.model.fc.weight", "shape"});
    expect_refused(variant("conv", nullptr,
                           [](const gguf::TensorInfo& t) {
                               Edit e;
                               if (t.name == "v.patch_embd.weight.1")
                                   e.ne = {14, 14, 3, t.ne[3] / 2};
                               return e;
                           }),
                   {"v.patch_embd.weight.1", "shape"});
    // (Quantized matrices load: QuantizedTowerStaysNearTheGoldens.)
    // glm-dsa is text only, whatever the mmproj.
    expect_refused(data_path("glm5next/mmproj-tiny.gguf"), {"glm-dsa", "text only"},
                   "glm-dsa/tiny.gguf");
}

// The published file is BF16: F16 and BF16 matrices run through the same
// kernels (activations rounded to the weight's format, as llama.cpp does),
// close to the F32 result.
TEST_F(VisionLoad, HalfPrecisionMatrices) {
    const auto& g = golden()["images"][1];
    const auto want = g["embeddings"].get<std::vector<double>>();
    for (quant::Type ty : {quant::Type::F16, quant::Type::BF16}) {
        const std::string path = variant(std::string("half_") + quant::name(ty), nullptr,
                                         [&](const gguf::TensorInfo& t) {
                                             Edit e;
                                             if (is_matrix(t)) e.type = ty;
                                             return e;
                                         });
        Tower t(path);
        const double e = rel_err(t.encode({&g}), want);
        std::printf("  %s matrices: max |d| / max |golden| = %.3g\n", quant::name(ty), e);
        EXPECT_LE(e, ty == quant::Type::F16 ? 5e-3 : 5e-2);
        EXPECT_GT(e, 1e-7);  // really rounded
    }
}

// make-model --arch mmproj's writer: the tiny preset loads beside tiny.gguf
// and encodes; the same seed gives the same bytes, another seed other ones.
TEST_F(VisionLoad, SyntheticMmprojLoadsAndEncodes) {
    const auto hp = synth::MmprojHParams::preset("tiny");
    const std::string a = (*dir_ / "gen_a.gguf").string(), b = (*dir_ / "gen_b.gguf").string(),
                      c = (*dir_ / "gen_c.gguf").string();
    synth::write_mmproj(hp, 1, a, 1, nullptr);
    synth::write_mmproj(hp, 1, b, 1, nullptr);
    synth::write_mmproj(hp, 2, c, 1, nullptr);
    auto bytes = [](const std::string& p) {
        std::ifstream f(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    EXPECT_EQ(bytes(a), bytes(b));
    EXPECT_NE(bytes(a), bytes(c));
    Tower t(a);
    const auto& g = golden()["images"][1];
    const auto rows = t.encode({&g});
    ASSERT_EQ(int64_t(rows.size()), g["tokens"].get<int64_t>() * 64);
    for (float x : rows) ASSERT_TRUE(std::isfinite(x));
    EXPECT_THROW(synth::MmprojHParams::preset("huge"), Error);
}

// A tower glm5 quantize wrote loads and encodes near the goldens: Q8_0, and Q4_K_M (its
// rows of 32 and 64 values fall back to Q5_0 and Q8_0). Measured: 0.03 and 0.18 of the
// largest golden value (the inputs are rounded to Q8_0 too, and the rows are short).
TEST(VisionTower, QuantizedTowerStaysNearTheGoldens) {
    const fs::path dir = fs::temp_directory_path() / ("glm5-vq-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const auto src = gguf::File::open(data_path("glm5next/mmproj-tiny.gguf"));
    for (const auto& [type, tol] :
         {std::pair<std::string, double>{"Q8_0", 0.05}, {"Q4_K_M", 0.3}}) {
        SCOPED_TRACE(type);
        quantize::QuantizeOptions o;
        o.scheme = type;
        const quantize::QuantizePlan p = quantize::plan_quantize(*src, o);
        int quantized = 0;
        for (const auto& t : p.tensors) quantized += quant::traits(t.type).quantized ? 1 : 0;
        EXPECT_GE(quantized, 10);
        const std::string out = (dir / (type + ".gguf")).string();
        quantize::write_quantized(*src, p, o, out, nullptr);
        Tower t(out);
        for (const auto& g : golden()["images"]) {
            const double e = rel_err(t.encode({&g}), g["embeddings"].get<std::vector<double>>());
            std::printf("  %s %s: max |d| / max |golden| = %.3g\n", type.c_str(),
                        g["file"].get<std::string>().c_str(), e);
            EXPECT_LE(e, tol) << g["file"];
        }
    }
    fs::remove_all(dir);
}

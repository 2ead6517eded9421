// The model generator's glm5next preset: the layout of the glm5next fixture
// (same metadata, same tensors and shapes but for the vocabulary), and a
// generated model loads and gives finite, sane logits, F32 and quantized, from
// the library and from `glm5 make-model --arch glm5next`.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "synth/generator.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;
namespace fs = std::filesystem;

namespace {

class Glm5NextGen : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("glm5next_gen_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string file(const std::string& n) const { return (dir_ / n).string(); }

    static synth::GenOptions options(const std::string& type) {
        synth::GenOptions o;
        o.arch = synth::Arch::Glm5Next;
        o.preset = "tiny";
        o.glm5next = synth::Glm5NextHParams::preset("tiny");
        o.type = type;
        o.n_threads = 1;
        return o;
    }

    fs::path dir_;
};

const std::vector<int32_t>& prompt() {
    static const std::vector<int32_t> p = [] {
        const auto g = load_json(data_path("glm5next/tiny.golden.json"));
        return to_ids(g["prompts"][3]["tokens"]);  // 40 tokens: the sparse path too
    }();
    return p;
}

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Finite logits with a spread like a real model's and a clear argmax.
void expect_sane(const std::vector<float>& lg, int64_t V, const std::string& what) {
    ASSERT_EQ(lg.size() % size_t(V), 0u);
    for (size_t r = 0; r < lg.size() / size_t(V); ++r) {
        const float* row = lg.data() + r * size_t(V);
        double sum = 0, sum2 = 0;
        for (int64_t i = 0; i < V; ++i) {
            ASSERT_TRUE(std::isfinite(row[i])) << what << " row " << r << " id " << i;
            sum += row[i];
            sum2 += double(row[i]) * row[i];
        }
        const double mean = sum / double(V), sd = std::sqrt(sum2 / double(V) - mean * mean);
        EXPECT_GT(sd, 0.3) << what << " row " << r;
        EXPECT_LT(sd, 30.0) << what << " row " << r;
    }
}

TEST_F(Glm5NextGen, TinyHasTheFixtureLayout) {
    const auto plan = synth::plan(options("F32"));
    EXPECT_EQ(plan.arch, "glm5next");
    auto fixture = gguf::File::open(data_path("glm5next/tiny.gguf"));
    std::set<std::string> want, got;
    for (const auto& t : fixture->tensors()) {
        std::string shape = t.shape_string();
        if (t.name == "token_embd.weight" || t.name == "output.weight") shape = "vocab";
        want.insert(t.name + " " + shape);
    }
    for (const auto& t : plan.tensors) {
        std::string shape = "[";
        for (size_t i = 0; i < t.ne.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.ne[i]);
        shape += "]";
        if (t.name == "token_embd.weight" || t.name == "output.weight") shape = "vocab";
        got.insert(t.name + " " + shape);
    }
    EXPECT_EQ(got, want);

    // The fixture's glm5next.* metadata, value for value (the vocabulary aside).
    const std::string path = file("tiny.gguf");
    synth::generate(options("F32"), path);
    auto gen = gguf::File::open(path);
    size_t compared = 0;
    for (const auto& [key, v] : fixture->metadata()) {
        if (key.rfind("glm5next.", 0) != 0 || key == "glm5next.vocab_size") continue;
        const gguf::Value* g = gen->find(key);
        ASSERT_NE(g, nullptr) << key;
        EXPECT_EQ(g->to_display(64), v.to_display(64)) << key;
        ++compared;
    }
    EXPECT_GT(compared, 30u);
    EXPECT_EQ(gen->get_string("general.architecture"), "glm5next");
}

TEST_F(Glm5NextGen, GeneratedModelsLoadAndGiveSaneLogits) {
    for (const char* type : {"F32", "Q8_0", "Q4_K_M"}) {
        const std::string path = file(std::string("tiny-") + type + ".gguf");
        synth::generate(options(type), path);
        TestModel m(path, backend::CacheType::F32, 1);
        EXPECT_EQ(m.model->info().arch, "glm5next");
        EXPECT_EQ(m.n_vocab(), 768);
        const auto lg = m.batch_logits(prompt(), true);
        expect_sane(lg, m.n_vocab(), type);
        // The generated model keeps the batching invariant too.
        EXPECT_TRUE(bitwise_equal(lg, m.chunked_logits(prompt(), 1))) << type;
    }
}

TEST_F(Glm5NextGen, MakeModelCli) {
    const std::string path = file("cli.gguf");
    const std::string cmd = std::string(GLM5_BINARY) +
                            " make-model --arch glm5next --quiet --threads 1 -o " + path +
                            " > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    TestModel m(path, backend::CacheType::F32, 1);
    EXPECT_EQ(m.model->info().arch, "glm5next");
    expect_sane(m.batch_logits(prompt(), false), m.n_vocab(), "cli");
    // The same bytes as the library with the default options.
    auto o = options("F32");
    o.n_threads = 0;
    synth::generate(o, file("lib.gguf"));
    EXPECT_TRUE(read_bytes(path) == read_bytes(file("lib.gguf")));

    // glm-dsa's dimension flags do not apply.
    const std::string bad = std::string(GLM5_BINARY) +
                            " make-model --arch glm5next --n-embd 128 --quiet -o " +
                            file("bad.gguf") + " > /dev/null 2>&1";
    EXPECT_NE(std::system(bad.c_str()), 0);
    EXPECT_FALSE(fs::exists(file("bad.gguf")));
}

}  // namespace

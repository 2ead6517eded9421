// `glm5 make-model` end to end: the file equals the library's, stdout holds
// only the path, overrides reach the file, and bad values exit with code 2.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "synth/generator.h"

namespace fs = std::filesystem;

namespace {

struct CliResult {
    int code;
    std::string out;
};

CliResult run(const std::string& args) {
    const std::string cmd = std::string(GLM5_BINARY) + " make-model " + args + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {-1, ""};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class CliTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("glm5-gen-cli-" + std::to_string(getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string file(const std::string& n) const { return (dir_ / n).string(); }
    fs::path dir_;
};

}  // namespace

TEST_F(CliTest, TinyEqualsTheLibraryAndPrintsOnlyThePath) {
    const std::string path = file("tiny.gguf");
    const CliResult r = run("-o " + path + " --threads 2");
    ASSERT_EQ(r.code, 0);
    EXPECT_EQ(r.out, path + "\n");
    glm5::synth::GenOptions o;  // the CLI's defaults: tiny, F32, seed 20260822
    glm5::synth::generate(o, file("lib.gguf"));
    EXPECT_TRUE(read_bytes(path) == read_bytes(file("lib.gguf")));
}

TEST_F(CliTest, OverridesReachTheFile) {
    const std::string path = file("o.gguf");
    const CliResult r = run("-o " + path +
                            " --preset small --type Q8_0 --n-embd 512 --n-layer 5 --n-expert 8"
                            " --indexer-top-k 32 --no-nextn --seed 3 --quiet");
    ASSERT_EQ(r.code, 0);
    const auto f = glm5::gguf::File::open(path);
    EXPECT_EQ(f->get_uint("glm-dsa.embedding_length"), 512u);
    EXPECT_EQ(f->get_uint("glm-dsa.block_count"), 5u);  // no NextN block
    EXPECT_EQ(f->get_uint("glm-dsa.nextn_predict_layers"), 0u);
    EXPECT_EQ(f->get_uint("glm-dsa.expert_count"), 8u);
    EXPECT_EQ(f->get_uint("glm-dsa.attention.indexer.top_k"), 32u);
    EXPECT_EQ(f->get_uint("general.file_type"), 7u);  // MOSTLY_Q8_0
    // Five trunk layers: the indexer pattern becomes GLM-5.2's (1,1,1,0,0).
    const auto* types = f->find("glm-dsa.attention.indexer.types");
    ASSERT_NE(types, nullptr);
    ASSERT_EQ(types->size(), 5u);
    const bool want[] = {true, true, true, false, false};
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(*(*types)[i].as_bool(), want[i]) << i;
    EXPECT_EQ(f->find_tensor("blk.5.attn_norm.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.3.indexer.attn_k.weight"), nullptr);  // shared layer
    ASSERT_NE(f->find_tensor("blk.2.indexer.attn_k.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.4.ffn_gate_exps.weight")->ne[2], 8);
}

TEST_F(CliTest, DryRunListsTensorsAndWritesNothing) {
    const CliResult r = run("--dry-run --preset tiny --type Q4_K_M");
    ASSERT_EQ(r.code, 0);
    size_t lines = 0;
    for (char c : r.out) lines += c == '\n';
    EXPECT_EQ(lines, 143u + 1u);  // tiny.gguf's 143 tensors and a summary line
    EXPECT_NE(r.out.find("blk.0.attn_k_b.weight"), std::string::npos);
}

TEST_F(CliTest, HelpListsEveryFlagWithItsDefault) {
    const CliResult r = run("--help");
    ASSERT_EQ(r.code, 0);
    for (const char* f :
         {"--preset",  "--type",          "--seed",          "--n-embd",        "--n-layer",
          "--n-dense", "--n-expert ",     "--n-expert-used", "--n-ff ",         "--n-ff-exp",
          "--n-head",  "--q-lora",        "--kv-lora",       "--qk-nope",       "--qk-rope",
          "--v-head",  "--indexer-heads", "--indexer-dim",   "--indexer-top-k", "--indexer-types",
          "--n-vocab", "--ctx",           "--imatrix",       "--blocks"})
        EXPECT_NE(r.out.find(f), std::string::npos) << f;
    EXPECT_NE(r.out.find("2048 bench"), std::string::npos);  // preset defaults are shown
}

TEST_F(CliTest, BadValuesExitWithTwo) {
    const std::string o = " -o " + file("bad.gguf");
    const char* bad[] = {
        "--preset huge",
        "--type Q9_K",
        "--indexer-dim 96",             // not a power of two
        "--indexer-dim 32",             // below 64
        "--qk-rope 128",                // beyond the indexer key length
        "--n-expert-used 17",           // more than the 16 experts
        "--indexer-types 0,1,1,1,1,1",  // the first layer must be full
        "--indexer-types 1,1",          // one per trunk layer
        "--indexer-types 1,2,0,0,0,0",
        "--n-vocab 100",
        "--n-embd 0",
        "--n-embd abc",
        "--blocks sometimes",
        "--imatrix maybe",
        "--preset small --type IQ2_XXS --imatrix off",  // the mix needs importance data
        "--nextn-type Q9",
        "--no-such-flag",
    };
    for (const char* b : bad) {
        const CliResult r = run(std::string(b) + o);
        EXPECT_EQ(r.code, 2) << b;
        EXPECT_EQ(r.out, "") << b;
    }
    EXPECT_EQ(run("--preset tiny").code, 2);  // no -o
    EXPECT_FALSE(fs::exists(file("bad.gguf")));
}

// The glm5 binary on the GPU, end to end (label `gpu`: in the simulation build every CI run
// runs these on the simulated device; scripts/device-check.sh runs them on a real one): for
// the embedded default model and both tiny fixtures, `run` greedy gives the CPU's tokens,
// `logits` the CPU's within the stated tolerance, speculation plain decoding's tokens, and
// `serve` gives a sequence the same reply whether it decodes alone, beside another decoding
// sequence, or beside another's prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "server/server_process.h"
#include "util_cli.h"
#include "util_model.h"

using glm5::test::data_path;
using glm5::test::http_post;
using glm5::test::run_glm5;
using glm5::test::ServerProcess;
using json = nlohmann::json;

namespace {

// The CUDA forward runs only when asked for until a GPU has passed the device check.
const std::string kGpu = "GLM5_CUDA_FORWARD=1";

// The default model (no --model) and the two tiny fixtures.
std::vector<std::string> models() {
    return {"", "--model " + data_path("glm-dsa/tiny.gguf"),
            "--model " + data_path("glm5next/tiny.gguf")};
}

std::string greedy(const std::string& model, const std::string& device, const std::string& more) {
    const auto r = run_glm5("run " + model + " --tokens 1,2,3,4,5 -n 16 --temp 0 --print-ids " +
                                "--ignore-eos --device " + device + " " + more,
                            "", kGpu);
    EXPECT_EQ(r.code, 0) << model << " " << device << " " << more << "\n" << r.err;
    return r.out;
}

TEST(CudaCli, RunGivesTheCpusGreedyTokens) {
    for (const std::string& m : models()) {
        const std::string on_gpu = greedy(m, "cuda", "");
        EXPECT_FALSE(on_gpu.empty());
        EXPECT_EQ(on_gpu, greedy(m, "none", "")) << m;
    }
}

// Speculation changes nothing but speed: the GPU's drafts (the NextN block where the file
// has one, else n-grams) verified on the GPU give plain decoding's tokens.
// An image encoded on the device enters the prompt as on the CPU: the vision goldens' last
// logits within the CPU test's bound, and their greedy ids.
TEST(CudaCli, AnImageOnTheDeviceGivesTheVisionGoldens) {
    const std::string T = data_path("glm5next/");
    const auto golden = glm5::test::load_json(T + "vision.golden.json");
    for (const auto& g : golden["images"]) {
        std::string ids;
        for (const auto& x : g["prompt_ids"]) ids += (ids.empty() ? "" : ",") + x.dump();
        const std::string flags = "--model " + T + "tiny.gguf --mmproj " + T +
                                  "mmproj-tiny.gguf --image " + T + std::string(g["file"]) +
                                  " --cache-type f32 -t 1 --device cuda --tokens " + ids;
        const auto lg = run_glm5("logits " + flags, "", kGpu);
        ASSERT_EQ(lg.code, 0) << lg.err;
        const auto j = json::parse(lg.out);
        EXPECT_LE(glm5::test::max_abs_diff(j["logits"][0].get<std::vector<float>>().data(),
                                           glm5::test::to_floats(g["last_logits"])),
                  1e-3)
            << g["file"];
        const auto run =
            run_glm5("run " + flags + " --print-ids --ignore-eos --temp 0 -n 8", "", kGpu);
        ASSERT_EQ(run.code, 0) << run.err;
        std::stringstream ss(run.out);
        std::vector<int32_t> got;
        for (int32_t x; ss >> x;) got.push_back(x);
        EXPECT_EQ(got, glm5::test::to_ids(g["greedy"])) << g["file"];
    }
}

TEST(CudaCli, SpeculationGivesPlainDecodingsTokens) {
    for (const std::string& m : models()) {
        const std::string plain = greedy(m, "cuda", "");
        EXPECT_EQ(greedy(m, "cuda", "--spec --spec-draft 4"), plain) << m;
        EXPECT_EQ(greedy(m, "cuda", "--spec --spec-type ngram --spec-draft 4"), plain) << m;
    }
}

// Every position's logits, the largest difference over the CPU's RMS. Measured on the
// simulated device: 2e-6 (the default model), 2e-4 and 4e-4 (the fixtures, whose products
// the CPU makes with activations rounded to the weights' 8-bit partner format while the GPU
// keeps them in F32). The bound leaves ten times that for a GPU's expf and sinf, which are
// within 2 ulp where the host's are within 1.
TEST(CudaCli, LogitsAgreeWithTheCpus) {
    // `logits` takes a file: the default model's own.
    std::vector<std::string> files = models();
    const char* away = std::getenv("GLM5_TEST_DATA");  // device-check.sh carries it there
    files[0] =
        "--model " + (away && *away ? std::string(away) + "/kjv-mini.gguf"
                                    : std::string(GLM5_SOURCE_DIR) + "/models/kjv-mini.gguf");
    for (const std::string& m : files) {
        auto logits = [&](const std::string& device) {
            const auto r = run_glm5(
                "logits " + m + " --tokens 3,1,4,1,5,9,2,6 --all --device " + device, "", kGpu);
            EXPECT_EQ(r.code, 0) << r.err;
            const json j = json::parse(r.out, nullptr, false);
            return j.is_object() ? j["logits"].get<std::vector<std::vector<float>>>()
                                 : std::vector<std::vector<float>>{};
        };
        const auto g = logits("cuda"), c = logits("none");
        ASSERT_EQ(g.size(), 8u) << m;
        ASSERT_EQ(c.size(), 8u) << m;
        for (size_t t = 0; t < c.size(); ++t) {
            ASSERT_EQ(g[t].size(), c[t].size());
            double sq = 0, worst = 0;
            for (size_t i = 0; i < c[t].size(); ++i) {
                sq += double(c[t][i]) * c[t][i];
                worst = std::max(worst, std::fabs(double(g[t][i]) - c[t][i]));
            }
            EXPECT_LT(worst / std::sqrt(sq / double(c[t].size())), 5e-3) << m << ", position " << t;
        }
    }
}

// A completion's text and why it ended.
struct Reply {
    std::string text, finish;
};

Reply complete(int port, const std::string& prompt, int n) {
    const auto r = http_post(
        port, "/v1/completions",
        json{{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}}
            .dump());
    EXPECT_EQ(r.status, 200) << r.raw;
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("choices")) return {};
    return {j["choices"][0].value("text", ""), j["choices"][0].value("finish_reason", "")};
}

// Two sequences decoding together, and one decoding beside another's long prompt: each
// reply is the one it gets alone (every product keeps one order at any row count).
TEST(CudaCli, ServedRepliesDoNotDependOnWhatSharesTheirSteps) {
    for (const std::string& m : models()) {
        std::vector<std::string> args = {"--port",     "0",   "--parallel", "2",
                                         "--ctx-size", "512", "--device",   "cuda"};
        if (!m.empty()) {
            args.push_back("--model");
            args.push_back(m.substr(m.find(' ') + 1));
        }
        setenv("GLM5_CUDA_FORWARD", "1", 1);
        ServerProcess s(args);
        ASSERT_GT(s.port(), 0) << s.log();
        const std::string a = "And God said, Let there be light", b = "In the beginning";
        std::string long_prompt;
        for (int i = 0; i < 8; ++i) long_prompt += "and the earth was without form, and void; ";
        const Reply alone_a = complete(s.port(), a, 16), alone_b = complete(s.port(), b, 16);
        EXPECT_FALSE(alone_a.text.empty()) << m;
        auto together = [&](const std::string& first, const std::string& second, int n2) {
            auto fa = std::async(std::launch::async, [&] { return complete(s.port(), first, 16); });
            auto fb =
                std::async(std::launch::async, [&] { return complete(s.port(), second, n2); });
            return std::make_pair(fa.get(), fb.get());
        };
        const auto [ta, tb] = together(a, b, 16);
        EXPECT_EQ(ta.text, alone_a.text) << m;
        EXPECT_EQ(tb.text, alone_b.text) << m;
        const auto [pa, pl] = together(a, long_prompt, 2);
        EXPECT_EQ(pa.text, alone_a.text) << m;
        EXPECT_EQ(pl.finish, "length") << m;
        // The server says where the model runs, and that a simulated GPU is one.
        EXPECT_NE(s.log().find("on cuda:0"), std::string::npos) << s.log();
        EXPECT_EQ(s.log().find("simulated") != std::string::npos, glm5::backend::cuda::simulated())
            << s.log();
    }
}

}  // namespace

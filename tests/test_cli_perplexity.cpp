// glm5 perplexity end to end: its figures against a perplexity computed here from the
// model's own forward (both architectures), --chunks, the batch layout not mattering,
// a text too short refused, and llama.cpp's figures on the same files (a golden, as CI
// has no llama.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/sha256.h"
#include "text/tokenizer.h"
#include "util_cli.h"
#include "util_model.h"

using namespace glm5::test;

namespace {

const std::string kText = data_path("text/genesis.txt");

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// What the command prints: the running figure after each chunk, the final one and its
// uncertainty.
struct Printed {
    std::vector<double> chunks;
    double ppl = NAN, err = NAN;
};

Printed parse_output(const std::string& out) {
    Printed p;
    const std::regex chunk(R"(\[(\d+)\]([0-9.]+),)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), chunk);
         it != std::sregex_iterator(); ++it) {
        EXPECT_EQ(std::stoi((*it)[1]), int(p.chunks.size()) + 1) << out;
        p.chunks.push_back(std::stod((*it)[2]));
    }
    std::smatch m;
    if (std::regex_search(out, m,
                          std::regex(R"(Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+))"))) {
        p.ppl = std::stod(m[1]);
        p.err = std::stod(m[2]);
    }
    return p;
}

Printed run_ppl(const std::string& model, const std::string& flags) {
    const CliResult r = run_glm5("perplexity -m " + model + " -f " + kText + " -t 2 " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return parse_output(r.out);
}

// The perplexity of chunks of n_ctx tokens of the text, each evaluated alone in one
// forward, their second halves scored: the definition, computed without the command's code.
Printed reference(const std::string& path, int n_ctx, int n_chunks) {
    TestModel m(path, glm5::backend::CacheType::F16);
    const auto tok = glm5::text::Tokenizer::from_gguf(*m.file);
    const std::vector<int32_t> ids = tok->encode(read_file(kText), false);
    const int64_t V = m.n_vocab();
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    Printed p;
    for (int c = 0; c < n_chunks; ++c) {
        const std::vector<int32_t> chunk(ids.begin() + c * n_ctx, ids.begin() + (c + 1) * n_ctx);
        const std::vector<float> lg = m.batch_logits(chunk);
        for (int k = n_ctx / 2; k < n_ctx - 1; ++k) {
            const float* row = lg.data() + size_t(k) * size_t(V);
            double z = 0;
            const double mx = *std::max_element(row, row + V);
            for (int64_t i = 0; i < V; ++i) z += std::exp(double(row[i]) - mx);
            const double v = std::log(z) + mx - double(row[chunk[size_t(k) + 1]]);
            nll += v;
            nll2 += v * v;
            ++count;
        }
        p.chunks.push_back(std::exp(nll / double(count)));
    }
    const double mean = nll / double(count);
    p.ppl = std::exp(mean);
    p.err = std::sqrt((nll2 / double(count) - mean * mean) / double(count - 1)) * p.ppl;
    return p;
}

void expect_close(const Printed& got, const Printed& want, double rel, const std::string& what) {
    ASSERT_EQ(got.chunks.size(), want.chunks.size()) << what;
    for (size_t i = 0; i < got.chunks.size(); ++i)
        EXPECT_NEAR(got.chunks[i], want.chunks[i], rel * want.chunks[i]) << what << " chunk " << i;
    EXPECT_NEAR(got.ppl, want.ppl, rel * want.ppl) << what;
    EXPECT_NEAR(got.err, want.err, rel * want.err + 1e-5) << what;
}

TEST(CliPerplexity, MatchesTheForwardOnBothArchitectures) {
    for (const char* model : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        const std::string path = data_path(model);
        // Two chunks per pass cut into forwards of 48 tokens: pieces of both sequences
        // share forwards, and some forwards end inside the scored half.
        const Printed got = run_ppl(path, "-c 64 --chunks 3 -b 128 -ub 48");
        expect_close(got, reference(path, 64, 3), 1e-4, model);
    }
}

TEST(CliPerplexity, ChunksLimitAndBatchLayoutDoesNotMatter) {
    const std::string tiny = data_path("glm-dsa/tiny.gguf");
    const Printed one = run_ppl(tiny, "-c 32 --chunks 5 -b 32");          // a chunk per pass
    const Printed all = run_ppl(tiny, "-c 32 --chunks 5");                // 5 chunks per pass
    const Printed small = run_ppl(tiny, "-c 32 --chunks 5 -b 16 -ub 7");  // half-chunk batches
    ASSERT_EQ(one.chunks.size(), 5u);
    expect_close(all, one, 1e-4, "default -b");
    expect_close(small, one, 1e-4, "-b 16 -ub 7");
    // Without --chunks every whole chunk is evaluated (a 2 KB text, so that this stays short).
    const std::string d =
        std::string(::testing::TempDir()) + "glm5-ppl-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    std::ofstream(d + "/short.txt") << read_file(kText).substr(0, 2000);
    const glm5::test::CliResult r =
        run_glm5("perplexity -m " + tiny + " -f " + d + "/short.txt -c 128 -t 2");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto tok = glm5::text::Tokenizer::from_gguf(*glm5::gguf::File::open(tiny));
    const size_t n = tok->encode(read_file(kText).substr(0, 2000), false).size();
    EXPECT_EQ(parse_output(r.out).chunks.size(), n / 128) << r.out;
    std::filesystem::remove_all(d);
}

TEST(CliPerplexity, RefusesATextTooShortAndBadFlags) {
    const std::string tiny = data_path("glm-dsa/tiny.gguf");
    const std::string d =
        std::string(::testing::TempDir()) + "glm5-ppl-short-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    std::ofstream(d + "/t.txt") << "In the beginning God created the heaven and the earth.";
    CliResult r = run_glm5("perplexity -m " + tiny + " -f " + d + "/t.txt");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("you need at least 1024 tokens for a context of 512 tokens"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    r = run_glm5("perplexity -m " + tiny + " -f " + kText + " -c 2");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--ctx-size"), std::string::npos) << r.err;
    r = run_glm5("perplexity -m " + tiny + " -f " + kText + " --chunks 0");
    EXPECT_EQ(r.code, 2);
    r = run_glm5("perplexity -m " + tiny);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--file"), std::string::npos) << r.err;
    r = run_glm5("perplexity -m " + tiny + " -f " + kText + " --ppl-stride 64");
    EXPECT_EQ(r.code, 2);
    std::filesystem::remove_all(d);
}

// llama.cpp's llama-perplexity on the same files and text, as
// scripts/gen_perplexity_golden.py ran it (CI has no llama.cpp): the final figure within
// each run's tolerance (1% on the random-weight fixtures, whose figures move by up to that
// much between llama.cpp's own settings; 0.1% on the trained KJV model), each chunk's
// running figure within its chunk tolerance.
TEST(CliPerplexity, AgreesWithLlamaCpp) {
    const auto g = load_json(data_path("perplexity.golden.json"));
    ASSERT_FALSE(g["runs"].empty());
    for (const auto& run : g["runs"]) {
        const std::string model =
            std::string(GLM5_SOURCE_DIR) + "/" + run["model"].get<std::string>();
        const std::string bytes = read_file(model);
        const glm5::Sha256 h =
            glm5::sha256({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
        ASSERT_EQ(glm5::to_hex(h), run["model_sha256"].get<std::string>())
            << model << " is not the file llama.cpp was run on";
        ASSERT_EQ(run["text"].get<std::string>(), "tests/data/text/genesis.txt");
        const Printed got = run_ppl(model, "-c " + std::to_string(run["n_ctx"].get<int>()));
        const double tol = run["tolerance"].get<double>();
        const double chunk_tol = run["chunk_tolerance"].get<double>();
        ASSERT_EQ(got.chunks.size(), run["chunks"].size()) << model;
        for (size_t i = 0; i < got.chunks.size(); ++i) {
            const double want = run["chunks"][i].get<double>();
            EXPECT_NEAR(got.chunks[i], want, chunk_tol * want) << model << " chunk " << i + 1;
        }
        const double ppl = run["ppl"].get<double>(), err = run["ppl_error"].get<double>();
        EXPECT_NEAR(got.ppl, ppl, tol * ppl) << model;
        EXPECT_NEAR(got.err, err, tol * err) << model;
        std::printf("%s: glm5 %.4f +/- %.5f, llama.cpp %.4f +/- %.5f (%+.3f%%)\n",
                    run["model"].get<std::string>().c_str(), got.ppl, got.err, ppl, err,
                    100.0 * (got.ppl / ppl - 1));
    }
}

}  // namespace

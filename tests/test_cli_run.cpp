// The glm5 CLI end to end: run (--tokens, --prompt, --raw, --jsonl), logits,
// flags and refusals, the embedded default model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "quant/ops.h"
#include "util_cli.h"
#include "util_model.h"

using namespace glm5::test;

namespace {

const std::string kTiny = data_path("glm-dsa/tiny.gguf");

std::string tmp_dir(const std::string& name) {
    const std::string d =
        std::string(::testing::TempDir()) + "glm5-cli-" + name + "-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
}

std::string join(const std::vector<int32_t>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
    return s;
}

TEST(CliRun, TokensGreedyMatchesGolden) {
    const auto g = load_json(data_path("glm-dsa/tiny.golden.json"));
    for (const auto& p : g["prompts"]) {
        const auto tokens = to_ids(p["tokens"]);
        const CliResult r =
            run_glm5("run --model " + kTiny + " --tokens " + join(tokens, ",") +
                     " -n 16 --temp 0 --print-ids --ignore-eos --cache-type f32 --threads 2");
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_EQ(r.out, join(to_ids(p["greedy"]), " ") + "\n");
        EXPECT_NE(r.err.find("tok/s"), std::string::npos) << "timing summary on stderr";
    }
}

TEST(CliRun, LogitsJsonMatchesGolden) {
    const auto g = load_json(data_path("glm-dsa/tiny.golden.json"));
    const auto& p = g["prompts"][2];
    const CliResult r = run_glm5("logits --model " + kTiny + " --tokens " +
                                 join(to_ids(p["tokens"]), ",") + " --all --cache-type f32");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["n_vocab"].get<int>(), 768);
    ASSERT_EQ(j["logits"].size(), p["tokens"].size());
    for (size_t t = 0; t < j["logits"].size(); ++t)
        EXPECT_LE(max_abs_diff(to_floats(j["logits"][t]).data(), to_floats(p["logits_all"][t])),
                  1e-3);
}

TEST(CliRun, ChatTurnPromptAndRaw) {
    CliResult r = run_glm5("run --model " + kTiny + " -p \"Hello, who are you?\" -n 12 --temp 0");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(r.out.empty());
    EXPECT_NE(r.err.find("generated"), std::string::npos);
    r = run_glm5("run --model " + kTiny + " --raw -p \"The cat\" -n 8 --temp 0.7 --seed 5");
    ASSERT_EQ(r.code, 0) << r.err;
    // Same seed, same output.
    const CliResult again =
        run_glm5("run --model " + kTiny + " --raw -p \"The cat\" -n 8 --temp 0.7 --seed 5");
    EXPECT_EQ(r.out, again.out);
    const std::string d = tmp_dir("input");
    std::ofstream(d + "/q.txt") << "Tell me a story.";
    r = run_glm5("run --model " + kTiny + " --input " + d + "/q.txt -n 8 --temp 0 --think");
    EXPECT_EQ(r.code, 0) << r.err;
}

TEST(CliRun, JsonlConversation) {
    const std::string d = tmp_dir("jsonl");
    std::ofstream(d + "/in.jsonl") << "{\"user\": \"Hi there\", \"think\": false}\n"
                                      "{\"user\": \"And then?\", \"think\": true}\n";
    const CliResult r = run_glm5("run --model " + kTiny + " --jsonl " + d + "/in.jsonl --out " + d +
                                 "/out.jsonl -n 10 --temp 0");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ifstream f(d + "/out.jsonl");
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
        const auto j = nlohmann::json::parse(line);
        for (const char* k : {"user", "reasoning", "content", "tool_calls"})
            EXPECT_TRUE(j.contains(k)) << k;
        EXPECT_TRUE(j["tool_calls"].is_array());
        ++n;
    }
    EXPECT_EQ(n, 2);
    // A malformed line is refused with its line number.
    std::ofstream(d + "/bad.jsonl") << "{\"user\": \"ok\"}\nnot json\n";
    const CliResult bad = run_glm5("run --model " + kTiny + " --jsonl " + d + "/bad.jsonl -n 2");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("bad.jsonl:2"), std::string::npos) << bad.err;
}

TEST(CliRun, HelpListsEveryFlagWithDefault) {
    for (const char* cmd : {"run", "chat", "logits"}) {
        const CliResult r = run_glm5(std::string(cmd) + " --help");
        ASSERT_EQ(r.code, 0);
        std::istringstream in(r.out);
        std::string line;
        int flags = 0;
        while (std::getline(in, line)) {
            // (llama.cpp's flags that are accepted and ignored, or refused, come last.)
            if (line.rfind("llama.cpp flags", 0) == 0) break;
            if (line.rfind("  -", 0) != 0 || line.find("--help") != std::string::npos) continue;
            ++flags;
            EXPECT_NE(line.find("(default"), std::string::npos) << cmd << ": " << line;
        }
        EXPECT_GT(flags, 3) << cmd;
    }
}

TEST(CliRun, BadInputIsRefusedWithExitCode2) {
    const std::string d = tmp_dir("bad");
    std::ofstream(d + "/not.gguf") << "this is not a gguf file at all";
    const struct {
        std::string args;
        const char* says;
    } cases[] = {
        {"run --model " + kTiny + " --bogus", "unknown flag"},
        {"run --model " + kTiny + " -p hi --temp abc", "--temp"},
        {"run --model " + kTiny + " -p hi -n -3", "--n-predict"},
        {"run --model " + kTiny + " -p hi --cache-type q9", "--cache-type"},
        {"run --model " + kTiny + " -p hi --cpu-strict 2", "--cpu-strict"},
        {"run --model " + kTiny, "give one of"},
        {"run --model " + d + "/missing.gguf -p hi", "missing.gguf"},
        {"run --model " + d + "/not.gguf -p hi", "not.gguf"},
        {"logits --model " + kTiny + " --tokens 1,x,3", "--tokens"},
        {"logits --model " + kTiny + " --tokens 1,99999", "outside the vocabulary"},
        {"frobnicate", "unknown command"},
    };
    for (const auto& c : cases) {
        const CliResult r = run_glm5(c.args);
        EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_TRUE(r.out.empty()) << c.args;
        // One clear line, no stack of messages.
        EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 3) << r.err;
    }
}

// Pinned workers or free ones: the same work in the same order, so the same logits.
TEST(CliRun, PinningWorkersChangesNoBit) {
    const std::string model = data_path("glm-dsa/small-q4_k_m.gguf");
    const std::string args = "logits --model " + model + " --tokens 1,2,3,4,5,6 --all --threads 2";
    const CliResult pinned = run_glm5(args + " --cpu-strict 1");
    const CliResult free = run_glm5(args + " --cpu-strict 0");
    ASSERT_EQ(pinned.code, 0) << pinned.err;
    ASSERT_EQ(free.code, 0) << free.err;
    EXPECT_FALSE(pinned.out.empty());
    EXPECT_EQ(pinned.out, free.out);
}

// Weights whose in-memory copies do not fit (available memory forced down):
// --no-mmap is refused with the numbers and exit code 2; the default repack
// steps aside, says why, and the logits are those of a normal run.
TEST(CliRun, CopiesThatDoNotFitInMemory) {
    const std::string model = data_path("glm-dsa/small-q4_k_m.gguf");
    const std::string args = "logits --model " + model + " --tokens 1,2,3,4 --threads 2";
    const std::string tight = "GLM5_MEM_AVAILABLE=100000";

    const CliResult refused = run_glm5(args + " --no-mmap", "", tight);
    EXPECT_EQ(refused.code, 2) << refused.err;
    EXPECT_NE(refused.err.find("--no-mmap needs"), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("is available"), std::string::npos) << refused.err;
    EXPECT_TRUE(refused.out.empty());

    const CliResult normal = run_glm5(args);
    ASSERT_EQ(normal.code, 0) << normal.err;
    const CliResult fallback = run_glm5(args, "", tight);
    ASSERT_EQ(fallback.code, 0) << fallback.err;
    EXPECT_EQ(fallback.out, normal.out) << "the same logits, repacked or not";
    EXPECT_EQ(fallback.err.find("weights repacked"), std::string::npos) << fallback.err;
    // Where this CPU has a repacked GEMM, the default run repacked and the
    // tight one says why it did not.
    const bool repacks = normal.err.find("weights repacked") != std::string::npos;
    EXPECT_EQ(repacks, fallback.err.find("weights not repacked") != std::string::npos)
        << normal.err << "\n"
        << fallback.err;
}

TEST(CliRun, UnsupportedArchitectureIsRefused) {
    // Rewrite general.architecture of a small GGUF through the writer.
    const std::string d = tmp_dir("arch");
    const CliResult gen = run_glm5("make-model --preset tiny -o " + d + "/t.gguf --quiet");
    ASSERT_EQ(gen.code, 0) << gen.err;
    std::string bytes;
    {
        std::ifstream f(d + "/t.gguf", std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(f), {});
    }
    const std::string from = "glm-dsa";
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), "llamaxx");  // same length: the file stays valid
    std::ofstream(d + "/other.gguf", std::ios::binary) << bytes;
    const CliResult r = run_glm5("run --model " + d + "/other.gguf -p hi");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("not supported"), std::string::npos) << r.err;
}

TEST(CliRun, EmbeddedDefaultModelIsWrittenOnFirstUse) {
    const std::string d = tmp_dir("cache");
    std::filesystem::remove_all(d);
    const CliResult first = run_glm5("run -p Hello -n 4 --temp 0", "", "GLM5_CACHE=" + d);
    ASSERT_EQ(first.code, 0) << first.err;
    EXPECT_NE(first.err.find("writing the embedded default model"), std::string::npos) << first.err;
    // One file in the cache, byte for byte the committed trained model.
    std::vector<std::filesystem::path> cached;
    for (const auto& e : std::filesystem::directory_iterator(d)) cached.push_back(e.path());
    ASSERT_EQ(cached.size(), 1u);
    auto read = [](const std::filesystem::path& p) {
        std::ifstream f(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    };
    EXPECT_TRUE(read(cached[0]) == read(std::string(GLM5_SOURCE_DIR) + "/models/kjv-mini.gguf"));
    const CliResult second = run_glm5("run -p Hello -n 4 --temp 0", "", "GLM5_CACHE=" + d);
    ASSERT_EQ(second.code, 0) << second.err;
    EXPECT_EQ(second.err.find("writing"), std::string::npos);
    EXPECT_EQ(first.out, second.out);
    // A damaged cached copy is replaced, not loaded.
    std::filesystem::resize_file(cached[0], 1000);
    const CliResult third = run_glm5("run -p Hello -n 4 --temp 0", "", "GLM5_CACHE=" + d);
    ASSERT_EQ(third.code, 0) << third.err;
    EXPECT_NE(third.err.find("writing the embedded default model"), std::string::npos);
    EXPECT_EQ(first.out, third.out);
}

}  // namespace

namespace {

// bench --parallel: the paired scaling and its bandwidth ceiling, which can
// lie neither below 1 (the batch reads no more bytes per token than one
// sequence alone) nor above N (every shared weight is read once).
TEST(CliRun, BenchParallelPrintsScalingAndCeiling) {
    const std::string model = data_path("glm-dsa/small-q4_k_m.gguf");
    const CliResult r = run_glm5("bench --model " + model +
                                 " -p 0 -n 4 -r 1 --parallel 2 --no-roofline --threads 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("parallel 2: "), std::string::npos) << r.out;
    const size_t at = r.out.find("weights read per token: ");
    ASSERT_NE(at, std::string::npos) << r.out;
    double alone = 0, shared = 0, ceiling = 0;
    ASSERT_EQ(std::sscanf(r.out.c_str() + at,
                          "weights read per token: %lf MB alone, %lf MB with 2 sequences: a "
                          "bandwidth ceiling of %lfx",
                          &alone, &shared, &ceiling),
              3)
        << r.out;
    EXPECT_GT(alone, shared);
    // (The MB figures are printed to 0.1.)
    EXPECT_NEAR(ceiling, alone / shared, 0.005 + ceiling * (0.05 / alone + 0.05 / shared));
    EXPECT_GT(ceiling, 1.0);
    EXPECT_LE(ceiling, 2.0);
}

}  // namespace

namespace {

// --spec with --tokens/--print-ids/--ignore-eos gives exactly the ids of the
// same run without it, and reports what it drafted on stderr.
TEST(CliRun, SpeculativeRunGivesThePlainIdsAndReportsItsDrafts) {
    const auto g = load_json(data_path("glm-dsa/tiny.golden.json"));
    const auto tokens = join(to_ids(g["prompts"][0]["tokens"]), ",");
    const std::string base = "run --model " + kTiny + " --tokens " + tokens +
                             " -n 24 --temp 0 --print-ids --ignore-eos --cache-type f32";
    const CliResult plain = run_glm5(base);
    ASSERT_EQ(plain.code, 0) << plain.err;
    for (const char* type : {"mtp", "ngram", "auto"}) {
        const CliResult spec =
            run_glm5(base + " --spec --spec-fixed --spec-draft 3 --spec-type " + type);
        ASSERT_EQ(spec.code, 0) << spec.err;
        EXPECT_EQ(spec.out, plain.out) << type;
        EXPECT_NE(spec.err.find("glm5: speculative:"), std::string::npos) << spec.err;
        EXPECT_NE(spec.err.find("accepted "), std::string::npos) << spec.err;
        EXPECT_NE(spec.err.find(" verifies, "), std::string::npos) << spec.err;
    }
}

TEST(CliRun, SpeculativeMtpWithoutANextNBlockIsRefused) {
    const CliResult next = run_glm5("run --model " + data_path("glm5next/tiny.gguf") +
                                    " --tokens 1,2,3 -n 2 --spec --spec-type mtp");
    EXPECT_EQ(next.code, 2);
    EXPECT_NE(next.err.find("ngram only"), std::string::npos) << next.err;
    const std::string dir = ::testing::TempDir();
    const std::string none = dir + "/glm5-no-nextn.gguf";
    ASSERT_EQ(run_glm5("make-model --preset tiny --no-nextn -o " + none).code, 0);
    const CliResult r =
        run_glm5("run --model " + none + " --tokens 1,2,3 -n 2 --spec --spec-type mtp");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("no loadable NextN/MTP block"), std::string::npos) << r.err;
    std::remove(none.c_str());
    EXPECT_EQ(run_glm5("run --model " + kTiny + " --tokens 1 -n 1 --spec --spec-type bogus").code,
              2);
}

// --attn-bf16: refused with --spec (verification stays exact); where the CPU
// has AMX-BF16 or AVX-512 BF16 it runs, says so and keeps the greedy tokens of
// the exact path on this model's few positions; elsewhere it is refused with
// the reason.
TEST(CliRun, Bf16AttentionFlag) {
    const CliResult spec =
        run_glm5("run --model " + kTiny + " --tokens 1,2,3 -n 2 --spec --attn-bf16");
    EXPECT_EQ(spec.code, 2);
    EXPECT_NE(spec.err.find("cannot be combined with --spec"), std::string::npos) << spec.err;
    const std::string gen = "run --model " + kTiny + " --tokens 5,9,13,7 --print-ids -n 6 --temp 0";
    const CliResult bf16 = run_glm5(gen + " --attn-bf16");
    if (glm5::quant::cpu_has_amx_bf16() || glm5::quant::cpu_has_bf16_vectors()) {
        ASSERT_EQ(bf16.code, 0) << bf16.err;
        EXPECT_NE(bf16.err.find("attention and indexer products in BF16"), std::string::npos)
            << bf16.err;
        const CliResult exact = run_glm5(gen);
        ASSERT_EQ(exact.code, 0) << exact.err;
        EXPECT_EQ(bf16.out, exact.out);
    } else {
        EXPECT_EQ(bf16.code, 2);
        EXPECT_NE(bf16.err.find("needs AMX-BF16 tiles or AVX-512 BF16"), std::string::npos)
            << bf16.err;
    }
}

}  // namespace

namespace {

std::string last_line(const std::string& s) {
    size_t end = s.find_last_not_of('\n');
    if (end == std::string::npos) return "";
    const size_t b = s.rfind('\n', end);
    return s.substr(b == std::string::npos ? 0 : b + 1,
                    end + 1 - (b == std::string::npos ? 0 : b + 1));
}

}  // namespace

// Memory planning under simulated memory: with no --ctx-size the context is
// the largest that fits (said in one line); a named context that does not fit
// is refused with exit code 2, its numbers and a --ctx-size that does fit as
// the last line, and that remedy loads and generates; MAX_CONTEXT names one too.
TEST(CliMemory, AutomaticContextRefusalAndItsRemedy) {
    const std::string env = "GLM5_MEM_AVAILABLE=" + std::to_string(600ull << 20);
    const std::string base = "run --model " + kTiny + " --tokens 1,2,3 -n 2 --print-ids";
    CliResult r = run_glm5(base, "", env);
    ASSERT_EQ(r.code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m,
                                  std::regex("glm5: context (\\d+) tokens \\(the GGUF "
                                             "advertises 1048576\\)")))
        << r.err;
    const long long n_auto = std::stoll(m[1]);
    EXPECT_GT(n_auto, 4096);
    EXPECT_LT(n_auto, 1048576);

    r = run_glm5(base + " --ctx-size 1000000", "", env);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(r.out.empty());
    const std::string last = last_line(r.err);
    EXPECT_NE(last.find("600.00 MiB is available"), std::string::npos) << last;
    ASSERT_TRUE(std::regex_search(last, m, std::regex("--ctx-size (\\d+)"))) << last;
    const std::string remedy = m[0];
    EXPECT_NEAR(double(std::stoll(m[1])), double(n_auto), 2.0 * 256) << last;

    r = run_glm5(base + " " + remedy, "", env);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ' '), 1) << "two ids: " << r.out;

    r = run_glm5(base, "", env + " MAX_CONTEXT=1000000");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(last_line(r.err).find("--ctx-size"), std::string::npos) << r.err;
    r = run_glm5(base, "", env + " MAX_CONTEXT=lots");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("MAX_CONTEXT"), std::string::npos) << r.err;
    r = run_glm5(base, "", env + " MAX_CONTEXT=2048");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("glm5: context 2048 tokens (MAX_CONTEXT"), std::string::npos) << r.err;
}

TEST(CliMemory, InspectPrintsThePlan) {
    const std::string env = "GLM5_MEM_AVAILABLE=" + std::to_string(600ull << 20);
    CliResult r = run_glm5("inspect " + kTiny + " --plan --parallel 2 --ctx-size 4096", "", env);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("memory plan: 2 slots x 4096 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("caches: 2 x 4096 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fits"), std::string::npos) << r.out;
    r = run_glm5("inspect " + kTiny + " --plan --parallel 4 --ctx-size 500000", "", env);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.out.find("does not fit"), std::string::npos) << r.out;
    EXPECT_NE(last_line(r.err).find("--ctx-size"), std::string::npos) << r.err;
}

// llama.cpp's command lines: its spellings are the same flags here (same output), its
// flags that mean nothing here say so once and go on (-ngl: test_cli_gpu.cpp), -hf is
// refused with the reason,
// --mlock locks the model in memory, and --reasoning-budget bounds the reasoning.
TEST(CliRun, LlamaCppFlags) {
    const std::string base = "run --model " + kTiny + " -p \"Hello\" -n 8";
    const CliResult ours = run_glm5(base + " --temp 0.7 --seed 3 --system Hi --ubatch 64");
    ASSERT_EQ(ours.code, 0) << ours.err;
    const CliResult theirs =
        run_glm5(base + " --temperature 0.7 -s 3 -sys Hi -ub 64 -fa on --jinja -cnv -ngl 0");
    ASSERT_EQ(theirs.code, 0) << theirs.err;
    EXPECT_EQ(theirs.out, ours.out);
    for (const char* f :
         {"-fa means nothing here", "--jinja means nothing here", "-cnv means nothing here"}) {
        const size_t at = theirs.err.find(f);
        EXPECT_NE(at, std::string::npos) << f << "\n" << theirs.err;
        EXPECT_EQ(theirs.err.find(f, at + 1), std::string::npos) << f << " said twice";
    }
    const CliResult hf = run_glm5("run -hf ggml-org/model -p hi");
    EXPECT_EQ(hf.code, 2);
    EXPECT_NE(hf.err.find("downloads nothing"), std::string::npos) << hf.err;
    // The penalties and their window, as flags.
    EXPECT_EQ(
        run_glm5(base + " --presence-penalty 0.5 --frequency-penalty 0.5 --repeat-last-n 32").code,
        0);
    EXPECT_EQ(run_glm5(base + " --presence-penalty 3").code, 2);
}

TEST(CliRun, MlockLocksTheModel) {
    const CliResult r = run_glm5("run --model " + kTiny + " -p \"Hello\" -n 2 --mlock");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("locked in memory"), std::string::npos) << r.err;
}

TEST(CliRun, ReasoningBudgetBoundsTheReasoning) {
    // Greedy: with a budget of 3 the reasoning is the first 3 tokens of the unbounded one.
    const std::string base = "run --model " + kTiny + " -p \"Hello\" -n 24 --temp 0 --think";
    const CliResult open = run_glm5(base);
    const CliResult bounded = run_glm5(base + " --reasoning-budget 3");
    ASSERT_EQ(open.code, 0) << open.err;
    ASSERT_EQ(bounded.code, 0) << bounded.err;
    // The reply after the reasoning goes to stdout: a bounded one answers sooner.
    EXPECT_NE(open.out, bounded.out);
    EXPECT_FALSE(bounded.out.empty());
}

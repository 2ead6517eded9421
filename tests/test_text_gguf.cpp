// The text layer on the fixture GGUFs: tokenizer and chat format read from the files,
// the goldens of both architectures, and `glm5 tokenize` end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"

using namespace glm5::text;
using nlohmann::json;

namespace {

const std::string kData = GLM5_TEST_DATA;
const std::string kDsa = kData + "/glm-dsa/tiny.gguf";
const std::string kNext = kData + "/glm5next/tiny.gguf";

json load_json(const std::string& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    return json::parse(f);
}

struct Loaded {
    std::unique_ptr<glm5::gguf::File> file;
    std::unique_ptr<Tokenizer> tok;
};

Loaded load(const std::string& path) {
    Loaded l;
    l.file = glm5::gguf::File::open(path);
    l.tok = Tokenizer::from_gguf(*l.file);
    return l;
}

struct CmdResult {
    int rc = -1;
    std::string out, err;
};

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

CmdResult run_glm5(const std::vector<std::string>& args) {
    // One file per call: ctest runs the tests of this binary in parallel processes.
    std::string err_path = ::testing::TempDir() + "/glm5_tokenize_stderr_XXXXXX";
    const int fd = mkstemp(err_path.data());
    if (fd >= 0) close(fd);
    std::string cmd = shell_quote(GLM5_BINARY);
    for (const std::string& a : args) cmd += " " + shell_quote(a);
    cmd += " 2>" + shell_quote(err_path);
    CmdResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(err_path);
    r.err.assign(std::istreambuf_iterator<char>(e), {});
    std::remove(err_path.c_str());
    return r;
}

}  // namespace

TEST(TextGguf, GlmDsaFixtureMatchesLlamaCppGolden) {
    Loaded l = load(kDsa);
    const json g = load_json(kData + "/glm-dsa/tokenization.golden.json");
    ASSERT_GE(g["cases"].size(), 10u);
    for (const json& c : g["cases"]) {
        const std::string text = c["text"].get<std::string>();
        SCOPED_TRACE(text);
        EXPECT_EQ(l.tok->encode(text, true), c["ids"].get<std::vector<TokenId>>());
        EXPECT_EQ(l.tok->encode(text, false),
                  c["ids_no_parse_special"].get<std::vector<TokenId>>());
        EXPECT_EQ(l.tok->decode(l.tok->encode(text)), text);
    }
    const SpecialTokens& s = l.tok->special();
    EXPECT_EQ(s.bos, 744);  // [gMASK]
    EXPECT_EQ(s.eos, 742);
    EXPECT_EQ(s.eot, 749);
    EXPECT_EQ(s.eom, 751);
    EXPECT_EQ(s.unk, 742);
    EXPECT_EQ(s.pad, 742);
    EXPECT_EQ(l.tok->stop_ids(), (std::vector<TokenId>{742, 749, 751}));
    EXPECT_EQ(l.tok->token_text(s.eot), "<|user|>");
    EXPECT_EQ(l.tok->token_text(s.eom), "<|observation|>");
}

TEST(TextGguf, Glm5NextFixtureMatchesGolden) {
    Loaded l = load(kNext);
    const json g = load_json(kData + "/glm5next/tiny.golden.json");
    ASSERT_FALSE(g["tokenize"].empty());
    for (const json& c : g["tokenize"]) {
        const std::string text = c["text"].get<std::string>();
        SCOPED_TRACE(text);
        EXPECT_EQ(l.tok->encode(text), c["ids"].get<std::vector<TokenId>>());
        EXPECT_EQ(l.tok->decode(l.tok->encode(text)), text);
    }
    // The prompts' informational decodes agree with their token ids.
    for (const json& p : g["prompts"])
        EXPECT_EQ(l.tok->decode(p["tokens"].get<std::vector<TokenId>>()),
                  p["text"].get<std::string>());
    EXPECT_EQ(l.tok->n_vocab(), g["n_vocab"].get<int>());
    const std::vector<TokenId> stops = l.tok->stop_ids();
    ASSERT_EQ(stops.size(), 3u);
    EXPECT_EQ(l.tok->token_text(stops[0]), "<|endoftext|>");
    EXPECT_EQ(l.tok->token_text(stops[1]), "<|user|>");
    EXPECT_EQ(l.tok->token_text(stops[2]), "<|observation|>");
    EXPECT_FALSE(l.tok->is_stop(l.tok->find("<|assistant|>")));
}

TEST(TextGguf, ChatFormatFromFixtures) {
    Loaded dsa = load(kDsa);
    ChatFormat f = ChatFormat::from_gguf(*dsa.file);
    EXPECT_EQ(f.style(), ChatStyle::GlmDsa);
    // The fixture's template is GLM-4.5-shaped (newline after every role token): reported.
    EXPECT_FALSE(f.chat_template().empty());
    EXPECT_NE(f.template_warning().find("newline after <|user|>"), std::string::npos)
        << f.template_warning();

    Loaded next = load(kNext);
    ChatFormat g = ChatFormat::from_gguf(*next.file);
    EXPECT_EQ(g.style(), ChatStyle::Glm5Next);
    EXPECT_EQ(g.template_warning(), "");  // no template in the file: nothing to compare
}

TEST(TextGguf, RenderedPromptTokenizes) {
    Loaded l = load(kDsa);
    ChatMessage u;
    u.role = "user";
    u.content = "Hello";
    const RenderedPrompt p = ChatFormat(ChatStyle::GlmDsa).render({u});
    // [gMASK] <sop> <|user|> He ll o <|assistant|> <think> </think>; "Hello" as in the golden.
    EXPECT_EQ(l.tok->encode(p.text),
              (std::vector<TokenId>{744, 746, 749, 615, 281, 78, 750, 758, 759}));
}

TEST(TextGguf, TokenizeCommand) {
    CmdResult r = run_glm5({"tokenize", "--model", kDsa, "--text", "Hello world"});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, "[615,281,78,444,320]\n");

    r = run_glm5({"tokenize", "-m", kDsa, "--text", "<|user|>\nWhat"});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(json::parse(r.out), json::parse("[749,198,54,71,293]"));
    r = run_glm5({"tokenize", "-m", kDsa, "--text", "<|user|>", "--no-parse-special"});
    EXPECT_EQ(r.rc, 0) << r.err;
    for (int id : json::parse(r.out)) EXPECT_LT(id, 742);

    r = run_glm5({"tokenize", "-m", kDsa, "--text", "Hello 東", "--pieces"});
    EXPECT_EQ(r.rc, 0) << r.err;
    const json pieces = json::parse(r.out);
    ASSERT_GE(pieces.size(), 4u);
    EXPECT_EQ(pieces[0]["id"], 615);
    EXPECT_EQ(pieces[0]["piece"], "He");
    EXPECT_EQ(pieces[0]["text"], "He");
    // 東 has no merged token in this vocabulary: its bytes come one token each.
    const json& last = pieces.back();
    ASSERT_TRUE(last.contains("bytes"));
    EXPECT_EQ(last["bytes"], json::parse("[177]"));

    // Text from a file.
    std::string path = ::testing::TempDir() + "/glm5_tokenize_input_XXXXXX";
    const int fd = mkstemp(path.data());
    ASSERT_GE(fd, 0);
    close(fd);
    std::ofstream(path) << "Hello world";
    r = run_glm5({"tokenize", "-m", kNext, "--file", path});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(json::parse(r.out), json::parse("[72, 266, 108, 111, 262, 271, 108, 100]"));
    std::remove(path.c_str());
}

TEST(TextGguf, TokenizeCommandErrors) {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"tokenize", "--model", kData + "/no-such-file.gguf", "--text",
                                   "x"},
          {"tokenize", "--text", "x"},
          {"tokenize", "--model", kDsa},
          {"tokenize", "--model", kDsa, "--text", "x", "--file", "y"},
          {"tokenize", "--model", kDsa, "--text", "x", "--bogus"},
          {"tokenize", "--model", kData + "/glm-dsa/vocab.json", "--text", "x"}}) {
        CmdResult r = run_glm5(args);
        EXPECT_EQ(r.rc, 2) << args.back();
        EXPECT_TRUE(r.out.empty());
        ASSERT_FALSE(r.err.empty());
        EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // exactly one line
    }
    CmdResult h = run_glm5({"tokenize", "--help"});
    EXPECT_EQ(h.rc, 0);
    EXPECT_NE(h.out.find("--no-parse-special"), std::string::npos);
}

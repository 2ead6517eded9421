// `glm5 inspect` end to end: runs the built binary and checks its report, the
// JSON of --tensor/--values, and that every failure is one line on stderr
// with exit code 2 and nothing on stdout.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using glm5::gguf::File;

namespace {

const std::string kData = GLM5_TEST_DATA;

struct CliResult {
    int rc = -1;
    std::string out, err;
};

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

CliResult inspect(const std::vector<std::string>& args) {
    const std::string err_path =
        (fs::temp_directory_path() / ("glm5_inspect_err_" + std::to_string(::getpid()))).string();
    std::string cmd = quote(GLM5_BINARY) + " inspect";
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " 2>" + quote(err_path);
    CliResult r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = slurp(err_path);
    fs::remove(err_path);
    return r;
}

// Floats of a JSON array, as the float32 each decimal reads back to.
std::vector<float> json_floats(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    std::vector<float> v;
    for (const auto& x : j) v.push_back(float(x.get<double>()));
    return v;
}

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}

void expect_usage_failure(const CliResult& r, const std::string& needle) {
    EXPECT_EQ(r.rc, 2);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    // One line.
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

}  // namespace

TEST(Inspect, ReportOnTiny) {
    const CliResult r = inspect({kData + "/glm-dsa/tiny.gguf"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    for (const char* s : {"gguf version           3",
                          "architecture           glm-dsa",
                          "hyperparameters (glm-dsa.*)",
                          "  block_count ",
                          "attention.indexer.types",
                          "[true, true, false, true, false, false]",
                          "model                \"gpt2\"",
                          "pre                  \"glm4\"",
                          "vocab size           768",
                          "merges               486",
                          "bos id               744 \"[gMASK]\"",
                          "eos id               742 \"<|endoftext|>\"",
                          "eot id               749 \"<|user|>\"",
                          "eom id               751 \"<|observation|>\"",
                          "chat template        present, ",
                          "blk.0.attn_k_b.weight",
                          "[32, 32, 4]",
                          "tensors              143",
                          "parameters           1018000 (1.02 M)",
                          "types                F32: 143"})
        EXPECT_NE(r.out.find(s), std::string::npos) << "missing: " << s << "\n" << r.out;
    // block_count's value is on its line.
    const size_t bc = r.out.find("  block_count ");
    ASSERT_NE(bc, std::string::npos);
    const std::string bc_line = r.out.substr(bc, r.out.find('\n', bc) - bc);
    EXPECT_EQ(bc_line.substr(bc_line.find_last_of(' ') + 1), "7");
    // The chat template's length is the metadata string's.
    const auto f = File::open(kData + "/glm-dsa/tiny.gguf");
    const std::string tmpl_len =
        std::to_string(f->get_string("tokenizer.chat_template").size()) + " bytes";
    EXPECT_NE(r.out.find("present, " + tmpl_len), std::string::npos);
    // Every tensor is listed with its shape, type and byte count.
    for (const auto& t : f->tensors()) {
        const size_t pos = r.out.find("  " + t.name + " ");
        ASSERT_NE(pos, std::string::npos) << t.name;
        const std::string row = r.out.substr(pos, r.out.find('\n', pos) - pos);
        EXPECT_NE(row.find(t.shape_string()), std::string::npos) << row;
        EXPECT_NE(row.find(" " + std::to_string(t.nbytes)), std::string::npos) << row;
    }
}

TEST(Inspect, TypeSummaryOfQ4KM) {
    const CliResult r = inspect({kData + "/glm-dsa/small-q4_k_m.gguf"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("types                F32: 30, Q4_K: 45, Q5_0: 4, Q6_K: 5"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("tensors              84"), std::string::npos);
    EXPECT_NE(r.out.find("parameters           5912328 (5.91 M)"), std::string::npos);
}

TEST(Inspect, ValuesOfAnF32TensorAreItsBytes) {
    const std::string path = kData + "/glm-dsa/tiny.gguf";
    const auto f = File::open(path);
    const auto* t = f->find_tensor("blk.0.attn_q_b.weight");  // [32, 192]: 16 values span one row
    ASSERT_NE(t, nullptr);
    auto raw = [&](size_t i) {
        float x;
        std::memcpy(&x, t->data + 4 * i, 4);
        return x;
    };

    CliResult r = inspect({path, "--tensor", t->name});
    ASSERT_EQ(r.rc, 0) << r.err;
    std::vector<float> v = json_floats(r.out);
    ASSERT_EQ(v.size(), 16u);  // the default
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], raw(i)) << i;

    // Across row boundaries, bit-exact through the shortest decimal.
    r = inspect({path, "--tensor", t->name, "--values", "100"});
    ASSERT_EQ(r.rc, 0) << r.err;
    v = json_floats(r.out);
    ASSERT_EQ(v.size(), 100u);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bits(v[i]), bits(raw(i))) << i;

    r = inspect({path, "--tensor", "blk.0.attn_norm.weight", "--values", "all"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(json_floats(r.out).size(), 64u);
    r = inspect({path, "--tensor", "blk.0.attn_norm.weight", "--values", "100000"});
    EXPECT_EQ(json_floats(r.out).size(), 64u);
    r = inspect({path, "--values=0", "--tensor=blk.0.attn_norm.weight"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, "[]\n");
}

// Dequantized values match the reference dequantization in dequant.golden.json.
TEST(Inspect, QuantizedValuesMatchTheGolden) {
    std::ifstream gj(kData + "/dequant.golden.json");
    const auto golden = nlohmann::json::parse(gj);
    int checked = 0;
    for (const auto& [file, types] : golden["files"].items()) {
        for (const auto& [type, entry] : types.items()) {
            const std::string tensor = entry["tensor"].get<std::string>();
            const auto& want = entry["values"];
            const CliResult r = inspect(
                {kData + "/" + file, "--tensor", tensor, "--values", std::to_string(want.size())});
            ASSERT_EQ(r.rc, 0) << file << " " << type << ": " << r.err;
            const std::vector<float> got = json_floats(r.out);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(got[i], float(want[i].get<double>()))
                    << file << " " << type << " [" << i << "]";
            ++checked;
        }
    }
    EXPECT_EQ(checked, 68);  // every (file, type) pair: 14 files, 19 formats
}

TEST(Inspect, FailuresExitTwoWithOneLine) {
    const std::string tiny = kData + "/glm-dsa/tiny.gguf";
    expect_usage_failure(inspect({"/no/such/file.gguf"}), "/no/such/file.gguf");
    expect_usage_failure(inspect({tiny, "--tensor", "no.such.tensor"}),
                         "no tensor named 'no.such.tensor'");
    expect_usage_failure(inspect({tiny, "--bogus"}), "--bogus");
    expect_usage_failure(inspect({tiny, "--tensor", "output.weight", "--values", "-3"}),
                         "--values");
    expect_usage_failure(inspect({tiny, "--tensor", "output.weight", "--values", "many"}),
                         "--values");
    expect_usage_failure(inspect({tiny, "--values", "3"}), "--values needs --tensor");
    expect_usage_failure(inspect({}), "FILE");

    // A damaged file: the error names the file, the field and the byte offset.
    const fs::path bad =
        fs::temp_directory_path() / ("glm5_inspect_bad_" + std::to_string(::getpid()) + ".gguf");
    std::string bytes = slurp(tiny);
    bytes.resize(bytes.size() / 2);
    bytes[4] = 7;  // version
    std::ofstream(bad, std::ios::binary) << bytes;
    const CliResult r = inspect({bad.string()});
    fs::remove(bad);
    expect_usage_failure(r, bad.string() + ": version at byte 4: unsupported GGUF version 7");
}

// tiny.gguf rewritten as three shards: the report covers all of them and
// --tensor finds a tensor in the last shard.
TEST(Inspect, SplitModel) {
    const fs::path dir =
        fs::temp_directory_path() / ("glm5_inspect_split_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const auto f = File::open(kData + "/glm-dsa/tiny.gguf");
    glm5::gguf::Writer w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors())
        w.add_tensor_bytes(t.name, t.type, {t.ne.begin(), t.ne.begin() + t.n_dims}, t.data,
                           t.nbytes);
    const auto paths = w.write_split((dir / "tiny").string(), {1536 * 1024, 0, {}});
    ASSERT_EQ(paths.size(), 3u);

    CliResult r = inspect({paths[0]});
    ASSERT_EQ(r.rc, 0) << r.err;
    for (const std::string& s :
         {std::string("files                  3 shards"), paths[2],
          std::string("tensors              143"),
          std::string("parameters           1018000 (1.02 M)"),
          std::string("architecture           glm-dsa"), std::string("split.count")})
        EXPECT_NE(r.out.find(s), std::string::npos) << "missing: " << s << "\n" << r.out;

    const auto& last = f->tensors().back();
    r = inspect({paths[0], "--tensor", last.name, "--values", "8"});
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<float> v = json_floats(r.out);
    ASSERT_EQ(v.size(), 8u);
    for (size_t i = 0; i < v.size(); ++i) {
        float x;
        std::memcpy(&x, last.data + 4 * i, 4);
        EXPECT_EQ(bits(v[i]), bits(x)) << i;
    }
    fs::remove_all(dir);
}

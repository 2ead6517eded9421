// GGUF reader on the fixtures (facts from tests/data and the fixtures README),
// typed getters, and writer round trips: every value type, nested arrays,
// several alignments and tensor types, split models.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace fs = std::filesystem;
using namespace glm5::gguf;
using glm5::quant::Type;

namespace {

const std::string kData = GLM5_TEST_DATA;

std::map<std::string, int> type_counts(const File& f) {
    std::map<std::string, int> m;
    for (const auto& t : f.tensors()) ++m[glm5::quant::name(t.type)];
    return m;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A fresh directory per test, removed afterwards.
class TempDir {
  public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        path_ = fs::temp_directory_path() /
                ("glm5_gguf_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() { fs::remove_all(path_); }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

  private:
    fs::path path_;
};

}  // namespace

TEST(GgufFixtures, TinyFacts) {
    const auto f = File::open(kData + "/glm-dsa/tiny.gguf");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->n_shards(), 1);
    EXPECT_EQ(f->total_file_bytes(), fs::file_size(kData + "/glm-dsa/tiny.gguf"));
    EXPECT_EQ(f->get_string("general.architecture"), "glm-dsa");
    EXPECT_EQ(f->get_uint("glm-dsa.block_count"), 7u);
    EXPECT_EQ(f->get_uint("glm-dsa.embedding_length"), 64u);
    EXPECT_EQ(f->get_uint("glm-dsa.attention.head_count"), 4u);
    EXPECT_EQ(f->get_uint("glm-dsa.attention.head_count_kv"), 1u);
    EXPECT_EQ(f->get_uint("glm-dsa.attention.key_length_mla"), 48u);
    EXPECT_EQ(f->get_uint("glm-dsa.attention.indexer.head_count"), 16u);
    EXPECT_EQ(f->get_uint("glm-dsa.expert_count"), 16u);
    EXPECT_EQ(f->get_uint("glm-dsa.context_length"), 1048576u);
    EXPECT_EQ(f->get_float("glm-dsa.rope.freq_base"), 8e6);
    EXPECT_EQ(float(f->get_float("glm-dsa.attention.layer_norm_rms_epsilon")), 1e-5f);
    EXPECT_EQ(f->get_float("glm-dsa.expert_weights_scale"), 2.5);
    EXPECT_TRUE(f->get_bool("glm-dsa.expert_weights_norm", false));

    const Value* types = f->find("glm-dsa.attention.indexer.types");
    ASSERT_NE(types, nullptr);
    ASSERT_TRUE(types->is_array());
    std::vector<int> full;
    for (const auto& v : types->items())
        full.push_back(v.as_bool() ? int(*v.as_bool()) : int(*v.as_uint()));
    EXPECT_EQ(full, (std::vector<int>{1, 1, 0, 1, 0, 0}));

    // Shapes in ggml order, per the README's tensor list.
    auto shape = [&](const std::string& name) {
        const TensorInfo* t = f->find_tensor(name);
        return t ? t->shape_string() : "missing";
    };
    EXPECT_EQ(shape("blk.0.attn_k_b.weight"), "[32, 32, 4]");
    EXPECT_EQ(shape("blk.0.attn_v_b.weight"), "[32, 32, 4]");
    EXPECT_EQ(shape("blk.0.attn_q_b.weight"), "[32, 192]");
    EXPECT_EQ(shape("blk.0.attn_kv_a_mqa.weight"), "[64, 48]");
    EXPECT_EQ(shape("blk.2.ffn_gate_exps.weight"), "[64, 32, 16]");
    EXPECT_EQ(shape("blk.2.ffn_down_exps.weight"), "[32, 64, 16]");
    EXPECT_EQ(shape("blk.6.nextn.eh_proj.weight"), "[128, 64]");
    EXPECT_EQ(shape("token_embd.weight"), "[64, 768]");
    EXPECT_EQ(shape("output.weight"), "[64, 768]");
    // Shared-indexer layers (2, 4, 5) carry no indexer tensors; full ones do.
    EXPECT_NE(f->find_tensor("blk.3.indexer.proj.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.2.indexer.proj.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.5.indexer.attn_k.weight"), nullptr);

    // hparams.json: tiny has 1,018,000 parameters, all F32; the golden agrees on the types.
    int64_t params = 0;
    for (const auto& t : f->tensors()) params += t.nelements();
    EXPECT_EQ(params, 1018000);
    std::ifstream gj(kData + "/glm-dsa/tiny.golden.json");
    const auto golden = nlohmann::json::parse(gj);
    std::map<std::string, int> want = golden["tensor_types"].get<std::map<std::string, int>>();
    EXPECT_EQ(type_counts(*f), want);

    // Tensor bytes are served in place: F32 rows read back as floats.
    const TensorInfo* norm = f->find_tensor("blk.0.attn_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->nbytes, 64u * 4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(norm->data) % f->alignment(), 0u);
    float w0;
    std::memcpy(&w0, norm->data, 4);
    EXPECT_NEAR(w0, 1.0f, 0.3f);  // norms are 1 + 0.05 N(0, 1)
}

TEST(GgufFixtures, Tokenizer) {
    const auto f = File::open(kData + "/glm-dsa/tiny.gguf");
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "glm4");
    const Value* tokens = f->find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->array_type(), ValueType::STRING);
    ASSERT_EQ(tokens->size(), 768u);
    EXPECT_EQ(*(*tokens)[0].as_string(), "!");
    EXPECT_EQ(*(*tokens)[744].as_string(), "[gMASK]");
    EXPECT_EQ(*(*tokens)[767].as_string(), "</arg_value>");
    EXPECT_EQ(f->find("tokenizer.ggml.merges")->size(), 486u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.bos_token_id"), 744u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.eos_token_id"), 742u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.eot_token_id"), 749u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.eom_token_id"), 751u);
    EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token", true));
    EXPECT_EQ(f->get_string("tokenizer.chat_template").rfind("[gMASK]<sop>", 0), 0u);

    // vocab.json is the same vocabulary.
    std::ifstream vj(kData + "/glm-dsa/vocab.json");
    const auto vocab = nlohmann::json::parse(vj);
    if (vocab.contains("tokens")) {
        ASSERT_EQ(vocab["tokens"].size(), tokens->size());
        for (size_t i = 0; i < tokens->size(); ++i)
            ASSERT_EQ(vocab["tokens"][i].get<std::string>(), *(*tokens)[i].as_string()) << i;
    }
}

TEST(GgufFixtures, SmallQ4KM) {
    const auto f = File::open(kData + "/glm-dsa/small-q4_k_m.gguf");
    const std::map<std::string, int> want = {{"Q4_K", 45}, {"Q6_K", 5}, {"Q5_0", 4}, {"F32", 30}};
    EXPECT_EQ(type_counts(*f), want);
    EXPECT_EQ(f->find("tokenizer.ggml.tokens")->size(), 768u);
    EXPECT_EQ(f->get_uint("glm-dsa.block_count"), 4u);
    EXPECT_EQ(f->find_tensor("blk.0.attn_k_b.weight")->type, Type::Q5_0);
    EXPECT_EQ(f->find_tensor("blk.0.attn_k_b.weight")->shape_string(), "[64, 256, 4]");
    EXPECT_EQ(f->find_tensor("output.weight")->type, Type::Q6_K);
}

// Every fixture opens; the tensors tile the data section (ggml writes them
// back to back, padded), and each golden's tensor_types matches.
TEST(GgufFixtures, AllFilesOpenAndTensorsTileTheData) {
    size_t n_files = 0;
    for (const char* dir : {"glm-dsa", "quant", "glm5next"}) {
        for (const auto& e : fs::directory_iterator(kData + "/" + dir)) {
            if (e.path().extension() != ".gguf") continue;
            ++n_files;
            const std::string path = e.path().string();
            const auto f = File::open(path);
            ASSERT_FALSE(f->tensors().empty()) << path;
            const auto bytes = fs::file_size(path);
            uint64_t expect_offset = 0;
            for (const auto& t : f->tensors()) {
                EXPECT_EQ(t.offset, expect_offset) << path << " " << t.name;
                EXPECT_EQ(t.nbytes, t.row_bytes() * size_t(t.nrows())) << t.name;
                expect_offset =
                    (t.offset + t.nbytes + f->alignment() - 1) / f->alignment() * f->alignment();
            }
            // Served in place: data pointers keep the file's relative offsets.
            const auto& first = f->tensors().front();
            for (const auto& t : f->tensors())
                ASSERT_EQ(t.data - first.data, ptrdiff_t(t.offset - first.offset)) << t.name;
            const auto& last = f->tensors().back();
            EXPECT_LE(last.offset + last.nbytes, bytes);
            const fs::path golden = fs::path(path).replace_extension(".golden.json");
            if (fs::exists(golden) && std::string(dir) == "glm-dsa") {
                std::ifstream gj(golden);
                const auto g = nlohmann::json::parse(gj);
                EXPECT_EQ(type_counts(*f), (g["tensor_types"].get<std::map<std::string, int>>()))
                    << path;
                if (g.contains("file_size")) {
                    EXPECT_EQ(g["file_size"].get<uint64_t>(), bytes);
                }
            }
        }
    }
    EXPECT_GE(n_files, 17u);
}

TEST(GgufGetters, TypeErrorsNameKeyAndOffset) {
    const auto f = File::open(kData + "/glm-dsa/tiny.gguf");
    EXPECT_EQ(f->get_uint("no.such.key", 5), 5u);
    EXPECT_EQ(f->get_string("no.such.key", "x"), "x");
    EXPECT_EQ(f->get_float("no.such.key", 1.5), 1.5);
    EXPECT_TRUE(f->get_bool("no.such.key", true));
    try {
        f->get_uint("no.such.key");
        FAIL();
    } catch (const FormatError& e) {
        EXPECT_NE(std::string(e.what()).find("'no.such.key' is missing"), std::string::npos)
            << e.what();
    }
    try {
        f->get_uint("general.architecture");
        FAIL();
    } catch (const FormatError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("tiny.gguf: metadata 'general.architecture' at byte "), std::string::npos)
            << m;
        EXPECT_NE(m.find("is STRING"), std::string::npos) << m;
    }
    EXPECT_THROW(f->get_string("glm-dsa.block_count"), FormatError);
    EXPECT_THROW(f->get_bool("glm-dsa.block_count", false), FormatError);
    EXPECT_THROW(f->get_float("tokenizer.ggml.tokens"), FormatError);
    // Integers convert to float, not the other way round.
    EXPECT_EQ(f->get_float("glm-dsa.block_count"), 7.0);
    EXPECT_THROW(f->get_uint("glm-dsa.rope.freq_base"), FormatError);
}

TEST(GgufValue, CheckedAccess) {
    const Value neg = Value::make_int(ValueType::I32, -3);
    EXPECT_FALSE(neg.as_uint().has_value());
    EXPECT_EQ(*neg.as_int(), -3);
    EXPECT_EQ(*neg.as_float(), -3.0);
    const Value big = Value::make_uint(ValueType::U64, ~uint64_t(0));
    EXPECT_FALSE(big.as_int().has_value());
    EXPECT_EQ(*big.as_uint(), ~uint64_t(0));
    EXPECT_FALSE(Value::make_bool(true).as_uint().has_value());
    EXPECT_FALSE(Value::make_string("7").as_int().has_value());
    EXPECT_EQ(Value::make_string("7").as_bool(), std::nullopt);
    EXPECT_EQ(Value::make_float(ValueType::F32, 0.1).as_float(), double(0.1f));

    std::vector<Value> items;
    for (int i = 0; i < 20; ++i) items.push_back(Value::make_int(ValueType::I32, i));
    const Value arr = Value::make_array(ValueType::I32, items);
    EXPECT_EQ(arr.to_display(3), "[0, 1, 2, ...] (20 items of I32)");
    EXPECT_EQ(Value::make_string("a\"b\n").to_display(), "\"a\\\"b\\n\"");
    EXPECT_EQ(Value::make_float(ValueType::F32, 1e-5).to_display(), "1e-05");
    EXPECT_EQ(Value::make_array(ValueType::ARRAY,
                                {Value::make_array(ValueType::BOOL, {Value::make_bool(false)})})
                  .to_display(),
              "[[false]]");
    const std::string long_str(300, 'x');
    EXPECT_EQ(Value::make_string(long_str).to_display(),
              "\"" + std::string(80, 'x') + "\"... (300 bytes)");
}

namespace {

// Deterministic bytes for tensor contents.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> b(n);
    std::mt19937 rng(seed);
    for (auto& x : b) x = uint8_t(rng());
    return b;
}

Value arr(ValueType t, std::vector<Value> v) {
    return Value::make_array(t, std::move(v));
}

// Every value type, scalar and as an array, plus nested arrays, in the order set.
std::vector<std::pair<std::string, Value>> all_values() {
    using V = Value;
    return {
        {"general.architecture", V::make_string("roundtrip")},
        {"t.u8", V::make_uint(ValueType::U8, 255)},
        {"t.i8", V::make_int(ValueType::I8, -128)},
        {"t.u16", V::make_uint(ValueType::U16, 65535)},
        {"t.i16", V::make_int(ValueType::I16, -32768)},
        {"t.u32", V::make_uint(ValueType::U32, 4000000000u)},
        {"t.i32", V::make_int(ValueType::I32, -2000000000)},
        {"t.f32", V::make_float(ValueType::F32, 3.25f)},
        {"t.bool", V::make_bool(true)},
        {"t.string", V::make_string(std::string("h\xc3\xa9llo\0x", 8))},
        {"t.u64", V::make_uint(ValueType::U64, ~uint64_t(0))},
        {"t.i64", V::make_int(ValueType::I64, INT64_MIN)},
        {"t.f64", V::make_float(ValueType::F64, 1.0 / 3.0)},
        {"t.a.string",
         arr(ValueType::STRING, {V::make_string("a"), V::make_string(""), V::make_string("ccc")})},
        {"t.a.i32",
         arr(ValueType::I32, {V::make_int(ValueType::I32, 1), V::make_int(ValueType::I32, -2)})},
        {"t.a.u32", arr(ValueType::U32, {V::make_uint(ValueType::U32, 7)})},
        {"t.a.f32", arr(ValueType::F32,
                        {V::make_float(ValueType::F32, 0.5f), V::make_float(ValueType::F32, -0.0f),
                         V::make_float(ValueType::F32, 1e-30f)})},
        {"t.a.bool",
         arr(ValueType::BOOL, {V::make_bool(true), V::make_bool(false), V::make_bool(true)})},
        {"t.a.u8", arr(ValueType::U8, {V::make_uint(ValueType::U8, 9)})},
        {"t.a.i8", arr(ValueType::I8, {V::make_int(ValueType::I8, -9)})},
        {"t.a.u16", arr(ValueType::U16, {V::make_uint(ValueType::U16, 999)})},
        {"t.a.i16", arr(ValueType::I16, {V::make_int(ValueType::I16, -999)})},
        {"t.a.u64", arr(ValueType::U64, {V::make_uint(ValueType::U64, 1ull << 40)})},
        {"t.a.i64", arr(ValueType::I64, {V::make_int(ValueType::I64, -(1ll << 40))})},
        {"t.a.f64", arr(ValueType::F64, {V::make_float(ValueType::F64, 2.5e300)})},
        {"t.a.empty", arr(ValueType::STRING, {})},
        {"t.nested",
         arr(ValueType::ARRAY,
             {arr(ValueType::STRING, {V::make_string("x"), V::make_string("yz")}),
              arr(ValueType::U8, {}),
              arr(ValueType::ARRAY, {arr(ValueType::F32, {V::make_float(ValueType::F32, 1.5)})})})},
    };
}

// Sets all_values(), through the typed convenience setters where one exists.
void set_all_types(Writer& w) {
    for (const auto& [k, v] : all_values()) w.set(k, v);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_f32("t.f32", 3.25f);
    w.set_bool("t.bool", true);
    w.set_string("t.string", std::string("h\xc3\xa9llo\0x", 8));
    w.set_u64("t.u64", ~uint64_t(0));
    w.set_array_string("t.a.string", {"a", "", "ccc"});
    w.set_array_i32("t.a.i32", {1, -2});
    w.set_array_u32("t.a.u32", {7});
    w.set_array_f32("t.a.f32", {0.5f, -0.0f, 1e-30f});
    w.set_array_bool("t.a.bool", {true, false, true});
}

bool bit_equal(double x, double y) {
    return std::memcmp(&x, &y, sizeof x) == 0;
}

bool same_value(const Value& a, const Value& b) {
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
        if (a.array_type() != b.array_type() || a.size() != b.size()) return false;
        for (size_t i = 0; i < a.size(); ++i)
            if (!same_value(a[i], b[i])) return false;
        return true;
    }
    if (a.as_string()) return *a.as_string() == *b.as_string();
    if (a.as_bool()) return a.as_bool() == b.as_bool();
    if (a.is_float()) return bit_equal(*a.as_float(), *b.as_float());
    return a.as_int() == b.as_int() && a.as_uint() == b.as_uint();
}

struct TensorSpec {
    std::string name;
    Type type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

std::vector<TensorSpec> some_tensors() {
    std::vector<TensorSpec> ts = {
        {"f32", Type::F32, {7, 3}, {}},         {"f16", Type::F16, {5}, {}},
        {"q8_0", Type::Q8_0, {64, 3}, {}},      {"q4_k", Type::Q4_K, {256, 2}, {}},
        {"bf16", Type::BF16, {3, 1, 2, 2}, {}}, {"i32", Type::I32, {1}, {}},
        {"iq2_xxs", Type::IQ2_XXS, {256}, {}},  {"empty", Type::F32, {0, 4}, {}},
    };
    uint32_t seed = 1;
    for (auto& t : ts) {
        int64_t n = 1;
        for (auto d : t.ne) n *= d;
        t.bytes = pattern(glm5::quant::row_size(t.type, n), seed++);
    }
    return ts;
}

void check_tensors(const File& f, const std::vector<TensorSpec>& ts) {
    ASSERT_EQ(f.tensors().size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
        const TensorInfo& t = f.tensors()[i];
        EXPECT_EQ(t.name, ts[i].name);
        EXPECT_EQ(t.type, ts[i].type);
        EXPECT_EQ(t.n_dims, int(ts[i].ne.size()));
        for (size_t j = 0; j < ts[i].ne.size(); ++j) EXPECT_EQ(t.ne[j], ts[i].ne[j]);
        ASSERT_EQ(t.nbytes, ts[i].bytes.size()) << t.name;
        EXPECT_TRUE(std::equal(t.data, t.data + t.nbytes, ts[i].bytes.begin())) << t.name;
        EXPECT_EQ(t.offset % f.alignment(), 0u);
        // The mapping is page-aligned, so file alignment is memory alignment.
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % f.alignment(), 0u);
        EXPECT_EQ(f.find_tensor(t.name), &t);
    }
}

}  // namespace

TEST(GgufWriter, RoundTripEveryTypeAndAlignment) {
    TempDir dir;
    const auto ts = some_tensors();
    for (uint32_t align : {32u, 64u, 1u, 4096u}) {
        Writer w(align);
        set_all_types(w);
        for (const auto& t : ts)
            w.add_tensor_bytes(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
        const std::string path = dir.file("rt" + std::to_string(align) + ".gguf");
        std::vector<std::pair<uint64_t, uint64_t>> progress;
        w.write(path, [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); });
        EXPECT_FALSE(fs::exists(path + ".tmp"));
        ASSERT_EQ(progress.size(), ts.size());
        uint64_t total = 0;
        for (const auto& t : ts) total += t.bytes.size();
        EXPECT_EQ(progress.back(), std::make_pair(total, total));

        const auto f = File::open(path);
        EXPECT_EQ(f->version(), 3u);
        EXPECT_EQ(f->alignment(), align);
        // Metadata in insertion order; general.alignment is added when not the default.
        const size_t n_user = f->metadata().size() - (align != 32 ? 1 : 0);
        std::vector<std::string> keys;
        for (const auto& kv : f->metadata()) keys.push_back(kv.first);
        EXPECT_EQ(keys.front(), "general.architecture");
        EXPECT_EQ(keys[n_user - 1], "t.nested");
        if (align != 32) {
            EXPECT_EQ(f->get_uint("general.alignment"), align);
        }

        EXPECT_EQ(f->get_uint("t.u8"), 255u);
        EXPECT_EQ(*f->find("t.i8")->as_int(), -128);
        EXPECT_EQ(f->get_uint("t.u16"), 65535u);
        EXPECT_EQ(*f->find("t.i16")->as_int(), -32768);
        EXPECT_EQ(f->get_uint("t.u32"), 4000000000u);
        EXPECT_EQ(*f->find("t.i32")->as_int(), -2000000000);
        EXPECT_EQ(f->get_float("t.f32"), 3.25);
        EXPECT_TRUE(f->get_bool("t.bool", false));
        EXPECT_EQ(f->get_string("t.string"), std::string("h\xc3\xa9llo\0x", 8));
        EXPECT_EQ(f->get_uint("t.u64"), ~uint64_t(0));
        EXPECT_EQ(*f->find("t.i64")->as_int(), INT64_MIN);
        EXPECT_EQ(f->get_float("t.f64"), 1.0 / 3.0);
        const Value* nested = f->find("t.nested");
        ASSERT_NE(nested, nullptr);
        EXPECT_EQ(nested->array_type(), ValueType::ARRAY);
        EXPECT_EQ(nested->to_display(), "[[\"x\", \"yz\"], [], [[1.5]]]");
        EXPECT_EQ(f->find("t.a.f32")->to_display(), "[0.5, -0, 1e-30]");
        EXPECT_EQ(f->find("t.a.empty")->size(), 0u);
        EXPECT_EQ(f->find("t.a.empty")->array_type(), ValueType::STRING);
        // Every value equal to what was set, type included, in order.
        const auto want = all_values();
        ASSERT_EQ(n_user, want.size());
        for (size_t i = 0; i < n_user; ++i) {
            EXPECT_EQ(f->metadata()[i].first, want[i].first);
            EXPECT_TRUE(same_value(f->metadata()[i].second, want[i].second)) << want[i].first;
        }
        check_tensors(*f, ts);

        // The same bytes with version 2 parse to the same content.
        auto bytes = read_bytes(path);
        bytes[4] = 2;
        const auto f2 = File::parse_memory(bytes.data(), bytes.size(), "v2.gguf");
        EXPECT_EQ(f2->version(), 2u);
        ASSERT_EQ(f2->metadata().size(), f->metadata().size());
        for (size_t i = 0; i < f->metadata().size(); ++i) {
            EXPECT_EQ(f2->metadata()[i].first, f->metadata()[i].first);
            EXPECT_TRUE(same_value(f2->metadata()[i].second, f->metadata()[i].second))
                << f->metadata()[i].first;
        }
    }
}

TEST(GgufWriter, FillIsCalledOnceWithExactSize) {
    TempDir dir;
    Writer w;
    std::vector<size_t> calls;
    w.add_tensor("w", Type::Q8_0, {64, 5}, [&](uint8_t* dst, size_t n) {
        calls.push_back(n);
        for (size_t i = 0; i < n; ++i) dst[i] = uint8_t(i * 7);
    });
    w.add_tensor("partial", Type::F32, {4}, [&](uint8_t* dst, size_t n) { dst[0] = 0xAB; });
    const std::string path = dir.file("fill.gguf");
    w.write(path);
    ASSERT_EQ(calls, std::vector<size_t>{5 * 2 * 34});
    const auto f = File::open(path);
    const TensorInfo* t = f->find_tensor("w");
    for (size_t i = 0; i < t->nbytes; ++i) ASSERT_EQ(t->data[i], uint8_t(i * 7));
    const TensorInfo* p = f->find_tensor("partial");
    EXPECT_EQ(p->data[0], 0xAB);
    for (size_t i = 1; i < 16; ++i)
        EXPECT_EQ(p->data[i], 0) << "bytes a Fill leaves alone are zero";
}

TEST(GgufWriter, FailedWriteLeavesNoFile) {
    TempDir dir;
    Writer w;
    w.set_string("general.architecture", "x");
    w.add_tensor("ok", Type::F32, {4}, [](uint8_t*, size_t) {});
    w.add_tensor("bad", Type::F32, {4}, [](uint8_t*, size_t) { throw glm5::Error("fill failed"); });
    const std::string path = dir.file("never.gguf");
    EXPECT_THROW(w.write(path), glm5::Error);
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    EXPECT_THROW(w.write(dir.file("no/such/dir.gguf")), glm5::Error);
}

TEST(GgufWriter, RefusesWhatTheFileCannotHold) {
    EXPECT_THROW(Writer(48), glm5::Error);
    EXPECT_THROW(Writer(0), glm5::Error);
    Writer w;
    EXPECT_THROW(w.set("k", Value::make_uint(ValueType::U8, 256)), glm5::Error);
    EXPECT_THROW(w.set("k", Value::make_int(ValueType::I16, 40000)), glm5::Error);
    EXPECT_THROW(w.set("k", arr(ValueType::U8, {Value::make_string("s")})), glm5::Error);
    EXPECT_THROW(w.set("", Value::make_bool(true)), glm5::Error);
    w.add_tensor("t", Type::F32, {4}, [](uint8_t*, size_t) {});
    EXPECT_THROW(w.add_tensor("t", Type::F32, {4}, [](uint8_t*, size_t) {}), glm5::Error);
    EXPECT_THROW(w.add_tensor("q", Type::Q4_K, {128}, [](uint8_t*, size_t) {}), glm5::Error);
    EXPECT_THROW(w.add_tensor("d", Type::F32, {1, 1, 1, 1, 1}, [](uint8_t*, size_t) {}),
                 glm5::Error);
    EXPECT_THROW(w.add_tensor("n", Type::F32, {-1}, [](uint8_t*, size_t) {}), glm5::Error);
    EXPECT_THROW(w.add_tensor("o", Type::F32, {0, 1ll << 40, 1ll << 40}, [](uint8_t*, size_t) {}),
                 glm5::Error);
    EXPECT_THROW(w.add_tensor(std::string(65, 'x'), Type::F32, {4}, [](uint8_t*, size_t) {}),
                 glm5::Error);
    const float four[4] = {};
    EXPECT_THROW(w.add_tensor_bytes("b", Type::F32, {5}, four, sizeof(four)), glm5::Error);
    EXPECT_EQ(w.n_tensors(), 1u);
    // Replacing a key keeps its position.
    Writer r;
    r.set_u32("a", 1);
    r.set_u32("b", 2);
    r.set_u32("a", 3);
    TempDir dir;
    r.write(dir.file("r.gguf"));
    const auto f = File::open(dir.file("r.gguf"));
    ASSERT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->metadata()[0].first, "a");
    EXPECT_EQ(f->get_uint("a"), 3u);
}

TEST(GgufSplit, NamesFollowGgufSplit) {
    EXPECT_EQ(split_shard_path("dir/m", 2, 13), "dir/m-00002-of-00013.gguf");
    const auto s = parse_split_path("/x/model-Q4-00003-of-00004.gguf");
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->prefix, "/x/model-Q4");
    EXPECT_EQ(s->index, 3);
    EXPECT_EQ(s->count, 4);
    EXPECT_FALSE(parse_split_path("model.gguf").has_value());
    EXPECT_FALSE(parse_split_path("m-0001-of-00004.gguf").has_value());
    EXPECT_FALSE(parse_split_path("m-00005-of-00004.gguf").has_value());
    EXPECT_FALSE(parse_split_path("m-00000-of-00004.gguf").has_value());
}

namespace {

void add_all(Writer& w, const std::vector<TensorSpec>& ts) {
    for (const auto& t : ts)
        w.add_tensor_bytes(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
}

// Overwrites the u16 value of metadata key `key` in a file written by Writer.
void patch_u16_key(const std::string& path, const std::string& key, uint16_t v) {
    auto b = read_bytes(path);
    std::string needle(8, '\0');
    const uint64_t n = key.size();
    std::memcpy(needle.data(), &n, 8);
    needle += key;
    const std::string s(b.begin(), b.end());
    const size_t pos = s.find(needle);
    ASSERT_NE(pos, std::string::npos) << key;
    uint32_t type;
    std::memcpy(&type, b.data() + pos + needle.size(), 4);
    ASSERT_EQ(type, uint32_t(ValueType::U16));
    std::memcpy(b.data() + pos + needle.size() + 4, &v, 2);
    write_bytes(path, b);
}

void expect_format_error(const std::string& path, const std::vector<std::string>& parts,
                         const OpenOptions& opt = {}) {
    try {
        File::open(path, opt);
        ADD_FAILURE() << "opened " << path;
    } catch (const FormatError& e) {
        for (const auto& p : parts)
            EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(GgufSplit, RoundTripMergesShards) {
    TempDir dir;
    const auto ts = some_tensors();
    for (uint32_t align : {32u, 64u}) {
        Writer w(align);
        set_all_types(w);
        add_all(w, ts);
        const auto paths = w.write_split(dir.file("m.gguf"), {0, 3, {}});
        ASSERT_EQ(paths.size(), 3u);
        EXPECT_EQ(paths[0], dir.file("m-00001-of-00003.gguf"));
        EXPECT_EQ(paths[2], dir.file("m-00003-of-00003.gguf"));

        const auto f = File::open(paths[0]);
        EXPECT_EQ(f->n_shards(), 3);
        EXPECT_EQ(f->shard_paths(), paths);
        EXPECT_EQ(f->alignment(), align);
        uint64_t total = 0;
        for (const auto& p : paths) total += fs::file_size(p);
        EXPECT_EQ(f->total_file_bytes(), total);
        check_tensors(*f, ts);
        for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(f->tensors()[i].shard, int(i / 3));
        EXPECT_EQ(f->get_uint("split.count"), 3u);
        EXPECT_EQ(f->get_uint("split.no"), 0u);
        EXPECT_EQ(f->get_uint("split.tensors.count"), ts.size());
        EXPECT_EQ(f->find("split.count")->type(), ValueType::U16);
        EXPECT_EQ(f->find("split.tensors.count")->type(), ValueType::I32);
        EXPECT_EQ(f->get_string("t.string"), std::string("h\xc3\xa9llo\0x", 8));

        // A shard opened alone with load_splits=false parses as itself, with
        // only the split.* keys (llama.cpp keeps the metadata in shard 1).
        const auto s2 = File::open(paths[1], {.load_splits = false});
        EXPECT_EQ(s2->n_shards(), 1);
        ASSERT_EQ(s2->tensors().size(), 3u);
        EXPECT_EQ(s2->tensors()[0].name, ts[3].name);
        EXPECT_EQ(s2->get_uint("split.no"), 1u);
        EXPECT_EQ(s2->find("general.architecture"), nullptr);
        EXPECT_EQ(s2->alignment(), align);
        const auto s1 = File::open(paths[0], {.load_splits = false});
        EXPECT_EQ(s1->tensors().size(), 3u);
    }
}

TEST(GgufSplit, ByteLimit) {
    TempDir dir;
    Writer w;
    for (int i = 0; i < 5; ++i)
        w.add_tensor("t" + std::to_string(i), Type::F32, {100},
                     [i](uint8_t* d, size_t n) { std::memset(d, i, n); });
    // 400 bytes each, padded to 416: two per 900-byte shard.
    const auto paths = w.write_split(dir.file("b"), {900, 0, {}});
    ASSERT_EQ(paths.size(), 3u);
    const auto f = File::open(paths[0]);
    ASSERT_EQ(f->tensors().size(), 5u);
    EXPECT_EQ(f->tensors()[4].shard, 2);
    EXPECT_EQ(f->tensors()[4].data[0], 4);
    // A limit below one tensor still puts one tensor in each shard.
    EXPECT_EQ(w.write_split(dir.file("c"), {1, 0, {}}).size(), 5u);
    // No limit: one shard named -00001-of-00001.
    const auto one = w.write_split(dir.file("d"), {});
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(File::open(one[0])->tensors().size(), 5u);
}

TEST(GgufSplit, InconsistentShardsRefused) {
    TempDir dir;
    const auto ts = some_tensors();
    Writer w;
    w.set_string("general.architecture", "x");
    add_all(w, ts);
    auto fresh = [&] { return w.write_split(dir.file("m"), {0, 3, {}}); };

    auto paths = fresh();
    patch_u16_key(paths[1], "split.no", 2);
    expect_format_error(
        paths[0], {"m-00002-of-00003.gguf: metadata 'split.no' at byte", "is 2", "expected 1"});

    paths = fresh();
    patch_u16_key(paths[0], "split.count", 4);
    expect_format_error(paths[0], {"m-00001-of-00003.gguf: metadata 'split.count'", "declares 4",
                                   "file name says 3"});

    paths = fresh();
    patch_u16_key(paths[2], "split.count", 2);
    expect_format_error(paths[0], {"m-00003-of-00003.gguf: metadata 'split.count'", "is 2"});

    // split.tensors.count is an i32: rewrite it through a writer copy with a wrong total.
    paths = fresh();
    {
        auto b = read_bytes(paths[0]);
        const std::string s(b.begin(), b.end());
        const size_t pos = s.find("split.tensors.count");
        ASSERT_NE(pos, std::string::npos);
        const int32_t bad = 99;
        std::memcpy(b.data() + pos + 19 + 4, &bad, 4);
        write_bytes(paths[0], b);
    }
    expect_format_error(paths[0], {"metadata 'split.tensors.count'", "is 99", "hold 8 tensors"});

    // The same tensor name in two shards.
    Writer dup;
    dup.set_string("general.architecture", "x");
    dup.add_tensor("aaaa", Type::F32, {4}, [](uint8_t*, size_t) {});
    dup.add_tensor("bbbb", Type::F32, {4}, [](uint8_t*, size_t) {});
    paths = dup.write_split(dir.file("dup"), {0, 1, {}});
    {
        auto b = read_bytes(paths[1]);
        const std::string s(b.begin(), b.end());
        const size_t pos = s.find("bbbb");
        ASSERT_NE(pos, std::string::npos);
        std::memcpy(b.data() + pos, "aaaa", 4);
        write_bytes(paths[1], b);
    }
    expect_format_error(paths[0], {"dup-00002-of-00002.gguf: tensor_infos[0].name at byte",
                                   "tensor 'aaaa' is also in", "dup-00001-of-00002.gguf"});

    // A missing shard, a later shard opened as if it were the first.
    paths = fresh();
    fs::remove(paths[2]);
    EXPECT_THROW(File::open(paths[0]), glm5::Error);
    paths = fresh();
    expect_format_error(paths[1],
                        {"is shard 2 of 3", "open the first shard", "m-00001-of-00003.gguf"});

    // A file that says it is split but is not named as a shard.
    fs::copy_file(paths[0], dir.file("renamed.gguf"));
    expect_format_error(dir.file("renamed.gguf"), {"renamed.gguf: metadata 'split.count'",
                                                   "declares 3", "NAME-00001-of-00003.gguf"});
    EXPECT_EQ(File::open(dir.file("renamed.gguf"), {.load_splits = false})->tensors().size(), 3u);
}

// The generator of the fuzz seed corpus (fuzz/corpus/gguf/): small valid GGUF
// files of both versions covering every value type, nested arrays and several
// tensor types, plus near-miss invalid ones. The test checks that the
// committed seeds are exactly what this generator makes, so they stay
// reproducible; run it with GLM5_WRITE_CORPUS=1 to (re)write them.
// Seeds named valid-* must parse and invalid-* must be refused; regression
// inputs found by the fuzzer live beside them under other names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "gguf_test_image.h"

namespace fs = std::filesystem;
using namespace glm5::gguf;
using glm5::quant::Type;

namespace {

struct Seed {
    std::string name;
    std::vector<uint8_t> bytes;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Tensor bytes: a fixed pattern, so seeds are byte-for-byte reproducible.
Writer::Fill pattern(uint8_t seed) {
    return [seed](uint8_t* d, size_t n) {
        for (size_t i = 0; i < n; ++i) d[i] = uint8_t(seed + i * 31);
    };
}

Value arr(ValueType t, std::vector<Value> v) {
    return Value::make_array(t, std::move(v));
}

void set_every_type(Writer& w) {
    using V = Value;
    w.set_string("general.architecture", "seed");
    w.set("s.u8", V::make_uint(ValueType::U8, 200));
    w.set("s.i8", V::make_int(ValueType::I8, -100));
    w.set("s.u16", V::make_uint(ValueType::U16, 60000));
    w.set("s.i16", V::make_int(ValueType::I16, -30000));
    w.set_u32("s.u32", 3000000000u);
    w.set_i32("s.i32", -7);
    w.set_f32("s.f32", 0.125f);
    w.set_bool("s.bool", true);
    w.set_string("s.string", "hello \xe2\x9c\x93");
    w.set_u64("s.u64", 1ull << 50);
    w.set("s.i64", V::make_int(ValueType::I64, -(1ll << 50)));
    w.set("s.f64", V::make_float(ValueType::F64, -2.5));
    w.set_array_string("s.a.string", {"<|endoftext|>", "", "\xc4\xa0the"});
    w.set_array_i32("s.a.i32", {1, 2, 3});
    w.set_array_f32("s.a.f32", {-1.0f, 0.5f});
    w.set_array_bool("s.a.bool", {true, false});
    w.set("s.a.u8", arr(ValueType::U8, {V::make_uint(ValueType::U8, 1)}));
    w.set("s.a.u64", arr(ValueType::U64, {V::make_uint(ValueType::U64, 5)}));
    w.set("s.a.f64", arr(ValueType::F64, {V::make_float(ValueType::F64, 1e100)}));
    w.set("s.a.empty", arr(ValueType::I16, {}));
    w.set("s.nested",
          arr(ValueType::ARRAY, {arr(ValueType::STRING, {V::make_string("a b")}),
                                 arr(ValueType::I32, {V::make_int(ValueType::I32, -1)})}));
}

std::vector<uint8_t> write_to_bytes(const Writer& w, const std::string& dir) {
    const std::string path = dir + "/seed.gguf";
    w.write(path);
    return read_bytes(path);
}

std::vector<Seed> make_seeds(const std::string& tmp) {
    std::vector<Seed> seeds;
    {
        Writer w;
        set_every_type(w);
        w.add_tensor("f32", Type::F32, {4, 2}, pattern(1));
        w.add_tensor("q8_0", Type::Q8_0, {32}, pattern(2));
        w.add_tensor("f16", Type::F16, {8}, pattern(3));
        seeds.push_back({"valid-v3-every-type.gguf", write_to_bytes(w, tmp)});
        auto v2 = seeds.back().bytes;
        v2[4] = 2;
        seeds.push_back({"valid-v2-every-type.gguf", v2});
        auto cut = seeds.back().bytes;
        cut.resize(cut.size() - 16 - 5);  // past the padding, into the last tensor (16 bytes)
        seeds.push_back({"invalid-truncated-data.gguf", cut});
    }
    {
        Writer w(64);
        w.set_string("general.architecture", "seed");
        w.add_tensor("q4_k", Type::Q4_K, {256}, pattern(4));
        w.add_tensor("q6_k", Type::Q6_K, {256}, pattern(5));
        w.add_tensor("iq4_nl", Type::IQ4_NL, {32, 2}, pattern(6));
        w.add_tensor("i32", Type::I32, {3}, pattern(7));
        w.add_tensor("bf16", Type::BF16, {2, 2, 1, 2}, pattern(8));
        w.add_tensor("empty", Type::F32, {0, 3}, pattern(9));
        seeds.push_back({"valid-v3-align64-types.gguf", write_to_bytes(w, tmp)});
    }
    {
        Writer w;
        set_every_type(w);
        seeds.push_back({"valid-v3-metadata-only.gguf", write_to_bytes(w, tmp)});
        seeds.push_back({"valid-v3-empty.gguf", write_to_bytes(Writer(), tmp)});
    }
    {
        // Arrays nested 8 deep (the reader's limit) with strings at the bottom.
        Value v = arr(ValueType::STRING, {Value::make_string("deep")});
        for (int d = 1; d < 8; ++d) v = arr(ValueType::ARRAY, {v, v});
        Writer w;
        w.set("s.deep", v);
        seeds.push_back({"valid-v3-nested-deep.gguf", write_to_bytes(w, tmp)});
    }
    {
        // The real fixture's metadata (vocabulary, merges, template) with two tensors.
        const auto f = File::open(std::string(GLM5_TEST_DATA) + "/glm-dsa/tiny.gguf");
        Writer w;
        for (const auto& [k, v] : f->metadata()) w.set(k, v);
        for (const char* name : {"output_norm.weight", "blk.0.attn_q_a_norm.weight"}) {
            const TensorInfo* t = f->find_tensor(name);
            w.add_tensor_bytes(t->name, t->type, {t->ne.begin(), t->ne.begin() + t->n_dims},
                               t->data, t->nbytes);
        }
        seeds.push_back({"valid-v3-glm-dsa-metadata.gguf", write_to_bytes(w, tmp)});
    }
    {
        // The middle shard of a split model, as a file on its own.
        Writer w;
        w.set_string("general.architecture", "seed");
        for (int i = 0; i < 3; ++i)
            w.add_tensor("t" + std::to_string(i), Type::F32, {8}, pattern(uint8_t(i)));
        const auto paths = w.write_split(tmp + "/split", {0, 1, {}});
        seeds.push_back({"valid-v3-split-shard2.gguf", read_bytes(paths[1])});
        for (const auto& p : paths) fs::remove(p);
    }
    // Near misses: the hand-built test image with one field corrupted.
    using test::make_image;
    auto corrupt = [&](const std::string& name, auto edit) {
        test::Image im = make_image();
        edit(im);
        seeds.push_back({name, im.bytes});
    };
    seeds.push_back({"valid-v2-hand-built.gguf", make_image(2, 32).bytes});
    corrupt("invalid-v1.gguf", [](test::Image& im) { im.patch<uint32_t>("version", 1); });
    corrupt("invalid-alignment-48.gguf",
            [](test::Image& im) { im.patch<uint32_t>("kv[1].value", 48); });
    corrupt("invalid-overlap.gguf",
            [](test::Image& im) { im.patch<uint64_t>("tensor_infos[1].offset", 0); });
    corrupt("invalid-huge-array.gguf",
            [](test::Image& im) { im.patch<uint64_t>("kv[2].array_length", uint64_t(1) << 60); });
    corrupt("invalid-duplicate-key.gguf", [](test::Image& im) {
        std::memcpy(im.bytes.data() + im.offset("kv[4].key") + 8, "test.u8s", 8);
    });
    corrupt("invalid-tensor-type.gguf",
            [](test::Image& im) { im.patch<uint32_t>("tensor_infos[1].type", 4); });
    corrupt("invalid-block-multiple.gguf",
            [](test::Image& im) { im.patch<uint64_t>("tensor_infos[1].ne[0]", 16); });
    corrupt("invalid-offset-past-end.gguf",
            [](test::Image& im) { im.patch<uint64_t>("tensor_infos[2].offset", 1024); });
    return seeds;
}

}  // namespace

TEST(GgufCorpus, CommittedSeedsMatchTheGenerator) {
    const fs::path tmp =
        fs::temp_directory_path() / ("glm5_gguf_corpus_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    const auto seeds = make_seeds(tmp.string());
    fs::remove_all(tmp);

    const fs::path dir = fs::path(GLM5_SOURCE_DIR) / "fuzz/corpus/gguf";
    if (std::getenv("GLM5_WRITE_CORPUS")) {
        fs::create_directories(dir);
        for (const auto& s : seeds)
            std::ofstream(dir / s.name, std::ios::binary)
                .write(reinterpret_cast<const char*>(s.bytes.data()),
                       std::streamsize(s.bytes.size()));
    }
    size_t total = 0;
    for (const auto& s : seeds) {
        EXPECT_EQ(read_bytes((dir / s.name).string()), s.bytes)
            << s.name << " differs from the generator; rerun with GLM5_WRITE_CORPUS=1";
        total += s.bytes.size();
        bool ok = true;
        try {
            File::parse_memory(s.bytes.data(), s.bytes.size(), s.name);
        } catch (const FormatError&) {
            ok = false;
        }
        EXPECT_EQ(ok, s.name.rfind("valid-", 0) == 0) << s.name;
    }
    EXPECT_GE(seeds.size(), 12u);
    EXPECT_LT(total, 1u << 20);
}

// The float / legacy / k-quant formats against llama.cpp's own output:
//  - dequantization reproduces tests/data/dequant.golden.json bit for bit;
//  - quantizing the F16 fixture model reproduces, byte for byte, the tensors
//    llama-quantize wrote without importance data (the plain reference
//    quantizers: every tensor of the files made without --imatrix, and in the
//    imatrix-made files the tensors the importance matrix had no entry for:
//    token_embd and the NextN block blk.3).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace glm5::test {
namespace {

using quant::Type;

std::string data_path(const std::string& rel) {
    return std::string(GLM5_TEST_DATA) + "/" + rel;
}

bool in_our_families(Type t) {
    static const std::set<Type> ours = {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0,
                                        Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K};
    return ours.count(t) > 0;
}

TEST(QuantGolden, DequantizationMatchesLlamaCppBitForBit) {
    std::ifstream f(data_path("dequant.golden.json"));
    ASSERT_TRUE(f.good());
    const nlohmann::json golden = nlohmann::json::parse(f);
    int compared = 0;
    std::set<std::string> types_seen;
    for (const auto& [path, entries] : golden.at("files").items()) {
        const auto file = gguf::File::open(data_path(path));
        for (const auto& [type_name, e] : entries.items()) {
            const auto type = quant::type_from_name(type_name);
            ASSERT_TRUE(type.has_value()) << type_name;
            if (!in_our_families(*type)) continue;
            const gguf::TensorInfo* t = file->find_tensor(e.at("tensor").get<std::string>());
            ASSERT_NE(t, nullptr) << path << " " << e.at("tensor");
            ASSERT_EQ(t->type, *type) << path << " " << t->name;
            const std::vector<float> want = e.at("values").get<std::vector<float>>();
            ASSERT_LE(int64_t(want.size()), t->nelements());
            std::vector<float> got(want.size());
            quant::dequantize_row(*type, t->data, got.data(), int64_t(got.size()));
            int mismatches = 0;
            for (size_t i = 0; i < want.size(); ++i)
                if (f32_bits(got[i]) != f32_bits(want[i]) && mismatches++ < 5)
                    ADD_FAILURE() << path << " " << type_name << " [" << i << "]: " << got[i]
                                  << " vs " << want[i];
            EXPECT_EQ(mismatches, 0) << path << " " << type_name;
            ++compared;
            types_seen.insert(type_name);
        }
    }
    // Every format of these families that the fixtures contain was checked.
    EXPECT_EQ(types_seen, (std::set<std::string>{"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0",
                                                 "Q5_1", "Q5_K", "Q6_K", "Q8_0"}));
    std::printf("%d golden tensors compared\n", compared);
}

std::vector<float> source_rows(const gguf::TensorInfo& t) {
    std::vector<float> x(size_t(t.nelements()));
    quant::dequantize_row(t.type, t.data, x.data(), t.nelements());  // F16 / F32: exact
    return x;
}

TEST(QuantGolden, QuantizationMatchesLlamaQuantizeWithoutImatrix) {
    const auto src = gguf::File::open(data_path("glm-dsa/small.gguf"));
    const char* files[] = {"glm-dsa/small-q8_0.gguf", "glm-dsa/small-q4_k_m.gguf",
                           "glm-dsa/small-q2_k.gguf", "glm-dsa/small-iq2_xxs.gguf",
                           "quant/small-q4_1.gguf",   "quant/small-q5_1.gguf",
                           "quant/small-q5_k_m.gguf"};
    std::map<std::string, int> tensors_per_type;
    for (const char* path : files) {
        const auto q = gguf::File::open(data_path(path));
        const bool imatrix = q->find("quantize.imatrix.file") != nullptr;
        for (const gguf::TensorInfo& t : q->tensors()) {
            if (!in_our_families(t.type)) continue;
            if (imatrix && t.name != "token_embd.weight" && t.name.rfind("blk.3.", 0) != 0)
                continue;
            const gguf::TensorInfo* s = src->find_tensor(t.name);
            ASSERT_NE(s, nullptr) << t.name;
            ASSERT_EQ(s->nelements(), t.nelements());
            const std::vector<float> x = source_rows(*s);
            std::vector<uint8_t> out(t.nbytes);
            ASSERT_EQ(
                quant::quantize_rows(t.type, x.data(), out.data(), t.nrows(), t.ne[0], nullptr),
                t.nbytes);
            const size_t bs = quant::traits(t.type).type_size;
            size_t bad_blocks = 0;
            for (size_t b = 0; b < t.nbytes; b += bs)
                if (std::memcmp(out.data() + b, t.data + b, bs) != 0) ++bad_blocks;
            EXPECT_EQ(bad_blocks, 0u)
                << path << " " << t.name << " (" << quant::name(t.type) << "): " << bad_blocks
                << " of " << t.nbytes / bs << " blocks differ";
            ++tensors_per_type[quant::name(t.type)];
        }
    }
    for (const auto& [type, count] : tensors_per_type)
        std::printf("%s: %d tensors\n", type.c_str(), count);
    // All ten formats were exercised.
    EXPECT_EQ(tensors_per_type.size(), 10u);
}

}  // namespace
}  // namespace glm5::test

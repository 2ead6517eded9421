// The i-quant formats against llama.cpp's own output.
//
// 1. Dequantization: tests/data/dequant.golden.json holds, for every quantized
//    fixture, the first 512 values of the first tensor of each type as ggml
//    dequantizes them. Compared as float32 bit patterns.
// 2. Quantization: glm-dsa/small-iq4_xs.gguf is llama-quantize's output for
//    glm-dsa/small.gguf without an importance matrix (IQ4_XS, with IQ4_NL for
//    the rows of 64). Quantizing the same F16 source must give the same bytes.
#include <gtest/gtest.h>

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

namespace {

using namespace glm5;
using quant::Type;

const std::string kData = GLM5_TEST_DATA;

// Parse the golden values straight into float (strtof), so no double rounding
// can move a value off its float32 bit pattern.
using FloatJson =
    nlohmann::basic_json<std::map, std::vector, std::string, bool, int64_t, uint64_t, float>;

bool is_iquant(Type t) {
    switch (t) {
        case Type::IQ1_S:
        case Type::IQ1_M:
        case Type::IQ2_XXS:
        case Type::IQ2_XS:
        case Type::IQ2_S:
        case Type::IQ3_XXS:
        case Type::IQ3_S:
        case Type::IQ4_NL:
        case Type::IQ4_XS:
            return true;
        default:
            return false;
    }
}

TEST(IQuantGolden, DequantizationIsBitExactWithGgml) {
    std::ifstream in(kData + "/dequant.golden.json");
    ASSERT_TRUE(in) << "missing dequant.golden.json";
    const FloatJson golden = FloatJson::parse(in);
    std::set<Type> seen;
    for (const auto& [path, types] : golden.at("files").items()) {
        const auto file = gguf::File::open(kData + "/" + path);
        for (const auto& [type_name, entry] : types.items()) {
            const auto t = quant::type_from_name(type_name);
            ASSERT_TRUE(t) << type_name;
            if (!is_iquant(*t)) continue;
            const std::string tensor = entry.at("tensor").get<std::string>();
            const gguf::TensorInfo* ti = file->find_tensor(tensor);
            ASSERT_NE(ti, nullptr) << path << ": " << tensor;
            ASSERT_EQ(ti->type, *t) << path << ": " << tensor;
            const auto& values = entry.at("values");
            const int64_t n = int64_t(values.size());
            ASSERT_EQ(n % quant::traits(*t).block_size, 0);
            ASSERT_GE(ti->nbytes, quant::row_size(*t, n));
            std::vector<float> got(n);
            quant::dequantize_row(*t, ti->data, got.data(), n);
            int mismatches = 0;
            for (int64_t i = 0; i < n; ++i) {
                const uint32_t want = f32_bits(values[i].get<float>());
                if (f32_bits(got[i]) != want && ++mismatches <= 5)
                    ADD_FAILURE() << path << " " << type_name << " " << tensor << " value " << i
                                  << ": got " << got[i] << " want " << values[i].get<float>();
            }
            EXPECT_EQ(mismatches, 0) << path << " " << type_name;
            seen.insert(*t);
        }
    }
    // The fixtures cover every i-quant format.
    EXPECT_EQ(seen.size(), 9u);
}

// The F32 values of a fixture tensor (F16 or F32 in the file).
std::vector<float> source_values(const gguf::TensorInfo& ti) {
    std::vector<float> v(ti.nelements());
    if (ti.type == Type::F32) {
        std::memcpy(v.data(), ti.data, v.size() * 4);
    } else {
        EXPECT_EQ(ti.type, Type::F16) << ti.name;
        for (size_t i = 0; i < v.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, ti.data + 2 * i, 2);
            v[i] = fp16_to_fp32(h);
        }
    }
    return v;
}

TEST(IQuantGolden, Iq4QuantizationIsByteIdenticalToLlamaQuantize) {
    const auto src = gguf::File::open(kData + "/glm-dsa/small.gguf");
    const auto ref = gguf::File::open(kData + "/glm-dsa/small-iq4_xs.gguf");
    std::map<Type, int> tensors;
    for (const gguf::TensorInfo& q : ref->tensors()) {
        if (q.type != Type::IQ4_XS && q.type != Type::IQ4_NL) continue;
        const gguf::TensorInfo* s = src->find_tensor(q.name);
        ASSERT_NE(s, nullptr) << q.name;
        ASSERT_EQ(s->nelements(), q.nelements()) << q.name;
        const std::vector<float> x = source_values(*s);
        const int64_t n = q.ne[0], rows = q.nrows();
        std::vector<uint8_t> out(quant::row_size(q.type, n) * rows);
        ASSERT_EQ(quant::quantize_rows(q.type, x.data(), out.data(), rows, n, nullptr), out.size());
        ASSERT_EQ(out.size(), q.nbytes) << q.name;
        const size_t bs = quant::traits(q.type).type_size;
        int differing = 0;
        for (size_t off = 0; off < out.size(); off += bs)
            differing += std::memcmp(out.data() + off, q.data + off, bs) != 0;
        EXPECT_EQ(differing, 0) << q.name << " (" << quant::name(q.type)
                                << "): blocks differing from llama-quantize";
        ++tensors[q.type];
    }
    // The file has both formats (IQ4_NL for attn_k_b, whose rows of 64 do not fit IQ4_XS).
    EXPECT_GT(tensors[Type::IQ4_XS], 0);
    EXPECT_GT(tensors[Type::IQ4_NL], 0);
}

}  // namespace

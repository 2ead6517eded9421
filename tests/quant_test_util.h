// Test helpers for the quantization formats: random data, rows of any format,
// and the block fields the checks need (scales, levels) read through the
// public dequantizer so the tests do not re-implement the bit layouts.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/ops.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace glm5::test {

using quant::Type;

// Every weight format a GLM GGUF uses, and the legacy ones beside them: the formats
// quant/groups.h decodes for a GPU.
inline const Type kGroupTypes[] = {
    Type::F32,   Type::F16,   Type::BF16,    Type::Q4_0,   Type::Q4_1,  Type::Q5_0,
    Type::Q5_1,  Type::Q8_0,  Type::IQ4_NL,  Type::Q2_K,   Type::Q3_K,  Type::Q4_K,
    Type::Q5_K,  Type::Q6_K,  Type::IQ2_XXS, Type::IQ2_XS, Type::IQ2_S, Type::IQ3_XXS,
    Type::IQ3_S, Type::IQ1_S, Type::IQ1_M,   Type::IQ4_XS,
};

inline std::vector<float> normal_floats(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// Rows whose scale varies a lot from block to block (as in real weights), so
// quantizers see small and large scales.
inline std::vector<float> varied_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-6.0f, 3.0f);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i += 32) {
        const float s = std::exp2(expo(rng));
        for (size_t j = i; j < std::min(n, i + 32); ++j) v[j] = dist(rng) * s;
    }
    return v;
}

inline std::vector<uint8_t> quantize(Type t, const std::vector<float>& x, int64_t n_rows = 1,
                                     const float* imatrix = nullptr) {
    const int64_t n_per_row = int64_t(x.size()) / n_rows;
    std::vector<uint8_t> out(quant::row_size(t, n_per_row) * size_t(n_rows));
    const size_t written =
        quant::quantize_rows(t, x.data(), out.data(), n_rows, n_per_row, imatrix);
    EXPECT_EQ(written, out.size());
    return out;
}

inline std::vector<float> dequantize(Type t, const std::vector<uint8_t>& q, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    quant::dequantize_row(t, q.data(), out.data(), n);
    return out;
}

inline std::vector<uint8_t> activation(Type act, const std::vector<float>& x) {
    std::vector<uint8_t> out(quant::row_size(act, int64_t(x.size())));
    quant::quantize_activation_row(act, x.data(), out.data(), int64_t(x.size()));
    return out;
}

inline float f16_random(std::mt19937& rng, float lo_exp, float hi_exp, bool allow_negative) {
    std::uniform_real_distribution<float> e(lo_exp, hi_exp);
    float v = std::exp2(e(rng));
    if (allow_negative && (rng() & 1)) v = -v;
    return round_fp16(v);
}

// Random bytes for every field of every block, then the fp16 scale fields set
// to finite values (positive d, as every quantizer writes them) so all level
// and sub-scale bit patterns are exercised. Q8_0 levels stay in [-127, 127]
// (the quantizers never write -128 and the int8 kernels rely on it).
inline std::vector<uint8_t> random_blocks(Type t, int64_t n, uint32_t seed) {
    using namespace quant;
    std::mt19937 rng(seed);
    std::vector<uint8_t> bytes(row_size(t, n));
    for (auto& b : bytes) b = uint8_t(rng());
    const size_t bs = traits(t).type_size;
    for (size_t off = 0; off < bytes.size(); off += bs) {
        uint8_t* p = bytes.data() + off;
        auto set = [&](uint16_t* field, bool neg) {
            *field = fp32_to_fp16(f16_random(rng, -12, 0, neg));
        };
        switch (t) {
            case Type::Q4_0:
                set(&reinterpret_cast<BlockQ4_0*>(p)->d, true);
                break;
            case Type::Q5_0:
                set(&reinterpret_cast<BlockQ5_0*>(p)->d, true);
                break;
            case Type::Q4_1:
                set(&reinterpret_cast<BlockQ4_1*>(p)->d, false);
                set(&reinterpret_cast<BlockQ4_1*>(p)->m, true);
                break;
            case Type::Q5_1:
                set(&reinterpret_cast<BlockQ5_1*>(p)->d, false);
                set(&reinterpret_cast<BlockQ5_1*>(p)->m, true);
                break;
            case Type::Q8_0: {
                auto* b = reinterpret_cast<BlockQ8_0*>(p);
                set(&b->d, true);
                for (auto& q : b->qs)
                    if (q == -128) q = -127;
                break;
            }
            case Type::Q2_K:
                set(&reinterpret_cast<BlockQ2_K*>(p)->d, false);
                set(&reinterpret_cast<BlockQ2_K*>(p)->dmin, false);
                break;
            case Type::Q3_K:
                set(&reinterpret_cast<BlockQ3_K*>(p)->d, true);
                break;
            case Type::Q4_K:
                set(&reinterpret_cast<BlockQ4_K*>(p)->d, false);
                set(&reinterpret_cast<BlockQ4_K*>(p)->dmin, false);
                break;
            case Type::Q5_K:
                set(&reinterpret_cast<BlockQ5_K*>(p)->d, false);
                set(&reinterpret_cast<BlockQ5_K*>(p)->dmin, false);
                break;
            case Type::Q6_K:
                set(&reinterpret_cast<BlockQ6_K*>(p)->d, true);
                break;
            case Type::F16: {
                auto* h = reinterpret_cast<uint16_t*>(p);
                *h = fp32_to_fp16(f16_random(rng, -8, 4, true));
                break;
            }
            case Type::BF16: {
                auto* h = reinterpret_cast<uint16_t*>(p);
                *h = fp32_to_bf16(f16_random(rng, -8, 4, true));
                break;
            }
            case Type::F32: {
                const float v = f16_random(rng, -8, 4, true) * (1.0f + float(rng() % 1000) * 1e-4f);
                std::memcpy(p, &v, 4);
                break;
            }
            default:
                ADD_FAILURE() << "random_blocks: no layout for " << name(t);
        }
    }
    return bytes;
}

// Copies of a row with the block scales replaced, read back through the
// dequantizer: with d = 1 and m/dmin = 0 it yields the integer levels (times
// the sub-block scale for k-quants); with the levels zeroed it yields -dmin*m.
inline void set_all_fp16(Type t, std::vector<uint8_t>& row, size_t offset_in_block, float v) {
    const size_t bs = quant::traits(t).type_size;
    const uint16_t h = fp32_to_fp16(v);
    for (size_t off = 0; off < row.size(); off += bs)
        std::memcpy(row.data() + off + offset_in_block, &h, 2);
}

// The weight formats with their vec_dot_type, as the engine uses them.
inline const std::vector<Type>& weight_types() {
    static const std::vector<Type> v = {Type::F32,  Type::F16,  Type::BF16, Type::Q4_0, Type::Q4_1,
                                        Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::Q2_K, Type::Q3_K,
                                        Type::Q4_K, Type::Q5_K, Type::Q6_K};
    return v;
}

inline bool is_kquant(Type t) {
    return t == Type::Q2_K || t == Type::Q3_K || t == Type::Q4_K || t == Type::Q5_K ||
           t == Type::Q6_K;
}

}  // namespace glm5::test

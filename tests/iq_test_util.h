// Shared helpers of the i-quant tests: the i-quant type list, random weight
// blocks, and activation rows in the Q8_K / Q8_0 layouts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace iqtest {

using glm5::quant::Type;

inline const std::vector<Type>& iquant_types() {
    static const std::vector<Type> v = {Type::IQ1_S,  Type::IQ1_M,  Type::IQ2_XXS,
                                        Type::IQ2_XS, Type::IQ2_S,  Type::IQ3_XXS,
                                        Type::IQ3_S,  Type::IQ4_NL, Type::IQ4_XS};
    return v;
}

// A weight row of n values with random content: random bytes everywhere (every
// bit pattern of the index, sign and scale fields is a valid block), then the
// fp16 super-block scales replaced by finite values of either sign.
inline std::vector<uint8_t> random_weight_row(Type t, int64_t n, std::mt19937& rng) {
    using namespace glm5::quant;
    const TypeTraits& tt = traits(t);
    std::vector<uint8_t> row(row_size(t, n));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : row) b = uint8_t(byte(rng));
    std::uniform_real_distribution<float> mag(0.25f, 4.0f);
    std::bernoulli_distribution neg(0.5);
    for (size_t off = 0; off < row.size(); off += tt.type_size) {
        const float d = (neg(rng) ? -1.f : 1.f) * mag(rng) * 1e-3f;
        const uint16_t h = glm5::fp32_to_fp16(d);
        if (t == Type::IQ1_M) {
            // IQ1_M spreads its fp16 scale over the top nibbles of the four scale words.
            uint16_t sc[4];
            std::memcpy(sc, row.data() + off + offsetof(BlockIQ1_M, scales), 8);
            for (int k = 0; k < 4; ++k)
                sc[k] = uint16_t((sc[k] & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
            std::memcpy(row.data() + off + offsetof(BlockIQ1_M, scales), sc, 8);
        } else {
            std::memcpy(row.data() + off, &h, 2);  // every other i-quant block starts with d
        }
    }
    return row;
}

// An activation row in the weight type's vec_dot layout with random 8-bit
// values in [-127, 127] (the range ggml's Q8 quantizers produce), consistent
// block sums, and positive scales. `extreme` uses only +-127.
inline std::vector<uint8_t> random_activation_row(Type t, int64_t n, std::mt19937& rng,
                                                  bool extreme) {
    using namespace glm5::quant;
    std::uniform_int_distribution<int> q(-127, 127);
    std::bernoulli_distribution coin(0.5);
    std::uniform_real_distribution<float> scale(0.5f, 2.0f);
    auto draw = [&] { return int8_t(extreme ? (coin(rng) ? 127 : -127) : q(rng)); };
    if (traits(t).vec_dot_type == Type::Q8_0) {
        std::vector<uint8_t> row(row_size(Type::Q8_0, n));
        auto* b = reinterpret_cast<BlockQ8_0*>(row.data());
        for (int64_t i = 0; i < n / 32; ++i) {
            b[i].d = glm5::fp32_to_fp16(scale(rng) * 1e-2f);
            for (auto& v : b[i].qs) v = draw();
        }
        return row;
    }
    std::vector<uint8_t> row(row_size(Type::Q8_K, n));
    auto* b = reinterpret_cast<BlockQ8_K*>(row.data());
    for (int64_t i = 0; i < n / 256; ++i) {
        b[i].d = scale(rng) * 1e-2f;
        for (auto& v : b[i].qs) v = draw();
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int k = 0; k < 16; ++k) s += b[i].qs[16 * j + k];
            b[i].bsums[j] = int16_t(s);
        }
    }
    return row;
}

// The activation row's values as floats.
inline std::vector<float> activation_values(Type t, const std::vector<uint8_t>& row, int64_t n) {
    using namespace glm5::quant;
    std::vector<float> v(n);
    if (traits(t).vec_dot_type == Type::Q8_0) {
        const auto* b = reinterpret_cast<const BlockQ8_0*>(row.data());
        for (int64_t i = 0; i < n; ++i)
            v[i] = glm5::fp16_to_fp32(b[i / 32].d) * b[i / 32].qs[i % 32];
    } else {
        const auto* b = reinterpret_cast<const BlockQ8_K*>(row.data());
        for (int64_t i = 0; i < n; ++i) v[i] = b[i / 256].d * b[i / 256].qs[i % 256];
    }
    return v;
}

}  // namespace iqtest

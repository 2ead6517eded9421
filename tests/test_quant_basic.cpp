// Float formats and activation quantizers. Activations must round exactly as
// llama.cpp's x86 CPU backend does, so these tests pin the rounding rules down
// (half-to-even where the backend uses it) and check every SIMD variant
// against the scalar one bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant_test_util.h"

namespace glm5::test {
namespace {

using namespace quant;

// Awkward values for conversions: signed zeros, fp16 subnormals and their
// rounding boundaries, values that overflow fp16, huge and tiny floats.
std::vector<float> special_floats() {
    std::vector<float> v = {0.0f,     -0.0f,     1.0f,  -1.0f,   65504.0f, 65519.0f,
                            65520.0f, -70000.0f, 1e-8f, -3e-8f,  5.96e-8f, 2.98e-8f,
                            6.1e-5f,  6.09e-5f,  1e30f, -1e-30f, 0.1f,     1.0f / 3};
    for (int e = -30; e <= 20; ++e) {
        v.push_back(std::ldexp(1.0f, e) * 1.0009765625f);  // just above a power of two
        v.push_back(-std::ldexp(1.5f, e));
    }
    while (v.size() % 8) v.push_back(0.25f);
    return v;
}

TEST(QuantFloat, F16AndBf16RowsRoundToNearestEven) {
    std::vector<float> x = special_floats();
    const std::vector<float> r = normal_floats(1003, 1, 100.0f);
    x.insert(x.end(), r.begin(), r.end());
    const int64_t n = int64_t(x.size());
    const std::vector<uint8_t> h = quantize(Type::F16, x), b = quantize(Type::BF16, x);
    const std::vector<float> hf = dequantize(Type::F16, h, n), bf = dequantize(Type::BF16, b, n);
    for (int64_t i = 0; i < n; ++i) {
        uint16_t hv, bv;
        std::memcpy(&hv, &h[size_t(2 * i)], 2);
        std::memcpy(&bv, &b[size_t(2 * i)], 2);
        EXPECT_EQ(hv, fp32_to_fp16(x[i])) << x[i];
        EXPECT_EQ(bv, fp32_to_bf16(x[i])) << x[i];
        EXPECT_EQ(f32_bits(hf[i]), f32_bits(fp16_to_fp32(hv)));
        EXPECT_EQ(f32_bits(bf[i]), f32_bits(bf16_to_fp32(bv)));
        // Nearest: no other representable value is closer (finite results).
        if (std::isfinite(hf[i]) && std::fabs(x[i]) < 65504.0f) {
            const float up = fp16_to_fp32(uint16_t(hv + 1)), down = fp16_to_fp32(uint16_t(hv - 1));
            if ((hv & 0x7fff) != 0 && (hv & 0x7fff) < 0x7bff) {
                EXPECT_LE(std::fabs(x[i] - hf[i]), std::fabs(x[i] - up)) << x[i];
                EXPECT_LE(std::fabs(x[i] - hf[i]), std::fabs(x[i] - down)) << x[i];
            }
        }
    }
    // Ties go to the even neighbour: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
    EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), fp32_to_fp16(1.0f));
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)),
              fp32_to_fp16(1.0f + std::ldexp(1.0f, -9)));
}

TEST(QuantFloat, F16ActivationSimdMatchesScalar) {
    std::vector<float> x = special_floats();
    const std::vector<float> r = normal_floats(4099, 2, 30.0f);
    x.insert(x.end(), r.begin(), r.end());
    std::vector<uint16_t> a(x.size()), b(x.size());
    kernels::act_f16_scalar(x.data(), a.data(), int64_t(x.size()));
    if (cpu_has_avx2()) {
        kernels::act_f16_avx2(x.data(), b.data(), int64_t(x.size()));
        EXPECT_EQ(a, b);
    }
    std::vector<uint8_t> via_api = activation(Type::F16, x);
    EXPECT_EQ(std::memcmp(via_api.data(), a.data(), via_api.size()), 0);
}

// ---- Q8_0 / Q8_1: d = fp16(amax / 127), q = round-half-even(x * (127 / amax)).

TEST(QuantActivation, Q8_0FollowsTheX86Backend) {
    const std::vector<float> x = varied_floats(32 * 64, 3);
    const std::vector<uint8_t> q = activation(Type::Q8_0, x);
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(q.data());
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        EXPECT_EQ(blocks[b].d, fp32_to_fp16(amax / 127.f));
        const float id = 127.f / amax;
        for (int j = 0; j < 32; ++j) {
            EXPECT_EQ(blocks[b].qs[j], int8_t(std::nearbyint(x[b * 32 + j] * id))) << b << " " << j;
            // and so the reconstruction is within half a step (plus the fp16 rounding of d)
            const float d = amax / 127.f, dq = fp16_to_fp32(blocks[b].d);
            EXPECT_LE(std::fabs(x[b * 32 + j] - blocks[b].qs[j] * dq),
                      d * (0.5f + 1e-5f) + 127 * std::fabs(d - dq));
        }
    }
}

TEST(QuantActivation, Q8_0AndQ8_1RoundHalfToEven) {
    // amax = 127 makes the multiplier exactly 1, so x itself is rounded.
    std::vector<float> x(32, 0.0f);
    x[0] = 127.0f;
    x[1] = 2.5f;    // -> 2 (roundf would give 3)
    x[2] = 3.5f;    // -> 4
    x[3] = -2.5f;   // -> -2
    x[4] = -0.5f;   // -> 0
    x[5] = 126.5f;  // -> 126
    for (Type t : {Type::Q8_0, Type::Q8_1}) {
        const std::vector<uint8_t> q = activation(t, x);
        const int8_t* qs = t == Type::Q8_0 ? reinterpret_cast<const BlockQ8_0*>(q.data())->qs
                                           : reinterpret_cast<const BlockQ8_1*>(q.data())->qs;
        EXPECT_EQ(qs[0], 127);
        EXPECT_EQ(qs[1], 2);
        EXPECT_EQ(qs[2], 4);
        EXPECT_EQ(qs[3], -2);
        EXPECT_EQ(qs[4], 0);
        EXPECT_EQ(qs[5], 126);
    }
    // Q8_1's s is fp16(d * sum(q)) with the unrounded d.
    const BlockQ8_1 b = *reinterpret_cast<const BlockQ8_1*>(activation(Type::Q8_1, x).data());
    EXPECT_EQ(b.s, fp32_to_fp16(1.0f * (127 + 2 + 4 - 2 + 0 + 126)));
}

TEST(QuantActivation, Q8_1SumIsScaledLevelSum) {
    const std::vector<float> x = varied_floats(32 * 40, 4);
    const std::vector<uint8_t> q = activation(Type::Q8_1, x);
    const std::vector<uint8_t> q0 = activation(Type::Q8_0, x);
    const auto* b1 = reinterpret_cast<const BlockQ8_1*>(q.data());
    const auto* b0 = reinterpret_cast<const BlockQ8_0*>(q0.data());
    for (size_t b = 0; b < x.size() / 32; ++b) {
        EXPECT_EQ(b1[b].d, b0[b].d);
        EXPECT_EQ(std::memcmp(b1[b].qs, b0[b].qs, 32), 0);
        float amax = 0;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            amax = std::max(amax, std::fabs(x[b * 32 + j]));
            sum += b1[b].qs[j];
        }
        EXPECT_EQ(b1[b].s, fp32_to_fp16(amax / 127.f * float(sum)));
    }
}

// ---- Q8_K: iscale = -127 / max (max: the signed element of largest magnitude,
// the first one on ties), q = min(127, round-half-even(iscale * x)), d = 1/iscale.

TEST(QuantActivation, Q8_KSignConventionTiesAndSums) {
    std::vector<float> x(256, 0.0f);
    x[3] = -127.0f;  // largest magnitude, first: iscale = +1
    x[9] = 127.0f;   // same magnitude, later: does not decide the sign
    x[10] = 2.5f;    // -> 2
    x[11] = -3.5f;   // -> -4
    x[200] = 1.5f;   // -> 2
    BlockQ8_K b = *reinterpret_cast<const BlockQ8_K*>(activation(Type::Q8_K, x).data());
    EXPECT_EQ(b.d, 1.0f);
    EXPECT_EQ(b.qs[3], -127);
    EXPECT_EQ(b.qs[9], 127);
    EXPECT_EQ(b.qs[10], 2);
    EXPECT_EQ(b.qs[11], -4);
    EXPECT_EQ(b.qs[200], 2);
    EXPECT_EQ(b.bsums[0], -127 + 127 + 2 - 4);
    EXPECT_EQ(b.bsums[200 / 16], 2);
    // A positive largest element flips the scale's sign (d < 0).
    x[3] = 127.0f;
    x[9] = -127.0f;
    b = *reinterpret_cast<const BlockQ8_K*>(activation(Type::Q8_K, x).data());
    EXPECT_EQ(b.d, -1.0f);
    EXPECT_EQ(b.qs[3], -127);
    EXPECT_EQ(b.qs[10], -2);
    EXPECT_EQ(b.qs[11], 4);
}

TEST(QuantActivation, Q8_KReconstructsWithinHalfAStep) {
    const std::vector<float> x = varied_floats(256 * 32, 5);
    const std::vector<uint8_t> q = activation(Type::Q8_K, x);
    const auto* blocks = reinterpret_cast<const BlockQ8_K*>(q.data());
    for (size_t b = 0; b < x.size() / 256; ++b) {
        float amax = 0;
        int sums[16] = {};
        for (int j = 0; j < 256; ++j) {
            amax = std::max(amax, std::fabs(x[b * 256 + j]));
            sums[j / 16] += blocks[b].qs[j];
        }
        // |d| = amax / 127 up to rounding; every level is the nearest one.
        EXPECT_NEAR(std::fabs(blocks[b].d), amax / 127.f, amax / 127.f * 1e-6f);
        for (int j = 0; j < 256; ++j)
            EXPECT_LE(std::fabs(x[b * 256 + j] - blocks[b].d * blocks[b].qs[j]),
                      std::fabs(blocks[b].d) * (0.5f + 1e-5f));
        for (int j = 0; j < 16; ++j) EXPECT_EQ(blocks[b].bsums[j], sums[j]);
    }
}

TEST(QuantActivation, SimdQuantizersMatchScalarBitForBit) {
    std::vector<float> x = varied_floats(256 * 24, 6);
    // Blocks with ties on the largest magnitude, zeros, and tiny values.
    for (int j = 0; j < 256; ++j) x[j] = 0.0f;
    for (int j = 256; j < 512; ++j)
        x[size_t(j)] = (j % 3 == 0) ? 4.0f : (j % 3 == 1 ? -4.0f : 1.0f);
    for (int j = 512; j < 768; ++j) x[size_t(j)] = std::ldexp(float(j % 17) - 8, -120);
    if (!cpu_has_avx2()) {
        std::printf("this CPU has no AVX2: nothing to compare\n");
        return;
    }
    const int64_t n = int64_t(x.size());
    auto cmp = [&](const char* what, void (*scalar)(const float*, void*, int64_t),
                   void (*simd)(const float*, void*, int64_t), Type t) {
        std::vector<uint8_t> a(row_size(t, n)), b(row_size(t, n));
        scalar(x.data(), a.data(), n);
        simd(x.data(), b.data(), n);
        EXPECT_EQ(a, b) << what;
    };
    cmp("Q8_0", kernels::act_q8_0_scalar, kernels::act_q8_0_avx2, Type::Q8_0);
    cmp("Q8_1", kernels::act_q8_1_scalar, kernels::act_q8_1_avx2, Type::Q8_1);
    cmp("Q8_K", kernels::act_q8_K_scalar, kernels::act_q8_K_avx2, Type::Q8_K);
}

TEST(QuantActivation, AllZeroBlocks) {
    const std::vector<float> x(512, 0.0f);
    for (Type t : {Type::Q8_0, Type::Q8_1, Type::Q8_K, Type::F16, Type::BF16, Type::F32}) {
        const std::vector<float> back = dequantize(t, activation(t, x), 512);
        for (float v : back) EXPECT_EQ(v, 0.0f) << name(t);
    }
}

}  // namespace
}  // namespace glm5::test

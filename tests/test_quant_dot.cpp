// Dot products of every float / legacy / k-quant weight format against its
// activation format:
//  - the scalar reference agrees with a float64 dot of the dequantized rows
//    (so dot products and dequantizers read the same bit layout);
//  - the AVX2 and AVX-512 kernels agree with the reference: bit for bit for the
//    k-quants (same integer sums, same float steps), within a float summation
//    bound for the others, exactly when every float step is exact;
//  - extreme levels (every bit set, activations at +-127) do not overflow.
// The SIMD variants are compared when this CPU has them (the CI machine does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>

#include "quant/ops.h"
#include "quant_test_util.h"

namespace glm5::test {
namespace {

using quant::FormatOps;

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of float

const FormatOps& ops(Type t) {
    const FormatOps* o = quant::float_ops(t);
    if (!o) o = quant::legacy_ops(t);
    if (!o) o = quant::kquant_ops(t);
    return *o;
}

std::vector<int64_t> lengths(Type t) {
    const int64_t bs = quant::traits(t).block_size;
    if (bs == 1) return {1, 7, 8, 15, 16, 31, 33, 64, 100, 129, 1000, 4097};
    if (bs == 32) return {32, 64, 96, 160, 256, 1024, 4128};
    return {256, 512, 768, 2560, 4352};
}

uint32_t bits(float f) {
    return f32_bits(f);
}

// The per-element offset of formats with mins (what a level of 0 decodes to).
std::vector<float> offsets(Type t, std::vector<uint8_t> row, int64_t n) {
    auto zero = [&](size_t off, size_t len) {
        const size_t bs = quant::traits(t).type_size;
        for (size_t b = 0; b < row.size(); b += bs) std::memset(row.data() + b + off, 0, len);
    };
    using namespace quant;
    switch (t) {
        case Type::Q4_1:
            zero(offsetof(BlockQ4_1, qs), 16);
            break;
        case Type::Q5_1:
            zero(offsetof(BlockQ5_1, qh), 20);
            break;
        case Type::Q2_K:
            zero(offsetof(BlockQ2_K, qs), 64);
            break;
        case Type::Q4_K:
            zero(offsetof(BlockQ4_K, qs), 128);
            break;
        case Type::Q5_K:
            zero(offsetof(BlockQ5_K, qh), 32 + 128);
            break;
        default:
            return std::vector<float>(size_t(n), 0.0f);
    }
    return dequantize(t, row, n);
}

struct DotCase {
    Type t;
    int64_t n;
    std::vector<uint8_t> w, a;
    std::vector<float> wf, af, off;
};

DotCase make_case(Type t, int64_t n, uint32_t seed, bool random_bits) {
    DotCase c{t, n, {}, {}, {}, {}, {}};
    const Type act = quant::traits(t).vec_dot_type;
    c.w = random_bits ? random_blocks(t, n, seed) : quantize(t, varied_floats(size_t(n), seed));
    c.a = activation(act, normal_floats(size_t(n), seed + 7, 2.0f));
    c.wf = dequantize(t, c.w, n);
    c.af = dequantize(act, c.a, n);
    c.off = offsets(t, c.w, n);
    return c;
}

// Sum of |terms| the dot product adds up: each weight split into its level
// part and offset part (|w - off| <= |w| + |off|), times the activation.
double magnitude(const DotCase& c) {
    double m = 0;
    for (int64_t i = 0; i < c.n; ++i)
        m += (std::fabs(double(c.wf[i])) + 2 * std::fabs(double(c.off[i]))) *
             std::fabs(double(c.af[i]));
    return m;
}

int64_t n_blocks(const DotCase& c) {
    return c.n / quant::traits(c.t).block_size;
}

// The reference computes each block's contribution with a handful of float
// roundings and adds the blocks in order: (blocks + 16) * u * sum|terms| bounds
// its distance to the exact dot of the dequantized rows (whose own rounding,
// one or two ulps per element, is inside the same budget), doubled for slack.
// Rows are random bit patterns (every level and sub-scale) and quantized data.
TEST(QuantDot, ReferenceMatchesFloat64DotOfDequantizedRows) {
    for (Type t : weight_types())
        for (int64_t n : lengths(t))
            for (bool random_bits : {true, false}) {
                const DotCase c = make_case(t, n, uint32_t(n * 31 + int(t)), random_bits);
                double exact = 0;
                for (int64_t i = 0; i < n; ++i) exact += double(c.wf[i]) * double(c.af[i]);
                const float ref = quant::vec_dot_ref(t, n, c.w.data(), c.a.data());
                double bound = 2 * double(n_blocks(c) + 16) * kU * magnitude(c);
                // Q8_1 stores s = d * sum(q) as fp16 (relative error <= 2^-11, or
                // 2^-25 absolute when subnormal); the offset formats use it as
                // m * s, off by at most 2^-11 * |m| * sum|a| per block.
                for (int64_t i = 0; i < n; ++i)
                    bound +=
                        (std::ldexp(1.0, -11) * std::fabs(double(c.af[i])) + std::ldexp(1.0, -25)) *
                        std::fabs(double(c.off[i]));
                EXPECT_LE(std::fabs(double(ref) - exact), bound)
                    << name(t) << " n=" << n << (random_bits ? " random bits" : " quantized");
            }
}

// SIMD against the reference. K-quants: identical bits. Others: both sum the
// same per-block products in different orders (8-16 float lanes, FMA); each
// term carries a few roundings and each sum at most `blocks` additions, so
// |simd - ref| <= 2 * (blocks + 8) * u * sum|terms|.
void check_simd(bool avx512) {
    const char* isa = avx512 ? "avx512" : "avx2";
    int checked = 0;
    for (Type t : weight_types())
        for (int64_t n : lengths(t))
            for (uint32_t seed = 1; seed <= 3; ++seed)
                for (bool random_bits : {true, false}) {
                    const DotCase c =
                        make_case(t, n, seed * 1000 + uint32_t(n) + uint32_t(t), random_bits);
                    const float ref = ops(t).vec_dot_ref(n, c.w.data(), c.a.data());
                    const FormatOps& o = ops(t);
                    const quant::VecDotFn simd = avx512 ? o.vec_dot_avx512 : o.vec_dot_avx2;
                    ASSERT_NE(simd, nullptr) << isa << " kernel missing for " << name(t);
                    const float got = simd(n, c.w.data(), c.a.data());
                    if (is_kquant(t)) {
                        EXPECT_EQ(bits(got), bits(ref))
                            << isa << " " << name(t) << " n=" << n << ": " << got << " vs " << ref;
                    } else {
                        const double bound = 2 * double(n_blocks(c) + 8) * kU * magnitude(c);
                        EXPECT_LE(std::fabs(double(got) - double(ref)), bound)
                            << isa << " " << name(t) << " n=" << n;
                    }
                    ++checked;
                }
    std::printf("%s: %d dot products compared\n", isa, checked);
}

TEST(QuantDot, Avx2MatchesReference) {
    if (quant::cpu_has_avx2())
        check_simd(false);
    else
        std::printf("this CPU has no AVX2: nothing to compare\n");
}

TEST(QuantDot, Avx512MatchesReference) {
    if (quant::cpu_has_avx512())
        check_simd(true);
    else
        std::printf("this CPU has no AVX-512 VNNI: nothing to compare\n");
}

// With every scale 1 (and no offsets) every float step is exact, so the SIMD
// kernels of the non-k formats must return exactly the integer dot product.
TEST(QuantDot, LegacyIntegerPartsAreExact) {
    for (Type t : {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0}) {
        const int64_t n = 512;  // 512 * 127 * 127 < 2^24: integer sums exact in float
        std::vector<uint8_t> w = random_blocks(t, n, 99);
        set_all_fp16(t, w, 0, 1.0f);
        if (t == Type::Q4_1 || t == Type::Q5_1) set_all_fp16(t, w, 2, 0.0f);
        const Type act = quant::traits(t).vec_dot_type;
        std::vector<uint8_t> a = activation(act, normal_floats(size_t(n), 5));
        set_all_fp16(act, a, 0, 1.0f);
        const std::vector<float> wf = dequantize(t, w, n), af = dequantize(act, a, n);
        double exact = 0;
        for (int64_t i = 0; i < n; ++i) exact += double(wf[i]) * double(af[i]);
        const FormatOps& o = ops(t);
        EXPECT_EQ(double(o.vec_dot_ref(n, w.data(), a.data())), exact) << name(t);
        if (quant::cpu_has_avx2()) {
            EXPECT_EQ(double(o.vec_dot_avx2(n, w.data(), a.data())), exact) << name(t);
        }
        if (quant::cpu_has_avx512()) {
            EXPECT_EQ(double(o.vec_dot_avx512(n, w.data(), a.data())), exact) << name(t);
        }
    }
}

// All level and scale bits set, activations all +127 or all -127: the largest
// intermediate sums the kernels can meet. Scales 1 keep everything exact.
TEST(QuantDot, ExtremeLevelsDoNotOverflow) {
    for (Type t : weight_types()) {
        if (quant::traits(t).block_size == 1) continue;
        const int64_t n = quant::traits(t).block_size == 32 ? 512 : 1024;
        for (int sign : {1, -1}) {
            std::vector<uint8_t> w(quant::row_size(t, n), 0xFF);
            if (t == Type::Q8_0)  // 0xFF is -1; use +-127 levels instead
                for (size_t b = 0; b < w.size(); b += sizeof(quant::BlockQ8_0))
                    std::memset(w.data() + b + 2, 0x81, 32);
            // d (and dmin / m) = 1: where they sit in each block.
            using namespace quant;
            switch (t) {
                case Type::Q2_K:
                    set_all_fp16(t, w, offsetof(BlockQ2_K, d), 1.0f);
                    set_all_fp16(t, w, offsetof(BlockQ2_K, dmin), 1.0f);
                    break;
                case Type::Q3_K:
                    set_all_fp16(t, w, offsetof(BlockQ3_K, d), 1.0f);
                    break;
                case Type::Q4_K:
                case Type::Q5_K:
                    set_all_fp16(t, w, 0, 1.0f);
                    set_all_fp16(t, w, 2, 1.0f);
                    break;
                case Type::Q6_K:
                    set_all_fp16(t, w, offsetof(BlockQ6_K, d), 1.0f);
                    break;
                default:
                    set_all_fp16(t, w, 0, 1.0f);
                    if (t == Type::Q4_1 || t == Type::Q5_1) set_all_fp16(t, w, 2, 1.0f);
            }
            const Type act = traits(t).vec_dot_type;
            std::vector<float> x(size_t(n), 127.0f * float(sign));
            std::vector<uint8_t> a = activation(act, x);  // levels +-127, d = 1
            const std::vector<float> wf = dequantize(t, w, n), af = dequantize(act, a, n);
            double exact = 0;
            for (int64_t i = 0; i < n; ++i) exact += double(wf[i]) * double(af[i]);
            const FormatOps& o = ops(t);
            const float ref = o.vec_dot_ref(n, w.data(), a.data());
            EXPECT_NEAR(double(ref), exact, std::fabs(exact) * 4 * kU) << name(t);
            if (cpu_has_avx2()) {
                EXPECT_EQ(o.vec_dot_avx2(n, w.data(), a.data()), ref) << name(t) << " avx2";
            }
            if (cpu_has_avx512()) {
                EXPECT_EQ(o.vec_dot_avx512(n, w.data(), a.data()), ref) << name(t) << " avx512";
            }
        }
    }
}

TEST(QuantDot, DispatchPicksTheWidestKernel) {
    for (Type t : weight_types()) {
        const FormatOps& o = ops(t);
        const quant::VecDotFn f = quant::vec_dot_fn(t);
        if (quant::cpu_has_avx512()) {
            EXPECT_EQ(f, o.vec_dot_avx512) << name(t);
        } else if (quant::cpu_has_avx2())
            EXPECT_EQ(f, o.vec_dot_avx2) << name(t);
        else
            EXPECT_EQ(f, o.vec_dot_ref) << name(t);
    }
}

}  // namespace
}  // namespace glm5::test

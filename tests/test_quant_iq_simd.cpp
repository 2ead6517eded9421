// The SIMD dot products of the i-quant formats against the scalar reference.
//
// Weight rows are random bytes (every index, sign and sub-scale pattern is a
// valid block) with sane fp16 scales; activation rows are random 8-bit values
// in [-127, 127], plus an all-+-127 pattern that drives every int16/int32
// intermediate to its largest magnitude. The integer part of every kernel is
// exact, so SIMD and reference differ only by float accumulation order: the
// allowed difference is 1e-5 of sum |w_i * a_i| (a float rounding of each of
// a few hundred partial sums stays far below that).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "iq_test_util.h"
#include "quant/iq_kernels.h"
#include "quant/ops.h"
#include "quant/quant.h"

namespace {

using namespace glm5::quant;
using iqtest::iquant_types;

std::vector<int64_t> lengths(Type t) {
    if (traits(t).block_size == 32) return {32, 64, 96, 128, 224, 1024, 4096 + 32};
    return {256, 512, 768, 1280, 4096, 7168};
}

struct Kernel {
    const char* isa;
    VecDotFn fn;
};

std::vector<Kernel> kernels(Type t) {
    const FormatOps* ops = iquant_ops(t);
    std::vector<Kernel> k;
    if (ops->vec_dot_avx2 && cpu_has_avx2()) k.push_back({"avx2", ops->vec_dot_avx2});
    if (ops->vec_dot_avx512 && cpu_has_avx512()) k.push_back({"avx512", ops->vec_dot_avx512});
    // IQ2_XXS has two AVX-512 variants, picked at run time: test both where possible.
    if (t == Type::IQ2_XXS && cpu_has_avx512()) {
        k.push_back({"avx512bw", glm5::quant::iq::dot_iq2_xxs_avx512bw});
        if (__builtin_cpu_supports("avx512vbmi"))
            k.push_back({"avx512vbmi", glm5::quant::iq::dot_iq2_xxs_avx512vbmi});
    }
    return k;
}

double abs_product_sum(Type t, const std::vector<uint8_t>& w, const std::vector<uint8_t>& a,
                       int64_t n) {
    std::vector<float> wv(n);
    dequantize_row(t, w.data(), wv.data(), n);
    const std::vector<float> av = iqtest::activation_values(t, a, n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::fabs(double(wv[i]) * av[i]);
    return s;
}

TEST(IQuantSimd, EveryFormatHasAnAvx2KernelAndTheRequiredAvx512Ones) {
    for (Type t : iquant_types()) {
        const FormatOps* ops = iquant_ops(t);
        ASSERT_NE(ops, nullptr) << name(t);
        EXPECT_NE(ops->vec_dot_avx2, nullptr) << name(t);
    }
    for (Type t : {Type::IQ2_XXS, Type::IQ4_XS, Type::IQ4_NL})
        EXPECT_NE(iquant_ops(t)->vec_dot_avx512, nullptr) << name(t);
}

TEST(IQuantSimd, DispatchPicksTheWidestKernelTheCpuRuns) {
    for (Type t : iquant_types()) {
        const FormatOps* ops = iquant_ops(t);
        VecDotFn want = ops->vec_dot_ref;
        if (ops->vec_dot_avx2 && cpu_has_avx2()) want = ops->vec_dot_avx2;
        if (ops->vec_dot_avx512 && cpu_has_avx512()) want = ops->vec_dot_avx512;
        EXPECT_EQ(vec_dot_fn(t), want) << name(t);
    }
}

TEST(IQuantSimd, MatchesReferenceOnRandomBlocks) {
    std::mt19937 rng(20261130);
    int checked = 0;
    for (Type t : iquant_types()) {
        const std::vector<Kernel> ks = kernels(t);
        for (int64_t n : lengths(t)) {
            for (int rep = 0; rep < 3; ++rep) {
                const bool extreme = rep == 2;
                const auto w = iqtest::random_weight_row(t, n, rng);
                const auto a = iqtest::random_activation_row(t, n, rng, extreme);
                const float ref = vec_dot_ref(t, n, w.data(), a.data());
                const double tol = 1e-5 * abs_product_sum(t, w, a, n);
                ASSERT_TRUE(std::isfinite(ref));
                for (const Kernel& k : ks) {
                    const float got = k.fn(n, w.data(), a.data());
                    EXPECT_NEAR(got, ref, tol) << name(t) << " " << k.isa << " n=" << n
                                               << (extreme ? " (+-127 activations)" : "");
                    ++checked;
                }
            }
        }
    }
    // On any x86-64 CPU with AVX2 this compares every format at least once.
    if (cpu_has_avx2()) {
        EXPECT_GE(checked, int(iquant_types().size()) * 3);
    }
}

// Realistic operands: weights quantized from Gaussian rows, activations
// quantized by the engine's own activation quantizer (Q8_K / Q8_0).
TEST(IQuantSimd, MatchesReferenceOnQuantizedRows) {
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (Type t : iquant_types()) {
        const Type at = traits(t).vec_dot_type;
        for (int64_t n : {traits(t).block_size * 8, int64_t(2048)}) {
            std::vector<float> xw(n), xa(n);
            for (auto& v : xw) v = nd(rng);
            for (auto& v : xa) v = nd(rng);
            std::vector<uint8_t> w(row_size(t, n)), a(row_size(at, n));
            quantize_rows(t, xw.data(), w.data(), 1, n, nullptr);
            quantize_activation_row(at, xa.data(), a.data(), n);
            const float ref = vec_dot_ref(t, n, w.data(), a.data());
            const double tol = 1e-5 * abs_product_sum(t, w, a, n);
            for (const Kernel& k : kernels(t))
                EXPECT_NEAR(k.fn(n, w.data(), a.data()), ref, tol)
                    << name(t) << " " << k.isa << " n=" << n;
        }
    }
}

// The reference against a plain float dot product of dequantized weights and
// activations: checks the reference's own integer/scale bookkeeping (the 1/8
// and 1/4 factors, IQ1's delta via block sums, IQ4_XS's per-32 float sums).
TEST(IQuantSimd, ReferenceEqualsDequantizedDotProduct) {
    std::mt19937 rng(7);
    for (Type t : iquant_types()) {
        for (int64_t n : lengths(t)) {
            const auto w = iqtest::random_weight_row(t, n, rng);
            const auto a = iqtest::random_activation_row(t, n, rng, false);
            std::vector<float> wv(n);
            dequantize_row(t, w.data(), wv.data(), n);
            const std::vector<float> av = iqtest::activation_values(t, a, n);
            double exact = 0;
            for (int64_t i = 0; i < n; ++i) exact += double(wv[i]) * av[i];
            EXPECT_NEAR(vec_dot_ref(t, n, w.data(), a.data()), exact,
                        1e-5 * abs_product_sum(t, w, a, n))
                << name(t) << " n=" << n;
        }
    }
}

}  // namespace

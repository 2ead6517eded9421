// The multi-activation dot kernels (the prefill matmul's inner loop) give
// bit for bit what the single-row kernel gives for each activation row: the
// promise that batching never changes a logit rests on it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "quant/ops.h"
#include "quant/quant.h"

using namespace glm5::quant;

namespace {

// The formats with a multi-activation kernel at the kernel level in force
// (GLM5_CPU or the CPU's): the AVX-512 VNNI level, and the AVX2 level for the
// float formats (F32, F16, BF16) and Q4_K, Q5_K, Q6_K; the scalar level has none.
int expected_multi_kernels() {
    int n = 0;
    for (uint32_t raw = 0; raw < 40; ++raw) {
        const TypeTraits* tt = find_traits(raw);
        if (!tt || !tt->weight_format) continue;
        const Type t = Type(raw);
        const FormatOps* o = float_ops(t);
        if (!o) o = legacy_ops(t);
        if (!o) o = kquant_ops(t);
        if (!o) o = iquant_ops(t);
        if (!o) continue;
        if (cpu_has_avx512() && o->vec_dot_avx512)
            n += o->vec_dot_multi_avx512 != nullptr;
        else if (cpu_has_avx2() && o->vec_dot_avx2)
            n += o->vec_dot_multi_avx2 != nullptr;
    }
    return n;
}

TEST(QuantMulti, BitIdenticalToSingleRowKernel) {
    // (At the scalar level every product runs the single-row kernel per
    // activation: nothing is compared and none may be offered, checked below.)
    int checked = 0;
    for (uint32_t raw = 0; raw < 40; ++raw) {
        const TypeTraits* tt = find_traits(raw);
        if (!tt || !tt->weight_format) continue;
        const Type t = Type(raw);
        const VecDotMultiFn multi = vec_dot_multi_fn(t);
        if (!multi) continue;
        const VecDotFn single = vec_dot_fn(t);
        std::mt19937 rng(raw);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // (100 and 200: float rows with a 16-value and a scalar tail.)
        for (int64_t n : {256, 512, 2048, 768, 100, 200}) {
            if (n % tt->block_size) continue;
            std::vector<float> wf(static_cast<size_t>(n));
            for (auto& v : wf) v = nd(rng) * 0.05f;
            std::vector<uint8_t> w(row_size(t, n));
            quantize_rows(t, wf.data(), w.data(), 1, n, nullptr);
            const Type at = tt->vec_dot_type;
            const size_t arow = row_size(at, n);
            for (int64_t n_act = 1; n_act <= 9; ++n_act) {
                std::vector<uint8_t> acts(arow * size_t(n_act));
                std::vector<float> x(static_cast<size_t>(n));
                for (int64_t i = 0; i < n_act; ++i) {
                    for (auto& v : x) v = nd(rng) * (i % 3 == 0 ? 10.0f : 0.3f);
                    quantize_activation_row(at, x.data(), acts.data() + size_t(i) * arow, n);
                }
                std::vector<float> got(static_cast<size_t>(n_act));
                multi(n, w.data(), acts.data(), arow, n_act, got.data());
                for (int64_t i = 0; i < n_act; ++i) {
                    const float want = single(n, w.data(), acts.data() + size_t(i) * arow);
                    uint32_t a, b;
                    std::memcpy(&a, &want, 4);
                    std::memcpy(&b, &got[size_t(i)], 4);
                    ASSERT_EQ(a, b) << name(t) << " n=" << n << " n_act=" << n_act << " row " << i
                                    << ": " << want << " vs " << got[size_t(i)];
                }
            }
        }
        ++checked;
    }
    // Every kernel the level has was checked, and none above it was offered
    // (at a level without any, vec_dot_multi_fn must answer null for all).
    EXPECT_EQ(checked, expected_multi_kernels()) << "at level " << cpu_level_name(cpu_level());
    if (cpu_has_avx512()) {
        EXPECT_GT(checked, 0) << "no multi-activation kernel at the VNNI level";
    } else if (cpu_has_avx2()) {
        EXPECT_EQ(checked, 6)
            << "the AVX2 level has the F32, F16, BF16, Q4_K, Q5_K and Q6_K multi kernels";
    }
}

// BF16 weights against activations expanded to floats once: the bits of the
// single-row BF16 kernel on the BF16 rows. Offered exactly at the AVX-512 level.
TEST(QuantMulti, Bf16AgainstExpandedActivationsIsTheBf16Dot) {
    const VecDotMultiFn f32act = bf16_dot_multi_f32act_fn();
    ASSERT_EQ(f32act != nullptr, cpu_has_avx512()) << "at level " << cpu_level_name(cpu_level());
    if (!f32act) return;
    const VecDotFn single = vec_dot_fn(Type::BF16);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t n : {1024, 100, 200, 17}) {
        std::vector<float> wf(static_cast<size_t>(n));
        for (auto& v : wf) v = nd(rng) * 0.05f;
        std::vector<uint8_t> w(row_size(Type::BF16, n));
        quantize_rows(Type::BF16, wf.data(), w.data(), 1, n, nullptr);
        for (int64_t n_act = 1; n_act <= 9; ++n_act) {
            std::vector<float> x(static_cast<size_t>(n)), wide(size_t(n * n_act));
            std::vector<uint8_t> narrow(row_size(Type::BF16, n) * size_t(n_act));
            for (int64_t i = 0; i < n_act; ++i) {
                for (auto& v : x) v = nd(rng) * (i % 3 == 0 ? 10.0f : 0.3f);
                quantize_activation_row(Type::BF16, x.data(),
                                        narrow.data() + size_t(i) * row_size(Type::BF16, n), n);
                expand_bf16_activation(x.data(), wide.data() + i * n, n);
            }
            std::vector<float> got(static_cast<size_t>(n_act));
            f32act(n, w.data(), wide.data(), size_t(n) * 4, n_act, got.data());
            for (int64_t i = 0; i < n_act; ++i) {
                const float want =
                    single(n, w.data(), narrow.data() + size_t(i) * row_size(Type::BF16, n));
                uint32_t a, b;
                std::memcpy(&a, &want, 4);
                std::memcpy(&b, &got[size_t(i)], 4);
                ASSERT_EQ(a, b) << "n=" << n << " n_act=" << n_act << " row " << i;
            }
        }
    }
}

}  // namespace

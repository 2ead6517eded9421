// backend/device_math.h, the attention arithmetic of a GPU's kernels, on the host
// against the CPU backend's kernels: the radix select's top k (the indexer's rule: the
// k highest scores, ties to the lower index) is kernels::top_k_rows's, row for row;
// the running softmax, key by key or in blocks merged in order, is the two-pass
// softmax's weighted sum within float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu_kernels.h"
#include "backend/device_math.h"

namespace glm5 {
namespace {

namespace device = backend::device;

// The radix select's rows, ascending, as a GPU writes them.
std::vector<int32_t> radix_top_k(const std::vector<float>& v, int64_t k) {
    const int64_t n = int64_t(v.size());
    std::vector<uint32_t> key(v.size());
    for (size_t i = 0; i < v.size(); ++i) key[i] = device::order_key(v[i]);
    int64_t equal = 0;
    const uint32_t kth = device::radix_kth(key.data(), n, k, &equal);
    std::vector<int32_t> out;
    int64_t equal_before = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (device::takes(key[size_t(i)], kth, equal_before, equal)) out.push_back(int32_t(i));
        equal_before += key[size_t(i)] == kth;
    }
    return out;
}

TEST(DeviceMath, RadixSelectTakesTheCpuIndexersRows) {
    std::mt19937 rng(3);
    for (int64_t n : {1, 7, 300, 2048, 5000}) {
        for (int64_t k : {int64_t(1), int64_t(16), int64_t(2048), n}) {
            if (k > n) continue;
            for (int ties : {0, 1}) {
                std::vector<float> v(static_cast<size_t>(n));
                std::normal_distribution<float> nd(0.f, 3.f);
                // With ties: few distinct values (zeros of both signs among them), so
                // the k-th value is shared by many rows.
                for (auto& x : v)
                    x = ties ? float(int(nd(rng))) * (rng() % 2 ? -0.f : 1.f) : nd(rng);
                std::vector<int32_t> want(static_cast<size_t>(k)), tmp;
                backend::kernels::top_k_rows(v.data(), n, k, tmp, want.data());
                EXPECT_EQ(radix_top_k(v, k), want) << "n " << n << ", k " << k << ", ties " << ties;
            }
        }
    }
}

TEST(DeviceMath, OrderKeyOrdersAsTheFloats) {
    const float vals[] = {-INFINITY, -3e38f, -1.5f, -1e-40f, -0.f,
                          0.f,       1e-40f, 2.f,   3e38f,   INFINITY};
    for (float a : vals)
        for (float b : vals) {
            EXPECT_EQ(device::order_key(a) < device::order_key(b), a < b) << a << " " << b;
            EXPECT_EQ(device::order_key(a), backend::kernels::order_key(a));
        }
}

// out = sum_j softmax(s)_j * val_j, the two-pass way (double sums: the reference).
std::vector<double> two_pass(const std::vector<float>& s, const std::vector<float>& val, int dim) {
    double mx = -INFINITY, sum = 0;
    for (float x : s) mx = std::max(mx, double(x));
    std::vector<double> out(size_t(dim), 0.0);
    for (size_t j = 0; j < s.size(); ++j) sum += std::exp(double(s[j]) - mx);
    for (size_t j = 0; j < s.size(); ++j) {
        const double p = std::exp(double(s[j]) - mx) / sum;
        for (int d = 0; d < dim; ++d) out[size_t(d)] += p * val[j * size_t(dim) + size_t(d)];
    }
    return out;
}

TEST(DeviceMath, RunningSoftmaxIsTheTwoPassSoftmax) {
    std::mt19937 rng(5);
    const int dim = 16;
    for (int64_t n : {1, 3, 64, 1000}) {
        std::normal_distribution<float> nd(0.f, 4.f);  // a wide spread: the max moves often
        std::vector<float> s(static_cast<size_t>(n)), val(static_cast<size_t>(n * dim));
        for (auto& x : s) x = nd(rng);
        for (auto& x : val) x = nd(rng);
        const std::vector<double> want = two_pass(s, val, dim);
        // Key by key.
        device::SoftmaxRun r = device::softmax_start();
        std::vector<float> acc(dim, 0.f);
        for (int64_t j = 0; j < n; ++j) {
            float rescale = 0;
            const float w = device::softmax_add(r, s[size_t(j)], &rescale);
            for (int d = 0; d < dim; ++d)
                acc[size_t(d)] = acc[size_t(d)] * rescale + w * val[size_t(j * dim + d)];
        }
        // Blocks of 37 keys, each its own run, merged in order (a block that is empty
        // merges as nothing).
        device::SoftmaxRun all = device::softmax_start();
        std::vector<float> merged(dim, 0.f);
        for (int64_t b = 0; b <= n; b += 37) {
            device::SoftmaxRun blk = device::softmax_start();
            std::vector<float> part(dim, 0.f);
            for (int64_t j = b; j < std::min(n, b + 37); ++j) {
                float rescale = 0;
                const float w = device::softmax_add(blk, s[size_t(j)], &rescale);
                for (int d = 0; d < dim; ++d)
                    part[size_t(d)] = part[size_t(d)] * rescale + w * val[size_t(j * dim + d)];
            }
            float sa = 0, sb = 0;
            device::softmax_merge(all, blk, &sa, &sb);
            for (int d = 0; d < dim; ++d)
                merged[size_t(d)] = merged[size_t(d)] * sa + part[size_t(d)] * sb;
        }
        for (int d = 0; d < dim; ++d) {
            const double tol = 1e-5 * (1 + std::fabs(want[size_t(d)]));
            EXPECT_NEAR(acc[size_t(d)] / r.sum, want[size_t(d)], tol) << "n " << n << " d " << d;
            EXPECT_NEAR(merged[size_t(d)] / all.sum, want[size_t(d)], tol)
                << "n " << n << " d " << d;
        }
    }
}

}  // namespace
}  // namespace glm5

// MLA attention over an F16 cache, through the helpers the CPU picks at run
// time (the AVX-512 tiles where the CPU has them): scores agree with a
// double-precision reference, output sums have the bits of the row-by-row
// axpy path, and no result depends on how heads, rows or queries are grouped
// into one call (the CPU determinism promise for prefill against decode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cpu_backend.h"
#include "backend/cpu_kernels.h"
#include "backend/cpu_memory.h"
#include "backend/cpu_simd.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/ops.h"
#include "quant/quant.h"

using namespace glm5;
using namespace glm5::backend;
using cpu::dev;
using cpu::F16Rows;

namespace {

struct Cache {
    int64_t width;
    std::vector<uint16_t> bits;
    Cache(int64_t rows, int64_t w, uint32_t seed) : width(w), bits(size_t(rows * w)) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> d(0.f, 1.f);
        for (auto& b : bits) b = fp32_to_fp16(d(rng));
    }
    F16Rows rows(const int32_t* idx = nullptr) const {
        return {reinterpret_cast<const uint8_t*>(bits.data()), size_t(width) * 2, idx};
    }
};

std::vector<float> f16_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = round_fp16(d(rng));
    return v;
}

bool same_bits(const float* a, const float* b, size_t n) {
    return std::memcmp(a, b, n * sizeof(float)) == 0;
}

constexpr int64_t kHeads = 16, kWidth = 576, kValue = 512;

TEST(AttentionSimd, ScoresMatchDoubleReference) {
    for (int64_t w : {kWidth, int64_t(100)}) {
        const int64_t n = 37;
        const Cache c(n, w, 1);
        const auto q = f16_floats(size_t(kHeads * w), 2);
        std::vector<float> s(size_t(kHeads * n));
        cpu::simd().scores_f16(q.data(), kHeads, w, c.rows(), n, s.data(), n);
        for (int64_t h = 0; h < kHeads; ++h)
            for (int64_t j = 0; j < n; ++j) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < w; ++i) {
                    const double k = fp16_to_fp32(c.bits[size_t(j * w + i)]);
                    ref += double(q[size_t(h * w + i)]) * k;
                    mag += std::fabs(double(q[size_t(h * w + i)]) * k);
                }
                ASSERT_NEAR(s[size_t(h * n + j)], ref, 1e-6 * mag + 1e-30)
                    << "w " << w << " head " << h << " row " << j;
            }
    }
}

TEST(AttentionSimd, WeightedSumHasTheBitsOfRowAxpy) {
    const cpu::SimdOps& sv = cpu::simd();
    for (int64_t vw : {kValue, int64_t(100)}) {
        const int64_t n = 45, w = vw + 64;
        const Cache c(n, w, 3);
        const auto p = f16_floats(size_t(kHeads * n), 4);
        std::vector<float> got(size_t(kHeads * vw)), want(size_t(kHeads * vw), 0.0f);
        sv.weighted_sum_f16(p.data(), n, kHeads, c.rows(), n, vw, got.data());
        for (int64_t j = 0; j < n; ++j)
            for (int64_t h = 0; h < kHeads; ++h)
                sv.axpy_f16(vw, p[size_t(h * n + j)], c.bits.data() + j * w, want.data() + h * vw);
        EXPECT_TRUE(same_bits(got.data(), want.data(), got.size())) << "v width " << vw;
    }
}

TEST(AttentionSimd, NoResultDependsOnGrouping) {
    const cpu::SimdOps& sv = cpu::simd();
    const int64_t n = 37;
    const Cache c(n, kWidth, 5);
    const auto q = f16_floats(size_t(kHeads * kWidth), 6);
    std::vector<float> all(size_t(kHeads * n));
    sv.scores_f16(q.data(), kHeads, kWidth, c.rows(), n, all.data(), n);

    // Heads split unevenly, and a shorter prefix of the rows.
    const int64_t splits[] = {0, 3, 8, 9, 16};
    const int64_t m = 21;
    std::vector<float> part(size_t(kHeads * m));
    for (int i = 0; i + 1 < 5; ++i) {
        const int64_t h0 = splits[i], nh = splits[i + 1] - h0;
        sv.scores_f16(q.data() + h0 * kWidth, nh, kWidth, c.rows(), m, part.data(), m);
        for (int64_t h = 0; h < nh; ++h)
            ASSERT_TRUE(same_bits(part.data() + h * m, all.data() + (h0 + h) * n, size_t(m)));
    }

    // Listed rows (as the indexer's selection) in another order.
    const std::vector<int32_t> idx = {30, 2, 17, 36, 0, 9, 11};
    const int64_t k = int64_t(idx.size());
    std::vector<float> sel(size_t(kHeads * k));
    sv.scores_f16(q.data(), kHeads, kWidth, c.rows(idx.data()), k, sel.data(), k);
    for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t j = 0; j < k; ++j)
            ASSERT_EQ(sel[size_t(h * k + j)], all[size_t(h * n + idx[size_t(j)])]);

    // Output sums: heads split, one head at a time.
    const auto p = f16_floats(size_t(kHeads * n), 7);
    std::vector<float> out(size_t(kHeads * kValue)), one(static_cast<size_t>(kValue));
    sv.weighted_sum_f16(p.data(), n, kHeads, c.rows(), n, kValue, out.data());
    for (int64_t h = 0; h < kHeads; ++h) {
        sv.weighted_sum_f16(p.data() + h * n, n, 1, c.rows(), n, kValue, one.data());
        ASSERT_TRUE(same_bits(one.data(), out.data() + h * kValue, size_t(kValue))) << h;
    }
}

// The query and cache rounding: the bits of the software conversion, over
// random values of every magnitude, F16 ties, subnormals and overflow.
TEST(AttentionSimd, F16RoundingHasTheBitsOfTheSoftwareOne) {
    std::mt19937 rng(10);
    std::vector<float> x;
    for (int i = 0; i < 20000; ++i)
        x.push_back(f32_from_bits(uint32_t(rng()) & 0xC7FFFFFFu));  // |x| < 2^16 and tiny
    for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 1.0009765625f,
                    1.00048828125f, 1.00146484375f, INFINITY, -INFINITY})
        x.push_back(v);
    const int64_t n = int64_t(x.size());
    std::vector<float> y(x.size());
    std::vector<uint16_t> h(x.size());
    cpu::simd().round_f16(n, x.data(), y.data());
    cpu::simd().f32_to_f16(n, x.data(), h.data());
    for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(h[i], fp32_to_fp16(x[i])) << x[i];
        ASSERT_EQ(f32_bits(y[i]), f32_bits(round_fp16(x[i]))) << x[i];
    }
}

TEST(AttentionSimd, SoftmaxMatchesTheScalarOne) {
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.f, 8.f);
    for (int64_t n : {1, 7, 16, 45, 300}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (auto& v : x) v = d(rng);
        if (n > 1) x[0] = -200.0f;  // e^(x - max) underflows to 0
        for (bool r16 : {false, true}) {
            auto got = x, want = x;
            cpu::simd().softmax(got.data(), n, r16);
            cpu::scalar::softmax(want.data(), n, r16);
            double total = 0;
            for (int64_t j = 0; j < n; ++j) {
                // Within two F16 steps (rounded) or 1e-6 relative (not rounded).
                const float tol = r16 ? std::ldexp(std::fabs(want[size_t(j)]), -9) + 1e-7f
                                      : 1e-6f * std::fabs(want[size_t(j)]) + 1e-12f;
                ASSERT_NEAR(got[size_t(j)], want[size_t(j)], tol) << n << " " << j;
                if (r16) {
                    ASSERT_EQ(got[size_t(j)], round_fp16(got[size_t(j)]));
                }
                total += got[size_t(j)];
            }
            if (n > 1) {
                EXPECT_EQ(got[0], 0.0f);
            }
            EXPECT_NEAR(total, 1.0, r16 ? 1e-2 : 1e-5);
        }
    }
}

// SwiGLU (the FFN's activation, vectorised beside the softmax): within a
// few ulp of silu(g) * u in double, with and without the clamp, in place,
// at the extremes of e^-g (underflow and overflow), and at every tail length.
TEST(AttentionSimd, SwigluMatchesDoubleReference) {
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.f, 6.f);
    for (int64_t n : {1, 5, 16, 33, 768}) {
        std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
        for (auto& v : g) v = d(rng);
        for (auto& v : u) v = d(rng);
        if (n > 2) {
            g[0] = -120.0f;  // e^120 overflows: silu is -0
            g[1] = 95.0f;    // e^-95 underflows: silu is g
        }
        for (float clamp : {0.0f, 7.0f}) {
            std::vector<float> got(static_cast<size_t>(n)), scal(got.size());
            cpu::simd().swiglu(n, g.data(), u.data(), clamp, got.data());
            cpu::scalar::swiglu(n, g.data(), u.data(), clamp, scal.data());
            auto inplace = g;
            cpu::simd().swiglu(n, inplace.data(), u.data(), clamp, inplace.data());
            for (int64_t i = 0; i < n; ++i) {
                double gi = g[size_t(i)], ui = u[size_t(i)];
                if (clamp > 0) {
                    gi = std::min(gi, double(clamp));
                    ui = std::clamp(ui, -double(clamp), double(clamp));
                }
                const double want = gi / (1.0 + std::exp(-gi)) * ui;
                const double tol = 4e-7 * std::fabs(want) + 1e-30;
                ASSERT_NEAR(got[size_t(i)], want, tol) << n << " " << i << " clamp " << clamp;
                ASSERT_NEAR(scal[size_t(i)], want, tol) << n << " " << i << " clamp " << clamp;
                ASSERT_EQ(inplace[size_t(i)], got[size_t(i)]);
            }
        }
    }
}

// RMS norm through the picked helper has the bits of the scalar row (the
// same eight partial sums in double), at every tail length, with and
// without the weight, in place.
TEST(AttentionSimd, RmsNormHasTheBitsOfTheScalarRow) {
    for (int64_t n : {1, 7, 8, 128, 2051}) {
        const auto x = f16_floats(size_t(n), uint32_t(n));
        const auto w = f16_floats(size_t(n), uint32_t(n + 1));
        for (const float* wp : {static_cast<const float*>(nullptr), w.data()}) {
            std::vector<float> want(x.size()), got(x.size());
            backend::kernels::rms_norm_row(x.data(), wp, n, 1e-5f, want.data());
            cpu::simd().rms_norm(x.data(), wp, n, 1e-5f, got.data());
            auto inplace = x;
            cpu::simd().rms_norm(inplace.data(), wp, n, 1e-5f, inplace.data());
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << n;
            ASSERT_EQ(0, std::memcmp(want.data(), inplace.data(), want.size() * sizeof(float)))
                << n;
            double ss = 0;
            for (float v : x) ss += double(v) * v;
            const double scale = 1.0 / std::sqrt(ss / double(n) + 1e-5);
            for (int64_t i = 0; i < n; ++i)
                ASSERT_NEAR(got[size_t(i)], x[size_t(i)] * scale * (wp ? wp[i] : 1.0f),
                            1e-5 * std::fabs(x[size_t(i)] * scale) + 1e-7);
        }
    }
}

// The AVX2 tiles against the row helpers they replaced, bit for bit: every
// (head, row) score is dot_f32_f16 of the two, every output value the chain
// of axpy_f16 over the rows, at tails of every kind (an odd number of 8-value
// chunks, a width not a multiple of 8, fewer rows or heads than a tile).
TEST(AttentionSimd, Avx2TilesHaveTheBitsOfTheRowHelpers) {
    if (!quant::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
    for (int64_t w : {kWidth, int64_t(584), int64_t(100), int64_t(8), int64_t(3)}) {
        for (int64_t nh : {1, 2, 4, 7, 16}) {
            const int64_t n = 37;
            const Cache c(n, w, 11);
            const auto q = f16_floats(size_t(nh * w), 12);
            const std::vector<int32_t> idx = {30, 2, 17, 36, 0, 9, 11, 3, 4, 5, 6};
            for (bool listed : {false, true}) {
                const int64_t m = listed ? int64_t(idx.size()) : n;
                const F16Rows rows = c.rows(listed ? idx.data() : nullptr);
                std::vector<float> got(size_t(nh * m));
                cpu::avx2::scores_f16(q.data(), nh, w, rows, m, got.data(), m);
                for (int64_t h = 0; h < nh; ++h)
                    for (int64_t j = 0; j < m; ++j) {
                        const float want = cpu::avx2::dot_f32_f16(w, q.data() + h * w, rows.row(j));
                        ASSERT_TRUE(same_bits(&got[size_t(h * m + j)], &want, 1))
                            << "w " << w << " heads " << nh << " head " << h << " row " << j;
                    }
            }
        }
    }
    for (int64_t vw : {kValue, int64_t(100), int64_t(24), int64_t(5)}) {
        for (int64_t nh : {1, 3, 5, 16}) {
            const int64_t n = 41, w = vw + 64;
            const Cache c(n, w, 13);
            const auto p = f16_floats(size_t(nh * n), 14);
            std::vector<float> got(size_t(nh * vw)), want(size_t(nh * vw), 0.0f);
            cpu::avx2::weighted_sum_f16(p.data(), n, nh, c.rows(), n, vw, got.data());
            for (int64_t j = 0; j < n; ++j)
                for (int64_t h = 0; h < nh; ++h)
                    cpu::avx2::axpy_f16(vw, p[size_t(h * n + j)], c.bits.data() + j * w,
                                        want.data() + h * vw);
            EXPECT_TRUE(same_bits(got.data(), want.data(), got.size()))
                << "v width " << vw << " heads " << nh;
        }
    }
}

// The indexer's key scores: each (key, head) dot with the bits of quant's F32
// dot on this machine (through the tiles where dim allows and the pairs where
// not), then the relu-weighted head sum in order, products and sums rounded
// apart; key counts that end inside a 16-key block, and dots that are
// negative, zero or NaN.
TEST(AttentionSimd, IndexerScoresHaveTheBitsOfTheF32Dots) {
    const quant::VecDotFn dot = quant::vec_dot_fn(quant::Type::F32);
    for (int64_t dim : {128, 64, 256, 96, 48, 16, 40}) {
        for (int64_t nq : {1, 2, 3, 8, 32}) {
            for (int64_t nk : {1, 10, 16, 37}) {
                const int64_t ks = dim + 16;
                auto q = f16_floats(size_t(nq * dim), 15);
                auto k = f16_floats(size_t(nk * ks), 16);
                // Query 0 against key 1: zero; query 1 against key 2: NaN.
                if (nk > 1) std::fill(q.begin(), q.begin() + dim, 0.0f);
                if (nq > 1 && nk > 2) k[size_t(2 * ks)] = std::nanf("");
                std::vector<float> w(static_cast<size_t>(nq));
                for (int64_t a = 0; a < nq; ++a) w[size_t(a)] = 0.25f + 0.125f * float(a % 5);
                std::vector<float> got(size_t(nk) + 1, -7.0f);
                cpu::simd().indexer_scores(q.data(), nq, w.data(), k.data(), ks, nk, dim,
                                           got.data());
                for (int64_t j = 0; j < nk; ++j) {
                    float want = 0.0f;
                    for (int64_t a = 0; a < nq; ++a) {
                        const float d = dot(dim, q.data() + a * dim, k.data() + j * ks);
                        const float r = std::max(d, 0.0f) * w[size_t(a)];
                        want += r;
                    }
                    ASSERT_TRUE(same_bits(&got[size_t(j)], &want, 1))
                        << "dim " << dim << " queries " << nq << " keys " << nk << " key " << j
                        << ": " << got[size_t(j)] << " against " << want;
                }
                EXPECT_EQ(got[size_t(nk)], -7.0f) << "written past the keys";
            }
        }
    }
}

// The F16-key form: the bits of the F32 form over the keys as floats, with
// key rows wider than dim (a cache row's stride), counts that end inside a
// 16-key block, NaN keys, and dims the AVX-512 form leaves to the others.
TEST(AttentionSimd, IndexerScoresOfF16KeysHaveTheBitsOfTheF32Form) {
    for (int64_t dim : {128, 64, 48, 40}) {
        for (int64_t nq : {1, 3, 8}) {
            for (int64_t nk : {1, 10, 16, 37, 100}) {
                const int64_t ks = dim + 16;
                const auto q = f16_floats(size_t(nq * dim), 25);
                Cache c(nk, ks, 26);
                if (nk > 2) c.bits[size_t(2 * ks + 1)] = 0x7E00;  // a NaN in key 2
                std::vector<float> kf(size_t(nk * dim));
                for (int64_t j = 0; j < nk; ++j)
                    for (int64_t i = 0; i < dim; ++i)
                        kf[size_t(j * dim + i)] = fp16_to_fp32(c.bits[size_t(j * ks + i)]);
                std::vector<float> w(static_cast<size_t>(nq));
                for (int64_t a = 0; a < nq; ++a) w[size_t(a)] = 0.5f - 0.125f * float(a % 3);
                std::vector<float> want(static_cast<size_t>(nk)), got(size_t(nk) + 1, -7.0f);
                cpu::simd().indexer_scores(q.data(), nq, w.data(), kf.data(), dim, nk, dim,
                                           want.data());
                cpu::simd().indexer_scores_f16(q.data(), nq, w.data(), c.bits.data(), ks, nk, dim,
                                               got.data());
                EXPECT_TRUE(same_bits(got.data(), want.data(), size_t(nk)))
                    << "dim " << dim << " queries " << nq << " keys " << nk;
                EXPECT_EQ(got[size_t(nk)], -7.0f) << "written past the keys";
            }
        }
    }
}

// The indexer's pick: the k best rows (ties to the lower index) in ascending
// order, as sorting every row by that rule would give: ties, signed zeros, k
// past n and k = n, and values spread over many of the radix buckets.
TEST(IndexerSelect, TopKRowsAreTheBestInAscendingOrder) {
    std::mt19937 rng(31);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t n : {1, 7, 100, 4096, 20000})
        for (int64_t k : {int64_t(1), int64_t(3), n / 2, n - 1, n, n + 5})
            for (bool ties : {true, false}) {
                std::vector<float> v(static_cast<size_t>(n));
                for (auto& x : v)  // many ties, or few (and values of both signs in one bucket)
                    x = ties ? float(int(rng() % 9) - 4) * 0.5f : normal(rng) * 1e-3f;
                if (n > 3) v[1] = -0.0f, v[2] = 0.0f;
                std::vector<int32_t> all(static_cast<size_t>(n));
                std::iota(all.begin(), all.end(), 0);
                std::stable_sort(all.begin(), all.end(),
                                 [&](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)]; });
                const int64_t m = std::min(k, n);
                std::vector<int32_t> want(all.begin(), all.begin() + m);
                std::sort(want.begin(), want.end());
                std::vector<int32_t> tmp, got(static_cast<size_t>(m), -1);
                kernels::top_k_rows(v.data(), n, k, tmp, got.data());
                ASSERT_EQ(got, want) << "n " << n << " k " << k << " ties " << ties;
                // This host's form (AVX-512: vector passes), into a larger
                // buffer: it writes k rows and nothing past them.
                std::vector<int32_t> fast(static_cast<size_t>(m + 16), -1);
                cpu::simd().top_k_rows(v.data(), n, k, tmp, fast.data());
                ASSERT_EQ(std::vector<int32_t>(fast.begin(), fast.begin() + m), want)
                    << "simd, n " << n << " k " << k << " ties " << ties;
                for (size_t j = size_t(m); j < fast.size(); ++j) ASSERT_EQ(fast[j], -1);
            }
}

// The KDA state passes (decay then read with the key; write then read with
// the query) have the bits of the plain loops, every product and sum rounded
// on its own, at this host's level: whole vectors, masked tails, widths the
// AVX2 ones leave to the loops, in place and from another state.
TEST(KdaSimd, DeltaPassesHaveTheBitsOfThePlainLoops) {
    const cpu::SimdOps& sv = cpu::simd();
    for (int64_t d : {16, 128, 200, 12, 1}) {
        const auto src = f16_floats(size_t(d * d), 21);
        const auto decay = f16_floats(size_t(d), 22);
        const auto k = f16_floats(size_t(d), 23);
        const auto u = f16_floats(size_t(d), 24);
        const auto q = f16_floats(size_t(d), 25);
        std::vector<float> s_want(src), s_got(src), a_want(static_cast<size_t>(d)),
            a_got(static_cast<size_t>(d), 7.0f);
        cpu::scalar::delta_decay(d, src.data(), decay.data(), k.data(), s_want.data(),
                                 a_want.data());
        sv.delta_decay(d, s_got.data(), decay.data(), k.data(), s_got.data(), a_got.data());
        ASSERT_TRUE(same_bits(s_got.data(), s_want.data(), s_want.size())) << "decay, d " << d;
        ASSERT_TRUE(same_bits(a_got.data(), a_want.data(), a_want.size())) << "decay, d " << d;
        std::vector<float> other(size_t(d * d), -1.0f);
        sv.delta_decay(d, src.data(), decay.data(), k.data(), other.data(), a_got.data());
        ASSERT_TRUE(same_bits(other.data(), s_want.data(), s_want.size())) << "from src, d " << d;
        cpu::scalar::delta_update(d, k.data(), u.data(), q.data(), s_want.data(), a_want.data());
        sv.delta_update(d, k.data(), u.data(), q.data(), s_got.data(), a_got.data());
        ASSERT_TRUE(same_bits(s_got.data(), s_want.data(), s_want.size())) << "update, d " << d;
        ASSERT_TRUE(same_bits(a_got.data(), a_want.data(), a_want.size())) << "update, d " << d;
    }
}

// Through the backend: each query's output is the same alone and batched
// with others of different lengths (prefill against decode), with 2 threads.
TEST(AttentionBackend, QueryOutputIndependentOfBatch) {
    CpuOptions opt;
    opt.n_threads = 2;
    auto be = std::make_unique<cpu::CpuBackend>(opt);
    // Alone, a query of 1536 or more rows takes the decode path that splits
    // rows and value columns between the threads (attend_wide); batched,
    // each query is one task.
    const int64_t rows = 2100;
    Cache c(rows, kWidth, 8);
    CacheRows cr{dev(reinterpret_cast<uint8_t*>(c.bits.data())), kWidth, CacheType::F16};
    const std::vector<int32_t> lens = {1, 17, 64, 300, 700, 2100};
    const std::vector<int32_t> picked = {5, 250, 31, 7, 199, 120};
    std::vector<int32_t> picked_long;  // a sparse selection of 1680 rows, ascending
    for (int32_t j = 0; j < int32_t(rows); ++j)
        if (j % 5 != 0) picked_long.push_back(j);
    const int64_t nq = int64_t(lens.size()) + 2;
    std::vector<std::vector<float>> qs, outs(static_cast<size_t>(nq));
    std::vector<cpu::CpuBackend::AttentionQuery> batch(static_cast<size_t>(nq));
    for (int64_t i = 0; i < nq; ++i) {
        qs.push_back(f16_floats(size_t(kHeads * kWidth), 20 + uint32_t(i)));
        outs[size_t(i)].assign(size_t(kHeads * kValue), 0.0f);
        auto& a = batch[size_t(i)];
        a.q = dev(qs.back().data());
        a.cache = cr;
        if (i < int64_t(lens.size())) {
            a.visible.n_dense = lens[size_t(i)];
        } else {
            const auto& sel = i == int64_t(lens.size()) ? picked : picked_long;
            a.visible.rows = dev(sel.data());
            a.visible.n_rows = int32_t(sel.size());
        }
        a.out = dev(outs[size_t(i)].data());
    }
    const float scale = 0.0625f;
    be->mla_attention(batch, kHeads, kValue, scale);
    for (int64_t i = 0; i < nq; ++i) {
        std::vector<float> alone(static_cast<size_t>(kHeads * kValue));
        auto a = batch[size_t(i)];
        a.out = dev(alone.data());
        be->mla_attention({&a, 1}, kHeads, kValue, scale);
        EXPECT_TRUE(same_bits(alone.data(), outs[size_t(i)].data(), alone.size())) << "query " << i;
        bool finite = true;
        for (float v : alone) finite = finite && std::isfinite(v);
        EXPECT_TRUE(finite);
    }
}

}  // namespace

namespace {

// The exact indexer through the backend, 2 threads: a prefill-like batch (70
// queries of one cache with growing key counts, so runs of queries share
// converted key blocks, and one query of another cache) picks what each
// query picks alone (one query: the decode form over stretches of keys).
TEST(AttentionBackend, IndexerPicksTheSameAloneAndBatched) {
    CpuOptions opt;
    opt.n_threads = 2;
    auto be = std::make_unique<cpu::CpuBackend>(opt);
    constexpr int64_t H = 8, D = 128, K = 64, keys = 3000;
    const Cache c0(keys, D, 61), c1(keys, D, 62);
    auto rows_of = [&](const Cache& c) {
        return CacheRows{dev(reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(c.bits.data()))), D,
                         CacheType::F16};
    };
    const int64_t nq = 71;
    std::vector<std::vector<float>> qs, ws;
    std::vector<std::vector<int32_t>> picks(static_cast<size_t>(nq),
                                            std::vector<int32_t>(static_cast<size_t>(K)));
    std::vector<cpu::CpuBackend::IndexerQuery> batch(static_cast<size_t>(nq));
    for (int64_t i = 0; i < nq; ++i) {
        qs.push_back(f16_floats(size_t(H * D), 70 + uint32_t(i)));
        ws.push_back(f16_floats(size_t(H), 170 + uint32_t(i)));
        auto& b = batch[size_t(i)];
        b.q = dev(static_cast<const float*>(qs.back().data()));
        b.w = dev(static_cast<const float*>(ws.back().data()));
        b.keys = rows_of(i == 5 ? c1 : c0);
        b.n_keys = int32_t(i == 5 ? keys : 40 + i * 41);  // 40 .. 2910
        b.out_rows = dev(picks[size_t(i)].data());
    }
    be->indexer_select(batch, H, D, K);
    for (int64_t i = 0; i < nq; ++i) {
        std::vector<int32_t> alone(static_cast<size_t>(K));
        cpu::CpuBackend::IndexerQuery a = batch[size_t(i)];
        a.out_rows = dev(alone.data());
        be->indexer_select({&a, 1}, H, D, K);
        EXPECT_EQ(alone, picks[size_t(i)]) << "query " << i;
        // Against the scores of the F32 form over the converted keys.
        const Cache& c = i == 5 ? c1 : c0;
        const int64_t n = batch[size_t(i)].n_keys;
        std::vector<float> kf(size_t(n * D)), sc(static_cast<size_t>(n));
        for (size_t j = 0; j < kf.size(); ++j) kf[j] = fp16_to_fp32(c.bits[j]);
        cpu::simd().indexer_scores(qs[size_t(i)].data(), H, ws[size_t(i)].data(), kf.data(), D, n,
                                   D, sc.data());
        std::vector<int32_t> order(static_cast<size_t>(n));
        for (int32_t j = 0; j < int32_t(n); ++j) order[size_t(j)] = j;
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t x, int32_t y) { return sc[size_t(x)] > sc[size_t(y)]; });
        order.resize(size_t(std::min<int64_t>(K, n)));
        std::sort(order.begin(), order.end());
        EXPECT_TRUE(std::equal(order.begin(), order.end(), alone.begin())) << "query " << i;
    }
}

// The step forms decide per row, from the plan's positions, what the model used to
// decide on the host: a row with no more candidates than the selection keeps sees
// everything (and the indexer leaves its output alone), the others their selection
// (pooled: the picked pools' cells and the trailing partial pool). Each row's result
// is the per-query form's with that decision.
TEST(AttentionBackend, StepFormsDecideEachRowFromItsPosition) {
    CpuOptions opt;
    opt.n_threads = 2;
    auto be = std::make_unique<cpu::CpuBackend>(opt);
    constexpr int64_t D = 128, Hi = 4, rows = 64;
    const Cache c0(rows, kWidth, 91), c1(rows, kWidth, 92), k0(rows, D, 93), k1(rows, D, 94);
    auto cache = [](const Cache& c) {
        return CacheRows{dev(reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(c.bits.data()))),
                         c.width, CacheType::F16};
    };
    // Two sequences of three rows each.
    const std::vector<int32_t> pos = {2, 10, 40, 5, 31, 63};
    const int64_t T = int64_t(pos.size());
    const std::vector<AttentionOps::Segment> segs = {{cache(c0), 0, 3}, {cache(c1), 3, 3}};
    const std::vector<AttentionOps::Segment> keys = {{cache(k0), 0, 3}, {cache(k1), 3, 3}};
    const std::vector<float> q = f16_floats(size_t(T * kHeads * kWidth), 95);
    const std::vector<float> iq = f16_floats(size_t(T * Hi * D), 96);
    const std::vector<float> iw = f16_floats(size_t(T * Hi), 97);
    const float scale = 0.0625f;

    // Tokens (pool 1), keep 8: rows at positions 2 and 5 see all their cells.
    constexpr int64_t K = 8;
    std::vector<int32_t> sel(size_t(T * K), -7);
    be->indexer_select(dev(iq.data()), dev(iw.data()), dev(pos.data()), keys, 1, Hi, D, K,
                       dev(sel.data()));
    std::vector<float> out(size_t(T * kHeads * kValue));
    be->mla_attention(
        dev(q.data()), dev(pos.data()), segs,
        AttentionOps::Selection{dev(static_cast<const int32_t*>(sel.data())), K, K, 1}, kHeads,
        kValue, scale, dev(out.data()));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t n_vis = pos[size_t(t)] + 1;
        const Cache& kc = t < 3 ? k0 : k1;
        std::vector<int32_t> pick(size_t(K), -7);
        if (n_vis > K) {
            cpu::CpuBackend::IndexerQuery a{dev(iq.data() + t * Hi * D), dev(iw.data() + t * Hi),
                                            cache(kc), int32_t(n_vis), dev(pick.data())};
            be->indexer_select({&a, 1}, Hi, D, K);
        }
        EXPECT_TRUE(std::equal(pick.begin(), pick.end(), sel.begin() + t * K)) << "row " << t;
        cpu::CpuBackend::AttentionQuery a;
        a.q = dev(q.data() + t * kHeads * kWidth);
        a.cache = cache(t < 3 ? c0 : c1);
        if (n_vis > K)
            a.visible = {0, dev(static_cast<const int32_t*>(pick.data())), int32_t(K)};
        else
            a.visible = {int32_t(n_vis), nullptr, 0};
        std::vector<float> alone(size_t(kHeads * kValue));
        a.out = dev(alone.data());
        be->mla_attention({&a, 1}, kHeads, kValue, scale);
        EXPECT_TRUE(same_bits(alone.data(), out.data() + t * kHeads * kValue, alone.size()))
            << "row " << t;
    }

    // Pools of 4, keep 2 (a row past 12 cells selects): the picked pools' cells, then
    // the trailing partial pool's.
    constexpr int64_t B = 4, keep = 2, stride = keep * B + B;
    std::vector<int32_t> picked(size_t(T * keep), -7), cells(size_t(T * stride), -7);
    for (int64_t t = 0; t < T; ++t) {
        picked[size_t(t * keep)] = 1;
        picked[size_t(t * keep + 1)] = int32_t((pos[size_t(t)] + 1) / B - 1);
    }
    be->pool_cells(dev(static_cast<const int32_t*>(picked.data())), dev(pos.data()), T, keep, B,
                   dev(cells.data()), stride);
    for (int64_t t = 0; t < T; ++t) {
        const int32_t n_vis = pos[size_t(t)] + 1;
        std::vector<int32_t> want(size_t(stride), -7);
        if (n_vis / B > keep) {
            int64_t n = 0;
            for (int64_t j = 0; j < keep; ++j)
                for (int64_t s = 0; s < B; ++s)
                    want[size_t(n++)] = int32_t(picked[size_t(t * keep + j)] * B + s);
            for (int32_t c = (n_vis / B) * B; c < n_vis; ++c) want[size_t(n++)] = c;
        }
        EXPECT_TRUE(std::equal(want.begin(), want.end(), cells.begin() + t * stride))
            << "row " << t;
    }
    be->mla_attention(
        dev(q.data()), dev(pos.data()), segs,
        AttentionOps::Selection{dev(static_cast<const int32_t*>(cells.data())), stride, keep, B},
        kHeads, kValue, scale, dev(out.data()));
    for (int64_t t = 0; t < T; ++t) {
        const int32_t n_vis = pos[size_t(t)] + 1;
        cpu::CpuBackend::AttentionQuery a;
        a.q = dev(q.data() + t * kHeads * kWidth);
        a.cache = cache(t < 3 ? c0 : c1);
        if (n_vis / B > keep)
            a.visible = {0, dev(static_cast<const int32_t*>(cells.data() + t * stride)),
                         int32_t(keep * B + n_vis % B)};
        else
            a.visible = {n_vis, nullptr, 0};
        std::vector<float> alone(size_t(kHeads * kValue));
        a.out = dev(alone.data());
        be->mla_attention({&a, 1}, kHeads, kValue, scale);
        EXPECT_TRUE(same_bits(alone.data(), out.data() + t * kHeads * kValue, alone.size()))
            << "pooled row " << t;
    }
}

// The decode roofline's cache bytes: each attention query counts the rows it
// sees, each indexer query the keys it scores.
TEST(AttentionBackend, CountsTheCacheRowsEachQueryReads) {
    CpuOptions opt;
    opt.n_threads = 2;
    auto be = std::make_unique<cpu::CpuBackend>(opt);
    const int64_t rows = 300;
    Cache c(rows, kWidth, 30);
    CacheRows cr{dev(reinterpret_cast<uint8_t*>(c.bits.data())), kWidth, CacheType::F16};
    const std::vector<int32_t> picked = {5, 250, 31};
    const auto q = f16_floats(size_t(kHeads * kWidth), 31);
    std::vector<float> o1(size_t(kHeads * kValue)), o2(o1.size());
    std::vector<cpu::CpuBackend::AttentionQuery> batch(2);
    batch[0].q = batch[1].q = dev(q.data());
    batch[0].cache = batch[1].cache = cr;
    batch[0].visible.n_dense = 200;
    batch[0].out = dev(o1.data());
    batch[1].visible.rows = dev(picked.data());
    batch[1].visible.n_rows = int32_t(picked.size());
    batch[1].out = dev(o2.data());
    be->reset_counters();
    be->mla_attention(batch, kHeads, kValue, 0.0625f);
    EXPECT_EQ(be->counters().cache_bytes, uint64_t(200 + 3) * uint64_t(kWidth) * 2);

    const int64_t ih = 4, dim = 128, keys = 90;
    Cache k(keys, dim, 32);
    const auto iq = f16_floats(size_t(ih * dim), 33);
    const std::vector<float> w(static_cast<size_t>(ih), 0.5f);
    std::vector<int32_t> top(8);
    cpu::CpuBackend::IndexerQuery x;
    x.q = dev(iq.data());
    x.w = dev(w.data());
    x.keys = CacheRows{dev(reinterpret_cast<uint8_t*>(k.bits.data())), dim, CacheType::F16};
    x.n_keys = int32_t(keys);
    x.out_rows = dev(top.data());
    be->reset_counters();
    be->indexer_select({&x, 1}, ih, dim, 8);
    EXPECT_EQ(be->counters().cache_bytes, uint64_t(keys) * uint64_t(dim) * 2);
}

}  // namespace

namespace {

// --attn-bf16: the BF16 path (AMX tiles, or their vector form) against a double-precision reference
// that rounds what the tiles read (query, cache rows, each block's e^(s - max)) to BF16, at shapes
// with partial tiles: more than 16 heads, widths and row counts that are not multiples of a tile,
// dense and selected rows, F16 and F32 caches.
float bf16_round(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

// A two-thread backend in --attn-bf16 mode; null (after checking that it is
// refused) where the CPU has neither AMX-BF16 nor AVX-512 BF16 (the vector
// form of the same kernels).
std::unique_ptr<cpu::CpuBackend> bf16_backend() {
    CpuOptions opt;
    opt.n_threads = 2;
    opt.attention_bf16 = true;
    if (!quant::cpu_has_amx_bf16() && !quant::cpu_has_bf16_vectors()) {
        EXPECT_THROW(make_cpu_backend(opt), Error);
        return nullptr;
    }
    return std::make_unique<cpu::CpuBackend>(opt);
}

TEST(AttentionBf16, MatchesTheBf16RoundedReference) {
    auto be = bf16_backend();
    if (!be) return;
    struct Shape {
        int64_t heads, width, value, rows;
        bool f16, pick;
    };
    for (const Shape& sh :
         {Shape{16, 576, 512, 300, true, false}, Shape{20, 100, 72, 37, true, true},
          Shape{3, 48, 32, 1, false, false}, Shape{16, 576, 512, 2100, true, true},
          Shape{72, 576, 512, 700, true, true}}) {
        const int64_t H = sh.heads, W = sh.width, V = sh.value, R = sh.rows;
        const Cache c(R, W, 41);
        std::vector<float> c32(size_t(R * W));
        for (size_t i = 0; i < c32.size(); ++i) c32[i] = fp16_to_fp32(c.bits[i]);
        std::vector<int32_t> pick;
        for (int32_t j = 0; j < int32_t(R); ++j)
            if (!sh.pick || j % 3 != 1) pick.push_back(j);
        const int64_t n = int64_t(pick.size());
        const auto q = f16_floats(size_t(H * W), 42);
        std::vector<float> out(size_t(H * V), -1.0f);
        cpu::CpuBackend::AttentionQuery a;
        a.q = dev(q.data());
        a.cache =
            sh.f16
                ? CacheRows{dev(reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(c.bits.data()))),
                            W, CacheType::F16}
                : CacheRows{dev(reinterpret_cast<uint8_t*>(c32.data())), W, CacheType::F32};
        if (sh.pick) {
            a.visible.rows = dev(static_cast<const int32_t*>(pick.data()));
            a.visible.n_rows = int32_t(n);
        } else {
            a.visible.n_dense = int32_t(n);
        }
        a.out = dev(out.data());
        const float scale = 1.0f / std::sqrt(float(W));
        be->mla_attention({&a, 1}, H, V, scale);
        for (int64_t h = 0; h < H; ++h) {
            std::vector<double> s(static_cast<size_t>(n));
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < n; ++j) {
                double d = 0;
                for (int64_t i = 0; i < W; ++i)
                    d += double(bf16_round(q[size_t(h * W + i)])) *
                         bf16_round(c32[size_t(pick[size_t(j)] * W + i)]);
                s[size_t(j)] = d * scale;
                mx = std::max(mx, s[size_t(j)]);
            }
            // Each block of 256 rows rounds its e^(s - block max) to BF16; the
            // blocks are rescaled to the common maximum when combined.
            std::vector<double> e(static_cast<size_t>(n)), wgt(static_cast<size_t>(n));
            for (int64_t b0 = 0; b0 < n; b0 += 256) {
                const int64_t b1 = std::min(n, b0 + 256);
                double bm = -1e300;
                for (int64_t j = b0; j < b1; ++j) bm = std::max(bm, s[size_t(j)]);
                for (int64_t j = b0; j < b1; ++j) {
                    e[size_t(j)] = std::exp(s[size_t(j)] - bm);
                    sum += e[size_t(j)] * std::exp(bm - mx);
                    wgt[size_t(j)] = std::exp(bm - mx);
                }
            }
            for (int64_t col = 0; col < V; ++col) {
                double ref = 0, mag = 0;
                for (int64_t j = 0; j < n; ++j) {
                    const double p = bf16_round(float(e[size_t(j)])) * wgt[size_t(j)] / sum;
                    const double v = bf16_round(c32[size_t(pick[size_t(j)] * W + col)]);
                    ref += p * v;
                    mag += std::fabs(p * v);
                }
                // The scores carry F32 sums of BF16 products (about 1e-6 relative),
                // which move a probability across a BF16 rounding at most.
                ASSERT_NEAR(out[size_t(h * V + col)], ref, 1e-4 * mag + 1e-6)
                    << "heads " << H << " width " << W << " rows " << n << " head " << h << " col "
                    << col;
            }
        }
    }
}

// Decode (one query: keys and columns split between threads) and prefill
// (runs of neighbouring queries sharing each block's rows) give the same bits
// for a query. Lengths mixed within a run, queries that read picked rows, a
// run whose queries read two caches and one whose picks lie too far apart
// to share (each query of those runs alone).
TEST(AttentionBf16, QueryOutputIndependentOfBatch) {
    auto be = bf16_backend();
    if (!be) return;
    // One head group, and three (decode does a block of all of them at once).
    for (const int64_t H : {int64_t(16), int64_t(40)}) {
        const int64_t rows = 9000;
        Cache c(rows, kWidth, 8), other(700, kWidth, 9);
        CacheRows cr{dev(reinterpret_cast<uint8_t*>(c.bits.data())), kWidth, CacheType::F16};
        CacheRows cr2{dev(reinterpret_cast<uint8_t*>(other.bits.data())), kWidth, CacheType::F16};
        // n > 0: the first n rows; -n: n ascending rows, every fourth skipped;
        // 0: every 40th row of the cache
        const std::vector<int32_t> lens = {1,     17,  64,   300, 2100, -700, 257,
                                           -1500, 513, -256, 600, -500, 0,    100};
        const size_t first_other = 10, last_other = 11;  // queries that read `other`
        std::vector<std::vector<int32_t>> picks(lens.size());
        std::vector<std::vector<float>> qs, outs(lens.size());
        std::vector<cpu::CpuBackend::AttentionQuery> batch(lens.size());
        for (size_t i = 0; i < lens.size(); ++i) {
            qs.push_back(f16_floats(size_t(H * kWidth), 60 + uint32_t(i)));
            outs[i].assign(size_t(H * kValue), 0.0f);
            batch[i].q = dev(qs.back().data());
            batch[i].cache = i >= first_other && i <= last_other ? cr2 : cr;
            if (lens[i] > 0) {
                batch[i].visible.n_dense = lens[i];
            } else {
                if (lens[i] == 0)
                    for (int32_t r = 0; r < int32_t(rows); r += 40) picks[i].push_back(r);
                for (int32_t r = 0; int32_t(picks[i].size()) < -lens[i]; ++r)
                    if ((r + int32_t(i)) % 4 != 0) picks[i].push_back(r);
                batch[i].visible.rows = dev(static_cast<const int32_t*>(picks[i].data()));
                batch[i].visible.n_rows = int32_t(picks[i].size());
            }
            batch[i].out = dev(outs[i].data());
        }
        be->mla_attention(batch, H, kValue, 0.0625f);
        for (size_t i = 0; i < lens.size(); ++i) {
            std::vector<float> alone(static_cast<size_t>(H * kValue));
            auto a = batch[i];
            a.out = dev(alone.data());
            be->mla_attention({&a, 1}, H, kValue, 0.0625f);
            EXPECT_TRUE(same_bits(alone.data(), outs[i].data(), alone.size()))
                << "heads " << H << " query " << i;
        }
    }
}

// --attn-bf16 also scores the indexer's keys on tiles. The selection must be
// the top-k of a double reference over BF16-rounded queries and keys, up to
// keys whose reference scores are within rounding of the k-th: every picked
// key scores at least the k-th minus that margin, every other key at most
// the k-th plus it. Shapes with partial tiles: head counts that are not a
// multiple of 16 (one, two and three head groups), widths that are not a
// multiple of 32, key counts that end inside a tile, F16, F32 and BF16 keys
// (read in place where the rows hold whole tile rows), and
// queries of two caches and of different lengths in one call, whose
// selections must be those of each query alone.
TEST(AttentionBf16, IndexerPicksTheBf16RoundedTopK) {
    auto be = bf16_backend();
    if (!be) return;
    struct Shape {
        int64_t heads, dim, keys, top_k;
        CacheType type;
    };
    for (const Shape& sh :
         {Shape{32, 128, 1000, 64, CacheType::F16}, Shape{20, 72, 301, 40, CacheType::F16},
          Shape{3, 128, 17, 5, CacheType::F32}, Shape{48, 128, 700, 100, CacheType::F16},
          Shape{32, 128, 1000, 64, CacheType::BF16}, Shape{20, 72, 301, 40, CacheType::BF16}}) {
        const int64_t H = sh.heads, D = sh.dim, K = sh.top_k;
        const Cache c0(sh.keys, D, 70), c1(sh.keys, D, 71);
        std::vector<float> f0(size_t(sh.keys * D)), f1(f0.size());
        for (size_t i = 0; i < f0.size(); ++i) {
            f0[i] = fp16_to_fp32(c0.bits[i]);
            f1[i] = fp16_to_fp32(c1.bits[i]);
        }
        // BF16 keys (the --attn-bf16 storage of glm-dsa's key caches) are
        // stored through cache_store, which must round each value to nearest;
        // the caches are exactly as long as their keys (a last partial tile
        // read in place must not read past them).
        std::vector<uint16_t> b0(f0.size()), b1(f0.size());
        if (sh.type == CacheType::BF16) {
            std::vector<int32_t> pos(static_cast<size_t>(sh.keys));
            std::iota(pos.begin(), pos.end(), 0);
            for (int cache : {0, 1}) {
                std::vector<uint16_t>& b = cache ? b1 : b0;
                const std::vector<float>& f = cache ? f1 : f0;
                be->cache_store(
                    CacheRows{dev(reinterpret_cast<uint8_t*>(b.data())), D, CacheType::BF16},
                    dev(f.data()), D, sh.keys, dev(pos.data()));
                for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], fp32_to_bf16(f[i])) << i;
            }
        }
        auto rows_of = [&](int cache) {
            const Cache& c = cache ? c1 : c0;
            std::vector<float>& f = cache ? f1 : f0;
            std::vector<uint16_t>& b = cache ? b1 : b0;
            if (sh.type == CacheType::BF16)
                return CacheRows{dev(reinterpret_cast<uint8_t*>(b.data())), D, CacheType::BF16};
            if (sh.type == CacheType::F16)
                return CacheRows{
                    dev(reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(c.bits.data()))), D,
                    CacheType::F16};
            return CacheRows{dev(reinterpret_cast<uint8_t*>(f.data())), D, CacheType::F32};
        };
        // Queries: the full length of each cache, and shorter ones of cache 0.
        const std::vector<int32_t> lens = {int32_t(sh.keys), int32_t(sh.keys),
                                           int32_t(std::max<int64_t>(K, sh.keys / 2 + 3)),
                                           int32_t(K)};
        const std::vector<int> cache_of = {0, 1, 0, 0};
        std::vector<std::vector<float>> qs, ws;
        std::vector<std::vector<int32_t>> picks(lens.size(), std::vector<int32_t>(size_t(K)));
        std::vector<cpu::CpuBackend::IndexerQuery> batch(lens.size());
        for (size_t i = 0; i < lens.size(); ++i) {
            qs.push_back(f16_floats(size_t(H * D), 80 + uint32_t(i)));
            ws.push_back(f16_floats(size_t(H), 90 + uint32_t(i)));
            batch[i].q = dev(static_cast<const float*>(qs.back().data()));
            batch[i].w = dev(static_cast<const float*>(ws.back().data()));
            batch[i].keys = rows_of(cache_of[i]);
            batch[i].n_keys = lens[i];
            batch[i].out_rows = dev(picks[i].data());
        }
        be->indexer_select(batch, H, D, K);
        for (size_t i = 0; i < lens.size(); ++i) {
            const std::vector<float>& f = cache_of[i] ? f1 : f0;
            std::vector<double> ref(static_cast<size_t>(lens[i]));
            double mag = 0;
            for (int64_t s = 0; s < lens[i]; ++s) {
                double score = 0, m = 0;
                for (int64_t h = 0; h < H; ++h) {
                    double d = 0, dm = 0;
                    for (int64_t j = 0; j < D; ++j) {
                        const double p = double(bf16_round(qs[i][size_t(h * D + j)])) *
                                         bf16_round(f[size_t(s * D + j)]);
                        d += p;
                        dm += std::fabs(p);
                    }
                    score += std::max(d, 0.0) * ws[i][size_t(h)];
                    m += dm * std::fabs(ws[i][size_t(h)]);
                }
                ref[size_t(s)] = score;
                mag = std::max(mag, m);
            }
            std::vector<double> sorted = ref;
            std::sort(sorted.begin(), sorted.end(), std::greater<double>());
            const double kth = sorted[size_t(std::min<int64_t>(K, lens[i]) - 1)];
            const double margin = 1e-5 * mag;
            std::vector<bool> picked(ref.size(), false);
            for (int64_t j = 0; j < std::min<int64_t>(K, lens[i]); ++j) {
                const int32_t s = picks[i][size_t(j)];
                ASSERT_TRUE(s >= 0 && s < lens[i]);
                if (j > 0) {
                    ASSERT_GT(s, picks[i][size_t(j - 1)]) << "ascending, no repeats";
                }
                picked[size_t(s)] = true;
                EXPECT_GE(ref[size_t(s)], kth - margin) << "heads " << H << " query " << i;
            }
            for (size_t s = 0; s < ref.size(); ++s) {
                if (!picked[s]) {
                    EXPECT_LE(ref[s], kth + margin) << "heads " << H << " query " << i;
                }
            }
            std::vector<int32_t> alone(static_cast<size_t>(K));
            cpu::CpuBackend::IndexerQuery a = batch[i];
            a.out_rows = dev(alone.data());
            be->indexer_select({&a, 1}, H, D, K);
            EXPECT_EQ(alone, picks[i]) << "heads " << H << " query " << i;
        }
    }
}

}  // namespace

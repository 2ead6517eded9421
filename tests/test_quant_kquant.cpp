// Quantizers of the legacy and k-quant formats: error bounds that follow from
// each format's definition, the importance-matrix path, edge cases, the
// lane-parallel scale searches (bit-identical to the scalar ones), and thread
// safety / determinism of quantize_rows.
//
// How the bounds follow from the formats. Every format reconstructs an element
// as x' = base + k * unit, k an integer level in [kmin, kmax], where unit and
// base are fixed per block or sub-block (d, or d*sc for the k-quants, and the
// offset -dmin*m or m). The tests read unit and base back through the public
// dequantizer (rows whose level bits are set to two known patterns).
//  - k-quants: after choosing the sub-block scales, the quantizer re-rounds
//    every element against the *stored* unit and base: k = clamp(round((x -
//    base) / unit)). So x' is the nearest grid point: |x - x'| <= unit/2, unless
//    x lies outside [base + kmin*unit, base + kmax*unit] and x' is the end point.
//  - legacy formats (reference quantizers): the level is rounded against the
//    unrounded float d, then d is stored as fp16 (relative error <= 2^-11), so
//    |x - x'| <= unit/2 + |k| * 2^-11 * unit (+ 2^-11 * |m| for the offset
//    formats), with the same exception for clamped ends (Q4_0/Q5_0 map the
//    element of largest magnitude to kmin exactly, so only +max can clamp).
//  - RMS: with errors spread uniformly over +-unit/2, rms = unit/sqrt(12).
//    Clamped ends and sub-blocks whose scale is distorted by the 4/6/8-bit
//    scale quantization add to that; we allow 25%.
//  - step size: the candidate scales the searches try span
//    range / (nmax + rmin + rdelta * nstep) .. range / (nmax + rmin), and the
//    sub-block scale is then rounded to 4 or 6 bits of the block maximum; the
//    mean unit must stay within (nmax / (nmax + rmin)) * 1.15 of range / nmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "quant/scale_search.h"
#include "quant_test_util.h"

namespace glm5::test {
namespace {

using namespace quant;

struct Grid {
    int kmin, kmax;
    int sub;  // values per unit/base (sub-block or block)
    // Level patterns: bytes for "every level k = 0" and "every level k = 1",
    // written over the block's level fields (offset, length).
    struct Field {
        size_t off, len;
        uint8_t zero, one;
    };
    std::vector<Field> fields;
};

Grid grid_of(Type t) {
    switch (t) {
        case Type::Q4_0:
            return {-8, 7, 32, {{offsetof(BlockQ4_0, qs), 16, 0x88, 0x99}}};
        case Type::Q5_0:
            return {-16,
                    15,
                    32,
                    {{offsetof(BlockQ5_0, qh), 4, 0xFF, 0xFF},
                     {offsetof(BlockQ5_0, qs), 16, 0x00, 0x11}}};
        case Type::Q4_1:
            return {0, 15, 32, {{offsetof(BlockQ4_1, qs), 16, 0x00, 0x11}}};
        case Type::Q5_1:
            return {0,
                    31,
                    32,
                    {{offsetof(BlockQ5_1, qh), 4, 0x00, 0x00},
                     {offsetof(BlockQ5_1, qs), 16, 0x00, 0x11}}};
        case Type::Q8_0:
            return {-127, 127, 32, {{offsetof(BlockQ8_0, qs), 32, 0x00, 0x01}}};
        case Type::Q2_K:
            return {0, 3, 16, {{offsetof(BlockQ2_K, qs), 64, 0x00, 0x55}}};
        case Type::Q3_K:
            return {-4,
                    3,
                    16,
                    {{offsetof(BlockQ3_K, hmask), 32, 0xFF, 0xFF},
                     {offsetof(BlockQ3_K, qs), 64, 0x00, 0x55}}};
        case Type::Q4_K:
            return {0, 15, 32, {{offsetof(BlockQ4_K, qs), 128, 0x00, 0x11}}};
        case Type::Q5_K:
            return {0,
                    31,
                    32,
                    {{offsetof(BlockQ5_K, qh), 32, 0x00, 0x00},
                     {offsetof(BlockQ5_K, qs), 128, 0x00, 0x11}}};
        case Type::Q6_K:
            return {-32,
                    31,
                    16,
                    {{offsetof(BlockQ6_K, ql), 128, 0x00, 0x11},
                     {offsetof(BlockQ6_K, qh), 64, 0xAA, 0xAA}}};
        default:
            ADD_FAILURE() << "no grid for " << name(t);
            return {};
    }
}

// Per element: base (level 0) and unit (one level up), read via dequantization.
void read_grid(Type t, const std::vector<uint8_t>& q, int64_t n, std::vector<float>* base,
               std::vector<float>* unit) {
    const Grid g = grid_of(t);
    const size_t bs = traits(t).type_size;
    std::vector<uint8_t> zero = q, one = q;
    for (size_t b = 0; b < q.size(); b += bs)
        for (const auto& f : g.fields) {
            std::memset(zero.data() + b + f.off, f.zero, f.len);
            std::memset(one.data() + b + f.off, f.one, f.len);
        }
    *base = dequantize(t, zero, n);
    const std::vector<float> up = dequantize(t, one, n);
    unit->resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) (*unit)[i] = up[i] - (*base)[i];
}

const std::vector<Type>& quant_types() {
    static const std::vector<Type> v = {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0,
                                        Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K};
    return v;
}

struct Stats {
    double sq_err = 0, sq_unit = 0, sum_unit = 0, sum_naive = 0;
    int64_t n = 0, groups = 0, violations = 0;
};

// The search parameters of each format's reference quantizer: nmax and rmin.
double step_factor(Type t) {
    switch (t) {
        case Type::Q2_K:
            return 3.0 / 2.5;
        case Type::Q4_K:
            return 15.0 / 14.0;
        case Type::Q5_K:
            return 31.0 / 30.5;
        default:
            return 1.0;
    }
}

// range / nmax of the "naive" grid of one group: symmetric formats span
// [-amax, amax] with nmax = -kmin levels on the large side; offset formats
// span [min(0, min), max] (k-quants) or [min, max] (legacy) with kmax steps.
double naive_step(Type t, const float* x, int n) {
    const Grid g = grid_of(t);
    float mn = x[0], mx = x[0], amax = 0;
    for (int i = 0; i < n; ++i) {
        mn = std::min(mn, x[i]);
        mx = std::max(mx, x[i]);
        amax = std::max(amax, std::fabs(x[i]));
    }
    if (g.kmin < 0) return double(amax) / -g.kmin;
    if (t != Type::Q4_1 && t != Type::Q5_1) mn = std::min(mn, 0.0f);
    return double(mx - mn) / g.kmax;
}

Stats check_grid(Type t, const std::vector<float>& x, const std::vector<uint8_t>& q,
                 bool per_element, const char* what) {
    const int64_t n = int64_t(x.size());
    const Grid g = grid_of(t);
    const std::vector<float> y = dequantize(t, q, n);
    std::vector<float> base, unit;
    read_grid(t, q, n, &base, &unit);
    const bool legacy = traits(t).block_size == 32;
    Stats s;
    for (int64_t i = 0; i < n; ++i) {
        const double err = double(x[i]) - double(y[i]);
        s.sq_err += err * err;
        s.sq_unit += double(unit[i]) * unit[i];
        ++s.n;
        if (i % g.sub == 0) {
            s.sum_unit += std::fabs(unit[i]);
            s.sum_naive += naive_step(t, &x[i], g.sub);
            ++s.groups;
        }
        if (!per_element || unit[i] == 0) continue;
        const double u = std::fabs(double(unit[i]));
        const double k = std::nearbyint((double(y[i]) - base[i]) / unit[i]);
        double bound = u / 2 * (1 + 1e-5) + 1e-6 * std::fabs(x[i]) + 1e-6 * std::fabs(base[i]);
        if (legacy)
            bound += std::fabs(k) * u * 0x1p-11 + std::fabs(base[i]) * 0x1p-11 + 0x1p-24 * u;
        const double dir = err / unit[i];  // > 0: x beyond x' in the direction of larger k
        const bool clamped = (k == g.kmax && dir > 0) || (k == g.kmin && dir < 0);
        // Written so that a NaN error fails too.
        if (!(std::fabs(err) <= bound) && !clamped && s.violations++ < 5)
            ADD_FAILURE() << name(t) << " " << what << " [" << i << "] x=" << x[i] << " x'=" << y[i]
                          << " unit=" << unit[i] << " level=" << k;
    }
    return s;
}

void check_rms(Type t, const Stats& s, const char* what) {
    const double rms = std::sqrt(s.sq_err / double(s.n));
    const double uniform = std::sqrt(s.sq_unit / double(s.n) / 12);
    EXPECT_LE(rms, 1.25 * uniform) << name(t) << " " << what;
    EXPECT_LE(s.sum_unit, 1.15 * step_factor(t) * s.sum_naive) << name(t) << " " << what;
    std::printf("%-5s %-10s rms %.4g  (unit/sqrt12 %.4g)  mean unit / naive step %.3f\n", name(t),
                what, rms, uniform, s.sum_unit / s.sum_naive);
}

TEST(QuantBounds, ReferenceQuantizersStayOnTheNearestGridPoint) {
    const int64_t rows = 16, n = 1024;
    for (Type t : quant_types())
        for (int dist = 0; dist < 2; ++dist) {
            const std::vector<float> x =
                dist ? varied_floats(size_t(rows * n), 11) : normal_floats(size_t(rows * n), 12);
            const char* what = dist ? "varied" : "normal";
            const Stats s = check_grid(t, x, quantize(t, x, rows), true, what);
            EXPECT_EQ(s.violations, 0) << name(t) << " " << what;
            check_rms(t, s, what);
        }
}

// Importance weights with a large dynamic range (like real activation
// statistics): the weighted searches minimise sum qw * sqrt(sigma2 + x^2) *
// err^2, close to the qw-weighted error, so that error should not exceed the
// one of the unweighted quantizer (10% margin: the search is heuristic and
// sub-block scales are re-quantized afterwards).
TEST(QuantBounds, ImatrixLowersTheWeightedError) {
    const int64_t rows = 32, n = 512;
    const std::vector<float> x = normal_floats(size_t(rows * n), 21);
    std::vector<float> im = normal_floats(size_t(n), 22);
    for (auto& v : im) v = std::exp(2.5f * v);
    for (Type t : quant_types()) {
        if (t == Type::Q8_0) continue;  // has no weighted variant
        const std::vector<uint8_t> plain = quantize(t, x, rows),
                                   weighted = quantize(t, x, rows, im.data());
        const std::vector<float> yp = dequantize(t, plain, rows * n),
                                 yw = dequantize(t, weighted, rows * n);
        double ep = 0, ew = 0;
        for (int64_t i = 0; i < rows * n; ++i) {
            const double w = im[size_t(i % n)];
            ep += w * (x[i] - yp[i]) * (x[i] - yp[i]);
            ew += w * (x[i] - yw[i]) * (x[i] - yw[i]);
        }
        EXPECT_LE(ew, 1.10 * ep) << name(t);
        std::printf("%-5s weighted error with imatrix / without: %.3f\n", name(t), ew / ep);
        // The k-quants re-round against the stored scales with importance data too.
        if (traits(t).block_size == 256) {
            EXPECT_EQ(check_grid(t, x, weighted, true, "imatrix").violations, 0);
        }
    }
}

TEST(QuantBounds, EdgeCases) {
    const int64_t n = 512;
    for (Type t : quant_types())
        for (bool imatrix : {false, true}) {
            std::vector<float> im(size_t(n), 1.0f);
            const float* qw = imatrix ? im.data() : nullptr;
            // All zeros: exactly zero back.
            const std::vector<float> zeros(size_t(n), 0.0f);
            for (float v : dequantize(t, quantize(t, zeros, 1, qw), n))
                EXPECT_EQ(v, 0.0f) << name(t);
            // Constant rows (positive and negative): within half a step of the
            // naive grid, plus fp16 rounding of the scale.
            for (float c : {0.75f, -2.0f}) {
                const std::vector<float> x(size_t(n), c);
                const std::vector<float> y = dequantize(t, quantize(t, x, 1, qw), n);
                const double step = naive_step(t, x.data(), 32) * step_factor(t);
                for (int64_t i = 0; i < n; ++i)
                    EXPECT_LE(std::fabs(y[i] - c), step / 2 + std::fabs(c) * 0x1p-10)
                        << name(t) << " c=" << c;
            }
            // Negative-only rows and one huge outlier: every element on the
            // nearest grid point (reference path), outlier reproduced within its
            // group's step.
            std::vector<float> neg = normal_floats(size_t(n), 31);
            for (auto& v : neg) v = -std::fabs(v) - 0.1f;
            std::vector<float> out = normal_floats(size_t(n), 32);
            out[77] = 1000.0f;
            for (const auto* x : {&neg, &out}) {
                const std::vector<uint8_t> q = quantize(t, *x, 1, qw);
                if (!imatrix || traits(t).block_size == 256) {
                    EXPECT_EQ(check_grid(t, *x, q, true, "edge").violations, 0) << name(t);
                }
                const std::vector<float> y = dequantize(t, q, n);
                for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isfinite(y[i]));
            }
            const std::vector<float> y = dequantize(t, quantize(t, out, 1, qw), n);
            const int g = grid_of(t).sub;
            EXPECT_LE(std::fabs(y[77] - 1000.0f),
                      naive_step(t, &out[77 / g * g], g) * step_factor(t) * 1.15)
                << name(t) << (imatrix ? " imatrix" : "");
        }
}

// The lane-parallel searches against the scalar ones, on groups built to hit
// every branch: flat groups, all-negative and all-positive ones, outliers,
// zeros, and weights with zeros.
TEST(QuantSearch, LaneParallelSearchesMatchScalarBitForBit) {
    if (!cpu_has_avx2()) {
        std::printf("this CPU has no AVX2: nothing to compare\n");
        return;
    }
    std::mt19937 rng(7);
    int compared = 0;
    for (int trial = 0; trial < 400; ++trial) {
        const int n = trial % 2 ? 16 : 32;
        std::vector<float> x = normal_floats(size_t(8 * n), uint32_t(trial));
        std::vector<float> w(size_t(8 * n));
        for (int g = 0; g < 8; ++g) {
            float* xg = &x[size_t(g * n)];
            switch ((trial + g) % 7) {
                case 0:
                    std::fill(xg, xg + n, 0.0f);
                    break;
                case 1:
                    std::fill(xg, xg + n, -1.5f);
                    break;
                case 2:
                    std::fill(xg, xg + n, 0.25f);
                    break;
                case 3:
                    for (int i = 0; i < n; ++i) xg[i] = -std::fabs(xg[i]);
                    break;
                case 4:
                    xg[rng() % n] = 50.0f;
                    break;
                case 5:
                    for (int i = 0; i < n; ++i) xg[i] = std::fabs(xg[i]) * 1e-3f;
                    break;
                default:
                    break;
            }
        }
        for (size_t i = 0; i < w.size(); ++i)
            w[i] = (rng() % 5 == 0) ? 0.0f : std::fabs(x[i]) + 0.1f * float(rng() % 7);
        struct P {
            int nmax;
            float rmin, rdelta;
            int nstep;
            bool mad;
        };
        for (const P& p : {P{3, -0.5f, 0.1f, 15, true}, P{15, -1.f, 0.1f, 20, false},
                           P{31, -0.5f, 0.1f, 15, false}, P{15, -0.9f, 0.05f, 36, false},
                           P{3, -0.9f, 0.05f, 36, false}}) {
            std::vector<uint8_t> L1(x.size()), L2(x.size()), aux(32);
            float s1[8], m1[8], s2[8], m2[8];
            search_scale_min_x8(n, p.nmax, x.data(), w.data(), L1.data(), s1, m1, p.rmin, p.rdelta,
                                p.nstep, p.mad);
            for (int g = 0; g < 8; ++g)
                s2[g] = search_scale_min(n, p.nmax, &x[size_t(g * n)], &w[size_t(g * n)],
                                         &L2[size_t(g * n)], &m2[g], aux.data(), p.rmin, p.rdelta,
                                         p.nstep, p.mad);
            EXPECT_EQ(L1, L2) << "trial " << trial << " nmax " << p.nmax;
            for (int g = 0; g < 8; ++g) {
                EXPECT_EQ(f32_bits(s1[g]), f32_bits(s2[g])) << "trial " << trial << " group " << g;
                EXPECT_EQ(f32_bits(m1[g]), f32_bits(m2[g])) << "trial " << trial << " group " << g;
            }
            ++compared;
        }
        for (int nmax : {4, 8, 16, 32})
            for (bool weighted : {false, true}) {
                std::vector<int8_t> L1(x.size()), L2(x.size());
                float s1[8], s2[8];
                const float* wp = weighted ? w.data() : nullptr;
                search_symmetric_x8(n, nmax, x.data(), L1.data(), wp, s1);
                for (int g = 0; g < 8; ++g)
                    s2[g] = search_symmetric(n, nmax, &x[size_t(g * n)], &L2[size_t(g * n)],
                                             wp ? wp + g * n : nullptr);
                EXPECT_EQ(L1, L2) << "trial " << trial << " nmax " << nmax;
                for (int g = 0; g < 8; ++g)
                    EXPECT_EQ(f32_bits(s1[g]), f32_bits(s2[g])) << "trial " << trial;
                ++compared;
            }
    }
    std::printf("%d group searches compared\n", compared);
}

// quantize_rows may be called from several threads on disjoint rows: the
// result must not depend on how the rows are split.
TEST(QuantBounds, ThreadedQuantizationIsDeterministic) {
    const int64_t rows = 64, n = 1024;
    const std::vector<float> x = varied_floats(size_t(rows * n), 41);
    std::vector<float> im = normal_floats(size_t(n), 42);
    for (auto& v : im) v = v * v + 0.01f;
    for (Type t : quant_types())
        for (const float* qw :
             {static_cast<const float*>(nullptr), static_cast<const float*>(im.data())}) {
            const std::vector<uint8_t> whole = quantize(t, x, rows, qw);
            std::vector<uint8_t> split(whole.size());
            const size_t rb = row_size(t, n);
            std::vector<std::thread> threads;
            for (int k = 0; k < 4; ++k)
                threads.emplace_back([&, k] {
                    for (int64_t r = k; r < rows; r += 4)
                        quantize_rows(t, &x[size_t(r * n)], split.data() + rb * size_t(r), 1, n,
                                      qw);
                });
            for (auto& th : threads) th.join();
            EXPECT_EQ(whole, split) << name(t) << (qw ? " imatrix" : "");
        }
}

}  // namespace
}  // namespace glm5::test

// Quantization of the i-quant formats: properties that follow from each
// format and from the structure of its search, checked on Gaussian rows (plus
// heavy-tailed rows and rows with all-zero stretches).
//
// What is checked, and why it must hold:
//  * Lattice tables: every reachable off-grid level combination lists exactly
//    the grid points at its `nwant` smallest distances, by (distance, index) -
//    the candidates the search may consider; best_neighbour returns the best
//    of them under its weighted error. grid_search returns on-grid groups and
//    the least-squares scale of what it returns.
//  * IQ4_NL / IQ4_XS: every value decodes to the level nearest to it at the
//    stored scale, up to the fp16 rounding of that scale (derivation at
//    check_iq4_nearest); hence, inside the level range, the error is at most
//    half the gap between the two levels around the value.
//  * 2/3-bit grids: signs follow the input, except the one value per group of
//    8 that the 7-bit sign formats must flip to keep an even number of minus
//    signs, which is the least important value of its group.
//  * All grid formats (IQ1 too): the search does better than the trivial grid
//    point (all magnitudes at the smallest level) with the same stored scales
//    and signs, and better than reconstructing zeros - on the row total. Per
//    group of 8 neither is guaranteed: the levels are chosen at the search's
//    own scale, and the stored 3/4-bit sub-block scale differs from it by up to
//    one step, so a value just past a rounding midpoint can end up closer to
//    the smaller level at the stored scale (about 1% of IQ2_XXS groups on
//    Gaussian data); summed over a row, values far from midpoints dominate.
//  * Importance matrix: the search minimises errors weighted by the imatrix,
//    so its imatrix-weighted error beats that of a search with uniform weights.
//  * All-zero rows decode to zeros.
// The fast mode (quantize_rows_fast) must meet the same bounds: it runs the
// same kind of search, with fewer trial scales.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "iq_test_util.h"
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_tables.h"
#include "quant/quant.h"
#include "quant/quantize_fast.h"

namespace {

using namespace glm5::quant;
using glm5::fp16_to_fp32;
using iqtest::iquant_types;

constexpr int64_t kN = 4096;  // values per row

// Rows of N(0,1); every fourth row heavy-tailed (N(0,1) * exp(N(0,1))); every
// third row with an all-zero stretch of 48 values (a whole sub-block of 32 and
// part of the next, for every block size).
std::vector<float> test_rows(int64_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(rows * kN);
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x.data() + r * kN;
        for (int64_t i = 0; i < kN; ++i) row[i] = nd(rng) * (r % 4 == 3 ? std::exp(nd(rng)) : 1.f);
        if (r % 3 == 2)
            for (int64_t i = 0; i < 48; ++i) row[256 + 16 + i] = 0.f;
    }
    return x;
}

// Importance per column: log-normal, spanning about two orders of magnitude.
std::vector<float> test_imatrix(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.5f);
    std::vector<float> im(kN);
    for (auto& v : im) v = std::exp(nd(rng));
    return im;
}

struct Quantized {
    std::vector<uint8_t> bytes;
    std::vector<float> y;  // dequantized
};

// fast: quantize_rows_fast (IQ2_XXS's cheaper search; the same as
// quantize_rows for the other formats).
Quantized quantize(Type t, const std::vector<float>& x, const float* imatrix, bool fast = false) {
    const int64_t rows = int64_t(x.size()) / kN;
    Quantized q;
    q.bytes.resize(row_size(t, kN) * rows);
    const auto fn = fast ? quantize_rows_fast : quantize_rows;
    EXPECT_EQ(fn(t, x.data(), q.bytes.data(), rows, kN, imatrix), q.bytes.size());
    q.y.resize(x.size());
    for (int64_t r = 0; r < rows; ++r)
        dequantize_row(t, q.bytes.data() + r * row_size(t, kN), q.y.data() + r * kN, kN);
    return q;
}

// Every format with its reference search, plus the fast-mode variants.
struct Variant {
    Type t;
    bool fast;
    std::string label() const { return std::string(name(t)) + (fast ? " (fast)" : ""); }
};

std::vector<Variant> variants() {
    std::vector<Variant> v;
    for (Type t : iquant_types()) v.push_back({t, false});
    for (Type t : iquant_types())
        if (has_fast_quantize(t)) v.push_back({t, true});
    return v;
}

double sq_err(const float* x, const float* y, int64_t n, const float* w = nullptr) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
        s += (w ? w[i % kN] : 1.0) * (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    return s;
}

// ---------------------------------------------------------------------------
// Lattices (internal): the candidate lists the grid searches draw from.

struct LatticeCase {
    iq::LatticeId id;
    const char* name;
    int max_level;  // levels the quantizers produce: 0..max_level
    int nwant;      // distance classes per list (ggml's choice per format)
};

const LatticeCase kLattices[] = {
    {iq::LatticeId::IQ2_XXS, "IQ2_XXS", 2, 2}, {iq::LatticeId::IQ2_XS, "IQ2_XS", 2, 2},
    {iq::LatticeId::IQ2_S, "IQ2_S", 2, 1},     {iq::LatticeId::IQ1, "IQ1", 2, 3},
    {iq::LatticeId::IQ3_XXS, "IQ3_XXS", 7, 2}, {iq::LatticeId::IQ3_S, "IQ3_S", 7, 3},
};

TEST(IQuantLattice, GridPointsMapToThemselves) {
    for (const LatticeCase& c : kLattices) {
        const iq::Lattice& lat = iq::lattice(c.id);
        for (int g = 0; g < lat.ngrid; ++g) {
            int8_t L[8];
            for (int i = 0; i < lat.dim; ++i) L[i] = int8_t(lat.levels[g * lat.dim + i]);
            ASSERT_EQ(lat.map[lat.code(L)], g) << c.name << " grid point " << g;
        }
    }
}

TEST(IQuantLattice, NeighbourListsAreTheNearestGridPoints) {
    for (const LatticeCase& c : kLattices) {
        const iq::Lattice& lat = iq::lattice(c.id);
        const uint32_t ncodes = 1u << (lat.bits * lat.dim);
        std::vector<int> d2(lat.ngrid);
        int lists = 0;
        for (uint32_t u = 0; u < ncodes; ++u) {
            int cur[8];
            bool reachable = true;
            for (int i = 0; i < lat.dim; ++i) {
                cur[i] = int(u >> (lat.bits * i)) & ((1 << lat.bits) - 1);
                reachable = reachable && cur[i] <= c.max_level;
            }
            if (!reachable || lat.map[u] >= 0) continue;
            for (int g = 0; g < lat.ngrid; ++g) {
                int d = 0;
                for (int i = 0; i < lat.dim; ++i)
                    d += (lat.levels[g * lat.dim + i] - cur[i]) *
                         (lat.levels[g * lat.dim + i] - cur[i]);
                d2[g] = d;
            }
            std::vector<int> classes(d2);
            std::sort(classes.begin(), classes.end());
            classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
            const int limit = classes[std::min<size_t>(c.nwant, classes.size()) - 1];
            std::vector<std::pair<int, int>> want;
            for (int g = 0; g < lat.ngrid; ++g)
                if (d2[g] <= limit) want.push_back({d2[g], g});
            std::sort(want.begin(), want.end());
            const uint16_t* nb = lat.neighbours(u);
            ASSERT_EQ(int(nb[0]), int(want.size())) << c.name << " code " << u;
            for (size_t j = 0; j < want.size(); ++j)
                ASSERT_EQ(int(nb[1 + j]), want[j].second) << c.name << " code " << u;
            ++lists;
        }
        EXPECT_GT(lists, 0) << c.name;
    }
}

TEST(IQuantLattice, BestNeighbourMinimisesTheWeightedError) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uni(0.f, 1.f);
    for (const LatticeCase& c : kLattices) {
        const iq::Lattice& lat = iq::lattice(c.id);
        const uint32_t ncodes = 1u << (lat.bits * lat.dim);
        std::uniform_int_distribution<uint32_t> pick(0, ncodes - 1);
        for (int trial = 0; trial < 2000; ++trial) {
            const uint32_t u = pick(rng);
            if (lat.map[u] < 0 && lat.map[u] != INT32_MIN) {
                float x[8], w[8];
                for (int i = 0; i < lat.dim; ++i)
                    x[i] = uni(rng) * 2 * (c.max_level + 1), w[i] = uni(rng);
                const float scale = 0.5f + uni(rng);
                int8_t L[8];
                const uint16_t* nb = lat.neighbours(u);
                const int got = iq::best_neighbour(lat, nb, x, w, scale, L);
                int want = -1;
                float best = 0;
                for (int j = 1; j <= nb[0]; ++j) {
                    float e = 0;
                    for (int i = 0; i < lat.dim; ++i) {
                        const float diff =
                            scale * float(2 * lat.levels[nb[j] * lat.dim + i] + 1) - x[i];
                        e += w[i] * diff * diff;
                    }
                    if (want < 0 || e < best) want = nb[j], best = e;
                }
                ASSERT_EQ(got, want) << c.name;
                for (int i = 0; i < lat.dim; ++i)
                    ASSERT_EQ(L[i], int8_t(lat.levels[got * lat.dim + i]));
            }
        }
    }
}

// grid_search, as every 2/3-bit format configures it: groups on the grid, and
// the returned scale is the weighted least-squares scale of the returned levels.
TEST(IQuantLattice, GridSearchReturnsGridPointsAndTheirLeastSquaresScale) {
    const iq::GridSearch configs[] = {
        {iq::LatticeId::IQ2_XXS, 32, 3, 6, 0.1f, true, iq::Resnap::All},
        {iq::LatticeId::IQ2_XS, 16, 3, 9, 0.1f, false, iq::Resnap::OffGrid},
        {iq::LatticeId::IQ2_S, 16, 3, 9, 0.1f, false, iq::Resnap::OffGrid},
        {iq::LatticeId::IQ3_XXS, 32, 8, 15, 0.2f, false, iq::Resnap::OffGrid},
        {iq::LatticeId::IQ3_S, 32, 8, 9, 0.2f, false, iq::Resnap::AllIfOffGrid},
    };
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (const iq::GridSearch& gs : configs) {
        const iq::Lattice& lat = iq::lattice(gs.lattice);
        for (int trial = 0; trial < 300; ++trial) {
            float x[32], w[32], waux[32];
            float max = 0;
            for (int i = 0; i < gs.n; ++i) {
                x[i] = std::fabs(nd(rng));
                w[i] = 0.1f + x[i] * x[i];
                waux[i] = std::sqrt(w[i]);
                max = std::max(max, x[i]);
            }
            int8_t L[32];
            const auto scale = iq::grid_search(gs, x, w, waux, max, L);
            ASSERT_TRUE(scale.has_value());
            for (int k = 0; k < gs.n / lat.dim; ++k)
                ASSERT_GE(lat.map[lat.code(L + k * lat.dim)], 0);
            float sumqx = 0, sumq2 = 0;
            for (int i = 0; i < gs.n; ++i) {
                const float q = float(2 * L[i] + 1);
                sumqx += w[i] * x[i] * q;
                sumq2 += w[i] * q * q;
            }
            ASSERT_EQ(*scale, sumqx / sumq2);
        }
    }
}

// ---------------------------------------------------------------------------
// Every format.

TEST(IQuantQuantize, AllZeroRowsDecodeToZero) {
    const std::vector<float> zeros(2 * kN, 0.f);
    const std::vector<float> im = test_imatrix(3);
    for (const Variant& v : variants()) {
        for (const float* imat : {static_cast<const float*>(nullptr), im.data()}) {
            const Quantized q = quantize(v.t, zeros, imat, v.fast);
            for (size_t i = 0; i < q.y.size(); ++i)
                ASSERT_EQ(q.y[i], 0.f) << v.label() << " value " << i;
        }
    }
}

TEST(IQuantQuantize, RepeatedCallsGiveIdenticalBytes) {
    const std::vector<float> x = test_rows(2, 21);
    const std::vector<float> im = test_imatrix(22);
    for (const Variant& v : variants()) {
        const Quantized a = quantize(v.t, x, im.data(), v.fast),
                        b = quantize(v.t, x, im.data(), v.fast);
        EXPECT_EQ(a.bytes, b.bytes) << v.label();
    }
}

TEST(IQuantQuantize, FastModeIsTheReferenceWhereThereIsNone) {
    const std::vector<float> x = test_rows(1, 23);
    EXPECT_TRUE(has_fast_quantize(Type::IQ2_XXS));
    for (Type t : iquant_types()) {
        if (has_fast_quantize(t)) continue;
        EXPECT_EQ(quantize(t, x, nullptr, true).bytes, quantize(t, x, nullptr).bytes) << name(t);
    }
}

// ---------------------------------------------------------------------------
// IQ4_NL / IQ4_XS.
//
// Derivation. The quantizer holds a float scale s for each block of 32 (IQ4_XS:
// s = d*l for its float super-scale d and 6-bit l) and picks for each value the
// level k minimising |x/s - kv[k]|, evaluated as x*(1/s) (relative error below
// 2^-22). It stores D = fp16(s) (IQ4_XS: fp16(d)*l), so |D - s| <= e|D| with
// e = 2^-11 (fp16 rounding, plus a few float roundings, taken as 2^-10). For the
// chosen level L and any level k:
//   |x - D kv[L]| <= |x - s kv[L]| + |D - s| 127
//                 <= |x - s kv[k]| + 2^-21 |x| + |D - s| 127
//                 <= |x - D kv[k]| + 2^-21 |x| + 254 e |D|.
// So every value decodes to the nearest level at the stored scale up to
// slack = 254 e |D| + 2^-21 |x|, and when x/D lies between the first and last
// level, within half the gap around it: |x - D kv[L]| <= D*gap/2 + slack.

struct Iq4Value {
    float D;  // stored scale of the value's block of 32
    int L;    // its level index
};

Iq4Value iq4_value(Type t, const uint8_t* row, int64_t i) {
    const int j = int(i % 32);
    if (t == Type::IQ4_NL) {
        const auto* b = reinterpret_cast<const BlockIQ4_NL*>(row) + i / 32;
        return {fp16_to_fp32(b->d), j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4};
    }
    const auto* b = reinterpret_cast<const BlockIQ4_XS*>(row) + i / 256;
    const int ib = int(i % 256) / 32;
    const int ls =
        ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b->scales_h >> (2 * ib)) & 3) << 4);
    const uint8_t* qs = b->qs + 16 * ib;
    return {fp16_to_fp32(b->d) * float(ls - 32), j < 16 ? qs[j] & 15 : qs[j - 16] >> 4};
}

void check_iq4_nearest(Type t, const std::vector<float>& x, const Quantized& q,
                       const std::string& what) {
    const int8_t* kv = iq::kvalues_iq4nl;
    const double e = 1.0 / 1024;
    int64_t inside = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const int64_t r = int64_t(i) / kN;
        const Iq4Value v = iq4_value(t, q.bytes.data() + r * row_size(t, kN), int64_t(i) % kN);
        const double D = v.D, xi = x[i];
        ASSERT_EQ(q.y[i], float(D) * float(kv[v.L])) << what;
        const double slack = 254 * e * std::fabs(D) + std::ldexp(std::fabs(xi), -21) + 1e-30;
        const double err = std::fabs(xi - D * kv[v.L]);
        double best = err;
        for (int k = 0; k < 16; ++k) best = std::min(best, std::fabs(xi - D * kv[k]));
        ASSERT_LE(err, best + slack)
            << what << " value " << i << ": level " << v.L << " is not the nearest";
        if (D != 0) {
            const double u = xi / D;
            for (int k = 0; k < 15; ++k)
                if (u >= kv[k] && u <= kv[k + 1]) {
                    ASSERT_LE(err, std::fabs(D) * (kv[k + 1] - kv[k]) / 2 + slack)
                        << what << " value " << i;
                    ++inside;
                }
        }
    }
    EXPECT_GT(inside, int64_t(x.size()) / 2) << what;  // most values are inside the level range
}

TEST(IQuantQuantize, Iq4ValuesAreTheNearestLevelAtTheStoredScale) {
    const std::vector<float> x = test_rows(8, 31);
    const std::vector<float> im = test_imatrix(32);
    for (Type t : {Type::IQ4_NL, Type::IQ4_XS}) {
        check_iq4_nearest(t, x, quantize(t, x, nullptr), std::string(name(t)));
        check_iq4_nearest(t, x, quantize(t, x, im.data()), std::string(name(t)) + " imatrix");
    }
}

// ---------------------------------------------------------------------------
// The grid formats (IQ1_S, IQ1_M, IQ2_*, IQ3_*).

bool is_grid_format(Type t) {
    return t != Type::IQ4_NL && t != Type::IQ4_XS;
}

// Index of IQ1's all-zero grid point.
int iq1_zero_point() {
    for (int g = 0; g < 2048; ++g)
        if (iq::iq1s_grid[g] == 0) return g;
    return -1;
}

// The same blocks with every grid index replaced by the trivial point: all
// magnitudes at the smallest level (grid point 0 of every IQ2/IQ3 grid), or
// IQ1's all-zero point. Scales, signs and IQ1 delta signs are kept.
std::vector<uint8_t> with_trivial_points(Type t, std::vector<uint8_t> row) {
    const size_t bs = traits(t).type_size;
    for (size_t off = 0; off < row.size(); off += bs) {
        uint8_t* p = row.data() + off;
        switch (t) {
            case Type::IQ2_XXS: {
                auto* b = reinterpret_cast<BlockIQ2_XXS*>(p);
                for (int ib = 0; ib < 8; ++ib)
                    b->qs[4 * ib] = b->qs[4 * ib + 1] = 0;  // the 4 index bytes
                break;
            }
            case Type::IQ2_XS: {
                auto* b = reinterpret_cast<BlockIQ2_XS*>(p);
                for (auto& q : b->qs) q = uint16_t(q & ~511);
                break;
            }
            case Type::IQ2_S: {
                auto* b = reinterpret_cast<BlockIQ2_S*>(p);
                std::memset(b->qs, 0, QK_K / 8);
                std::memset(b->qh, 0, sizeof(b->qh));
                break;
            }
            case Type::IQ3_XXS:
                std::memset(reinterpret_cast<BlockIQ3_XXS*>(p)->qs, 0, QK_K / 4);
                break;
            case Type::IQ3_S: {
                auto* b = reinterpret_cast<BlockIQ3_S*>(p);
                std::memset(b->qs, 0, sizeof(b->qs));
                std::memset(b->qh, 0, sizeof(b->qh));
                break;
            }
            case Type::IQ1_S: {
                auto* b = reinterpret_cast<BlockIQ1_S*>(p);
                const int z = iq1_zero_point();
                std::memset(b->qs, z & 255, sizeof(b->qs));
                for (auto& h : b->qh)
                    h = uint16_t((h & 0xf000) | ((z >> 8) * 0x249));  // 3 bits x 4 groups
                break;
            }
            case Type::IQ1_M: {
                auto* b = reinterpret_cast<BlockIQ1_M*>(p);
                const int z = iq1_zero_point();
                std::memset(b->qs, z & 255, sizeof(b->qs));
                for (auto& h : b->qh)
                    h = uint8_t((h & 0x88) | ((z >> 8) * 0x11));  // 3 bits x 2 groups
                break;
            }
            default:
                break;
        }
    }
    return row;
}

TEST(IQuantQuantize, TrivialPointsAreTheSmallestMagnitudes) {
    EXPECT_EQ(iq::iq2xxs_grid[0], 0x0808080808080808ull);  // 8 is the smallest IQ2 magnitude
    EXPECT_EQ(iq::iq2xs_grid[0], 0x0808080808080808ull);
    EXPECT_EQ(iq::iq2s_grid[0], 0x0808080808080808ull);
    EXPECT_EQ(iq::iq3xxs_grid[0], 0x04040404u);  // 4 is the smallest IQ3_XXS magnitude
    EXPECT_EQ(iq::iq3s_grid[0], 0x01010101u);    // 1 is the smallest IQ3_S magnitude
    EXPECT_GE(iq1_zero_point(), 0);
}

TEST(IQuantQuantize, GridFormatsBeatTheTrivialGridPointAndZero) {
    const std::vector<float> x = test_rows(8, 41);
    const std::vector<float> im = test_imatrix(42);
    for (const Variant& v : variants()) {
        const Type t = v.t;
        if (!is_grid_format(t)) continue;
        for (const float* imat : {static_cast<const float*>(nullptr), im.data()}) {
            const Quantized q = quantize(t, x, imat, v.fast);
            for (int64_t r = 0; r < int64_t(x.size()) / kN; ++r) {
                const size_t rb = row_size(t, kN);
                const std::vector<uint8_t> row(q.bytes.begin() + r * rb,
                                               q.bytes.begin() + (r + 1) * rb);
                const std::vector<uint8_t> triv = with_trivial_points(t, row);
                std::vector<float> yt(kN);
                dequantize_row(t, triv.data(), yt.data(), kN);
                const float* xr = x.data() + r * kN;
                const double e = sq_err(xr, q.y.data() + r * kN, kN),
                             et = sq_err(xr, yt.data(), kN);
                const std::vector<float> zero(kN, 0.f);
                const double e0 = sq_err(xr, zero.data(), kN);
                EXPECT_LT(e, et) << v.label() << (imat ? " imatrix" : "") << " row " << r;
                EXPECT_LT(e, e0) << v.label() << (imat ? " imatrix" : "") << " row " << r;
            }
        }
    }
}

// Signs. IQ2_S and IQ3_S store all 8 sign bits: every decoded sign is the
// input's (x >= 0 decodes positive). IQ2_XXS, IQ2_XS and IQ3_XXS store 7, the
// eighth making the count of minus signs even; when the input has an odd count,
// exactly one value of the group decodes with the wrong sign, and ggml's rule
// (kept here) picks the value with the least importance w*x^2, w being the
// format's weight qw*sqrt(sigma2 + x^2), sigma2 the mean square (IQ2) or twice
// it (IQ3_XXS) of the super-block and qw the imatrix or, without one, 1
// (IQ3_XXS without one: x^2); without an imatrix that is the smallest |x|.
void check_signs(Type t, const std::vector<float>& x, const Quantized& q, const float* imat) {
    const bool parity = t == Type::IQ2_XXS || t == Type::IQ2_XS || t == Type::IQ3_XXS;
    int64_t odd_groups = 0;
    for (size_t g = 0; g < x.size() / 8; ++g) {
        const float* xg = x.data() + 8 * g;
        const float* yg = q.y.data() + 8 * g;
        if (yg[0] == 0 && yg[1] == 0) continue;  // a zero scale: no signs to check
        // Importance as the format computes it (for the flip choice only).
        const int64_t sb = int64_t(8 * g) / 256 * 256;
        double sumx2 = 0;
        for (int i = 0; i < 256; ++i) sumx2 += double(x[sb + i]) * x[sb + i];
        const double sigma2 = (t == Type::IQ3_XXS ? 2 : 1) * sumx2 / 256;
        double imp[8];
        for (int i = 0; i < 8; ++i) {
            const double xi = xg[i];
            // Without an imatrix: IQ3_XXS weighs by x^2 (ggml's default), IQ2_XXS
            // and IQ2_XS by unit importance.
            const double qw = imat ? imat[(8 * g + i) % kN] : 1.0;
            const double w =
                !imat && t == Type::IQ3_XXS ? xi * xi : qw * std::sqrt(sigma2 + xi * xi);
            imp[i] = w * xi * xi;
        }
        int negatives = 0, wrong = -1, nwrong = 0;
        for (int i = 0; i < 8; ++i) {
            negatives += xg[i] < 0;
            if ((xg[i] < 0) != (yg[i] < 0)) wrong = i, ++nwrong;
        }
        if (!parity || negatives % 2 == 0) {
            ASSERT_EQ(nwrong, 0) << name(t) << " group " << g;
            continue;
        }
        ++odd_groups;
        ASSERT_EQ(nwrong, 1) << name(t) << " group " << g;
        const double least = *std::min_element(imp, imp + 8);
        ASSERT_LE(imp[wrong], least * (1 + 1e-5) + 1e-30) << name(t) << " group " << g;
    }
    if (parity) {
        EXPECT_GT(odd_groups, 0);
    }
}

TEST(IQuantQuantize, GridFormatSignsFollowTheInput) {
    const std::vector<float> x = test_rows(4, 51);
    const std::vector<float> im = test_imatrix(52);
    for (const Variant& v : variants()) {
        if (!is_grid_format(v.t) || v.t == Type::IQ1_S || v.t == Type::IQ1_M) continue;
        check_signs(v.t, x, quantize(v.t, x, nullptr, v.fast), nullptr);
        check_signs(v.t, x, quantize(v.t, x, im.data(), v.fast), im.data());
    }
}

// ---------------------------------------------------------------------------
// Importance matrix.

TEST(IQuantQuantize, ImatrixLowersTheImportanceWeightedError) {
    const std::vector<float> x = test_rows(8, 61);
    const std::vector<float> im = test_imatrix(62);
    const std::vector<float> uniform(kN, 1.f);
    for (const Variant& v : variants()) {
        const Type t = v.t;
        const Quantized steered = quantize(t, x, im.data(), v.fast);
        const Quantized flat = quantize(t, x, uniform.data(), v.fast);
        const double e_steered = sq_err(x.data(), steered.y.data(), int64_t(x.size()), im.data());
        const double e_flat = sq_err(x.data(), flat.y.data(), int64_t(x.size()), im.data());
        EXPECT_LT(e_steered, e_flat) << v.label();
    }
}

}  // namespace

// Internal to src/quant: the i-quant family (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS). Row functions per format, the lattice
// tables the grid quantizers search, and small helpers they share.
//
// Numerics follow ggml's reference code operation by operation where it
// matters: dequantization and the scalar dot products are bit-exact with
// ggml's, and the quantizers run the same searches in the same float order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "quant/common.h"

namespace glm5::quant::iq {

// ---- Lattices -------------------------------------------------------------
//
// The 2- and 3-bit grid formats (and IQ1's ternary grid) only allow a subset
// of all level combinations for each group of 8 (or 4) values. The quantizer
// rounds each value to a level, then looks the combination up: either it is a
// grid point, or it has a precomputed list of the nearest grid points (the
// points at the `nwant` smallest squared distances, in level space, ordered by
// distance then by grid index) among which the best is chosen under weights.

enum class LatticeId { IQ2_XXS, IQ2_XS, IQ2_S, IQ1, IQ3_XXS, IQ3_S, Count };

struct Lattice {
    int dim = 0;                      // values per group: 8 or 4
    int bits = 0;                     // bits per coordinate in a combination code
    int ngrid = 0;                    // grid points
    const uint8_t* levels = nullptr;  // ngrid*dim levels (0..), row per grid point
    const int32_t* map = nullptr;     // code -> grid index (>= 0) or -(1 + offset into lists)
    const uint16_t* lists = nullptr;  // at an offset: count, then that many grid indices

    // Code of a combination of levels (level i in bits [bits*i, bits*i+bits)).
    uint32_t code(const int8_t* l) const {
        uint32_t u = 0;
        for (int i = 0; i < dim; ++i) u |= uint32_t(l[i]) << (bits * i);
        return u;
    }
    // The neighbour list of an off-grid code (map[code] < 0).
    const uint16_t* neighbours(uint32_t u) const { return lists + (-map[u] - 1); }
};

// Built on first use (thread-safe, once per lattice), then immutable.
const Lattice& lattice(LatticeId id);

// Among the neighbours of an off-grid code, the grid point minimising
// sum_i w[i] * (scale*(2*level+1) - x[i])^2; writes its levels to L and returns
// its index (the first such point on ties, like ggml).
int best_neighbour(const Lattice& lat, const uint16_t* nb, const float* x, const float* w,
                   float scale, int8_t* L);

// Scan a neighbour list of an 8-dimensional 3-level lattice, given each
// coordinate's error term per level: the candidate with the least sum of its
// terms (summed in coordinate order), the first one on ties. Four candidates
// are summed side by side (independent chains; each sum keeps its order, so
// the result is that of scanning one by one).
inline void scan_candidates(const float (*term)[3], const uint8_t* levels, const uint16_t* nb,
                            float& best, int& best_g) {
    const int count = nb[0];
    int j = 1;
    for (; j + 3 <= count; j += 4) {
        const uint8_t* p0 = levels + size_t(nb[j]) * 8;
        const uint8_t* p1 = levels + size_t(nb[j + 1]) * 8;
        const uint8_t* p2 = levels + size_t(nb[j + 2]) * 8;
        const uint8_t* p3 = levels + size_t(nb[j + 3]) * 8;
        float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int i = 0; i < 8; ++i) {
            d0 += term[i][p0[i]];
            d1 += term[i][p1[i]];
            d2 += term[i][p2[i]];
            d3 += term[i][p3[i]];
        }
        if (d0 < best) best = d0, best_g = nb[j];
        if (d1 < best) best = d1, best_g = nb[j + 1];
        if (d2 < best) best = d2, best_g = nb[j + 2];
        if (d3 < best) best = d3, best_g = nb[j + 3];
    }
    for (; j <= count; ++j) {
        const uint8_t* p = levels + size_t(nb[j]) * 8;
        float d = 0;
        for (int i = 0; i < 8; ++i) d += term[i][p[i]];
        if (d < best) best = d, best_g = nb[j];
    }
}

// ---- Grid search for one sub-block (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) ----
//
// Given non-negative magnitudes xval (signs already split off), importance
// weights w and their square roots waux, find levels L (one grid point per group
// of lat.dim values) and a scale s so that s*(2L+1) approximates xval: try a fan
// of trial scales around the one that maps the largest value to the top level,
// round to levels, snap each group to the lattice (nearest listed neighbour
// under waux), keep the trial with the best least-squares fit, then re-snap at
// the fitted scale and refit.

enum class Resnap {
    All,           // every group is re-snapped at the fitted scale (IQ2_XXS)
    OffGrid,       // only groups whose best trial was off the grid (IQ2_XS, IQ2_S, IQ3_XXS)
    AllIfOffGrid,  // every group, when any group was off the grid (IQ3_S)
};

struct GridSearch {
    LatticeId lattice;
    int n;           // values in the sub-block: 16 or 32
    int kmax;        // levels 0..kmax-1
    int half_steps;  // trials is = -half_steps..half_steps
    float step;      // trial spacing in units of the top level
    bool qp_start;   // start from make_qp_quants' scale (IQ2_XXS) instead of max/(2*kmax-1)
    Resnap resnap;
    // Fast mode (not ggml's search): try only every trial_stride-th trial scale,
    // and during the trials snap an off-grid group to the nearest grid point in
    // level space (the head of its list) instead of searching the whole list.
    // The final snap at the fitted scale still searches the lists.
    int trial_stride = 1;
    bool cheap_trials = false;
};

// Returns the scale; `max` is the largest xval (> 0). With qp_start, returns
// nothing when the starting fit is empty (ggml then leaves the sub-block
// all-zero, signs included).
std::optional<float> grid_search(const GridSearch& gs, const float* xval, const float* w,
                                 const float* waux, float max, int8_t* L);

// Split signs off a group of 8: xval = |x|, returns the sign bits (bit i set
// for x[i] < 0). With `even`, the format stores only 7 sign bits and the eighth
// is implied by even parity: when the count of negatives is odd, the element
// with the least w*x^2 keeps the wrong sign (its xval becomes negative) and its
// bit is toggled.
uint8_t split_signs8(const float* x, const float* w, bool even, float* xval);

// ---- Row functions --------------------------------------------------------

#define GLM5_IQ_ROW_FUNCS(fmt)                                                                    \
    void dequant_##fmt(const void* src, float* dst, int64_t n);                                   \
    size_t quant_##fmt(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat); \
    float dot_##fmt##_ref(int64_t n, const void* w, const void* act);

GLM5_IQ_ROW_FUNCS(iq2_xxs)
GLM5_IQ_ROW_FUNCS(iq2_xs)
GLM5_IQ_ROW_FUNCS(iq2_s)
GLM5_IQ_ROW_FUNCS(iq3_xxs)
GLM5_IQ_ROW_FUNCS(iq3_s)
GLM5_IQ_ROW_FUNCS(iq1_s)
GLM5_IQ_ROW_FUNCS(iq1_m)
GLM5_IQ_ROW_FUNCS(iq4_nl)
GLM5_IQ_ROW_FUNCS(iq4_xs)
#undef GLM5_IQ_ROW_FUNCS

// IQ2_XXS with a cheaper search (see kSearchXXSFast in iq2.cpp).
size_t quant_iq2_xxs_fast(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat);

}  // namespace glm5::quant::iq

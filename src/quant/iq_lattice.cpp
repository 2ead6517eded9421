// The lattices the i-quant quantizers search: grid points in level space, a
// map from every reachable level combination to its grid index or its
// neighbour list. Built lazily, once per lattice, from the dequantization
// grids in iq_tables.h (the level of a grid byte is its rank among the
// format's magnitudes; scripts/gen_iq_tables.py checks this reproduces ggml's
// compressed quantizer grids).
#include <algorithm>
#include <array>
#include <cfloat>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "quant/iq_impl.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

struct Spec {
    int dim, bits, ngrid;
    int max_level;  // the quantizers clamp levels to [0, max_level]
    int nwant;      // distance classes kept in a neighbour list
    const void* grid;
    std::array<int, 8> magnitudes;  // byte value of level 0, 1, ...
    int nmag;
};

Spec spec(LatticeId id) {
    switch (id) {
        case LatticeId::IQ2_XXS:
            return {8, 2, 256, 2, 2, iq2xxs_grid, {8, 25, 43}, 3};
        case LatticeId::IQ2_XS:
            return {8, 2, 512, 2, 2, iq2xs_grid, {8, 25, 43}, 3};
        case LatticeId::IQ2_S:
            return {8, 2, 1024, 2, 1, iq2s_grid, {8, 25, 43}, 3};
        // IQ1 grid bytes are int8 -1, 0, +1.
        case LatticeId::IQ1:
            return {8, 2, 2048, 2, 3, iq1s_grid, {0xff, 0x00, 0x01}, 3};
        case LatticeId::IQ3_XXS:
            return {4, 3, 256, 7, 2, iq3xxs_grid, {4, 12, 20, 28, 36, 44, 52, 62}, 8};
        case LatticeId::IQ3_S:
            return {4, 3, 512, 7, 3, iq3s_grid, {1, 3, 5, 7, 9, 11, 13, 15}, 8};
        default:
            break;
    }
    return {};
}

struct Built {
    Lattice lat;
    std::vector<uint8_t> levels;
    std::vector<int32_t> map;
    std::vector<uint16_t> lists;
};

void build(LatticeId id, Built& b) {
    const Spec s = spec(id);
    b.levels.resize(size_t(s.ngrid) * s.dim);
    for (int g = 0; g < s.ngrid; ++g) {
        const uint64_t packed = s.dim == 8 ? static_cast<const uint64_t*>(s.grid)[g]
                                           : static_cast<const uint32_t*>(s.grid)[g];
        for (int i = 0; i < s.dim; ++i) {
            const int byte = int((packed >> (8 * i)) & 0xff);
            int level = 0;
            while (level < s.nmag && s.magnitudes[level] != byte) ++level;
            b.levels[size_t(g) * s.dim + i] =
                uint8_t(level);  // == nmag cannot happen (checked by the generator)
        }
    }

    const uint32_t ncodes = 1u << (s.bits * s.dim);
    const int32_t kUnreachable = INT32_MIN;  // never queried: some level above max_level
    b.map.assign(ncodes, kUnreachable);
    for (int g = 0; g < s.ngrid; ++g) {
        uint32_t u = 0;
        for (int i = 0; i < s.dim; ++i)
            u |= uint32_t(b.levels[size_t(g) * s.dim + i]) << (s.bits * i);
        b.map[u] = g;
    }

    // Neighbour lists for every off-grid code the quantizers can produce. Squared
    // distances in level space are 1/4 of ggml's (which uses 2*level+1), so the
    // order by (distance, index) is the same; a counting pass over the small
    // integer distances yields exactly that order without sorting.
    const int max_d2 = s.dim * s.max_level * s.max_level;
    const int mask = (1 << s.bits) - 1;
    std::vector<int> d2(s.ngrid);
    std::vector<int> count(max_d2 + 1);
    int cur[8];
    for (uint32_t u = 0; u < ncodes; ++u) {
        if (b.map[u] >= 0) continue;
        bool reachable = true;
        for (int i = 0; i < s.dim; ++i) {
            cur[i] = int(u >> (s.bits * i)) & mask;
            if (cur[i] > s.max_level) reachable = false;
        }
        if (!reachable) continue;
        std::fill(count.begin(), count.end(), 0);
        for (int g = 0; g < s.ngrid; ++g) {
            const uint8_t* p = &b.levels[size_t(g) * s.dim];
            int d = 0;
            for (int i = 0; i < s.dim; ++i) d += (p[i] - cur[i]) * (p[i] - cur[i]);
            d2[g] = d;
            ++count[d];
        }
        // The nwant smallest distinct distances present.
        int classes = 0, limit = -1;
        for (int d = 0; d <= max_d2 && classes < s.nwant; ++d)
            if (count[d]) ++classes, limit = d;
        b.map[u] = -int32_t(b.lists.size()) - 1;
        const size_t head = b.lists.size();
        b.lists.push_back(0);
        for (int d = 0; d <= limit; ++d) {
            if (!count[d]) continue;
            for (int g = 0; g < s.ngrid; ++g)
                if (d2[g] == d) b.lists.push_back(uint16_t(g));
        }
        b.lists[head] = uint16_t(b.lists.size() - head - 1);
    }

    b.lat.dim = s.dim;
    b.lat.bits = s.bits;
    b.lat.ngrid = s.ngrid;
    b.lat.levels = b.levels.data();
    b.lat.map = b.map.data();
    b.lat.lists = b.lists.data();
}

}  // namespace

const Lattice& lattice(LatticeId id) {
    constexpr int n = int(LatticeId::Count);
    static Built built[n];
    static std::once_flag once[n];
    const int i = int(id);
    std::call_once(once[i], [&] { build(id, built[i]); });
    return built[i].lat;
}

int best_neighbour(const Lattice& lat, const uint16_t* nb, const float* x, const float* w,
                   float scale, int8_t* L) {
    const int count = nb[0];
    float best = FLT_MAX;
    int best_g = nb[1];  // a NaN input would match nothing; stay on a valid point
    if (lat.dim == 8) {
        // The 2-bit lattices have 3 levels, so each coordinate's error term
        // w*(scale*q - x)^2 takes one of 3 values: compute them once, with the
        // same operations, and sum per candidate in coordinate order - the
        // same float result as evaluating every candidate from scratch.
        float term[8][3];
        for (int i = 0; i < 8; ++i)
            for (int l = 0; l < 3; ++l) {
                const float diff = scale * float(2 * l + 1) - x[i];
                term[i][l] = w[i] * diff * diff;
            }
        scan_candidates(term, lat.levels, nb, best, best_g);
    } else {
        for (int j = 1; j <= count; ++j) {
            const uint8_t* p = lat.levels + size_t(nb[j]) * lat.dim;
            float d2 = 0;
            for (int i = 0; i < lat.dim; ++i) {
                const float q = float(2 * p[i] + 1);
                const float diff = scale * q - x[i];
                d2 += w[i] * diff * diff;
            }
            if (d2 < best) best = d2, best_g = nb[j];
        }
    }
    const uint8_t* p = lat.levels + size_t(best_g) * lat.dim;
    for (int i = 0; i < lat.dim; ++i) L[i] = int8_t(p[i]);
    return best_g;
}

namespace {

// ggml's make_qp_quants (the scale part): a least-squares scale for levels
// 0..nmax, found by a small fan of trial scales and a few rounds of coordinate
// descent. Kept in ggml's float order, including L being stored as uint8 (a
// negative level, possible for a parity-flipped value, wraps there too).
float qp_scale(int n, int nmax, const float* x, const float* w) {
    uint8_t L[32];
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < 1e-15f) return 0.f;
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = uint8_t(nearest_int(iscale * x[i]));
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) best_mse = mse, iscale = iscale_is;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = uint8_t(l);
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int nl = nearest_int(x[i] * sl2 / slx);
                nl = nl < nmax ? nl : nmax;
                if (nl != L[i]) {
                    slx += w[i] * x[i] * nl;
                    sl2 += w[i] * nl * nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = uint8_t(nl), sumlx = slx, suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Levels for one group at inverse scale id: round to the odd grid 2L+1, clamp.
// Returns true when the combination is a grid point; otherwise L becomes the
// best listed neighbour at `scale`.
bool snap_group(const Lattice& lat, int kmax, float id, float scale, const float* xval,
                const float* waux, int8_t* L, bool cheap = false) {
    for (int i = 0; i < lat.dim; ++i) {
        const int l = nearest_int(0.5f * (id * xval[i] - 1));
        L[i] = int8_t(l < 0 ? 0 : l > kmax - 1 ? kmax - 1 : l);
    }
    const uint32_t u = lat.code(L);
    if (lat.map[u] >= 0) return true;
    if (cheap) {
        const uint8_t* p = lat.levels + size_t(lat.neighbours(u)[1]) * lat.dim;
        for (int i = 0; i < lat.dim; ++i) L[i] = int8_t(p[i]);
    } else {
        best_neighbour(lat, lat.neighbours(u), xval, waux, scale, L);
    }
    return false;
}

// sum w*x*q and sum w*q*q for q = 2L+1, in index order.
void fit_sums(int n, const float* xval, const float* w, const int8_t* L, float& sumqx,
              float& sumq2) {
    sumqx = 0, sumq2 = 0;
    for (int i = 0; i < n; ++i) {
        const float q = float(2 * L[i] + 1);
        sumqx += w[i] * xval[i] * q;
        sumq2 += w[i] * q * q;
    }
}

}  // namespace

std::optional<float> grid_search(const GridSearch& gs, const float* xval, const float* w,
                                 const float* waux, float max, int8_t* L) {
    const Lattice& lat = lattice(gs.lattice);
    const int dim = lat.dim, ngroups = gs.n / dim;
    std::memset(L, 0, size_t(gs.n));

    float scale, ref;
    if (gs.qp_start) {
        scale = qp_scale(gs.n, gs.kmax + 1, xval, w);
        const float eff_max = scale * gs.kmax;
        if (eff_max <= 0) return std::nullopt;
        ref = eff_max;
    } else {
        scale = max / (2 * gs.kmax - 1);
        ref = max;
    }

    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    for (int k = 0; k < ngroups; ++k) on_grid[k] = gs.resnap != Resnap::AllIfOffGrid;
    float best = 0;
    for (int is = -gs.half_steps; is <= gs.half_steps; is += gs.trial_stride) {
        const float id = (2 * gs.kmax - 1 + is * gs.step) / ref;
        const float this_scale = 1 / id;
        for (int k = 0; k < ngroups; ++k)
            on_grid_aux[k] = snap_group(lat, gs.kmax, id, this_scale, xval + dim * k,
                                        waux + dim * k, Laux + dim * k, gs.cheap_trials);
        float sumqx, sumq2;
        fit_sums(gs.n, xval, w, Laux, sumqx, sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::memcpy(L, Laux, size_t(gs.n));
            std::memcpy(on_grid, on_grid_aux, sizeof(on_grid));
        }
    }

    int n_off = 0;
    for (int k = 0; k < ngroups; ++k) n_off += !on_grid[k];
    const bool resnap = scale > 0 && (gs.resnap == Resnap::All || n_off > 0);
    if (resnap) {
        const float id = 1 / scale;
        for (int k = 0; k < ngroups; ++k) {
            if (gs.resnap == Resnap::OffGrid && on_grid[k]) continue;
            snap_group(lat, gs.kmax, id, scale, xval + dim * k, waux + dim * k, L + dim * k);
        }
        float sumqx, sumq2;
        fit_sums(gs.n, xval, w, L, sumqx, sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

uint8_t split_signs8(const float* x, const float* w, bool even, float* xval) {
    uint8_t s = 0;
    int nneg = 0;
    for (int i = 0; i < 8; ++i) {
        if (x[i] >= 0) {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            s |= uint8_t(1 << i);
            ++nneg;
        }
    }
    if (even && (nneg & 1)) {
        int imin = 0;
        float min = w[0] * x[0] * x[0];
        for (int i = 1; i < 8; ++i) {
            const float ax = w[i] * x[i] * x[i];
            if (ax < min) min = ax, imin = i;
        }
        xval[imin] = -xval[imin];
        s ^= uint8_t(1 << imin);
    }
    return s;
}

}  // namespace glm5::quant::iq

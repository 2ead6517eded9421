// IQ1_S (1.56 bpw) and IQ1_M (1.75 bpw): each group of 8 weights is one of
// 2048 points of a ternary grid {-1, 0, +1}^8, shifted by +-delta (1/8) and
// scaled by d*(2s+1). IQ1_S: a 3-bit scale and one delta sign per 32 values,
// fp16 d per 256. IQ1_M: a 3-bit scale per 16 values, a delta sign per 8, and
// the fp16 d spread over the top nibbles of the four scale words.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

inline const int8_t* tgrid(int idx) {
    return reinterpret_cast<const int8_t*>(iq1s_grid + idx);
}

// The fp16 super-block scale of IQ1_M: four nibbles at the top of the scale words.
inline uint16_t iq1m_scale_bits(const uint8_t* scales) {
    uint16_t sc[4];
    std::memcpy(sc, scales, 8);
    return uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                    (sc[3] & 0xf000));
}

// Reconstruction levels for the three grid values when the group is shifted up
// (+delta) or down (-delta).
constexpr float kShiftUp[3] = {-1 + kIq1Delta, kIq1Delta, 1 + kIq1Delta};
constexpr float kShiftDown[3] = {-1 - kIq1Delta, -kIq1Delta, 1 - kIq1Delta};

// Among the listed neighbours of an off-grid ternary combination, the one
// minimising sum w*(scale*xx[level] - x)^2 (first on ties).
int best_ternary_neighbour(const Lattice& lat, const uint16_t* nb, const float* x, const float* w,
                           float scale, const float* xx, int8_t* L) {
    // Each coordinate's term w*(scale*xx[l] - x)^2 has 3 possible values:
    // computed once with the same operations, then summed per candidate in
    // coordinate order (the same float result as evaluating it directly).
    float term[8][3];
    for (int i = 0; i < 8; ++i)
        for (int l = 0; l < 3; ++l) {
            const float diff = scale * xx[l] - x[i];
            term[i][l] = w[i] * diff * diff;
        }
    float best = FLT_MAX;
    int best_g = nb[1];
    scan_candidates(term, lat.levels, nb, best, best_g);
    const uint8_t* p = lat.levels + size_t(best_g) * 8;
    for (int i = 0; i < 8; ++i) L[i] = int8_t(p[i]);
    return best_g;
}

// Indices of x[0..n) sorted by value (stable: ties keep index order, so the
// result does not depend on the sort implementation). NaNs sort last, which
// keeps the comparison a strict weak order for any input.
template <int n>
void sort_by_value(const float* x, int* idx) {
    for (int i = 0; i < n; ++i) idx[i] = i;
    std::stable_sort(idx, idx + n, [x](int a, int b) {
        const bool na = std::isnan(x[a]), nb = std::isnan(x[b]);
        return na || nb ? !na && nb : x[a] < x[b];
    });
}

inline float twice_mean_square(const float* x) {
    float s = 0;
    for (int i = 0; i < QK_K; ++i) s += x[i] * x[i];
    return 2 * s / QK_K;
}

// Importance: ggml's qw*sqrt(sigma2+x^2) with an imatrix. Without one, IQ1_M
// uses its ggml default x^2; ggml has no default for IQ1_S (it refuses), and
// here it takes unit importance (qw = 1), which gives a clearly lower plain
// squared error than x^2.
inline void importance(const float* xb, const float* qw, float sigma2, int n, bool unit_default,
                       float* w) {
    if (qw) {
        for (int i = 0; i < n; ++i) w[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
    } else if (unit_default) {
        for (int i = 0; i < n; ++i) w[i] = sqrtf(sigma2 + xb[i] * xb[i]);
    } else {
        for (int i = 0; i < n; ++i) w[i] = xb[i] * xb[i];
    }
}

// Snap each group of 8 to the lattice (levels L in 0..2), with xx(k) the
// reconstruction levels of group k. Returns true when all were on the grid.
template <typename XX>
bool snap_groups(const Lattice& lat, int ngroups, const float* xb, const float* w, float scale,
                 XX xx, int8_t* L, uint16_t* index) {
    bool all_on = true;
    for (int k = 0; k < ngroups; ++k) {
        const uint32_t u = lat.code(L + 8 * k);
        int g = lat.map[u];
        if (g < 0) {
            all_on = false;
            g = best_ternary_neighbour(lat, lat.neighbours(u), xb + 8 * k, w + 8 * k, scale, xx(k),
                                       L + 8 * k);
        }
        index[k] = uint16_t(g);
    }
    return all_on;
}

void quant_block_iq1_s(const float* x, BlockIQ1_S& y, const float* qw, const Lattice& lat) {
    constexpr int bs = 32;
    float scales[QK_K / bs];
    int8_t shifts[QK_K / bs];
    float w[bs], sumx[bs + 1], sumw[bs + 1];
    int idx[bs];
    int8_t L[bs];
    uint16_t index[bs / 8];

    y.d = 0;
    std::memset(y.qs, 0, sizeof(y.qs));
    std::memset(y.qh, 0, sizeof(y.qh));
    const float sigma2 = twice_mean_square(x);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / bs; ++ib) {
        const float* xb = x + bs * ib;
        importance(xb, qw ? qw + bs * ib : nullptr, sigma2, bs, true, w);
        float max = fabsf(xb[0]);
        for (int i = 1; i < bs; ++i) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        scales[ib] = 0, shifts[ib] = 1;
        if (max < 1e-12f) continue;
        // With three levels the weighted least-squares problem is solved exactly:
        // sorted by value, the levels split the values at two boundaries i1 <= i2,
        // and prefix sums give each split's optimal scale and score in O(1).
        sort_by_value<bs>(xb, idx);
        sumx[0] = sumw[0] = 0;
        for (int j = 0; j < bs; ++j) {
            const int i = idx[j];
            sumx[j + 1] = sumx[j] + w[i] * xb[i];
            sumw[j + 1] = sumw[j] + w[i];
        }
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_shift = 0;
        for (int i1 = 0; i1 <= bs; ++i1) {
            for (int i2 = i1; i2 <= bs; ++i2) {
                for (int shift : {1, -1}) {
                    const float* xx = shift == 1 ? kShiftUp : kShiftDown;
                    const float sumqx = (sumx[i1] - sumx[0]) * xx[0] +
                                        (sumx[i2] - sumx[i1]) * xx[1] +
                                        (sumx[bs] - sumx[i2]) * xx[2];
                    const float sumq2 = (sumw[i1] - sumw[0]) * xx[0] * xx[0] +
                                        (sumw[i2] - sumw[i1]) * xx[1] * xx[1] +
                                        (sumw[bs] - sumw[i2]) * xx[2] * xx[2];
                    if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        besti1 = i1, besti2 = i2, best_shift = shift;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_shift == 0) continue;
        for (int j = 0; j < bs; ++j) L[idx[j]] = int8_t(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < bs; ++j) L[j] = int8_t(2 - L[j]);
            scale = -scale, best_shift = -best_shift;
        }
        const float* xx = best_shift == 1 ? kShiftUp : kShiftDown;
        if (!snap_groups(
                lat, bs / 8, xb, w, scale, [xx](int) { return xx; }, L, index)) {
            float sumqx = 0, sumq2 = 0;
            for (int k = 0; k < bs / 8; ++k) {
                const uint8_t* p = lat.levels + size_t(index[k]) * 8;
                for (int j = 0; j < 8; ++j) {
                    const float q = xx[p[j]];
                    sumqx += w[8 * k + j] * q * xb[8 * k + j];
                    sumq2 += w[8 * k + j] * q * q;
                }
            }
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        uint16_t h = 0;
        for (int k = 0; k < bs / 8; ++k) {
            y.qs[(bs / 8) * ib + k] = uint8_t(index[k] & 255);
            h |= uint16_t((index[k] >> 8) << (3 * k));
        }
        y.qh[ib] = h;
        scales[ib] = scale, shifts[ib] = int8_t(best_shift);
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    const float d = max_scale / 15;
    y.d = fp32_to_fp16(d * 1.125f);  // ggml's empirical correction of the fitted scale
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / bs; ++ib) {
        int l = nearest_int(0.5f * (id * scales[ib] - 1));
        l = l < 0 ? 0 : l > 7 ? 7 : l;
        if (shifts[ib] == -1) l |= 8;
        y.qh[ib] |= uint16_t(l << 12);
    }
}

void quant_block_iq1_m(const float* x, BlockIQ1_M& y, const float* qw, const Lattice& lat) {
    constexpr int bs = 16;
    // Shift choice per sub-block: bit 1 = first group shifted down, bit 0 = second.
    constexpr uint8_t kShiftMask[4] = {0x00, 0x80, 0x08, 0x88};
    float scales[QK_K / bs];
    int8_t shifts[QK_K / bs];
    float w[bs];
    int idx[bs];
    int8_t L[bs];
    uint16_t index[bs / 8];
    auto group_levels = [](int combo, int k) {
        return k == 0 ? (combo < 2 ? kShiftUp : kShiftDown)
                      : (combo % 2 == 0 ? kShiftUp : kShiftDown);
    };

    std::memset(&y, 0, sizeof(y));
    const float sigma2 = twice_mean_square(x);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / bs; ++ib) {
        const float* xb = x + bs * ib;
        importance(xb, qw ? qw + bs * ib : nullptr, sigma2, bs, false, w);
        float max = fabsf(xb[0]);
        for (int i = 1; i < bs; ++i) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        scales[ib] = 0, shifts[ib] = 0;
        if (max < 1e-7f) continue;
        // Exhaustive over the two split points of the sorted values and the four
        // shift combinations of the two groups (sums accumulated in sorted order).
        sort_by_value<bs>(xb, idx);
        float best_score = -FLT_MAX, scale = max;
        int besti1 = -1, besti2 = -1, best_k = -1;
        for (int i1 = 0; i1 <= bs; ++i1) {
            for (int i2 = i1; i2 <= bs; ++i2) {
                float sumqx[4] = {0, 0, 0, 0}, sumq2[4] = {0, 0, 0, 0};
                for (int j = 0; j < bs; ++j) {
                    const int i = idx[j];
                    const int level = j < i1 ? 0 : j < i2 ? 1 : 2;
                    for (int k = 0; k < 4; ++k) {
                        const float q = group_levels(k, i < bs / 2 ? 0 : 1)[level];
                        sumqx[k] += w[i] * q * xb[i];
                        sumq2[k] += w[i] * q * q;
                    }
                }
                for (int k = 0; k < 4; ++k) {
                    if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        besti1 = i1, besti2 = i2, best_k = k;
                    }
                }
            }
        }
        if (besti1 < 0 || besti2 < 0 || best_k < 0) continue;
        for (int j = 0; j < bs; ++j) L[idx[j]] = int8_t(j < besti1 ? 0 : j < besti2 ? 1 : 2);
        if (scale < 0) {
            for (int j = 0; j < bs; ++j) L[j] = int8_t(2 - L[j]);
            scale = -scale, best_k = 3 - best_k;
        }
        const auto xx = [&](int k) { return group_levels(best_k, k); };
        if (!snap_groups(lat, bs / 8, xb, w, scale, xx, L, index)) {
            float sumqx = 0, sumq2 = 0;
            for (int k = 0; k < bs / 8; ++k) {
                const uint8_t* p = lat.levels + size_t(index[k]) * 8;
                for (int j = 0; j < 8; ++j) {
                    const float q = xx(k)[p[j]];
                    sumqx += w[8 * k + j] * q * xb[8 * k + j];
                    sumq2 += w[8 * k + j] * q * q;
                }
            }
            if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
        }
        y.qs[2 * ib + 0] = uint8_t(index[0] & 255);
        y.qs[2 * ib + 1] = uint8_t(index[1] & 255);
        y.qh[ib] = uint8_t((index[0] >> 8) | ((index[1] >> 8) << 4));
        scales[ib] = scale, shifts[ib] = int8_t(best_k);
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;

    // Sub-block scale indices, then refit the super-block scale to the final
    // reconstruction (all sub-blocks at once).
    uint16_t sc[4] = {0, 0, 0, 0};
    float d = max_scale / 15;
    const float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int ib = 0; ib < QK_K / bs; ++ib) {
        int l = nearest_int(0.5f * (id * scales[ib] - 1));
        l = l < 0 ? 0 : l > 7 ? 7 : l;
        sc[ib / 4] |= uint16_t(l << (3 * (ib % 4)));
        y.qh[ib] |= kShiftMask[shifts[ib]];
        const float* xb = x + bs * ib;
        importance(xb, qw ? qw + bs * ib : nullptr, sigma2, bs, false, w);
        for (int k = 0; k < bs / 8; ++k) {
            const float* xx = group_levels(shifts[ib], k);
            const int g = y.qs[2 * ib + k] + ((y.qh[ib] << (8 - 4 * k)) & 0x700);
            const uint8_t* p = lat.levels + size_t(g) * 8;
            for (int j = 0; j < 8; ++j) {
                const float q = xx[p[j]] * (2 * l + 1);
                sumqx += w[8 * k + j] * q * xb[8 * k + j];
                sumq2 += w[8 * k + j] * q * q;
            }
        }
    }
    if (sumq2 > 0) d = sumqx / sumq2;
    const uint16_t s = fp32_to_fp16(d * 1.1125f);  // ggml's empirical correction
    sc[0] |= uint16_t((s & 0x000f) << 12);
    sc[1] |= uint16_t((s & 0x00f0) << 8);
    sc[2] |= uint16_t((s & 0x0f00) << 4);
    sc[3] |= uint16_t(s & 0xf000);
    std::memcpy(y.scales, sc, 8);
}

}  // namespace

// ---- IQ1_S: per 32 values 4 index bytes (qs) and a uint16 qh holding 4x3 high
// index bits, the 3-bit scale (bits 12-14) and the delta sign (bit 15).

void dequant_iq1_s(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ1_S*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4) {
            const uint16_t qh = x[i].qh[ib];
            const float dl = d * (2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
            for (int l = 0; l < 4; ++l, y += 8) {
                const int8_t* g = tgrid(qs[l] | (((qh >> (3 * l)) & 7) << 8));
                for (int j = 0; j < 8; ++j) y[j] = dl * (g[j] + delta);
            }
        }
    }
}

float dot_iq1_s_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ1_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t* q8 = a[i].qs;
        const uint8_t* qs = x[i].qs;
        int32_t sumi = 0, sumi1 = 0;  // grid part; delta part (via the activation block sums)
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4) {
            const uint16_t qh = x[i].qh[ib];
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            const int delta = qh & 0x8000 ? -1 : 1;
            int32_t lsum = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const int8_t* g = tgrid(qs[l] | (((qh >> (3 * l)) & 7) << 8));
                for (int j = 0; j < 8; ++j) lsum += q8[j] * g[j];
            }
            sumi += ls * lsum;
            sumi1 += ls * delta * (a[i].bsums[2 * ib] + a[i].bsums[2 * ib + 1]);
        }
        sumf += fp16_to_fp32(x[i].d) * a[i].d * (sumi + kIq1Delta * sumi1);
    }
    return sumf;
}

size_t quant_iq1_s(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ1);
    auto* y = static_cast<BlockIQ1_S*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_iq1_s(src + r * n + i * QK_K, y[r * nb + i],
                              imat ? imat + i * QK_K : nullptr, lat);
    return size_t(nrows * nb) * sizeof(BlockIQ1_S);
}

// ---- IQ1_M: per 16 values 2 index bytes and a qh byte (per group of 8: 3 high
// index bits and the delta sign); 3-bit scales, 4 per uint16 scale word.

void dequant_iq1_m(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ1_M*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sc[4];
        std::memcpy(sc, x[i].scales, 8);
        const float d = fp16_to_fp32(iq1m_scale_bits(x[i].scales));
        const uint8_t* qs = x[i].qs;
        const uint8_t* qh = x[i].qh;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, qh += 2) {
            const float dl[2] = {d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1),
                                 d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1)};
            for (int l = 0; l < 4; ++l, y += 8) {
                const uint8_t h = qh[l / 2];
                const int g = qs[l] | ((h << (l % 2 ? 4 : 8)) & 0x700);
                const float delta = h & (l % 2 ? 0x80 : 0x08) ? -kIq1Delta : kIq1Delta;
                const int8_t* gv = tgrid(g);
                for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * (gv[j] + delta);
            }
        }
    }
}

float dot_iq1_m_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ1_M*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint16_t sc[4];
        std::memcpy(sc, x[i].scales, 8);
        const int8_t* q8 = a[i].qs;
        const uint8_t* qs = x[i].qs;
        const uint8_t* qh = x[i].qh;
        int32_t sumi1 = 0, sumi2 = 0;  // grid part; delta part
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, qh += 2) {
            int32_t s1[2] = {0, 0}, s2[2] = {0, 0};
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const uint8_t h = qh[l / 2];
                const int8_t* g = tgrid(qs[l] | ((uint16_t(h) << (8 - 4 * (l % 2))) & 0x700));
                const int delta = h & (l % 2 ? 0x80 : 0x08) ? -1 : 1;
                int32_t lsum1 = 0, lsum2 = 0;
                for (int j = 0; j < 8; ++j) lsum1 += q8[j] * g[j], lsum2 += q8[j];
                s1[l / 2] += lsum1;
                s2[l / 2] += lsum2 * delta;
            }
            const int ls1 = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1;
            const int ls2 = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1;
            sumi1 += s1[0] * ls1 + s1[1] * ls2;
            sumi2 += s2[0] * ls1 + s2[1] * ls2;
        }
        sumf += fp16_to_fp32(iq1m_scale_bits(x[i].scales)) * a[i].d * (sumi1 + kIq1Delta * sumi2);
    }
    return sumf;
}

size_t quant_iq1_m(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ1);
    auto* y = static_cast<BlockIQ1_M*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_iq1_m(src + r * n + i * QK_K, y[r * nb + i],
                              imat ? imat + i * QK_K : nullptr, lat);
    return size_t(nrows * nb) * sizeof(BlockIQ1_M);
}

}  // namespace glm5::quant::iq

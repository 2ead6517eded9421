// Scale searches of the reference quantizers. The float expressions keep
// ggml's evaluation order (left to right, no fused multiply-add: this file is
// compiled for baseline x86-64, which has no FMA) because the searches compare
// errors between candidates, and a different rounding can pick another one.
#include "quant/scale_search.h"

#include <cmath>
#include <cstring>

#include "quant/common.h"
#include "quant/ops.h"

namespace glm5::quant {

namespace {

inline int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

// The element of largest magnitude, with its sign (the first one on ties).
inline float signed_absmax(int n, const float* x, float* amax_out) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    *amax_out = amax;
    return max;
}

}  // namespace

float search_symmetric(int n, int nmax, const float* x, int8_t* L, const float* w) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < kGroupMaxEps) {
        std::memset(L, 0, size_t(n));
        return 0.f;
    }
    // Sums of w*x*l and w*l^2 for the levels that scale `iscale` gives; the
    // least-squares scale for fixed levels is sumlx/suml2, and its error
    // decreases as sumlx^2/suml2 grows.
    auto fit = [&](float iscale, float* sumlx_out, float* suml2_out, int8_t* levels) {
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            levels[i] = int8_t(l + nmax);
            const float wi = w ? w[i] : x[i] * x[i];
            sumlx += wi * x[i] * l;
            suml2 += wi * l * l;
        }
        *sumlx_out = sumlx;
        *suml2_out = suml2;
    };
    float sumlx, suml2;
    fit(-nmax / max, &sumlx, &suml2, L);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    int8_t trial[256];
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        fit(-(nmax + 0.1f * is) / max, &sumlx, &suml2, trial);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            std::memcpy(L, trial, size_t(n));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

float search_symmetric_refine(int n, int nmax, const float* x, int8_t* L) {
    float amax;
    const float max = signed_absmax(n, x, &amax);
    if (amax < kGroupMaxEps) {
        std::memset(L, 0, size_t(n));
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = int8_t(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    // Coordinate descent: move one level to its best value for the scale the
    // others imply, keep it if the total error drops. At most 5 sweeps.
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = int8_t(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float search_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
    auto weight = [&](int i) { return weights ? weights[i] : x[i] * x[i]; };
    float min = x[0], max = x[0];
    float sum_w = weight(0);
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weight(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        std::memset(L, 0, size_t(n));
        *the_min = -min;
        return 0.f;
    }
    auto error_of = [&](float scale, float offset, const uint8_t* levels) {
        float err = 0;
        for (int i = 0; i < n; ++i) {
            float diff = scale * levels[i] + offset - x[i];
            diff = use_mad ? std::fabs(diff) : diff * diff;
            err += weight(i) * diff;
        }
        return err;
    };
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    for (int i = 0; i < n; ++i)
        L[i] = uint8_t(clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float best_error = error_of(scale, min, L);
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        // `min` moves when a candidate wins, and later candidates start from it.
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = uint8_t(l);
            const float w = weight(i);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        // Weighted least squares for x ≈ scale*l + offset with these levels.
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            const float cur_error = error_of(this_scale, this_min, Laux);
            if (cur_error < best_error) {
                std::memcpy(L, Laux, size_t(n));
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

void search_scale_min_groups(int groups, int n, int nmax, const float* x, const float* weights,
                             uint8_t* L, float* scales, float* the_mins, float rmin, float rdelta,
                             int nstep, bool use_mad) {
    int g = 0;
    if (n <= 32 && cpu_has_avx2())
        for (; g + 8 <= groups; g += 8)
            search_scale_min_x8(n, nmax, x + g * n, weights + g * n, L + g * n, scales + g,
                                the_mins + g, rmin, rdelta, nstep, use_mad);
    uint8_t Laux[256];
    for (; g < groups; ++g)
        scales[g] = search_scale_min(n, nmax, x + g * n, weights + g * n, L + g * n, &the_mins[g],
                                     Laux, rmin, rdelta, nstep, use_mad);
}

void search_symmetric_groups(int groups, int n, int nmax, const float* x, int8_t* L, const float* w,
                             float* scales) {
    int g = 0;
    if (n <= 32 && cpu_has_avx2())
        for (; g + 8 <= groups; g += 8)
            search_symmetric_x8(n, nmax, x + g * n, L + g * n, w ? w + g * n : nullptr, scales + g);
    for (; g < groups; ++g)
        scales[g] = search_symmetric(n, nmax, x + g * n, L + g * n, w ? w + g * n : nullptr);
}

float search_positive(int n, int nmax, const float* x, uint8_t* L, const float* weights) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < kGroupMaxEps) {
        std::memset(L, 0, size_t(n));
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = uint8_t(nearest_int(iscale * x[i]));
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += weights[i] * diff * diff;
    }
    // Pick the best of 9 scales by plain rounding...
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale_is * x[i]);
            if (l > nmax) l = nmax;
            const float diff = x[i] - scale_is * l;
            mse += weights[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    // ...then refine the levels one at a time against the least-squares scale.
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        if (l > nmax) l = nmax;
        L[i] = uint8_t(l);
        const float w = weights[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = weights[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = nearest_int(x[i] * sl2 / slx);
                if (new_l > nmax) new_l = nmax;
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = uint8_t(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace glm5::quant

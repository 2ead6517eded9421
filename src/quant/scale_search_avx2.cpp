// search_scale_min with one group per AVX2 lane. Bit-identical to the scalar
// version: every lane evaluates the same float expressions in the same order,
// branches become per-lane selects, and no multiply-add is fused (the pragmas
// below; an FMA rounds once where the scalar code rounds twice).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "quant/scale_search.h"

namespace glm5::quant {

namespace {

// if (cond) a = b, per lane.
inline __m256 select(__m256 a, __m256 b, __m256 cond) {
    return _mm256_blendv_ps(a, b, cond);
}

}  // namespace

void search_scale_min_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                         float* scales, float* the_mins, float rmin, float rdelta, int nstep,
                         bool use_mad) {
    // Transpose: X[i] holds element i of the 8 groups.
    __m256 X[32] = {}, W[32] = {}, Lf[32], La[32];
    const __m256i gather_idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(n));
    for (int i = 0; i < n; ++i) {
        X[i] = _mm256_i32gather_ps(x + i, gather_idx, 4);
        W[i] = _mm256_i32gather_ps(weights + i, gather_idx, 4);
    }
    const __m256 zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(nmax);
    const __m256 fnmax = _mm256_set1_ps(float(nmax));

    __m256 min = X[0], max = X[0];
    __m256 sum_w = W[0];
    __m256 sum_x = _mm256_mul_ps(sum_w, X[0]);
    for (int i = 1; i < n; ++i) {
        min = select(min, X[i], _mm256_cmp_ps(X[i], min, _CMP_LT_OQ));
        max = select(max, X[i], _mm256_cmp_ps(X[i], max, _CMP_GT_OQ));
        sum_w = _mm256_add_ps(sum_w, W[i]);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(W[i], X[i]));
    }
    min = select(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
    // Lanes with max <= min (constant non-negative groups) end with L = 0,
    // scale 0; their arithmetic below is discarded.
    const __m256 flat = _mm256_cmp_ps(max, min, _CMP_LE_OQ);
    const __m256 flat_min = min;

    auto levels = [&](__m256 iscale, __m256 mn, __m256* out) {
        for (int i = 0; i < n; ++i) {
            __m256i l = _mm256_cvtps_epi32(_mm256_mul_ps(iscale, _mm256_sub_ps(X[i], mn)));
            l = _mm256_min_epi32(_mm256_max_epi32(l, lo), hi);
            out[i] = _mm256_cvtepi32_ps(l);
        }
    };
    auto error = [&](__m256 scale, __m256 offset, const __m256* lv) {
        __m256 err = zero;
        for (int i = 0; i < n; ++i) {
            __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, lv[i]), offset), X[i]);
            diff = use_mad ? _mm256_andnot_ps(sign, diff) : _mm256_mul_ps(diff, diff);
            err = _mm256_add_ps(err, _mm256_mul_ps(W[i], diff));
        }
        return err;
    };

    __m256 iscale = _mm256_div_ps(fnmax, _mm256_sub_ps(max, min));
    __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
    levels(iscale, min, Lf);
    __m256 best_error = error(scale, min, Lf);

    for (int is = 0; nstep >= 1 && is <= nstep; ++is) {
        const float step = (rmin + rdelta * float(is)) + float(nmax);
        iscale = _mm256_div_ps(_mm256_set1_ps(step), _mm256_sub_ps(max, min));
        levels(iscale, min, La);
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < n; ++i) {
            const __m256 wl = _mm256_mul_ps(W[i], La[i]);
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, La[i]));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, X[i]));
        }
        const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        const __m256 valid = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
        if (_mm256_testz_ps(valid, valid)) continue;
        __m256 this_scale = _mm256_div_ps(
            _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
        __m256 this_min = _mm256_div_ps(
            _mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
        const __m256 positive = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
        this_min = select(this_min, zero, positive);
        this_scale = select(this_scale, _mm256_div_ps(sum_xl, sum_l2), positive);
        const __m256 cur_error = error(this_scale, this_min, La);
        const __m256 better =
            _mm256_and_ps(valid, _mm256_cmp_ps(cur_error, best_error, _CMP_LT_OQ));
        if (_mm256_testz_ps(better, better)) continue;
        for (int i = 0; i < n; ++i) Lf[i] = select(Lf[i], La[i], better);
        best_error = select(best_error, cur_error, better);
        scale = select(scale, this_scale, better);
        min = select(min, this_min, better);
    }

    scale = select(scale, zero, flat);
    min = select(min, flat_min, flat);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, scale);
    for (int g = 0; g < 8; ++g) scales[g] = lanes[g];
    _mm256_store_ps(lanes, _mm256_xor_ps(min, sign));  // the_min = -min
    for (int g = 0; g < 8; ++g) the_mins[g] = lanes[g];
    alignas(32) int32_t li[8];
    for (int i = 0; i < n; ++i) {
        _mm256_store_si256(
            reinterpret_cast<__m256i*>(li),
            _mm256_andnot_si256(_mm256_castps_si256(flat), _mm256_cvtps_epi32(Lf[i])));
        for (int g = 0; g < 8; ++g) L[g * n + i] = uint8_t(li[g]);
    }
}

void search_symmetric_x8(int n, int nmax, const float* x, int8_t* L, const float* w,
                         float* scales) {
    __m256 X[32] = {}, W[32] = {}, Lbest[32], Ltry[32];
    const __m256i gather_idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(n));
    for (int i = 0; i < n; ++i) {
        X[i] = _mm256_i32gather_ps(x + i, gather_idx, 4);
        W[i] = w ? _mm256_i32gather_ps(w + i, gather_idx, 4) : _mm256_mul_ps(X[i], X[i]);
    }
    const __m256 zero = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    // The element of largest magnitude with its sign (first on ties).
    __m256 amax = zero, max = zero;
    for (int i = 0; i < n; ++i) {
        const __m256 ax = _mm256_andnot_ps(sign, X[i]);
        const __m256 upd = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = select(amax, ax, upd);
        max = select(max, X[i], upd);
    }
    const __m256 flat = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_LT_OQ);
    const __m256i lo = _mm256_set1_epi32(-nmax), hi = _mm256_set1_epi32(nmax - 1);

    auto fit = [&](__m256 iscale, __m256* sumlx, __m256* suml2, __m256* levels) {
        __m256 slx = zero, sl2 = zero;
        for (int i = 0; i < n; ++i) {
            __m256i l = _mm256_cvtps_epi32(_mm256_mul_ps(iscale, X[i]));
            l = _mm256_min_epi32(_mm256_max_epi32(l, lo), hi);
            const __m256 lf = _mm256_cvtepi32_ps(l);
            levels[i] = lf;
            slx = _mm256_add_ps(slx, _mm256_mul_ps(_mm256_mul_ps(W[i], X[i]), lf));
            sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(_mm256_mul_ps(W[i], lf), lf));
        }
        *sumlx = slx;
        *suml2 = sl2;
    };
    __m256 sumlx, suml2;
    fit(_mm256_div_ps(_mm256_set1_ps(float(-nmax)), max), &sumlx, &suml2, Lbest);
    // scale = suml2 ? sumlx / suml2 : 0
    __m256 scale =
        select(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
    __m256 best = _mm256_mul_ps(scale, sumlx);
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        const float c = -(float(nmax) + 0.1f * float(is));
        fit(_mm256_div_ps(_mm256_set1_ps(c), max), &sumlx, &suml2, Ltry);
        const __m256 better = _mm256_and_ps(
            _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
            _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
        if (_mm256_testz_ps(better, better)) continue;
        for (int i = 0; i < n; ++i) Lbest[i] = select(Lbest[i], Ltry[i], better);
        scale = select(scale, _mm256_div_ps(sumlx, suml2), better);
        best = select(best, _mm256_mul_ps(scale, sumlx), better);
    }
    scale = select(scale, zero, flat);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, scale);
    for (int g = 0; g < 8; ++g) scales[g] = lanes[g];
    // L = l + nmax, or 0 for all-zero groups.
    alignas(32) int32_t li[8];
    const __m256i bias = _mm256_set1_epi32(nmax);
    for (int i = 0; i < n; ++i) {
        const __m256i l = _mm256_add_epi32(_mm256_cvtps_epi32(Lbest[i]), bias);
        _mm256_store_si256(reinterpret_cast<__m256i*>(li),
                           _mm256_andnot_si256(_mm256_castps_si256(flat), l));
        for (int g = 0; g < 8; ++g) L[g * n + i] = int8_t(li[g]);
    }
}

}  // namespace glm5::quant

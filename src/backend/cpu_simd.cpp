#include "backend/cpu_simd.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu_kernels.h"
#include "core/fp16.h"
#include "quant/ops.h"

namespace glm5::backend::cpu {

namespace scalar {

void axpy_f32(int64_t n, float a, const float* x, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}
void f16_to_f32(int64_t n, const uint16_t* src, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * fp16_to_fp32(b[i + k]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * fp16_to_fp32(b[i]);
    return s;
}

void f32_to_f16(int64_t n, const float* src, uint16_t* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}
void round_f16(int64_t n, const float* x, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = round_fp16(x[i]);
}

void swiglu(int64_t n, const float* g, const float* u, float clamp, float* out) {
    if (clamp > 1e-6f) {
        for (int64_t i = 0; i < n; ++i) {
            const float gi = std::min(g[i], clamp);
            const float ui = std::clamp(u[i], -clamp, clamp);
            out[i] = kernels::silu(gi) * ui;
        }
    } else {
        for (int64_t i = 0; i < n; ++i) out[i] = kernels::silu(g[i]) * u[i];
    }
}

void softmax(float* x, int64_t n, bool round_f16) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        x[j] = std::exp(x[j] - mx);
        sum += double(x[j]);
    }
    const float inv = float(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) x[j] = round_f16 ? round_fp16(x[j] * inv) : x[j] * inv;
}

// Built without FMA: each product and sum is rounded on its own.
void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc) {
    for (int64_t j = 0; j < d; ++j) acc[j] = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
        float* row = S + i * d;
        const float* in = src + i * d;
        const float di = decay[i], ki = k[i];
        for (int64_t j = 0; j < d; ++j) {
            row[j] = in[j] * di;
            acc[j] += row[j] * ki;
        }
    }
}

void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc) {
    for (int64_t j = 0; j < d; ++j) acc[j] = 0.0f;
    for (int64_t i = 0; i < d; ++i) {
        float* row = S + i * d;
        const float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < d; ++j) {
            row[j] += ki * u[j];
            acc[j] += row[j] * qi;
        }
    }
}

}  // namespace scalar

namespace {

// The attention helpers built from the row ones: rows outer, so each row is
// read once for all the heads.
template <float (*Dot)(int64_t, const float*, const uint16_t*)>
void scores_by_rows(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n, float* s,
                    int64_t ld) {
    for (int64_t j = 0; j < n; ++j) {
        const uint16_t* r = rows.row(j);
        for (int64_t h = 0; h < nh; ++h) s[h * ld + j] = Dot(w, q + h * w, r);
    }
}

template <void (*Axpy)(int64_t, float, const uint16_t*, float*)>
void weighted_sum_by_rows(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                          int64_t vw, float* out) {
    std::fill(out, out + nh * vw, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
        const uint16_t* r = rows.row(j);
        for (int64_t h = 0; h < nh; ++h) Axpy(vw, p[h * ld + j], r, out + h * vw);
    }
}

void dots_by_pairs(const float* q, int64_t nq, const float* k, int64_t ks, int64_t nk, int64_t dim,
                   float* out, int64_t ld) {
    const quant::VecDotFn dot = quant::vec_dot_fn(quant::Type::F32);
    for (int64_t j = 0; j < nk; ++j)
        for (int64_t a = 0; a < nq; ++a) out[j * ld + a] = dot(dim, q + a * dim, k + j * ks);
}

// quant's AVX2 F32 dot has no tail when dim is a multiple of 32: the tiles
// reproduce exactly that case.
void dots_avx2(const float* q, int64_t nq, const float* k, int64_t ks, int64_t nk, int64_t dim,
               float* out, int64_t ld) {
    if (dim % 32 == 0)
        avx2::dots_f32(q, nq, k, ks, nk, dim, out, ld);
    else
        dots_by_pairs(q, nq, k, ks, nk, dim, out, ld);
}

// The indexer's scores from a [key][query] table of dots. Built without FMA:
// each product and sum is rounded on its own.
template <void (*Dots)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*,
                       int64_t)>
void scores_by_dots(const float* q, int64_t nq, const float* w, const float* k, int64_t ks,
                    int64_t nk, int64_t dim, float* out) {
    thread_local std::vector<float> d;
    d.resize(size_t(nk * nq));
    Dots(q, nq, k, ks, nk, dim, d.data(), nq);
    for (int64_t j = 0; j < nk; ++j) {
        const float* dj = d.data() + j * nq;
        float s = 0.0f;
        for (int64_t a = 0; a < nq; ++a) s += std::max(dj[a], 0.0f) * w[a];
        out[j] = s;
    }
}

void scores_avx512(const float* q, int64_t nq, const float* w, const float* k, int64_t ks,
                   int64_t nk, int64_t dim, float* out) {
    if (!avx512::indexer_scores(q, nq, w, k, ks, nk, dim, out))
        scores_by_dots<dots_by_pairs>(q, nq, w, k, ks, nk, dim, out);
}

// F16 keys 16 at a time as floats, then the level's F32 form.
template <void (*ToF32)(int64_t, const uint16_t*, float*),
          void (*Scores)(const float*, int64_t, const float*, const float*, int64_t, int64_t,
                         int64_t, float*)>
void scores_of_f16(const float* q, int64_t nq, const float* w, const uint16_t* k, int64_t ks,
                   int64_t nk, int64_t dim, float* out) {
    constexpr int64_t kKeys = 16;
    thread_local std::vector<float> kf;
    kf.resize(size_t(kKeys * dim));
    for (int64_t j0 = 0; j0 < nk; j0 += kKeys) {
        const int64_t n = std::min(kKeys, nk - j0);
        for (int64_t j = 0; j < n; ++j) ToF32(dim, k + (j0 + j) * ks, kf.data() + j * dim);
        Scores(q, nq, w, kf.data(), dim, n, dim, out + j0);
    }
}

void scores_f16_avx512(const float* q, int64_t nq, const float* w, const uint16_t* k, int64_t ks,
                       int64_t nk, int64_t dim, float* out) {
    if (!avx512::indexer_scores_f16(q, nq, w, k, ks, nk, dim, out))
        scores_of_f16<avx2::f16_to_f32, scores_avx512>(q, nq, w, k, ks, nk, dim, out);
}

SimdOps pick() {
    if (!quant::cpu_has_avx2())
        return {scalar::axpy_f32,
                scalar::axpy_f16,
                scalar::f16_to_f32,
                scalar::dot_f32_f16,
                scalar::f32_to_f16,
                scalar::round_f16,
                scores_by_rows<scalar::dot_f32_f16>,
                scalar::softmax,
                weighted_sum_by_rows<scalar::axpy_f16>,
                scalar::swiglu,
                kernels::rms_norm_row,
                scores_by_dots<dots_by_pairs>,
                scores_of_f16<scalar::f16_to_f32, scores_by_dots<dots_by_pairs>>,
                scalar::delta_decay,
                scalar::delta_update,
                kernels::top_k_rows};
    SimdOps ops{avx2::axpy_f32,
                avx2::axpy_f16,
                avx2::f16_to_f32,
                avx2::dot_f32_f16,
                avx2::f32_to_f16,
                avx2::round_f16,
                avx2::scores_f16,
                scalar::softmax,
                avx2::weighted_sum_f16,
                scalar::swiglu,
                avx2::rms_norm,
                scores_by_dots<dots_avx2>,
                scores_of_f16<avx2::f16_to_f32, scores_by_dots<dots_avx2>>,
                avx2::delta_decay,
                avx2::delta_update,
                kernels::top_k_rows};
    if (quant::cpu_has_avx512()) {
        ops.indexer_scores = scores_avx512;
        ops.indexer_scores_f16 = scores_f16_avx512;
        ops.scores_f16 = avx512::scores_f16;
        ops.weighted_sum_f16 = avx512::weighted_sum_f16;
        ops.softmax = avx512::softmax;
        ops.swiglu = avx512::swiglu;
        ops.delta_decay = avx512::delta_decay;
        ops.delta_update = avx512::delta_update;
        ops.top_k_rows = avx512::top_k_rows;
    }
    return ops;
}

}  // namespace

const SimdOps& simd() {
    static const SimdOps ops = pick();
    return ops;
}

}  // namespace glm5::backend::cpu

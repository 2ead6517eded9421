// Scalar row kernels of the CPU backend. The float operation order follows
// ggml's CPU ops where it matters for agreement with llama.cpp (norm sums in
// double, RoPE angles by repeated multiplication).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace glm5::backend::kernels {

inline float dot_f32(const float* a, const float* b, int64_t n) {
    // Eight independent partial sums (vectorisable), combined in a fixed order.
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// y[i] += x[i], and o[i] = src[i] * w (first) or o[i] += src[i] * w: each
// product and sum rounded on its own (the bits of the plain loops), in SSE
// lanes where the baseline has them, since the project's -O2 leaves such
// loops scalar when it cannot prove the pointers apart.
inline void add_row(float* y, const float* x, int64_t n) {
    int64_t i = 0;
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(y + i, _mm_add_ps(_mm_loadu_ps(y + i), _mm_loadu_ps(x + i)));
#endif
    for (; i < n; ++i) y[i] += x[i];
}

inline void weigh_row(float* o, const float* src, float w, int64_t n, bool first) {
    int64_t i = 0;
#if defined(__SSE2__)
    const __m128 vw = _mm_set1_ps(w);
    if (first)
        for (; i + 4 <= n; i += 4) _mm_storeu_ps(o + i, _mm_mul_ps(_mm_loadu_ps(src + i), vw));
    else
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(o + i,
                          _mm_add_ps(_mm_loadu_ps(o + i), _mm_mul_ps(_mm_loadu_ps(src + i), vw)));
#endif
    if (first)
        for (; i < n; ++i) o[i] = src[i] * w;
    else
        for (; i < n; ++i) o[i] += src[i] * w;
}

inline float silu(float x) {
    return x / (1.0f + std::exp(-x));
}

// y = x / sqrt(mean(x^2) + eps) [* w]; in place allowed.
inline void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
    // Eight partial sums in double, combined in a fixed order: one chain of
    // dependent additions made this a third of decode's serial time.
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += double(x[i + k] * x[i + k]);
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) sum += double(x[i] * x[i]);
    const float mean = float(sum / double(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (w)
        for (i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
    else
        for (i = 0; i < n; ++i) y[i] = x[i] * scale;
}

// y = (x - mean) / sqrt(var + eps) * w + b; in place allowed.
inline void layer_norm_row(const float* x, const float* w, const float* b, int64_t n, float eps,
                           float* y) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(x[i]);
    const float mean = float(sum / double(n));
    double sum2 = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i] - mean;
        y[i] = v;
        sum2 += double(v * v);
    }
    const float var = float(sum2 / double(n));
    const float scale = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) {
        float v = y[i] * scale;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

// cos/sin pairs for RoPE "normal" mode at position p: theta_i = p * base^(-2i/n_rot),
// computed by repeated multiplication as ggml does. cs holds [cos0, sin0, cos1, sin1, ...].
inline void rope_cos_sin(int32_t p, int64_t n_rot, float freq_base, float* cs) {
    const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
    float theta = float(p);
    for (int64_t i = 0; i < n_rot; i += 2) {
        cs[i] = std::cos(theta);
        cs[i + 1] = std::sin(theta);
        theta *= theta_scale;
    }
}

// Rotates adjacent pairs (x[2i], x[2i+1]) of the first n_rot values.
inline void rope_apply(float* x, int64_t n_rot, const float* cs) {
    for (int64_t i = 0; i < n_rot; i += 2) {
        const float c = cs[i], s = cs[i + 1];
        const float x0 = x[i], x1 = x[i + 1];
        x[i] = x0 * c - x1 * s;
        x[i + 1] = x0 * s + x1 * c;
    }
}

// Normalised Sylvester-Hadamard transform (entries +-1/sqrt(n)), n a power of two.
inline void hadamard_row(float* x, int64_t n) {
    for (int64_t len = 1; len < n; len <<= 1)
        for (int64_t i = 0; i < n; i += 2 * len)
            for (int64_t j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    const float s = 1.0f / std::sqrt(float(n));
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// Indices of the k largest values in descending order; ties go to the lower index.
inline void top_k_desc(const float* v, int64_t n, int64_t k, std::vector<int32_t>& order) {
    order.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int32_t(i);
    auto better = [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
    k = std::min(k, n);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
    order.resize(size_t(k));
}

// A float's order as an unsigned integer: a < b exactly when key(a) <
// key(b), and both zeros are one key (they compare equal).
inline uint32_t order_key(float x) {
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Steps of top_k_rows's bucket select that its vector form (SimdOps) shares.
// The shift that puts the keys [lo, hi] into at most `buckets` buckets.
inline int bucket_shift(uint32_t lo, uint32_t hi, int64_t buckets) {
    int shift = 0;
    while (((hi - lo) >> shift) >= uint32_t(buckets)) ++shift;
    return shift;
}

// The bucket of the k-th best key, searched down from bucket `top`; `above`
// receives the rows in the buckets above it.
inline int64_t kth_bucket(const int32_t* hist, int64_t top, int64_t k, int64_t& above) {
    above = 0;
    int64_t b = top;
    while (above + hist[b] < k) above += hist[b--];
    return b;
}

// The r-th largest of that bucket's keys cand[0, nc) (reordered), which is
// the k-th key; `equal` receives how many rows equal to it the k best take.
inline uint32_t kth_key(uint32_t* cand, int64_t nc, int64_t r, int64_t& equal) {
    std::nth_element(cand, cand + (r - 1), cand + nc, std::greater<uint32_t>());
    const uint32_t kth = cand[r - 1];
    equal = r;
    for (int64_t j = 0; j < r - 1; ++j) equal -= cand[j] > kth;
    return kth;
}

// The k highest-scoring rows (ties to the lower index), written in ascending
// row order. A bucket select over the values' order keys: a histogram of
// 2048 buckets spanning the keys actually present (scores cluster, so fixed
// top bits would put most rows in a few buckets) finds the bucket of the
// k-th best key, the key itself comes from that bucket's rows, and one
// ascending pass takes every row above it and the lowest-indexed rows equal
// to it. Sorting indices by value, even partially, cost several times more
// at GLM-5's top-2048 of a few thousand keys.
inline void top_k_rows(const float* v, int64_t n, int64_t k, std::vector<int32_t>& tmp,
                       int32_t* out) {
    k = std::min(k, n);
    if (k <= 0) return;
    constexpr int64_t kBuckets = 2048;
    tmp.resize(size_t(2 * n + kBuckets));  // keys, histogram, one bucket's keys
    uint32_t* key = reinterpret_cast<uint32_t*>(tmp.data());
    int32_t* hist = tmp.data() + n;
    uint32_t* cand = reinterpret_cast<uint32_t*>(hist + kBuckets);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
        key[i] = order_key(v[i]);
        lo = std::min(lo, key[i]);
        hi = std::max(hi, key[i]);
    }
    const int shift = bucket_shift(lo, hi, kBuckets);
    std::fill(hist, hist + kBuckets, 0);
    for (int64_t i = 0; i < n; ++i) ++hist[(key[i] - lo) >> shift];
    int64_t above = 0;
    const int64_t b = kth_bucket(hist, int64_t((hi - lo) >> shift), k, above);
    // The bucket's keys; the (k - above)-th largest of them is the k-th key.
    int64_t nc = 0;
    for (int64_t i = 0; i < n; ++i)
        if (int64_t((key[i] - lo) >> shift) == b) cand[nc++] = key[i];
    int64_t equal = 0;  // rows equal to the k-th that are taken
    const uint32_t kth = kth_key(cand, nc, k - above, equal);
    int64_t m = 0;
    for (int32_t i = 0; i < int32_t(n); ++i)
        if (key[i] > kth || (key[i] == kth && equal-- > 0)) out[m++] = i;
}

}  // namespace glm5::backend::kernels

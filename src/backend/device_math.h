// The attention arithmetic a GPU's kernels are written in, as host-and-device functions
// (core/hd.h) that the CPU suite checks against the CPU backend's kernels:
// - the running softmax: keys taken one at a time or in blocks merged in a fixed
//   order, the sum kept against the running maximum (the CPU's softmax is two passes
//   over all scores; a GPU streams the scores instead);
// - the top-k rule of the indexer: the k highest scores, ties to the lower index,
//   found by a radix select over the scores' order keys (four passes of a 256-bucket
//   histogram of integer counts, so the answer does not depend on thread timing).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace glm5::backend::device {

// A float's order as an unsigned integer: a < b exactly when key(a) < key(b), and
// both zeros one key (they compare equal), as the CPU's kernels::order_key.
GLM5_HD uint32_t order_key(float x) {
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(x);
#else
    std::memcpy(&u, &x, 4);
#endif
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k-th largest of n keys (1 <= k <= n), byte by byte from the top: each pass counts
// the keys that share the bytes found so far into 256 buckets and walks down from the
// largest bucket. `equal` receives how many keys equal to the k-th the k largest take.
// A GPU runs the counting of each pass across its threads (integer sums: the same in
// any order) and the walk on one.
GLM5_HD uint32_t radix_kth(const uint32_t* key, int64_t n, int64_t k, int64_t* equal) {
    uint32_t prefix = 0, mask = 0;
    int64_t remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t hist[256];
        for (int b = 0; b < 256; ++b) hist[b] = 0;
        for (int64_t i = 0; i < n; ++i)
            if ((key[i] & mask) == prefix) ++hist[(key[i] >> shift) & 255];
        int b = 255;
        while (hist[b] < remaining) remaining -= hist[b--];
        prefix |= uint32_t(b) << shift;
        mask |= 255u << shift;
    }
    *equal = remaining;
    return prefix;
}

// Whether row i is among the k largest, given the k-th key and `equal` (radix_kth's),
// and how many rows before i have the k-th key (a prefix count in index order).
GLM5_HD bool takes(uint32_t key, uint32_t kth, int64_t equal_before, int64_t equal) {
    return key > kth || (key == kth && equal_before < equal);
}

// The running softmax of one row of scores: the largest score so far and the sum of
// exp(score - max) over them.
struct SoftmaxRun {
    float max;
    float sum;
};
GLM5_HD SoftmaxRun softmax_start() {
    return SoftmaxRun{-3.402823466e38f, 0.f};
}
GLM5_HD float exp_of(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return __builtin_expf(x);
#endif
}
// Score s joins the run: returns its weight exp(s - max'), and *rescale the factor
// exp(max - max') by which values accumulated so far are multiplied.
GLM5_HD float softmax_add(SoftmaxRun& r, float s, float* rescale) {
    const float m = s > r.max ? s : r.max;
    *rescale = exp_of(r.max - m);
    const float w = exp_of(s - m);
    r.sum = r.sum * *rescale + w;
    r.max = m;
    return w;
}
// Two runs over disjoint keys merged (a block's into the running one, in key order):
// *scale_a and *scale_b multiply the values each accumulated.
GLM5_HD void softmax_merge(SoftmaxRun& a, const SoftmaxRun& b, float* scale_a, float* scale_b) {
    const float m = a.max > b.max ? a.max : b.max;
    *scale_a = exp_of(a.max - m);
    *scale_b = exp_of(b.max - m);
    a.sum = a.sum * *scale_a + b.sum * *scale_b;
    a.max = m;
}

}  // namespace glm5::backend::device

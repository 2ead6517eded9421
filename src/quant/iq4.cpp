// IQ4_NL (4.5 bpw, blocks of 32, pairs with Q8_0) and IQ4_XS (4.25 bpw,
// super-blocks of 256, pairs with Q8_K): 4-bit indices into 16 non-linear
// levels (kvalues_iq4nl, denser near zero), scaled by an fp16 d per 32 (NL) or
// by d*(ls-32) with a 6-bit ls per 32 (XS). Nibble order: the low nibbles of a
// 16-byte run are values 0..15 of a 32-block, the high nibbles 16..31.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

// Index of the level nearest to v (the upper one on ties); ggml's best_index_int8.
inline int nearest_level(float v) {
    const int8_t* val = kvalues_iq4nl;
    if (v <= val[0]) return 0;
    if (v >= val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < val[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - val[hi - 1] < val[hi] - v ? hi - 1 : hi;
}

inline int iq4xs_scale(const BlockIQ4_XS& b, int ib) {
    return ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4);
}

constexpr int kTries = 7;  // trial scales on each side (ggml's ntry for the file quantizers)

// Best scale for one block of 32 under weights w: start from the scale that
// maps the largest-magnitude value to the most negative level, then try
// scales mapping it to the levels -127+t, t in [-kTries, kTries], keeping the
// weighted least-squares optimum. Returns 0 for a (near) zero block.
float fit_block32(const float* xb, const float* w) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
        const float ax = fabsf(xb[j]);
        if (ax > amax) amax = ax, max = xb[j];
    }
    if (amax < 1e-15f) return 0;
    const int8_t* values = kvalues_iq4nl;
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
        const float q = values[nearest_level(id * xb[j])];
        sumqx += w[j] * q * xb[j];
        sumq2 += w[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -kTries; itry <= kTries; ++itry) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            const float q = values[nearest_level(id * xb[j])];
            sumqx += w[j] * q * xb[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) d = sumqx / sumq2, best = d * sumqx;
    }
    return d;
}

// ggml's importance: qw*sqrt(sigma2+x^2) with an imatrix, else x^2.
inline void importance(const float* xb, const float* qw, float sigma2, float* w) {
    if (qw) {
        for (int j = 0; j < 32; ++j) w[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
    } else {
        for (int j = 0; j < 32; ++j) w[j] = xb[j] * xb[j];
    }
}

inline float twice_mean_square(const float* x, int n) {
    float s = 0;
    for (int j = 0; j < n; ++j) s += x[j] * x[j];
    return s * (2.f / n);
}

inline void pack32(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(L[j] | (L[16 + j] << 4));
}

void quant_block_nl(const float* x, BlockIQ4_NL& y, const float* qw) {
    float w[32];
    uint8_t L[32];
    importance(x, qw, twice_mean_square(x, 32), w);
    const float d = fit_block32(x, w);
    y.d = fp32_to_fp16(d);
    const float id = d ? 1 / d : 0;
    for (int j = 0; j < 32; ++j) L[j] = uint8_t(nearest_level(id * x[j]));
    pack32(L, y.qs);
}

void quant_block_xs(const float* x, BlockIQ4_XS& y, const float* qw) {
    float w[32], scales[QK_K / 32];
    uint8_t L[32];
    const float sigma2 = twice_mean_square(x, QK_K);
    float max_scale = 0, amax_scale = 0;  // the sub-block scale of largest magnitude
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        importance(x + 32 * ib, qw ? qw + 32 * ib : nullptr, sigma2, w);
        scales[ib] = fit_block32(x + 32 * ib, w);
        if (fabsf(scales[ib]) > amax_scale) amax_scale = fabsf(scales[ib]), max_scale = scales[ib];
    }
    // 6-bit signed sub-scales l in [-32, 31] of d = -max_scale/32, then the
    // values are re-rounded at the scale actually stored.
    const float d = -max_scale / 32;
    y.d = fp32_to_fp16(d);
    const float id = d ? 1 / d : 0.f;
    y.scales_h = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        int l = nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        const float dl = d * l;
        const float idl = dl ? 1 / dl : 0.f;
        for (int j = 0; j < 32; ++j) L[j] = uint8_t(nearest_level(idl * x[32 * ib + j]));
        pack32(L, y.qs + 16 * ib);
        l += 32;
        if (ib % 2 == 0)
            y.scales_l[ib / 2] = uint8_t(l & 0xf);
        else
            y.scales_l[ib / 2] |= uint8_t((l & 0xf) << 4);
        y.scales_h |= uint16_t((l >> 4) << (2 * ib));
    }
}

}  // namespace

void dequant_iq4_nl(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = d * kvalues_iq4nl[x[i].qs[j] & 0xf];
            y[j + QK / 2] = d * kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

float dot_iq4_nl_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_NL*>(vw);
    const auto* a = static_cast<const BlockQ8_0*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        const float d = fp16_to_fp32(a[i].d) * fp16_to_fp32(x[i].d);
        int32_t lo = 0, hi = 0;
        for (int j = 0; j < QK / 2; ++j) {
            lo += a[i].qs[j] * kvalues_iq4nl[x[i].qs[j] & 0xf];
            hi += a[i].qs[j + QK / 2] * kvalues_iq4nl[x[i].qs[j] >> 4];
        }
        sumf += d * (lo + hi);
    }
    return sumf;
}

size_t quant_iq4_nl(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    auto* y = static_cast<BlockIQ4_NL*>(dst);
    const int64_t nb = n / QK;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_nl(src + r * n + i * QK, y[r * nb + i], imat ? imat + i * QK : nullptr);
    return size_t(nrows * nb) * sizeof(BlockIQ4_NL);
}

void dequant_iq4_xs(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ4_XS*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ++ib, y += 32, qs += 16) {
            const float dl = d * (iq4xs_scale(x[i], ib) - 32);
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

float dot_iq4_xs_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ4_XS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d4d8 = fp16_to_fp32(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const int8_t* q8 = a[i].qs;
        // Float accumulation per sub-block of 32, in order, as ggml does.
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 16, q8 += 32) {
            const float dl = d4d8 * (iq4xs_scale(x[i], ib) - 32);
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 16; ++j) {
                lo += q8[j] * kvalues_iq4nl[qs[j] & 0xf];
                hi += q8[j + 16] * kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += dl * (lo + hi);
        }
    }
    return sumf;
}

size_t quant_iq4_xs(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    auto* y = static_cast<BlockIQ4_XS*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_xs(src + r * n + i * QK_K, y[r * nb + i], imat ? imat + i * QK_K : nullptr);
    return size_t(nrows * nb) * sizeof(BlockIQ4_XS);
}

}  // namespace glm5::quant::iq

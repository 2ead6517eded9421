// K-quants: 256-value super-blocks with quantized sub-block scales.
//
//   Q2_K  16 x 16 values, 2-bit q, 4-bit scale and min each: x = d*sc*q - dmin*m
//   Q3_K  16 x 16 values, 3-bit q (2 low bits + hmask), 6-bit signed scale: x = d*sc*(q-4)
//   Q4_K   8 x 32 values, 4-bit q, 6-bit scale and min:   x = d*sc*q - dmin*m
//   Q5_K   8 x 32 values, 5-bit q (4 low bits + qh):      x = d*sc*q - dmin*m
//   Q6_K  16 x 16 values, 6-bit q (4 low bits + 2 in qh), int8 scale: x = d*sc*(q-32)
//   Q8_K  activation: float d, int8 q, and the sums of each 16 q (bsums)
//
// d and dmin are fp16 (float for Q8_K). The bit layouts are documented at each
// format's dequantizer.
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/common.h"
#include "quant/kernels.h"
#include "quant/ops.h"
#include "quant/scale_search.h"

namespace glm5::quant {

namespace {

inline float f16(uint16_t h) {
    return fp16_to_fp32(h);
}
inline uint16_t to_f16(float f) {
    return fp32_to_fp16(f);
}
inline int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

// ---------------------------------------------------------------- dequantize
// Each element is (d * sc) * q - (dmin * m): the two products are formed once
// per sub-block, then one multiply and one subtract per element, as ggml does.

// Q2_K: qs[32*h + l] holds, in bits 2s..2s+1, element 128h + 32s + l.
// scales[j] (low nibble scale, high nibble min) covers elements 16j..16j+15.
void dequant_q2_K(const void* src, float* y, int64_t n) {
    const BlockQ2_K* b = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        for (int j = 0; j < QK_K / 16; ++j) {
            const uint8_t sc = b[i].scales[j];
            const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
            const uint8_t* q = b[i].qs + 32 * (j / 8) + 16 * (j % 2);
            const int shift = 2 * ((j % 8) / 2);
            for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l] >> shift) & 3) - ml;
        }
    }
}

// Q3_K: the low two bits as in Q2_K; bit (4h + s) of hmask[l] is the third bit
// of element 128h + 32s + l, and a cleared bit means "subtract 4".
void dequant_q3_K(const void* src, float* y, int64_t n) {
    const BlockQ3_K* b = static_cast<const BlockQ3_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d_all = f16(b[i].d);
        int8_t scales[16];
        unpack_q3k_scales(b[i].scales, scales);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float dl = d_all * scales[j];
            const int h = j / 8, s = (j % 8) / 2, off = 16 * (j % 2);
            const uint8_t* q = b[i].qs + 32 * h + off;
            const uint8_t* hm = b[i].hmask + off;
            const uint8_t bit = uint8_t(1u << (4 * h + s));
            for (int l = 0; l < 16; ++l)
                *y++ = dl * float(((q[l] >> (2 * s)) & 3) - ((hm[l] & bit) ? 0 : 4));
        }
    }
}

// Q4_K: qs[32*k + l] holds element 64k + l (low nibble, sub-block 2k) and
// element 64k + 32 + l (high nibble, sub-block 2k+1).
void dequant_q4_K(const void* src, float* y, int64_t n) {
    const BlockQ4_K* b = static_cast<const BlockQ4_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        uint8_t sc[8], m[8];
        unpack_k4_scales(b[i].scales, sc, m);
        for (int k = 0; k < 4; ++k) {
            const uint8_t* q = b[i].qs + 32 * k;
            const float d1 = d * sc[2 * k], m1 = dmin * m[2 * k];
            const float d2 = d * sc[2 * k + 1], m2 = dmin * m[2 * k + 1];
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
        }
    }
}

// Q5_K: as Q4_K, plus bit 2k (low nibble) / 2k+1 (high nibble) of qh[l] adds 16.
void dequant_q5_K(const void* src, float* y, int64_t n) {
    const BlockQ5_K* b = static_cast<const BlockQ5_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = f16(b[i].d), dmin = f16(b[i].dmin);
        uint8_t sc[8], m[8];
        unpack_k4_scales(b[i].scales, sc, m);
        for (int k = 0; k < 4; ++k) {
            const uint8_t* ql = b[i].qs + 32 * k;
            const uint8_t* qh = b[i].qh;
            const uint8_t u1 = uint8_t(1u << (2 * k)), u2 = uint8_t(2u << (2 * k));
            const float d1 = d * sc[2 * k], m1 = dmin * m[2 * k];
            const float d2 = d * sc[2 * k + 1], m2 = dmin * m[2 * k + 1];
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * float((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

// Q6_K, per 128-value half h: ql[64h + l] low/high nibble = elements
// 128h + l / 128h + 64 + l, ql[64h + 32 + l] = 128h + 32 + l / 128h + 96 + l;
// qh[32h + l] bits 2s..2s+1 are the top bits of element 128h + 32s + l.
inline int q6_value(const BlockQ6_K& b, int e) {
    const int h = e / 128, r = e % 128, s = r / 32, l = r % 32;
    const uint8_t lo = b.ql[64 * h + l + 32 * (s & 1)];
    const int low4 = (s < 2) ? (lo & 0xF) : (lo >> 4);
    const int high2 = (b.qh[32 * h + l] >> (2 * s)) & 3;
    return (low4 | (high2 << 4)) - 32;
}

void dequant_q6_K(const void* src, float* y, int64_t n) {
    const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = f16(b[i].d);
        for (int e = 0; e < QK_K; ++e) *y++ = d * b[i].scales[e / 16] * float(q6_value(b[i], e));
    }
}

void dequant_q8_K(const void* src, float* y, int64_t n) {
    const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i)
        for (int j = 0; j < QK_K; ++j) *y++ = b[i].d * float(b[i].qs[j]);
}

// ---------------------------------------------------------------- packing

// 2-bit levels into Q2_K/Q3_K qs (see dequant_q2_K).
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* p = L + 128 * h + l;
            qs[32 * h + l] = uint8_t(p[0] | (p[32] << 2) | (p[64] << 4) | (p[96] << 6));
        }
}

// 6-bit scale/min pairs of Q4_K/Q5_K (inverse of unpack_k4_scale_min).
void pack_k4_scales(const uint8_t* ls, const uint8_t* lm, uint8_t* out) {
    std::memset(out, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = uint8_t((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= uint8_t((ls[j] >> 4) << 6);
            out[j] |= uint8_t((lm[j] >> 4) << 6);
        }
    }
}

// 16 biased 6-bit scales of Q3_K (inverse of unpack_q3k_scales).
void pack_q3k_scales(const int* l6, uint8_t* out) {
    std::memset(out, 0, 12);
    for (int j = 0; j < 16; ++j) {
        const int l = l6[j];
        if (j < 8)
            out[j] = uint8_t(l & 0xF);
        else
            out[j - 8] |= uint8_t((l & 0xF) << 4);
        out[8 + j % 4] |= uint8_t((l >> 4) << (2 * (j / 4)));
    }
}

// ---------------------------------------------------------------- Q2_K

// Final levels for fixed quantized scales: q = round((x + dmin*m) / (d*sc)).
// Sub-blocks whose scale is 0 keep the levels of the scale search.
void requantize_q2_K(const float* x, const BlockQ2_K& y, uint8_t* L) {
    const float d = f16(y.d), dmin = f16(y.dmin);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float dl = d * (y.scales[j] & 0xF);
        if (!dl) continue;
        const float ml = dmin * (y.scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = uint8_t(clamp_int(nearest_int((x[16 * j + ii] + ml) / dl), 0, 3));
    }
}

void quant_block_q2_K(const float* x, BlockQ2_K* y, const float* qw) {
    uint8_t L[QK_K];
    float weights[QK_K], scales[16], mins[16];
    if (!qw) {
        // Reference: per sub-block search weighted by |x|, then the largest
        // scale and min map to 15.
        float max_scale = 0, max_min = 0;
        for (int l = 0; l < QK_K; ++l) weights[l] = std::fabs(x[l]);
        search_scale_min_groups(16, 16, 3, x, weights, L, scales, mins, -0.5f, 0.1f, 15, true);
        for (int j = 0; j < QK_K / 16; ++j) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j)
                y->scales[j] = uint8_t(nearest_int(iscale * scales[j]));
            y->d = to_f16(max_scale / 15.f);
        } else {
            std::memset(y->scales, 0, sizeof y->scales);
            y->d = to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < QK_K / 16; ++j)
                y->scales[j] = uint8_t(y->scales[j] | (nearest_int(iscale * mins[j]) << 4));
            y->dmin = to_f16(max_min / 15.f);
        } else {
            y->dmin = to_f16(0.f);
        }
    } else {
        // Importance-weighted: finer search, then the 16 scales and mins are
        // themselves quantized by a weighted search (weights = sum per sub-block).
        float sumx2 = 0;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = sumx2 / QK_K;
        float sw[16];
        for (int j = 0; j < QK_K / 16; ++j) {
            float* w = weights + 16 * j;
            for (int l = 0; l < 16; ++l)
                w[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += w[l];
        }
        search_scale_min_groups(16, 16, 3, x, weights, L, scales, mins, -0.9f, 0.05f, 36, false);
        uint8_t Ls[16], Lm[16];
        const float dm = search_positive(16, 15, scales, Ls, sw);
        const float mm = search_positive(16, 15, mins, Lm, sw);
        y->d = to_f16(dm);
        y->dmin = to_f16(mm);
        for (int j = 0; j < 16; ++j) y->scales[j] = uint8_t(Ls[j] | (Lm[j] << 4));
    }
    requantize_q2_K(x, *y, L);
    pack_2bit(L, y->qs);
}

// ---------------------------------------------------------------- Q3_K

void finish_q3_K(const float* x, BlockQ3_K* y, int8_t* L) {
    // Final levels against the quantized scales (signed, biased by 4).
    int8_t scales[16];
    unpack_q3k_scales(y->scales, scales);
    const float d_all = f16(y->d);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = d_all * scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = int8_t(clamp_int(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    // The third bit goes to hmask: element e sets bit e/32 of hmask[e%32].
    std::memset(y->hmask, 0, sizeof y->hmask);
    uint8_t low[QK_K];
    for (int e = 0; e < QK_K; ++e) {
        int l = L[e];
        if (l > 3) {
            y->hmask[e % 32] |= uint8_t(1u << (e / 32));
            l -= 4;
        }
        low[e] = uint8_t(l);
    }
    pack_2bit(low, y->qs);
}

void quant_block_q3_K(const float* x, BlockQ3_K* y, const float* qw) {
    int8_t L[QK_K];
    float scales[16];
    int l6[16];
    if (!qw) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = search_symmetric_refine(16, 4, x + 16 * j, L + 16 * j);
            const float a = std::fabs(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        if (max_scale) {
            // The scale of largest magnitude maps to -32.
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int8_t l = int8_t(nearest_int(iscale * scales[j]));
                l6[j] = clamp_int(l, -32, 31) + 32;
            }
            pack_q3k_scales(l6, y->scales);
            y->d = to_f16(1 / iscale);
        } else {
            std::memset(y->scales, 0, sizeof y->scales);
            y->d = to_f16(0.f);
        }
    } else {
        float sumx2 = 0;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = 2 * sumx2 / QK_K;
        float weight[QK_K], sw[16];
        for (int j = 0; j < QK_K / 16; ++j) {
            float* w = weight + 16 * j;
            for (int l = 0; l < 16; ++l)
                w[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += w[l];
            sw[j] = sumw;
        }
        search_symmetric_groups(16, 16, 4, x, L, weight, scales);
        int8_t Ls[16];
        const float d_block = search_symmetric(16, 32, scales, Ls, sw);
        for (int j = 0; j < 16; ++j) l6[j] = Ls[j];
        pack_q3k_scales(l6, y->scales);
        y->d = to_f16(d_block);
    }
    finish_q3_K(x, y, L);
}

// ---------------------------------------------------------------- Q4_K / Q5_K

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): sub-block scales and mins, their
// 6-bit quantization, and the final levels in L. Returns d, dmin via y fields.
template <int kNmax>
void scales_q45_K(const float* x, const float* qw, uint8_t* L, uint8_t* packed, uint16_t* d_out,
                  uint16_t* dmin_out) {
    uint8_t ls[8], lm[8];
    float weights[QK_K], scales[8], mins[8];
    if (!qw) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 32; ++j) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
            const float av_x = std::sqrt(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[32 * j + l] = av_x + std::fabs(x[32 * j + l]);
        }
        if constexpr (kNmax == 15)
            search_scale_min_groups(8, 32, 15, x, weights, L, scales, mins, -1.f, 0.1f, 20, false);
        else
            search_scale_min_groups(8, 32, 31, x, weights, L, scales, mins, -0.5f, 0.1f, 15, false);
        for (int j = 0; j < QK_K / 32; ++j) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        for (int j = 0; j < 8; ++j) {
            const uint8_t a = uint8_t(nearest_int(inv_scale * scales[j]));
            const uint8_t b = uint8_t(nearest_int(inv_min * mins[j]));
            ls[j] = a < 63 ? a : 63;
            lm[j] = b < 63 ? b : 63;
        }
        *d_out = to_f16(max_scale / 63.f);
        *dmin_out = to_f16(max_min / 63.f);
    } else {
        float sum_x2 = 0;
        for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
        const float sigma2 = 2 * sum_x2 / QK_K;
        float sw[8];
        for (int j = 0; j < QK_K / 32; ++j) {
            float* w = weights + 32 * j;
            for (int l = 0; l < 32; ++l)
                w[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 32; ++l) sumw += w[l];
            sw[j] = sumw;
        }
        search_scale_min_groups(8, 32, kNmax, x, weights, L, scales, mins, -0.9f, 0.05f, 36, false);
        const float d_block = search_positive(8, 63, scales, ls, sw);
        const float m_block = search_positive(8, 63, mins, lm, sw);
        // ggml clamps here for Q5_K only (the search never exceeds 63 unless a
        // scale came out negative and wrapped; kept for identical output).
        if constexpr (kNmax == 31)
            for (int j = 0; j < 8; ++j) {
                if (ls[j] > 63) ls[j] = 63;
                if (lm[j] > 63) lm[j] = 63;
            }
        *d_out = to_f16(d_block);
        *dmin_out = to_f16(m_block);
    }
    pack_k4_scales(ls, lm, packed);
    // Final levels for the quantized scales.
    const float d = f16(*d_out), dmin = f16(*dmin_out);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        unpack_k4_scale_min(j, packed, &sc, &m);
        const float dl = d * sc;
        if (!dl) continue;
        const float ml = dmin * m;
        for (int ii = 0; ii < 32; ++ii)
            L[32 * j + ii] = uint8_t(clamp_int(nearest_int((x[32 * j + ii] + ml) / dl), 0, kNmax));
    }
}

void quant_block_q4_K(const float* x, BlockQ4_K* y, const float* qw) {
    uint8_t L[QK_K];
    scales_q45_K<15>(x, qw, L, y->scales, &y->d, &y->dmin);
    for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l)
            y->qs[32 * k + l] = uint8_t(L[64 * k + l] | (L[64 * k + 32 + l] << 4));
}

void quant_block_q5_K(const float* x, BlockQ5_K* y, const float* qw) {
    uint8_t L[QK_K];
    scales_q45_K<31>(x, qw, L, y->scales, &y->d, &y->dmin);
    std::memset(y->qh, 0, sizeof y->qh);
    for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
            int l1 = L[64 * k + l], l2 = L[64 * k + 32 + l];
            if (l1 > 15) {
                l1 -= 16;
                y->qh[l] |= uint8_t(1u << (2 * k));
            }
            if (l2 > 15) {
                l2 -= 16;
                y->qh[l] |= uint8_t(2u << (2 * k));
            }
            y->qs[32 * k + l] = uint8_t(l1 | (l2 << 4));
        }
}

// ---------------------------------------------------------------- Q6_K

void quant_block_q6_K(const float* x, BlockQ6_K* y, const float* qw) {
    int8_t L[QK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    // With importance data the raw imatrix values are the weights.
    search_symmetric_groups(16, 16, 32, x, L, qw, scales);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const float a = std::fabs(scales[ib]);
        if (a > max_abs_scale) {
            max_abs_scale = a;
            max_scale = scales[ib];
        }
    }
    if (max_abs_scale < kGroupMaxEps) {
        std::memset(y, 0, sizeof *y);
        return;
    }
    // The scale of largest magnitude maps to -128.
    const float iscale = -128.f / max_scale;
    y->d = to_f16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const int s = nearest_int(iscale * scales[ib]);
        y->scales[ib] = int8_t(s < 127 ? s : 127);
    }
    const float d_all = f16(y->d);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = d_all * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = int8_t(clamp_int(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
    }
    // Pack (see q6_value for the layout).
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const int8_t* p = L + 128 * h + l;
            y->ql[64 * h + l] = uint8_t((p[0] & 0xF) | ((p[64] & 0xF) << 4));
            y->ql[64 * h + l + 32] = uint8_t((p[32] & 0xF) | ((p[96] & 0xF) << 4));
            y->qh[32 * h + l] = uint8_t((p[0] >> 4) | ((p[32] >> 4) << 2) | ((p[64] >> 4) << 4) |
                                        ((p[96] >> 4) << 6));
        }
}

template <typename Block, void (*Quant)(const float*, Block*, const float*)>
size_t quantize_rows_of(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* imatrix) {
    Block* y = static_cast<Block*>(dst);
    const int64_t nb = n_per_row / QK_K;
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            Quant(src + r * n_per_row + i * QK_K, y + r * nb + i,
                  imatrix ? imatrix + i * QK_K : nullptr);
    return size_t(n_rows * nb) * sizeof(Block);
}

// ---------------------------------------------------------------- dot products
// Per super-block: an exact integer sum of sc * q * q8 over the sub-blocks (and
// of m * bsums for the formats with mins), then
//     sum += (d * q8.d) * isum - (dmin * q8.d) * summs
// in float, super-blocks in order. The SIMD kernels compute the same integers
// and finish each super-block with the same float operations, so they return
// bit-identical results.

inline float finish(float acc, float d, int isum, float dmin, int summs) {
    return acc + (unfused(d * float(isum)) - unfused(dmin * float(summs)));
}
inline float finish(float acc, float d, int isum) {
    return acc + unfused(d * float(isum));
}

float dot_q2_K_ref(int64_t n, const void* w, const void* a) {
    const BlockQ2_K* x = static_cast<const BlockQ2_K*>(w);
    const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int isum = 0, summs = 0;
        for (int j = 0; j < 16; ++j) {
            const uint8_t* q = x[i].qs + 32 * (j / 8) + 16 * (j % 2);
            const int shift = 2 * ((j % 8) / 2);
            const int8_t* q8 = y[i].qs + 16 * j;
            int s = 0;
            for (int l = 0; l < 16; ++l) s += q8[l] * ((q[l] >> shift) & 3);
            isum += (x[i].scales[j] & 0xF) * s;
            summs += (x[i].scales[j] >> 4) * y[i].bsums[j];
        }
        sum = finish(sum, y[i].d * f16(x[i].d), isum, y[i].d * f16(x[i].dmin), summs);
    }
    return sum;
}

float dot_q3_K_ref(int64_t n, const void* w, const void* a) {
    const BlockQ3_K* x = static_cast<const BlockQ3_K*>(w);
    const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t scales[16];
        unpack_q3k_scales(x[i].scales, scales);
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
            const int h = j / 8, s = (j % 8) / 2, off = 16 * (j % 2);
            const uint8_t* q = x[i].qs + 32 * h + off;
            const uint8_t* hm = x[i].hmask + off;
            const uint8_t bit = uint8_t(1u << (4 * h + s));
            const int8_t* q8 = y[i].qs + 16 * j;
            int acc = 0;
            for (int l = 0; l < 16; ++l)
                acc += q8[l] * (((q[l] >> (2 * s)) & 3) - ((hm[l] & bit) ? 0 : 4));
            isum += scales[j] * acc;
        }
        sum = finish(sum, f16(x[i].d) * y[i].d, isum);
    }
    return sum;
}

template <bool kFive, typename Block>
float dot_q45_K_ref(int64_t n, const Block* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        uint8_t sc[8], m[8];
        unpack_k4_scales(x[i].scales, sc, m);
        int isum = 0, summs = 0;
        for (int j = 0; j < 8; ++j) {
            const uint8_t* q = x[i].qs + 32 * (j / 2);
            const int8_t* q8 = y[i].qs + 32 * j;
            int acc = 0;
            for (int l = 0; l < 32; ++l) {
                int v = (j % 2) ? (q[l] >> 4) : (q[l] & 0xF);
                if constexpr (kFive) v += ((x[i].qh[l] >> j) & 1) << 4;
                acc += q8[l] * v;
            }
            isum += sc[j] * acc;
            summs += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        sum = finish(sum, f16(x[i].d) * y[i].d, isum, f16(x[i].dmin) * y[i].d, summs);
    }
    return sum;
}

float dot_q4_K_ref(int64_t n, const void* w, const void* a) {
    return dot_q45_K_ref<false>(n, static_cast<const BlockQ4_K*>(w),
                                static_cast<const BlockQ8_K*>(a));
}
float dot_q5_K_ref(int64_t n, const void* w, const void* a) {
    return dot_q45_K_ref<true>(n, static_cast<const BlockQ5_K*>(w),
                               static_cast<const BlockQ8_K*>(a));
}

float dot_q6_K_ref(int64_t n, const void* w, const void* a) {
    const BlockQ6_K* x = static_cast<const BlockQ6_K*>(w);
    const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
            int acc = 0;
            for (int l = 0; l < 16; ++l) acc += y[i].qs[16 * j + l] * q6_value(x[i], 16 * j + l);
            isum += x[i].scales[j] * acc;
        }
        sum = finish(sum, f16(x[i].d) * y[i].d, isum);
    }
    return sum;
}

// ---------------------------------------------------------------- Q8_K activation

void act_q8_K(const float* x, void* dst, int64_t n) {
    if (cpu_has_avx2())
        kernels::act_q8_K_avx2(x, dst, n);
    else
        kernels::act_q8_K_scalar(x, dst, n);
}

size_t quant_q8_K(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
    kernels::act_q8_K_scalar(src, dst, n_rows * n_per_row);
    return size_t(n_rows * n_per_row / QK_K) * sizeof(BlockQ8_K);
}

using namespace kernels;

const FormatOps kQ2_K = {dequant_q2_K,  quantize_rows_of<BlockQ2_K, quant_block_q2_K>,
                         nullptr,       dot_q2_K_ref,
                         dot_q2_K_avx2, dot_q2_K_avx512};
const FormatOps kQ3_K = {dequant_q3_K,  quantize_rows_of<BlockQ3_K, quant_block_q3_K>,
                         nullptr,       dot_q3_K_ref,
                         dot_q3_K_avx2, dot_q3_K_avx512};
const FormatOps kQ4_K = {dequant_q4_K,
                         quantize_rows_of<BlockQ4_K, quant_block_q4_K>,
                         nullptr,
                         dot_q4_K_ref,
                         dot_q4_K_avx2,
                         dot_q4_K_avx512,
                         dot_q4_K_multi_avx2,
                         dot_q4_K_multi_avx512};
const FormatOps kQ5_K = {dequant_q5_K,
                         quantize_rows_of<BlockQ5_K, quant_block_q5_K>,
                         nullptr,
                         dot_q5_K_ref,
                         dot_q5_K_avx2,
                         dot_q5_K_avx512,
                         dot_q5_K_multi_avx2,
                         dot_q5_K_multi_avx512};
const FormatOps kQ6_K = {dequant_q6_K,
                         quantize_rows_of<BlockQ6_K, quant_block_q6_K>,
                         nullptr,
                         dot_q6_K_ref,
                         dot_q6_K_avx2,
                         dot_q6_K_avx512,
                         dot_q6_K_multi_avx2};
const FormatOps kQ8_K = {dequant_q8_K, quant_q8_K, act_q8_K, nullptr, nullptr, nullptr};

}  // namespace

// ggml's quantize_row_q8_K_ref (which llama.cpp's x86 backend uses): the
// element of largest magnitude (first on ties, with its sign) sets
// iscale = -127 / max, q = min(127, nearest_int(iscale * x)), d = 1 / iscale.
void kernels::act_q8_K_scalar(const float* x, void* dst, int64_t n) {
    BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            y[i].d = 0;
            std::memset(y[i].qs, 0, sizeof y[i].qs);
            std::memset(y[i].bsums, 0, sizeof y[i].bsums);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = int8_t(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = int16_t(sum);
        }
        y[i].d = 1 / iscale;
    }
}

const FormatOps* kquant_ops(Type t) {
    switch (t) {
        case Type::Q2_K:
            return &kQ2_K;
        case Type::Q3_K:
            return &kQ3_K;
        case Type::Q4_K:
            return &kQ4_K;
        case Type::Q5_K:
            return &kQ5_K;
        case Type::Q6_K:
            return &kQ6_K;
        case Type::Q8_K:
            return &kQ8_K;
        default:
            return nullptr;
    }
}

}  // namespace glm5::quant

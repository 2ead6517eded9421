// IQ3_XXS (3.06 bpw) and IQ3_S (3.44 bpw): each group of 4 weights is one
// point of a 4-dimensional grid of 8 magnitude levels (256 or 512 points), with
// per-value signs and one scale per 32 values. IQ3_XXS stores 7 sign bits per 8
// values (even parity implies the eighth) and its scale as d*(0.5+s)/2 on
// magnitudes 4..62; IQ3_S stores all sign bits, a 9th index bit, and its scale
// as d*(1+2s) on odd magnitudes 1..15.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

inline const uint8_t* grid4(const uint32_t* grid, int idx) {
    return reinterpret_cast<const uint8_t*>(grid + idx);
}

// 8 values from two grid points of 4: y = db * grid * sign.
inline void put4x2(float* y, float db, const uint8_t* g1, const uint8_t* g2, uint8_t signs) {
    for (int j = 0; j < 4; ++j) {
        y[j + 0] = db * g1[j] * (signs & (1u << j) ? -1.f : 1.f);
        y[j + 4] = db * g2[j] * (signs & (1u << (j + 4)) ? -1.f : 1.f);
    }
}

inline int32_t dot4x2(const uint8_t* g1, const uint8_t* g2, const int8_t* q8, uint8_t signs) {
    int32_t s = 0;
    for (int j = 0; j < 4; ++j) {
        s += g1[j] * q8[j + 0] * (signs & (1u << j) ? -1 : 1);
        s += g2[j] * q8[j + 4] * (signs & (1u << (j + 4)) ? -1 : 1);
    }
    return s;
}

inline int scale_index(float id, float s) {
    const int l = nearest_int(0.5f * (id * s - 1));
    return l < 0 ? 0 : l > 15 ? 15 : l;
}

constexpr GridSearch kSearchXXS{LatticeId::IQ3_XXS, 32, 8, 15, 0.2f, false, Resnap::OffGrid};
constexpr GridSearch kSearchS{LatticeId::IQ3_S, 32, 8, 9, 0.2f, false, Resnap::AllIfOffGrid};

// Shared front half of both quantizers for one sub-block of 32: importance
// (ggml's qw*sqrt(sigma2+x^2), or x^2 without an imatrix) and sign split.
inline void prepare(const float* xb, const float* qw, float sigma2, bool even, float* w,
                    float* waux, float* xval, uint8_t signs[4]) {
    if (qw) {
        for (int i = 0; i < 32; ++i) w[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]);
    } else {
        for (int i = 0; i < 32; ++i) w[i] = xb[i] * xb[i];
    }
    for (int i = 0; i < 32; ++i) waux[i] = sqrtf(w[i]);
    for (int k = 0; k < 4; ++k) {
        const uint8_t s = split_signs8(xb + 8 * k, w + 8 * k, even, xval + 8 * k);
        signs[k] = even ? uint8_t(s & 127) : s;
    }
}

inline float twice_mean_square(const float* x) {
    float s = 0;
    for (int i = 0; i < QK_K; ++i) s += x[i] * x[i];
    return 2 * s / QK_K;
}

void quant_block_xxs(const float* x, BlockIQ3_XXS& y, const float* qw, const Lattice& lat) {
    float scales[QK_K / 32];
    float w[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    uint8_t q3[3 * QK_K / 8] = {};
    uint32_t sas[QK_K / 32] = {};  // per 32: 4x7 sign bits, 4-bit scale on top

    y.d = 0;
    const float sigma2 = twice_mean_square(x);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        prepare(x + 32 * ib, qw ? qw + 32 * ib : nullptr, sigma2, true, w, waux, xval, signs);
        float max = xval[0];
        for (int i = 1; i < 32; ++i) max = max > xval[i] ? max : xval[i];
        scales[ib] = 0;
        if (max < 1e-8f) continue;
        float scale = *grid_search(kSearchXXS, xval, w, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; ++k) signs[k] = uint8_t(~signs[k] & 127);
        }
        for (int k = 0; k < 8; ++k) {
            const int g = lat.map[lat.code(L + 4 * k)];
            q3[8 * ib + k] = uint8_t(g < 0 ? 0 : g);
        }
        sas[ib] = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (uint32_t(signs[3]) << 21);
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        std::memset(y.qs, 0, sizeof(y.qs));
        return;
    }
    const float d = max_scale / 31;
    y.d = fp32_to_fp16(d * 1.0125f);  // ggml's empirical correction of the fitted scale
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / 32; ++ib) sas[ib] |= uint32_t(scale_index(id, scales[ib])) << 28;
    std::memcpy(y.qs, q3, QK_K / 4);
    std::memcpy(y.qs + QK_K / 4, sas, sizeof(sas));
}

// Note: ggml's quantize_row_iq3_s_impl advances its qs/signs write pointers only
// for sub-blocks that are not all zero, so a block with an all-zero sub-block
// before a non-zero one decodes wrongly there. Here every sub-block is written
// at its own position.
void quant_block_s(const float* x, BlockIQ3_S& y, const float* qw, const Lattice& lat) {
    float scales[QK_K / 32];
    float w[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];

    std::memset(&y, 0, sizeof(y));
    const float sigma2 = twice_mean_square(x);
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        prepare(x + 32 * ib, qw ? qw + 32 * ib : nullptr, sigma2, false, w, waux, xval, signs);
        float max = xval[0];
        for (int i = 1; i < 32; ++i) max = max > xval[i] ? max : xval[i];
        scales[ib] = 0;
        if (!max) continue;
        float scale = *grid_search(kSearchS, xval, w, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; ++k) signs[k] = uint8_t(~signs[k]);
        }
        for (int k = 0; k < 8; ++k) {
            int g = lat.map[lat.code(L + 4 * k)];
            g = g < 0 ? 0 : g;
            y.qs[8 * ib + k] = uint8_t(g & 255);
            y.qh[ib] |= uint8_t((g >> 8) << k);
        }
        for (int k = 0; k < 4; ++k) y.signs[4 * ib + k] = signs[k];
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    y.d = fp32_to_fp16(d * 1.033f);  // ggml's empirical correction of the fitted scale
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / 32; ib += 2)
        y.scales[ib / 2] =
            uint8_t(scale_index(id, scales[ib]) | (scale_index(id, scales[ib + 1]) << 4));
}

}  // namespace

// ---- IQ3_XXS: 64 bytes of grid indices (8 per 32 values), then per 32 values a
// word of 4x7 sign bits with a 4-bit scale on top.

void dequant_iq3_xxs(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ3_XXS*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 8) {
            uint32_t sas;
            std::memcpy(&sas, x[i].qs + QK_K / 4 + 4 * ib, 4);
            const float db = d * (0.5f + (sas >> 28)) * 0.5f;
            for (int l = 0; l < 4; ++l, y += 8)
                put4x2(y, db, grid4(iq3xxs_grid, qs[2 * l]), grid4(iq3xxs_grid, qs[2 * l + 1]),
                       ksigns_iq2xs[(sas >> (7 * l)) & 127]);
        }
    }
}

float dot_iq3_xxs_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ3_XXS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const int8_t* q8 = a[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 8) {
            uint32_t sas;
            std::memcpy(&sas, x[i].qs + QK_K / 4 + 4 * ib, 4);
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8)
                sumi += dot4x2(grid4(iq3xxs_grid, qs[2 * l]), grid4(iq3xxs_grid, qs[2 * l + 1]), q8,
                               ksigns_iq2xs[(sas >> (7 * l)) & 127]);
            bsum += sumi * int32_t(2 * (sas >> 28) + 1);
        }
        sumf += d * bsum;
    }
    return 0.25f * sumf;
}

size_t quant_iq3_xxs(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ3_XXS);
    auto* y = static_cast<BlockIQ3_XXS*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_xxs(src + r * n + i * QK_K, y[r * nb + i], imat ? imat + i * QK_K : nullptr,
                            lat);
    return size_t(nrows * nb) * sizeof(BlockIQ3_XXS);
}

// ---- IQ3_S: per 4 values an index (8 bits in qs, the 9th in qh), a sign byte
// per 8 values, a 4-bit scale per 32.

namespace {

inline int iq3s_index(const uint8_t* qs, uint8_t qh, int l, int half) {
    return qs[2 * l + half] | ((qh << (8 - 2 * l - half)) & 256);
}

}  // namespace

void dequant_iq3_s(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ3_S*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].signs;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 8, signs += 4) {
            const float db = d * (1 + 2 * ((x[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
            for (int l = 0; l < 4; ++l, y += 8)
                put4x2(y, db, grid4(iq3s_grid, iq3s_index(qs, x[i].qh[ib], l, 0)),
                       grid4(iq3s_grid, iq3s_index(qs, x[i].qh[ib], l, 1)), signs[l]);
        }
    }
}

float dot_iq3_s_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ3_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d) * a[i].d;
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].signs;
        const int8_t* q8 = a[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 8, signs += 4) {
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8)
                sumi += dot4x2(grid4(iq3s_grid, iq3s_index(qs, x[i].qh[ib], l, 0)),
                               grid4(iq3s_grid, iq3s_index(qs, x[i].qh[ib], l, 1)), q8, signs[l]);
            bsum += sumi * (2 * ((x[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xf) + 1);
        }
        sumf += d * bsum;
    }
    return sumf;
}

size_t quant_iq3_s(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ3_S);
    auto* y = static_cast<BlockIQ3_S*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_s(src + r * n + i * QK_K, y[r * nb + i], imat ? imat + i * QK_K : nullptr,
                          lat);
    return size_t(nrows * nb) * sizeof(BlockIQ3_S);
}

}  // namespace glm5::quant::iq

// IQ2_XXS (2.06 bpw), IQ2_XS (2.31 bpw), IQ2_S (2.56 bpw): each group of 8
// weights is one point of an 8-dimensional grid of magnitudes {8, 25, 43}
// (256, 512 or 1024 points) times per-value signs, scaled per 32 (XXS) or 16
// (XS, S) values by d * (0.5 + s) / 4 with a 4-bit s and an fp16 d per 256.
// XXS and XS store 7 sign bits per group (the eighth makes the number of minus
// signs even); S stores all 8.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_tables.h"

namespace glm5::quant::iq {

namespace {

inline const uint8_t* grid_bytes(const uint64_t* grid, int idx) {
    return reinterpret_cast<const uint8_t*>(grid + idx);
}

// One group of 8: y = db * grid * sign.
inline void put8(float* y, float db, const uint8_t* g, uint8_t signs) {
    for (int j = 0; j < 8; ++j) y[j] = db * g[j] * (signs & (1u << j) ? -1.f : 1.f);
}

inline int32_t dot8(const uint8_t* g, const int8_t* q8, uint8_t signs) {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) s += g[j] * q8[j] * (signs & (1u << j) ? -1 : 1);
    return s;
}

// Per-value importance for one sub-block: ggml's qw * sqrt(sigma2 + x^2) with
// an imatrix. Without one: IQ2_S uses its ggml default, sigma2/4 + x^2; ggml
// has no default for IQ2_XXS/IQ2_XS (it refuses to quantize them without an
// imatrix), and here they take unit importance (qw = 1), which on Gaussian and
// heavy-tailed rows gives a lower plain squared error than either x^2 or
// IQ2_S's default.
inline void subblock_weights(const float* xb, const float* qw, int n, float sigma2_imat,
                             float sigma2_default, bool unit_default, float* w) {
    if (qw) {
        for (int i = 0; i < n; ++i) w[i] = qw[i] * sqrtf(sigma2_imat + xb[i] * xb[i]);
    } else if (unit_default) {
        for (int i = 0; i < n; ++i) w[i] = sqrtf(sigma2_imat + xb[i] * xb[i]);
    } else {
        for (int i = 0; i < n; ++i) w[i] = 0.25f * sigma2_default + xb[i] * xb[i];
    }
}

inline float sum_squares(const float* x, int n) {
    float s = 0;
    for (int i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
}

// 4-bit sub-block scale index for scale s under super-block scale 1/id: the s
// with s ~ d*(2l+1).
inline int scale_index(float id, float s) {
    const int l = nearest_int(0.5f * (id * s - 1));
    return l < 0 ? 0 : l > 15 ? 15 : l;
}

constexpr GridSearch kSearchXXS{LatticeId::IQ2_XXS, 32, 3, 6, 0.1f, true, Resnap::All};
constexpr GridSearch kSearchXS{LatticeId::IQ2_XS, 16, 3, 9, 0.1f, false, Resnap::OffGrid};
constexpr GridSearch kSearchS{LatticeId::IQ2_S, 16, 3, 9, 0.1f, false, Resnap::OffGrid};

void quant_block_xxs(const float* x, BlockIQ2_XXS& y, const float* qw, const Lattice& lat,
                     const GridSearch& search) {
    float scales[QK_K / 32];
    float w[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    uint32_t q2[2 * (QK_K / 32)] = {};

    y.d = 0;
    const float sumx2 = sum_squares(x, QK_K);
    const float sigma2 = sumx2 / QK_K;
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        const float* xb = x + 32 * ib;
        subblock_weights(xb, qw ? qw + 32 * ib : nullptr, 32, sigma2, 2 * sumx2 / QK_K, true, w);
        for (int i = 0; i < 32; ++i) waux[i] = sqrtf(w[i]);
        for (int k = 0; k < 4; ++k)
            signs[k] = split_signs8(xb + 8 * k, w + 8 * k, true, xval + 8 * k) & 127;
        float max = xval[0];
        for (int i = 1; i < 32; ++i) max = max > xval[i] ? max : xval[i];
        scales[ib] = 0;
        if (max < 1e-15f) continue;
        const std::optional<float> found = grid_search(search, xval, w, waux, max, L);
        if (!found) continue;
        float scale = *found;
        if (scale < 0) {  // only through an odd parity flip; keep the scale unsigned
            scale = -scale;
            for (int k = 0; k < 4; ++k) signs[k] = uint8_t(~signs[k] & 127);
        }
        for (int k = 0; k < 4; ++k) {
            const int g = lat.map[lat.code(L + 8 * k)];
            q2[2 * ib + 0] |= uint32_t(g < 0 ? 0 : g) << (8 * k);
            q2[2 * ib + 1] |= uint32_t(signs[k]) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        std::memset(y.qs, 0, sizeof(y.qs));
        return;
    }
    const float d = max_scale / 31;
    y.d = fp32_to_fp16(d);
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / 32; ++ib)
        q2[2 * ib + 1] |= uint32_t(scale_index(id, scales[ib])) << 28;
    std::memcpy(y.qs, q2, sizeof(y.qs));
}

// IQ2_XS and IQ2_S share the search over sub-blocks of 16; they differ in sign
// storage, constants and packing.
template <bool kIsS>
void quant_block_16(const float* x, uint16_t& dh, const float* qw, const Lattice& lat,
                    int grid_idx[QK_K / 8], uint8_t signs_out[QK_K / 8],
                    uint8_t scales_out[QK_K / 32]) {
    float scales[QK_K / 16];
    float w[16], waux[16], xval[16];
    int8_t L[16];
    const GridSearch& gs = kIsS ? kSearchS : kSearchXS;

    dh = 0;
    std::memset(scales_out, 0, QK_K / 32);
    for (int i = 0; i < QK_K / 8; ++i) grid_idx[i] = 0, signs_out[i] = 0;
    const float sumx2 = sum_squares(x, QK_K);
    // ggml: XS weighs with sigma2 = mean square, S with twice that.
    const float sigma2 = kIsS ? 2 * sumx2 / QK_K : sumx2 / QK_K;
    float max_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const float* xb = x + 16 * ib;
        subblock_weights(xb, qw ? qw + 16 * ib : nullptr, 16, sigma2, 2 * sumx2 / QK_K, !kIsS, w);
        for (int i = 0; i < 16; ++i) waux[i] = sqrtf(w[i]);
        uint8_t signs[2];
        for (int k = 0; k < 2; ++k) {
            const uint8_t s = split_signs8(xb + 8 * k, w + 8 * k, !kIsS, xval + 8 * k);
            signs[k] = kIsS ? s : uint8_t(s & 127);
        }
        float max = xval[0];
        for (int i = 1; i < 16; ++i) max = max > xval[i] ? max : xval[i];
        scales[ib] = 0;
        if (max < (kIsS ? 1e-8f : 1e-15f)) continue;
        float scale = *grid_search(gs, xval, w, waux, max, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; ++k) signs[k] = uint8_t(kIsS ? ~signs[k] : ~signs[k] & 127);
        }
        for (int k = 0; k < 2; ++k) {
            const int g = lat.map[lat.code(L + 8 * k)];
            grid_idx[2 * ib + k] = g < 0 ? 0 : g;
            signs_out[2 * ib + k] = signs[k];
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        // ggml clears the indices of XS here but leaves S's as written (d = 0
        // makes them irrelevant); kept for byte-identical output.
        if (!kIsS)
            for (int i = 0; i < QK_K / 8; ++i) grid_idx[i] = 0, signs_out[i] = 0;
        return;
    }
    const float d = max_scale / 31;
    dh = fp32_to_fp16(kIsS ? d * 0.9875f : d);
    const float id = 1 / d;
    for (int ib = 0; ib < QK_K / 16; ++ib)
        scales_out[ib / 2] |= uint8_t(scale_index(id, scales[ib]) << (4 * (ib % 2)));
}

}  // namespace

// ---- IQ2_XXS: per 32 values, 4 grid bytes then a word of 4x7 sign bits and a
// 4-bit scale in the top nibble.

void dequant_iq2_xxs(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ2_XXS*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            uint32_t w[2];
            std::memcpy(w, x[i].qs + 4 * ib, 8);
            const float db = d * (0.5f + (w[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l, y += 8)
                put8(y, db, grid_bytes(iq2xxs_grid, (w[0] >> (8 * l)) & 255),
                     ksigns_iq2xs[(w[1] >> (7 * l)) & 127]);
        }
    }
}

float dot_iq2_xxs_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_XXS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d) * a[i].d;
        const int8_t* q8 = a[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            uint32_t w[2];
            std::memcpy(w, x[i].qs + 4 * ib, 8);
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8)
                sumi += dot8(grid_bytes(iq2xxs_grid, (w[0] >> (8 * l)) & 255), q8,
                             ksigns_iq2xs[(w[1] >> (7 * l)) & 127]);
            bsum += sumi * int32_t(2 * (w[1] >> 28) + 1);
        }
        sumf += d * bsum;
    }
    return 0.125f * sumf;
}

namespace {

size_t quant_rows_xxs(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat,
                      const GridSearch& search) {
    const Lattice& lat = lattice(LatticeId::IQ2_XXS);
    auto* y = static_cast<BlockIQ2_XXS*>(dst);
    const int64_t nb = n / QK_K;
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t i = 0; i < nb; ++i)
            quant_block_xxs(src + r * n + i * QK_K, y[r * nb + i], imat ? imat + i * QK_K : nullptr,
                            lat, search);
    return size_t(nrows * nb) * sizeof(BlockIQ2_XXS);
}

}  // namespace

size_t quant_iq2_xxs(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    return quant_rows_xxs(src, dst, nrows, n, imat, kSearchXXS);
}

// Fast mode: 2 of the 13 trial scales (the ends of the fan), trial groups
// snapped to the nearest grid point of their list; the final snap at the
// fitted scale searches the lists as ggml does. About 4x faster; on Gaussian
// rows its squared error is 1% above the full search's (5% for the
// imatrix-weighted error with an imatrix).
constexpr GridSearch kSearchXXSFast{LatticeId::IQ2_XXS, 32, 3,   6, 0.1f, true,
                                    Resnap::All,        12, true};

size_t quant_iq2_xxs_fast(const float* src, void* dst, int64_t nrows, int64_t n,
                          const float* imat) {
    return quant_rows_xxs(src, dst, nrows, n, imat, kSearchXXSFast);
}

// ---- IQ2_XS: per 8 values a uint16 of 9-bit grid index and 7 sign bits; two
// 4-bit scales per 32.

void dequant_iq2_xs(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ2_XS*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; ++l, y += 8) {
                const uint16_t q = x[i].qs[4 * ib + l];
                put8(y, db[l / 2], grid_bytes(iq2xs_grid, q & 511), ksigns_iq2xs[q >> 9]);
            }
        }
    }
}

float dot_iq2_xs_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_XS*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d) * a[i].d;
        const int8_t* q8 = a[i].qs;
        const uint16_t* q2 = x[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, q2 += 4) {
            for (int half = 0; half < 2; ++half) {
                const int ls = 2 * ((x[i].scales[ib] >> (4 * half)) & 0xf) + 1;
                int32_t sumi = 0;
                for (int l = 2 * half; l < 2 * half + 2; ++l, q8 += 8)
                    sumi += dot8(grid_bytes(iq2xs_grid, q2[l] & 511), q8, ksigns_iq2xs[q2[l] >> 9]);
                bsum += sumi * ls;
            }
        }
        sumf += d * bsum;
    }
    return 0.125f * sumf;
}

size_t quant_iq2_xs(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ2_XS);
    auto* y = static_cast<BlockIQ2_XS*>(dst);
    const int64_t nb = n / QK_K;
    int idx[QK_K / 8];
    uint8_t signs[QK_K / 8];
    for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = 0; i < nb; ++i) {
            BlockIQ2_XS& b = y[r * nb + i];
            quant_block_16<false>(src + r * n + i * QK_K, b.d, imat ? imat + i * QK_K : nullptr,
                                  lat, idx, signs, b.scales);
            for (int g = 0; g < QK_K / 8; ++g) b.qs[g] = uint16_t(idx[g] | (signs[g] << 9));
        }
    }
    return size_t(nrows * nb) * sizeof(BlockIQ2_XS);
}

// ---- IQ2_S: per 8 values a grid index (8 low bits in qs, 2 high bits in qh) and
// a full sign byte (second half of qs); two 4-bit scales per 32.

void dequant_iq2_s(const void* src, float* y, int64_t n) {
    const auto* x = static_cast<const BlockIQ2_S*>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, signs += 4) {
            const float db[2] = {d * (0.5f + (x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; ++l, y += 8) {
                const int idx = qs[l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                put8(y, db[l / 2], grid_bytes(iq2s_grid, idx), signs[l]);
            }
        }
    }
}

float dot_iq2_s_ref(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const BlockIQ2_S*>(vw);
    const auto* a = static_cast<const BlockQ8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_fp32(x[i].d) * a[i].d;
        const int8_t* q8 = a[i].qs;
        const uint8_t* qs = x[i].qs;
        const uint8_t* signs = x[i].qs + QK_K / 8;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 4, signs += 4) {
            int32_t sumi[2] = {0, 0};
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const int idx = qs[l] | ((x[i].qh[ib] << (8 - 2 * l)) & 0x300);
                sumi[l / 2] += dot8(grid_bytes(iq2s_grid, idx), q8, signs[l]);
            }
            bsum += (1 + 2 * (x[i].scales[ib] & 0xf)) * sumi[0] +
                    (1 + 2 * (x[i].scales[ib] >> 4)) * sumi[1];
        }
        sumf += d * bsum;
    }
    return 0.125f * sumf;
}

size_t quant_iq2_s(const float* src, void* dst, int64_t nrows, int64_t n, const float* imat) {
    const Lattice& lat = lattice(LatticeId::IQ2_S);
    auto* y = static_cast<BlockIQ2_S*>(dst);
    const int64_t nb = n / QK_K;
    int idx[QK_K / 8];
    uint8_t signs[QK_K / 8];
    for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = 0; i < nb; ++i) {
            BlockIQ2_S& b = y[r * nb + i];
            quant_block_16<true>(src + r * n + i * QK_K, b.d, imat ? imat + i * QK_K : nullptr, lat,
                                 idx, signs, b.scales);
            std::memset(b.qh, 0, sizeof(b.qh));
            for (int g = 0; g < QK_K / 8; ++g) {
                b.qs[g] = uint8_t(idx[g] & 255);
                b.qh[g / 4] |= uint8_t((idx[g] >> 8) << (2 * (g % 4)));
                b.qs[QK_K / 8 + g] = signs[g];
            }
        }
    }
    return size_t(nrows * nb) * sizeof(BlockIQ2_S);
}

}  // namespace glm5::quant::iq

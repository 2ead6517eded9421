// Every weight format decoded 32 values at a time, in code that compiles for the host
// and for a GPU (nvcc marks it __host__ __device__): a GPU thread decodes the groups
// of a row it owns, and the CPU test suite runs the same functions against the
// format's reference dequantizer on every run, so the bit layouts that are easy to
// get wrong are checked where no GPU is.
//
// Each value is formed with the reference dequantizer's operations in its order (a
// level times the sub-block's scale, minus its offset). A device compiler may fuse
// a product and a sum into one rounding; the products that read these values check
// against normalised error bounds, not bits.
//
// Blocks are read byte by byte: the 18- and 22-byte blocks of the legacy formats
// leave the wider fields unaligned, which a GPU does not forgive.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"
#include "quant/types.h"

namespace glm5::quant::groups {

constexpr int kGroup = 32;

// The i-quants' lookup tables, wherever they live (host arrays on the host, copies in
// device memory on a GPU): the functions below read them through these pointers.
struct Tables {
    const uint64_t* iq2xxs = nullptr;  // [256]
    const uint64_t* iq2xs = nullptr;   // [512]
    const uint64_t* iq2s = nullptr;    // [1024]
    const uint32_t* iq3xxs = nullptr;  // [256]
    const uint32_t* iq3s = nullptr;    // [512]
    const uint64_t* iq1s = nullptr;    // [2048]
    const uint8_t* ksigns = nullptr;   // [128]
    const int8_t* kvalues = nullptr;   // [16]
};
// The host's (quant/iq_tables.h).
Tables host_tables();

GLM5_HD uint32_t u16(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8;
}
GLM5_HD uint32_t u32(const uint8_t* p) {
    return u16(p) | u16(p + 2) << 16;
}
GLM5_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}
// A product that is rounded on its own: a device compiler may not fuse it with a sum
// that follows it, even statements later, so host and device form the same bits.
GLM5_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
// a * b + c rounded once, on the host as on the device.
GLM5_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return __builtin_fmaf(a, b, c);
#endif
}
// binary16 to float, exact (core/fp16.h's rule).
GLM5_HD float f16(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | man << 13);
    if (exp != 0) return bits_f32(sign | (exp + 112) << 23 | man << 13);
    const float v = float(man) * 5.9604644775390625e-08f;  // subnormal: man * 2^-24
    return sign ? -v : v;
}
GLM5_HD float bf16(uint32_t h) {
    return bits_f32(h << 16);
}
// A byte of a table entry: entry `idx` of a table of 64- or 32-bit words, byte j,
// in the little-endian order the host arrays are read in.
GLM5_HD int grid_byte(uint64_t word, int j) {
    return int((word >> (8 * j)) & 0xff);
}
GLM5_HD float sign_of(uint32_t signs, int j) {
    return signs & (1u << j) ? -1.f : 1.f;
}

// Values per block of a weight format that has groups (1 for the plain floats).
GLM5_HD int64_t group_block_values(Type t) {
    switch (t) {
        case Type::F32:
        case Type::F16:
        case Type::BF16:
            return 1;
        case Type::Q4_0:
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::Q8_0:
        case Type::IQ4_NL:
            return 32;
        default:
            return 256;
    }
}

// ---- the formats, one group each: y[0..32) = values 32g .. 32g+31 of the row -------

GLM5_HD void group_q4_0(const uint8_t* b, float* y) {
    const float d = f16(u16(b));
    for (int j = 0; j < 16; ++j) {
        y[j] = float(int(b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = float(int(b[2 + j] >> 4) - 8) * d;
    }
}
GLM5_HD void group_q4_1(const uint8_t* b, float* y) {
    const float d = f16(u16(b)), m = f16(u16(b + 2));
    for (int j = 0; j < 16; ++j) {
        y[j] = mul(float(b[4 + j] & 0xF), d) + m;
        y[j + 16] = mul(float(b[4 + j] >> 4), d) + m;
    }
}
GLM5_HD void group_q5_0(const uint8_t* b, float* y) {
    const float d = f16(u16(b));
    const uint32_t qh = u32(b + 2);
    for (int j = 0; j < 16; ++j) {
        const int lo = int((b[6 + j] & 0xF) | ((qh >> j) & 1) << 4);
        const int hi = int((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        y[j] = float(lo - 16) * d;
        y[j + 16] = float(hi - 16) * d;
    }
}
GLM5_HD void group_q5_1(const uint8_t* b, float* y) {
    const float d = f16(u16(b)), m = f16(u16(b + 2));
    const uint32_t qh = u32(b + 4);
    for (int j = 0; j < 16; ++j) {
        const int lo = int((b[8 + j] & 0xF) | ((qh >> j) & 1) << 4);
        const int hi = int((b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        y[j] = mul(float(lo), d) + m;
        y[j + 16] = mul(float(hi), d) + m;
    }
}
GLM5_HD void group_q8_0(const uint8_t* b, float* y) {
    const float d = f16(u16(b));
    for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}
GLM5_HD void group_iq4_nl(const uint8_t* b, float* y, const Tables& t) {
    const float d = f16(u16(b));
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(t.kvalues[b[2 + j] & 0xf]);
        y[j + 16] = d * float(t.kvalues[b[2 + j] >> 4]);
    }
}

// Q2_K (84 bytes): scales[16] | qs[64] | d | dmin. Sub-block j (16 values) has
// scale nibble scales[j] & 15 and min nibble scales[j] >> 4; its 2-bit levels sit at
// qs[32 (j / 8) + 16 (j % 2) + l], bits 2 ((j % 8) / 2).
GLM5_HD void group_q2_K(const uint8_t* b, int ib, float* y) {
    const float d = f16(u16(b + 80)), dmin = f16(u16(b + 82));
    for (int h = 0; h < 2; ++h) {
        const int j = 2 * ib + h;
        const uint8_t sc = b[j];
        const float dl = mul(d, float(sc & 0xF)), ml = mul(dmin, float(sc >> 4));
        const uint8_t* q = b + 16 + 32 * (j / 8) + 16 * (j % 2);
        const int shift = 2 * ((j % 8) / 2);
        for (int l = 0; l < 16; ++l) y[16 * h + l] = mul(dl, float((q[l] >> shift) & 3)) - ml;
    }
}
// Q3_K (110 bytes): hmask[32] | qs[64] | scales[12] | d. Sixteen 6-bit scales biased
// by 32 (low nibbles in bytes 0-7, top bits in 8-11); a cleared hmask bit subtracts 4.
GLM5_HD void group_q3_K(const uint8_t* b, int ib, float* y) {
    const float d_all = f16(u16(b + 108));
    const uint8_t* sc = b + 96;
    for (int h = 0; h < 2; ++h) {
        const int j = 2 * ib + h;
        const int low = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
        const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = d_all * float((low | high << 4) - 32);
        const int hh = j / 8, s = (j % 8) / 2, off = 16 * (j % 2);
        const uint8_t* q = b + 32 + 32 * hh + off;
        const uint8_t* hm = b + off;
        const uint32_t bit = 1u << (4 * hh + s);
        for (int l = 0; l < 16; ++l)
            y[16 * h + l] = dl * float(int((q[l] >> (2 * s)) & 3) - ((hm[l] & bit) ? 0 : 4));
    }
}
// Q4_K / Q5_K: eight 6-bit scales and mins packed in 12 bytes.
GLM5_HD void k4_scale_min(int j, const uint8_t* q, int* scale, int* min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
        *min = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}
// Q4_K (144 bytes): d | dmin | scales[12] | qs[128]; group ib is the low (even ib) or
// high (odd ib) nibbles of qs[32 (ib / 2) ..].
GLM5_HD void group_q4_K(const uint8_t* b, int ib, float* y) {
    const float d = f16(u16(b)), dmin = f16(u16(b + 2));
    int sc, m;
    k4_scale_min(ib, b + 4, &sc, &m);
    const float dl = mul(d, float(sc)), ml = mul(dmin, float(m));
    const uint8_t* q = b + 16 + 32 * (ib / 2);
    const int shift = 4 * (ib % 2);
    for (int l = 0; l < 32; ++l) y[l] = mul(dl, float((q[l] >> shift) & 0xF)) - ml;
}
// Q5_K (176 bytes): d | dmin | scales[12] | qh[32] | qs[128]; bit ib of qh[l] adds 16.
GLM5_HD void group_q5_K(const uint8_t* b, int ib, float* y) {
    const float d = f16(u16(b)), dmin = f16(u16(b + 2));
    int sc, m;
    k4_scale_min(ib, b + 4, &sc, &m);
    const float dl = mul(d, float(sc)), ml = mul(dmin, float(m));
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + 48 + 32 * (ib / 2);
    const int shift = 4 * (ib % 2);
    for (int l = 0; l < 32; ++l)
        y[l] = mul(dl, float(((q[l] >> shift) & 0xF) + ((qh[l] >> ib) & 1 ? 16 : 0))) - ml;
}
// Q6_K (210 bytes): ql[128] | qh[64] | scales[16] (int8) | d. In half hh of 128
// values, group s: low nibbles of ql[64 hh + 32 (s & 1) + l] (high ones for s >= 2),
// top bits 2s.. of qh[32 hh + l].
GLM5_HD void group_q6_K(const uint8_t* b, int ib, float* y) {
    const float d = f16(u16(b + 208));
    const int hh = ib / 4, s = ib % 4;
    const uint8_t* ql = b + 64 * hh + 32 * (s & 1);
    const uint8_t* qh = b + 128 + 32 * hh;
    for (int l = 0; l < 32; ++l) {
        const int low4 = s < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
        const int high2 = (qh[l] >> (2 * s)) & 3;
        const float sc = float(int8_t(b[192 + (32 * ib + l) / 16]));
        y[l] = d * sc * float((low4 | high2 << 4) - 32);
    }
}

// IQ2_XXS (66 bytes): d | per group a word of 4 grid indices and a word of 4x7 sign
// bits with a 4-bit scale on top.
GLM5_HD void group_iq2_xxs(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint32_t w0 = u32(b + 2 + 8 * ib), w1 = u32(b + 6 + 8 * ib);
    const float db = d * (0.5f + float(w1 >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l) {
        const uint64_t g = t.iq2xxs[(w0 >> (8 * l)) & 255];
        const uint32_t signs = t.ksigns[(w1 >> (7 * l)) & 127];
        for (int j = 0; j < 8; ++j) y[8 * l + j] = db * float(grid_byte(g, j)) * sign_of(signs, j);
    }
}
// IQ2_XS (74 bytes): d | qs[32] (uint16: 9-bit index, 7 sign bits) | scales[8].
GLM5_HD void group_iq2_xs(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint8_t sc = b[66 + ib];
    const float db[2] = {d * (0.5f + float(sc & 0xf)) * 0.25f, d * (0.5f + float(sc >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
        const uint32_t q = u16(b + 2 + 2 * (4 * ib + l));
        const uint64_t g = t.iq2xs[q & 511];
        const uint32_t signs = t.ksigns[q >> 9];
        for (int j = 0; j < 8; ++j)
            y[8 * l + j] = db[l / 2] * float(grid_byte(g, j)) * sign_of(signs, j);
    }
}
// IQ2_S (82 bytes): d | qs[64] (32 index bytes, then 32 sign bytes) | qh[8] | scales[8].
GLM5_HD void group_iq2_s(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint8_t* qs = b + 2 + 4 * ib;
    const uint8_t* signs = b + 2 + 32 + 4 * ib;
    const uint32_t qh = b[66 + ib];
    const uint8_t sc = b[74 + ib];
    const float db[2] = {d * (0.5f + float(sc & 0xf)) * 0.25f, d * (0.5f + float(sc >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
        const uint64_t g = t.iq2s[qs[l] | ((qh << (8 - 2 * l)) & 0x300)];
        for (int j = 0; j < 8; ++j)
            y[8 * l + j] = db[l / 2] * float(grid_byte(g, j)) * sign_of(signs[l], j);
    }
}
// IQ3_XXS (98 bytes): d | qs[64] grid indices (8 per group) | 8 words of 4x7 sign bits
// and a 4-bit scale.
GLM5_HD void group_iq3_xxs(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint8_t* qs = b + 2 + 8 * ib;
    const uint32_t sas = u32(b + 2 + 64 + 4 * ib);
    const float db = d * (0.5f + float(sas >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
        const uint32_t signs = t.ksigns[(sas >> (7 * l)) & 127];
        const uint32_t g1 = t.iq3xxs[qs[2 * l]], g2 = t.iq3xxs[qs[2 * l + 1]];
        for (int j = 0; j < 4; ++j) {
            y[8 * l + j] = db * float(grid_byte(g1, j)) * sign_of(signs, j);
            y[8 * l + j + 4] = db * float(grid_byte(g2, j)) * sign_of(signs, j + 4);
        }
    }
}
// IQ3_S (110 bytes): d | qs[64] | qh[8] | signs[32] | scales[4].
GLM5_HD void group_iq3_s(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint8_t* qs = b + 2 + 8 * ib;
    const uint32_t qh = b[66 + ib];
    const uint8_t* signs = b + 74 + 4 * ib;
    const float db = d * float(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xf));
    for (int l = 0; l < 4; ++l) {
        const uint32_t g1 = t.iq3s[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
        const uint32_t g2 = t.iq3s[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
        for (int j = 0; j < 4; ++j) {
            y[8 * l + j] = db * float(grid_byte(g1, j)) * sign_of(signs[l], j);
            y[8 * l + j + 4] = db * float(grid_byte(g2, j)) * sign_of(signs[l], j + 4);
        }
    }
}
// IQ1_S (50 bytes): d | qs[32] (low 8 index bits) | qh[8] (uint16: 4x3 high index bits,
// a 3-bit scale, the delta's sign).
GLM5_HD void group_iq1_s(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint8_t* qs = b + 2 + 4 * ib;
    const uint32_t qh = u16(b + 34 + 2 * ib);
    const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -0.125f : 0.125f;
    for (int l = 0; l < 4; ++l) {
        const uint64_t g = t.iq1s[qs[l] | ((qh >> (3 * l)) & 7) << 8];
        for (int j = 0; j < 8; ++j) y[8 * l + j] = dl * (float(int8_t(grid_byte(g, j))) + delta);
    }
}
// IQ1_M (56 bytes): qs[32] | qh[16] | scales[8] (four uint16: 3-bit scales, and the
// fp16 super-block scale in their top nibbles).
GLM5_HD void group_iq1_m(const uint8_t* b, int ib, float* y, const Tables& t) {
    const uint8_t* sp = b + 48;
    const uint32_t s0 = u16(sp), s1 = u16(sp + 2), s2 = u16(sp + 4), s3 = u16(sp + 6);
    const float d = f16((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000));
    const uint32_t sc = u16(sp + 2 * (ib / 2));
    const float dl[2] = {d * float(2 * ((sc >> (6 * (ib % 2) + 0)) & 0x7) + 1),
                         d * float(2 * ((sc >> (6 * (ib % 2) + 3)) & 0x7) + 1)};
    const uint8_t* qs = b + 4 * ib;
    const uint8_t* qh = b + 32 + 2 * ib;
    for (int l = 0; l < 4; ++l) {
        const uint32_t h = qh[l / 2];
        const uint32_t idx = qs[l] | ((h << (l % 2 ? 4 : 8)) & 0x700);
        const float delta = h & (l % 2 ? 0x80 : 0x08) ? -0.125f : 0.125f;
        const uint64_t g = t.iq1s[idx];
        for (int j = 0; j < 8; ++j)
            y[8 * l + j] = dl[l / 2] * (float(int8_t(grid_byte(g, j))) + delta);
    }
}
// IQ4_XS (136 bytes): d | scales_h (uint16, 2 bits per group) | scales_l[4] | qs[128].
GLM5_HD void group_iq4_xs(const uint8_t* b, int ib, float* y, const Tables& t) {
    const float d = f16(u16(b));
    const uint32_t sh = u16(b + 2);
    const int ls = int(((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | ((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * float(ls - 32);
    const uint8_t* qs = b + 8 + 16 * ib;
    for (int j = 0; j < 16; ++j) {
        y[j] = dl * float(t.kvalues[qs[j] & 0xf]);
        y[j + 16] = dl * float(t.kvalues[qs[j] >> 4]);
    }
}

// Bytes of one block of t's (32 values for the plain floats), 0 for a type without
// groups here; with group_block_values, where group g of a row starts.
GLM5_HD int64_t group_block_bytes(Type t) {
    switch (t) {
        case Type::F32:
            return 128;
        case Type::F16:
        case Type::BF16:
            return 64;
        case Type::Q4_0:
            return 18;
        case Type::Q4_1:
            return 20;
        case Type::Q5_0:
            return 22;
        case Type::Q5_1:
            return 24;
        case Type::Q8_0:
            return 34;
        case Type::IQ4_NL:
            return 18;
        case Type::Q2_K:
            return 84;
        case Type::Q3_K:
            return 110;
        case Type::Q4_K:
            return 144;
        case Type::Q5_K:
            return 176;
        case Type::Q6_K:
            return 210;
        case Type::IQ2_XXS:
            return 66;
        case Type::IQ2_XS:
            return 74;
        case Type::IQ2_S:
            return 82;
        case Type::IQ3_XXS:
            return 98;
        case Type::IQ3_S:
            return 110;
        case Type::IQ1_S:
            return 50;
        case Type::IQ1_M:
            return 56;
        case Type::IQ4_XS:
            return 136;
        default:
            return 0;
    }
}

// Whether decode_group knows t.
GLM5_HD bool has_groups(Type t) {
    return group_block_bytes(t) != 0;
}

// The values group g of a row of `cols` values holds: 32, but for the last group of a
// float row whose length is not a multiple of 32 (the block formats' rows are whole groups).
GLM5_HD int group_values(int64_t cols, int64_t g) {
    const int64_t left = cols - kGroup * g;
    return left < kGroup ? int(left) : kGroup;
}
// The groups of a row of `cols` values, the last one maybe partial.
GLM5_HD int64_t row_groups(int64_t cols) {
    return (cols + kGroup - 1) / kGroup;
}

// Values 32g .. 32g+n-1 of a row of `t` starting at `row` (n < 32 only for the last group
// of a float row: values past it are neither read nor written). Returns false for a type
// that is not a weight format here (the caller refuses such weights at registration).
GLM5_HD bool decode_group(Type t, const uint8_t* row, int64_t g, const Tables& tab, float* y,
                          int n = kGroup) {
    // The block holding group g, and g's place in it (K- and i-quant blocks hold 8).
    const int64_t per_block = group_block_values(t) <= 32 ? 1 : 8;
    const uint8_t* b = row + group_block_bytes(t) * (g / per_block);
    const int ib = int(g % per_block);
    switch (t) {
        // (32 steps, the tail's predicated: constant indices keep y in a GPU's registers.)
        case Type::F32:
            for (int j = 0; j < kGroup; ++j) y[j] = j < n ? bits_f32(u32(b + 4 * j)) : 0.f;
            return true;
        case Type::F16:
            for (int j = 0; j < kGroup; ++j) y[j] = j < n ? f16(u16(b + 2 * j)) : 0.f;
            return true;
        case Type::BF16:
            for (int j = 0; j < kGroup; ++j) y[j] = j < n ? bf16(u16(b + 2 * j)) : 0.f;
            return true;
        case Type::Q4_0:
            group_q4_0(b, y);
            return true;
        case Type::Q4_1:
            group_q4_1(b, y);
            return true;
        case Type::Q5_0:
            group_q5_0(b, y);
            return true;
        case Type::Q5_1:
            group_q5_1(b, y);
            return true;
        case Type::Q8_0:
            group_q8_0(b, y);
            return true;
        case Type::IQ4_NL:
            group_iq4_nl(b, y, tab);
            return true;
        case Type::Q2_K:
            group_q2_K(b, ib, y);
            return true;
        case Type::Q3_K:
            group_q3_K(b, ib, y);
            return true;
        case Type::Q4_K:
            group_q4_K(b, ib, y);
            return true;
        case Type::Q5_K:
            group_q5_K(b, ib, y);
            return true;
        case Type::Q6_K:
            group_q6_K(b, ib, y);
            return true;
        case Type::IQ2_XXS:
            group_iq2_xxs(b, ib, y, tab);
            return true;
        case Type::IQ2_XS:
            group_iq2_xs(b, ib, y, tab);
            return true;
        case Type::IQ2_S:
            group_iq2_s(b, ib, y, tab);
            return true;
        case Type::IQ3_XXS:
            group_iq3_xxs(b, ib, y, tab);
            return true;
        case Type::IQ3_S:
            group_iq3_s(b, ib, y, tab);
            return true;
        case Type::IQ1_S:
            group_iq1_s(b, ib, y, tab);
            return true;
        case Type::IQ1_M:
            group_iq1_m(b, ib, y, tab);
            return true;
        case Type::IQ4_XS:
            group_iq4_xs(b, ib, y, tab);
            return true;
        default:
            return false;
    }
}

// One group's share of a row product: its n values against x[0..n) as a chain of fused
// multiply-adds in order, from `acc`.
GLM5_HD float group_dot(const float* w, const float* x, float acc, int n = kGroup) {
    for (int j = 0; j < kGroup; ++j)
        if (j < n) acc = fma(w[j], x[j], acc);
    return acc;
}

// A row's product as the GPU's vector kernel forms it: lane l of a warp of 32 takes
// groups l, l + 32, l + 64, ... in turn, then the lanes' sums meet in a butterfly
// (lane i adds lane i ^ 16's sum, then i ^ 8's, ... i ^ 1's). The shape of the sum
// depends on the row's length alone, never on how many rows or tokens share a
// launch; this host form is what the device's results are checked against, bit for
// bit. A float row whose length is not a multiple of 32 ends in a partial group. False for
// a type without groups.
GLM5_HD bool row_dot(Type t, const uint8_t* row, int64_t cols, const float* x, const Tables& tab,
                     float* out) {
    float lane[32];
    float w[32];
    for (int l = 0; l < 32; ++l) {
        float acc = 0.f;
        for (int64_t g = l; g < row_groups(cols); g += 32) {
            const int n = group_values(cols, g);
            if (!decode_group(t, row, g, tab, w, n)) return false;
            acc = group_dot(w, x + 32 * g, acc, n);
        }
        lane[l] = acc;
    }
    for (int off = 16; off >= 1; off /= 2) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
        for (int l = 0; l < 32; ++l) lane[l] = next[l];
    }
    *out = lane[0];
    return true;
}

}  // namespace glm5::quant::groups

// Internal helpers shared by the quantization families (float, legacy, k-quants,
// i-quants). Small on purpose: only what several families need to reproduce
// ggml's arithmetic bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace glm5::quant {

// ggml's reference quantizers never let a group with a maximum below this
// produce a scale (the group is all zeros).
constexpr float kGroupMaxEps = 1e-15f;

// Round to the nearest integer, ties to even, exactly as ggml's quantizers do:
// adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits. Valid
// for |x| < 2^22, which every caller guarantees by construction.
inline int nearest_int(float x) {
    const float biased = x + 12582912.0f;
    uint32_t bits;
    std::memcpy(&bits, &biased, sizeof bits);
    return int(bits & 0x7fffffu) - 0x400000;
}

// An optimisation barrier for one float: the compiler cannot fuse a product
// that passes through it with a later add (an FMA rounds once instead of
// twice, which would change results that must match a scalar reference).
inline float unfused(float v) {
    asm("" : "+x"(v));
    return v;
}

// Q4_K / Q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes:
// bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7,
// bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of scales/mins 4-7.
inline void unpack_k4_scale_min(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *min = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// All eight scales and mins at once (scales[0..7], mins[0..7]).
inline void unpack_k4_scales(const uint8_t* q, uint8_t* scales, uint8_t* mins) {
    for (int j = 0; j < 8; ++j) unpack_k4_scale_min(j, q, &scales[j], &mins[j]);
}

// Q3_K packs sixteen 6-bit scales (stored with a +32 bias) into 12 bytes:
// bytes 0-7 hold the low nibbles (scale j in byte j%8, high nibble for j>=8),
// bytes 8-11 the top 2 bits (scale j at byte 8 + j%4, bit 2*(j/4)).
inline void unpack_q3k_scales(const uint8_t* q, int8_t* scales) {
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? (q[j] & 0xF) : (q[j - 8] >> 4);
        const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        scales[j] = int8_t((low | (high << 4)) - 32);
    }
}

}  // namespace glm5::quant

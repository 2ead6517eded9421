// IEEE binary16 and bfloat16 conversions, bit-exact with the hardware
// (round to nearest even, NaN stays NaN). The scalar versions here are the
// reference; SIMD kernels use F16C where the CPU has it.
#pragma once

#include <cstdint>
#include <cstring>

namespace glm5 {

inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / nan
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0) return f32_from_bits(sign);
    // Subnormal: value = man * 2^-24, exact in float.
    const float v = float(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
}

inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00);   // NaN -> quiet NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
    if (ax >= 0x38800000u) {                                // normal half
        // Re-bias the exponent, then round the 13 dropped mantissa bits to nearest even.
        uint32_t v = ax - 0x38000000u;
        const uint32_t rest = v & 0x1fffu;
        v >>= 13;
        if (rest > 0x1000u || (rest == 0x1000u && (v & 1))) v += 1;
        return uint16_t(sign | v);
    }
    if (ax < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
    // Subnormal half: shift the full significand, round to nearest even.
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t v = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (v & 1))) v += 1;
    return uint16_t(sign | v);
}

inline float bf16_to_fp32(uint16_t h) {
    return f32_from_bits(uint32_t(h) << 16);
}

inline uint16_t fp32_to_bf16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 64);  // quiet NaN
    return uint16_t((x + (0x7fffu + ((x >> 16) & 1))) >> 16);
}

// Round a float through binary16 and back (what an F16 matmul does to its input).
inline float round_fp16(float f) {
    return fp16_to_fp32(fp32_to_fp16(f));
}

}  // namespace glm5

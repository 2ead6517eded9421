// CUDA's half and bfloat16 types for the simulation build: the storage formats and their
// conversions, round to nearest even as the GPU's __float2half_rn and __float2bfloat16_rn
// (a NaN becomes the canonical quiet NaN, as there).
#pragma once

#include <cstdint>
#include <cstring>

struct __half_raw {
    unsigned short x;
};
struct __half {
    unsigned short __x;
    __half() = default;
    constexpr __half(__half_raw r) : __x(r.x) {}
    constexpr operator __half_raw() const { return {__x}; }
};
struct __nv_bfloat16_raw {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
    constexpr operator __nv_bfloat16_raw() const { return {__x}; }
};

namespace cudasim::detail {
inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
}  // namespace cudasim::detail

inline __half __float2half_rn(float f) {
    using namespace cudasim::detail;
    const uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    uint16_t h;
    if (ax > 0x7f800000u) {
        h = 0x7fff;  // NaN: CUDA's canonical half NaN, sign dropped
        return __half_raw{h};
    }
    if (ax >= 0x477ff000u) {
        h = uint16_t(sign | 0x7c00u);  // rounds to 65520 or more: infinity
    } else if (ax >= 0x38800000u) {
        uint32_t v = ax - 0x38000000u;
        const uint32_t rest = v & 0x1fffu;
        v >>= 13;
        if (rest > 0x1000u || (rest == 0x1000u && (v & 1))) v += 1;
        h = uint16_t(sign | v);
    } else if (ax < 0x33000000u) {
        h = sign;
    } else {
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t v = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (v & 1))) v += 1;
        h = uint16_t(sign | v);
    }
    return __half_raw{h};
}
inline __half __float2half(float f) {
    return __float2half_rn(f);
}
inline float __half2float(__half h) {
    using namespace cudasim::detail;
    const uint32_t sign = uint32_t(h.__x & 0x8000u) << 16, exp = (h.__x >> 10) & 0x1fu,
                   man = h.__x & 0x3ffu;
    if (exp == 0x1f) return f32_of(sign | 0x7f800000u | man << 13);
    if (exp != 0) return f32_of(sign | (exp + 112) << 23 | man << 13);
    const float v = float(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
}
inline unsigned short __half_as_ushort(__half h) {
    return h.__x;
}
inline __half __ushort_as_half(unsigned short u) {
    return __half_raw{u};
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    using namespace cudasim::detail;
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16_raw{0x7fff};
    const uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
    return __nv_bfloat16_raw{uint16_t(r >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    return __float2bfloat16_rn(f);
}
inline float __bfloat162float(__nv_bfloat16 b) {
    return cudasim::detail::f32_of(uint32_t(b.__x) << 16);
}

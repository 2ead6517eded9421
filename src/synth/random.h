// Counter-based random numbers for the synthetic model generator.
//
// Every value is a pure function of (tensor seed, element index), so any
// tensor, row or chunk can be generated on any thread in any order and the
// bytes never change. Only integer arithmetic and at most one float multiply
// per value are used: an integer converts to float exactly, and a single
// IEEE multiply rounds the same everywhere (no libm, nothing a compiler could
// fuse into an FMA), so the output is identical on every platform.
#pragma once

#include <cstdint>
#include <string_view>

namespace glm5::synth {

// splitmix64's output function: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The i-th 64-bit draw of stream `seed` (splitmix64 evaluated at position i).
inline uint64_t draw64(uint64_t seed, uint64_t i) {
    return mix64(seed + (i + 1) * 0x9e3779b97f4a7c15ull);
}

// FNV-1a of a name, mixed with the user seed: the stream of one tensor.
inline uint64_t stream_seed(uint64_t seed, std::string_view name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed));
}

// Sum of the four 16-bit lanes of x.
inline uint32_t sum_u16_lanes(uint64_t x) {
    const uint64_t pairs = (x & 0x0000ffff0000ffffull) + ((x >> 16) & 0x0000ffff0000ffffull);
    return uint32_t((pairs & 0xffffffffull) + (pairs >> 32));
}

// Irwin–Hall(12) approximation of a standard normal, in fixed point.
//
// The sum of 12 independent uniforms on {0..65535} has mean 12*65535/2 and
// variance 12*(65536^2-1)/12 = 65536^2 - 1, so (sum - mean) / 65536 has mean 0
// and variance 1 - 2^-32. Its density is within 0.3% of the normal's over
// |z| < 3, its excess kurtosis is -0.1, and it is bounded by |z| <= 6. The
// result is returned unscaled (an exact integer in [-393210, 393210]); callers
// turn it into a float with one multiply by scale/65536.
constexpr int32_t kNormalMean = 6 * 65535;
constexpr float kNormalUnit = 1.0f / 65536.0f;

inline int32_t normal_fixed(uint64_t seed, uint64_t i) {
    const uint32_t s = sum_u16_lanes(draw64(seed, 3 * i)) + sum_u16_lanes(draw64(seed, 3 * i + 1)) +
                       sum_u16_lanes(draw64(seed, 3 * i + 2));
    return int32_t(s) - kNormalMean;
}

}  // namespace glm5::synth

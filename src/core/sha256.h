// SHA-256 (FIPS 180-4), for content keys that must not collide even when a
// client chooses the bytes (the prefix cache's image keys).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace glm5 {

using Sha256 = std::array<uint8_t, 32>;
Sha256 sha256(std::span<const uint8_t> data);
std::string to_hex(const Sha256& d);

}  // namespace glm5

// Number formatting shared by every machine-readable output.
#pragma once

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

namespace glm5 {

// The shortest decimal that reads back to the same float32 (JSON-safe:
// non-finite values become null, since JSON has no inf/nan).
inline void append_float(std::string& out, float v) {
    if (!std::isfinite(v)) {
        out += "null";
        return;
    }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
}

inline std::string float_array_json(const float* v, size_t n) {
    std::string s;
    s.reserve(n * 12 + 2);
    s += '[';
    for (size_t i = 0; i < n; ++i) {
        if (i) s += ',';
        append_float(s, v[i]);
    }
    s += ']';
    return s;
}

// "1.5 GiB"-style sizes for humans.
std::string human_bytes(double bytes);

}  // namespace glm5

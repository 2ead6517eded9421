#include "text/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

#include "text/unicode_tables.h"

namespace glm5::text {

namespace {

// ASCII classes are looked up on nearly every byte of a prompt: keep them in a table
// built from the same generated ranges.
struct AsciiClasses {
    std::array<CharClass, 128> cls{};
    AsciiClasses() {
        for (uint32_t cp = 0; cp < 128; ++cp) cls[cp] = CharClass::Other;
        const auto& r = unicode_data::kClassRanges;
        for (size_t i = 0; i < std::size(r); ++i) {
            uint32_t first = r[i] >> 8;
            uint32_t end = i + 1 < std::size(r) ? (r[i + 1] >> 8) : 0x110000;
            for (uint32_t cp = first; cp < end && cp < 128; ++cp)
                cls[cp] = static_cast<CharClass>(r[i] & 0xFF);
            if (first >= 128) break;
        }
    }
};

const AsciiClasses& ascii_classes() {
    static const AsciiClasses t;
    return t;
}

// Valid range of the second byte for a lead byte, or {0,0} when the lead is invalid.
// Table 3-7 of the Unicode standard.
struct Lead {
    uint8_t len;
    uint8_t lo, hi;  // second byte bounds
};

inline Lead lead_info(uint8_t b) {
    if (b < 0x80) return {1, 0, 0};
    if (b < 0xC2) return {0, 0, 0};
    if (b < 0xE0) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b < 0xF0) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b < 0xF4) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

inline bool is_cont(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

}  // namespace

CharClass char_class(uint32_t cp) {
    if (cp < 128) return ascii_classes().cls[cp];
    if (cp >= 0x110000) return CharClass::Other;
    const auto& r = unicode_data::kClassRanges;
    // Last entry whose first code point is <= cp.
    const uint32_t key = (cp << 8) | 0xFF;
    auto it = std::upper_bound(std::begin(r), std::end(r), key);
    return static_cast<CharClass>(*(it - 1) & 0xFF);
}

Utf8Unit utf8_decode(std::string_view s, size_t pos) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
    const size_t avail = s.size() - pos;
    const uint8_t b0 = p[0];
    if (b0 < 0x80) return {b0, 1, true};
    const Lead L = lead_info(b0);
    if (L.len == 0) return {b0, 1, false};
    if (avail < 2 || p[1] < L.lo || p[1] > L.hi) return {b0, 1, false};
    if (L.len == 2) return {uint32_t(b0 & 0x1F) << 6 | (p[1] & 0x3F), 2, true};
    if (avail < 3 || !is_cont(p[2])) return {b0, 2, false};
    if (L.len == 3)
        return {uint32_t(b0 & 0x0F) << 12 | uint32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F), 3, true};
    if (avail < 4 || !is_cont(p[3])) return {b0, 3, false};
    return {uint32_t(b0 & 0x07) << 18 | uint32_t(p[1] & 0x3F) << 12 | uint32_t(p[2] & 0x3F) << 6 |
                (p[3] & 0x3F),
            4, true};
}

size_t utf8_incomplete_tail(std::string_view s, size_t pos) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
    const size_t avail = s.size() - pos;
    if (avail == 0) return 0;
    const Lead L = lead_info(p[0]);
    if (L.len <= 1 || avail >= L.len) return 0;
    if (avail >= 2 && (p[1] < L.lo || p[1] > L.hi)) return 0;
    if (avail >= 3 && !is_cont(p[2])) return 0;
    return avail;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        Utf8Unit u = utf8_decode(s, i);
        if (!u.valid) return false;
        i += u.len;
    }
    return true;
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        Utf8Unit u = utf8_decode(s, i);
        if (u.valid)
            out.append(s.substr(i, u.len));
        else
            out.append("\xEF\xBF\xBD");
        i += u.len;
    }
    return out;
}

bool is_python_space(uint32_t cp) {
    return (cp >= 0x1C && cp <= 0x1F) || char_class(cp) == CharClass::Space;
}

std::string_view python_strip(std::string_view s) {
    size_t b = 0;
    while (b < s.size()) {
        Utf8Unit u = utf8_decode(s, b);
        if (!u.valid || !is_python_space(u.cp)) break;
        b += u.len;
    }
    // Walk back over whole code points: find each unit's start from the right.
    size_t e = s.size();
    while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80 && e - start < 4)
            --start;
        Utf8Unit u = utf8_decode(s, start);
        if (!u.valid || start + u.len != e || !is_python_space(u.cp)) break;
        e = start;
    }
    return s.substr(b, e - b);
}

}  // namespace glm5::text

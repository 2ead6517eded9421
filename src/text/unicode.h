// UTF-8 and character-class helpers for the text layer: what the GLM pre-tokenizer needs
// (letter / number / white space classes from the generated table in unicode_tables.h),
// strict UTF-8 decoding, and the U+FFFD policy used wherever bytes must become valid text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace glm5::text {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

// \p{L}, \p{N}, \s (Unicode White_Space) or anything else. Code points above U+10FFFF
// are Other.
CharClass char_class(uint32_t cp);

// One decoded unit of a byte string. Invalid bytes decode one at a time with `valid`
// false (their cp is the byte value and they class as Other).
struct Utf8Unit {
    uint32_t cp = 0;
    uint8_t len = 0;  // bytes consumed, 1..4
    bool valid = false;
};

// Decodes the unit at s[pos] (pos < s.size()), following the well-formed byte
// sequences of the Unicode standard (no overlongs, no surrogates, nothing above
// U+10FFFF).
Utf8Unit utf8_decode(std::string_view s, size_t pos);

// How many bytes at s[pos] could still become a valid sequence if more bytes arrived:
// 0 when s[pos..] already starts with a complete or an invalid sequence, otherwise the
// number of bytes of an incomplete but so far well-formed prefix (1..3, reaching the end).
size_t utf8_incomplete_tail(std::string_view s, size_t pos);

void append_utf8(std::string& out, uint32_t cp);

bool is_valid_utf8(std::string_view s);

// Replaces every maximal ill-formed subsequence with U+FFFD (the Unicode "maximal subpart"
// practice, as Python's and browsers' decoders do). Valid text comes back unchanged.
std::string sanitize_utf8(std::string_view s);

// Python's str.isspace() on a code point (White_Space plus U+001C..U+001F), which is what
// Jinja's strip() removes in chat templates.
bool is_python_space(uint32_t cp);

// Python's str.strip() on UTF-8 text (invalid bytes are never stripped).
std::string_view python_strip(std::string_view s);

}  // namespace glm5::text

#include "text/pretokenize.h"

#include <cstdint>

#include "text/unicode.h"

namespace glm5::text {

namespace {

struct Unit {
    uint32_t cp;
    uint32_t offset;  // byte offset of the unit in the text
    CharClass cls;
};

// Class of a position past the end: none of letter / number / space, and no code point.
constexpr uint32_t kEnd = 0xFFFFFFFFu;

inline uint32_t ascii_lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

}  // namespace

void pretokenize_glm4(std::string_view text, std::vector<std::string_view>& pieces) {
    if (text.empty()) return;
    std::vector<Unit> u;
    u.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
        Utf8Unit d = utf8_decode(text, i);
        // An invalid byte sequence is one "other" unit; kEnd-1 keeps it distinct from any
        // code point the rules test for.
        u.push_back({d.valid ? d.cp : 0xFFFFFFFEu, uint32_t(i),
                     d.valid ? char_class(d.cp) : CharClass::Other});
        i += d.len;
    }
    const size_t n = u.size();
    u.push_back({kEnd, uint32_t(text.size()), CharClass::Other});  // sentinel

    auto cp = [&](size_t p) { return p < n ? u[p].cp : kEnd; };
    auto is = [&](size_t p, CharClass c) { return p < n && u[p].cls == c; };
    auto is_rn = [&](size_t p) { return p < n && (u[p].cp == '\r' || u[p].cp == '\n'); };
    // [^\s\p{L}\p{N}]: in range and of class Other.
    auto is_punct = [&](size_t p) { return p < n && u[p].cls == CharClass::Other; };

    size_t start = 0;  // first unit of the piece being built
    auto emit = [&](size_t end) {
        if (end > start)
            pieces.push_back(text.substr(u[start].offset, u[end].offset - u[start].offset));
        start = end;
    };

    size_t pos = 0;
    while (pos < n) {
        const uint32_t c = u[pos].cp;
        const CharClass cls = u[pos].cls;

        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if (c == '\'' && pos + 1 < n) {
            const uint32_t c1 = ascii_lower(cp(pos + 1));
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                emit(pos);
                continue;
            }
            if (pos + 2 < n) {
                const uint32_t c2 = ascii_lower(cp(pos + 2));
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    emit(pos);
                    continue;
                }
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (c != '\r' && c != '\n' && cls != CharClass::Number &&
            (cls == CharClass::Letter || is(pos + 1, CharClass::Letter))) {
            ++pos;
            while (is(pos, CharClass::Letter)) ++pos;
            emit(pos);
            continue;
        }

        // \p{N}{1,3}
        if (cls == CharClass::Number) {
            size_t run = 0;
            while (is(pos, CharClass::Number)) {
                ++pos;
                if (++run == 3) {
                    emit(pos);
                    run = 0;
                }
            }
            emit(pos);
            continue;
        }

        // ' ?[^\s\p{L}\p{N}]+[\r\n]*': a leading space only when something non-space,
        // non-letter, non-number follows it (or the text ends, which the space rules below
        // would split the same way).
        const bool space_lead = (c == ' ');
        const size_t q = space_lead ? pos + 1 : pos;
        if (q >= n ? space_lead : is_punct(q)) {
            pos = q;
            while (is_punct(pos)) ++pos;
            while (is_rn(pos)) ++pos;
            emit(pos);
            continue;
        }

        // \s*[\r\n]+ | \s+(?!\S) | \s+
        size_t ws = 0, last_rn_end = 0;
        while (is(pos + ws, CharClass::Space)) {
            if (is_rn(pos + ws)) last_rn_end = pos + ws + 1;
            ++ws;
        }
        if (last_rn_end > 0) {
            pos = last_rn_end;
        } else if (ws > 1 && pos + ws < n) {
            pos += ws - 1;  // leave the last space to prefix the next word
        } else if (ws > 0) {
            pos += ws;
        } else {
            ++pos;  // not reachable with the classes above; keeps the loop total
        }
        emit(pos);
    }
}

}  // namespace glm5::text

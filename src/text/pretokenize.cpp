#include "text/pretokenize.h"

#include <algorithm>
#include <cstdint>

#include "text/unicode.h"

namespace glm5::text {

namespace {

struct Unit {
    uint32_t cp;
    size_t offset;  // byte offset of the unit in the text
    CharClass cls;
};

// Class of a position past the end: none of letter / number / space, and no code point.
constexpr uint32_t kEnd = 0xFFFFFFFFu;

inline uint32_t ascii_lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

// The text's units, decoded as the scanner reaches them and forgotten once the piece
// they belong to is emitted: memory follows the longest piece, not the text.
class Units {
  public:
    Units(std::string_view text, size_t max_piece_bytes)
        : text_(text), max_piece_(max_piece_bytes) {}

    // Unit p exists (decoding up to it); false past the end of the text, or past
    // the piece byte bound (overflowed()).
    bool have(size_t p) {
        while (base_ + buf_.size() <= p) {
            if (next_ >= text_.size()) return false;
            if (next_ - piece_offset_ > max_piece_) {
                overflow_ = true;
                return false;
            }
            const Utf8Unit d = utf8_decode(text_, next_);
            // An invalid byte sequence is one "other" unit; kEnd-1 keeps it distinct from
            // any code point the rules test for.
            buf_.push_back({d.valid ? d.cp : 0xFFFFFFFEu, next_,
                            d.valid ? char_class(d.cp) : CharClass::Other});
            next_ += d.len;
        }
        return true;
    }
    const Unit& operator[](size_t p) const { return buf_[p - base_]; }
    // Byte offset of unit p (the text's end past the last unit).
    size_t offset(size_t p) { return have(p) ? (*this)[p].offset : next_; }
    // A piece starts at unit p: the units before it are no longer needed.
    void start_piece(size_t p) {
        piece_offset_ = offset(p);
        const size_t drop = std::min(p - base_, buf_.size());
        if (drop >= 4096 && drop * 2 >= buf_.size()) {
            buf_.erase(buf_.begin(), buf_.begin() + ptrdiff_t(drop));
            base_ += drop;
        }
    }
    bool overflowed() const { return overflow_; }

  private:
    std::string_view text_;
    size_t max_piece_;
    std::vector<Unit> buf_;
    size_t base_ = 0;          // buf_[0] is unit base_
    size_t next_ = 0;          // byte offset of the next unit to decode
    size_t piece_offset_ = 0;  // byte offset of the piece being scanned
    bool overflow_ = false;
};

}  // namespace

bool pretokenize_glm4(std::string_view text, const std::function<bool(std::string_view)>& piece,
                      size_t max_piece_bytes) {
    if (text.empty()) return true;
    Units u(text, max_piece_bytes);
    auto cp = [&](size_t p) { return u.have(p) ? u[p].cp : kEnd; };
    auto is = [&](size_t p, CharClass c) { return u.have(p) && u[p].cls == c; };
    auto is_rn = [&](size_t p) { return u.have(p) && (u[p].cp == '\r' || u[p].cp == '\n'); };
    // [^\s\p{L}\p{N}]: in range and of class Other.
    auto is_punct = [&](size_t p) { return u.have(p) && u[p].cls == CharClass::Other; };

    size_t start = 0;  // first unit of the piece being built
    bool more = true;
    auto emit = [&](size_t end) {
        if (end > start && !u.overflowed()) {
            const size_t b = u.offset(start);
            more = piece(text.substr(b, u.offset(end) - b));
        }
        start = end;
        u.start_piece(start);
    };

    size_t pos = 0;
    while (more && !u.overflowed() && u.have(pos)) {
        const uint32_t c = u[pos].cp;
        const CharClass cls = u[pos].cls;

        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if (c == '\'' && u.have(pos + 1)) {
            const uint32_t c1 = ascii_lower(cp(pos + 1));
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                pos += 2;
                emit(pos);
                continue;
            }
            if (u.have(pos + 2)) {
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
        if (!u.have(q) ? space_lead : is_punct(q)) {
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
        } else if (ws > 1 && u.have(pos + ws)) {
            pos += ws - 1;  // leave the last space to prefix the next word
        } else if (ws > 0) {
            pos += ws;
        } else {
            ++pos;  // not reachable with the classes above; keeps the loop total
        }
        emit(pos);
    }
    return more && !u.overflowed();
}

void pretokenize_glm4(std::string_view text, std::vector<std::string_view>& pieces) {
    pretokenize_glm4(text, [&](std::string_view p) {
        pieces.push_back(p);
        return true;
    });
}

}  // namespace glm5::text

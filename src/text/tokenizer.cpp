#include "text/tokenizer.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "core/error.h"
#include "text/pretokenize.h"
#include "text/unicode.h"

namespace glm5::text {

namespace {

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the other 68 bytes
// (controls, space, DEL, the C1 range, NBSP, soft hyphen) take code points 256, 257, ... in
// byte order, so every byte has a visible, non-space character.
struct ByteMap {
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];  // -1 where the code point is not a byte's character

    ByteMap() {
        std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t(-1));
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable =
                (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            byte_to_cp[b] = printable ? b : next++;
            cp_to_byte[byte_to_cp[b]] = int16_t(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

std::string byte_char(uint8_t b) {
    std::string s;
    append_utf8(s, byte_map().byte_to_cp[b]);
    return s;
}

// The bytes a byte-level BPE token string stands for. Characters outside the byte map
// (never in a well-formed vocabulary) are kept as their own UTF-8.
std::string byte_decode(std::string_view text) {
    // Printable ASCII stands for itself: most tokens need no decoding.
    bool plain = true;
    for (char c : text) plain &= (c >= 0x21 && c <= 0x7E);
    if (plain) return std::string(text);
    std::string out;
    out.reserve(text.size());
    const auto& m = byte_map();
    for (size_t i = 0; i < text.size();) {
        Utf8Unit u = utf8_decode(text, i);
        if (u.valid && u.cp < std::size(m.cp_to_byte) && m.cp_to_byte[u.cp] >= 0)
            out.push_back(char(m.cp_to_byte[u.cp]));
        else
            out.append(text.substr(i, u.len));
        i += u.len;
    }
    return out;
}

// A power of two with room to spare (load factor <= 1/2).
size_t table_size(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c <<= 1;
    return c;
}

inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

bool renders_raw(TokenType t) {
    return t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

Tokenizer::Tokenizer(VocabData d) : tokens_(std::move(d.tokens)), types_(std::move(d.types)) {
    if (d.pre != "glm4" && d.pre != "chatglm-bpe")
        throw Error("tokenizer: pre-tokenizer '" + d.pre +
                    "' is not supported (expected 'glm4' or 'chatglm-bpe')");
    if (tokens_.empty()) throw Error("tokenizer: empty vocabulary");
    if (tokens_.size() > size_t(INT32_MAX) / 2) throw Error("tokenizer: vocabulary too large");
    const int32_t n = n_vocab();
    if (types_.empty()) types_.assign(tokens_.size(), TokenType::Normal);
    if (types_.size() != tokens_.size())
        throw Error("tokenizer: " + std::to_string(types_.size()) + " token types for " +
                    std::to_string(tokens_.size()) + " tokens");

    index_.assign(table_size(tokens_.size()), IndexSlot{0, kNoToken});
    bytes_.reserve(tokens_.size());
    for (int32_t i = 0; i < n; ++i) {
        index_insert(i);
        bytes_.push_back(renders_raw(types_[i]) ? tokens_[i] : byte_decode(tokens_[i]));
    }

    // Special ids.
    auto check = [&](TokenId& id, const char* what) {
        if (id != kNoToken && (id < 0 || id >= n))
            throw Error(std::string("tokenizer: ") + what + " token id " + std::to_string(id) +
                        " is outside the vocabulary of " + std::to_string(n));
    };
    special_ = d.special;
    check(special_.bos, "bos");
    check(special_.eos, "eos");
    check(special_.eot, "eot");
    check(special_.eom, "eom");
    check(special_.unk, "unknown");
    check(special_.pad, "padding");
    if (special_.eot == kNoToken) special_.eot = find("<|user|>");
    if (special_.eom == kNoToken) special_.eom = find("<|observation|>");

    // Symbols: every byte's character, every merge operand and result.
    std::unordered_map<std::string, int32_t> extra_index;  // only for strings not in the vocab
    auto symbol = [&](std::string_view s) -> int32_t {
        if (TokenId id = find(s); id != kNoToken) return id;
        auto it = extra_index.find(std::string(s));
        if (it != extra_index.end()) return it->second;
        const int32_t id = n + int32_t(extra_symbols_.size());
        extra_symbols_.emplace_back(s);
        extra_index.emplace(std::string(s), id);
        return id;
    };
    for (int b = 0; b < 256; ++b) byte_symbol_[b] = symbol(byte_char(uint8_t(b)));

    merges_.assign(table_size(d.merges.size()), MergeSlot{kEmptyKey, 0, 0});
    const uint64_t mask = merges_.size() - 1;
    std::string joined;
    for (size_t r = 0; r < d.merges.size(); ++r) {
        const std::string_view m = d.merges[r];
        const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
        if (sp == std::string_view::npos || sp + 1 >= m.size())
            throw Error("tokenizer: merge " + std::to_string(r) + " ('" + std::string(m) +
                        "') is not two symbols separated by a space");
        const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
        const int32_t l = symbol(left), rr = symbol(right);
        joined.assign(left);
        joined.append(right);
        const int32_t res = symbol(joined);
        const uint64_t key = uint64_t(uint32_t(l)) << 32 | uint32_t(rr);
        for (uint64_t h = mix64(key) & mask;; h = (h + 1) & mask) {
            if (merges_[h].key == key) break;  // listed twice: the first (lowest) rank wins
            if (merges_[h].key == kEmptyKey) {
                merges_[h] = {key, int32_t(r), res};
                break;
            }
        }
    }

    for (int32_t i = 0; i < n; ++i) {
        const TokenType t = types_[i];
        if (!renders_raw(t) || tokens_[i].empty()) continue;
        specials_.push_back({i, t != TokenType::UserDefined});
    }
    for (const std::string& b : bytes_) max_token_bytes_ = std::max(max_token_bytes_, b.size());
    std::stable_sort(specials_.begin(), specials_.end(),
                     [&](const SpecialMatch& a, const SpecialMatch& b) {
                         return tokens_[a.id].size() > tokens_[b.id].size();
                     });
}

void Tokenizer::index_insert(TokenId id) {
    const std::string_view s = tokens_[size_t(id)];
    const uint64_t h = std::hash<std::string_view>()(s);
    const uint64_t mask = index_.size() - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        IndexSlot& slot = index_[i];
        if (slot.id == kNoToken) {
            slot = {uint32_t(h >> 32), id};
            return;
        }
        if (slot.tag == uint32_t(h >> 32) && tokens_[size_t(slot.id)] == s) {
            slot.id = id;  // a duplicated string resolves to its last id, as in llama.cpp
            return;
        }
    }
}

TokenId Tokenizer::find(std::string_view text) const {
    const uint64_t h = std::hash<std::string_view>()(text);
    const uint64_t mask = index_.size() - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        const IndexSlot& slot = index_[i];
        if (slot.id == kNoToken) return kNoToken;
        if (slot.tag == uint32_t(h >> 32) && tokens_[size_t(slot.id)] == text) return slot.id;
    }
}

const Tokenizer::MergeSlot* Tokenizer::find_merge(int32_t left, int32_t right) const {
    const uint64_t key = uint64_t(uint32_t(left)) << 32 | uint32_t(right);
    const uint64_t mask = merges_.size() - 1;
    for (uint64_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        const MergeSlot& slot = merges_[i];
        if (slot.key == key) return &slot;
        if (slot.key == kEmptyKey) return nullptr;
    }
}

bool Tokenizer::is_control(TokenId id) const {
    return is_valid(id) && types_[size_t(id)] == TokenType::Control;
}

std::vector<TokenId> Tokenizer::stop_ids() const {
    std::vector<TokenId> ids;
    for (TokenId id : {special_.eos, special_.eot, special_.eom})
        if (id != kNoToken && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    return ids;
}

bool Tokenizer::is_stop(TokenId id) const {
    return id != kNoToken && (id == special_.eos || id == special_.eot || id == special_.eom);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<TokenId> out;
    out.reserve(text.size() / 3 + 4);
    encode_append(text, parse_special, out);
    return out;
}

bool Tokenizer::encode_append(std::string_view text, bool parse_special, std::vector<TokenId>& out,
                              size_t limit) const {
    // Too many bytes for the tokens left: no need to look at them.
    if (out.size() > limit || text.size() / max_token_bytes_ > limit - out.size()) return false;
    // Cut special tokens out of the raw text, longest first; each token carves every
    // occurrence out of the still-raw fragments, left to right.
    struct Frag {
        TokenId id;  // kNoToken: raw text [b, e)
        size_t b, e;
    };
    std::vector<Frag> frags{{kNoToken, 0, text.size()}};
    std::vector<Frag> next;
    for (const SpecialMatch& sm : specials_) {
        if (sm.needs_parse_special && !parse_special) continue;
        const std::string& s = tokens_[size_t(sm.id)];
        if (text.find(s) == std::string_view::npos) continue;
        next.clear();
        for (const Frag& f : frags) {
            if (f.id != kNoToken) {
                next.push_back(f);
                continue;
            }
            size_t b = f.b;
            while (b < f.e) {
                const size_t m = text.substr(0, f.e).find(s, b);
                if (m == std::string_view::npos) break;
                if (m > b) next.push_back({kNoToken, b, m});
                next.push_back({sm.id, m, m + s.size()});
                b = m + s.size();
            }
            if (b < f.e) next.push_back({kNoToken, b, f.e});
        }
        frags.swap(next);
    }
    for (const Frag& f : frags) {
        if (f.id != kNoToken)
            out.push_back(f.id);
        else if (!encode_raw(text.substr(f.b, f.e - f.b), out, limit))
            return false;
        if (out.size() > limit) return false;
    }
    return true;
}

bool Tokenizer::encode_raw(std::string_view text, std::vector<TokenId>& out, size_t limit) const {
    // A piece of more than (tokens left + 1) * max_token_bytes_ bytes encodes to more
    // tokens than are left (the scan may read two code points past a piece).
    const size_t left = limit - std::min(limit, out.size());
    const size_t max_piece =
        left >= SIZE_MAX / max_token_bytes_ - 16 ? SIZE_MAX : (left + 1) * max_token_bytes_ + 8;
    return pretokenize_glm4(
        text,
        [&](std::string_view w) {
            bpe_word(w, out);
            return out.size() <= limit;
        },
        max_piece);
}

void Tokenizer::emit_symbol(int32_t sym, std::vector<TokenId>& out) const {
    if (sym < n_vocab()) {
        out.push_back(sym);
        return;
    }
    // A merge product the vocabulary lacks: fall back to its characters' tokens.
    const std::string& s = extra_symbols_[size_t(sym - n_vocab())];
    for (size_t i = 0; i < s.size();) {
        Utf8Unit u = utf8_decode(s, i);
        TokenId id = find(s.substr(i, u.len));
        if (id == kNoToken) id = special_.unk;
        if (id != kNoToken) out.push_back(id);
        i += u.len;
    }
}

void Tokenizer::bpe_word(std::string_view word, std::vector<TokenId>& out) const {
    const size_t n = word.size();
    if (n == 0) return;
    if (n == 1) {
        emit_symbol(byte_symbol_[uint8_t(word[0])], out);
        return;
    }

    // Doubly linked symbols over the word's bytes; a merge keeps the left node.
    struct Node {
        int32_t sym, prev, next;
    };
    struct Cand {
        int32_t rank, left, lsym, rsym, result;
        // Heap order: lowest rank first, then the leftmost pair (as llama.cpp and
        // Hugging Face apply equal-rank merges).
        bool operator<(const Cand& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    thread_local std::vector<Node> nodes;
    thread_local std::vector<Cand> heap;
    nodes.resize(n);
    for (size_t i = 0; i < n; ++i)
        nodes[i] = {byte_symbol_[uint8_t(word[i])], int32_t(i) - 1,
                    i + 1 < n ? int32_t(i + 1) : -1};

    heap.clear();
    auto consider = [&](int32_t left) {
        const int32_t right = nodes[size_t(left)].next;
        if (right < 0) return;
        const int32_t ls = nodes[size_t(left)].sym, rs = nodes[size_t(right)].sym;
        const MergeSlot* m = find_merge(ls, rs);
        if (!m) return;
        heap.push_back({m->rank, left, ls, rs, m->result});
        std::push_heap(heap.begin(), heap.end());
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(int32_t(i));

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const Cand c = heap.back();
        heap.pop_back();
        Node& L = nodes[size_t(c.left)];
        // Stale when either side has changed since the candidate was queued; a symbol
        // only ever grows, so equal ids mean the same pair.
        if (L.sym != c.lsym || L.next < 0 || nodes[size_t(L.next)].sym != c.rsym) continue;
        const int32_t r = L.next;
        L.sym = c.result;
        L.next = nodes[size_t(r)].next;
        if (L.next >= 0) nodes[size_t(L.next)].prev = c.left;
        nodes[size_t(r)].sym = -1;
        if (L.prev >= 0) consider(L.prev);
        consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = nodes[size_t(i)].next) emit_symbol(nodes[size_t(i)].sym, out);
    // A long word's buffers (tens of bytes a byte) are not kept by the thread for the next.
    if (n > (size_t(1) << 16)) {
        std::vector<Node>().swap(nodes);
        std::vector<Cand>().swap(heap);
    }
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
    std::string out;
    for (TokenId id : ids) {
        if (!is_valid(id)) continue;
        const TokenType t = types_[size_t(id)];
        if (!render_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
        out += bytes_[size_t(id)];
    }
    return out;
}

std::string StreamDecoder::push(TokenId id) {
    if (!tok_->is_valid(id)) return {};
    const TokenType t = tok_->token_type(id);
    if (!render_special_ && (t == TokenType::Control || t == TokenType::Unknown)) return {};
    return push_bytes(tok_->token_bytes(id));
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        if (utf8_incomplete_tail(pending_, i) > 0) break;  // wait for the rest
        Utf8Unit u = utf8_decode(pending_, i);
        if (u.valid)
            out.append(pending_, i, u.len);
        else
            out.append("\xEF\xBF\xBD");
        i += u.len;
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out = pending_.empty() ? std::string() : sanitize_utf8(pending_);
    pending_.clear();
    return out;
}

}  // namespace glm5::text

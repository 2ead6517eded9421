#include "runtime/vocab_trie.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer.h"

namespace glm5::runtime {

namespace {

// Plain string text, one byte at a time (the string rules of the matcher, starting at a
// character boundary).
struct Utf8Scan {
    bool ok = true;
    int8_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    int32_t chars = 0;
    void step(uint8_t c) {
        if (!ok) return;
        if (need > 0) {
            if (c < lo || c > hi) {
                ok = false;
                return;
            }
            --need;
            lo = 0x80;
            hi = 0xBF;
            return;
        }
        if (c < 0x20 || c == '"' || c == '\\')
            ok = false;
        else if (c < 0x80)
            need = 0;
        else if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c == 0xE0)
            need = 2, lo = 0xA0;
        else if (c == 0xED)
            need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF)
            need = 2;
        else if (c == 0xF0)
            need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            need = 3;
        else if (c == 0xF4)
            need = 3, hi = 0x8F;
        else
            ok = false;
        if (ok) ++chars;
    }
};

}  // namespace

void TokenTrie::build(const std::vector<int32_t>& ids, const std::vector<std::string>& bytes) {
    nodes.clear();
    tok_ids.clear();
    std::vector<int32_t> parent{-1}, path{0};
    nodes.push_back({0, 0, 0, 0, 0});
    const std::string* prev = nullptr;
    for (int32_t id : ids) {
        const std::string& s = bytes[size_t(id)];
        size_t common = 0;
        if (prev)
            while (common < s.size() && common < prev->size() && s[common] == (*prev)[common])
                ++common;
        common = std::min(common, path.size() - 1);
        path.resize(common + 1);
        for (size_t k = common; k < s.size(); ++k) {
            const uint16_t d = uint16_t(std::min<size_t>(k + 1, 65535));
            parent.push_back(path.back());
            path.push_back(int32_t(nodes.size()));
            nodes.push_back({0, int32_t(tok_ids.size()), d, d, uint8_t(s[k])});
        }
        tok_ids.push_back(id);
        prev = &s;
    }
    const size_t n = nodes.size();
    std::vector<int32_t> open;
    for (size_t i = 0; i < n; ++i) {
        while (!open.empty() && nodes[size_t(open.back())].depth >= nodes[i].depth) {
            nodes[size_t(open.back())].end = int32_t(i);
            open.pop_back();
        }
        open.push_back(int32_t(i));
    }
    for (int32_t i : open) nodes[size_t(i)].end = int32_t(n);
    for (size_t i = n; i-- > 1;) {
        auto& p = nodes[size_t(parent[i])];
        p.maxdepth = std::max(p.maxdepth, nodes[i].maxdepth);
    }
    nodes.push_back({int32_t(n), int32_t(tok_ids.size()), 0, 0, 0});  // sentinel
}

TokenVocab::~TokenVocab() = default;

TokenVocab::TokenVocab(const text::Tokenizer& tok, VocabOptions opt) {
    n_vocab_ = tok.n_vocab();
    stop_ids_ = opt.stop_ids.empty() ? tok.stop_ids() : std::move(opt.stop_ids);
    if (stop_ids_.empty() && opt.require_stop)
        throw Error("constraint: the vocabulary has no end-of-generation token");
    for (int32_t s : stop_ids_)
        if (!tok.is_valid(s)) throw Error("constraint: stop token id out of range");
    think_end_ = tok.find("</think>");
    markers_ = std::move(opt.markers);

    // Bytes a JSON document can ever hold: no control bytes (strings escape them, and the
    // only white space is ' ') and none that cannot occur in UTF-8. In JSON mode tokens
    // holding another byte are never allowed, so they stay out of the trie (newline and
    // indentation tokens).
    auto emittable = [](uint8_t b) { return b >= 0x20 && b != 0xC0 && b != 0xC1 && b < 0xF5; };
    auto listed = [](const std::vector<int32_t>& v, int32_t id) {
        return std::find(v.begin(), v.end(), id) != v.end();
    };
    bytes_.resize(size_t(n_vocab_));
    text_bits_.assign((size_t(n_vocab_) + 63) / 64, 0);
    std::vector<int32_t> ids;
    bool have[256] = {};
    for (int32_t id = 0; id < n_vocab_; ++id) {
        const text::TokenType t = tok.token_type(id);
        const bool usable = t == text::TokenType::Normal || t == text::TokenType::Byte ||
                            t == text::TokenType::Undefined ||
                            (opt.user_defined_text && t == text::TokenType::UserDefined);
        const std::string& b = tok.token_bytes(id);
        if (!usable || b.empty()) continue;
        if (listed(stop_ids_, id) || listed(markers_, id) || listed(opt.not_text, id)) continue;
        if (opt.json_bytes &&
            !std::all_of(b.begin(), b.end(), [&](char c) { return emittable(uint8_t(c)); }))
            continue;
        bytes_[size_t(id)] = b;
        text_bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
        ids.push_back(id);
        if (b.size() == 1) have[uint8_t(b[0])] = true;
    }
    for (int c = 0; c < 256; ++c) missing_bytes_ += emittable(uint8_t(c)) && !have[c];

    // Sorted byte strings give the tries in preorder.
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
        return bytes_[size_t(a)] < bytes_[size_t(b)] ||
               (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
    });
    all_.build(ids, bytes_);
    std::vector<int32_t> nonplain;
    for (int32_t id : ids) {
        Utf8Scan u;
        for (unsigned char c : bytes_[size_t(id)]) u.step(c);
        if (!u.ok) {
            nonplain.push_back(id);
            continue;
        }
        plain_.push_back({id, u.chars, u.need});
        max_plain_chars_ = std::max(max_plain_chars_, u.chars);
    }
    nonplain_.build(nonplain, bytes_);
    for (int32_t id : nonplain)
        max_nonplain_bytes_ = std::max(max_nonplain_bytes_, int32_t(bytes_[size_t(id)].size()));
    std::stable_sort(plain_.begin(), plain_.end(),
                     [](const Plain& a, const Plain& b) { return a.chars < b.chars; });
    const int32_t levels = std::min(kPlainLevels, max_plain_chars_ + 1);
    plain_le_.assign(size_t(levels) + 1, std::vector<uint64_t>((size_t(n_vocab_) + 63) / 64, 0));
    for (const auto& p : plain_)
        for (int32_t k = std::min(p.chars, levels); k <= levels; ++k)
            plain_le_[size_t(k)][size_t(p.id) / 64] |= uint64_t(1) << (p.id % 64);
}

bool TokenVocab::is_stop(int32_t id) const {
    return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

}  // namespace glm5::runtime

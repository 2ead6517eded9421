#include "runtime/grammar_constraint.h"

#include <algorithm>
#include <array>
#include <bit>

#include "core/error.h"

namespace glm5::runtime {

using namespace grammar;

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> g,
                                     std::shared_ptr<const TokenVocab> v, bool after_think)
    : g_(std::move(g)), v_(std::move(v)), remaining_(kNoBudget), thinking_(after_think) {
    if (!g_ || !v_) throw Error("constraint: missing grammar or vocabulary");
    if (after_think && v_->think_end() < 0)
        throw Error("constraint: the vocabulary has no </think> token");
    m_ = std::make_unique<Matcher>(*g_);
}

GrammarConstraint::GrammarConstraint(const GrammarConstraint& o)
    : TokenConstraint(),
      g_(o.g_),
      v_(o.v_),
      m_(std::make_unique<Matcher>(*o.m_)),
      text_(o.text_),
      remaining_(o.remaining_),
      thinking_(o.thinking_),
      stopped_(o.stopped_) {}

GrammarConstraint::~GrammarConstraint() = default;

bool GrammarConstraint::complete() const {
    return !thinking_ && m_->complete();
}

int64_t GrammarConstraint::min_completion() const {
    return (thinking_ ? 1 : 0) + m_->completion() + g_->tail;
}

void GrammarConstraint::set_remaining(int64_t n) {
    if (n != remaining_) dirty_ = ref_dirty_ = true;
    remaining_ = n;
}

// The completions (in matcher symbols: the tail comes after them) a token may leave, in
// order of preference: room to finish in the tokens left after it; when no token leaves
// that (the budget is already too small), a strictly shorter way to the end; when none does
// either, anything the grammar takes, so that sampling never runs dry.
std::array<int64_t, 3> GrammarConstraint::thresholds() const {
    if (remaining_ == kNoBudget) return {kNoBudget, kNoBudget, kNoBudget};
    return {remaining_ - 1 - g_->tail, m_->completion() - 1, kNoBudget};
}

// Reasoning: anything but a stop token while there is room for </think> and the shortest
// output after it; </think> always.
bool GrammarConstraint::thinking_allows(int32_t t) const {
    if (t == v_->think_end()) return true;
    if (v_->is_stop(t)) return false;
    return remaining_ == kNoBudget || remaining_ - 1 >= 1 + m_->completion() + g_->tail;
}

bool GrammarConstraint::allows(int32_t token) const {
    if (token < 0 || token >= v_->n_vocab_) return false;
    if (thinking_) return thinking_allows(token);
    if (dirty_) compute();
    return (bits_[size_t(token) / 64] >> (token % 64)) & 1;
}

size_t GrammarConstraint::allowed_count() const {
    if (thinking_) {
        size_t n = 0;
        for (int32_t t = 0; t < v_->n_vocab_; ++t) n += thinking_allows(t);
        return n;
    }
    if (dirty_) compute();
    size_t n = 0;
    for (uint64_t w : bits_) n += size_t(std::popcount(w));
    return n;
}

void GrammarConstraint::compute() const {
    const TokenVocab& v = *v_;
    bits_.assign((size_t(v.n_vocab_) + 63) / 64, 0);
    dirty_ = false;
    if (stopped_) return;
    if (m_->complete())
        for (int32_t s : v.stop_ids_) bits_[size_t(s) / 64] |= uint64_t(1) << (s % 64);
    if (m_->empty()) return;
    // Each looser tier is a superset of the tighter ones that come before it. A token
    // shortens the completion by at most its length in symbols, so the budget's tier is
    // skipped without a walk when no token is long enough to get back within it.
    const auto tiers = thresholds();
    const int64_t now = m_->completion();
    for (size_t i = 0; i < tiers.size(); ++i) {
        if (i == 0 && tiers[0] < tiers[1] && now - tiers[0] > std::max(v.max_token_bytes(), 1))
            continue;
        compute_within(tiers[i]);
        if (std::any_of(bits_.begin(), bits_.end(), [](uint64_t w) { return w != 0; })) break;
    }
}

void GrammarConstraint::compute_within(int64_t T) const {
    const TokenVocab& v = *v_;
    auto set = [&](int32_t id) { bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64); };
    Matcher& m = *m_;
    const bool budget = T != kNoBudget;

    // Markers are single symbols: each is tried on its own.
    for (size_t k = 0; k < v.markers_.size(); ++k) {
        const int32_t id = v.markers_[k];
        if (id < 0) continue;
        const size_t mark = m.mark();
        if (m.feed(kMarker + int32_t(k)) && (!budget || m.completion() <= T)) set(id);
        m.undo(mark);
    }

    const Frame top = m.top();
    const Node& tn = g_->nodes[size_t(top.node)];
    if (tn.kind == Kind::Text) {
        // Free text takes every text token and stays where it is.
        if (!budget || top.base <= T)
            for (size_t w = 0; w < bits_.size(); ++w) bits_[w] |= v.text_bits_[w];
        return;
    }
    // In a string body, plain text tokens depend only on their character count.
    const bool fast = tn.kind == Kind::Str && top.st == S_BODY;
    if (fast) {
        const int64_t room = int64_t(tn.max_len) - top.a;
        const int64_t owed = std::max<int64_t>(0, int64_t(tn.min_len) - top.a);
        const int32_t levels = int32_t(v.plain_le_.size()) - 1;
        if ((room >= v.max_plain_chars_ || room < levels) &&
            (!budget || top.base + owed + 1 + 3 <= T)) {
            const auto& le = v.plain_le_[size_t(room >= v.max_plain_chars_ ? levels : room)];
            for (size_t w = 0; w < bits_.size(); ++w) bits_[w] |= le[w];
        } else {
            for (const auto& p : v.plain_) {
                if (p.chars > room) break;
                if (budget && top.base + std::max<int64_t>(0, owed - p.chars) + p.pending + 1 > T)
                    continue;
                set(p.id);
            }
        }
    }

    // Walk the token trie with the matcher, skipping the subtrees it refuses or the budget
    // rules out; in a string body only the tokens that are not plain text are left.
    if (!fast) {
        m.walk_bits(v.all_, T, bits_.data());
        return;
    }
    const bool cacheable =
        top.a >= tn.min_len && int64_t(tn.max_len) - top.a >= v.max_nonplain_bytes_;
    if (!cacheable) {
        m.walk_bits(v.nonplain_, T, bits_.data());
        return;
    }
    // The stack with the top's character count left out.
    std::vector<Frame> key = m.stack();
    key.back().a = 0;
    const auto* kb = reinterpret_cast<const uint8_t*>(key.data());
    if (!string_cache_valid_ || !std::equal(kb, kb + key.size() * sizeof(Frame),
                                            string_cache_key_.begin(), string_cache_key_.end())) {
        string_cache_.clear();
        m.walk(v.nonplain_, T, false, string_cache_);
        string_cache_key_.assign(kb, kb + key.size() * sizeof(Frame));
        string_cache_valid_ = true;
    }
    for (const auto& [id, c] : string_cache_)
        if (!budget || c <= T) set(id);
}

bool GrammarConstraint::allows_uncached(int32_t token) const {
    const TokenVocab& v = *v_;
    if (token < 0 || token >= v.n_vocab_) return false;
    if (thinking_) return thinking_allows(token);
    if (stopped_) return false;
    if (v.is_stop(token)) return m_->complete();
    // The tier in force: the first one some token meets, by feeding every token.
    if (ref_dirty_) {
        ref_dirty_ = false;
        const bool stop = m_->complete() && !v.stop_ids_.empty();
        for (int64_t t : thresholds()) {
            ref_threshold_ = t;
            bool any = stop;
            for (int32_t id = 0; id < v.n_vocab_ && !any; ++id) {
                const int64_t c = completion_after(id);
                any = c >= 0 && c <= t;
            }
            if (any) break;
        }
    }
    const int64_t c = completion_after(token);
    return c >= 0 && c <= ref_threshold_;
}

int64_t GrammarConstraint::completion_after(int32_t token) const {
    const TokenVocab& v = *v_;
    if (v.is_stop(token)) return -1;
    Matcher m = *m_;
    const auto mk = std::find(v.markers_.begin(), v.markers_.end(), token);
    if (mk != v.markers_.end()) {
        if (!m.feed(kMarker + int32_t(mk - v.markers_.begin()))) return -1;
    } else {
        const std::string& b = v.bytes_[size_t(token)];
        if (b.empty()) return -1;
        for (unsigned char c : b)
            if (!m.feed(c)) return -1;
    }
    return m.completion();
}

void GrammarConstraint::accept(int32_t token) {
    const TokenVocab& v = *v_;
    if (token < 0 || token >= v.n_vocab_) throw Error("constraint: token id out of range");
    dirty_ = ref_dirty_ = true;
    if (thinking_) {
        if (v.is_stop(token)) throw Error("constraint: stop token before the reply's output");
        if (token == v.think_end()) {
            thinking_ = false;
            // </think> took one token of the budget.
            if (remaining_ != kNoBudget) remaining_ -= 1;
        }
        return;
    }
    if (stopped_) throw Error("constraint: token after the end of the output");
    if (v.is_stop(token)) {
        if (!m_->complete()) throw Error("constraint: stop token before the output is complete");
        stopped_ = true;
        return;
    }
    const auto mk = std::find(v.markers_.begin(), v.markers_.end(), token);
    if (mk != v.markers_.end()) {
        if (!m_->feed(kMarker + int32_t(mk - v.markers_.begin())))
            throw Error("constraint: token " + std::to_string(token) +
                        " does not continue the output");
        m_->commit();
        return;
    }
    const std::string& b = v.bytes_[size_t(token)];
    if (b.empty()) throw Error("constraint: token " + std::to_string(token) + " is not allowed");
    for (unsigned char c : b)
        if (!m_->feed(c)) {
            m_->undo(0);
            throw Error("constraint: token " + std::to_string(token) +
                        " does not continue the output");
        }
    m_->commit();
    text_ += b;
}

}  // namespace glm5::runtime

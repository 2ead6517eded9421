#include "runtime/grammar.h"

#include <algorithm>
#include <bit>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "runtime/vocab_trie.h"

namespace glm5::runtime {

using namespace grammar;

bool grammar::is_container(Kind k) {
    return k == Kind::Arr || k == Kind::Obj || k == Kind::Map;
}

int32_t grammar::trie_child(const std::vector<Trie>& tries, int32_t t, int32_t c) {
    for (const auto& [b, n] : tries[size_t(t)].next)
        if (b == c) return n;
    return -1;
}

int64_t min_document_bytes(const Grammar& g) {
    return g.nodes[size_t(g.root)].minlen;
}

// ---------------------------------------------------------------------------
// The matcher.

namespace {

Frame with(Frame f, int32_t st) {
    f.st = st;
    return f;
}

}  // namespace

Matcher::Matcher(const Grammar& g) : g_(&g) {
    stack_.reserve(64);
    log_.reserve(256);
    stack_.push_back(initial(g.root, 0));
}

bool Matcher::feed(int32_t c) {
    const size_t m = log_.size();
    for (;;) {
        if (stack_.empty()) break;
        const Frame f = stack_.back();
        const Node& n = g_->nodes[size_t(f.node)];
        R r = R::Fail;
        switch (n.kind) {
            case Kind::Lit:
                r = step_lit(f, c);
                break;
            case Kind::Str:
                r = step_str(f, n, c);
                break;
            case Kind::Num:
                r = step_num(f, n, c);
                break;
            case Kind::Arr:
                r = step_arr(f, n, c);
                break;
            case Kind::Obj:
                r = step_obj(f, n, c);
                break;
            case Kind::Map:
                r = step_map(f, n, c);
                break;
            case Kind::Union:
                r = step_union(f, n, c);
                break;
            case Kind::Text:
                r = c < kMarker ? R::Ok : R::Retry;  // free text ends at a marker
                break;
            case Kind::Call:
                r = step_call(f, n, c);
                break;
            case Kind::Tags:
                r = step_tags(f, n, c);
                break;
            case Kind::Ref:
                break;
        }
        if (r == R::Ok) return true;
        if (r == R::Fail) break;
        if (r == R::Retry) pop();  // the value ended before c: c belongs to the parent
    }
    undo(m);
    return false;
}

int64_t Matcher::completion() const {
    if (stack_.empty()) return 0;
    return sat_add(cost(stack_.back()), stack_.back().base);
}

bool Matcher::can_end(const Frame& f) const {
    const Node& n = g_->nodes[size_t(f.node)];
    if (n.kind == Kind::Num)
        return f.st == N_ZERO || f.st == N_INT || f.st == N_FRAC || f.st == N_EXPD;
    if (n.kind == Kind::Lit) return g_->tries[size_t(f.b)].term >= 0;
    return false;
}

// Bytes the frame needs to finish its value.
[[gnu::always_inline]] inline int64_t Matcher::cost(const Frame& f) const {
    const Node& n = g_->nodes[size_t(f.node)];
    switch (n.kind) {
        case Kind::Lit:
            return g_->tries[size_t(f.b)].dist;
        case Kind::Str: {
            const int64_t rest = std::max<int64_t>(0, int64_t(n.min_len) - f.a) + 1;
            switch (f.st) {
                case S_OPEN:
                    return n.minlen;
                case S_BODY:
                    return rest;
                case S_ESC:
                    return rest + 1;
                case S_U0:
                    return rest + 4;
                case S_U1:
                case S_U1D:
                    return rest + 3;
                case S_U2:
                    return rest + 2;
                case S_U3:
                    return rest + 1;
                case S_C1:
                    return rest + 1;
                case S_C2:
                case S_E0:
                case S_ED:
                    return rest + 2;
                default:
                    return rest + 3;
            }
        }
        case Kind::Num:
            return (f.st == N_ZERO || f.st == N_INT || f.st == N_FRAC || f.st == N_EXPD) ? 0 : 1;
        case Kind::Arr: {
            const int64_t L = g_->nodes[size_t(n.item)].minlen;
            const int64_t m = n.min_items;
            switch (f.st) {
                case A_OPEN:
                    return n.minlen;
                case A_FIRST:
                    return m == 0 ? 1 : sat_add(sat_mul(m, L), m);
                case A_VALUE: {
                    const int64_t r = std::max<int64_t>(0, m - f.a);
                    return sat_add(sat_mul(r, sat_add(L, 1)), 1);
                }
                default: {
                    const int64_t r = std::max<int64_t>(1, m - f.a);
                    return sat_add(sat_mul(r, L), r);
                }
            }
        }
        case Kind::Obj: {
            const size_t a = size_t(f.a);
            auto after = [&](size_t k) { return sat_add(n.req_sum[k], n.req_cnt[k] + 1); };
            switch (f.st) {
                case O_OPEN:
                    return n.minlen;
                case O_FIRST:
                    return n.req_cnt[a] == 0 ? 1 : sat_add(n.req_sum[a], n.req_cnt[a]);
                case O_KEY: {
                    int64_t best = kInf;
                    const int32_t lo = f.a, hi = lo < int32_t(n.props.size()) ? n.hi[a] : -1;
                    for (const auto& [j, c] : g_->tries[size_t(f.b)].via)
                        if (j >= lo && j <= hi) best = std::min(best, c);
                    return best;
                }
                case O_COLON:
                    return sat_add(g_->nodes[size_t(n.props[size_t(f.b)].value)].minlen,
                                   1 + after(a));
                case O_AFTER_COLON:
                case O_AFTER_COLON_WS:
                    return sat_add(g_->nodes[size_t(n.props[size_t(f.b)].value)].minlen, after(a));
                case O_VALUE:
                    return after(a);
                default:
                    return n.req_cnt[a] > 0 ? sat_add(n.req_sum[a], n.req_cnt[a])
                                            : sat_add(n.opt_min[a], 1);
            }
        }
        case Kind::Map: {
            const int64_t Lv = g_->nodes[size_t(n.value)].minlen;
            const int64_t Lk = g_->nodes[size_t(n.key)].minlen;
            switch (f.st) {
                case M_OPEN:
                    return 2;
                case M_FIRST:
                    return 1;
                case M_KEYDONE:
                    return sat_add(Lv, 2);
                case M_AFTER_COLON:
                case M_AFTER_COLON_WS:
                    return sat_add(Lv, 1);
                case M_VALUE:
                    return 1;
                default:
                    return sat_add(sat_add(Lk, Lv), 2);
            }
        }
        case Kind::Union:
            return n.minlen;
        case Kind::Text:
            return 0;
        case Kind::Call:
        case Kind::Tags:
            return tool_cost(f, n);
        case Kind::Ref:
            break;
    }
    return kInf;
}

// The tool-call kinds' costs, apart from cost() so that it stays small enough to inline.
int64_t Matcher::tool_cost(const Frame& f, const Node& n) const {
    if (n.kind == Kind::Call) {
        switch (f.st) {
            case C_OPEN:
                return n.minlen;
            case C_NAME:
                return g_->tries[size_t(f.b)].dist;
            default:
                return 1;
        }
    }
    const TagsFrame t = TagsFrame::of(f);
    auto member = [&](int32_t j) {  // <arg_key> KEY </arg_key> <arg_value> VALUE </arg_value>
        const Prop& p = n.props[size_t(j)];
        return sat_add(g_->nodes[size_t(p.value)].minlen, 4 + int64_t(p.key.size()));
    };
    auto key_len = [&](int32_t j) { return int64_t(n.props[size_t(j)].key.size()); };
    auto then = [&](int32_t j) { return members_left(n, t.used | uint64_t(1) << j); };
    switch (t.state) {
        case T_NEXT:
            return members_left(n, t.used);
        case T_KEY: {
            // The key's bytes left, then </arg_key> <arg_value> VALUE </arg_value>.
            int64_t best = kInf;
            for (const auto& [j, left] : g_->tries[size_t(t.x)].via)
                if (!(t.used >> j & 1))
                    best = std::min(best, sat_add(member(j) - key_len(j) - 1 + left, then(j)));
            return best;
        }
        case T_VOPEN:
            return sat_add(member(t.x) - key_len(t.x) - 2, then(t.x));
        default:
            return 1 + then(t.x);
    }
}

int64_t Matcher::members_left(const Node& n, uint64_t used) const {
    int64_t c = 0;
    for (size_t j = 0; j < n.props.size(); ++j) {
        const Prop& p = n.props[j];
        if (p.required && !(used >> j & 1))
            c = sat_add(c, sat_add(g_->nodes[size_t(p.value)].minlen, 4 + int64_t(p.key.size())));
    }
    return c;
}

// The trie walk, kept in this file with feed() and cost() so that cost() inlines into it: it
// is the per-token hot loop of constrained sampling.
template <class Found>
void Matcher::walk_trie(const TokenTrie& trie, int64_t t, bool prune, Found&& found) {
    const bool budget = t != kNoBudget;
    std::vector<size_t> path;  // undo marks of the nodes above
    path.reserve(64);
    const size_t base = mark();
    const int32_t n = int32_t(trie.size());
    const auto* nodes = trie.nodes.data();
    for (int32_t i = 1; i < n;) {
        const auto& nd = nodes[i];
        const size_t d = nd.depth;
        while (path.size() >= d) {
            undo(path.back());
            path.pop_back();
        }
        const size_t here = mark();
        if (!feed(nd.label)) {
            i = nd.end;
            continue;
        }
        int64_t c = 0;
        if (budget || !prune) {
            c = stack_.empty() ? 0 : sat_add(cost(stack_.back()), stack_.back().base);
            // One byte shortens the completion by at most one.
            if (prune && c - int64_t(nd.maxdepth - d) > t) {
                undo(here);
                i = nd.end;
                continue;
            }
        }
        path.push_back(here);
        for (int32_t k = nd.tok_begin; k < nodes[i + 1].tok_begin; ++k)
            found(trie.tok_ids[size_t(k)], c);
        ++i;
    }
    undo(base);
}

void Matcher::walk(const TokenTrie& trie, int64_t t, bool prune,
                   std::vector<std::pair<int32_t, int64_t>>& found) {
    walk_trie(trie, t, prune, [&](int32_t id, int64_t c) { found.emplace_back(id, c); });
}

void Matcher::walk_bits(const TokenTrie& trie, int64_t t, uint64_t* bits) {
    walk_trie(trie, t, true, [&](int32_t id, int64_t c) {
        if (c <= t) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    });
}

Matcher::Frame Matcher::initial(int32_t node, int64_t base) const {
    const Node& n = g_->nodes[size_t(node)];
    return Frame{node, 0, 0, n.kind == Kind::Lit ? n.trie : 0, base};
}
void Matcher::set_top(const Frame& f) {
    log_.push_back({Op::Set, stack_.back()});
    stack_.back() = f;
}
void Matcher::push(const Frame& f) {
    log_.push_back({Op::Push, f});
    stack_.push_back(f);
}
void Matcher::pop() {
    log_.push_back({Op::Pop, stack_.back()});
    stack_.pop_back();
}
// The parent moves to `parent` (its state once the child is done) and the child
// starts; the same byte then goes to the child.
Matcher::R Matcher::start_child(const Frame& parent, int32_t child, int32_t c) {
    if (c >= kMarker || !g_->nodes[size_t(child)].first[size_t(c)]) return R::Fail;
    set_top(parent);
    push(initial(child, sat_add(cost(parent), parent.base)));
    return R::Again;
}
Matcher::R Matcher::step_lit(const Frame& f, int32_t c) {
    const int32_t t = trie_child(g_->tries, f.b, c);
    if (t >= 0) {
        const Trie& tn = g_->tries[size_t(t)];
        if (tn.term >= 0 && tn.next.empty()) {
            pop();
        } else {
            Frame nf = f;
            nf.b = t;
            set_top(nf);
        }
        return R::Ok;
    }
    return g_->tries[size_t(f.b)].term >= 0 ? R::Retry : R::Fail;
}

Matcher::R Matcher::step_str(const Frame& f, const Node& n, int32_t c) {
    Frame nf = f;
    auto go = [&](int32_t st) {
        nf.st = st;
        set_top(nf);
        return R::Ok;
    };
    auto is_hex = [](int32_t x) {
        return (x >= '0' && x <= '9') || (x >= 'a' && x <= 'f') || (x >= 'A' && x <= 'F');
    };
    switch (f.st) {
        case S_OPEN:
            return c == '"' ? go(S_BODY) : R::Fail;
        case S_BODY: {
            if (c == '"') {
                if (f.a < n.min_len) return R::Fail;
                pop();
                return R::Ok;
            }
            if (c < 0x20) return R::Fail;
            int32_t st;
            if (c == '\\')
                st = S_ESC;
            else if (c < 0x80)
                st = S_BODY;
            else if (c >= 0xC2 && c <= 0xDF)
                st = S_C1;
            else if (c == 0xE0)
                st = S_E0;
            else if (c == 0xED)
                st = S_ED;
            else if (c >= 0xE1 && c <= 0xEF)
                st = S_C2;
            else if (c == 0xF0)
                st = S_F0;
            else if (c >= 0xF1 && c <= 0xF3)
                st = S_C3;
            else if (c == 0xF4)
                st = S_F4;
            else
                return R::Fail;
            if (f.a >= n.max_len) return R::Fail;
            nf.a = f.a + 1;  // a character starts here
            return go(st);
        }
        case S_ESC:
            if (c == 'u') return go(S_U0);
            switch (c) {
                case '"':
                case '\\':
                case '/':
                case 'b':
                case 'f':
                case 'n':
                case 'r':
                case 't':
                    return go(S_BODY);
                default:
                    return R::Fail;
            }
        case S_U0:
            if (!is_hex(c)) return R::Fail;
            return go(c == 'd' || c == 'D' ? S_U1D : S_U1);
        case S_U1D:
            return (c >= '0' && c <= '7') ? go(S_U2) : R::Fail;
        case S_U1:
            return is_hex(c) ? go(S_U2) : R::Fail;
        case S_U2:
            return is_hex(c) ? go(S_U3) : R::Fail;
        case S_U3:
            return is_hex(c) ? go(S_BODY) : R::Fail;
        case S_C1:
            return (c >= 0x80 && c <= 0xBF) ? go(S_BODY) : R::Fail;
        case S_C2:
            return (c >= 0x80 && c <= 0xBF) ? go(S_C1) : R::Fail;
        case S_C3:
            return (c >= 0x80 && c <= 0xBF) ? go(S_C2) : R::Fail;
        case S_E0:
            return (c >= 0xA0 && c <= 0xBF) ? go(S_C1) : R::Fail;
        case S_ED:
            return (c >= 0x80 && c <= 0x9F) ? go(S_C1) : R::Fail;
        case S_F0:
            return (c >= 0x90 && c <= 0xBF) ? go(S_C2) : R::Fail;
        case S_F4:
            return (c >= 0x80 && c <= 0x8F) ? go(S_C2) : R::Fail;
    }
    return R::Fail;
}

Matcher::R Matcher::step_num(const Frame& f, const Node& n, int32_t c) {
    const GrammarLimits& L = g_->lim;
    const bool digit = c >= '0' && c <= '9';
    auto go = [&](int32_t st, int32_t a) {
        set_top(Frame{f.node, st, a, 0, f.base});
        return R::Ok;
    };
    // After a complete integer part or fraction: a fraction / exponent may follow.
    auto tail = [&](bool frac_ok) {
        if (!n.integer) {
            if (c == '.' && frac_ok) return go(N_DOT, 0);
            if (c == 'e' || c == 'E') return go(N_EXP, 0);
        }
        return R::Retry;
    };
    switch (f.st) {
        case N_START:
            if (c == '-') return go(N_MINUS, 0);
            [[fallthrough]];
        case N_MINUS:
            if (c == '0') return go(N_ZERO, 1);
            if (digit) return go(N_INT, 1);
            return R::Fail;
        case N_ZERO:
            return tail(true);
        case N_INT:
            if (digit && f.a < L.max_int_digits) return go(N_INT, f.a + 1);
            return tail(true);
        case N_DOT:
            return digit ? go(N_FRAC, 1) : R::Fail;
        case N_FRAC:
            if (digit && f.a < L.max_frac_digits) return go(N_FRAC, f.a + 1);
            return tail(false);
        case N_EXP:
            if (c == '+' || c == '-') return go(N_EXPSIGN, 0);
            [[fallthrough]];
        case N_EXPSIGN:
            return digit ? go(N_EXPD, 1) : R::Fail;
        case N_EXPD:
            if (digit && f.a < L.max_exp_digits) return go(N_EXPD, f.a + 1);
            return R::Retry;
    }
    return R::Fail;
}

Matcher::R Matcher::step_arr(const Frame& f, const Node& n, int32_t c) {
    Frame nf = f;
    auto item = [&](int32_t count) {
        nf.st = A_VALUE;
        nf.a = count;
        return start_child(nf, n.item, c);
    };
    switch (f.st) {
        case A_OPEN:
            if (c != '[') return R::Fail;
            set_top(with(f, A_FIRST));
            return R::Ok;
        case A_FIRST:
            if (c == ']' && n.min_items == 0) {
                pop();
                return R::Ok;
            }
            return n.max_items >= 1 ? item(1) : R::Fail;
        case A_VALUE:
            if (c == ',' && f.a < n.max_items) {
                set_top(with(f, A_COMMA));
                return R::Ok;
            }
            if (c == ']' && f.a >= n.min_items) {
                pop();
                return R::Ok;
            }
            return R::Fail;
        case A_COMMA:
            if (c == ' ' && g_->lim.spaces) {
                set_top(with(f, A_COMMA_WS));
                return R::Ok;
            }
            return item(f.a + 1);
        case A_COMMA_WS:
            return item(f.a + 1);
    }
    return R::Fail;
}

bool Matcher::key_viable(const Node& n, int32_t t, int32_t a) const {
    if (a >= int32_t(n.props.size())) return false;
    const int32_t hi = n.hi[size_t(a)];
    for (const auto& [j, c] : g_->tries[size_t(t)].via)
        if (j >= a && j <= hi) return true;
    return false;
}

Matcher::R Matcher::step_obj(const Frame& f, const Node& n, int32_t c) {
    auto key_start = [&]() {
        const int32_t t = trie_child(g_->tries, n.trie, c);
        if (t < 0 || !key_viable(n, t, f.a)) return R::Fail;
        set_top(Frame{f.node, O_KEY, f.a, t, f.base});
        return R::Ok;
    };
    auto value = [&]() { return start_child(with(f, O_VALUE), n.props[size_t(f.b)].value, c); };
    switch (f.st) {
        case O_OPEN:
            if (c != '{') return R::Fail;
            set_top(with(f, O_FIRST));
            return R::Ok;
        case O_FIRST:
            if (c == '}') {
                if (n.req_cnt[size_t(f.a)] != 0) return R::Fail;
                pop();
                return R::Ok;
            }
            return key_start();
        case O_COMMA:
            if (c == ' ' && g_->lim.spaces) {
                set_top(with(f, O_COMMA_WS));
                return R::Ok;
            }
            return key_start();
        case O_COMMA_WS:
            return key_start();
        case O_KEY: {
            const int32_t t = trie_child(g_->tries, f.b, c);
            if (t < 0 || !key_viable(n, t, f.a)) return R::Fail;
            const int32_t j = g_->tries[size_t(t)].term;
            if (j >= 0)
                set_top(Frame{f.node, O_COLON, j + 1, j, f.base});
            else
                set_top(Frame{f.node, O_KEY, f.a, t, f.base});
            return R::Ok;
        }
        case O_COLON:
            if (c != ':') return R::Fail;
            set_top(with(f, O_AFTER_COLON));
            return R::Ok;
        case O_AFTER_COLON:
            if (c == ' ' && g_->lim.spaces) {
                set_top(with(f, O_AFTER_COLON_WS));
                return R::Ok;
            }
            return value();
        case O_AFTER_COLON_WS:
            return value();
        case O_VALUE:
            if (c == ',' && f.a < int32_t(n.props.size())) {
                set_top(with(f, O_COMMA));
                return R::Ok;
            }
            if (c == '}' && n.req_cnt[size_t(f.a)] == 0) {
                pop();
                return R::Ok;
            }
            return R::Fail;
    }
    return R::Fail;
}

Matcher::R Matcher::step_map(const Frame& f, const Node& n, int32_t c) {
    Frame nf = f;
    auto key = [&](int32_t count) {
        if (c != '"') return R::Fail;
        nf.st = M_KEYDONE;
        nf.a = count;
        return start_child(nf, n.key, c);
    };
    auto value = [&]() { return start_child(with(f, M_VALUE), n.value, c); };
    auto to = [&](int32_t st) {
        set_top(with(f, st));
        return R::Ok;
    };
    switch (f.st) {
        case M_OPEN:
            return c == '{' ? to(M_FIRST) : R::Fail;
        case M_FIRST:
            if (c == '}') {
                pop();
                return R::Ok;
            }
            return n.max_members >= 1 ? key(1) : R::Fail;
        case M_KEYDONE:
            return c == ':' ? to(M_AFTER_COLON) : R::Fail;
        case M_AFTER_COLON:
            if (c == ' ' && g_->lim.spaces) return to(M_AFTER_COLON_WS);
            return value();
        case M_AFTER_COLON_WS:
            return value();
        case M_VALUE:
            if (c == ',' && f.a < n.max_members) return to(M_COMMA);
            if (c == '}') {
                pop();
                return R::Ok;
            }
            return R::Fail;
        case M_COMMA:
            if (c == ' ' && g_->lim.spaces) return to(M_COMMA_WS);
            return key(f.a + 1);
        case M_COMMA_WS:
            return key(f.a + 1);
    }
    return R::Fail;
}

Matcher::R Matcher::step_union(const Frame& f, const Node& n, int32_t c) {
    const int32_t alt = c < kMarker ? n.dispatch[size_t(c)] : -1;
    if (alt < 0) return R::Fail;
    if (n.depth_cap && int64_t(stack_.size()) > g_->lim.max_depth &&
        is_container(g_->nodes[size_t(alt)].kind))
        return R::Fail;
    set_top(initial(alt, f.base));
    return R::Again;
}

Matcher::R Matcher::step_call(const Frame& f, const Node& n, int32_t c) {
    switch (f.st) {
        case C_OPEN:
            if (c != MK_CALL_OPEN) return R::Fail;
            set_top(Frame{f.node, C_NAME, 0, n.trie, f.base});
            return R::Ok;
        case C_NAME: {
            if (c < kMarker) {
                const int32_t t = trie_child(g_->tries, f.b, c);
                if (t < 0) return R::Fail;
                set_top(Frame{f.node, C_NAME, 0, t, f.base});
                return R::Ok;
            }
            // The name is whole: the tool's arguments take the marker (<arg_key>, or
            // </tool_call> when it needs none), then the call closes.
            const int32_t j = g_->tries[size_t(f.b)].term;
            if (j < 0) return R::Fail;
            const Frame parent{f.node, C_CLOSE, j, 0, f.base};
            set_top(parent);
            push(initial(n.alts[size_t(j)], sat_add(cost(parent), parent.base)));
            return R::Again;
        }
        case C_CLOSE:
            if (c != MK_CALL_CLOSE) return R::Fail;
            pop();
            return R::Ok;
    }
    return R::Fail;
}

Matcher::R Matcher::step_tags(const Frame& f, const Node& n, int32_t c) {
    TagsFrame t = TagsFrame::of(f);
    auto go = [&](int32_t state, int32_t x) {
        t.state = state;
        t.x = x;
        set_top(t.frame(f.node, f.base));
        return R::Ok;
    };
    switch (t.state) {
        case T_NEXT:
            if (c == MK_KEY_OPEN) {
                if (std::popcount(t.used) >= int(n.props.size())) return R::Fail;
                return go(T_KEY, n.trie);
            }
            // Anything else ends the arguments, once the required ones are all there.
            return members_left(n, t.used) == 0 ? R::Retry : R::Fail;
        case T_KEY: {
            if (c < kMarker) {
                const int32_t k = trie_child(g_->tries, t.x, c);
                if (k < 0) return R::Fail;
                bool viable = false;
                for (const auto& [j, left] : g_->tries[size_t(k)].via)
                    viable = viable || !(t.used >> j & 1);
                return viable ? go(T_KEY, k) : R::Fail;
            }
            const int32_t j = g_->tries[size_t(t.x)].term;
            if (c != MK_KEY_CLOSE || j < 0 || (t.used >> j & 1)) return R::Fail;
            return go(T_VOPEN, j);
        }
        case T_VOPEN: {
            if (c != MK_VALUE_OPEN) return R::Fail;
            // The marker is this frame's; the value starts with the next symbol.
            go(T_VALUE, t.x);
            const Frame parent = stack_.back();
            push(initial(n.props[size_t(t.x)].value, sat_add(cost(parent), parent.base)));
            return R::Ok;
        }
        case T_VALUE:
            if (c != MK_VALUE_CLOSE) return R::Fail;
            t.used |= uint64_t(1) << t.x;
            return go(T_NEXT, 0);
    }
    return R::Fail;
}

// ---------------------------------------------------------------------------
// Linking.

namespace {

// Only a schema's unions and references can fail to link (tool calls build neither).
[[noreturn]] void refuse(const std::string& where, const std::string& msg) {
    throw Error("json schema: " + msg + " (at " + where + ")");
}

// Does the scalar node (Str / Num) accept the whole of `bytes`?
bool scalar_accepts(const Grammar& g, int32_t node, const std::string& bytes) {
    Grammar one;  // a grammar view rooted at `node`
    one.lim = g.lim;
    one.nodes = {g.nodes[size_t(node)]};
    one.root = 0;
    Matcher m(one);
    for (unsigned char c : bytes)
        if (!m.feed(c)) return false;
    return m.complete();
}

std::string show_byte(int c) {
    if (c >= 0x21 && c < 0x7f) return std::string("'") + char(c) + "'";
    return "byte " + std::to_string(c);
}

// 1. References resolved to what they name; a cycle of references alone names nothing.
void resolve_refs(Grammar& g) {
    auto& nodes = g.nodes;
    auto resolve = [&](int32_t id) {
        for (int hops = 0; nodes[size_t(id)].kind == Kind::Ref; ++hops) {
            if (hops > int(nodes.size()))
                refuse(nodes[size_t(id)].where, "'$ref' cycle without content");
            id = nodes[size_t(id)].target;
        }
        return id;
    };
    g.root = resolve(g.root);
    for (auto& n : nodes) {
        if (n.item >= 0) n.item = resolve(n.item);
        if (n.value >= 0) n.value = resolve(n.value);
        for (auto& p : n.props) p.value = resolve(p.value);
        for (auto& a : n.alts) a = resolve(a);
    }
}

// 2. Each union's alternatives with nested unions flattened into it, in order.
std::vector<std::vector<int32_t>> flatten_unions(const std::vector<Node>& nodes) {
    std::vector<std::vector<int32_t>> flat(nodes.size());
    for (size_t u = 0; u < nodes.size(); ++u) {
        if (nodes[u].kind != Kind::Union) continue;
        std::vector<int32_t> out, todo(nodes[u].alts.rbegin(), nodes[u].alts.rend());
        std::set<int32_t> seen{int32_t(u)};
        while (!todo.empty()) {
            const int32_t a = todo.back();
            todo.pop_back();
            if (nodes[size_t(a)].kind == Kind::Union) {
                if (!seen.insert(a).second) continue;
                for (auto it = nodes[size_t(a)].alts.rbegin(); it != nodes[size_t(a)].alts.rend();
                     ++it)
                    todo.push_back(*it);
            } else {
                out.push_back(a);
            }
        }
        flat[u] = std::move(out);
    }
    return flat;
}

// 3. The bytes each leaf can start with.
void set_first_bytes(std::vector<Node>& nodes) {
    for (auto& n : nodes) {
        switch (n.kind) {
            case Kind::Lit:
                for (const auto& l : n.lits) n.first.set(uint8_t(l[0]));
                break;
            case Kind::Str:
                n.first.set('"');
                break;
            case Kind::Num:
                n.first.set('-');
                for (int c = '0'; c <= '9'; ++c) n.first.set(size_t(c));
                break;
            case Kind::Arr:
                n.first.set('[');
                break;
            case Kind::Obj:
            case Kind::Map:
                n.first.set('{');
                break;
            default:
                break;
        }
    }
}

// A union's alternatives as its literals and its other alternatives, each once (sets for
// the duplicates: time linear in the alternatives and their literals). oneOf refuses a
// duplicate, since both alternatives would match.
void split_alternatives(const std::vector<Node>& nodes, const std::vector<int32_t>& flat, bool ex,
                        const std::string& where, std::vector<std::string>& lits,
                        std::vector<int32_t>& others) {
    std::unordered_set<std::string> lit_seen;
    std::unordered_set<int32_t> other_seen;
    for (int32_t a : flat) {
        const Node& n = nodes[size_t(a)];
        if (n.kind == Kind::Lit) {
            for (const auto& l : n.lits) {
                if (!lit_seen.insert(l).second) {
                    if (ex) refuse(where, "'oneOf' alternatives both accept " + l);
                    continue;
                }
                lits.push_back(l);
            }
            continue;
        }
        if (!other_seen.insert(a).second) {
            if (ex) refuse(where, "'oneOf' lists the same alternative twice");
            continue;
        }
        others.push_back(a);
    }
}

// integer | number: number (for anyOf); identical strings / numbers: one.
void merge_scalars(const std::vector<Node>& nodes, bool ex, const std::string& where,
                   std::vector<int32_t>& others) {
    bool has_number = false;
    for (int32_t a : others)
        has_number =
            has_number || (nodes[size_t(a)].kind == Kind::Num && !nodes[size_t(a)].integer);
    if (has_number) {
        for (int32_t a : others)
            if (nodes[size_t(a)].kind == Kind::Num && nodes[size_t(a)].integer && ex)
                refuse(where, "'oneOf' alternatives integer and number overlap");
        others.erase(std::remove_if(others.begin(), others.end(),
                                    [&](int32_t a) {
                                        return nodes[size_t(a)].kind == Kind::Num &&
                                               nodes[size_t(a)].integer;
                                    }),
                     others.end());
    }
    if (ex) return;
    std::vector<int32_t> kept;
    for (int32_t a : others) {
        const Node& n = nodes[size_t(a)];
        bool dup = false;
        for (int32_t k : kept) {
            const Node& m = nodes[size_t(k)];
            dup = dup ||
                  (n.kind == m.kind &&
                   ((n.kind == Kind::Num && n.integer == m.integer) ||
                    (n.kind == Kind::Str && n.min_len == m.min_len && n.max_len == m.max_len)));
        }
        if (!dup) kept.push_back(a);
    }
    others = std::move(kept);
}

// 4. A union normalized: literals merged, integer into number; its alternatives must then
// be told apart by their first byte.
void normalize_union(Grammar& g, size_t u, const std::vector<int32_t>& flat) {
    auto& nodes = g.nodes;
    const bool ex = nodes[u].exclusive;
    const std::string where = nodes[u].where;
    const char* kw = ex ? "oneOf" : "anyOf";
    std::vector<std::string> lits;
    std::vector<int32_t> others;
    split_alternatives(nodes, flat, ex, where, lits, others);
    merge_scalars(nodes, ex, where, others);
    // Literals another alternative also starts with: drop them when it accepts them.
    std::vector<std::string> kept_lits;
    for (const auto& l : lits) {
        int32_t clash = -1;
        for (int32_t a : others)
            if (nodes[size_t(a)].first[uint8_t(l[0])]) clash = a;
        if (clash < 0) {
            kept_lits.push_back(l);
            continue;
        }
        const Kind k = nodes[size_t(clash)].kind;
        if (ex || !(k == Kind::Str || k == Kind::Num) || !scalar_accepts(g, clash, l))
            refuse(where, std::string("'") + kw + "' alternatives overlap on " + l);
    }
    for (size_t i = 0; i < others.size(); ++i)
        for (size_t j = i + 1; j < others.size(); ++j) {
            const auto both = nodes[size_t(others[i])].first & nodes[size_t(others[j])].first;
            if (both.any()) {
                int c = 0;
                while (!both[size_t(c)]) ++c;
                refuse(where, std::string("'") + kw + "' alternatives that both start with " +
                                  show_byte(c) + " are not supported");
            }
        }
    if (!kept_lits.empty()) {
        Node l;
        l.kind = Kind::Lit;
        l.where = where;
        l.lits = std::move(kept_lits);
        for (const auto& s : l.lits) l.first.set(uint8_t(s[0]));
        nodes.push_back(std::move(l));
        others.push_back(int32_t(nodes.size() - 1));
    }
    nodes[u].alts = std::move(others);
    nodes[u].first.reset();
    for (int32_t a : nodes[u].alts) nodes[u].first |= nodes[size_t(a)].first;
}

// The length of a node's shortest document, given its children's.
int64_t shortest(const std::vector<Node>& nodes, const Node& n) {
    switch (n.kind) {
        case Kind::Lit: {
            int64_t m = kInf;
            for (const auto& l : n.lits) m = std::min<int64_t>(m, int64_t(l.size()));
            return m;
        }
        case Kind::Str:
            return int64_t(n.min_len) + 2;
        case Kind::Num:
            return 1;
        case Kind::Arr: {
            const int64_t m = n.min_items, it = nodes[size_t(n.item)].minlen;
            return m == 0 ? 2 : sat_add(sat_mul(m, it), m + 1);
        }
        case Kind::Obj: {
            int64_t sum = 2, cnt = 0;
            for (const auto& p : n.props)
                if (p.required) {
                    sum = sat_add(
                        sum, sat_add(int64_t(p.key.size()) + 1, nodes[size_t(p.value)].minlen));
                    ++cnt;
                }
            return sat_add(sum, std::max<int64_t>(0, cnt - 1));
        }
        case Kind::Map:
            return 2;
        case Kind::Union: {
            int64_t m = kInf;
            for (int32_t a : n.alts) m = std::min(m, nodes[size_t(a)].minlen);
            return m;
        }
        case Kind::Ref:
            return nodes[size_t(n.target)].minlen;
        case Kind::Text:
            return 0;
        case Kind::Call: {
            int64_t m = kInf;
            for (size_t j = 0; j < n.alts.size(); ++j)
                m = std::min(m,
                             sat_add(int64_t(n.lits[j].size()), nodes[size_t(n.alts[j])].minlen));
            return sat_add(m, 2);  // <tool_call> and </tool_call>
        }
        case Kind::Tags: {
            int64_t sum = 0;  // <arg_key> KEY </arg_key> <arg_value> VALUE </arg_value>
            for (const auto& p : n.props)
                if (p.required)
                    sum = sat_add(
                        sum, sat_add(4 + int64_t(p.key.size()), nodes[size_t(p.value)].minlen));
            return sum;
        }
    }
    return kInf;
}

// 5. Shortest document of every node (a fixed point: schemas may recurse); parts with no
// finite document can never be chosen and are dropped.
void shortest_documents(Grammar& g) {
    auto& nodes = g.nodes;
    for (bool changed = true; changed;) {
        changed = false;
        for (auto& n : nodes) {
            const int64_t m = shortest(nodes, n);
            if (m < n.minlen) {
                n.minlen = m;
                changed = true;
            }
        }
    }
    if (nodes[size_t(g.root)].minlen >= kInf)
        refuse("#", "the schema accepts no finite document (required recursion)");
    auto endless = [&](int32_t id) { return nodes[size_t(id)].minlen >= kInf; };
    for (auto& n : nodes) {
        if (n.kind == Kind::Obj)
            n.props.erase(
                std::remove_if(n.props.begin(), n.props.end(),
                               [&](const Prop& p) { return !p.required && endless(p.value); }),
                n.props.end());
        if (n.kind == Kind::Arr && endless(n.item)) n.max_items = 0;
        if (n.kind == Kind::Map && endless(n.value)) n.max_members = 0;
        if (n.kind == Kind::Union)
            n.alts.erase(std::remove_if(n.alts.begin(), n.alts.end(), endless), n.alts.end());
    }
}

// `s` added under trie `root` with terminal `term`; the trie nodes of its path.
std::vector<int32_t> trie_insert(Grammar& g, int32_t root, const std::string& s, int32_t term) {
    int32_t t = root;
    std::vector<int32_t> path{t};
    for (unsigned char c : s) {
        int32_t nx = trie_child(g.tries, t, c);
        if (nx < 0) {
            nx = int32_t(g.tries.size());
            g.tries.emplace_back();
            auto& next = g.tries[size_t(t)].next;
            next.emplace_back(c, nx);
            std::sort(next.begin(), next.end());
        }
        t = nx;
        path.push_back(t);
    }
    g.tries[size_t(t)].term = term;
    return path;
}

int32_t new_trie(Grammar& g) {
    g.tries.emplace_back();
    return int32_t(g.tries.size() - 1);
}

// A union's alternative by first byte, and whether its shortest document is a scalar's.
void union_tables(const std::vector<Node>& nodes, Node& n) {
    n.dispatch.fill(-1);
    for (int32_t a : n.alts)
        for (int c = 0; c < 256; ++c)
            if (nodes[size_t(a)].first[size_t(c)]) n.dispatch[size_t(c)] = int16_t(a);
    int64_t scalar_min = kInf;
    for (int32_t a : n.alts)
        if (!is_container(nodes[size_t(a)].kind))
            scalar_min = std::min(scalar_min, nodes[size_t(a)].minlen);
    n.depth_cap = scalar_min < kInf && scalar_min == n.minlen;
}

// An object's per-member suffix sums and its key trie, each trie node knowing what the
// members reachable through it still cost.
void object_tables(Grammar& g, Node& n) {
    const size_t np = n.props.size();
    n.req_sum.assign(np + 1, 0);
    n.req_cnt.assign(np + 1, 0);
    n.opt_min.assign(np + 1, kInf);
    n.hi.assign(np + 1, int32_t(np) - 1);
    for (size_t j = np; j-- > 0;) {
        const Prop& p = n.props[j];
        const int64_t member = sat_add(int64_t(p.key.size()) + 1, g.nodes[size_t(p.value)].minlen);
        n.req_sum[j] = n.req_sum[j + 1];
        n.req_cnt[j] = n.req_cnt[j + 1];
        n.hi[j] = n.hi[j + 1];
        if (p.required) {
            n.req_sum[j] = sat_add(n.req_sum[j], member);
            ++n.req_cnt[j];
            n.hi[j] = int32_t(j);
        }
        n.opt_min[j] = std::min(n.opt_min[j + 1], member);
    }
    n.trie = new_trie(g);
    for (size_t j = 0; j < np; ++j) {
        const Prop& p = n.props[j];
        const auto path = trie_insert(g, n.trie, p.key, int32_t(j));
        const int64_t after = sat_add(n.req_sum[j + 1], n.req_cnt[j + 1] + 1);
        const int64_t tail = sat_add(sat_add(g.nodes[size_t(p.value)].minlen, 1), after);
        for (size_t d = 0; d < path.size(); ++d)
            g.tries[size_t(path[d])].via.emplace_back(int32_t(j),
                                                      sat_add(int64_t(p.key.size() - d), tail));
    }
}

// 6. Dispatch tables, literal and key tries, per-object suffix sums, trie distances.
void build_tables(Grammar& g) {
    auto& nodes = g.nodes;
    for (auto& n : nodes) {
        if (n.kind == Kind::Union) {
            union_tables(nodes, n);
        } else if (n.kind == Kind::Lit) {
            n.trie = new_trie(g);
            for (size_t i = 0; i < n.lits.size(); ++i)
                trie_insert(g, n.trie, n.lits[i], int32_t(i));
        } else if (n.kind == Kind::Obj) {
            object_tables(g, n);
        } else if (n.kind == Kind::Tags) {
            // Keys in any order: the matcher adds up what the unused required ones cost.
            n.trie = new_trie(g);
            for (size_t j = 0; j < n.props.size(); ++j) {
                const auto path = trie_insert(g, n.trie, n.props[j].key, int32_t(j));
                for (size_t d = 0; d < path.size(); ++d)
                    g.tries[size_t(path[d])].via.emplace_back(int32_t(j),
                                                              int64_t(n.props[j].key.size() - d));
            }
        } else if (n.kind == Kind::Call) {
            // A name is followed by its tool's arguments and </tool_call>.
            n.trie = new_trie(g);
            for (size_t j = 0; j < n.lits.size(); ++j) {
                const auto path = trie_insert(g, n.trie, n.lits[j], int32_t(j));
                g.tries[size_t(path.back())].term_cost =
                    sat_add(nodes[size_t(n.alts[j])].minlen, 1);
            }
        }
    }
    // Children come after their parents in the pool: one backward pass gives distances.
    for (size_t t = g.tries.size(); t-- > 0;) {
        Trie& tr = g.tries[t];
        tr.dist = tr.term >= 0 ? tr.term_cost : kInf;
        for (const auto& [c, nx] : tr.next)
            tr.dist = std::min(tr.dist, g.tries[size_t(nx)].dist + 1);
    }
}

}  // namespace

void link_grammar(Grammar& g) {
    resolve_refs(g);
    const size_t n_before = g.nodes.size();  // unions normalized add literal nodes after
    const std::vector<std::vector<int32_t>> flat = flatten_unions(g.nodes);
    set_first_bytes(g.nodes);
    for (size_t u = 0; u < n_before; ++u)
        if (g.nodes[u].kind == Kind::Union) normalize_union(g, u, flat[u]);
    shortest_documents(g);
    build_tables(g);
}

}  // namespace glm5::runtime

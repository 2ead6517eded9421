#include "runtime/json_constraint.h"

#include <algorithm>
#include <array>
#include <bit>
#include <bitset>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "text/tokenizer.h"

namespace glm5::runtime {

using ojson = nlohmann::ordered_json;

namespace jc {

constexpr int64_t kInf = int64_t(1) << 40;  // "no finite document"
constexpr int64_t kNoBudget = std::numeric_limits<int64_t>::max();

int64_t sat_add(int64_t a, int64_t b) {
    return std::min(kInf, a + b);
}
int64_t sat_mul(int64_t n, int64_t x) {
    if (n == 0) return 0;
    if (x >= kInf || n >= kInf / std::max<int64_t>(1, x)) return kInf;
    return n * x;
}

enum class Kind : uint8_t { Lit, Str, Num, Arr, Obj, Map, Union, Ref };

// Per-kind automaton states. State 0 is always the state before the value's first byte.
enum StrState : int32_t {
    S_OPEN,
    S_BODY,
    S_ESC,
    S_U0,   // after \u
    S_U1,   // one hex digit read
    S_U1D,  // first hex digit was d: the second must be 0-7 (no surrogates)
    S_U2,
    S_U3,
    S_C1,  // one continuation byte owed (80-BF)
    S_C2,
    S_C3,
    S_E0,  // after E0: A0-BF, then one more
    S_ED,  // after ED: 80-9F (no surrogates), then one more
    S_F0,  // after F0: 90-BF, then two more
    S_F4,  // after F4: 80-8F, then two more
};
enum NumState : int32_t {
    N_START,
    N_MINUS,
    N_ZERO,
    N_INT,
    N_DOT,
    N_FRAC,
    N_EXP,
    N_EXPSIGN,
    N_EXPD
};
enum ArrState : int32_t { A_OPEN, A_FIRST, A_VALUE, A_COMMA, A_COMMA_WS };
enum ObjState : int32_t {
    O_OPEN,
    O_FIRST,
    O_KEY,    // b: key trie node
    O_COLON,  // b: property
    O_AFTER_COLON,
    O_AFTER_COLON_WS,
    O_VALUE,
    O_COMMA,
    O_COMMA_WS,
};
enum MapState : int32_t {
    M_OPEN,
    M_FIRST,
    M_KEYDONE,
    M_AFTER_COLON,
    M_AFTER_COLON_WS,
    M_VALUE,
    M_COMMA,
    M_COMMA_WS,
};

// A node of a byte trie of literals (enum values, object keys).
struct Trie {
    std::vector<std::pair<uint8_t, int32_t>> next;  // by byte
    int32_t term = -1;                              // literal / property ending here
    int64_t dist = kInf;                            // bytes to the nearest literal end
    // Object keys: (property, bytes to finish the object choosing it) for every key in
    // the subtree, by property.
    std::vector<std::pair<int32_t, int64_t>> via;
};

struct Prop {
    std::string name;
    std::string key;  // serialized, quotes included
    int32_t value = -1;
    bool required = false;
};

struct Node {
    Kind kind = Kind::Union;
    std::string where;                                // schema location, for messages
    std::vector<std::string> lits;                    // Lit: serialized values
    int32_t trie = -1;                                // Lit values; Obj keys
    int32_t min_len = 0, max_len = 0;                 // Str, code points
    bool integer = false;                             // Num
    int32_t item = -1, min_items = 0, max_items = 0;  // Arr
    std::vector<Prop> props;                          // Obj
    std::vector<int64_t> req_sum, opt_min;            // Obj, per next property (n + 1)
    std::vector<int32_t> req_cnt, hi;
    int32_t key = -1, value = -1, max_members = 0;  // Map
    std::vector<int32_t> alts;                      // Union
    bool exclusive = false;                         // oneOf
    bool depth_cap = false;  // containers may be refused when deep (the minimum is a scalar)
    std::array<int16_t, 256> dispatch{};
    int32_t target = -1;  // Ref
    std::bitset<256> first;
    int64_t minlen = kInf;
};

bool is_container(Kind k) {
    return k == Kind::Arr || k == Kind::Obj || k == Kind::Map;
}

int32_t trie_child(const std::vector<Trie>& tries, int32_t t, uint8_t c) {
    for (const auto& [b, n] : tries[size_t(t)].next)
        if (b == c) return n;
    return -1;
}

struct Frame {
    int32_t node;
    int32_t st;
    int32_t a;
    int32_t b;
    int64_t base;  // bytes the frames below still need once this one is done
};
static_assert(sizeof(Frame) == 24, "no padding: stacks are compared as bytes");

}  // namespace jc

using namespace jc;

class JsonGrammar {
  public:
    std::vector<Node> nodes;
    std::vector<Trie> tries;
    int32_t root = -1;
    JsonLimits lim;
};

int64_t min_document_bytes(const JsonGrammar& g) {
    return g.nodes[size_t(g.root)].minlen;
}

// ---------------------------------------------------------------------------
// The automaton's state: a stack of frames, changed in place with an undo log so
// the vocabulary walk can try a byte and take it back cheaply.

class JsonMatcher {
  public:
    explicit JsonMatcher(const JsonGrammar& g) : g_(&g) {
        stack_.reserve(64);
        log_.reserve(256);
        stack_.push_back(initial(g.root, 0));
    }
    JsonMatcher(const JsonMatcher&) = default;

    // Consumes c, or returns false and leaves the state as it was.
    bool feed(uint8_t c) {
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

    size_t mark() const { return log_.size(); }
    void undo(size_t m) {
        while (log_.size() > m) {
            const Undo& u = log_.back();
            switch (u.op) {
                case Op::Set:
                    stack_.back() = u.f;
                    break;
                case Op::Push:
                    stack_.pop_back();
                    break;
                case Op::Pop:
                    stack_.push_back(u.f);
                    break;
            }
            log_.pop_back();
        }
    }
    void commit() { log_.clear(); }

    bool empty() const { return stack_.empty(); }
    const std::vector<Frame>& stack() const { return stack_; }
    const Frame& top() const { return stack_.back(); }
    bool complete() const { return stack_.empty() || (stack_.size() == 1 && can_end(stack_[0])); }
    int64_t completion() const {
        if (stack_.empty()) return 0;
        return sat_add(cost(stack_.back()), stack_.back().base);
    }

    bool can_end(const Frame& f) const {
        const Node& n = g_->nodes[size_t(f.node)];
        if (n.kind == Kind::Num)
            return f.st == N_ZERO || f.st == N_INT || f.st == N_FRAC || f.st == N_EXPD;
        if (n.kind == Kind::Lit) return g_->tries[size_t(f.b)].term >= 0;
        return false;
    }

    // Bytes the frame needs to finish its value.
    int64_t cost(const Frame& f) const {
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
                return (f.st == N_ZERO || f.st == N_INT || f.st == N_FRAC || f.st == N_EXPD) ? 0
                                                                                             : 1;
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
                        return sat_add(g_->nodes[size_t(n.props[size_t(f.b)].value)].minlen,
                                       after(a));
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
            case Kind::Ref:
                break;
        }
        return kInf;
    }

  private:
    enum class R { Ok, Fail, Retry, Again };
    enum class Op : uint8_t { Set, Push, Pop };
    struct Undo {
        Op op;
        Frame f;
    };

    Frame initial(int32_t node, int64_t base) const {
        const Node& n = g_->nodes[size_t(node)];
        return Frame{node, 0, 0, n.kind == Kind::Lit ? n.trie : 0, base};
    }
    void set_top(const Frame& f) {
        log_.push_back({Op::Set, stack_.back()});
        stack_.back() = f;
    }
    void push(const Frame& f) {
        log_.push_back({Op::Push, f});
        stack_.push_back(f);
    }
    void pop() {
        log_.push_back({Op::Pop, stack_.back()});
        stack_.pop_back();
    }
    // The parent moves to `parent` (its state once the child is done) and the child
    // starts; the same byte then goes to the child.
    R start_child(const Frame& parent, int32_t child, uint8_t c) {
        if (!g_->nodes[size_t(child)].first[c]) return R::Fail;
        set_top(parent);
        push(initial(child, sat_add(cost(parent), parent.base)));
        return R::Again;
    }
    Frame with(Frame f, int32_t st) {
        f.st = st;
        return f;
    }

    R step_lit(const Frame& f, uint8_t c) {
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

    R step_str(const Frame& f, const Node& n, uint8_t c) {
        Frame nf = f;
        auto go = [&](int32_t st) {
            nf.st = st;
            set_top(nf);
            return R::Ok;
        };
        auto is_hex = [](uint8_t x) {
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

    R step_num(const Frame& f, const Node& n, uint8_t c) {
        const JsonLimits& L = g_->lim;
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

    R step_arr(const Frame& f, const Node& n, uint8_t c) {
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

    bool key_viable(const Node& n, int32_t t, int32_t a) const {
        if (a >= int32_t(n.props.size())) return false;
        const int32_t hi = n.hi[size_t(a)];
        for (const auto& [j, c] : g_->tries[size_t(t)].via)
            if (j >= a && j <= hi) return true;
        return false;
    }

    R step_obj(const Frame& f, const Node& n, uint8_t c) {
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

    R step_map(const Frame& f, const Node& n, uint8_t c) {
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

    R step_union(const Frame& f, const Node& n, uint8_t c) {
        const int32_t alt = n.dispatch[c];
        if (alt < 0) return R::Fail;
        if (n.depth_cap && int64_t(stack_.size()) > g_->lim.max_depth &&
            is_container(g_->nodes[size_t(alt)].kind))
            return R::Fail;
        set_top(initial(alt, f.base));
        return R::Again;
    }

    const JsonGrammar* g_;
    std::vector<Frame> stack_;
    std::vector<Undo> log_;
};

// ---------------------------------------------------------------------------
// Schema compiler.

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& msg) {
    throw Error("json schema: " + msg + " (at " + where + ")");
}

const std::set<std::string> kAlwaysRefused = {"not",          "if",
                                              "then",         "else",
                                              "$dynamicRef",  "$recursiveRef",
                                              "dependencies", "dependentSchemas"};
const std::set<std::string> kNumberRefused = {"minimum", "maximum", "exclusiveMinimum",
                                              "exclusiveMaximum", "multipleOf"};
const std::set<std::string> kStringRefused = {"pattern"};
const std::set<std::string> kArrayRefused = {"prefixItems", "contains",         "minContains",
                                             "maxContains", "unevaluatedItems", "additionalItems"};
const std::set<std::string> kObjectRefused = {"patternProperties", "propertyNames",
                                              "dependentRequired"};
// Keywords that restrict what is valid and that this compiler implements.
const std::set<std::string> kValidity = {"type",
                                         "enum",
                                         "const",
                                         "properties",
                                         "required",
                                         "items",
                                         "additionalProperties",
                                         "minLength",
                                         "maxLength",
                                         "minItems",
                                         "maxItems",
                                         "anyOf",
                                         "oneOf",
                                         "allOf",
                                         "$ref",
                                         "minProperties",
                                         "maxProperties",
                                         "uniqueItems",
                                         "unevaluatedProperties"};

enum TypeBit : unsigned {
    T_NULL = 1,
    T_BOOL = 2,
    T_INT = 4,
    T_NUM = 8,
    T_STR = 16,
    T_ARR = 32,
    T_OBJ = 64,
    T_ALL = 127,
};

unsigned type_bit(const std::string& t, const std::string& where) {
    if (t == "null") return T_NULL;
    if (t == "boolean") return T_BOOL;
    if (t == "integer") return T_INT;
    if (t == "number") return T_NUM;
    if (t == "string") return T_STR;
    if (t == "array") return T_ARR;
    if (t == "object") return T_OBJ;
    refuse(where, "unknown type '" + t + "'");
}

// Which type names a JSON value satisfies.
unsigned value_types(const ojson& v) {
    switch (v.type()) {
        case ojson::value_t::null:
            return T_NULL;
        case ojson::value_t::boolean:
            return T_BOOL;
        case ojson::value_t::number_integer:
        case ojson::value_t::number_unsigned:
            return T_INT | T_NUM;
        case ojson::value_t::number_float: {
            const double d = v.get<double>();
            return d == double(int64_t(d)) ? (T_INT | T_NUM) : T_NUM;
        }
        case ojson::value_t::string:
            return T_STR;
        case ojson::value_t::array:
            return T_ARR;
        case ojson::value_t::object:
            return T_OBJ;
        default:
            return 0;
    }
}

class Compiler {
  public:
    Compiler(const ojson& root, const JsonLimits& lim, JsonGrammar& g)
        : root_(root), lim_(lim), g_(g) {}

    int32_t compile(const ojson& s, const std::string& where, int depth) {
        if (depth > 64) refuse(where, "schema nested too deeply");
        if (s.is_boolean()) {
            if (s.get<bool>()) return any();
            refuse(where, "the schema 'false' accepts nothing");
        }
        if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");

        for (const auto& kw : kAlwaysRefused)
            if (s.contains(kw)) refuse(where, "keyword '" + kw + "' is not supported");
        auto others = [&](std::initializer_list<const char*> except) {
            for (const auto& [k, v] : s.items()) {
                if (!kValidity.count(k)) continue;
                bool skip = false;
                for (const char* e : except) skip = skip || k == e;
                if (!skip) return k;
            }
            return std::string();
        };

        if (s.contains("$ref")) {
            const std::string o = others({"$ref"});
            if (!o.empty()) refuse(where, "'" + o + "' next to '$ref' is not supported");
            if (!s["$ref"].is_string()) refuse(where, "'$ref' must be a string");
            return ref(s["$ref"].get<std::string>(), where, depth);
        }
        if (s.contains("allOf")) {
            const auto& all = s["allOf"];
            if (!all.is_array() || all.size() != 1)
                refuse(where, "'allOf' with other than one subschema is not supported");
            const std::string o = others({"allOf"});
            if (!o.empty()) refuse(where, "'" + o + "' next to 'allOf' is not supported");
            return compile(all[0], where + "/allOf/0", depth + 1);
        }
        if (s.contains("anyOf") || s.contains("oneOf")) {
            const bool one = s.contains("oneOf");
            if (one && s.contains("anyOf")) refuse(where, "'anyOf' with 'oneOf' is not supported");
            const char* kw = one ? "oneOf" : "anyOf";
            const std::string o = others({kw});
            if (!o.empty()) refuse(where, "'" + o + "' next to '" + kw + "' is not supported");
            const auto& alts = s[kw];
            if (!alts.is_array() || alts.empty())
                refuse(where, std::string("'") + kw + "' must be a non-empty array");
            Node u;
            u.kind = Kind::Union;
            u.where = where;
            u.exclusive = one;
            for (size_t i = 0; i < alts.size(); ++i)
                u.alts.push_back(
                    compile(alts[i], where + "/" + kw + "/" + std::to_string(i), depth + 1));
            return add(std::move(u));
        }

        // The types this schema may produce.
        unsigned types = 0;
        if (s.contains("type")) {
            const auto& t = s["type"];
            if (t.is_string()) {
                types = type_bit(t.get<std::string>(), where);
            } else if (t.is_array() && !t.empty()) {
                for (const auto& x : t) {
                    if (!x.is_string()) refuse(where, "'type' must name types");
                    types |= type_bit(x.get<std::string>(), where);
                }
            } else {
                refuse(where, "'type' must be a string or a non-empty array");
            }
        } else if (s.contains("enum") || s.contains("const")) {
            types = T_ALL;
        } else if (s.contains("properties") || s.contains("required") ||
                   s.contains("additionalProperties") || s.contains("minProperties") ||
                   s.contains("maxProperties")) {
            types = T_OBJ;
        } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
            types = T_ARR;
        } else if (s.contains("minLength") || s.contains("maxLength")) {
            types = T_STR;
        } else {
            types = T_ALL;
        }
        auto check = [&](const std::set<std::string>& kws) {
            for (const auto& kw : kws)
                if (s.contains(kw)) refuse(where, "keyword '" + kw + "' is not supported");
        };
        if (types & (T_INT | T_NUM)) check(kNumberRefused);
        if (types & T_STR) check(kStringRefused);
        if (types & T_ARR) {
            check(kArrayRefused);
            if (s.contains("uniqueItems") && s["uniqueItems"] != false)
                refuse(where, "keyword 'uniqueItems' is not supported");
        }
        if (types & T_OBJ) check(kObjectRefused);

        if (s.contains("enum") || s.contains("const")) return literals(s, types, where, others);

        if (types == T_ALL && !s.contains("type")) return any();

        std::vector<int32_t> alts;
        if (types & T_NULL) alts.push_back(lit({"null"}, where));
        if (types & T_BOOL) alts.push_back(lit({"true", "false"}, where));
        if (types & (T_INT | T_NUM)) {
            Node n;
            n.kind = Kind::Num;
            n.where = where;
            n.integer = !(types & T_NUM);
            alts.push_back(add(std::move(n)));
        }
        if (types & T_STR) {
            Node n;
            n.kind = Kind::Str;
            n.where = where;
            n.min_len = count(s, "minLength", 0, where);
            n.max_len = count(s, "maxLength", std::max(n.min_len, lim_.max_string_chars), where);
            if (n.max_len < n.min_len) refuse(where, "maxLength is below minLength");
            alts.push_back(add(std::move(n)));
        }
        if (types & T_ARR) alts.push_back(array(s, where, depth));
        if (types & T_OBJ) alts.push_back(object(s, where, depth));
        if (alts.size() == 1) return alts[0];
        Node u;
        u.kind = Kind::Union;
        u.where = where;
        u.alts = std::move(alts);
        return add(std::move(u));
    }

    // Any JSON value: one shared node.
    int32_t any() {
        if (any_ >= 0) return any_;
        Node u;
        u.kind = Kind::Union;
        u.where = "any value";
        any_ = add(std::move(u));
        Node m;
        m.kind = Kind::Map;
        m.where = "any value";
        m.key = key_string();
        m.value = any_;
        m.max_members = lim_.max_object_members;
        const int32_t map = add(std::move(m));
        Node a;
        a.kind = Kind::Arr;
        a.where = "any value";
        a.item = any_;
        a.max_items = lim_.max_array_items;
        const int32_t arr = add(std::move(a));
        Node s;
        s.kind = Kind::Str;
        s.where = "any value";
        s.max_len = lim_.max_string_chars;
        const int32_t str = add(std::move(s));
        Node n;
        n.kind = Kind::Num;
        n.where = "any value";
        const int32_t num = add(std::move(n));
        const int32_t l = lit({"true", "false", "null"}, "any value");
        g_.nodes[size_t(any_)].alts = {map, arr, str, num, l};
        return any_;
    }

    int32_t add(Node n) {
        g_.nodes.push_back(std::move(n));
        return int32_t(g_.nodes.size() - 1);
    }

  private:
    int32_t key_string() {
        if (key_ >= 0) return key_;
        Node s;
        s.kind = Kind::Str;
        s.where = "object key";
        s.max_len = lim_.max_string_chars;
        key_ = add(std::move(s));
        return key_;
    }

    int32_t lit(std::vector<std::string> values, const std::string& where) {
        Node n;
        n.kind = Kind::Lit;
        n.where = where;
        n.lits = std::move(values);
        return add(std::move(n));
    }

    int32_t count(const ojson& s, const char* kw, int32_t dflt, const std::string& where) {
        if (!s.contains(kw)) return dflt;
        const auto& v = s[kw];
        if (!v.is_number_integer() && !v.is_number_unsigned() &&
            !(v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))))
            refuse(where, std::string("'") + kw + "' must be a non-negative integer");
        const double d = v.get<double>();
        if (d < 0) refuse(where, std::string("'") + kw + "' must be a non-negative integer");
        return int32_t(std::min(d, 1e6));  // beyond any budget anyway
    }

    template <class Others>
    int32_t literals(const ojson& s, unsigned types, const std::string& where, Others& others) {
        const std::string o = others({"enum", "const", "type"});
        if (!o.empty()) refuse(where, "'" + o + "' next to 'enum' / 'const' is not supported");
        std::vector<ojson> values;
        if (s.contains("enum")) {
            if (!s["enum"].is_array() || s["enum"].empty())
                refuse(where, "'enum' must be a non-empty array");
            for (const auto& v : s["enum"]) values.push_back(v);
        }
        if (s.contains("const")) {
            if (s.contains("enum")) {
                std::vector<ojson> both;
                for (const auto& v : values)
                    if (v == s["const"]) both.push_back(v);
                values = std::move(both);
            } else {
                values.push_back(s["const"]);
            }
        }
        std::vector<std::string> lits;
        for (const auto& v : values) {
            if (!(value_types(v) & types)) continue;
            std::string d = v.dump();
            if (std::find(lits.begin(), lits.end(), d) == lits.end()) lits.push_back(std::move(d));
        }
        if (lits.empty()) refuse(where, "no 'enum' / 'const' value has the schema's type");
        return lit(std::move(lits), where);
    }

    int32_t array(const ojson& s, const std::string& where, int depth) {
        Node n;
        n.kind = Kind::Arr;
        n.where = where;
        if (s.contains("items")) {
            if (s["items"].is_array())
                refuse(where, "'items' as an array (tuple validation) is not supported");
            n.item = compile(s["items"], where + "/items", depth + 1);
        } else {
            n.item = any();
        }
        n.min_items = count(s, "minItems", 0, where);
        n.max_items = count(s, "maxItems", std::max(n.min_items, lim_.max_array_items), where);
        if (n.max_items < n.min_items) refuse(where, "maxItems is below minItems");
        return add(std::move(n));
    }

    int32_t object(const ojson& s, const std::string& where, int depth) {
        const bool has_props = s.contains("properties");
        if (has_props && !s["properties"].is_object())
            refuse(where, "'properties' must be an object");
        std::vector<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) refuse(where, "'required' must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) refuse(where, "'required' must list property names");
                required.push_back(r.get<std::string>());
            }
        }
        const int32_t min_props = count(s, "minProperties", 0, where);
        const int32_t max_props = count(s, "maxProperties", 1 << 30, where);

        if (!has_props && required.empty() &&
            !(s.contains("additionalProperties") && s["additionalProperties"] == false)) {
            // An open map: string keys, values of additionalProperties.
            if (min_props > 0) refuse(where, "'minProperties' is not supported here");
            if (s.contains("unevaluatedProperties") && s["unevaluatedProperties"] != true)
                refuse(where, "keyword 'unevaluatedProperties' is not supported");
            Node n;
            n.kind = Kind::Map;
            n.where = where;
            n.key = key_string();
            n.max_members = std::min(lim_.max_object_members, max_props);
            const int32_t value =
                s.contains("additionalProperties")
                    ? compile(s["additionalProperties"], where + "/additionalProperties", depth + 1)
                    : any();
            n.value = value;
            return add(std::move(n));
        }

        Node n;
        n.kind = Kind::Obj;
        n.where = where;
        std::set<std::string> req(required.begin(), required.end());
        if (has_props) {
            for (const auto& [name, sub] : s["properties"].items()) {
                Prop p;
                p.name = name;
                p.key = ojson(name).dump();
                p.required = req.count(name) > 0;
                p.value = compile(sub, where + "/properties/" + name, depth + 1);
                n.props.push_back(std::move(p));
            }
        }
        for (const auto& r : required) {  // required but not declared: any value
            bool found = false;
            for (const auto& p : n.props) found = found || p.name == r;
            if (found) continue;
            Prop p;
            p.name = r;
            p.key = ojson(r).dump();
            p.required = true;
            p.value = any();
            n.props.push_back(std::move(p));
        }
        if (min_props > int32_t(req.size()))
            refuse(where,
                   "'minProperties' above the number of required properties is not "
                   "supported");
        if (max_props < int32_t(n.props.size()))
            refuse(where, "'maxProperties' below the number of properties is not supported");
        return add(std::move(n));
    }

    int32_t ref(const std::string& r, const std::string& where, int depth) {
        if (r.empty() || r[0] != '#')
            refuse(where, "only local '$ref' (\"#/...\") is supported, not \"" + r + "\"");
        if (auto it = refs_.find(r); it != refs_.end()) return it->second;
        Node n;
        n.kind = Kind::Ref;
        n.where = r;
        const int32_t id = add(std::move(n));
        refs_[r] = id;
        const std::string ptr = r.substr(1);
        const ojson* target = &root_;
        if (!ptr.empty()) {
            if (ptr[0] != '/') refuse(where, "'$ref' anchors are not supported: \"" + r + "\"");
            try {
                target = &root_.at(ojson::json_pointer(ptr));
            } catch (const std::exception&) {
                refuse(where, "'$ref' target \"" + r + "\" does not exist");
            }
        }
        const int32_t t = compile(*target, r, depth + 1);
        g_.nodes[size_t(id)].target = t;
        return id;
    }

    const ojson& root_;
    const JsonLimits& lim_;
    JsonGrammar& g_;
    std::map<std::string, int32_t> refs_;
    int32_t any_ = -1;
    int32_t key_ = -1;
};

// Does the scalar node (Str / Num) accept the whole of `bytes`?
bool scalar_accepts(const JsonGrammar& g, int32_t node, const std::string& bytes) {
    JsonGrammar one;  // a grammar view rooted at `node`
    one.lim = g.lim;
    one.nodes = {g.nodes[size_t(node)]};
    one.root = 0;
    JsonMatcher m(one);
    for (unsigned char c : bytes)
        if (!m.feed(c)) return false;
    return m.complete();
}

std::string show_byte(int c) {
    if (c >= 0x21 && c < 0x7f) return std::string("'") + char(c) + "'";
    return "byte " + std::to_string(c);
}

void finish(JsonGrammar& g) {
    auto& nodes = g.nodes;

    // 1. Resolve references.
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

    // 2. Flatten nested unions.
    const size_t n_before = nodes.size();
    std::vector<std::vector<int32_t>> flat(n_before);
    for (size_t u = 0; u < n_before; ++u) {
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

    // 3. First bytes of the leaves.
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

    // 4. Normalize unions: merge literals, integer into number; alternatives must then be
    // told apart by their first byte.
    for (size_t u = 0; u < n_before; ++u) {
        if (nodes[u].kind != Kind::Union) continue;
        const bool ex = nodes[u].exclusive;
        const std::string where = nodes[u].where;
        const char* kw = ex ? "oneOf" : "anyOf";
        std::vector<std::string> lits;
        std::vector<int32_t> others;
        for (int32_t a : flat[u]) {
            const Node& n = nodes[size_t(a)];
            if (n.kind == Kind::Lit) {
                for (const auto& l : n.lits) {
                    if (std::find(lits.begin(), lits.end(), l) != lits.end()) {
                        if (ex) refuse(where, "'oneOf' alternatives both accept " + l);
                        continue;
                    }
                    lits.push_back(l);
                }
                continue;
            }
            if (std::find(others.begin(), others.end(), a) != others.end()) {
                if (ex) refuse(where, "'oneOf' lists the same alternative twice");
                continue;
            }
            others.push_back(a);
        }
        auto drop_if = [&](auto pred) {
            others.erase(std::remove_if(others.begin(), others.end(), pred), others.end());
        };
        // integer | number: number (for anyOf); identical strings / numbers: one.
        bool has_number = false;
        for (int32_t a : others)
            has_number =
                has_number || (nodes[size_t(a)].kind == Kind::Num && !nodes[size_t(a)].integer);
        if (has_number) {
            for (int32_t a : others)
                if (nodes[size_t(a)].kind == Kind::Num && nodes[size_t(a)].integer && ex)
                    refuse(where, "'oneOf' alternatives integer and number overlap");
            drop_if([&](int32_t a) {
                return nodes[size_t(a)].kind == Kind::Num && nodes[size_t(a)].integer;
            });
        }
        if (!ex) {
            std::vector<int32_t> kept;
            for (int32_t a : others) {
                const Node& n = nodes[size_t(a)];
                bool dup = false;
                for (int32_t k : kept) {
                    const Node& m = nodes[size_t(k)];
                    dup = dup ||
                          (n.kind == m.kind && ((n.kind == Kind::Num && n.integer == m.integer) ||
                                                (n.kind == Kind::Str && n.min_len == m.min_len &&
                                                 n.max_len == m.max_len)));
                }
                if (!dup) kept.push_back(a);
            }
            others = std::move(kept);
        }
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

    // 5. Shortest document of every node (a fixed point: schemas may recurse).
    auto minlen_of = [&](const Node& n) -> int64_t {
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
        }
        return kInf;
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (auto& n : nodes) {
            const int64_t m = minlen_of(n);
            if (m < n.minlen) {
                n.minlen = m;
                changed = true;
            }
        }
    }
    if (nodes[size_t(g.root)].minlen >= kInf)
        refuse("#", "the schema accepts no finite document (required recursion)");
    // Parts with no finite document can never be chosen.
    for (auto& n : nodes) {
        if (n.kind == Kind::Obj)
            n.props.erase(std::remove_if(n.props.begin(), n.props.end(),
                                         [&](const Prop& p) {
                                             return !p.required &&
                                                    nodes[size_t(p.value)].minlen >= kInf;
                                         }),
                          n.props.end());
        if (n.kind == Kind::Arr && nodes[size_t(n.item)].minlen >= kInf) n.max_items = 0;
        if (n.kind == Kind::Map && nodes[size_t(n.value)].minlen >= kInf) n.max_members = 0;
        if (n.kind == Kind::Union)
            n.alts.erase(std::remove_if(n.alts.begin(), n.alts.end(),
                                        [&](int32_t a) { return nodes[size_t(a)].minlen >= kInf; }),
                         n.alts.end());
    }

    // 6. Dispatch tables, literal and key tries, per-object suffix sums.
    auto insert = [&](int32_t root, const std::string& s, int32_t term) {
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
    };
    for (auto& n : nodes) {
        if (n.kind == Kind::Union) {
            n.dispatch.fill(-1);
            for (int32_t a : n.alts)
                for (int c = 0; c < 256; ++c)
                    if (nodes[size_t(a)].first[size_t(c)]) n.dispatch[size_t(c)] = int16_t(a);
            int64_t scalar_min = kInf;
            for (int32_t a : n.alts)
                if (!is_container(nodes[size_t(a)].kind))
                    scalar_min = std::min(scalar_min, nodes[size_t(a)].minlen);
            n.depth_cap = scalar_min < kInf && scalar_min == n.minlen;
        } else if (n.kind == Kind::Lit) {
            n.trie = int32_t(g.tries.size());
            g.tries.emplace_back();
            for (size_t i = 0; i < n.lits.size(); ++i) insert(n.trie, n.lits[i], int32_t(i));
        } else if (n.kind == Kind::Obj) {
            const size_t np = n.props.size();
            n.req_sum.assign(np + 1, 0);
            n.req_cnt.assign(np + 1, 0);
            n.opt_min.assign(np + 1, kInf);
            n.hi.assign(np + 1, int32_t(np) - 1);
            for (size_t j = np; j-- > 0;) {
                const Prop& p = n.props[j];
                const int64_t member =
                    sat_add(int64_t(p.key.size()) + 1, nodes[size_t(p.value)].minlen);
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
            n.trie = int32_t(g.tries.size());
            g.tries.emplace_back();
            for (size_t j = 0; j < np; ++j) {
                const Prop& p = n.props[j];
                const auto path = insert(n.trie, p.key, int32_t(j));
                const int64_t after = sat_add(n.req_sum[j + 1], n.req_cnt[j + 1] + 1);
                const int64_t tail = sat_add(sat_add(nodes[size_t(p.value)].minlen, 1), after);
                for (size_t d = 0; d < path.size(); ++d)
                    g.tries[size_t(path[d])].via.emplace_back(
                        int32_t(j), sat_add(int64_t(p.key.size() - d), tail));
            }
        }
    }
    // Children come after their parents in the pool: one backward pass gives distances.
    for (size_t t = g.tries.size(); t-- > 0;) {
        Trie& tr = g.tries[t];
        tr.dist = tr.term >= 0 ? 0 : kInf;
        for (const auto& [c, nx] : tr.next)
            tr.dist = std::min(tr.dist, g.tries[size_t(nx)].dist + 1);
    }
}

void check_limits(const JsonLimits& L) {
    if (L.max_string_chars < 0 || L.max_array_items < 0 || L.max_object_members < 0 ||
        L.max_int_digits < 1 || L.max_frac_digits < 1 || L.max_exp_digits < 1 || L.max_depth < 0)
        throw Error("json constraint: invalid limits");
}

// OpenAI's {"name", "schema", "strict"} wrapper, or a bare schema.
const ojson& unwrap(const ojson& s) {
    if (s.is_object() && s.contains("schema") && !s.contains("type") && !s.contains("properties") &&
        (s["schema"].is_object() || s["schema"].is_boolean()))
        return s["schema"];
    return s;
}

}  // namespace

std::shared_ptr<const JsonGrammar> compile_json_schema(const ojson& schema, const JsonLimits& lim) {
    check_limits(lim);
    const ojson& s = unwrap(schema);
    auto g = std::make_shared<JsonGrammar>();
    g->lim = lim;
    Compiler c(s, lim, *g);
    g->root = c.compile(s, "#", 0);
    finish(*g);
    return g;
}

std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::json& schema,
                                                       const JsonLimits& lim) {
    return compile_json_schema(ojson::parse(schema.dump()), lim);
}

std::shared_ptr<const JsonGrammar> json_object_grammar(const JsonLimits& lim) {
    return compile_json_schema(ojson{{"type", "object"}}, lim);
}

std::shared_ptr<const JsonGrammar> grammar_from_response_format(const ojson& rf,
                                                                const JsonLimits& lim) {
    if (rf.is_null()) return nullptr;
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
        throw Error("response_format must be an object with a \"type\"");
    const std::string type = rf["type"].get<std::string>();
    if (type == "text") return nullptr;
    if (type == "json_object") {
        if (rf.contains("schema")) return compile_json_schema(rf["schema"], lim);
        return json_object_grammar(lim);
    }
    if (type == "json_schema") {
        if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
            throw Error("response_format.json_schema must be an object");
        const ojson& js = rf["json_schema"];
        // The wrapper without a schema: any object, as json_object.
        if (!js.contains("schema") && (js.contains("name") || js.contains("strict")) &&
            !js.contains("type") && !js.contains("properties"))
            return json_object_grammar(lim);
        return compile_json_schema(js, lim);
    }
    throw Error(
        "response_format.type must be \"text\", \"json_object\" or \"json_schema\", not \"" + type +
        "\"");
}

std::shared_ptr<const JsonGrammar> grammar_from_response_format(const nlohmann::json& rf,
                                                                const JsonLimits& lim) {
    return grammar_from_response_format(ojson::parse(rf.dump()), lim);
}

// ---------------------------------------------------------------------------
// Vocabulary.

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

void JsonVocab::TokenTrie::build(const std::vector<int32_t>& ids,
                                 const std::vector<std::string>& bytes) {
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

JsonVocab::~JsonVocab() = default;

JsonVocab::JsonVocab(const text::Tokenizer& tok, std::vector<int32_t> stop_ids) {
    n_vocab_ = tok.n_vocab();
    stop_ids_ = stop_ids.empty() ? tok.stop_ids() : std::move(stop_ids);
    if (stop_ids_.empty())
        throw Error("json constraint: the vocabulary has no end-of-generation token");
    for (int32_t s : stop_ids_)
        if (!tok.is_valid(s)) throw Error("json constraint: stop token id out of range");
    think_end_ = tok.find("</think>");

    // Bytes the grammar can ever emit: no control bytes (strings escape them, and the only
    // white space is ' ') and none that cannot occur in UTF-8. Tokens holding another byte
    // are never allowed, so they stay out of the trie (newline and indentation tokens).
    auto emittable = [](uint8_t b) { return b >= 0x20 && b != 0xC0 && b != 0xC1 && b < 0xF5; };
    bytes_.resize(size_t(n_vocab_));
    std::vector<int32_t> ids;
    bool have[256] = {};
    for (int32_t id = 0; id < n_vocab_; ++id) {
        const text::TokenType t = tok.token_type(id);
        const bool usable = t == text::TokenType::Normal || t == text::TokenType::Byte ||
                            t == text::TokenType::Undefined;
        const std::string& b = tok.token_bytes(id);
        if (!usable || b.empty()) continue;
        if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) continue;
        if (!std::all_of(b.begin(), b.end(), [&](char c) { return emittable(uint8_t(c)); }))
            continue;
        bytes_[size_t(id)] = b;
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

// ---------------------------------------------------------------------------
// The constraint.

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonGrammar> g,
                               std::shared_ptr<const JsonVocab> v)
    : g_(std::move(g)),
      v_(std::move(v)),
      m_(std::make_unique<JsonMatcher>(*g_)),
      remaining_(kNoBudget) {}

JsonConstraint::JsonConstraint(const JsonConstraint& o)
    : TokenConstraint(),
      g_(o.g_),
      v_(o.v_),
      m_(std::make_unique<JsonMatcher>(*o.m_)),
      text_(o.text_),
      remaining_(o.remaining_),
      stopped_(o.stopped_) {}

JsonConstraint::~JsonConstraint() = default;

bool JsonConstraint::complete() const {
    return m_->complete();
}

int64_t JsonConstraint::min_completion() const {
    return m_->completion();
}

void JsonConstraint::set_remaining(int64_t n) {
    if (n != remaining_) dirty_ = true;
    remaining_ = n;
}

// A token may come when, after it, the document can still close in the tokens left; when
// that is already impossible, when it at least brings the end closer.
int64_t JsonConstraint::threshold() const {
    if (remaining_ == kNoBudget) return kNoBudget;
    const int64_t c = m_->completion();
    return c <= remaining_ ? remaining_ - 1 : c - 1;
}

bool JsonConstraint::allows(int32_t token) const {
    if (token < 0 || token >= v_->n_vocab_) return false;
    if (dirty_) compute();
    return (bits_[size_t(token) / 64] >> (token % 64)) & 1;
}

size_t JsonConstraint::allowed_count() const {
    if (dirty_) compute();
    size_t n = 0;
    for (uint64_t w : bits_) n += size_t(std::popcount(w));
    return n;
}

void JsonConstraint::compute() const {
    const JsonVocab& v = *v_;
    bits_.assign((size_t(v.n_vocab_) + 63) / 64, 0);
    dirty_ = false;
    if (stopped_) return;
    auto set = [&](int32_t id) { bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64); };
    JsonMatcher& m = *m_;
    if (m.complete())
        for (int32_t s : v.stop_ids_) set(s);
    if (m.empty()) return;
    const int64_t T = threshold();
    const bool budget = T != kNoBudget;

    // In a string body, plain text tokens depend only on their character count.
    const Frame top = m.top();
    const Node& tn = g_->nodes[size_t(top.node)];
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

    // Walk the token trie with the automaton, skipping subtrees it refuses (by the budget
    // too when `prune`); in a string body only the tokens that are not plain text are left.
    // `found` gets each token the budget lets through with the completion it leaves.
    auto walk = [&](const JsonVocab::TokenTrie& trie, bool prune, auto&& found) {
        std::vector<size_t> path;  // undo marks of the nodes above
        path.reserve(64);
        const int32_t N = int32_t(trie.size());
        const auto* nodes = trie.nodes.data();
        for (int32_t i = 1; i < N;) {
            const auto& nd = nodes[i];
            const size_t d = nd.depth;
            while (path.size() >= d) {
                m.undo(path.back());
                path.pop_back();
            }
            const size_t mark = m.mark();
            if (!m.feed(nd.label)) {
                i = nd.end;
                continue;
            }
            int64_t c = 0;
            if (budget || !prune) {
                c = m.completion();
                // One byte shortens the completion by at most one.
                if (prune && c - int64_t(nd.maxdepth - d) > T) {
                    m.undo(mark);
                    i = nd.end;
                    continue;
                }
            }
            path.push_back(mark);
            for (int32_t k = nd.tok_begin; k < nodes[i + 1].tok_begin; ++k)
                found(trie.tok_ids[size_t(k)], c);
            ++i;
        }
        m.undo(0);
    };
    auto set_within = [&](int32_t id, int64_t c) {
        if (!budget || c <= T) set(id);
    };
    if (!fast) {
        walk(v.all_, true, set_within);
        return;
    }
    const bool cacheable =
        top.a >= tn.min_len && int64_t(tn.max_len) - top.a >= v.max_nonplain_bytes_;
    if (!cacheable) {
        walk(v.nonplain_, true, set_within);
        return;
    }
    // The stack with the top's character count left out.
    std::vector<Frame> key = m.stack();
    key.back().a = 0;
    const auto* kb = reinterpret_cast<const uint8_t*>(key.data());
    if (!string_cache_valid_ || !std::equal(kb, kb + key.size() * sizeof(Frame),
                                            string_cache_key_.begin(), string_cache_key_.end())) {
        string_cache_.clear();
        walk(v.nonplain_, false, [&](int32_t id, int64_t c) { string_cache_.emplace_back(id, c); });
        string_cache_key_.assign(kb, kb + key.size() * sizeof(Frame));
        string_cache_valid_ = true;
    }
    for (const auto& [id, c] : string_cache_) set_within(id, c);
}

bool JsonConstraint::allows_uncached(int32_t token) const {
    const JsonVocab& v = *v_;
    if (stopped_ || token < 0 || token >= v.n_vocab_) return false;
    if (std::find(v.stop_ids_.begin(), v.stop_ids_.end(), token) != v.stop_ids_.end())
        return m_->complete();
    const std::string& b = v.bytes_[size_t(token)];
    if (b.empty()) return false;
    const int64_t T = threshold();
    JsonMatcher m = *m_;
    for (unsigned char c : b)
        if (!m.feed(c)) return false;
    return T == kNoBudget || m.completion() <= T;
}

void JsonConstraint::accept(int32_t token) {
    const JsonVocab& v = *v_;
    if (stopped_) throw Error("json constraint: token after the end of the output");
    if (token < 0 || token >= v.n_vocab_) throw Error("json constraint: token id out of range");
    dirty_ = true;
    if (std::find(v.stop_ids_.begin(), v.stop_ids_.end(), token) != v.stop_ids_.end()) {
        if (!m_->complete())
            throw Error("json constraint: stop token before the document is complete");
        stopped_ = true;
        return;
    }
    const std::string& b = v.bytes_[size_t(token)];
    if (b.empty())
        throw Error("json constraint: token " + std::to_string(token) + " is not allowed");
    for (unsigned char c : b)
        if (!m_->feed(c)) {
            m_->undo(0);
            throw Error("json constraint: token " + std::to_string(token) +
                        " does not continue the document");
        }
    m_->commit();
    text_ += b;
}

// ---------------------------------------------------------------------------
// Reasoning first, then the document.

namespace {

class ThinkThenJson : public TokenConstraint {
  public:
    ThinkThenJson(std::shared_ptr<const JsonGrammar> g, std::shared_ptr<const JsonVocab> v)
        : inner_(std::move(g), v), v_(std::move(v)), think_end_(v_->think_end()) {}

    bool allows(int32_t t) const override {
        if (!thinking_) return inner_.allows(t);
        if (t == think_end_) return true;
        if (t < 0 || t >= v_->n_vocab()) return false;
        const auto& s = v_->stop_ids();
        if (std::find(s.begin(), s.end(), t) != s.end()) return false;
        // Leave room for </think> and the shortest document.
        return remaining_ == kNoBudget || remaining_ - 1 >= 1 + inner_.min_completion();
    }
    void accept(int32_t t) override {
        if (!thinking_) return inner_.accept(t);
        const auto& s = v_->stop_ids();
        if (std::find(s.begin(), s.end(), t) != s.end())
            throw Error("json constraint: stop token before the reply's document");
        if (t == think_end_) {
            thinking_ = false;
            if (remaining_ != kNoBudget) inner_.set_remaining(remaining_ - 1);
        }
    }
    void set_remaining(int64_t n) override {
        remaining_ = n;
        if (!thinking_) inner_.set_remaining(n);
    }

  private:
    JsonConstraint inner_;
    std::shared_ptr<const JsonVocab> v_;
    int32_t think_end_;
    bool thinking_ = true;
    int64_t remaining_ = kNoBudget;
};

}  // namespace

std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const JsonGrammar> g,
                                                      std::shared_ptr<const JsonVocab> v,
                                                      bool after_think) {
    if (!g || !v) throw Error("json constraint: missing grammar or vocabulary");
    if (!after_think) return std::make_unique<JsonConstraint>(std::move(g), std::move(v));
    if (v->think_end() < 0) throw Error("json constraint: the vocabulary has no </think> token");
    return std::make_unique<ThinkThenJson>(std::move(g), std::move(v));
}

}  // namespace glm5::runtime

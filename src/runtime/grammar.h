// The grammar behind constrained sampling: one IR and one matcher for every front end.
//
// A Grammar is a graph of nodes (JSON values: literals, strings, numbers, arrays, objects,
// maps, unions; GLM's tool call: the call, its tagged arguments, free text). The front ends
// build it (runtime/json_schema.h from a JSON schema, runtime/tool_call.h from tool
// signatures) and link_grammar() resolves it: references, union dispatch, tries of literals
// and keys, and the shortest completion of every node. A Matcher runs it over symbols: bytes
// 0-255, and kMarker + k for the k-th marker token (the tool call's tags, which are tokens of
// their own, never bytes). runtime/grammar_constraint.h turns a matcher into a token
// constraint over a vocabulary (runtime/vocab_trie.h).
//
// Costs are symbols: the bytes and markers still needed for the shortest complete output.
// Since a byte-level vocabulary has a token for every byte and every marker is one token,
// that bounds the tokens still needed.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

namespace glm5::runtime {

struct TokenTrie;

// Digits in a number's integer part and in its fraction, for JSON values and tool-call
// arguments alike: 15 is the most decimal digits a double always keeps (DBL_DIG), so every
// integer written is below 2^53 and reads back exactly in clients that hold JSON numbers
// as doubles (JavaScript, Python floats), and no fraction claims more precision than a
// double has. Two exponent digits keep every number far from infinity.
constexpr int32_t kMaxNumberDigits = 15;
constexpr int32_t kMaxExponentDigits = 2;

// Caps that keep every document finite. Schema keywords (maxLength, maxItems, ...) win
// over the defaults; a minimum above a default cap raises the cap to it.
struct GrammarLimits {
    int32_t max_string_chars = 512;               // code points per string without maxLength
    int32_t max_array_items = 64;                 // items per array without maxItems
    int32_t max_object_members = 64;              // members of an open object (json_object, maps)
    int32_t max_int_digits = kMaxNumberDigits;    // integer part
    int32_t max_frac_digits = kMaxNumberDigits;   // fraction
    int32_t max_exp_digits = kMaxExponentDigits;  // exponent
    // Containers nested in untyped values (json_object, {}): deeper ones get scalars only.
    int32_t max_depth = 8;
    bool spaces = true;  // one optional ' ' after ':' and ','
};

namespace grammar {

constexpr int64_t kInf = int64_t(1) << 40;  // "no finite document"
constexpr int64_t kNoBudget = INT64_MAX;    // no threshold on completions

inline int64_t sat_add(int64_t a, int64_t b) {
    return a + b < kInf ? a + b : kInf;
}
inline int64_t sat_mul(int64_t n, int64_t x) {
    if (n == 0) return 0;
    if (x >= kInf || n >= kInf / (x > 1 ? x : 1)) return kInf;
    return n * x;
}

// Symbols above the bytes: the markers of GLM's tool-call format, in the order a
// vocabulary lists their tokens (TokenVocab's markers).
constexpr int32_t kMarker = 256;
enum Mark : int32_t {
    MK_CALL_OPEN = kMarker,  // <tool_call>
    MK_CALL_CLOSE,           // </tool_call>
    MK_KEY_OPEN,             // <arg_key>
    MK_KEY_CLOSE,            // </arg_key>
    MK_VALUE_OPEN,           // <arg_value>
    MK_VALUE_CLOSE,          // </arg_value>
    kMarkerEnd,
};

enum class Kind : uint8_t {
    Lit,    // one of a few literal byte strings
    Str,    // a JSON string
    Num,    // a JSON number
    Arr,    // a JSON array
    Obj,    // a JSON object with declared properties, in declaration order
    Map,    // a JSON object with free keys
    Union,  // alternatives told apart by their first byte
    Ref,    // a schema reference (resolved by link_grammar)
    Text,   // free text: any bytes, up to the next marker
    Call,   // <tool_call>NAME members </tool_call>, members a Tags node per name
    Tags,   // tagged arguments, any order, each at most once, the required ones all
};

// Per-kind matcher states. State 0 is always the state before the value's first symbol.
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
enum CallState : int32_t {
    C_OPEN,
    C_NAME,   // b: name trie node
    C_CLOSE,  // a: the tool; its members are done
};
// A Tags frame keeps the arguments written as a 64-bit mask in a (low half) and b (high
// half), and packs its state with one more number into st: TagsFrame says how.
enum TagsState : int32_t {
    T_NEXT,   // between arguments
    T_KEY,    // in a key: the key trie node
    T_VOPEN,  // the argument's key is whole: the argument
    T_VALUE,  // the argument's value is done: the argument
};

// A node of a byte trie of literals (enum values, object keys, tool names).
struct Trie {
    std::vector<std::pair<uint8_t, int32_t>> next;  // by byte
    int32_t term = -1;                              // literal / property / tool ending here
    int64_t term_cost = 0;                          // what follows the literal (tool names)
    int64_t dist = kInf;                            // symbols to the nearest end, term_cost in
    // Keys: (property, what finishing through it costs) for every key in the subtree, by
    // property. Obj: the whole object's remaining bytes; Tags: the key bytes left.
    std::vector<std::pair<int32_t, int64_t>> via;
};

struct Prop {
    std::string name;
    std::string key;  // Obj: serialized, quotes included; Tags: the name as written
    int32_t value = -1;
    bool required = false;
};

struct Node {
    Kind kind = Kind::Union;
    std::string where;                                // schema location, for messages
    std::vector<std::string> lits;                    // Lit: the values; Call: tool names
    int32_t trie = -1;                                // Lit values; Obj / Tags keys; Call names
    int32_t min_len = 0, max_len = 0;                 // Str, code points
    bool integer = false;                             // Num
    int32_t item = -1, min_items = 0, max_items = 0;  // Arr
    std::vector<Prop> props;                          // Obj, Tags
    std::vector<int64_t> req_sum, opt_min;            // Obj, per next property (n + 1)
    std::vector<int32_t> req_cnt, hi;
    int32_t key = -1, value = -1, max_members = 0;  // Map
    std::vector<int32_t> alts;                      // Union; Call: a Tags node per tool
    bool exclusive = false;                         // oneOf
    bool depth_cap = false;  // containers may be refused when deep (the minimum is a scalar)
    std::array<int16_t, 256> dispatch{};
    int32_t target = -1;  // Ref
    std::bitset<256> first;
    int64_t minlen = kInf;
};

bool is_container(Kind k);
int32_t trie_child(const std::vector<Trie>& tries, int32_t t, int32_t c);

struct Frame {
    int32_t node;
    int32_t st;
    int32_t a;
    int32_t b;
    int64_t base;  // symbols the frames below still need once this one is done
};
// Small and without padding: the vocabulary walk copies frames into its undo log for every
// trie node, and string caches compare stacks as bytes.
static_assert(sizeof(Frame) == 24, "no padding: stacks are compared as bytes");

// A Tags frame's fields.
struct TagsFrame {
    int32_t state;  // TagsState
    int32_t x;      // T_KEY: the key trie node; T_VOPEN / T_VALUE: the argument
    uint64_t used;  // the arguments written
    static TagsFrame of(const Frame& f) {
        return {f.st & 3, f.st >> 2, uint64_t(uint32_t(f.a)) | uint64_t(uint32_t(f.b)) << 32};
    }
    Frame frame(int32_t node, int64_t base) const {
        return {node, state | x << 2, int32_t(uint32_t(used)), int32_t(uint32_t(used >> 32)), base};
    }
};

}  // namespace grammar

// A compiled grammar; immutable once linked, shared by the requests that use it.
class Grammar {
  public:
    std::vector<grammar::Node> nodes;
    std::vector<grammar::Trie> tries;
    int32_t root = -1;
    GrammarLimits lim;
    // Symbols that must follow the document and count against the budget (tool calls:
    // the stop token, so that a call always ends with one).
    int64_t tail = 0;
};

// Resolves what a front end built: references, unions (merged and checked to be told apart
// by their first byte), shortest documents, dispatch tables and tries. Throws glm5::Error
// naming the schema location for unions it cannot tell apart and recursions with no
// finite document.
void link_grammar(Grammar& g);

// The shortest document the grammar accepts, in symbols (without the tail).
int64_t min_document_bytes(const Grammar& g);

// The grammar's state: a stack of frames, changed in place with an undo log so a
// vocabulary walk can try a symbol and take it back cheaply.
class Matcher {
  public:
    explicit Matcher(const Grammar& g);
    Matcher(const Matcher&) = default;

    // Consumes symbol c (a byte, or a marker), or returns false and leaves the state
    // as it was.
    bool feed(int32_t c);

    size_t mark() const { return log_.size(); }
    // Takes back what came after mark m (inline: the vocabulary walk's inner loop).
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
    const std::vector<grammar::Frame>& stack() const { return stack_; }
    const grammar::Frame& top() const { return stack_.back(); }
    // The output so far is a whole document.
    bool complete() const { return stack_.empty() || (stack_.size() == 1 && can_end(stack_[0])); }
    // Symbols the shortest way to a whole document still needs.
    int64_t completion() const;

    // The tokens of `trie` the grammar takes from here, each with the completion it leaves
    // (when `t` is finite or `prune` is off; else 0) appended to `found`; with `prune`,
    // subtrees whose tokens all leave more than `t` are skipped. The state is left as it was.
    void walk(const TokenTrie& trie, int64_t t, bool prune,
              std::vector<std::pair<int32_t, int64_t>>& found);
    // The same with `prune`, setting the bit of each token that leaves at most `t`.
    void walk_bits(const TokenTrie& trie, int64_t t, uint64_t* bits);

  private:
    enum class R { Ok, Fail, Retry, Again };
    enum class Op : uint8_t { Set, Push, Pop };
    struct Undo {
        Op op;
        grammar::Frame f;
    };
    using Frame = grammar::Frame;
    using Node = grammar::Node;

    template <class Found>
    void walk_trie(const TokenTrie& trie, int64_t t, bool prune, Found&& found);
    bool can_end(const Frame& f) const;
    // Symbols the frame needs to finish its value. Inline, defined in grammar.cpp (the only
    // user): the walk's inner loop calls it for every trie node.
    inline int64_t cost(const Frame& f) const;
    int64_t tool_cost(const Frame& f, const Node& n) const;
    int64_t members_left(const Node& n, uint64_t used) const;  // Tags: required ones
    Frame initial(int32_t node, int64_t base) const;
    void set_top(const Frame& f);
    void push(const Frame& f);
    void pop();
    R start_child(const Frame& parent, int32_t child, int32_t c);
    R step_lit(const Frame& f, int32_t c);
    R step_str(const Frame& f, const Node& n, int32_t c);
    R step_num(const Frame& f, const Node& n, int32_t c);
    R step_arr(const Frame& f, const Node& n, int32_t c);
    bool key_viable(const Node& n, int32_t t, int32_t a) const;
    R step_obj(const Frame& f, const Node& n, int32_t c);
    R step_map(const Frame& f, const Node& n, int32_t c);
    R step_union(const Frame& f, const Node& n, int32_t c);
    R step_call(const Frame& f, const Node& n, int32_t c);
    R step_tags(const Frame& f, const Node& n, int32_t c);

    const Grammar* g_;
    std::vector<Frame> stack_;
    std::vector<Undo> log_;
};

}  // namespace glm5::runtime

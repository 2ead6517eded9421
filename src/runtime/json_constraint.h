// Grammar-constrained sampling for JSON output: OpenAI `response_format`
// ({"type": "json_object"} and {"type": "json_schema"}) compiled to a byte-level
// pushdown automaton, and a TokenConstraint that lets through only the tokens
// whose bytes keep the output a prefix of a document the schema accepts.
//
// How the server uses it (once per tokenizer, then per request):
//
//   auto vocab = std::make_shared<const runtime::JsonVocab>(*tok);        // at startup
//   auto g = runtime::grammar_from_response_format(body["response_format"]);  // throws
//                                                  // glm5::Error -> HTTP 400; nullptr: text
//   if (g) params.constraint = runtime::make_json_constraint(g, vocab, prompt.reasoning_open);
//
// Parse the request body with nlohmann::ordered_json so properties keep their declaration
// order (with nlohmann::json they come out sorted by name).
//
// Schema subset (JSON Schema 2020-12 meaning):
//   type (a name or a list), properties, required, items, enum, const, additionalProperties,
//   minLength / maxLength (code points), minItems / maxItems, anyOf / oneOf (alternatives
//   told apart by their first byte; integer|number and literals a string/number alternative
//   already accepts are merged for anyOf), allOf with one subschema, local $ref ("#...",
//   recursion included), true / {} (any value).
//   Objects emit only declared properties, in declaration order, every required one,
//   optional ones at the model's choice; a required name missing from properties is added
//   with an any-value schema. An object schema with no properties is an open map: string
//   keys, values of additionalProperties (any value when absent or true; {} when false).
//   No type with properties / items given: object / array; no type otherwise: any value.
//   Annotations are ignored (title, description, default, examples, $schema, $id, $defs,
//   format, ...), as are unknown keywords. Keywords that restrict validity and are not
//   implemented are refused with glm5::Error naming the keyword and where it is (pattern,
//   minimum / maximum / multipleOf, not, if/then/else, allOf with several schemas,
//   overlapping anyOf / oneOf, prefixItems, contains, uniqueItems: true, patternProperties,
//   propertyNames, dependentRequired, remote $ref, ...).
//
// Output shape: no white space except one optional ' ' after ':' and after ','
// (JsonLimits::spaces); nothing before or after the document. Strings are any valid UTF-8
// without raw control characters, escapes \" \\ \/ \b \f \n \r \t and \uXXXX except
// surrogates (nlohmann::json refuses lone ones). Enum / const values are matched exactly in
// nlohmann's compact serialization. Numbers: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? (integers:
// no fraction or exponent) with the digit caps below.
//
// Finishing in time: set_remaining(n) makes the constraint allow a token only when the
// document can still be closed in the n - 1 tokens that follow it (the shortest completion
// in bytes is an upper bound on tokens, since every byte has a single-byte token in a
// byte-level vocabulary; JsonVocab::missing_byte_tokens() says whether it does). So when
// max_tokens >= the shortest document the schema allows (min_completion() before the first
// token), the output is always a complete, valid document, ended by a stop token or by the
// last allowed token. With a smaller budget it moves toward the end as fast as it can
// (strictly shorter completion each token) and is cut off.
//
// Cost: allows() computes the allowed set once per step (after set_remaining / accept) by
// walking a byte trie of the vocabulary with the automaton; inside a string only the tokens
// that are not plain text are walked (the rest go by character count, and are cached per
// string). Measured on this 2-core machine: 2-3 us per step for the 32K bench vocabulary;
// 10-100 us for a 150K vocabulary full of quotes and braces (tests/test_json_constraint.cpp
// prints the figures).
//
// Stop tokens (Tokenizer::stop_ids) are allowed exactly when the output is a complete
// document; once nothing can extend it (always so for objects and arrays) they are the only
// tokens allowed. Control, user-defined, unknown and unused tokens are never allowed inside
// the document.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine.h"

namespace glm5::text {
class Tokenizer;
}

namespace glm5::runtime {

// Caps that keep every document finite. Schema keywords (maxLength, maxItems, ...) win
// over the defaults; a minimum above a default cap raises the cap to it.
struct JsonLimits {
    int32_t max_string_chars = 512;   // code points per string without maxLength
    int32_t max_array_items = 64;     // items per array without maxItems
    int32_t max_object_members = 64;  // members of an open object (json_object, maps)
    int32_t max_int_digits = 16;      // integer part
    int32_t max_frac_digits = 16;     // fraction
    int32_t max_exp_digits = 2;       // exponent
    // Containers nested in untyped values (json_object, {}): deeper ones get scalars only.
    int32_t max_depth = 8;
    bool spaces = true;  // one optional ' ' after ':' and ','
};

// A compiled schema; immutable, shared by the requests that use it.
class JsonGrammar;

// Compiles a JSON schema. Accepts a bare schema or OpenAI's wrapper
// {"name", "schema", "strict", "description"}. Throws glm5::Error with a message fit for
// a 400 response.
std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                       const JsonLimits& lim = {});
// Same; property order is the object's iteration order (sorted names for nlohmann::json).
std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::json& schema,
                                                       const JsonLimits& lim = {});
// Any JSON object (response_format json_object).
std::shared_ptr<const JsonGrammar> json_object_grammar(const JsonLimits& lim = {});
// From a request's response_format: null or {"type": "text"} -> nullptr;
// {"type": "json_object"} (an optional "schema" is honoured);
// {"type": "json_schema", "json_schema": {...}}. Throws glm5::Error otherwise.
std::shared_ptr<const JsonGrammar> grammar_from_response_format(
    const nlohmann::ordered_json& response_format, const JsonLimits& lim = {});
std::shared_ptr<const JsonGrammar> grammar_from_response_format(
    const nlohmann::json& response_format, const JsonLimits& lim = {});

// The shortest document the grammar accepts, in bytes.
int64_t min_document_bytes(const JsonGrammar& g);

// What the constraint needs from a tokenizer, built once per tokenizer (a byte trie of the
// usable tokens, and which tokens are plain string text); immutable and shareable.
class JsonVocab {
  public:
    // stop_ids: the tokens that end a generation; empty: tokenizer.stop_ids(). Throws
    // glm5::Error when there is none.
    explicit JsonVocab(const text::Tokenizer& tok, std::vector<int32_t> stop_ids = {});
    ~JsonVocab();

    int32_t n_vocab() const { return n_vocab_; }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    int32_t think_end() const { return think_end_; }  // </think>, or -1
    // Bytes a document may hold (0x20-0xFF except C0, C1, F5-FF) with no usable single-byte
    // token (0 for a byte-level BPE vocabulary); when nonzero the finish-in-time guarantee
    // does not hold for documents needing them.
    int missing_byte_tokens() const { return missing_bytes_; }
    size_t trie_nodes() const { return all_.size(); }

  private:
    friend class JsonConstraint;
    int32_t n_vocab_ = 0;
    std::vector<int32_t> stop_ids_;
    int32_t think_end_ = -1;
    int missing_bytes_ = 0;
    std::vector<std::string> bytes_;  // per token; empty when the token is never allowed
    // A byte trie in preorder (node 0 is the root): a subtree is a contiguous range, so a
    // walk skips a refused subtree by jumping to its end.
    struct TokenTrie {
        struct Node {
            int32_t end;        // one past the subtree
            int32_t tok_begin;  // tokens ending here: tok_ids[tok_begin, next node's tok_begin)
            uint16_t depth;     // bytes from the root
            uint16_t maxdepth;  // deepest token in the subtree
            uint8_t label;      // byte on the edge into the node
        };
        std::vector<Node> nodes;  // plus a sentinel holding the last tok_begin
        std::vector<int32_t> tok_ids;
        void build(const std::vector<int32_t>& sorted_ids, const std::vector<std::string>& bytes);
        size_t size() const { return nodes.empty() ? 0 : nodes.size() - 1; }
    };
    TokenTrie all_;  // every usable token
    // Plain string text: valid UTF-8 from a character start (possibly ending inside a
    // character) without '"', '\\' or control bytes. In a string body these tokens are
    // decided by their character count alone, and only the others are walked.
    TokenTrie nonplain_;
    struct Plain {
        int32_t id;
        int32_t chars;    // characters started
        int32_t pending;  // continuation bytes still owed at the end
    };
    int32_t max_nonplain_bytes_ = 0;
    std::vector<Plain> plain_;  // by chars, ascending
    // plain_le_[k]: the plain tokens of at most k characters, for k below
    // min(kPlainLevels, max_plain_chars_ + 1); the last entry holds them all.
    static constexpr int32_t kPlainLevels = 65;
    std::vector<std::vector<uint64_t>> plain_le_;
    int32_t max_plain_chars_ = 0;
};

class JsonMatcher;  // the automaton's state (internal)

// One request's constraint. Not thread-safe (the engine uses it from one thread).
class JsonConstraint : public TokenConstraint {
  public:
    JsonConstraint(std::shared_ptr<const JsonGrammar> g, std::shared_ptr<const JsonVocab> v);
    JsonConstraint(const JsonConstraint& o);
    ~JsonConstraint() override;

    bool allows(int32_t token) const override;
    // Throws glm5::Error for a token allows() refuses (the output would stop being a
    // prefix of a valid document).
    void accept(int32_t token) override;
    void set_remaining(int64_t n_tokens) override;

    // The output so far is a whole document (stop tokens are allowed).
    bool complete() const;
    // Bytes still needed for the shortest complete document.
    int64_t min_completion() const;
    // The bytes accepted so far.
    const std::string& text() const { return text_; }
    // allows() answered by feeding the token's bytes to a copy of the state, without the
    // trie walk and the plain-text shortcut: slow, the reference for tests.
    bool allows_uncached(int32_t token) const;
    // Tokens allowed now (fills the cache like allows()).
    size_t allowed_count() const;

  private:
    void compute() const;
    int64_t threshold() const;

    std::shared_ptr<const JsonGrammar> g_;
    std::shared_ptr<const JsonVocab> v_;
    std::unique_ptr<JsonMatcher> m_;
    std::string text_;
    int64_t remaining_;
    bool stopped_ = false;
    mutable bool dirty_ = true;
    mutable std::vector<uint64_t> bits_;
    // Inside one string value the non-plain tokens the grammar takes do not change from
    // token to token (once minLength is met and maxLength is out of their reach): they are
    // kept with the completion each leaves, keyed by the automaton's stack.
    mutable bool string_cache_valid_ = false;
    mutable std::vector<uint8_t> string_cache_key_;
    mutable std::vector<std::pair<int32_t, int64_t>> string_cache_;
};

// The constraint for a request. after_think: the prompt left <think> open, so the reply
// starts with reasoning: everything except the stop tokens is allowed until </think>, and
// the document must follow right after it. When the remaining budget only leaves room for
// </think> and the shortest document, </think> is the only token allowed. Throws
// glm5::Error when after_think is set and the vocabulary has no </think>.
std::unique_ptr<TokenConstraint> make_json_constraint(std::shared_ptr<const JsonGrammar> g,
                                                      std::shared_ptr<const JsonVocab> v,
                                                      bool after_think);

}  // namespace glm5::runtime

// A grammar as a token constraint: lets through only the tokens that keep the output a
// prefix of what the grammar accepts (runtime/grammar.h), for any front end (JSON schemas,
// tool calls).
//
// Finishing in time: set_remaining(n) makes the constraint allow a token only when the
// output can still be finished (its shortest completion plus the grammar's tail) in the
// n - 1 tokens that follow it: the completion in symbols is an upper bound on tokens, since
// every byte has a single-byte token in a byte-level vocabulary (TokenVocab::
// missing_byte_tokens() says whether it does) and every marker is one token. With a budget
// already too small, the tokens after which it would suffice again if there are any, else
// those that bring the end strictly closer (and if none does, any the grammar takes).
//
// Cost: allows() computes the allowed set once per step (after set_remaining / accept) by
// walking the vocabulary's byte trie with the matcher; inside a JSON string only the tokens
// that are not plain text are walked (the rest go by character count, and are cached per
// string), and in free text every text token is allowed at once. The allowed set per step
// costs a few microseconds for a 32K vocabulary, tens for a 150K vocabulary full of quotes
// and braces (tests/test_json_constraint.cpp prints the figures measured on the machine
// that runs it).
//
// Stop tokens are allowed exactly when the output is complete; once nothing can extend it
// (always so for objects, arrays and tool calls) they are the only tokens allowed. Tokens
// that are neither text nor markers (control, unknown, unused) are never allowed inside
// the output.
//
// after_think: the prompt left <think> open, so the reply starts with reasoning: every
// token but the stop tokens is allowed until </think>, and the grammar's output follows
// right after it. When the budget only leaves room for </think> and the shortest output,
// </think> is the only token allowed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/grammar.h"
#include "runtime/vocab_trie.h"

namespace glm5::runtime {

// One request's constraint. Not thread-safe (the engine uses it from one thread).
class GrammarConstraint : public TokenConstraint {
  public:
    // Throws glm5::Error when after_think is set and the vocabulary has no </think>.
    GrammarConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v,
                      bool after_think = false);
    GrammarConstraint(const GrammarConstraint& o);
    ~GrammarConstraint() override;

    bool allows(int32_t token) const override;
    // Throws glm5::Error for a token allows() refuses (the output would stop being a
    // prefix of what the grammar accepts).
    void accept(int32_t token) override;
    void set_remaining(int64_t n_tokens) override;

    // The output so far is whole (stop tokens are allowed).
    bool complete() const;
    // Tokens still needed for the shortest complete output: </think> while reasoning, the
    // output's symbols, and the grammar's tail (a tool call's stop token).
    int64_t min_completion() const;
    // The text bytes accepted after the reasoning (markers add none).
    const std::string& text() const { return text_; }
    // allows() answered by feeding the token to a copy of the state, without the trie walk
    // and the shortcuts: slow, the reference for tests.
    bool allows_uncached(int32_t token) const;
    // Tokens allowed now (fills the cache like allows()).
    size_t allowed_count() const;

  private:
    void compute() const;
    // Sets the tokens after which the matcher's completion is at most t.
    void compute_within(int64_t t) const;
    std::array<int64_t, 3> thresholds() const;
    bool thinking_allows(int32_t token) const;
    // The completion after `token` by feeding it to a copy of the matcher; -1: refused.
    int64_t completion_after(int32_t token) const;

    std::shared_ptr<const Grammar> g_;
    std::shared_ptr<const TokenVocab> v_;
    std::unique_ptr<Matcher> m_;
    std::string text_;
    int64_t remaining_;
    bool thinking_;
    bool stopped_ = false;
    mutable bool dirty_ = true;
    mutable std::vector<uint64_t> bits_;
    mutable bool ref_dirty_ = true;  // allows_uncached()'s threshold
    mutable int64_t ref_threshold_ = 0;
    // Inside one string value the non-plain tokens the grammar takes do not change from
    // token to token (once minLength is met and maxLength is out of their reach): they are
    // kept with the completion each leaves, keyed by the matcher's stack.
    mutable bool string_cache_valid_ = false;
    mutable std::vector<uint8_t> string_cache_key_;
    mutable std::vector<std::pair<int32_t, int64_t>> string_cache_;
};

}  // namespace glm5::runtime

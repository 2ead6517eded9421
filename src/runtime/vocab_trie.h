// What a grammar constraint needs from a tokenizer, built once per tokenizer and front end:
// which tokens are text (their bytes), which are markers (grammar symbols of their own),
// the stop tokens, and the text tokens as a byte trie the constraint walks with the
// matcher. Immutable and shareable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace glm5::text {
class Tokenizer;
}

namespace glm5::runtime {

// Tokens' bytes as a trie in preorder (node 0 is the root): a subtree is a contiguous
// range, so a walk (Matcher::walk) skips a refused subtree by jumping to its end.
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
    // sorted_ids: the tokens by their bytes (ties by id).
    void build(const std::vector<int32_t>& sorted_ids, const std::vector<std::string>& bytes);
    size_t size() const { return nodes.empty() ? 0 : nodes.size() - 1; }
};

struct VocabOptions {
    std::vector<int32_t> stop_ids;  // the tokens that end a generation; empty: the tokenizer's
    bool require_stop = true;       // throw glm5::Error when there is no stop token
    // Token k of this list is the grammar symbol grammar::kMarker + k (never text); -1: the
    // vocabulary has no such token.
    std::vector<int32_t> markers;
    std::vector<int32_t> not_text;   // other tokens that are never text
    bool user_defined_text = false;  // user-defined tokens are text (else never allowed)
    // Only tokens whose bytes a JSON document can hold are text (no control bytes, none
    // that UTF-8 never uses).
    bool json_bytes = false;
};

class TokenVocab {
  public:
    TokenVocab(const text::Tokenizer& tok, VocabOptions opt);
    ~TokenVocab();

    int32_t n_vocab() const { return n_vocab_; }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    bool is_stop(int32_t id) const;
    int32_t think_end() const { return think_end_; }  // </think>, or -1
    const std::vector<int32_t>& markers() const { return markers_; }
    // The bytes of a text token; empty for any other token.
    const std::string& text(int32_t id) const { return bytes_[size_t(id)]; }
    // Bytes a JSON document may hold (0x20-0xFF except C0, C1, F5-FF) with no text
    // single-byte token (0 for a byte-level BPE vocabulary); when nonzero the
    // finish-in-time guarantee does not hold for documents needing them.
    int missing_byte_tokens() const { return missing_bytes_; }
    size_t trie_nodes() const { return all_.size(); }
    // The longest text token, in bytes.
    int32_t max_token_bytes() const { return all_.size() ? all_.nodes[0].maxdepth : 0; }

  private:
    friend class GrammarConstraint;
    int32_t n_vocab_ = 0;
    std::vector<int32_t> stop_ids_;
    std::vector<int32_t> markers_;
    int32_t think_end_ = -1;
    int missing_bytes_ = 0;
    std::vector<std::string> bytes_;   // per token; empty when the token is not text
    std::vector<uint64_t> text_bits_;  // the text tokens
    TokenTrie all_;                    // every text token
    // Plain string text: valid UTF-8 from a character start (possibly ending inside a
    // character) without '"', '\\' or control bytes. In a JSON string body these tokens are
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

}  // namespace glm5::runtime

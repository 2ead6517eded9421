// Byte-level BPE tokenizer for GLM vocabularies (tokenizer.ggml.model "gpt2",
// tokenizer.ggml.pre "glm4" / "chatglm-bpe").
//
// encode(): control / user-defined tokens written in the text are cut out first (longest
// token first, as llama.cpp does), the remaining text is split by the glm4 pre-tokenizer
// (pretokenize.h), every piece is byte-encoded with the GPT-2 byte-to-unicode map and merged
// by merge rank. Matches llama.cpp's llama-tokenize on valid UTF-8 input. Nothing (no BOS)
// is ever added.
//
// decode(): exact inverse on bytes: decode(encode(s)) == s for every byte string s
// (invalid UTF-8 included: invalid bytes are encoded through their byte tokens, where
// llama.cpp would substitute U+FFFD). Control tokens render as their text.
//
// A Tokenizer is immutable after construction and safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace glm5::gguf {
class File;
}

namespace glm5::text {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// GGUF token_type values.
enum class TokenType : int32_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

struct SpecialTokens {
    TokenId bos = kNoToken;  // [gMASK]: never added automatically
    TokenId eos = kNoToken;  // <|endoftext|>
    TokenId eot = kNoToken;  // <|user|>
    TokenId eom = kNoToken;  // <|observation|>
    TokenId unk = kNoToken;
    TokenId pad = kNoToken;
};

// Everything a tokenizer is built from; what the GGUF keys tokenizer.ggml.* hold.
struct VocabData {
    std::string pre = "glm4";         // tokenizer.ggml.pre
    std::vector<std::string> tokens;  // tokenizer.ggml.tokens
    std::vector<TokenType> types;     // tokenizer.ggml.token_type (empty: all Normal)
    std::vector<std::string> merges;  // tokenizer.ggml.merges, "left right", rank order
    // Ids from the file; kNoToken where absent. A missing eot / eom is looked up by its text
    // (<|user|>, <|observation|>).
    SpecialTokens special;
};

// Reads the tokenizer.ggml.* keys. Throws glm5::Error naming the key when one is missing,
// has the wrong type, or names an unsupported tokenizer.
VocabData read_vocab(const gguf::File& file);

class Tokenizer {
  public:
    // Throws glm5::Error on an inconsistent vocabulary (unsupported pre-tokenizer, special
    // ids out of range, a malformed merge, mismatched array lengths).
    explicit Tokenizer(VocabData data);
    static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
    ~Tokenizer();

    // parse_special: control tokens written in the text become their ids. Off: they are
    // tokenized as plain text. User-defined tokens are matched either way (llama.cpp's and
    // Hugging Face's rule for non-special added tokens).
    std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;
    // Appends the tokens of `text` to `out` while `out` holds at most `limit` tokens:
    // returns false, with only a prefix appended, as soon as the whole would hold more
    // (a text too long for a context is refused without encoding it all: the memory an
    // encode takes follows its longest piece, not the text).
    bool encode_append(std::string_view text, bool parse_special, std::vector<TokenId>& out,
                       size_t limit = SIZE_MAX) const;
    // No token stands for more bytes than this, so a text of B bytes encodes to at
    // least B / max_token_bytes() tokens.
    size_t max_token_bytes() const { return max_token_bytes_; }

    // Bytes of the tokens. render_special false drops control and unknown tokens.
    std::string decode(std::span<const TokenId> ids, bool render_special = true) const;
    // Bytes of one token (may be part of a UTF-8 character).
    const std::string& token_bytes(TokenId id) const { return bytes_[size_t(id)]; }
    // The vocabulary's string for the token ("Ġthe", "<|user|>").
    const std::string& token_text(TokenId id) const { return tokens_[size_t(id)]; }
    TokenType token_type(TokenId id) const { return types_[size_t(id)]; }
    bool is_control(TokenId id) const;
    bool is_valid(TokenId id) const { return id >= 0 && id < n_vocab(); }

    int32_t n_vocab() const { return int32_t(tokens_.size()); }
    // Exact lookup of a vocabulary string; kNoToken when absent.
    TokenId find(std::string_view token_text) const;

    const SpecialTokens& special() const { return special_; }
    // Ids that end a generation: eos, eot (<|user|>), eom (<|observation|>), without
    // duplicates or missing ones, in that order.
    std::vector<TokenId> stop_ids() const;
    bool is_stop(TokenId id) const;

  private:
    // Open-addressing tables (linear probing, power-of-two sizes): a 150k-token vocabulary
    // with 300k merges loads in tens of milliseconds and BPE lookups stay in cache.
    struct IndexSlot {
        uint32_t tag;  // low hash bits, to skip most string compares
        TokenId id;    // kNoToken: empty
    };
    struct MergeSlot {
        uint64_t key;    // left << 32 | right; kEmptyKey when free
        int32_t rank;    // merge priority, lower first
        int32_t result;  // symbol id of the merged pair
    };
    static constexpr uint64_t kEmptyKey = ~uint64_t(0);

    void index_insert(TokenId id);
    const MergeSlot* find_merge(int32_t left, int32_t right) const;

    void bpe_word(std::string_view word, std::vector<TokenId>& out) const;
    bool encode_raw(std::string_view text, std::vector<TokenId>& out, size_t limit) const;
    void emit_symbol(int32_t sym, std::vector<TokenId>& out) const;

    std::vector<std::string> tokens_;
    std::vector<TokenType> types_;
    std::vector<std::string> bytes_;  // decoded bytes per token
    std::vector<IndexSlot> index_;
    SpecialTokens special_;

    // BPE works on symbol ids: vocabulary ids, plus ids >= n_vocab for strings a merge
    // produces that the vocabulary lacks (so a sparse vocabulary still merges exactly like
    // string-based BPE). extra_symbols_[id - n_vocab] holds their byte-encoded text.
    std::vector<std::string> extra_symbols_;
    int32_t byte_symbol_[256];
    std::vector<MergeSlot> merges_;

    // Tokens cut out of the text before BPE, longest text first.
    struct SpecialMatch {
        TokenId id;
        bool needs_parse_special;  // control / unknown; false for user-defined
    };
    std::vector<SpecialMatch> specials_;
    size_t max_token_bytes_ = 1;
};

// Incremental decoder for streaming: push() returns only complete UTF-8 characters and
// holds back an incomplete trailing sequence until its remaining bytes arrive. Bytes that
// can never become valid UTF-8 come out as U+FFFD (one per maximal ill-formed subsequence),
// so the concatenated output is always valid UTF-8 and equals
// sanitize_utf8(tokenizer.decode(all ids)) for any split of the ids.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tok, bool render_special = true)
        : tok_(&tok), render_special_(render_special) {}

    std::string push(TokenId id);
    std::string push_bytes(std::string_view bytes);
    // End of stream: an incomplete held sequence becomes U+FFFD.
    std::string flush();
    bool has_pending() const { return !pending_.empty(); }
    void reset() { pending_.clear(); }

  private:
    const Tokenizer* tok_;
    bool render_special_;
    std::string pending_;
};

}  // namespace glm5::text

// A text evaluated chunk by chunk, as llama.cpp's llama-perplexity and llama-imatrix do:
// the whole text tokenized once, cut into chunks of n_ctx tokens, each chunk evaluated
// from an empty context (its first token replaced by BOS where the vocabulary adds one),
// and the second half of each chunk scored: positions n_ctx/2 .. n_ctx-2, each
// predicting the token after it. glm5 perplexity and glm5 imatrix both run this.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace glm5::gguf {
class File;
}
namespace glm5::text {
class Tokenizer;
}

namespace glm5::app {

// A text's tokens as llama.cpp's common_tokenize(ctx, text, add_special = true) gives
// them: BOS first when the vocabulary adds one (tokenizer.ggml.add_bos_token; GLM's
// BPE vocabularies do not by default), then the text, control tokens written in it
// tokenized as plain text unless parse_special.
// The bytes of a text file ('-': stdin); glm5::Error when it cannot be read.
std::string read_text_file(const std::string& path);

struct TextTokens {
    std::vector<int32_t> tokens;
    bool add_bos = false;
    int32_t bos = -1;
};
TextTokens tokenize_text(const gguf::File& f, const text::Tokenizer& tok, const std::string& text,
                         bool parse_special = false);
// A text file's tokens with the vocabulary of the model at model_path (its first shard alone:
// a text too short can be refused before the weights are loaded).
TextTokens read_tokens(const std::string& model_path, const std::string& text_path);

struct ChunkPlan {
    TextTokens text;
    int n_ctx = 0;    // tokens per chunk
    int n_chunk = 0;  // chunks evaluated: min(tokens / n_ctx, the most asked for)
    // Chunks evaluated together, each in its own sequence: llama.cpp's n_seq,
    // max(1, n_batch / n_ctx). Only speed depends on it.
    int n_seq = 1;
    int n_batch = 2048;  // llama.cpp's n_batch after that cap (what its log line shows)
    int n_ubatch = 512;  // the most tokens one forward takes (all sequences together)
    // Logits for every position, not only the scored half (imatrix: the LM head's
    // inputs are statistics too). The score is the same.
    bool logits_all = false;

    int first() const { return n_ctx / 2; }  // the first scored position
    int scored_per_chunk() const { return n_ctx - 1 - first(); }
    // Token k of chunk c as evaluated: BOS at k = 0 when the vocabulary adds one.
    int32_t token(int c, int k) const;
};

// The chunks of `text` for a context of n_ctx (at least 3, so that a chunk scores a
// token), at most n_chunks_max of them (negative: all), with llama.cpp's n_batch
// (capped to n_ctx * n_seq as llama.cpp caps it) and forwards of at most n_ubatch
// tokens. Throws glm5::Error when the text holds fewer than 2 * n_ctx tokens, as
// llama.cpp refuses it.
ChunkPlan plan_chunks(TextTokens text, int n_ctx, int n_chunks_max, int n_batch, int n_ubatch);

// llama.cpp's running sums: the negative log-likelihood of every scored token, its
// square, and how many were scored.
struct NllSums {
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    double ppl() const;
    // llama.cpp's uncertainty of the final estimate: ppl * sqrt(var(nll) / (count - 1));
    // negative where it cannot be had (fewer than two tokens, no variance).
    double ppl_error() const;
};

// The log-softmax of `tok` in one row of logits, computed as llama.cpp's perplexity
// does (maximum in float, sum of expf in double).
double log_softmax(const float* logits, int64_t n_vocab, int32_t tok);

// Evaluates the plan's chunks in order, n_seq at a time from empty states, and adds
// each chunk's scored tokens to `sums` (in position order); calls done(c, sums) after
// chunk c is added, in chunk order (llama.cpp prints its [c+1] figure there).
// `threads` share the log-softmax of the rows.
void score_chunks(model::Model& m, const ChunkPlan& plan, int threads, NllSums& sums,
                  const std::function<void(int chunk, const NllSums& sums)>& done);

// llama.cpp's figures: "[3]12.3456," after chunk index 2, and the final line
// "Final estimate: PPL = 12.3456 +/- 0.12345".
std::string ppl_progress(int chunk, const NllSums& sums);
std::string ppl_final(const NllSums& sums);

}  // namespace glm5::app

// The vocabulary the synthetic model generator writes: the fixtures' 768-token
// byte-level BPE vocabulary with the GLM special tokens (embedded as data by
// scripts/gen_glm_dsa_vocab.py), optionally padded with filler tokens so the
// embedding and LM head reach a realistic size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace glm5::synth {

// GGUF tokenizer.ggml.token_type values.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;

// The embedded data, exactly as in tests/data/glm-dsa/vocab.json.
struct BaseVocab {
    const char* const* tokens;
    const int32_t* types;
    size_t n_tokens;
    const char* const* merges;
    size_t n_merges;
    const char* chat_template;
    int32_t n_normal;  // ids below this are byte and merged tokens
    int32_t bos, eos, eot, eom, unk, pad;
};
const BaseVocab& glm_dsa_base_vocab();

struct Vocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
    std::string chat_template;
    int32_t bos, eos, eot, eom, unk, pad;
};

// The base vocabulary padded to n_vocab tokens (n_vocab >= the base size).
// Ids 0..767 stay exactly as in the fixtures, so text tokenizes identically;
// the extra ids are NORMAL tokens spelled as byte-level words that are not in
// the base vocabulary. No merge produces them (every merge result is a base
// token), so BPE never emits them and the merges stay valid; they only widen
// token_embd and output. Throws glm5::Error when n_vocab is too small.
Vocab make_vocab(int64_t n_vocab);

}  // namespace glm5::synth

// Token sampling: logit bias and penalties (repetition, frequency, presence over the
// last repeat_last_n tokens, as llama.cpp applies them), then greedy at temperature 0,
// otherwise temperature, top-k, top-p and min-p with a seeded, platform-independent RNG.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace glm5::runtime {

struct SamplerParams {
    float temperature = 0.8f;     // <= 0: greedy (argmax, ties to the lowest id)
    int32_t top_k = 40;           // <= 0: off
    float top_p = 0.95f;          // >= 1: off
    float min_p = 0.05f;          // <= 0: off
    float repeat_penalty = 1.0f;  // 1: off
    // logit -= frequency_penalty * count + presence_penalty * (count > 0), per token
    // over the window (OpenAI's and llama.cpp's penalties); 0: off.
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int32_t repeat_last_n = 64;  // the penalties' window of recent tokens; -1: all, 0: none
    // Added to a token's logit before anything else; -inf: the token is never picked
    // (unless nothing else is allowed).
    std::vector<std::pair<int32_t, float>> logit_bias;
    uint64_t seed = 0;
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams& p);

    // Picks the next token. `history` is the sequence so far (for the
    // repetition penalty); `allowed`, when set, says which ids may be picked
    // (grammar-constrained output); at least one must be allowed.
    int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                   const std::function<bool(int32_t)>& allowed = nullptr);

    const SamplerParams& params() const { return p_; }

  private:
    double next_uniform();  // [0, 1)

    SamplerParams p_;
    uint64_t s_[4];
    std::vector<std::pair<float, int32_t>> cand_;
};

// Argmax with ties to the lowest id.
int32_t argmax(std::span<const float> logits);

// A token's log-probability under the raw distribution (log-softmax of the logits, before
// temperature, penalties, bias and grammar: what vLLM returns by default), and the
// top_n most likely tokens with theirs (highest first, ties to the lowest id).
struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n);

}  // namespace glm5::runtime

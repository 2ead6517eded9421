// Token sampling: greedy at temperature 0, otherwise repetition penalty,
// temperature, top-k, top-p and min-p with a seeded, platform-independent RNG.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace glm5::runtime {

struct SamplerParams {
    float temperature = 0.8f;     // <= 0: greedy (argmax, ties to the lowest id)
    int32_t top_k = 40;           // <= 0: off
    float top_p = 0.95f;          // >= 1: off
    float min_p = 0.05f;          // <= 0: off
    float repeat_penalty = 1.0f;  // 1: off
    int32_t repeat_last_n = 64;
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

}  // namespace glm5::runtime

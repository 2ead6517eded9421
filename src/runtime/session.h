// One conversation's sequence: evaluates prompts reusing the longest cached
// prefix the architecture allows, in micro-batches, and decodes token by token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace glm5::runtime {

class Session {
  public:
    Session(model::Model& m, int64_t n_ctx, int64_t ubatch = 512);

    // Makes the sequence hold `prompt` and returns the logits of its last
    // token. Tokens already cached as a prefix are reused when the state can
    // be rewound there (glm-dsa: anywhere; glm5next: only an exact extension).
    std::span<const float> prefill(std::span<const int32_t> prompt);
    // Appends one token and returns its logits.
    std::span<const float> decode(int32_t token);

    const std::vector<int32_t>& tokens() const { return tokens_; }
    int64_t reused_last() const { return reused_; }  // prefix tokens reused by the last prefill
    int64_t n_ctx() const { return state_->n_ctx(); }
    void reset();
    model::SequenceState& state() { return *state_; }

  private:
    model::Model& model_;
    int64_t ubatch_;
    std::unique_ptr<model::SequenceState> state_;
    std::vector<int32_t> tokens_;
    std::vector<float> logits_;
    int64_t reused_ = 0;
};

struct GenerateOptions {
    int64_t max_tokens = 256;
    std::unordered_set<int32_t> stop_ids;  // end-of-generation tokens (not emitted)
    bool ignore_eos = false;
};

struct GenerateResult {
    std::vector<int32_t> tokens;
    std::string finish_reason;  // "stop" (a stop token or the callback), "length", "context"
    int64_t prompt_tokens = 0;
    int64_t reused_tokens = 0;
    double prompt_seconds = 0;
    double gen_seconds = 0;
};

// Prefills `prompt` and samples until a stop token, max_tokens or the end of
// the context. on_token is called for each emitted token; returning false stops.
GenerateResult generate(Session& s, std::span<const int32_t> prompt, Sampler& sampler,
                        const GenerateOptions& opt,
                        const std::function<bool(int32_t)>& on_token = nullptr);

}  // namespace glm5::runtime

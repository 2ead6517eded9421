// A reasoning budget: once a reply has reasoned for `budget` tokens, </think> is the
// only token allowed, so the reasoning ends there and the answer follows (what
// llama.cpp's --reasoning-budget and Anthropic's thinking.budget_tokens bound; a model
// that cannot turn reasoning off is bounded this way). Wraps the request's other
// constraint, which sees every token as before.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/engine.h"

namespace glm5::runtime {

class ReasoningBudget : public TokenConstraint {
  public:
    // The reply starts inside <think> (the prompt left it open); think_end: the
    // </think> token. inner: the request's other constraint, or null.
    ReasoningBudget(int64_t budget, int32_t think_end, std::unique_ptr<TokenConstraint> inner);

    bool allows(int32_t token) const override;
    void accept(int32_t token) override;
    void set_remaining(int64_t n_tokens) override;

  private:
    int64_t budget_;
    int32_t think_end_;
    std::unique_ptr<TokenConstraint> inner_;
    bool thinking_ = true;
    int64_t used_ = 0;
};

}  // namespace glm5::runtime

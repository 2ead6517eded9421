#include "runtime/reasoning_budget.h"

namespace glm5::runtime {

ReasoningBudget::ReasoningBudget(int64_t budget, int32_t think_end,
                                 std::unique_ptr<TokenConstraint> inner)
    : budget_(budget), think_end_(think_end), inner_(std::move(inner)) {}

bool ReasoningBudget::allows(int32_t token) const {
    if (thinking_ && used_ >= budget_) return token == think_end_;
    return !inner_ || inner_->allows(token);
}

void ReasoningBudget::accept(int32_t token) {
    if (thinking_) {
        if (token == think_end_)
            thinking_ = false;
        else
            ++used_;
    }
    if (inner_) inner_->accept(token);
}

void ReasoningBudget::set_remaining(int64_t n_tokens) {
    if (inner_) inner_->set_remaining(n_tokens);
}

}  // namespace glm5::runtime

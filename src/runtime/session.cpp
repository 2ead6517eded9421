#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace glm5::runtime {

Session::Session(model::Model& m, int64_t n_ctx, int64_t ubatch)
    : model_(m), ubatch_(std::max<int64_t>(1, ubatch)), state_(m.new_state(n_ctx)) {}

void Session::reset() {
    state_->reset();
    tokens_.clear();
}

std::span<const float> Session::prefill(std::span<const int32_t> prompt) {
    if (prompt.empty()) throw Error("empty prompt");
    if (int64_t(prompt.size()) > state_->n_ctx())
        throw Error("prompt of " + std::to_string(prompt.size()) +
                    " tokens exceeds the context size " + std::to_string(state_->n_ctx()));
    // Longest common prefix, leaving at least one token to produce logits.
    size_t common = 0;
    while (common < tokens_.size() && common < prompt.size() && tokens_[common] == prompt[common])
        ++common;
    common = std::min(common, prompt.size() - 1);
    if (!state_->rewind(int64_t(common))) {
        state_->reset();
        common = 0;
    }
    tokens_.resize(common);
    reused_ = int64_t(common);
    for (size_t i = common; i < prompt.size(); i += size_t(ubatch_)) {
        const size_t n = std::min(size_t(ubatch_), prompt.size() - i);
        model::SeqInput in{state_.get(), prompt.subspan(i, n), false};
        model_.forward({&in, 1}, logits_);
        tokens_.insert(tokens_.end(), prompt.begin() + long(i), prompt.begin() + long(i + n));
    }
    return logits_;
}

std::span<const float> Session::decode(int32_t token) {
    if (state_->n_past() + 1 > state_->n_ctx()) throw Error("context full");
    model::SeqInput in{state_.get(), {&token, 1}, false};
    model_.forward({&in, 1}, logits_);
    tokens_.push_back(token);
    return logits_;
}

GenerateResult generate(Session& s, std::span<const int32_t> prompt, Sampler& sampler,
                        const GenerateOptions& opt, const std::function<bool(int32_t)>& on_token) {
    using clock = std::chrono::steady_clock;
    GenerateResult r;
    r.prompt_tokens = int64_t(prompt.size());
    auto t0 = clock::now();
    std::span<const float> logits = s.prefill(prompt);
    r.reused_tokens = s.reused_last();
    auto t1 = clock::now();
    r.finish_reason = "length";
    std::vector<int32_t> history(prompt.begin(), prompt.end());
    for (int64_t i = 0; i < opt.max_tokens; ++i) {
        const int32_t tok = sampler.sample(logits, history);
        if (!opt.ignore_eos && opt.stop_ids.count(tok)) {
            r.finish_reason = "stop";
            break;
        }
        r.tokens.push_back(tok);
        history.push_back(tok);
        if (on_token && !on_token(tok)) {
            r.finish_reason = "stop";
            break;
        }
        if (i + 1 == opt.max_tokens) break;
        if (s.state().n_past() + 1 > s.n_ctx()) {
            r.finish_reason = "context";
            break;
        }
        logits = s.decode(tok);
    }
    auto t2 = clock::now();
    r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
    r.gen_seconds = std::chrono::duration<double>(t2 - t1).count();
    return r;
}

}  // namespace glm5::runtime

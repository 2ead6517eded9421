// Token constraints for a request's tools (OpenAI form) in GLM's tool-call format:
//
//   ToolCallConstraint  tool_choice "required" or a named function: the reply (after
//                       </think> when reasoning) is exactly one call of an allowed tool,
//                       then a stop token (runtime/tool_call.h has the grammar).
//   BanConstraint       forbids a few tokens (the <tool_call> marker when the request has no
//                       tools or says tool_choice "none").
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/grammar_constraint.h"
#include "runtime/tool_call.h"

namespace glm5::server {

// What the constraints need from a tokenizer; built once, shared by requests.
using ToolVocab = runtime::ToolCallVocab;

class BanConstraint : public runtime::TokenConstraint {
  public:
    explicit BanConstraint(std::vector<int32_t> banned) : banned_(std::move(banned)) {}
    bool allows(int32_t token) const override;
    void accept(int32_t) override {}

  private:
    std::vector<int32_t> banned_;
};

class ToolCallConstraint : public runtime::GrammarConstraint {
  public:
    // tools: the request's tools (OpenAI form, validated); name: the only tool allowed,
    // or empty for any of them. after_think: the prompt left <think> open. Throws
    // glm5::Error when a tool cannot be forced (more than 64 parameters, no such tool) or
    // the vocabulary lacks the markers.
    ToolCallConstraint(std::shared_ptr<const ToolVocab> vocab, const nlohmann::ordered_json& tools,
                       const std::string& name, bool after_think);
};

}  // namespace glm5::server

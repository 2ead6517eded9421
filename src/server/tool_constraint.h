// Token constraints for tool calling in GLM's format:
//
//   ToolCallConstraint  tool_choice "required" or a named function: the reply (after
//                       </think> when reasoning) is exactly one call
//                         <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//                       then a stop token. NAME is one of the allowed tools; keys are the
//                       tool's declared parameters, each at most once, every required one
//                       present; values follow the parameter's schema: "number" / "integer"
//                       a JSON number (at most 15 digits per part, 2 in the exponent),
//                       "boolean" true / false, "null" null, "enum" one of its
//                       values; anything else (strings, objects, arrays, no type) free text.
//   BanConstraint       forbids a few tokens (the <tool_call> marker when the request has no
//                       tools or says tool_choice "none").
//
// Finishing in time: like the JSON constraint, a token is allowed only when the call can
// still be closed with the tokens left after it (set_remaining), counting one token per
// byte of the shortest completion (a byte-level vocabulary has a token for every byte).
// With too small a budget every token moves strictly closer to the end.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace glm5::text {
class Tokenizer;
}

namespace glm5::server {

// What the constraints need from a tokenizer; built once, shared by requests.
class ToolVocab {
  public:
    explicit ToolVocab(const text::Tokenizer& tok);

    int32_t n_vocab() const { return int32_t(text_.size()); }
    // The bytes of a plain-text token; empty for control / unknown / unused tokens.
    const std::string& text(int32_t id) const { return text_[size_t(id)]; }
    bool is_stop(int32_t id) const;
    // Every marker of the tool-call format is a token of its own.
    bool has_tool_markers() const;

    int32_t tool_open = -1, tool_close = -1, key_open = -1, key_close = -1;
    int32_t value_open = -1, value_close = -1, think_end = -1;
    std::vector<int32_t> stop_ids;

  private:
    std::vector<std::string> text_;
};

class BanConstraint : public runtime::TokenConstraint {
  public:
    explicit BanConstraint(std::vector<int32_t> banned) : banned_(std::move(banned)) {}
    bool allows(int32_t token) const override;
    void accept(int32_t) override {}

  private:
    std::vector<int32_t> banned_;
};

class ToolCallConstraint : public runtime::TokenConstraint {
  public:
    // tools: the request's tools (OpenAI form, validated); name: the only tool allowed,
    // or empty for any of them. after_think: the prompt left <think> open. Throws
    // glm5::Error when a tool cannot be forced (more than 64 parameters, no such tool).
    ToolCallConstraint(std::shared_ptr<const ToolVocab> vocab, const nlohmann::ordered_json& tools,
                       const std::string& name, bool after_think);
    ~ToolCallConstraint() override;

    bool allows(int32_t token) const override;
    void accept(int32_t token) override;
    void set_remaining(int64_t n_tokens) override;

    bool complete() const;  // the call is closed: only stop tokens may follow
    // Tokens still needed for the shortest way to the end, the stop token included.
    int64_t min_completion() const;

    enum class Kind { Text, Number, Integer, Choice };
    struct Param {
        std::string name;
        Kind kind = Kind::Text;
        std::vector<std::string> choices;  // Kind::Choice: the values as written
        bool required = false;
        int64_t min_bytes = 0;  // shortest value
    };
    struct Tool {
        std::string name;
        std::vector<Param> params;
    };
    enum class Phase { Think, Open, Name, Key, ValueOpen, Value, AfterValue, Done };
    struct State {
        Phase phase = Phase::Open;
        int tool = -1;      // chosen tool (from the end of the name on)
        int param = -1;     // parameter being written
        uint64_t used = 0;  // parameters written
        std::string buf;    // name / key / value bytes so far (not kept for text values)
        int num = 0;        // number automaton state
        int digits = 0;     // digits in the number's current part
    };

  private:
    // The state after `token`, or false when the token is not allowed there at all.
    bool next(const State& s, int32_t token, State& out) const;
    int64_t need(const State& s) const;
    int64_t finish_cost(int tool, uint64_t used) const;
    int64_t value_cost(const Param& p) const;
    void compute() const;

    std::shared_ptr<const ToolVocab> v_;
    std::vector<Tool> tools_;
    State st_;
    int64_t remaining_ = INT64_MAX / 4;
    mutable bool dirty_ = true;
    mutable std::vector<uint8_t> allowed_;
};

}  // namespace glm5::server

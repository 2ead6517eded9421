// The tool-call front end of constrained sampling: GLM's format as a grammar
// (runtime/grammar.h), so that a reply is exactly one call
//
//   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//
// then a stop token. NAME is one of the tools; keys are the tool's declared parameters, in
// any order, each at most once, every required one present; values follow the parameter's
// schema: "number" / "integer" a JSON number (the digit caps of GrammarLimits, as for
// JSON output), "boolean" true / false, "null" null, "enum" / "const" one of its values
// (strings as written, others in compact JSON); anything else (strings, objects, arrays,
// no type) free text. The markers are tokens of their own (grammar symbols, not bytes).
// A GrammarConstraint over a ToolCallVocab runs it; its budget counts the stop token.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/vocab_trie.h"

namespace glm5::runtime {

struct ToolSignature {
    std::string name;
    nlohmann::ordered_json parameters;  // a JSON schema of an object (properties, required)
};

// Compiles the call of one of `tools` (at least one). Throws glm5::Error for a tool that
// cannot be forced (more than 64 parameters, an empty name or required parameter name).
std::shared_ptr<const Grammar> compile_tool_call(const std::vector<ToolSignature>& tools,
                                                 const GrammarLimits& lim = {});

// The vocabulary as a tool call sees it: the six tags are markers, every other normal,
// byte, user-defined or undefined token is text (free-text values take any of them), and
// </think> and the stop tokens are never text.
class ToolCallVocab : public TokenVocab {
  public:
    explicit ToolCallVocab(const text::Tokenizer& tok);

    // Every marker of the tool-call format is a token of its own, and there is a stop token.
    bool has_tool_markers() const;

    int32_t tool_open = -1, tool_close = -1, key_open = -1, key_close = -1;
    int32_t value_open = -1, value_close = -1;
};

}  // namespace glm5::runtime

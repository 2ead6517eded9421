// Incremental parser for GLM replies: splits the decoded text of a generation into
// reasoning, content and tool calls while it streams.
//
//   reasoning   text up to </think> when the prompt left <think> open, or when the reply
//               itself starts with <think> (leading white space allowed)
//   content     everything else; white space at its start, right after </think> and right
//               after a tool call is dropped
//   tool calls  <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//               -> {name, arguments} (a call the generation cut off: its name and the
//               arguments that arrived whole); a value becomes a JSON number / boolean / null /
//               array / object when it parses as one (unless the tool's schema declares that
//               parameter a string), otherwise it stays the raw string.
//
// A marker split across chunks never leaks: text that could still become a marker is held
// back until the next chunk decides. Feed it text from StreamDecoder (control tokens
// rendered), without the stop token that ended the generation.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat.h"

namespace glm5::text {

struct ReplyDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;  // complete calls, in order
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedReply {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;
    bool reasoning_unterminated = false;  // generation ended before </think>
    // generation ended inside a <tool_call>: the call as far as it came is the last of
    // tool_calls (with the arguments whose values arrived whole), or none when its name
    // was cut off; its markup is never content
    bool tool_call_unterminated = false;
};

struct ReplyParserOptions {
    // The prompt ended with an open <think> (RenderedPrompt::reasoning_open).
    bool reasoning_open = false;
    // The request's tools (OpenAI form); only used to keep string-typed parameters as
    // strings. Null for none.
    nlohmann::ordered_json tools = nullptr;
};

class ReplyParser {
  public:
    explicit ReplyParser(const ReplyParserOptions& opt = {});

    // Returns what became certain with this chunk.
    ReplyDelta feed(std::string_view text);
    // End of generation: releases anything held back.
    ReplyDelta finish();

    // Everything so far (the concatenation of all deltas).
    const ParsedReply& result() const { return result_; }

  private:
    enum class Mode { Reasoning, Content, ToolCall };

    void step(ReplyDelta& d, bool final);
    void emit_reasoning(ReplyDelta& d, std::string_view s);
    void emit_content(ReplyDelta& d, std::string_view s);
    bool parse_tool_call(std::string_view body, ToolCall& call) const;
    // A call cut off before </tool_call>: its name and the arguments that arrived whole.
    bool partial_tool_call(std::string_view body, ToolCall& call) const;

    Mode mode_;
    bool reply_start_ = true;  // nothing but white space seen yet: <think> may open
    bool skip_ws_ = true;      // drop white space before the next content
    std::string buf_;          // undecided text
    ParsedReply result_;
    // tool name -> parameter name -> declared as a plain string
    std::map<std::string, std::map<std::string, bool>> string_params_;
};

// The assistant turn to append to a conversation's history after a reply (reasoning,
// content and tool calls as parsed; the renderer decides whether the reasoning is shown).
ChatMessage assistant_message(const ParsedReply& reply);

}  // namespace glm5::text

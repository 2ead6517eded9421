// Generated tokens -> the text a reply streams: UTF-8 safe decoding, the reply parser
// (reasoning / content / tool calls) for chat (other control tokens are dropped from a
// chat reply), and stop strings. Runs on the engine
// thread inside the token callback, so a stop string ends the generation at once.
//
// Stop strings apply to the content (chat) or the whole text (completions), not to
// reasoning. Text that could be the start of a stop string is held back until the
// next token decides, so a stop string never reaches the client; it and everything
// after it is dropped.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat.h"
#include "text/reply_parser.h"
#include "text/tokenizer.h"

namespace glm5::server {

struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<text::ToolCall> tool_calls;  // complete calls with their ids
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Finds the first occurrence of any stop string in a stream of text.
class StopMatcher {
  public:
    explicit StopMatcher(std::vector<std::string> stops);
    // Returns the text that is now certain to precede any stop string. After a match
    // (matched()), it returns the text before the stop string, then nothing.
    std::string feed(std::string_view s);
    // End of the text: releases what was held back.
    std::string flush();
    bool matched() const { return matched_; }
    // The stop string that matched (empty: none did).
    const std::string& which() const { return which_; }

  private:
    std::vector<std::string> stops_;
    std::string which_;
    std::string held_;
    bool matched_ = false;
};

struct ReplyStreamOptions {
    bool parse = true;            // chat: split reasoning / content / tool calls
    bool reasoning_open = false;  // the prompt left <think> open
    nlohmann::ordered_json tools = nullptr;
    std::vector<std::string> stop;
    bool single_tool_call = false;  // end the reply after its first tool call
};

class ReplyStream {
  public:
    ReplyStream(const text::Tokenizer& tok, ReplyStreamOptions opt);

    // One generated token (not a stop token). Returns false when the reply is over: a
    // stop string was found, or the only tool call allowed is complete.
    bool push(int32_t token, Delta& out);
    // End of generation: releases held-back text.
    void finish(Delta& out);

    bool stop_matched() const { return stop_.matched(); }
    const std::string& matched_stop() const { return stop_.which(); }

  private:
    void take(const text::ReplyDelta& d, Delta& out);

    const text::Tokenizer* tok_;
    std::vector<int32_t> markers_;  // the tool-call control tokens
    int32_t think_open_ = -1, think_close_ = -1;
    bool answering_ = false;  // the reasoning is over (or there was none) and the answer began
    text::StreamDecoder dec_;
    text::ReplyParser parser_;
    StopMatcher stop_;
    ReplyStreamOptions opt_;
    bool over_ = false;
    int tool_calls_ = 0;
};

// "call_" + 24 random letters and digits.
std::string new_call_id();
// prefix + 24 random letters and digits.
std::string random_id(const char* prefix);

}  // namespace glm5::server

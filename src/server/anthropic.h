// Anthropic's Messages API on the chat pipeline: a POST /v1/messages body becomes the
// OpenAI chat body parse_chat_request reads, so both APIs share one validation, one
// prompt renderer and one engine path; the replies are shaped here and in
// routes_anthropic.cpp.
//
//   system (a string or text blocks; also "system" messages)  -> a system message, less
//                                                                Claude Code's
//                                                                x-anthropic-billing-header
//                                                                block (per-request metadata)
//   user: text and image blocks (base64 sources)              -> a user message, text and
//                                                                image_url parts
//   user: tool_result blocks                                  -> tool messages, before the
//                                                                user's own text
//   assistant: thinking, text, tool_use blocks                -> reasoning_content, content,
//                                                                tool_calls
//   tools [{name, description, input_schema}]                 -> function tools
//   tool_choice auto | any | tool {name} | none               -> auto | required | the
//                                                                function | none;
//                                                                disable_parallel_tool_use
//   thinking enabled {budget_tokens} | adaptive | disabled     -> think, reasoning_budget
//   stop_sequences, max_tokens, temperature, top_p, top_k      -> stop and the same fields
//   seed, min_p, repeat_penalty, ignore_eos, cache_prompt,
//   speculative (the chat endpoint's extensions)               -> the same fields
//   output_config.format {json_schema} (or output_format)      -> response_format
//   output_config.effort low | medium | high | xhigh | max      -> reasoning_effort (xhigh, max:
//                                                                "max")
//   context_management clear_thinking with keep "all"          -> chat_template_kwargs
//                                                                .clear_thinking false
//
// metadata, cache_control, service_tier, inference_geo, speed "standard", thinking.display
// "summarized" and unknown fields are accepted at their neutral meaning; "model" is
// whatever the client names (it is echoed back). What the API defines and cannot be
// served (server tools, documents, URL images, container, mcp_servers, fallbacks, other
// context_management edits, output_config.task_budget) is a 400 naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace glm5::server::anthropic {

// The chat body for a Messages request (count_tokens: for /v1/messages/count_tokens,
// where max_tokens is not required). Throws ApiError (400) naming the field.
nlohmann::ordered_json to_chat_body(const nlohmann::ordered_json& body, bool count_tokens);

// {"type": "error", "error": {"type": ..., "message": ...}} for an error of `status`.
nlohmann::ordered_json error_body(int status, const std::string& message);
nlohmann::ordered_json error_body(const ApiError& e);
// invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
const char* error_type(int status);

// Paths whose errors take Anthropic's shape.
bool is_messages_path(std::string_view path);

// A tool call id in Anthropic's form ("toolu_...").
std::string tool_use_id(const std::string& call_id);

}  // namespace glm5::server::anthropic

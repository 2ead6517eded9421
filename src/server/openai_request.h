// OpenAI request bodies -> what the engine runs. Parsing validates every field it
// reads and throws ApiError (4xx, OpenAI's error shape) naming the offending one.
//
// /v1/chat/completions: messages (system / developer / user / assistant / tool), tools,
// tool_choice ("auto" | "none" | "required" | {"type": "function", "function": {"name"}}),
// parallel_tool_calls, think (bool), reasoning_effort ("none" | "low" | "medium" | "high"),
// chat_template_kwargs.enable_thinking, reasoning_budget, response_format (text /
// json_object / json_schema) or llama.cpp's top-level json_schema, logprobs + top_logprobs.
// /v1/completions: prompt (a string, token ids, or a list of either), echo, logprobs N.
// Both: model, stream, stream_options.include_usage, n, max_tokens (chat also
// max_completion_tokens), temperature, top_p, top_k, min_p, seed, stop,
// repetition_penalty (or repeat_penalty), presence_penalty, frequency_penalty,
// repeat_last_n, logit_bias (OpenAI's object or llama.cpp's pairs), ignore_eos,
// cache_prompt, speculative. Other servers' fields this one does not implement are
// accepted at their neutral values and refused otherwise (docs/usage.md's table);
// unknown fields are ignored, as vLLM and llama.cpp do.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "server/api_error.h"

namespace glm5::text {
class Tokenizer;
class ChatFormat;
}  // namespace glm5::text

namespace glm5::runtime {
class Grammar;
class JsonVocab;
class ToolCallVocab;
}  // namespace glm5::runtime

namespace glm5::server {

// What parsing needs to know about the served model and the server's defaults.
struct ModelContext {
    const text::Tokenizer* tok = nullptr;
    const text::ChatFormat* format = nullptr;
    std::string id;                  // reported as "model"
    std::string path;                // the model file (/props)
    std::vector<std::string> names;  // accepted in a request's "model" (id first)
    int64_t n_ctx = 4096;
    std::shared_ptr<const runtime::JsonVocab> json_vocab;      // response_format
    std::shared_ptr<const runtime::ToolCallVocab> tool_vocab;  // tool_choice constraints
    runtime::SamplerParams sampling;                           // defaults for absent fields
    bool seed_fixed = false;  // sampling.seed is a default seed, else one is drawn per choice
    int64_t default_max_tokens = 0;  // <= 0: up to the end of the context
    int max_choices = 16;            // n times the number of prompts
    runtime::SpecParams spec;        // speculative decoding for requests that do not say
    int64_t reasoning_budget = -1;   // --reasoning-budget: for requests that do not say; -1: none
    bool can_mtp = false;            // a NextN/MTP block is loaded
    // The vision tower's parameters when the server has one (--mmproj); null:
    // requests with images are refused.
    const model::VisionHParams* vision = nullptr;
    int max_images = 16;  // images in one request (--max-images)
};

enum class Endpoint { Chat, Completion };
enum class ToolChoice { Auto, None, Required, Named };

struct PromptInput {
    std::vector<int32_t> tokens;
    std::string text;  // the prompt as text (completions' echo)
    // Chat: the images of the messages, in order, one per <|image|> in `tokens`
    // (data URLs only: this engine makes no outbound requests).
    std::vector<runtime::PreparedImage> images;
    int64_t expanded_size() const;  // tokens with every image expanded
};

class BudgetHold;  // http_transport.h

struct GenRequest {
    Endpoint endpoint = Endpoint::Chat;
    bool stream = false;
    bool include_usage = false;
    std::vector<PromptInput> prompts;  // chat: one
    // The body budget its images' canvases hold while the request lives.
    std::vector<std::shared_ptr<BudgetHold>> image_holds;
    int n = 1;  // choices per prompt
    runtime::SamplerParams sampling;
    bool seed_given = false;
    int64_t max_tokens = 0;  // as asked (0: not given); clamped to the context per prompt
    std::vector<std::string> stop;
    bool ignore_eos = false;
    bool echo = false;
    bool use_prefix_cache = true;
    // chat
    bool reasoning_open = false;             // the prompt leaves <think> open
    nlohmann::ordered_json tools = nullptr;  // null when none
    ToolChoice tool_choice = ToolChoice::Auto;
    std::string tool_name;  // ToolChoice::Named
    bool parallel_tool_calls = true;
    std::shared_ptr<const runtime::Grammar> grammar;  // response_format
    std::optional<runtime::SpecParams> spec;          // "speculative"; none: the server's
    // Reasoning tokens before </think> is forced ("reasoning_budget"); -1: no bound.
    int64_t reasoning_budget = -1;
    // Log-probabilities of the sampled tokens with this many alternatives each
    // (chat: logprobs + top_logprobs; completions: logprobs N); -1: none.
    int logprobs = -1;
    std::vector<std::string> warnings;  // options the format could not honour

    int choices() const { return int(prompts.size()) * n; }
};

// The request body as JSON; 400 when it is not a JSON object.
nlohmann::ordered_json parse_body(std::string_view body);

GenRequest parse_chat_request(const nlohmann::ordered_json& body, const ModelContext& mc);
GenRequest parse_completion_request(const nlohmann::ordered_json& body, const ModelContext& mc);
// The prompt tokens of a chat body, images included, however many there are (a prompt
// longer than the context is counted, not refused): /v1/messages/count_tokens.
int64_t count_chat_prompt(const nlohmann::ordered_json& body, const ModelContext& mc);
// The prompt text a chat body renders to (llama-server's /apply-template).
std::string apply_chat_template(const nlohmann::ordered_json& body, const ModelContext& mc);

// The engine parameters of choice `index` (prompt index / n): prompt, sampling with
// its own seed, max_tokens clamped to the context, stop ids, and a fresh constraint.
runtime::RequestParams engine_params(const GenRequest& g, int index, const ModelContext& mc);

}  // namespace glm5::server

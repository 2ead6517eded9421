// GLM-5 chat prompt format: renders a conversation (messages, tools, options) into the
// prompt text the model was trained on. Two styles share one renderer:
//
//   GlmDsa   (GLM-5.2 / GLM-5.3, architecture "glm-dsa"): reasoning is opt-in.
//   Glm5Next (GLM-5.3-Flash, architecture "glm5next"): always reasons, keeps past reasoning
//            (docs/glm5next-format.md section 11).
//
// Layout, byte for byte (no newline after role tokens, as in GLM-4.7-Flash and the
// GLM-5.x templates):
//
//   [gMASK]<sop>
//   <|system|>Reasoning Effort: Max            only when reasoning; Low / High on request.
//                                              It comes first, before the tools and any
//                                              system message, as the GLM-5.2/5.3 templates
//                                              place it.
//   <|system|>\n# Tools\n\n...<tools>\n{json}\n...</tools>\n\n...   only with tools (the
//                                              template's wording; each tool is Python
//                                              json.dumps of the object given)
//   <|system|>TEXT   <|user|>TEXT              per message, in order
//   <|assistant|><think>R</think>TEXT<tool_call>NAME<arg_key>K</arg_key><arg_value>V
//       </arg_value>...</tool_call>            R is the turn's reasoning when kept, else
//                                              the block is <think></think>. TEXT is stripped;
//                                              string argument values are written raw, others
//                                              as JSON.
//   <|observation|><tool_response>TEXT</tool_response>...   consecutive tool messages share
//                                              one <|observation|>
//   <|assistant|><think>                       generation prompt, reasoning on (left open)
//   <|assistant|><think></think>               generation prompt, reasoning off
//
// Past reasoning: glm-dsa keeps it only for assistant turns after the last user message
// (the tool-calling chain being answered), as the template's clear_thinking default does;
// earlier turns get <think></think>. glm5next keeps it everywhere. The reasoning text is
// written verbatim (GLM-5.x templates do not strip it).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace glm5::gguf {
class File;
}

namespace glm5::text {

enum class ChatStyle { GlmDsa, Glm5Next };

// "glm-dsa" -> GlmDsa, "glm5next" -> Glm5Next; nullopt for anything else.
std::optional<ChatStyle> chat_style_for_arch(std::string_view arch);
const char* chat_style_name(ChatStyle s);

enum class ReasoningEffort { Default, None, Low, Medium, High };
// "none" | "low" | "medium" | "high" | "max" (= medium); throws glm5::Error otherwise.
ReasoningEffort parse_reasoning_effort(std::string_view s);

struct ToolCall {
    std::string id;  // the API's call id; not part of the prompt
    std::string name;
    // An object (key order is kept). A string holding a JSON object is accepted too (the
    // OpenAI wire form); anything else renders as no arguments.
    nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ChatMessage {
    std::string role;  // "system" | "user" | "assistant" | "tool"
    std::string content;
    // Assistant only. Without it, reasoning is taken from a "<think>...</think>" prefix of
    // the content, as the templates do.
    std::optional<std::string> reasoning_content;
    std::vector<ToolCall> tool_calls;  // assistant only
    std::string tool_call_id;          // tool only; not part of the prompt
    // User only: images, each rendered as <|begin_of_image|><|image|><|end_of_image|>
    // at byte offset image_at[i] of `content` (non-decreasing), and where the
    // image comes from (an OpenAI image_url, a file path): not part of the prompt.
    std::vector<size_t> image_at;
    std::vector<std::string> image_urls;
};

// A message of plain text (no reasoning, tool calls or images).
inline ChatMessage text_message(std::string role, std::string content) {
    ChatMessage m;
    m.role = std::move(role);
    m.content = std::move(content);
    return m;
}

// The text an image is rendered as (docs/glm5next-format.md 11, 12.5).
inline constexpr const char* kImageMarker = "<|begin_of_image|><|image|><|end_of_image|>";

struct ChatOptions {
    bool add_generation_prompt = true;
    // Unset: the style's default (glm-dsa off, glm5next on). glm5next cannot turn it off.
    std::optional<bool> thinking;
    // Low / Medium / High also turn reasoning on; None turns it off.
    ReasoningEffort effort = ReasoningEffort::Default;
    // Keep every past turn's reasoning (the templates' clear_thinking=false).
    // Unset: the style's default (see above).
    std::optional<bool> keep_past_reasoning;
};

struct RenderedPrompt {
    std::string text;
    // The prompt ends inside an open <think>: the reply starts with reasoning
    // (pass to ReplyParserOptions::reasoning_open).
    bool reasoning_open = false;
    std::vector<std::string> warnings;  // options that could not be honoured
    // [begin, end) byte ranges of text that came from the caller (message contents,
    // reasoning, tool-call names and arguments, tool declarations), in order. See
    // encode_prompt().
    std::vector<std::pair<size_t, size_t>> content_spans;
};

class ChatFormat {
  public:
    // chat_template: the GGUF's tokenizer.chat_template, only compared against the
    // built-in layout (see template_warning()); the built-in layout is always used.
    explicit ChatFormat(ChatStyle style = ChatStyle::GlmDsa, std::string chat_template = {});
    // Style from general.architecture (anything but glm5next -> glm-dsa, with a warning),
    // template from tokenizer.chat_template.
    static ChatFormat from_gguf(const gguf::File& file);

    ChatStyle style() const { return style_; }
    const std::string& chat_template() const { return template_; }
    // One line when the GGUF's template differs from the built-in layout (or the
    // architecture is not a GLM-5 one); empty otherwise. Meant to be shown once at load.
    const std::string& template_warning() const { return warning_; }

    // Throws glm5::Error on an unknown role or a malformed tools list.
    // tools: an array of OpenAI tool objects ({"type":"function","function":{...}}), or
    // null / empty for none.
    RenderedPrompt render(const std::vector<ChatMessage>& messages,
                          const nlohmann::ordered_json& tools = nullptr,
                          const ChatOptions& options = {}) const;

  private:
    ChatStyle style_;
    std::string template_;
    std::string warning_;
};

class Tokenizer;

// The prompt's token ids: the format's own text with control tokens parsed, the caller's text
// (content_spans) as plain text, so that "<|user|>" typed by a user stays text instead of
// forging a turn. Equal to tok.encode(p.text) whenever the caller's text holds no control
// token strings (every span is bounded by control tokens or by a pre-tokenizer split).
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const RenderedPrompt& p);
// The same, stopping as soon as the prompt holds more than `limit` tokens: false (and
// `ids` holds only a prefix) when it does.
bool encode_prompt(const Tokenizer& tok, const RenderedPrompt& p, size_t limit,
                   std::vector<int32_t>& ids);

// Compares a Jinja chat template against the built-in layout by its markers (GLM role and
// start tokens present, no newline emitted after role tokens, closed reasoning written as
// <think></think>, no /nothink suffix, tool-call arguments inline). Returns an empty
// string when it matches, else one line naming the differences.
std::string check_chat_template(std::string_view chat_template);

// The tokens that start a message in the GLM format (<|system|>, <|user|>, <|assistant|>,
// <|observation|>), those the vocabulary has: where a prompt's messages begin (the serving
// engine keeps checkpoints of recurrent state there).
std::vector<int32_t> message_start_ids(const Tokenizer& tok);

// OpenAI chat messages (JSON array) -> ChatMessage list. Content may be a string, null, or
// an array of {"type":"text","text":...} parts (concatenated) and, in user messages,
// {"type":"image_url","image_url":{"url":...}} parts (ChatMessage::image_at / image_urls;
// other roles' images and parts of other types are dropped);
// tool_calls[i].function .arguments may be a JSON string or an object; "reasoning_content" (or
// "reasoning") is read for assistant turns. Throws glm5::Error naming the offending message.
std::vector<ChatMessage> messages_from_openai(const nlohmann::ordered_json& messages);

// A parsed tool call in OpenAI form: {"id","type":"function","function":{"name",
// "arguments": JSON text}}.
nlohmann::ordered_json tool_call_to_openai(const ToolCall& call);

}  // namespace glm5::text

#include "text/chat.h"

#include <algorithm>

#include "core/error.h"
#include "text/json_py.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace glm5::text {

using ojson = nlohmann::ordered_json;

namespace {

// The tools block of the GLM templates (GLM-4.7-Flash wording): a system turn that lists
// the function signatures and shows the call syntax.
constexpr std::string_view kToolsHead =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\n<tools>\n";
constexpr std::string_view kToolsTail =
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-"
    "2}</arg_value>...</tool_call>";

const char* effort_label(ReasoningEffort e) {
    switch (e) {
        case ReasoningEffort::Low:
            return "Low";
        case ReasoningEffort::High:
            return "High";
        default:
            return "Max";  // Default and Medium
    }
}

// The object a tool call's arguments stand for (a JSON string is parsed), or null.
const ojson* arguments_object(const ojson& args, ojson& parsed) {
    if (args.is_object()) return &args;
    if (args.is_string()) {
        parsed = ojson::parse(args.get_ref<const std::string&>(), nullptr, false);
        if (parsed.is_object()) return &parsed;
    }
    return nullptr;
}

// Appends caller-supplied text and remembers where it lies (RenderedPrompt::content_spans).
void add_content(RenderedPrompt& r, std::string_view s) {
    if (s.empty()) return;
    const size_t b = r.text.size();
    r.text += s;
    if (!r.content_spans.empty() && r.content_spans.back().second == b)
        r.content_spans.back().second = r.text.size();
    else
        r.content_spans.emplace_back(b, r.text.size());
}

void render_tool_call(const ToolCall& tc, RenderedPrompt& r) {
    r.text += "<tool_call>";
    add_content(r, tc.name);
    ojson parsed;
    if (const ojson* args = arguments_object(tc.arguments, parsed)) {
        for (const auto& [key, value] : args->items()) {
            r.text += "<arg_key>";
            add_content(r, key);
            r.text += "</arg_key><arg_value>";
            add_content(
                r, value.is_string() ? value.get_ref<const std::string&>() : py_json_dumps(value));
            r.text += "</arg_value>";
        }
    }
    r.text += "</tool_call>";
}

std::string text_of(const ojson& content, const std::string& where, ChatMessage* images) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (content.is_array()) {
        std::string s;
        for (const ojson& part : content) {
            if (part.is_string()) {
                s += part.get<std::string>();
            } else if (part.is_object() && part.value("type", "") == "text" &&
                       part.contains("text") && part["text"].is_string()) {
                s += part["text"].get<std::string>();
            } else if (part.is_object() && part.value("type", "") == "image_url" && images) {
                // (Other roles' images are dropped, as parts of unknown types are.)
                const ojson* u = part.contains("image_url") ? &part["image_url"] : nullptr;
                if (u && u->is_object() && u->contains("url")) u = &(*u)["url"];
                if (!u || !u->is_string())
                    throw Error(where +
                                ": an image_url part needs {\"image_url\": {\"url\": ...}}");
                images->image_at.push_back(s.size());
                images->image_urls.push_back(u->get<std::string>());
            }
        }
        return s;
    }
    throw Error(where + ": content must be a string, null or an array of text parts");
}

}  // namespace

std::optional<ChatStyle> chat_style_for_arch(std::string_view arch) {
    if (arch == "glm-dsa") return ChatStyle::GlmDsa;
    if (arch == "glm5next") return ChatStyle::Glm5Next;
    return std::nullopt;
}

const char* chat_style_name(ChatStyle s) {
    return s == ChatStyle::Glm5Next ? "glm5next" : "glm-dsa";
}

ReasoningEffort parse_reasoning_effort(std::string_view s) {
    if (s == "none") return ReasoningEffort::None;
    if (s == "low") return ReasoningEffort::Low;
    if (s == "medium" || s == "max") return ReasoningEffort::Medium;
    if (s == "high") return ReasoningEffort::High;
    throw Error("reasoning effort '" + std::string(s) +
                "' is not one of none, low, medium, high, max");
}

ChatFormat::ChatFormat(ChatStyle style, std::string chat_template)
    : style_(style), template_(std::move(chat_template)) {
    warning_ = check_chat_template(template_);
}

RenderedPrompt ChatFormat::render(const std::vector<ChatMessage>& messages, const ojson& tools,
                                  const ChatOptions& opt) const {
    RenderedPrompt r;
    std::string& out = r.text;
    const bool next = style_ == ChatStyle::Glm5Next;

    bool thinking = opt.thinking.value_or(next);
    if (opt.effort == ReasoningEffort::None) thinking = false;
    if (opt.effort == ReasoningEffort::Low || opt.effort == ReasoningEffort::Medium ||
        opt.effort == ReasoningEffort::High)
        thinking = true;
    if (next && !thinking) {
        r.warnings.push_back("glm5next always reasons: reasoning cannot be turned off");
        thinking = true;
    }
    const bool keep_all = opt.keep_past_reasoning.value_or(next);

    out += "[gMASK]<sop>";
    if (thinking) {
        out += "<|system|>Reasoning Effort: ";
        out += effort_label(opt.effort);
    }

    if (!tools.is_null()) {
        if (!tools.is_array()) throw Error("tools must be an array of tool objects");
        if (!tools.empty()) {
            out += kToolsHead;
            // Each declaration with its newline is one span: "}\n" is a single pre-token,
            // so the split between spans falls where the whole text splits anyway.
            for (const ojson& t : tools) add_content(r, py_json_dumps(t) + "\n");
            out += kToolsTail;
        }
    }

    int last_user = -1;
    for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].role == "user") last_user = int(i);

    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
            out += "<|system|>";
            add_content(r, m.content);
        } else if (m.role == "user") {
            out += "<|user|>";
            size_t at = 0;
            for (size_t k : m.image_at) {
                k = std::clamp(k, at, m.content.size());
                add_content(r, std::string_view(m.content).substr(at, k - at));
                out += kImageMarker;  // format text: its control tokens are parsed
                at = k;
            }
            add_content(r, std::string_view(m.content).substr(at));
        } else if (m.role == "assistant") {
            out += "<|assistant|>";
            std::string_view content = m.content;
            std::optional<std::string_view> reasoning;
            if (m.reasoning_content) {
                reasoning = *m.reasoning_content;
            } else if (size_t close = content.find("</think>"); close != std::string_view::npos) {
                // The templates' split: reasoning is what precedes the first </think> (after
                // the last <think> before it), content what follows the last </think>.
                std::string_view before = content.substr(0, close);
                size_t open = before.rfind("<think>");
                reasoning = open == std::string_view::npos ? before : before.substr(open + 7);
                content = content.substr(content.rfind("</think>") + 8);
            }
            if ((keep_all || int(i) > last_user) && reasoning) {
                out += "<think>";
                add_content(r, *reasoning);
                out += "</think>";
            } else {
                out += "<think></think>";
            }
            add_content(r, python_strip(content));
            for (const ToolCall& tc : m.tool_calls) render_tool_call(tc, r);
        } else if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") out += "<|observation|>";
            out += "<tool_response>";
            add_content(r, m.content);
            out += "</tool_response>";
        } else {
            throw Error("message " + std::to_string(i) + ": unknown role '" + m.role +
                        "' (expected system, user, assistant or tool)");
        }
    }

    if (opt.add_generation_prompt) {
        out += thinking ? "<|assistant|><think>" : "<|assistant|><think></think>";
        r.reasoning_open = thinking;
    }
    return r;
}

namespace {

// Whether the template writes a newline right after the marker at t[pos, pos + len): a
// "\n" escape inside a string literal, or a raw newline that the next tag does not strip
// ({%- / {{-). Text that legitimately keeps its newline (the tools block) is allowed by
// `allowed_next`.
bool newline_after(std::string_view t, size_t end, std::string_view allowed_next = {}) {
    std::string_view after = t.substr(end);
    if (after.starts_with("\\n")) return true;
    if (!after.starts_with("\n")) return false;
    const size_t k = after.find_first_not_of(" \t\r\n");
    const std::string_view next = k == std::string_view::npos ? "" : after.substr(k);
    if (next.starts_with("{%-") || next.starts_with("{{-")) return false;
    return allowed_next.empty() || !next.starts_with(allowed_next);
}

bool any_newline_after(std::string_view t, std::string_view marker,
                       std::string_view allowed_next = {}) {
    for (size_t p = t.find(marker); p != std::string_view::npos; p = t.find(marker, p + 1))
        if (newline_after(t, p + marker.size(), allowed_next)) return true;
    return false;
}

}  // namespace

std::string check_chat_template(std::string_view t) {
    if (t.empty()) return {};
    const std::string tail = "; prompts use the built-in GLM-5 format";
    if (t.find("[gMASK]<sop>") == std::string_view::npos ||
        t.find("<|user|>") == std::string_view::npos ||
        t.find("<|assistant|>") == std::string_view::npos)
        return "the GGUF's chat template is not a GLM template" + tail;

    std::vector<std::string> issues;
    if (any_newline_after(t, "<|system|>", "# Tools")) issues.push_back("newline after <|system|>");
    for (std::string_view role : {"<|user|>", "<|assistant|>", "<|observation|>"})
        if (any_newline_after(t, role)) issues.push_back("newline after " + std::string(role));
    if (t.find("\\n<think>") != std::string_view::npos) issues.push_back("newline before <think>");
    if (t.find("<think></think>") == std::string_view::npos)
        issues.push_back("closed reasoning not written as <think></think>");
    if (t.find("/nothink") != std::string_view::npos) issues.push_back("/nothink user suffix");
    if (any_newline_after(t, "</arg_key>") || any_newline_after(t, "</arg_value>") ||
        t.find("\\n<arg_key>") != std::string_view::npos ||
        t.find("\\n<tool_call>") != std::string_view::npos)
        issues.push_back("tool calls spread over lines");
    if (issues.empty()) return {};
    std::string s = "the GGUF's chat template differs from the built-in GLM-5 layout (";
    for (size_t i = 0; i < issues.size(); ++i) s += (i ? ", " : "") + issues[i];
    return s + ")" + tail;
}

std::vector<ChatMessage> messages_from_openai(const ojson& messages) {
    if (!messages.is_array()) throw Error("messages must be an array");
    std::vector<ChatMessage> out;
    out.reserve(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
        const ojson& j = messages[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!j.is_object()) throw Error(where + " is not an object");
        if (!j.contains("role") || !j["role"].is_string())
            throw Error(where + " has no string \"role\"");
        ChatMessage m;
        m.role = j["role"].get<std::string>();
        if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
            throw Error(where + ": unknown role '" + m.role + "'");
        if (j.contains("content"))
            m.content = text_of(j["content"], where, m.role == "user" ? &m : nullptr);
        if (m.role == "assistant") {
            for (const char* key : {"reasoning_content", "reasoning"}) {
                if (j.contains(key) && j[key].is_string()) {
                    m.reasoning_content = j[key].get<std::string>();
                    break;
                }
            }
            if (j.contains("tool_calls") && !j["tool_calls"].is_null()) {
                if (!j["tool_calls"].is_array())
                    throw Error(where + ": tool_calls must be an array");
                for (const ojson& tc : j["tool_calls"]) {
                    const ojson& fn = tc.contains("function") ? tc["function"] : tc;
                    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
                        throw Error(where + ": a tool call has no function name");
                    ToolCall call;
                    call.name = fn["name"].get<std::string>();
                    if (tc.contains("id") && tc["id"].is_string())
                        call.id = tc["id"].get<std::string>();
                    if (fn.contains("arguments")) {
                        const ojson& a = fn["arguments"];
                        if (a.is_string()) {
                            const std::string& s = a.get_ref<const std::string&>();
                            ojson parsed =
                                s.empty() ? ojson::object() : ojson::parse(s, nullptr, false);
                            if (!parsed.is_object())
                                throw Error(where + ": arguments of '" + call.name +
                                            "' are not a JSON object");
                            call.arguments = std::move(parsed);
                        } else if (a.is_object()) {
                            call.arguments = a;
                        } else if (!a.is_null()) {
                            throw Error(where + ": arguments of '" + call.name +
                                        "' are not a JSON object");
                        }
                    }
                    m.tool_calls.push_back(std::move(call));
                }
            }
        }
        if (m.role == "tool" && j.contains("tool_call_id") && j["tool_call_id"].is_string())
            m.tool_call_id = j["tool_call_id"].get<std::string>();
        out.push_back(std::move(m));
    }
    return out;
}

ojson tool_call_to_openai(const ToolCall& call) {
    ojson fn = ojson::object();
    fn["name"] = call.name;
    fn["arguments"] = call.arguments.is_string()
                          ? call.arguments.get<std::string>()
                          : call.arguments.dump(-1, ' ', false, ojson::error_handler_t::replace);
    ojson j = ojson::object();
    j["id"] = call.id;
    j["type"] = "function";
    j["function"] = std::move(fn);
    return j;
}

bool encode_prompt(const Tokenizer& tok, const RenderedPrompt& p, size_t limit,
                   std::vector<TokenId>& ids) {
    ids.clear();
    ids.reserve(std::min(p.text.size() / 3, limit) + 16);
    const std::string_view t = p.text;
    size_t at = 0;
    for (const auto& [b, e] : p.content_spans) {
        if (b > at && !tok.encode_append(t.substr(at, b - at), true, ids, limit)) return false;
        if (!tok.encode_append(t.substr(b, e - b), false, ids, limit)) return false;
        at = e;
    }
    return at >= t.size() || tok.encode_append(t.substr(at), true, ids, limit);
}

std::vector<TokenId> encode_prompt(const Tokenizer& tok, const RenderedPrompt& p) {
    std::vector<TokenId> ids;
    encode_prompt(tok, p, SIZE_MAX, ids);
    return ids;
}

std::vector<int32_t> message_start_ids(const Tokenizer& tok) {
    std::vector<int32_t> ids;
    for (std::string_view role : {"<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"})
        if (const TokenId id = tok.find(role); id != kNoToken) ids.push_back(id);
    return ids;
}

}  // namespace glm5::text

#include "server/anthropic.h"

#include <set>

#include "core/error.h"
#include "runtime/json_schema.h"

namespace glm5::server::anthropic {

namespace {

using ojson = nlohmann::ordered_json;

ApiError invalid(const std::string& message, const std::string& param = "") {
    return ApiError(400, message, param, "invalid_request_error");
}

const ojson* field(const ojson& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return nullptr;
    return &*it;
}

std::string block_type(const ojson& b, const std::string& where) {
    if (!b.is_object())
        throw invalid(where + " must be an object, got " + json_kind(b), "messages");
    const ojson* t = field(b, "type");
    if (!t || !t->is_string()) throw invalid(where + ".type must be a string", "messages");
    return t->get<std::string>();
}

std::string text_field(const ojson& b, const char* key, const std::string& where) {
    const ojson* t = field(b, key);
    if (!t || !t->is_string()) throw invalid(where + "." + key + " must be a string", "messages");
    return t->get<std::string>();
}

// Text blocks in a row are one text, a blank line between them.
void add_text(ojson& parts, const std::string& text) {
    if (!parts.empty() && parts.back()["type"] == "text") {
        std::string& t = parts.back()["text"].get_ref<std::string&>();
        if (!t.empty() && !text.empty()) t += "\n\n";
        t += text;
        return;
    }
    parts.push_back({{"type", "text"}, {"text", text}});
}

// An image block with a base64 source, as an image_url part with a data URL.
ojson image_part(const ojson& b, const std::string& where) {
    const ojson* src = field(b, "source");
    if (!src || !src->is_object()) throw invalid(where + ".source must be an object", "messages");
    const std::string type = src->value("type", "");
    if (type == "url")
        throw invalid(where +
                          ": images by URL are not served (this engine makes no outbound "
                          "requests); send the image as a base64 source",
                      "messages");
    if (type != "base64")
        throw invalid(where + ".source.type must be \"base64\", got '" + type + "'", "messages");
    const std::string media = text_field(*src, "media_type", where + ".source");
    const std::string data = text_field(*src, "data", where + ".source");
    return {{"type", "image_url"}, {"image_url", {{"url", "data:" + media + ";base64," + data}}}};
}

// A tool_result's content: a string, or text blocks (images in results are refused).
std::string result_text(const ojson& b, const std::string& where) {
    const ojson* c = field(b, "content");
    std::string out;
    if (!c) {
        out = "";
    } else if (c->is_string()) {
        out = c->get<std::string>();
    } else if (c->is_array()) {
        for (size_t k = 0; k < c->size(); ++k) {
            const std::string at = where + ".content[" + std::to_string(k) + "]";
            const std::string t = block_type((*c)[k], at);
            if (t != "text")
                throw invalid(at + ": tool results may hold text only, not '" + t + "'",
                              "messages");
            if (!out.empty()) out += "\n\n";
            out += text_field((*c)[k], "text", at);
        }
    } else {
        throw invalid(where + ".content must be a string or an array of text blocks", "messages");
    }
    if (const ojson* e = field(b, "is_error"); e && e->is_boolean() && e->get<bool>())
        out = "Error: " + out;
    return out;
}

// Blocks this engine cannot serve, by type.
bool unsupported_block(const std::string& t) {
    return t == "document" || t == "search_result" || t == "server_tool_use" ||
           t == "web_search_tool_result" || t == "web_fetch_tool_result" ||
           t == "code_execution_tool_result" || t == "container_upload" ||
           t.find("tool_result") != std::string::npos || t.find("tool_use") != std::string::npos;
}

void user_message(const ojson& content, const std::string& where, ojson& out) {
    if (content.is_string()) {
        out.push_back({{"role", "user"}, {"content", content}});
        return;
    }
    ojson parts = ojson::array();
    for (size_t k = 0; k < content.size(); ++k) {
        const ojson& b = content[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        const std::string t = block_type(b, at);
        if (t == "text") {
            add_text(parts, text_field(b, "text", at));
        } else if (t == "image") {
            parts.push_back(image_part(b, at));
        } else if (t == "tool_result") {
            const std::string id = text_field(b, "tool_use_id", at);
            out.push_back(
                {{"role", "tool"}, {"tool_call_id", id}, {"content", result_text(b, at)}});
        } else if (unsupported_block(t) || t == "thinking" || t == "redacted_thinking") {
            throw invalid(at + ": content blocks of type '" + t +
                              "' are not supported in a user message here",
                          "messages");
        } else {
            throw invalid(at + ": unknown content block type '" + t + "'", "messages");
        }
    }
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", parts}});
}

void assistant_message(const ojson& content, const std::string& where, ojson& out) {
    ojson m = {{"role", "assistant"}};
    if (content.is_string()) {
        m["content"] = content;
        out.push_back(std::move(m));
        return;
    }
    std::string text, reasoning;
    ojson calls = ojson::array();
    for (size_t k = 0; k < content.size(); ++k) {
        const ojson& b = content[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        const std::string t = block_type(b, at);
        if (t == "text") {
            if (!text.empty()) text += "\n\n";
            text += text_field(b, "text", at);
        } else if (t == "thinking") {
            reasoning += text_field(b, "thinking", at);
        } else if (t == "redacted_thinking") {
            // Another model's encrypted reasoning: nothing this one can read.
        } else if (t == "tool_use") {
            const std::string id = text_field(b, "id", at);
            const std::string name = text_field(b, "name", at);
            const ojson* input = field(b, "input");
            if (input && !input->is_object())
                throw invalid(at + ".input must be an object", "messages");
            calls.push_back(
                {{"id", id},
                 {"type", "function"},
                 {"function", {{"name", name}, {"arguments", input ? *input : ojson::object()}}}});
        } else if (unsupported_block(t) || t == "image") {
            throw invalid(at + ": content blocks of type '" + t +
                              "' are not supported in an assistant message here",
                          "messages");
        } else {
            throw invalid(at + ": unknown content block type '" + t + "'", "messages");
        }
    }
    m["content"] = text.empty() && !calls.empty() ? ojson(nullptr) : ojson(text);
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    if (!calls.empty()) m["tool_calls"] = std::move(calls);
    out.push_back(std::move(m));
}

// Claude Code's per-request metadata block: not part of the conversation, and in some
// versions different in every request, which would end the reusable prefix there.
bool billing_header(const std::string& text) {
    return text.starts_with("x-anthropic-billing-header:");
}

std::string system_text(const ojson& s, const std::string& where) {
    if (s.is_string()) return s.get<std::string>();
    if (!s.is_array()) throw invalid(where + " must be a string or an array of text blocks", where);
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
        const std::string at = where + "[" + std::to_string(k) + "]";
        const std::string t = block_type(s[k], at);
        if (t != "text") throw invalid(at + ": system blocks must be text, not '" + t + "'", where);
        const std::string text = text_field(s[k], "text", at);
        if (billing_header(text)) continue;
        if (!out.empty()) out += "\n\n";
        out += text;
    }
    return out;
}

ojson tools_of(const ojson& tools) {
    if (!tools.is_array())
        throw invalid("'tools' must be an array, got " + std::string(json_kind(tools)), "tools");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const ojson& t = tools[i];
        const std::string at = "tools[" + std::to_string(i) + "]";
        if (!t.is_object()) throw invalid(at + " must be an object", "tools");
        const std::string type = t.value("type", "custom");
        if (type != "custom")
            throw invalid(at + ": server tools ('" + type +
                              "') are not supported: this engine runs none; declare a custom "
                              "tool with an input_schema",
                          "tools");
        const ojson* name = field(t, "name");
        if (!name || !name->is_string()) throw invalid(at + ".name must be a string", "tools");
        ojson fn = {{"name", *name}};
        if (const ojson* d = field(t, "description")) fn["description"] = *d;
        const ojson* schema = field(t, "input_schema");
        if (!schema) throw invalid(at + ".input_schema is required", "tools");
        fn["parameters"] = *schema;
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return out;
}

// A JSON-schema format ({"type": "json_schema", "schema": {...}}) as the chat body's
// response_format.
ojson response_format(const ojson& f, const std::string& where) {
    if (!f.is_object()) throw invalid("'" + where + "' must be an object", where);
    const ojson* type = field(f, "type");
    if (!type || *type != "json_schema")
        throw invalid("'" + where + ".type' must be \"json_schema\"", where);
    const ojson* schema = field(f, "schema");
    if (!schema || !schema->is_object())
        throw invalid("'" + where + ".schema' must be an object (a JSON schema)", where);
    try {
        runtime::check_json_schema(*schema);
    } catch (const Error& e) {
        throw invalid("'" + where + ".schema': " + e.what(), where);
    }
    return {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
}

// output_config: format (structured output) and effort (the reasoning effort; it shapes
// reasoning, so with thinking disabled it changes nothing, there being no other effort
// for this model to spend); output_format is format's earlier beta spelling.
void output_config(const ojson& body, ojson& chat) {
    const ojson* oc = field(body, "output_config");
    const ojson* legacy = field(body, "output_format");
    if (oc && !oc->is_object()) throw invalid("'output_config' must be an object", "output_config");
    const ojson* format = oc ? field(*oc, "format") : nullptr;
    if (format && legacy)
        throw invalid("'output_format' and 'output_config.format' together: give one",
                      "output_format");
    if (format) chat["response_format"] = response_format(*format, "output_config.format");
    if (legacy) chat["response_format"] = response_format(*legacy, "output_format");
    if (!oc) return;
    if (const ojson* e = field(*oc, "effort")) {
        const std::string v = e->is_string() ? e->get<std::string>() : "";
        // The model's efforts are low, medium and high, and its highest ("max", which
        // Anthropic's xhigh and max ask for).
        if (v == "low" || v == "medium" || v == "high")
            chat["reasoning_effort"] = v;
        else if (v == "xhigh" || v == "max")
            chat["reasoning_effort"] = "max";
        else
            throw invalid("'output_config.effort' must be low, medium, high, xhigh or max, got " +
                              (e->is_string() ? "'" + v + "'" : std::string(json_kind(*e))),
                          "output_config.effort");
    }
    for (const auto& [key, v] : oc->items())
        if (key != "format" && key != "effort" && !v.is_null())
            throw invalid("'output_config." + key +
                              "' is not supported by this server (it serves format and effort)",
                          "output_config." + key);
}

// context_management: clearing past thinking; keeping it all is the template's option to
// keep past reasoning. Other edits (clearing tool results, server-side compaction) are not
// done here.
void context_management(const ojson& body, ojson& chat) {
    const ojson* cm = field(body, "context_management");
    if (!cm) return;
    if (!cm->is_object())
        throw invalid("'context_management' must be an object", "context_management");
    const ojson* edits = field(*cm, "edits");
    if (!edits) return;
    if (!edits->is_array())
        throw invalid("'context_management.edits' must be an array", "context_management");
    for (size_t i = 0; i < edits->size(); ++i) {
        const ojson& e = (*edits)[i];
        const std::string at = "context_management.edits[" + std::to_string(i) + "]";
        const std::string type = e.is_object() ? e.value("type", "") : "";
        const ojson* keep = e.is_object() ? field(e, "keep") : nullptr;
        if (type.starts_with("clear_thinking_") && keep && *keep == "all") {
            chat["chat_template_kwargs"] = {{"clear_thinking", false}};
            continue;
        }
        throw invalid("'" + at + "' (" + (type.empty() ? e.dump() : type) +
                          ") is not supported by this server: it keeps the conversation as "
                          "sent; only clear_thinking with keep \"all\" is served",
                      "context_management");
    }
}

// Request fields of the Messages API that need what this server does not run (code
// execution containers, MCP connections, other models, a faster tier): a 400 naming the
// field unless at a value that asks for nothing.
void check_unserved(const ojson& body) {
    auto refuse = [](const std::string& name, const std::string& why) {
        return invalid("'" + name + "' is not supported by this server: " + why, name);
    };
    if (field(body, "container")) throw refuse("container", "it runs no code execution containers");
    if (const ojson* m = field(body, "mcp_servers"); m && !(m->is_array() && m->empty()))
        throw refuse("mcp_servers", "it makes no outbound connections; declare tools instead");
    if (const ojson* f = field(body, "fallbacks"); f && !(f->is_array() && f->empty()))
        throw refuse("fallbacks", "it serves one model");
    if (const ojson* sp = field(body, "speed"); sp && *sp != "standard")
        throw refuse("speed", "it has one speed (\"standard\")");
    if (const ojson* t = field(body, "service_tier"); t && *t != "auto" && *t != "standard_only")
        throw invalid("'service_tier' must be auto or standard_only", "service_tier");
    if (const ojson* c = field(body, "cache_control"); c && !c->is_object())
        throw invalid("'cache_control' must be an object", "cache_control");
}

// The messages, each in the chat endpoint's form, after the system message (if any).
void append_messages(const ojson& body, ojson& msgs) {
    const ojson* m = field(body, "messages");
    if (!m) throw invalid("'messages' is required", "messages");
    if (!m->is_array())
        throw invalid("'messages' must be an array, got " + std::string(json_kind(*m)), "messages");
    if (m->empty()) throw invalid("'messages' must not be empty", "messages");
    for (size_t i = 0; i < m->size(); ++i) {
        const ojson& msg = (*m)[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!msg.is_object())
            throw invalid(where + " must be an object, got " + json_kind(msg), "messages");
        const ojson* role = field(msg, "role");
        if (!role || !role->is_string())
            throw invalid(where + ".role must be a string", "messages");
        const std::string r = role->get<std::string>();
        const ojson* content = field(msg, "content");
        if (!content || !(content->is_string() || content->is_array()))
            throw invalid(where + ".content must be a string or an array of content blocks",
                          "messages");
        if (r == "user")
            user_message(*content, where, msgs);
        else if (r == "assistant")
            assistant_message(*content, where, msgs);
        else if (r == "system")
            msgs.push_back(
                {{"role", "system"}, {"content", system_text(*content, where + ".content")}});
        else
            throw invalid(where + ".role must be \"user\" or \"assistant\", got '" + r + "'",
                          "messages");
    }
}

// tool_choice in the chat endpoint's terms.
void tool_choice(const ojson& tc, ojson& chat) {
    if (!tc.is_object() || !field(tc, "type") || !tc["type"].is_string())
        throw invalid("'tool_choice' must be an object with a \"type\"", "tool_choice");
    const std::string type = tc["type"].get<std::string>();
    if (type == "auto")
        chat["tool_choice"] = "auto";
    else if (type == "any")
        chat["tool_choice"] = "required";
    else if (type == "none")
        chat["tool_choice"] = "none";
    else if (type == "tool") {
        const ojson* name = field(tc, "name");
        if (!name || !name->is_string())
            throw invalid("'tool_choice' of type \"tool\" needs a \"name\"", "tool_choice");
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
        throw invalid("'tool_choice.type' must be auto, any, tool or none, got '" + type + "'",
                      "tool_choice");
    }
    if (const ojson* d = field(tc, "disable_parallel_tool_use")) {
        if (!d->is_boolean())
            throw invalid("'tool_choice.disable_parallel_tool_use' must be a boolean",
                          "tool_choice");
        chat["parallel_tool_calls"] = !d->get<bool>();
    }
}

// thinking: on or off, and its budget (below max_tokens when both are given).
void thinking(const ojson& body, const ojson* mt, ojson& chat) {
    // Thinking is off unless asked for, as Anthropic's models have it.
    chat["think"] = false;
    if (const ojson* th = field(body, "thinking")) {
        if (!th->is_object() || !field(*th, "type") || !(*th)["type"].is_string())
            throw invalid("'thinking' must be an object with a \"type\"", "thinking");
        const std::string type = (*th)["type"].get<std::string>();
        if (type == "enabled") {
            const ojson* b = field(*th, "budget_tokens");
            if (!b || !b->is_number_integer() || b->get<int64_t>() < 0)
                throw invalid("'thinking.budget_tokens' must be a non-negative integer",
                              "thinking.budget_tokens");
            if (mt && mt->is_number_integer() && b->get<int64_t>() >= mt->get<int64_t>())
                throw invalid("'thinking.budget_tokens' must be less than 'max_tokens'",
                              "thinking.budget_tokens");
            chat["think"] = true;
            chat["reasoning_budget"] = *b;
        } else if (type == "adaptive" || type == "between_tools") {
            chat["think"] = true;
        } else if (type != "disabled") {
            throw invalid(
                "'thinking.type' must be enabled, adaptive or disabled, got '" + type + "'",
                "thinking");
        }
        // The reasoning is returned as generated, which "summarized" takes; leaving it out
        // of the reply is not done.
        if (const ojson* d = field(*th, "display"); d && *d != "summarized")
            throw invalid("'thinking.display' " + d->dump() +
                              " is not supported by this server: the reasoning is returned "
                              "in full (\"summarized\")",
                          "thinking.display");
    }
}

}  // namespace

ojson to_chat_body(const ojson& body, bool count_tokens) {
    ojson chat = ojson::object();
    ojson msgs = ojson::array();

    if (const ojson* s = field(body, "system")) {
        std::string text = system_text(*s, "system");
        // Blocks that were all metadata leave no system message, as if none was sent.
        if (!text.empty() || s->is_string())
            msgs.push_back({{"role", "system"}, {"content", std::move(text)}});
    }

    append_messages(body, msgs);
    chat["messages"] = std::move(msgs);

    const ojson* mt = field(body, "max_tokens");
    if (mt)
        chat["max_tokens"] = *mt;
    else if (!count_tokens)
        throw invalid("'max_tokens' is required", "max_tokens");
    for (const char* k : {"temperature", "top_p", "top_k", "stream"})
        if (const ojson* v = field(body, k)) chat[k] = *v;
    // The chat endpoint's extensions (llama.cpp's and this server's), for clients that
    // want them here too.
    for (const char* k : {"seed", "min_p", "repetition_penalty", "repeat_penalty", "ignore_eos",
                          "cache_prompt", "speculative"})
        if (const ojson* v = field(body, k)) chat[k] = *v;
    if (const ojson* s = field(body, "stop_sequences")) chat["stop"] = *s;
    if (const ojson* md = field(body, "metadata"); md && !md->is_object())
        throw invalid("'metadata' must be an object", "metadata");
    check_unserved(body);
    output_config(body, chat);
    context_management(body, chat);

    if (const ojson* t = field(body, "tools")) {
        ojson tools = tools_of(*t);
        if (!tools.empty()) chat["tools"] = std::move(tools);
    }
    if (const ojson* tc = field(body, "tool_choice")) tool_choice(*tc, chat);

    thinking(body, mt, chat);
    return chat;
}

const char* error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 408:
        case 504:
            return "timeout_error";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        default:
            return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

ojson error_body(int status, const std::string& message) {
    ojson e = ojson::object();
    e["type"] = error_type(status);
    e["message"] = message;
    ojson j = ojson::object();
    j["type"] = "error";
    j["error"] = std::move(e);
    return j;
}

ojson error_body(const ApiError& e) {
    return error_body(
        e.status(), e.anthropic_message().empty() ? std::string(e.what()) : e.anthropic_message());
}

bool is_messages_path(std::string_view path) {
    return path == "/v1/messages" || path.starts_with("/v1/messages/") || path == "/v1/messages?";
}

std::string tool_use_id(const std::string& call_id) {
    return call_id.starts_with("call_") ? "toolu_" + call_id.substr(5) : call_id;
}

}  // namespace glm5::server::anthropic

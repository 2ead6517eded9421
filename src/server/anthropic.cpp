#include "server/anthropic.h"

#include <set>

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

std::string system_text(const ojson& s, const std::string& where) {
    if (s.is_string()) return s.get<std::string>();
    if (!s.is_array()) throw invalid(where + " must be a string or an array of text blocks", where);
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
        const std::string at = where + "[" + std::to_string(k) + "]";
        const std::string t = block_type(s[k], at);
        if (t != "text") throw invalid(at + ": system blocks must be text, not '" + t + "'", where);
        if (!out.empty()) out += "\n\n";
        out += text_field(s[k], "text", at);
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

}  // namespace

ojson to_chat_body(const ojson& body, bool count_tokens) {
    ojson chat = ojson::object();
    ojson msgs = ojson::array();

    if (const ojson* s = field(body, "system"))
        msgs.push_back({{"role", "system"}, {"content", system_text(*s, "system")}});

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

    if (const ojson* t = field(body, "tools")) {
        ojson tools = tools_of(*t);
        if (!tools.empty()) chat["tools"] = std::move(tools);
    }
    if (const ojson* tc = field(body, "tool_choice")) {
        if (!tc->is_object() || !field(*tc, "type") || !(*tc)["type"].is_string())
            throw invalid("'tool_choice' must be an object with a \"type\"", "tool_choice");
        const std::string type = (*tc)["type"].get<std::string>();
        if (type == "auto")
            chat["tool_choice"] = "auto";
        else if (type == "any")
            chat["tool_choice"] = "required";
        else if (type == "none")
            chat["tool_choice"] = "none";
        else if (type == "tool") {
            const ojson* name = field(*tc, "name");
            if (!name || !name->is_string())
                throw invalid("'tool_choice' of type \"tool\" needs a \"name\"", "tool_choice");
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
        } else {
            throw invalid("'tool_choice.type' must be auto, any, tool or none, got '" + type + "'",
                          "tool_choice");
        }
        if (const ojson* d = field(*tc, "disable_parallel_tool_use")) {
            if (!d->is_boolean())
                throw invalid("'tool_choice.disable_parallel_tool_use' must be a boolean",
                              "tool_choice");
            chat["parallel_tool_calls"] = !d->get<bool>();
        }
    }

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
    }
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
    return error_body(e.status(), e.what());
}

bool is_messages_path(std::string_view path) {
    return path == "/v1/messages" || path.starts_with("/v1/messages/") || path == "/v1/messages?";
}

std::string tool_use_id(const std::string& call_id) {
    return call_id.starts_with("call_") ? "toolu_" + call_id.substr(5) : call_id;
}

}  // namespace glm5::server::anthropic

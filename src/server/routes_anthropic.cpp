// POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the
// same engine path as chat completions (anthropic.h maps the request), with its reply
// shapes: content blocks (thinking, text, tool_use), stop_reason and usage, and in a
// stream the event sequence message_start, ping, content_block_start / _delta / _stop,
// message_delta, message_stop.
#include <string>

#include "core/log.h"
#include "core/sha256.h"
#include "server/anthropic.h"
#include "server/exchange.h"
#include "server/reply_stream.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string event(const char* type, const ojson& data) {
    return std::string("event: ") + type + "\ndata: " + dump(data) + "\n\n";
}

// Anthropic's thinking blocks carry a signature the client sends back; here it is the
// text's SHA-256 (nothing checks it on the way back in).
std::string signature(const std::string& thinking) {
    return to_hex(sha256({reinterpret_cast<const uint8_t*>(thinking.data()), thinking.size()}));
}

std::string stop_reason(const ChoiceState& c) {
    if (c.result.finish_reason == "length") return "max_tokens";
    if (!c.stop_sequence.empty()) return "stop_sequence";
    return c.calls.empty() ? "end_turn" : "tool_use";
}

ojson tool_use_block(const text::ToolCall& call) {
    ojson b = ojson::object();
    b["type"] = "tool_use";
    b["id"] = anthropic::tool_use_id(call.id);
    b["name"] = call.name;
    b["input"] = call.arguments.is_object() ? call.arguments : ojson::object();
    return b;
}

ojson usage(const GenRequest& g, const ChoiceState& c, bool done) {
    const int64_t prompt = g.prompts[0].expanded_size();
    const int64_t cached = c.result.cached_tokens;
    ojson u = ojson::object();
    u["input_tokens"] = prompt - cached;
    u["cache_creation_input_tokens"] = 0;
    u["cache_read_input_tokens"] = cached;
    u["output_tokens"] = done ? int64_t(c.result.tokens.size()) : 0;
    return u;
}

// A streamed reply as Anthropic's events: what it has produced, its open content
// block, and how it is sent.
class EventStream final : public StreamShape {
  public:
    EventStream(const GenRequest& request, std::string model_name)
        : g(request), model(std::move(model_name)) {}

    // The message opens at once.
    std::string opening() override {
        ojson msg = ojson::object();
        msg["id"] = random_id("msg_");
        msg["type"] = "message";
        msg["role"] = "assistant";
        msg["model"] = model;
        msg["content"] = ojson::array();
        msg["stop_reason"] = nullptr;
        msg["stop_sequence"] = nullptr;
        msg["usage"] = usage(g, c, false);
        return event("message_start", {{"type", "message_start"}, {"message", msg}}) +
               event("ping", {{"type", "ping"}});
    }

    std::string on_event(Event& e) override;

    bool end_turn(std::string& out) override {
        // A long wait (a queue, a long prompt) keeps the connection alive.
        const Clock::time_point now = Clock::now();
        if (out.empty() && now - last_write > std::chrono::seconds(10))
            out += event("ping", {{"type", "ping"}});
        if (!out.empty()) last_write = now;
        return finished;
    }

    std::string summary() const override {
        return generation_summary(g.prompts[0].expanded_size(), c.result.cached_tokens,
                                  int64_t(c.result.tokens.size()), c.result.finish_reason);
    }

  private:
    const GenRequest g;
    const std::string model;
    ChoiceState c;
    bool finished = false;
    int index = -1;          // the open content block, -1: none
    std::string block_type;  // its type
    Clock::time_point last_write;

    std::string close_block() {
        if (index < 0 || block_type.empty()) return "";
        std::string out;
        if (block_type == "thinking")
            out += event(
                "content_block_delta",
                {{"type", "content_block_delta"},
                 {"index", index},
                 {"delta", {{"type", "signature_delta"}, {"signature", signature(c.reasoning)}}}});
        out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
        block_type.clear();
        return out;
    }

    // Text of one kind goes into the open block of that kind, or a new one.
    std::string text_block(const char* type, const char* delta_type, const char* key,
                           const std::string& text) {
        if (text.empty()) return "";
        std::string out;
        if (block_type != type) {
            out += close_block();
            ++index;
            block_type = type;
            ojson block = {{"type", type}, {key, ""}};
            if (std::string(type) == "thinking") block["signature"] = "";
            out += event(
                "content_block_start",
                {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
        }
        return out + event("content_block_delta", {{"type", "content_block_delta"},
                                                   {"index", index},
                                                   {"delta", {{"type", delta_type}, {key, text}}}});
    }

    // A tool call is a block of its own, its input in one delta.
    std::string tool_block(const text::ToolCall& call) {
        std::string out = close_block();
        ++index;
        ojson block = tool_use_block(call);
        const ojson input = block["input"];
        block["input"] = ojson::object();
        out += event("content_block_start",
                     {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
        out += event("content_block_delta",
                     {{"type", "content_block_delta"},
                      {"index", index},
                      {"delta", {{"type", "input_json_delta"}, {"partial_json", dump(input)}}}});
        out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
        return out;
    }
};

// What one event from the engine thread sends.
std::string EventStream::on_event(Event& e) {
    const Delta& d = e.delta;
    std::string out = text_block("thinking", "thinking_delta", "thinking", d.reasoning);
    out += text_block("text", "text_delta", "text", d.content);
    for (const auto& call : d.tool_calls) out += tool_block(call);
    c.apply(e);
    if (!e.done) return out;
    c.finish(e);
    finished = true;
    if (auto err = failure(c.result)) return out + event("error", anthropic::error_body(*err));
    out += close_block();
    out += event(
        "message_delta",
        {{"type", "message_delta"},
         {"delta",
          {{"stop_reason", stop_reason(c)},
           {"stop_sequence", c.stop_sequence.empty() ? ojson(nullptr) : ojson(c.stop_sequence)}}},
         {"usage", usage(g, c, true)}});
    return out + event("message_stop", {{"type", "message_stop"}});
}

}  // namespace

void Server::messages_create(const httplib::Request& req, httplib::Response& res,
                             std::string_view body, bool large) {
    messages(req, res, body, large, false);
}

void Server::messages_count_tokens(const httplib::Request& req, httplib::Response& res,
                                   std::string_view body, bool large) {
    messages(req, res, body, large, true);
}

void Server::messages(const httplib::Request& req, httplib::Response& res,
                      std::string_view raw_body, bool large, bool count_only) {
    GenRequest g;
    std::string model;
    int64_t counted = 0;
    auto guard = start_generation(raw_body, large, [&](const ojson& body) {
        if (const auto it = body.find("model"); it != body.end() && it->is_string())
            model = it->get<std::string>();
        const ojson chat = anthropic::to_chat_body(body, count_only);
        if (count_only)
            counted = count_chat_prompt(chat, mc_);
        else
            g = parse_chat_request(chat, mc_);
    });
    if (model.empty()) model = mc_.id;
    if (count_only) {
        send_json(res, 200, {{"input_tokens", counted}});
        return;
    }
    for (const auto& w : g.warnings) log_info("glm5 serve: %s\n", w.c_str());
    std::shared_ptr<Exchange> ex = submit(g, Endpoint::Chat);
    if (g.stream)
        messages_stream(req, res, g, ex, model);
    else
        messages_plain(req, res, g, ex, model);
    (void)guard;
}

void Server::messages_plain(const httplib::Request& req, httplib::Response& res,
                            const GenRequest& g, std::shared_ptr<Exchange> ex,
                            const std::string& model) {
    ChoiceState c;
    if (!wait_reply(req, res, *ex, std::span<ChoiceState>(&c, 1))) return;
    if (auto err = failure(c.result)) throw *err;
    ojson content = ojson::array();
    if (!c.reasoning.empty())
        content.push_back({{"type", "thinking"},
                           {"thinking", c.reasoning},
                           {"signature", signature(c.reasoning)}});
    if (!c.content.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
    for (const auto& call : c.calls) content.push_back(tool_use_block(call));
    ojson j = ojson::object();
    j["id"] = random_id("msg_");
    j["type"] = "message";
    j["role"] = "assistant";
    j["model"] = model;
    j["content"] = std::move(content);
    j["stop_reason"] = stop_reason(c);
    j["stop_sequence"] = c.stop_sequence.empty() ? ojson(nullptr) : ojson(c.stop_sequence);
    j["usage"] = usage(g, c, true);
    if (opt_.log_requests)
        log_info("glm5 serve: POST %s: %lld prompt tokens (%lld cached) + %lld generated, %s\n",
                 req.path.c_str(), (long long)g.prompts[0].expanded_size(),
                 (long long)c.result.cached_tokens, (long long)c.result.tokens.size(),
                 c.result.finish_reason.c_str());
    send_json(res, 200, j);
}

void Server::messages_stream(const httplib::Request& req, httplib::Response& res,
                             const GenRequest& g, std::shared_ptr<Exchange> ex,
                             const std::string& model) {
    stream(req, res, std::move(ex), std::make_shared<EventStream>(g, model));
}

}  // namespace glm5::server

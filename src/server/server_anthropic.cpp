// POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the
// same engine path as chat completions (anthropic.h maps the request), with its reply
// shapes: content blocks (thinking, text, tool_use), stop_reason and usage, and in a
// stream the event sequence message_start, ping, content_block_start / _delta / _stop,
// message_delta, message_stop.
#include <string>

#include "core/log.h"
#include "core/sha256.h"
#include "server/anthropic.h"
#include "server/client_socket.h"
#include "server/exchange.h"
#include "server/http_transport.h"
#include "server/large_body.h"
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

}  // namespace

void Server::messages(const httplib::Request& req, httplib::Response& res,
                      std::string_view raw_body, bool large, bool count_only) {
    auto guard = std::make_shared<InFlight>(this);
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    GenRequest g;
    std::string model;
    auto parse = [&] {
        const ojson body = parse_body(raw_body);
        if (const auto it = body.find("model"); it != body.end() && it->is_string())
            model = it->get<std::string>();
        g = parse_chat_request(anthropic::to_chat_body(body, count_only), mc_);
    };
    if (large)
        parse_lane_->run(parse);
    else
        parse();
    body_parsed();
    if (model.empty()) model = mc_.id;
    if (count_only) {
        send_json(res, 200, {{"input_tokens", g.prompts[0].expanded_size()}});
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
    struct Stream {
        GenRequest g;
        std::shared_ptr<Exchange> ex;
        std::unique_ptr<InFlight> guard;
        ChoiceState c;
        bool started = false, finished = false;
        std::string model, path;
        int index = -1;          // the open content block, -1: none
        std::string block_type;  // its type
        Clock::time_point last_write;
    };
    auto st = std::make_shared<Stream>();
    st->g = g;
    st->ex = std::move(ex);
    st->guard = std::make_unique<InFlight>(this);
    st->model = model;
    st->path = req.path;

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
            std::string out;
            auto close_block = [&] {
                if (st->index < 0 || st->block_type.empty()) return;
                if (st->block_type == "thinking")
                    out += event("content_block_delta",
                                 {{"type", "content_block_delta"},
                                  {"index", st->index},
                                  {"delta",
                                   {{"type", "signature_delta"},
                                    {"signature", signature(st->c.reasoning)}}}});
                out += event("content_block_stop",
                             {{"type", "content_block_stop"}, {"index", st->index}});
                st->block_type.clear();
            };
            // Text of one kind goes into the open block of that kind, or a new one.
            auto text_block = [&](const char* type, const char* delta_type, const char* key,
                                  const std::string& text) {
                if (text.empty()) return;
                if (st->block_type != type) {
                    close_block();
                    ++st->index;
                    st->block_type = type;
                    ojson block = {{"type", type}, {key, ""}};
                    if (std::string(type) == "thinking") block["signature"] = "";
                    out += event("content_block_start", {{"type", "content_block_start"},
                                                         {"index", st->index},
                                                         {"content_block", block}});
                }
                out +=
                    event("content_block_delta", {{"type", "content_block_delta"},
                                                  {"index", st->index},
                                                  {"delta", {{"type", delta_type}, {key, text}}}});
            };
            if (!st->started) {
                // The message opens at once: the client sees the reply start.
                st->started = true;
                ojson msg = ojson::object();
                msg["id"] = random_id("msg_");
                msg["type"] = "message";
                msg["role"] = "assistant";
                msg["model"] = st->model;
                msg["content"] = ojson::array();
                msg["stop_reason"] = nullptr;
                msg["stop_sequence"] = nullptr;
                msg["usage"] = usage(st->g, st->c, false);
                out += event("message_start", {{"type", "message_start"}, {"message", msg}});
                out += event("ping", {{"type", "ping"}});
            }
            std::vector<Event> evs;
            st->ex->channel->take(evs, out.empty() ? kPoll : std::chrono::milliseconds(0));
            for (auto& e : evs) {
                const Delta& d = e.delta;
                text_block("thinking", "thinking_delta", "thinking", d.reasoning);
                text_block("text", "text_delta", "text", d.content);
                for (const auto& call : d.tool_calls) {
                    close_block();
                    ++st->index;
                    ojson block = tool_use_block(call);
                    const ojson input = block["input"];
                    block["input"] = ojson::object();
                    out += event("content_block_start", {{"type", "content_block_start"},
                                                         {"index", st->index},
                                                         {"content_block", block}});
                    out += event(
                        "content_block_delta",
                        {{"type", "content_block_delta"},
                         {"index", st->index},
                         {"delta", {{"type", "input_json_delta"}, {"partial_json", dump(input)}}}});
                    out += event("content_block_stop",
                                 {{"type", "content_block_stop"}, {"index", st->index}});
                }
                st->c.apply(e);
                if (!e.done) continue;
                st->c.finish(e);
                st->finished = true;
                if (auto err = failure(st->c.result)) {
                    out += event("error", anthropic::error_body(*err));
                } else {
                    close_block();
                    out += event("message_delta",
                                 {{"type", "message_delta"},
                                  {"delta",
                                   {{"stop_reason", stop_reason(st->c)},
                                    {"stop_sequence", st->c.stop_sequence.empty()
                                                          ? ojson(nullptr)
                                                          : ojson(st->c.stop_sequence)}}},
                                  {"usage", usage(st->g, st->c, true)}});
                    out += event("message_stop", {{"type", "message_stop"}});
                }
            }
            // A long wait (a queue, a long prompt) keeps the connection alive.
            const Clock::time_point now = Clock::now();
            if (out.empty() && now - st->last_write > std::chrono::seconds(10))
                out += event("ping", {{"type", "ping"}});
            if (!out.empty()) {
                st->last_write = now;
                if (!sink.write(out.data(), out.size())) {
                    st->ex->cancel();
                    return false;
                }
            }
            return stream_turn(
                sink, *st->ex, st->finished, st->path,
                st->finished ? generation_summary(
                                   st->g.prompts[0].expanded_size(), st->c.result.cached_tokens,
                                   int64_t(st->c.result.tokens.size()), st->c.result.finish_reason)
                             : std::string());
        },
        [st](bool) {
            // However the stream ended: nothing keeps generating for it.
            st->ex->cancel();
            st->guard.reset();
        });
}

}  // namespace glm5::server

// OpenAI's API: POST /v1/chat/completions and /v1/completions (openai_request.h parses
// their bodies), GET /v1/models and /v1/models/{id}; and the generation path every API's
// responders share: a request's start, its submission to the engine as one group, the
// wait for a plain reply and the turns of a stream.
#include <httplib.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "server/client_socket.h"
#include "server/exchange.h"
#include "server/http_transport.h"
#include "server/large_body.h"
#include "server/reply_stream.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;
using std::chrono::milliseconds;

std::string sse(const ojson& j) {
    return "data: " + dump(j) + "\n\n";
}

std::string finish_reason(const ChoiceState& c) {
    if (c.result.finish_reason == "length") return "length";
    return c.calls.empty() ? "stop" : "tool_calls";
}

// A token as OpenAI's logprobs show it: its text, its log-probability, its bytes.
ojson token_json(const text::Tokenizer& tok, int32_t id, float logprob) {
    const std::string& b = tok.token_bytes(id);
    ojson bytes = ojson::array();
    for (unsigned char c : b) bytes.push_back(int(c));
    ojson t = ojson::object();
    t["token"] = b;
    t["logprob"] = logprob;
    t["bytes"] = std::move(bytes);
    return t;
}

// Chat's {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
ojson chat_logprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps) {
    ojson content = ojson::array();
    for (const auto& lp : lps) {
        ojson e = token_json(tok, lp.token, lp.logprob);
        ojson top = ojson::array();
        for (const auto& [id, l] : lp.top) top.push_back(token_json(tok, id, l));
        e["top_logprobs"] = std::move(top);
        content.push_back(std::move(e));
    }
    ojson j = ojson::object();
    j["content"] = std::move(content);
    j["refusal"] = nullptr;
    return j;
}

// Completions' {tokens, token_logprobs, top_logprobs, text_offset}; `offset` is the
// byte offset of the first token in the text, advanced past the last.
ojson completion_logprobs(const text::Tokenizer& tok, std::span<const runtime::TokenLogprob> lps,
                          int64_t& offset) {
    ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(),
          offsets = ojson::array();
    for (const auto& lp : lps) {
        tokens.push_back(tok.token_bytes(lp.token));
        values.push_back(lp.logprob);
        ojson top = ojson::object();
        for (const auto& [id, l] : lp.top) top[tok.token_bytes(id)] = l;
        tops.push_back(std::move(top));
        offsets.push_back(offset);
        offset += int64_t(tok.token_bytes(lp.token).size());
    }
    ojson j = ojson::object();
    j["tokens"] = std::move(tokens);
    j["token_logprobs"] = std::move(values);
    j["top_logprobs"] = std::move(tops);
    j["text_offset"] = std::move(offsets);
    return j;
}

ojson tool_calls_json(const ChoiceState& c) {
    ojson a = ojson::array();
    for (const auto& call : c.calls) a.push_back(text::tool_call_to_openai(call));
    return a;
}

ojson usage_json(const GenRequest& g, const std::vector<ChoiceState>& cs) {
    int64_t prompt = 0, cached = 0, completion = 0;
    for (size_t p = 0; p < g.prompts.size(); ++p) {
        prompt += g.prompts[p].expanded_size();  // image tokens count, as in vLLM
        cached += cs[p * size_t(g.n)].result.cached_tokens;
    }
    for (const auto& c : cs) completion += int64_t(c.result.tokens.size());
    ojson u = ojson::object();
    u["prompt_tokens"] = prompt;
    u["completion_tokens"] = completion;
    u["total_tokens"] = prompt + completion;
    u["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return u;
}

ojson timings_json(const std::vector<ChoiceState>& cs) {
    double queue = 0, prompt = 0, gen = 0;
    int64_t n = 0, draft_n = 0, draft_accepted = 0;
    for (const auto& c : cs) {
        draft_n += c.result.draft_n;
        draft_accepted += c.result.draft_accepted;
        queue = std::max(queue, c.result.queue_seconds);
        prompt = std::max(prompt, c.result.prompt_seconds);
        gen = std::max(gen, c.result.gen_seconds);
        n += int64_t(c.result.tokens.size());
    }
    ojson t = ojson::object();
    t["queue_ms"] = queue * 1e3;
    t["prompt_ms"] = prompt * 1e3;
    t["generation_ms"] = gen * 1e3;
    t["generated_per_second"] = gen > 0 ? double(n) / gen : 0.0;
    // As llama.cpp's server reports speculative decoding.
    t["draft_n"] = draft_n;
    t["draft_n_accepted"] = draft_accepted;
    return t;
}

// A streamed reply as OpenAI's chunks: what it has produced, and how it is sent.
class ChunkStream final : public StreamShape {
  public:
    ChunkStream(const GenRequest& request, const ModelContext& mc)
        : g(request),
          tok(mc.tok),
          model(mc.id),
          chat(request.endpoint == Endpoint::Chat),
          cs(size_t(request.choices())),
          tool_index(size_t(request.choices()), 0),
          text_offset(size_t(request.choices()), 0),
          pending(request.choices()),
          id(random_id(chat ? "chatcmpl-" : "cmpl-")),
          created(unix_now()) {}

    // The first chunks.
    std::string opening() override {
        std::string out;
        for (int k = 0; k < g.choices(); ++k) {
            if (chat)
                out += chunk(k, {{"role", "assistant"}, {"content", ""}}, nullptr);
            else if (g.echo)
                out += chunk(k, g.prompts[size_t(k / g.n)].text, nullptr);
        }
        return out;
    }

    std::string on_event(Event& e) override;

    // After the last choice's end: the usage chunk when asked for, and [DONE].
    bool end_turn(std::string& out) override {
        if (pending > 0) return false;
        if (g.include_usage) {
            ojson j = head();
            j["choices"] = ojson::array();
            j["usage"] = usage_json(g, cs);
            out += sse(j);
        }
        out += "data: [DONE]\n\n";
        return true;
    }

    std::string summary() const override {
        const ojson u = usage_json(g, cs);
        return generation_summary(u["prompt_tokens"].get<int64_t>(),
                                  u["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
                                  u["completion_tokens"].get<int64_t>(),
                                  cs[0].result.finish_reason);
    }

  private:
    const GenRequest g;
    const text::Tokenizer* tok;
    const std::string model;
    const bool chat;
    std::vector<ChoiceState> cs;
    std::vector<int> tool_index;
    std::vector<int64_t> text_offset;  // completions' logprobs
    int pending;
    const std::string id;
    const int64_t created;

    // What every chunk starts with.
    ojson head() const {
        ojson j = ojson::object();
        j["id"] = id;
        j["object"] = chat ? "chat.completion.chunk" : "text_completion";
        j["created"] = created;
        j["model"] = model;
        return j;
    }

    std::string chunk(int index, ojson delta_or_text, const ojson& finish,
                      ojson logprobs = nullptr) const {
        ojson j = head();
        ojson c = ojson::object();
        c["index"] = index;
        if (chat)
            c["delta"] = std::move(delta_or_text);
        else
            c["text"] = std::move(delta_or_text);
        c["logprobs"] = std::move(logprobs);
        c["finish_reason"] = finish;
        j["choices"] = ojson::array({std::move(c)});
        if (g.include_usage) j["usage"] = nullptr;
        return sse(j);
    }

    // A choice's new tool calls, numbered across its stream.
    ojson tool_call_deltas(int index, const std::vector<text::ToolCall>& calls) {
        ojson a = ojson::array();
        for (const auto& call : calls) {
            ojson tc = text::tool_call_to_openai(call);
            ojson indexed = ojson::object();
            indexed["index"] = tool_index[size_t(index)]++;
            for (auto& [k, v] : tc.items()) indexed[k] = v;
            a.push_back(std::move(indexed));
        }
        return a;
    }
};

// What one event from the engine thread sends.
std::string ChunkStream::on_event(Event& e) {
    std::string out;
    ChoiceState& c = cs[size_t(e.index)];
    const Delta& d = e.delta;
    // The tokens' logprobs go with the event's first chunk, or one of their own.
    ojson lp = nullptr;
    if (!e.logprobs.empty())
        lp = chat ? chat_logprobs(*tok, e.logprobs)
                  : completion_logprobs(*tok, e.logprobs, text_offset[size_t(e.index)]);
    if (chat) {
        if (!d.reasoning.empty())
            out += chunk(e.index, {{"reasoning_content", d.reasoning}}, nullptr,
                         std::exchange(lp, nullptr));
        if (!d.content.empty())
            out += chunk(e.index, {{"content", d.content}}, nullptr, std::exchange(lp, nullptr));
        if (!d.tool_calls.empty())
            out += chunk(e.index, {{"tool_calls", tool_call_deltas(e.index, d.tool_calls)}},
                         nullptr, std::exchange(lp, nullptr));
    } else if (!d.content.empty()) {
        out += chunk(e.index, d.content, nullptr, std::exchange(lp, nullptr));
    }
    if (!lp.is_null())
        out += chunk(e.index, chat ? ojson::object() : ojson(""), nullptr, std::move(lp));
    c.apply(e);
    if (!e.done) return out;
    c.finish(e);
    --pending;
    if (auto err = failure(c.result))
        out += sse(err->body());
    else
        out += chunk(e.index, chat ? ojson::object() : ojson(""), finish_reason(c));
    return out;
}

}  // namespace

void Server::chat_completions(const httplib::Request& req, httplib::Response& res,
                              std::string_view body, bool large) {
    generate(req, res, body, large, Endpoint::Chat);
}

void Server::completions(const httplib::Request& req, httplib::Response& res, std::string_view body,
                         bool large) {
    generate(req, res, body, large, Endpoint::Completion);
}

ojson Server::model_json() const {
    ojson m = ojson::object();
    m["id"] = mc_.id;
    m["object"] = "model";
    m["created"] = created_;
    m["owned_by"] = "glm5.cpp";
    m["meta"] = {
        {"n_ctx", mc_.n_ctx}, {"n_vocab", mc_.tok->n_vocab()}, {"vision", mc_.vision != nullptr}};
    return m;
}

void Server::list_models(const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", ojson::array({model_json()})}});
}

void Server::get_model(const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (std::find(mc_.names.begin(), mc_.names.end(), name) == mc_.names.end())
        throw ApiError(404, "The model '" + name + "' does not exist", "model", "model_not_found");
    send_json(res, 200, model_json());
}

std::shared_ptr<InFlight> Server::start_generation(std::string_view raw_body, bool large,
                                                   const std::function<void(const ojson&)>& parse) {
    // Counted before the check: a drain that starts now sees this request (and
    // waits for it) or this request sees the drain.
    auto guard = std::make_shared<InFlight>(this);
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    auto job = [&] { parse(parse_body(raw_body)); };
    if (large)
        parse_lane_->run(job);
    else
        job();
    body_parsed();
    return guard;
}

void Server::generate(const httplib::Request& req, httplib::Response& res,
                      std::string_view raw_body, bool large, Endpoint ep) {
    GenRequest g;
    auto guard = start_generation(raw_body, large, [&](const ojson& body) {
        g = ep == Endpoint::Chat ? parse_chat_request(body, mc_)
                                 : parse_completion_request(body, mc_);
    });
    for (const auto& w : g.warnings) log_info("glm5 serve: %s\n", w.c_str());

    std::shared_ptr<Exchange> ex = submit(g, ep);
    if (g.stream) {
        respond_stream(req, res, g, ex);
        // The stream's provider holds its own InFlight; this one ends with the handler.
    } else {
        respond_plain(req, res, g, ex);
    }
    (void)guard;
}

std::shared_ptr<Server::Exchange> Server::submit(const GenRequest& g, Endpoint ep) {
    // Every choice's parameters first, so a refused constraint is a 400 before anything runs.
    std::vector<runtime::RequestParams> params;
    for (int k = 0; k < g.choices(); ++k) params.push_back(engine_params(g, k, mc_));

    ReplyStreamOptions ro;
    ro.parse = ep == Endpoint::Chat;
    ro.reasoning_open = g.reasoning_open;
    ro.tools = g.tools;
    ro.stop = g.stop;
    ro.single_tool_call = ep == Endpoint::Chat && !g.parallel_tool_calls;

    // The choices go to the engine as one group: admitted in the same step, they
    // decode in lockstep (and their speculative windows share verifies).
    auto ex = std::make_shared<Exchange>();
    std::vector<runtime::Engine::Submission> subs;
    for (int k = 0; k < g.choices(); ++k) {
        auto rs = std::make_shared<ReplyStream>(*mc_.tok, ro);
        std::shared_ptr<Channel> ch = ex->channel;
        // With logprobs: the engine hands each sampled token's logits row over right
        // before the token (a stop token's row is dropped with it).
        std::shared_ptr<std::optional<runtime::TokenLogprob>> lp;
        if (g.logprobs >= 0) {
            lp = std::make_shared<std::optional<runtime::TokenLogprob>>();
            params[size_t(k)].on_logits = [lp, top = g.logprobs](int32_t t,
                                                                 std::span<const float> row) {
                *lp = runtime::token_logprob(row, t, top);
            };
        }
        auto on_token = [rs, ch, k, lp](int32_t t) {
            Event e;
            e.index = k;
            const bool more = rs->push(t, e.delta);
            if (lp && *lp) {
                e.logprobs.push_back(std::move(**lp));
                lp->reset();
            }
            if (!e.delta.empty() || !e.logprobs.empty()) ch->push(std::move(e));
            return more;
        };
        auto on_done = [rs, ch, k](const runtime::RequestResult& r) {
            Event e;
            e.index = k;
            rs->finish(e.delta);
            e.done = true;
            e.result = r;
            e.stop_sequence = rs->matched_stop();
            ch->push(std::move(e));
        };
        subs.push_back({std::move(params[size_t(k)]), on_token, on_done});
    }
    try {
        ex->requests = engine_.submit_group(std::move(subs));
    } catch (const runtime::QueueFull& e) {
        throw ApiError(429, std::string(e.what()) + "; retry later", "", "queue_full",
                       "rate_limit_error")
            .with_retry_after(1);
    } catch (const Error& e) {
        if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
        throw bad_request(e.what());
    }
    return ex;
}

bool Server::wait_reply(const httplib::Request& req, httplib::Response& res, Exchange& ex,
                        std::span<ChoiceState> cs) {
    // This handler runs on its connection's worker, which knows the socket.
    const int fd = client_socket();
    if (fd < 0) throw Error("the handler does not know its client's connection");
    size_t pending = cs.size();
    std::vector<Event> evs;
    while (pending > 0) {
        evs.clear();
        ex.channel->take(evs, kPoll);
        for (auto& e : evs) {
            ChoiceState& c = cs[size_t(e.index)];
            c.apply(e);
            if (e.done) {
                c.finish(e);
                --pending;
            }
        }
        if (pending > 0 && client_gone(fd)) {
            ex.cancel();
            if (opt_.log_requests)
                log_info("glm5 serve: %s %s: client went away, cancelled\n", req.method.c_str(),
                         printable(req.path).c_str());
            res.status = 499;  // nginx's "client closed request"; nobody reads it
            return false;
        }
    }
    return true;
}

void Server::respond_plain(const httplib::Request& req, httplib::Response& res, const GenRequest& g,
                           std::shared_ptr<Exchange> ex) {
    std::vector<ChoiceState> cs(size_t(g.choices()));
    if (!wait_reply(req, res, *ex, cs)) return;
    for (const auto& c : cs)
        if (auto err = failure(c.result)) throw *err;

    const bool chat = g.endpoint == Endpoint::Chat;
    ojson j = ojson::object();
    j["id"] = random_id(chat ? "chatcmpl-" : "cmpl-");
    j["object"] = chat ? "chat.completion" : "text_completion";
    j["created"] = unix_now();
    j["model"] = mc_.id;
    ojson choices = ojson::array();
    for (size_t k = 0; k < cs.size(); ++k) {
        const ChoiceState& c = cs[k];
        ojson ch = ojson::object();
        ch["index"] = k;
        if (chat) {
            ojson m = ojson::object();
            m["role"] = "assistant";
            m["content"] =
                c.content.empty() && !c.calls.empty() ? ojson(nullptr) : ojson(c.content);
            if (!c.reasoning.empty()) m["reasoning_content"] = c.reasoning;
            if (!c.calls.empty()) m["tool_calls"] = tool_calls_json(c);
            ch["message"] = std::move(m);
        } else {
            ch["text"] = (g.echo ? g.prompts[k / size_t(g.n)].text : std::string()) + c.content;
        }
        if (g.logprobs < 0) {
            ch["logprobs"] = nullptr;
        } else if (chat) {
            ch["logprobs"] = chat_logprobs(*mc_.tok, c.logprobs);
        } else {
            int64_t offset = 0;
            ch["logprobs"] = completion_logprobs(*mc_.tok, c.logprobs, offset);
        }
        ch["finish_reason"] = finish_reason(c);
        choices.push_back(std::move(ch));
    }
    j["choices"] = std::move(choices);
    j["usage"] = usage_json(g, cs);
    j["timings"] = timings_json(cs);
    if (opt_.log_requests) {
        const ojson& u = j["usage"];
        log_info("glm5 serve: %s %s: %lld prompt tokens (%lld cached) + %lld generated, %s\n",
                 req.method.c_str(), printable(req.path).c_str(),
                 (long long)u["prompt_tokens"].get<int64_t>(),
                 (long long)u["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
                 (long long)u["completion_tokens"].get<int64_t>(),
                 cs[0].result.finish_reason.c_str());
    }
    send_json(res, 200, j);
}

std::string generation_summary(int64_t prompt, int64_t cached, int64_t generated,
                               const std::string& finish) {
    return std::to_string(prompt) + " prompt tokens (" + std::to_string(cached) + " cached) + " +
           std::to_string(generated) + " generated, " + finish;
}

bool Server::stream_turn(httplib::DataSink& sink, Exchange& ex, const std::string& out,
                         bool finished, const std::string& path, const std::string& summary) {
    if (!out.empty() && !sink.write(out.data(), out.size())) {
        ex.cancel();
        return false;
    }
    if (finished) {
        if (opt_.log_requests)
            log_info("glm5 serve: POST %s (stream): %s\n", printable(path).c_str(),
                     summary.c_str());
        sink.done();
        return true;
    }
    if (!sink.is_writable()) {
        ex.cancel();
        if (opt_.log_requests)
            log_info("glm5 serve: POST %s (stream): client went away, cancelled\n",
                     printable(path).c_str());
        return false;
    }
    return true;
}

void Server::respond_stream(const httplib::Request& req, httplib::Response& res,
                            const GenRequest& g, std::shared_ptr<Exchange> ex) {
    stream(req, res, std::move(ex), std::make_shared<ChunkStream>(g, mc_));
}

void Server::stream(const httplib::Request& req, httplib::Response& res,
                    std::shared_ptr<Exchange> ex, std::shared_ptr<StreamShape> shape) {
    struct State {
        std::shared_ptr<Exchange> ex;
        std::shared_ptr<StreamShape> shape;
        std::unique_ptr<InFlight> guard;
        std::string path;
        bool started = false;
    };
    auto st = std::make_shared<State>();
    st->ex = std::move(ex);
    st->shape = std::move(shape);
    st->guard = std::make_unique<InFlight>(this);
    st->path = req.path;

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
            std::string out;
            if (!st->started) {
                st->started = true;
                out += st->shape->opening();
            }
            std::vector<Event> evs;
            st->ex->channel->take(evs, out.empty() ? kPoll : milliseconds(0));
            for (auto& e : evs) out += st->shape->on_event(e);
            const bool finished = st->shape->end_turn(out);
            return stream_turn(sink, *st->ex, out, finished, st->path,
                               finished ? st->shape->summary() : std::string());
        },
        [st](bool) {
            // However the stream ended: nothing keeps generating for it.
            st->ex->cancel();
            st->guard.reset();
        });
}

}  // namespace glm5::server

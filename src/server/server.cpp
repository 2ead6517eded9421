#include "server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <deque>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "server/anthropic.h"
#include "server/client_socket.h"
#include "server/exchange.h"
#include "server/http_transport.h"
#include "server/large_body.h"
#include "server/reply_stream.h"
#include "server/webui.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string sse(const ojson& j) {
    return "data: " + dump(j) + "\n\n";
}

// In the shape of the API the request's path belongs to.
void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
    if (e.retry_after() > 0) res.set_header("Retry-After", std::to_string(e.retry_after()));
    send_json(res, e.status(),
              anthropic::is_messages_path(req.path) ? anthropic::error_body(e) : e.body());
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

}  // namespace

std::string printable(std::string_view s) {
    std::string out;
    char buf[16];
    for (size_t i = 0; i < s.size();) {
        const auto c = uint8_t(s[i]);
        // The UTF-8 sequence at i, and its code point (-1 when it is not one).
        int n = c < 0x80                ? 1
                : c >= 0xC2 && c < 0xE0 ? 2
                : c >= 0xE0 && c < 0xF0 ? 3
                : c >= 0xF0 && c < 0xF5 ? 4
                                        : 0;
        int32_t cp = -1;
        if (n > 0 && i + size_t(n) <= s.size()) {
            cp = n == 1 ? c : c & (0x7F >> n);
            for (int k = 1; k < n && cp >= 0; ++k) {
                const auto d = uint8_t(s[i + size_t(k)]);
                cp = (d & 0xC0) == 0x80 ? cp << 6 | (d & 0x3F) : -1;
            }
        }
        if (cp < 0) {
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
            ++i;
            continue;
        }
        const bool hidden = cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) || cp == 0x200E ||
                            cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
                            (cp >= 0x2066 && cp <= 0x2069);
        if (hidden) {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
            out += buf;
        } else {
            out.append(s.substr(i, size_t(n)));
        }
        i += size_t(n);
    }
    return out;
}

namespace {

// A Host header's name, without its port (bracketed IPv6 kept in its brackets).
std::string host_name(const std::string& host) {
    if (!host.empty() && host[0] == '[') return host.substr(0, host.find(']') + 1);
    return host.substr(0, host.rfind(':') == std::string::npos ? host.size() : host.rfind(':'));
}

bool loopback_name(const std::string& h) {
    return h == "localhost" || h == "127.0.0.1" || h == "[::1]" || h == "::1" ||
           h.rfind("127.", 0) == 0;
}

}  // namespace

std::pair<int, std::string> Server::health() const {
    const runtime::EngineStats s = engine_.stats();
    ojson j = ojson::object();
    j["status"] = draining_ ? "shutting down" : "ok";
    j["slots_busy"] = s.busy_slots;
    j["slots_total"] = engine_.options().n_parallel;
    j["queue_depth"] = s.queue_depth;
    return {draining_ ? 503 : 200, dump(j)};
}

bool Server::host_allowed(const std::string& host) const {
    // Bound elsewhere than loopback, the operator chose who reaches it; no Host at all
    // (HTTP/1.0) is no rebound name either.
    if (!loopback_name(opt_.host) || host.empty()) return true;
    const std::string name = host_name(host);
    if (loopback_name(name)) return true;
    for (const std::string& a : opt_.allowed_hosts)
        if (a == "*" || a == name || a == host) return true;
    return false;
}

bool Server::origin_allowed(const std::string& origin, const std::string& host) const {
    for (const std::string& o : opt_.cors_origins)
        if (o == "*" || o == origin) return true;
    if (!opt_.cors_origins.empty()) return false;
    // By default: a key guards the API, so any page that has it may use it; without one,
    // only the server's own page (a page elsewhere could otherwise drive it unasked).
    if (!opt_.api_key.empty()) return true;
    return origin == "http://" + host || origin == "https://" + host;
}

Server::Server(runtime::Engine& engine, ModelContext mc, ServerOptions opt)
    : engine_(engine), mc_(std::move(mc)), opt_(std::move(opt)) {
    created_ = unix_now();
    // Blocks of a MiB or more always their own mappings, returned when freed: glibc would
    // otherwise raise its threshold to the largest block freed (a large body's strings), and
    // the next ones would stay in a thread's arena after the request (16 MiB resident after
    // a few refused 20 MB bodies, where one left none).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    TransportOptions to;
    to.max_connections = std::max(1, opt_.max_connections);
    to.max_threads = opt_.http_threads;
    to.read_timeout = opt_.read_timeout;
    to.write_timeout = opt_.write_timeout;
    // An idle keep-alive connection holds a worker until this runs out.
    to.keep_alive = opt_.keep_alive;
    to.max_body = opt_.max_body_bytes;
    http_ = std::make_unique<Transport>(to);
    parse_lane_ = std::make_unique<ParseLane>();
    http_->set_error_body([](const std::string& path, int status, const std::string& message,
                             const std::string& code) {
        return dump(anthropic::is_messages_path(path) ? anthropic::error_body(status, message)
                                                      : ApiError(status, message, "", code).body());
    });
    http_->set_keep_alive_max_count(1000);
    // /health is answered even beyond the connection cap: probes see a busy server as busy,
    // not down, however many clients hold connections.
    http_->set_health([this] { return health(); });
    // httplib's default is SO_REUSEPORT, which lets a second server bind the same port
    // and silently take half the connections; SO_REUSEADDR only allows a quick restart.
    http_->set_socket_options([](int sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    routes();
}

Server::~Server() {
    stop();
}

void Server::enter() {
    ++in_flight_;
}

void Server::leave() {
    {
        std::lock_guard<std::mutex> lk(idle_mu_);
        --in_flight_;
    }
    idle_cv_.notify_all();
}

bool Server::wait_idle(milliseconds timeout) {
    std::unique_lock<std::mutex> lk(idle_mu_);
    return idle_cv_.wait_for(lk, timeout, [&] { return in_flight_ == 0; });
}

void Server::begin_drain() {
    draining_ = true;
}

bool Server::running() const {
    return http_ && http_->is_running();
}

void Server::start() {
    if (opt_.port == 0) {
        port_ = http_->bind_to_any_port(opt_.host);
        if (port_ <= 0) throw Error("cannot listen on " + opt_.host + " (any port)");
    } else {
        if (!http_->bind_to_port(opt_.host, opt_.port))
            throw Error("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                        " (address in use, or not an address of this machine)");
        port_ = opt_.port;
    }
    listener_ = std::thread([this] { http_->listen_after_bind(); });
    // running() is what callers watch from now on: wait until the listener says so.
    for (int i = 0; i < 5000 && !http_->is_running(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    monitor_ = std::thread([this] {
        std::unique_lock<std::mutex> lk(stats_mu_);
        while (!stop_monitor_) {
            lk.unlock();
            sample_rates();
            lk.lock();
            monitor_cv_.wait_for(lk, std::chrono::seconds(1), [&] { return stop_monitor_; });
        }
    });
}

void Server::stop() {
    if (http_) http_->stop();
    if (listener_.joinable()) listener_.join();
    {
        std::lock_guard<std::mutex> lk(stats_mu_);
        stop_monitor_ = true;
    }
    monitor_cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
}

void Server::sample_rates() {
    const runtime::EngineStats s = engine_.stats();
    std::lock_guard<std::mutex> lk(stats_mu_);
    samples_.push_back({Clock::now(), s.generated_tokens, s.prompt_tokens});
    if (samples_.size() > 11) samples_.erase(samples_.begin());
}

void Server::count_status(int status) {
    std::lock_guard<std::mutex> lk(stats_mu_);
    http_status_[status]++;
}

std::string Server::metrics_text() {
    const runtime::EngineStats s = engine_.stats();
    double gen_rate = 0, prompt_rate = 0;
    std::map<int, uint64_t> statuses;
    {
        std::lock_guard<std::mutex> lk(stats_mu_);
        if (!samples_.empty()) {
            const RateSample& a = samples_.front();
            const double dt = std::chrono::duration<double>(Clock::now() - a.t).count();
            if (dt > 0.2) {
                gen_rate = double(s.generated_tokens - a.generated) / dt;
                prompt_rate = double(s.prompt_tokens - a.prompt) / dt;
            }
        }
        statuses = http_status_;
    }
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        o << "# HELP glm5_" << name << ' ' << help << "\n# TYPE glm5_" << name << ' ' << type
          << "\nglm5_" << name << ' ' << value << '\n';
    };
    metric("requests_total", "counter", "Engine requests submitted (one per choice).",
           s.requests_total);
    metric("requests_finished_total", "counter", "Engine requests that ended, however they ended.",
           s.requests_done);
    metric("requests_cancelled_total", "counter",
           "Engine requests cancelled (client gone, shutdown).", s.requests_cancelled);
    metric("requests_failed_total", "counter", "Engine requests that failed.", s.requests_failed);
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests (tokens in).",
           s.prompt_tokens);
    metric("prompt_tokens_cached_total", "counter",
           "Prompt tokens taken from the prefix cache instead of evaluated.", s.cached_tokens);
    metric("generated_tokens_total", "counter", "Tokens generated (tokens out).",
           s.generated_tokens);
    metric("generated_tokens_per_second", "gauge",
           "Tokens generated per second over the last 10 s.", gen_rate);
    metric("prompt_tokens_per_second", "gauge",
           "Prompt tokens admitted per second over the last 10 s.", prompt_rate);
    metric("forwards_total", "counter", "Model forwards (one per engine step).", s.forwards);
    metric("forward_seconds_total", "counter", "Seconds spent in model forwards.", s.busy_seconds);
    metric("weight_bytes_read_total", "counter",
           "Weight bytes the forwards read (counted by the kernels; a batch reads each once).",
           s.weight_bytes);
    metric("speculative_verifies_total", "counter",
           "Speculative windows verified (one per slot per forward).", s.verifies);
    metric("speculative_drafted_total", "counter", "Draft tokens proposed.", s.draft_tokens);
    metric("speculative_accepted_total", "counter", "Draft tokens accepted.", s.draft_accepted);
    metric("speculative_shared_verifies_total", "counter",
           "Forwards that verified the windows of two or more slots at once.", s.shared_verifies);
    o << "# HELP glm5_speculative_acceptance Acceptance of draft position i (0: the first "
         "draft of a window), given the drafts before it were accepted.\n"
         "# TYPE glm5_speculative_acceptance gauge\n";
    for (size_t i = 0; i < s.drafted_at.size(); ++i)
        o << "glm5_speculative_acceptance{position=\"" << i << "\"} "
          << (s.drafted_at[i] ? double(s.accepted_at[i]) / double(s.drafted_at[i]) : 0.0) << '\n';
    metric("queue_depth", "gauge", "Requests waiting for a slot.", s.queue_depth);
    metric("busy_slots", "gauge", "Slots bound to a request.", s.busy_slots);
    metric("slots", "gauge", "Slots (--parallel).", engine_.options().n_parallel);
    metric("retained_entries", "gauge", "Finished sequences kept for prefix reuse.",
           s.retained_entries);
    metric("retained_bytes", "gauge", "Memory held by retained sequences.", s.retained_bytes);
    metric("cache_planned_bytes", "gauge",
           "Cache memory the load-time plan set aside (slots at full context + prefix cache).",
           s.cache_pool_bytes);
    metric("cache_used_bytes", "gauge",
           "Cache memory held now by running requests and retained sequences.", s.cache_used_bytes);
    metric("http_in_flight", "gauge", "Generation requests being served.", in_flight_.load());
    metric("requests_refused_total", "counter",
           "Engine requests refused with 429 because the queue was full (--max-queue).",
           s.requests_refused);
    metric("queue_limit", "gauge", "Requests that may wait for a slot (--max-queue; 0: no limit).",
           engine_.options().max_queue);
    metric("http_connections_open", "gauge", "Open HTTP connections.", http_->open_connections());
    metric("http_connections_refused_total", "counter",
           "HTTP connections refused with 503 beyond --max-connections.",
           http_->refused_connections());
    metric("draining", "gauge", "1 while shutting down.", draining_ ? 1 : 0);
    // The names llama-server exports, for the dashboards built on them.
    auto llama = [&](const char* name, const char* type, const char* help, auto value) {
        o << "# HELP llamacpp:" << name << ' ' << help << "\n# TYPE llamacpp:" << name << ' '
          << type << "\nllamacpp:" << name << ' ' << value << '\n';
    };
    llama("prompt_tokens_total", "counter", "Prompt tokens processed (evaluated, not cached).",
          s.prompt_tokens - s.cached_tokens);
    llama("tokens_predicted_total", "counter", "Tokens generated.", s.generated_tokens);
    llama("prompt_tokens_seconds", "gauge", "Prompt tokens admitted per second (last 10 s).",
          prompt_rate);
    llama("predicted_tokens_seconds", "gauge", "Tokens generated per second (last 10 s).",
          gen_rate);
    llama("n_decode_total", "counter", "Model forwards.", s.forwards);
    llama("requests_processing", "gauge", "Requests being generated (busy slots).", s.busy_slots);
    llama("requests_deferred", "gauge", "Requests waiting for a slot.", s.queue_depth);
    llama("kv_cache_usage_ratio", "gauge", "Cache memory in use over what the plan set aside.",
          s.cache_pool_bytes ? double(s.cache_used_bytes) / double(s.cache_pool_bytes) : 0.0);
    o << "# HELP glm5_http_responses_total HTTP responses by status code.\n"
         "# TYPE glm5_http_responses_total counter\n";
    for (const auto& [code, n] : statuses)
        o << "glm5_http_responses_total{code=\"" << code << "\"} " << n << '\n';
    return o.str();
}

void Server::routes() {
    using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
    auto guarded = [](Handler h) {
        return [h](const httplib::Request& req, httplib::Response& res) {
            try {
                h(req, res);
            } catch (const ApiError& e) {
                send_error(req, res, e);
            } catch (const std::exception& e) {
                send_error(req, res, ApiError(500, std::string("internal error: ") + e.what()));
            }
        };
    };

    // Generation endpoints read their bodies themselves: into a string of the stated
    // size (httplib's own reading grows one by doubling), or a large body into a
    // mapping of its own (large_body.h).
    using BodyHandler = std::function<void(const httplib::Request&, httplib::Response&,
                                           std::string_view body, bool large)>;
    auto with_body = [guarded](BodyHandler h) {
        return [h, guarded](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) {
            guarded([&](const httplib::Request& rq, httplib::Response& rs) {
                const size_t stated =
                    rq.has_header("Content-Length")
                        ? size_t(std::stoull(rq.get_header_value("Content-Length")))
                        : kLargeBody + 1;  // unknown: as a large one
                std::string small;
                std::unique_ptr<BodyBuffer> large;
                if (stated > kLargeBody)
                    large = std::make_unique<BodyBuffer>(stated);
                else
                    small.reserve(stated);
                // A body cut off by the read timeout or the body limit is answered by the
                // transport (408, 413), whatever is sent from here.
                if (!reader([&](const char* data, size_t n) {
                        if (large)
                            large->append(data, n);
                        else
                            small.append(data, n);
                        return true;
                    }))
                    throw ApiError(400, "the request body could not be read", "", "bad_body");
                h(rq, rs, large ? large->view() : std::string_view(small), large != nullptr);
            })(req, res);
        };
    };
    auto chat = with_body([this](const auto& req, auto& res, std::string_view body, bool large) {
        generate(req, res, body, large, Endpoint::Chat);
    });
    auto completion =
        with_body([this](const auto& req, auto& res, std::string_view body, bool large) {
            generate(req, res, body, large, Endpoint::Completion);
        });
    auto messages_route = [this, with_body](bool count_only) {
        return with_body(
            [this, count_only](const auto& req, auto& res, std::string_view body, bool large) {
                messages(req, res, body, large, count_only);
            });
    };
    http_->Post("/v1/messages", messages_route(false));
    http_->Post("/v1/messages/count_tokens", messages_route(true));
    http_->Post("/v1/chat/completions", chat);
    http_->Post("/chat/completions", chat);
    http_->Post("/v1/completions", completion);
    http_->Post("/completions", completion);

    auto model_json = [this] {
        ojson m = ojson::object();
        m["id"] = mc_.id;
        m["object"] = "model";
        m["created"] = created_;
        m["owned_by"] = "glm5.cpp";
        m["meta"] = {{"n_ctx", mc_.n_ctx},
                     {"n_vocab", mc_.tok->n_vocab()},
                     {"vision", mc_.vision != nullptr}};
        return m;
    };
    auto models = [model_json](const httplib::Request&, httplib::Response& res) {
        send_json(res, 200, {{"object", "list"}, {"data", ojson::array({model_json()})}});
    };
    http_->Get("/v1/models", models);
    http_->Get("/models", models);
    http_->Get(R"(/v1/models/(.+))", guarded([this, model_json](const auto& req, auto& res) {
                   const std::string name = req.matches[1];
                   if (std::find(mc_.names.begin(), mc_.names.end(), name) == mc_.names.end())
                       throw ApiError(404, "The model '" + name + "' does not exist", "model",
                                      "model_not_found");
                   send_json(res, 200, model_json());
               }));

    // llama-server's utility endpoints, in its shapes.
    auto body_json = [](const httplib::Request& req) { return parse_body(req.body); };
    auto token_ids = [this](const ojson& t, const char* name) {
        if (!t.is_array())
            throw bad_request(std::string("'") + name + "' must be an array of token ids", name,
                              "invalid_type");
        std::vector<int32_t> ids;
        for (const auto& x : t) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
                x.get<int64_t>() >= mc_.tok->n_vocab())
                throw bad_request(std::string("'") + name + "' holds " + x.dump() +
                                      ", not a token id of this vocabulary (0.." +
                                      std::to_string(mc_.tok->n_vocab() - 1) + ")",
                                  name);
            ids.push_back(int32_t(x.get<int64_t>()));
        }
        return ids;
    };
    auto tokenize = guarded([this, body_json](const auto& req, auto& res) {
        const ojson b = body_json(req);
        const auto it = b.find("content");
        if (it == b.end() || !it->is_string())
            throw bad_request("'content' must be a string", "content", "invalid_type");
        const bool add_special = b.value("add_special", false);
        const bool parse_special = b.value("parse_special", true);
        const bool with_pieces = b.value("with_pieces", false);
        // Encoding takes up to about 64 bytes a byte of content (a run of punctuation is one
        // word to the byte-pair merges): bounded, and charged to the body budget.
        const std::string& content = it->get_ref<const std::string&>();
        constexpr size_t kMaxContent = size_t(8) << 20;
        if (content.size() > kMaxContent)
            throw ApiError(413,
                           "'content' of " + std::to_string(content.size()) +
                               " bytes: /tokenize takes at most " + std::to_string(kMaxContent) +
                               " (encoding costs up to 64 bytes a byte)",
                           "content", "content_too_large");
        const BudgetHold hold(64 * content.size());
        if (!hold.held())
            throw ApiError(503, "the server holds too much request memory; retry later", "",
                           "server_busy");
        // The ids (4 bytes a token, a token at least a byte of the body) are all this holds;
        // the reply, pieces and all (over 200 bytes a token), is written as it is sent.
        auto ids = std::make_shared<std::vector<int32_t>>();
        if (add_special && mc_.tok->special().bos >= 0) ids->push_back(mc_.tok->special().bos);
        mc_.tok->encode_append(content, parse_special, *ids);
        const text::Tokenizer* tok = mc_.tok;
        auto next = std::make_shared<size_t>(0);
        res.status = 200;
        res.set_chunked_content_provider(
            "application/json", [ids, next, tok, with_pieces](size_t, httplib::DataSink& sink) {
                std::string out = *next == 0 ? "{\"tokens\":[" : "";
                const size_t end = std::min(ids->size(), *next + 4096);
                for (size_t i = *next; i < end; ++i) {
                    if (i > 0) out += ',';
                    const int32_t id = (*ids)[i];
                    if (!with_pieces) {
                        out += std::to_string(id);
                        continue;
                    }
                    // A piece that is not whole UTF-8 comes as its bytes, as llama-server
                    // sends it.
                    const std::string& piece = tok->token_bytes(id);
                    ojson p = ojson::object();
                    p["id"] = id;
                    if (text::is_valid_utf8(piece)) {
                        p["piece"] = piece;
                    } else {
                        ojson bytes = ojson::array();
                        for (unsigned char c : piece) bytes.push_back(int(c));
                        p["piece"] = std::move(bytes);
                    }
                    out += dump(p);
                }
                *next = end;
                if (end == ids->size()) out += "]}";
                if (!sink.write(out.data(), out.size())) return false;
                if (end == ids->size()) sink.done();
                return true;
            });
    });
    auto detokenize = guarded([this, body_json, token_ids](const auto& req, auto& res) {
        const ojson b = body_json(req);
        const auto it = b.find("tokens");
        if (it == b.end())
            throw bad_request("'tokens' is required", "tokens", "missing_required_parameter");
        send_json(res, 200, {{"content", mc_.tok->decode(token_ids(*it, "tokens"))}});
    });
    auto apply_template = guarded([this, body_json](const auto& req, auto& res) {
        send_json(res, 200, {{"prompt", apply_chat_template(body_json(req), mc_)}});
    });
    auto props = [this](const httplib::Request&, httplib::Response& res) {
        const runtime::SamplerParams& sp = mc_.sampling;
        // A float as the decimal it was given as (0.8, not 0.800000011920929).
        auto dec = [](float f) {
            char buf[32];
            const auto r = std::to_chars(buf, buf + sizeof(buf), f);
            return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
        };
        ojson params = ojson::object();
        params["temperature"] = dec(sp.temperature);
        params["top_k"] = sp.top_k;
        params["top_p"] = dec(sp.top_p);
        params["min_p"] = dec(sp.min_p);
        params["repeat_penalty"] = dec(sp.repeat_penalty);
        params["repeat_last_n"] = sp.repeat_last_n;
        params["presence_penalty"] = dec(sp.presence_penalty);
        params["frequency_penalty"] = dec(sp.frequency_penalty);
        params["seed"] = mc_.seed_fixed ? int64_t(sp.seed) : int64_t(-1);
        params["n_predict"] = mc_.default_max_tokens > 0 ? mc_.default_max_tokens : int64_t(-1);
        params["reasoning_budget"] = mc_.reasoning_budget;
        ojson gen = ojson::object();
        gen["n_ctx"] = mc_.n_ctx;
        gen["params"] = std::move(params);
        ojson j = ojson::object();
        j["default_generation_settings"] = std::move(gen);
        j["total_slots"] = engine_.options().n_parallel;
        j["model_alias"] = mc_.id;
        j["model_path"] = mc_.path;
        j["chat_template"] = mc_.format->chat_template();
        j["modalities"] = {{"vision", mc_.vision != nullptr}, {"audio", false}};
        j["build_info"] = "glm5.cpp";
        send_json(res, 200, j);
    };
    for (const char* p : {"/tokenize", "/v1/tokenize"}) http_->Post(p, tokenize);
    for (const char* p : {"/detokenize", "/v1/detokenize"}) http_->Post(p, detokenize);
    for (const char* p : {"/apply-template", "/v1/apply-template"}) http_->Post(p, apply_template);
    for (const char* p : {"/props", "/v1/props"}) http_->Get(p, props);

    // llama-server's slot actions: the sequence a slot's last request left, to and from
    // a file in --slot-save-path.
    http_->Post(
        R"(/slots/(\d+))", guarded([this, body_json](const auto& req, auto& res) {
            if (opt_.slot_save_path.empty())
                throw ApiError(501, "slot actions need --slot-save-path", "", "not_supported");
            // The id as a number of this server's slots: digits that overflow an int name
            // no slot (atoi would have wrapped them onto one).
            const std::string id = req.matches[1].str();
            int slot = -1;
            const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), slot);
            if (ec != std::errc() || end != id.data() + id.size() || slot < 0 ||
                slot >= engine_.options().n_parallel)
                throw ApiError(400,
                               "slot " + id.substr(0, 24) + " does not exist (slots 0.." +
                                   std::to_string(engine_.options().n_parallel - 1) + ")",
                               "", "invalid_slot");
            const std::string action = req.get_param_value("action");
            ojson j = ojson::object();
            j["id_slot"] = slot;
            try {
                if (action == "erase") {
                    j["n_erased"] = engine_.erase_slot(slot);
                    send_json(res, 200, j);
                    return;
                }
                if (action != "save" && action != "restore")
                    throw bad_request(
                        "'action' must be save, restore or erase, got '" + action + "'", "action");
                const ojson b = body_json(req);
                const auto f = b.find("filename");
                if (f == b.end() || !f->is_string())
                    throw bad_request("'filename' must be a string", "filename", "invalid_type");
                const std::string name = f->get<std::string>();
                // A plain file name: nothing that leaves the folder or hides in it.
                bool ok = !name.empty() && name.size() <= 255 && name[0] != '.' &&
                          text::is_valid_utf8(name) && printable(name) == name;
                for (unsigned char c : name)
                    ok = ok && c >= 0x20 && c != '/' && c != '\\' && c != 0x7f;
                if (!ok)
                    throw bad_request(
                        "'filename' must be a plain file name (no '/', '\\', leading "
                        "'.', control or direction-changing characters), got '" +
                            printable(name) + "'",
                        "filename");
                const std::string path = opt_.slot_save_path + "/" + name;
                j["filename"] = name;
                if (action == "save") {
                    const runtime::Engine::SlotIo io = engine_.save_slot(
                        slot, opt_.slot_save_path, name, opt_.slot_fingerprint, opt_.slot_save_max);
                    j["n_saved"] = io.tokens;
                    j["n_written"] = io.bytes;
                    j["timings"] = {{"save_ms", io.seconds * 1e3}};
                } else {
                    const runtime::Engine::SlotIo io =
                        engine_.restore_slot(slot, path, opt_.slot_fingerprint);
                    j["n_restored"] = io.tokens;
                    j["n_read"] = io.bytes;
                    j["timings"] = {{"restore_ms", io.seconds * 1e3}};
                }
            } catch (const ApiError&) {
                throw;
            } catch (const Error& e) {
                throw bad_request(e.what(), "", "slot_action_failed");
            }
            send_json(res, 200, j);
        }));

    auto health = [this](const httplib::Request&, httplib::Response& res) {
        const auto [status, body] = this->health();
        res.status = status;
        res.set_content(body, "application/json");
    };
    http_->Get("/health", health);
    http_->Get("/v1/health", health);
    http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    // CORS preflight.
    http_->Options(R"(.*)", [](const httplib::Request&, httplib::Response& res) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers",
                       "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
        res.set_header("Access-Control-Max-Age", "86400");
    });

    if (opt_.webui) {
        // The page itself is public: what it asks of the API needs the key.
        auto page = [](const httplib::Request& req, httplib::Response& res) {
            const webui::Asset* a = webui::find(req.path);
            res.set_header("Content-Security-Policy", std::string(webui::kContentSecurityPolicy));
            res.set_header("X-Content-Type-Options", "nosniff");
            res.set_header("Cache-Control", "no-cache");
            res.set_content(a->bytes.data(), a->bytes.size(), std::string(a->content_type));
        };
        for (const char* p : {"/", "/index.html", "/webui.js", "/webui.css"}) http_->Get(p, page);
    }

    http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        // Where the request comes from, as sent (raw_header: httplib decodes %xx in header
        // values): a foreign Host on a loopback server, or a browser page of an origin not
        // allowed, is refused before anything else.
        const std::string host = raw_header("Host"), origin = raw_header("Origin");
        if (!host_allowed(host)) {
            send_error(req, res,
                       ApiError(403,
                                "Host '" + printable(host.substr(0, 128)) +
                                    "' is not this server's: it listens on loopback (a page "
                                    "elsewhere reaching it through a rebound DNS name is "
                                    "refused); --allowed-hosts adds names for proxies and tunnels",
                                "", "host_not_allowed"));
            return httplib::Server::HandlerResponse::Handled;
        }
        if (!origin.empty()) {
            if (!origin_allowed(origin, host)) {
                send_error(
                    req, res,
                    ApiError(403,
                             "requests from the page at '" + printable(origin.substr(0, 128)) +
                                 "' are not served (--cors-origins names the origins "
                                 "whose pages may use this server)",
                             "", "origin_not_allowed"));
                return httplib::Server::HandlerResponse::Handled;
            }
            res.set_header("Access-Control-Allow-Origin", origin);
            res.set_header("Vary", "Origin");
        }
        // Public: health probes, the page, CORS preflights. /metrics (how busy, what is
        // cached) and the model list (the page asks it to learn that a key is needed) need
        // the key.
        if (opt_.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" ||
            req.path == "/v1/health" ||
            (opt_.webui && req.method == "GET" && webui::find(req.path)))
            return httplib::Server::HandlerResponse::Unhandled;
        // Compare every byte so the time taken says nothing about the key.
        auto same = [](const std::string& want, const std::string& got) {
            unsigned char diff = got.size() == want.size() ? 0 : 1;
            for (size_t i = 0; i < want.size(); ++i)
                diff |= uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0);
            return diff == 0;
        };
        // OpenAI's clients send a bearer token, Anthropic's an x-api-key header: compared as
        // sent (raw_header: httplib would have decoded %xx in them).
        const bool bearer = same("Bearer " + opt_.api_key, raw_header("Authorization"));
        const bool x_key = same(opt_.api_key, raw_header("x-api-key"));
        if (bearer || x_key) return httplib::Server::HandlerResponse::Unhandled;
        send_error(req, res,
                   ApiError(401,
                            "invalid or missing API key (send 'Authorization: Bearer <key>' or "
                            "'x-api-key: <key>')",
                            "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
    });

    // Replies httplib makes on its own (no route, body too large, bad HTTP) in the same
    // JSON shape as ours; handlers' own error bodies are left alone.
    http_->set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
            std::string msg;
            std::string code;
            switch (res.status) {
                case 404:
                    msg = "no endpoint " + req.method + " " + req.path;
                    code = "not_found";
                    break;
                case 413:
                    msg = "the request body is larger than the limit of " +
                          std::to_string(opt_.max_body_bytes) + " bytes";
                    code = "body_too_large";
                    break;
                case 405:
                    msg = "method " + req.method + " is not allowed on " + req.path;
                    break;
                default:
                    msg = "the HTTP request could not be served (status " +
                          std::to_string(res.status) + ")";
            }
            send_error(req, res, ApiError(res.status, msg, "", code));
            return httplib::Server::HandlerResponse::Handled;
        }));
    http_->set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "unknown";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(req, res, ApiError(500, "internal error: " + what));
        });
    http_->set_logger([this](const httplib::Request&, const httplib::Response& res) {
        count_status(res.status);
    });
}

void Server::generate(const httplib::Request& req, httplib::Response& res,
                      std::string_view raw_body, bool large, Endpoint ep) {
    // Counted before the check: a drain that starts now sees this request (and
    // waits for it) or this request sees the drain.
    auto guard = std::make_shared<InFlight>(this);
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    GenRequest g;
    auto parse = [&] {
        const ojson body = parse_body(raw_body);
        g = ep == Endpoint::Chat ? parse_chat_request(body, mc_)
                                 : parse_completion_request(body, mc_);
    };
    if (large)
        parse_lane_->run(parse);
    else
        parse();
    body_parsed();
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

bool Server::stream_turn(httplib::DataSink& sink, Exchange& ex, bool finished,
                         const std::string& path, const std::string& summary) {
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
    struct Stream {
        GenRequest g;
        std::shared_ptr<Exchange> ex;
        std::unique_ptr<InFlight> guard;
        std::vector<ChoiceState> cs;
        std::vector<int> tool_index;
        std::vector<int64_t> text_offset;  // completions' logprobs
        int pending = 0;
        bool started = false;
        std::string id;
        int64_t created = 0;
        std::string path;
    };
    auto st = std::make_shared<Stream>();
    st->g = g;
    st->ex = std::move(ex);
    st->guard = std::make_unique<InFlight>(this);
    st->cs.resize(size_t(g.choices()));
    st->tool_index.assign(size_t(g.choices()), 0);
    st->text_offset.assign(size_t(g.choices()), 0);
    st->pending = g.choices();
    const bool chat = g.endpoint == Endpoint::Chat;
    st->id = random_id(chat ? "chatcmpl-" : "cmpl-");
    st->created = unix_now();
    st->path = req.path;

    auto chunk = [this, st, chat](int index, ojson delta_or_text, const ojson& finish,
                                  ojson logprobs = nullptr) {
        ojson j = ojson::object();
        j["id"] = st->id;
        j["object"] = chat ? "chat.completion.chunk" : "text_completion";
        j["created"] = st->created;
        j["model"] = mc_.id;
        ojson c = ojson::object();
        c["index"] = index;
        if (chat)
            c["delta"] = std::move(delta_or_text);
        else
            c["text"] = std::move(delta_or_text);
        c["logprobs"] = std::move(logprobs);
        c["finish_reason"] = finish;
        j["choices"] = ojson::array({std::move(c)});
        if (st->g.include_usage) j["usage"] = nullptr;
        return sse(j);
    };

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, chat, chunk](size_t, httplib::DataSink& sink) {
            std::string out;
            if (!st->started) {
                // The first chunk goes out at once: the client sees the reply start.
                st->started = true;
                for (int k = 0; k < st->g.choices(); ++k) {
                    if (chat)
                        out += chunk(k, {{"role", "assistant"}, {"content", ""}}, nullptr);
                    else if (st->g.echo)
                        out += chunk(k, st->g.prompts[size_t(k / st->g.n)].text, nullptr);
                }
            }
            std::vector<Event> evs;
            st->ex->channel->take(evs, out.empty() ? kPoll : milliseconds(0));
            for (auto& e : evs) {
                ChoiceState& c = st->cs[size_t(e.index)];
                const Delta& d = e.delta;
                // The tokens' logprobs go with the event's first chunk, or one of their own.
                ojson lp = nullptr;
                if (!e.logprobs.empty())
                    lp = chat ? chat_logprobs(*mc_.tok, e.logprobs)
                              : completion_logprobs(*mc_.tok, e.logprobs,
                                                    st->text_offset[size_t(e.index)]);
                if (chat) {
                    if (!d.reasoning.empty())
                        out += chunk(e.index, {{"reasoning_content", d.reasoning}}, nullptr,
                                     std::exchange(lp, nullptr));
                    if (!d.content.empty())
                        out += chunk(e.index, {{"content", d.content}}, nullptr,
                                     std::exchange(lp, nullptr));
                    if (!d.tool_calls.empty()) {
                        ojson calls = ojson::array();
                        for (const auto& call : d.tool_calls) {
                            ojson tc = text::tool_call_to_openai(call);
                            ojson indexed = ojson::object();
                            indexed["index"] = st->tool_index[size_t(e.index)]++;
                            for (auto& [k, v] : tc.items()) indexed[k] = v;
                            calls.push_back(std::move(indexed));
                        }
                        out += chunk(e.index, {{"tool_calls", calls}}, nullptr,
                                     std::exchange(lp, nullptr));
                    }
                } else if (!d.content.empty()) {
                    out += chunk(e.index, d.content, nullptr, std::exchange(lp, nullptr));
                }
                if (!lp.is_null())
                    out +=
                        chunk(e.index, chat ? ojson::object() : ojson(""), nullptr, std::move(lp));
                c.apply(e);
                if (!e.done) continue;
                c.finish(e);
                --st->pending;
                if (auto err = failure(c.result))
                    out += sse(err->body());
                else
                    out += chunk(e.index, chat ? ojson::object() : ojson(""), finish_reason(c));
            }
            if (st->pending == 0) {
                if (st->g.include_usage) {
                    ojson j = ojson::object();
                    j["id"] = st->id;
                    j["object"] = chat ? "chat.completion.chunk" : "text_completion";
                    j["created"] = st->created;
                    j["model"] = mc_.id;
                    j["choices"] = ojson::array();
                    j["usage"] = usage_json(st->g, st->cs);
                    out += sse(j);
                }
                out += "data: [DONE]\n\n";
            }
            if (!out.empty() && !sink.write(out.data(), out.size())) {
                st->ex->cancel();
                return false;
            }
            std::string summary;
            if (st->pending == 0) {
                const ojson u = usage_json(st->g, st->cs);
                summary = generation_summary(
                    u["prompt_tokens"].get<int64_t>(),
                    u["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
                    u["completion_tokens"].get<int64_t>(), st->cs[0].result.finish_reason);
            }
            return stream_turn(sink, *st->ex, st->pending == 0, st->path, summary);
        },
        [st](bool) {
            // However the stream ended: nothing keeps generating for it.
            st->ex->cancel();
            st->guard.reset();
        });
}

}  // namespace glm5::server

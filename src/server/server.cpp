#include "server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "server/anthropic.h"
#include "server/exchange.h"
#include "server/http_transport.h"
#include "server/large_body.h"
#include "server/webui.h"

namespace glm5::server {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// In the shape of the API the request's path belongs to.
void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
    if (e.retry_after() > 0) res.set_header("Retry-After", std::to_string(e.retry_after()));
    send_json(res, e.status(),
              anthropic::is_messages_path(req.path) ? anthropic::error_body(e) : e.body());
}

// Runs a handler's `work`; what it throws becomes the error reply.
void guarded(const httplib::Request& req, httplib::Response& res,
             const std::function<void()>& work) {
    try {
        work();
    } catch (const ApiError& e) {
        send_error(req, res, e);
    } catch (const std::exception& e) {
        send_error(req, res, ApiError(500, std::string("internal error: ") + e.what()));
    }
}

// A generation body: a string, or a large one's mapping.
struct Body {
    std::string small;
    std::unique_ptr<BodyBuffer> large;
    std::string_view view() const { return large ? large->view() : std::string_view(small); }
};

// Generation endpoints read their bodies themselves: into a string of the stated
// size (httplib's own reading grows one by doubling), or a large body into a
// mapping of its own (large_body.h).
Body read_body(const httplib::Request& req, const httplib::ContentReader& reader) {
    const size_t stated = req.has_header("Content-Length")
                              ? size_t(std::stoull(req.get_header_value("Content-Length")))
                              : kLargeBody + 1;  // unknown: as a large one
    Body b;
    if (stated > kLargeBody)
        b.large = std::make_unique<BodyBuffer>(stated);
    else
        b.small.reserve(stated);
    // A body cut off by the read timeout or the body limit is answered by the
    // transport (408, 413), whatever is sent from here.
    if (!reader([&](const char* data, size_t n) {
            if (b.large)
                b.large->append(data, n);
            else
                b.small.append(data, n);
            return true;
        }))
        throw ApiError(400, "the request body could not be read", "", "bad_body");
    return b;
}

// What a handler threw past guarded() (or httplib itself), as an error reply.
void exception_reply(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
        if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
        what = e.what();
    } catch (...) {
    }
    send_error(req, res, ApiError(500, "internal error: " + what));
}

// A Host header's name, without its port (bracketed IPv6 kept in its brackets).
std::string host_name(const std::string& host) {
    if (!host.empty() && host[0] == '[') return host.substr(0, host.find(']') + 1);
    return host.substr(0, host.rfind(':') == std::string::npos ? host.size() : host.rfind(':'));
}

bool loopback_name(const std::string& h) {
    return h == "localhost" || h == "127.0.0.1" || h == "[::1]" || h == "::1" ||
           h.rfind("127.", 0) == 0;
}

// Compare every byte so the time taken says nothing about the key.
bool same(const std::string& want, const std::string& got) {
    unsigned char diff = got.size() == want.size() ? 0 : 1;
    for (size_t i = 0; i < want.size(); ++i)
        diff |= uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0);
    return diff == 0;
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
    // Paths come with and without /v1 where clients use both; a BodyHandler is a
    // generation endpoint.
    using enum Method;
    std::vector<Route> table = {
        // routes_anthropic.cpp
        {Post, "/v1/messages", &Server::messages_create},
        {Post, "/v1/messages/count_tokens", &Server::messages_count_tokens},
        // routes_openai.cpp
        {Post, "/v1/chat/completions", &Server::chat_completions},
        {Post, "/chat/completions", &Server::chat_completions},
        {Post, "/v1/completions", &Server::completions},
        {Post, "/completions", &Server::completions},
        {Get, "/v1/models", &Server::list_models},
        {Get, "/models", &Server::list_models},
        {Get, R"(/v1/models/(.+))", &Server::get_model},
        // routes_llama.cpp
        {Post, "/tokenize", &Server::tokenize},
        {Post, "/v1/tokenize", &Server::tokenize},
        {Post, "/detokenize", &Server::detokenize},
        {Post, "/v1/detokenize", &Server::detokenize},
        {Post, "/apply-template", &Server::apply_template},
        {Post, "/v1/apply-template", &Server::apply_template},
        {Get, "/props", &Server::props},
        {Get, "/v1/props", &Server::props},
        // routes_slots.cpp
        {Post, R"(/slots/(\d+))", &Server::slot_action},
        // server.cpp
        {Get, "/health", &Server::get_health},
        {Get, "/v1/health", &Server::get_health},
        {Get, "/metrics", &Server::get_metrics},
        {Options, R"(.*)", &Server::preflight},
    };
    if (opt_.webui)  // webui.cpp
        for (const char* p : {"/", "/index.html", "/webui.js", "/webui.css"})
            table.push_back({Get, p, &Server::page});
    for (const Route& r : table) add_route(r);

    http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        return refuse(req, res) ? httplib::Server::HandlerResponse::Handled
                                : httplib::Server::HandlerResponse::Unhandled;
    });
    http_->set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) {
            return error_reply(req, res) ? httplib::Server::HandlerResponse::Handled
                                         : httplib::Server::HandlerResponse::Unhandled;
        }));
    http_->set_exception_handler(exception_reply);
    http_->set_logger([this](const httplib::Request&, const httplib::Response& res) {
        count_status(res.status);
    });
}

void Server::add_route(const Route& r) {
    if (const BodyHandler* body = std::get_if<BodyHandler>(&r.handler)) {
        http_->Post(r.pattern,
                    [this, h = *body](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
                        guarded(req, res, [&] {
                            const Body b = read_body(req, reader);
                            (this->*h)(req, res, b.view(), b.large != nullptr);
                        });
                    });
        return;
    }
    auto handler = [this, h = std::get<Handler>(r.handler)](const httplib::Request& req,
                                                            httplib::Response& res) {
        guarded(req, res, [&] { (this->*h)(req, res); });
    };
    switch (r.method) {
        case Method::Get:
            http_->Get(r.pattern, handler);
            break;
        case Method::Post:
            http_->Post(r.pattern, handler);
            break;
        case Method::Options:
            http_->Options(r.pattern, handler);
            break;
    }
}

bool Server::refuse(const httplib::Request& req, httplib::Response& res) const {
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
        return true;
    }
    if (!origin.empty()) {
        if (!origin_allowed(origin, host)) {
            send_error(req, res,
                       ApiError(403,
                                "requests from the page at '" + printable(origin.substr(0, 128)) +
                                    "' are not served (--cors-origins names the origins "
                                    "whose pages may use this server)",
                                "", "origin_not_allowed"));
            return true;
        }
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
    }
    // Public: health probes, the page, CORS preflights. /metrics (how busy, what is
    // cached) and the model list (the page asks it to learn that a key is needed) need
    // the key.
    if (opt_.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" ||
        req.path == "/v1/health" || (opt_.webui && req.method == "GET" && webui::find(req.path)))
        return false;
    // OpenAI's clients send a bearer token, Anthropic's an x-api-key header: compared as
    // sent (raw_header: httplib would have decoded %xx in them).
    const bool bearer = same("Bearer " + opt_.api_key, raw_header("Authorization"));
    const bool x_key = same(opt_.api_key, raw_header("x-api-key"));
    if (bearer || x_key) return false;
    send_error(req, res,
               ApiError(401,
                        "invalid or missing API key (send 'Authorization: Bearer <key>' or "
                        "'x-api-key: <key>')",
                        "", "invalid_api_key"));
    return true;
}

bool Server::error_reply(const httplib::Request& req, httplib::Response& res) const {
    // Replies httplib makes on its own (no route, body too large, bad HTTP) in the same
    // JSON shape as ours; handlers' own error bodies are left alone.
    if (!res.body.empty()) return false;
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
            msg =
                "the HTTP request could not be served (status " + std::to_string(res.status) + ")";
    }
    send_error(req, res, ApiError(res.status, msg, "", code));
    return true;
}

void Server::get_health(const httplib::Request&, httplib::Response& res) {
    const auto [status, body] = health();
    res.status = status;
    res.set_content(body, "application/json");
}

void Server::get_metrics(const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
}

void Server::preflight(const httplib::Request&, httplib::Response& res) {
    // CORS preflight.
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers",
                   "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
    res.set_header("Access-Control-Max-Age", "86400");
}

}  // namespace glm5::server

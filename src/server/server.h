// The OpenAI-compatible HTTP server over a runtime::Engine, with Anthropic's Messages
// API beside it. Routes, by the file that serves them:
//
//   routes_openai.cpp     POST /v1/chat/completions, /v1/completions (also without /v1);
//                         GET /v1/models, /v1/models/{id}
//   routes_anthropic.cpp  POST /v1/messages, /v1/messages/count_tokens (anthropic.h)
//   routes_llama.cpp      POST /tokenize, /detokenize, /apply-template; GET /props
//                         (llama-server's shapes)
//   routes_slots.cpp      POST /slots/{id}?action=save|restore|erase (--slot-save-path:
//                         the prompt cache on disk)
//   webui.cpp             GET /, /webui.js, /webui.css: the chat page, unless --no-webui
//   server.cpp            GET /health, /metrics (Prometheus text); the routes table, who
//                         is served (Host, Origin, API key) and the error replies
//
// Each choice of a request is one engine request (one slot; beyond --parallel they
// queue in the engine). Tokens come back on the engine thread, are turned into text
// deltas there (reply_stream.h) and handed to the HTTP thread through a channel; the
// HTTP thread writes SSE chunks or, for a plain request, waits and writes one JSON
// reply. While it waits it watches the client's socket: a client that goes away has
// its requests cancelled at once, streaming or not. Connections are capped and timed
// (http_transport.h); beyond --max-queue waiting requests, a request gets 429.
//
// Shutdown: begin_drain() refuses new generation requests (503) and lets the ones in
// flight finish; cancel_all() cancels them (streams end with an error event, plain
// requests get 503); stop() closes the listener once nothing is in flight.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "runtime/engine.h"
#include "server/openai_request.h"

namespace httplib {
class Server;
struct Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace glm5::server {

class Transport;
class ParseLane;
struct ChoiceState;
struct InFlight;
class StreamShape;

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;      // 0: any free port (see port())
    std::string api_key;  // non-empty: /v1/* needs "Authorization: Bearer <key>"
    size_t max_body_bytes = size_t(32) << 20;
    int http_threads = 0;       // workers; 0: one per open connection (max_connections + a few)
    int max_connections = 256;  // beyond: 503 and closed at once
    std::chrono::milliseconds read_timeout{30000};   // a whole request must arrive within it
    std::chrono::milliseconds write_timeout{30000};  // a write stalled this long drops the client
    // An idle connection (no request in progress) is closed after this.
    std::chrono::milliseconds keep_alive{3000};
    bool log_requests = true;
    bool webui = true;  // the chat page at / (webui.h)
    // --slot-save-path: the folder of /slots/{id}?action=save|restore files (empty: the
    // actions are refused); slot_fingerprint names the model and cache type in them.
    std::string slot_save_path;
    std::string slot_fingerprint;
    uint64_t slot_save_max = 0;  // --slot-save-max: the folder's files together (0: no limit)
    // --cors-origins: the browser origins whose requests are served ("*": any). Empty: the
    // server's own page only, or any origin when an API key guards the API. A request with
    // no Origin (curl, the SDKs) is never refused for it.
    std::vector<std::string> cors_origins;
    // --allowed-hosts: Host names served besides the loopback names when bound to loopback
    // (a page on another site reaching this server through a rebound DNS name is refused);
    // "*": any. Bound elsewhere, any Host is served.
    std::vector<std::string> allowed_hosts;
};

class Server {
  public:
    Server(runtime::Engine& engine, ModelContext mc, ServerOptions opt);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds the listening socket (throws glm5::Error when it cannot) and starts serving
    // on a thread of its own.
    void start();
    int port() const { return port_; }
    bool running() const;

    void begin_drain();
    bool draining() const { return draining_; }
    // Generation requests being served (streams until their last byte).
    int in_flight() const { return in_flight_; }
    // Waits until nothing is in flight; false on timeout.
    bool wait_idle(std::chrono::milliseconds timeout);
    // Stops the listener and joins its thread.
    void stop();

    // Prometheus text for /metrics.
    std::string metrics_text();

    struct Exchange;  // one HTTP request's engine requests and their channel

  private:
    // A route's handler; a generation endpoint's also gets its body, read by the route
    // table (`large`: over kLargeBody, parsed on parse_lane_; large_body.h).
    using Handler = void (Server::*)(const httplib::Request&, httplib::Response&);
    using BodyHandler = void (Server::*)(const httplib::Request&, httplib::Response&,
                                         std::string_view body, bool large);
    // A row of the routes table: its method, its path pattern and its handler.
    enum class Method { Get, Post, Options };
    struct Route {
        Method method;
        const char* pattern;
        std::variant<Handler, BodyHandler> handler;
    };

    // server.cpp: the routes table, admission, errors, health and metrics.
    void routes();
    // Registers a route: whatever its handler throws becomes its error reply, and a
    // BodyHandler reads its own body.
    void add_route(const Route& r);
    // /health's status and body (also answered beyond the connection cap).
    std::pair<int, std::string> health() const;
    // Whether a request's Host (as sent) may be served, and its Origin (a browser page's).
    bool host_allowed(const std::string& host) const;
    bool origin_allowed(const std::string& origin, const std::string& host) const;
    // Before routing: answers a request that is not to be served (its Host, its Origin,
    // its API key) and returns true; sets the CORS headers of one that is.
    bool refuse(const httplib::Request& req, httplib::Response& res) const;
    // httplib's own replies (no route, body too large, bad HTTP) in our error shape;
    // false: the reply already has a body.
    bool error_reply(const httplib::Request& req, httplib::Response& res) const;
    void get_health(const httplib::Request& req, httplib::Response& res);
    void get_metrics(const httplib::Request& req, httplib::Response& res);
    void preflight(const httplib::Request& req, httplib::Response& res);

    // routes_openai.cpp: OpenAI's API, and the generation path every API shares.
    void chat_completions(const httplib::Request& req, httplib::Response& res,
                          std::string_view body, bool large);
    void completions(const httplib::Request& req, httplib::Response& res, std::string_view body,
                     bool large);
    void list_models(const httplib::Request& req, httplib::Response& res);
    void get_model(const httplib::Request& req, httplib::Response& res);
    nlohmann::ordered_json model_json() const;
    void generate(const httplib::Request& req, httplib::Response& res, std::string_view body,
                  bool large, Endpoint ep);
    // A generation request's start, whatever its API: counted in flight (503 while
    // draining) for as long as the result lives, and its body parsed by `parse` (on
    // parse_lane_ when it is large).
    std::shared_ptr<InFlight> start_generation(
        std::string_view body, bool large,
        const std::function<void(const nlohmann::ordered_json&)>& parse);
    // The request's choices, submitted to the engine as one group (429, 400, 503 as
    // ApiError).
    std::shared_ptr<Exchange> submit(const GenRequest& g, Endpoint ep);
    // Waits for every choice of a plain reply, watching the client's socket; false
    // when the client went away (its requests are cancelled).
    bool wait_reply(const httplib::Request& req, httplib::Response& res, Exchange& ex,
                    std::span<ChoiceState> cs);
    void respond_plain(const httplib::Request& req, httplib::Response& res, const GenRequest& g,
                       std::shared_ptr<Exchange> ex);
    void respond_stream(const httplib::Request& req, httplib::Response& res, const GenRequest& g,
                        std::shared_ptr<Exchange> ex);
    // Sends a reply as server-sent events in `shape`, as the engine produces it.
    void stream(const httplib::Request& req, httplib::Response& res, std::shared_ptr<Exchange> ex,
                std::shared_ptr<StreamShape> shape);
    // The end of one turn of a stream's content provider: writes the turn's bytes `out`;
    // a finished reply is logged (`summary`) and ends the stream; otherwise the client
    // must still be there. A client gone has its requests cancelled. Returns the
    // provider's result.
    bool stream_turn(httplib::DataSink& sink, Exchange& ex, const std::string& out, bool finished,
                     const std::string& path, const std::string& summary);

    // routes_anthropic.cpp: Anthropic's Messages API; count_only: count_tokens.
    void messages_create(const httplib::Request& req, httplib::Response& res, std::string_view body,
                         bool large);
    void messages_count_tokens(const httplib::Request& req, httplib::Response& res,
                               std::string_view body, bool large);
    void messages(const httplib::Request& req, httplib::Response& res, std::string_view body,
                  bool large, bool count_only);
    void messages_plain(const httplib::Request& req, httplib::Response& res, const GenRequest& g,
                        std::shared_ptr<Exchange> ex, const std::string& model);
    void messages_stream(const httplib::Request& req, httplib::Response& res, const GenRequest& g,
                         std::shared_ptr<Exchange> ex, const std::string& model);

    // routes_llama.cpp: llama-server's utility endpoints.
    void tokenize(const httplib::Request& req, httplib::Response& res);
    void detokenize(const httplib::Request& req, httplib::Response& res);
    void apply_template(const httplib::Request& req, httplib::Response& res);
    void props(const httplib::Request& req, httplib::Response& res);

    // routes_slots.cpp: llama-server's slot actions.
    void slot_action(const httplib::Request& req, httplib::Response& res);

    // webui.cpp: the chat page's files.
    void page(const httplib::Request& req, httplib::Response& res);

    void count_status(int status);
    void sample_rates();

    runtime::Engine& engine_;
    ModelContext mc_;
    ServerOptions opt_;
    std::unique_ptr<Transport> http_;
    std::unique_ptr<ParseLane> parse_lane_;
    std::thread listener_;
    std::thread monitor_;
    int port_ = 0;
    int64_t created_ = 0;
    std::string fingerprint_;

    std::atomic<bool> draining_{false};
    std::atomic<int> in_flight_{0};
    std::mutex idle_mu_;
    std::condition_variable idle_cv_;

    std::mutex stats_mu_;
    std::condition_variable monitor_cv_;
    bool stop_monitor_ = false;
    std::map<int, uint64_t> http_status_;
    struct RateSample {
        std::chrono::steady_clock::time_point t;
        uint64_t generated = 0, prompt = 0;
    };
    std::vector<RateSample> samples_;  // the last ~10 s, one a second

    friend struct InFlight;
    void enter();
    void leave();
};

}  // namespace glm5::server

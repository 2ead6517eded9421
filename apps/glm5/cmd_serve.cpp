// glm5 serve: an OpenAI-compatible HTTP server (src/server) over the serving engine.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "args.h"
#include "chat_runner.h"
#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "default_model.h"
#include "model_setup.h"
#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "runtime/slot_file.h"
#include "server/server.h"
#include "server/tool_constraint.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "vision_setup.h"

namespace glm5::app {

namespace {

// SIGINT / SIGTERM: counted, and a byte on a pipe wakes the main thread. Only
// async-signal-safe calls here.
std::atomic<int> g_signals{0};
int g_signal_pipe[2] = {-1, -1};

void on_signal(int) {
    g_signals.fetch_add(1);
    const char c = 1;
    ssize_t r = write(g_signal_pipe[1], &c, 1);
    (void)r;
}

void install_signal_handlers() {
    if (pipe(g_signal_pipe) != 0) throw Error("cannot create the signal pipe");
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that went away must not end the server
}

// Waits up to `ms` for a signal; true when one arrived.
bool wait_signal(int ms) {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (poll(&p, 1, ms) > 0) {
        char buf[16];
        ssize_t r = read(g_signal_pipe[0], buf, sizeof(buf));
        (void)r;
    }
    return g_signals.load() > 0;
}

std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

void declare_flags(Args& a) {
    add_model_flags(a, false);
    a.option("host", "ADDR", "127.0.0.1", "address to listen on");
    a.option("port", "N", "8080", "port to listen on (0: any free port, printed at start)");
    a.option("parallel", "N", "4", "requests decoded at once (slots); more queue", "-np");
    add_context_flags(a, "per slot");
    a.flag("prefix-cache", "keep finished sequences and reuse shared prompt prefixes", true);
    a.option("cache-budget", "SIZE", "2G",
             "memory for retained sequences (prefix cache), e.g. 512M");
    a.option("api-key", "KEY", "",
             "require 'Authorization: Bearer KEY' on /v1/* (also $GLM5_API_KEY)");
    a.option("cors-origins", "LIST", "",
             "comma-separated origins (https://app.example) whose browser pages may use the "
             "server, or *; a request with another Origin header is refused (403). Default: "
             "the server's own page, or any origin when --api-key guards the API");
    a.option("allowed-hosts", "LIST", "",
             "bound to loopback, the Host names served besides localhost and 127.0.0.1 "
             "(a reverse proxy's or tunnel's name), or *; another Host is refused (403)");
    a.option("max-body", "SIZE", "32M", "largest request body accepted");
    a.option("alias", "NAME", "",
             "model id to report and accept, instead of the GGUF's general.name");
    a.option("max-tokens", "N", "0",
             "default max_tokens of a request (0: up to the context's end)");
    a.option("max-choices", "N", "16", "most choices one request may ask for (n x prompts)");
    a.option("max-images", "N", "16",
             "most images one request may hold (each is sized from its header and counted "
             "against the context before any is decoded)");
    a.option("http-threads", "N", "0",
             "most HTTP worker threads (0: one per open connection, up to --max-connections)");
    a.option("max-queue", "N", "64",
             "requests that may wait for a slot; beyond, 429 with Retry-After (0: no limit)");
    a.option("max-connections", "N", "256",
             "open HTTP connections; beyond, 503 with Retry-After at once");
    a.option("read-timeout", "SECONDS", "30", "time a request (head and body) has to arrive");
    a.option("write-timeout", "SECONDS", "30",
             "time a reply may wait on a client that reads nothing before it is dropped");
    a.option("keep-alive", "SECONDS", "3",
             "an idle connection (between requests, or before the first) is closed after this");
    a.option("drain-timeout", "SECONDS", "30",
             "on SIGINT / SIGTERM, how long requests in flight may take to finish");
    // The defaults of requests that do not say (as run's and llama-server's).
    add_sampling_flags(a, "default seed (-1: a random one per request)");
    a.flag("log-requests", "one line on stderr per request", true);
    a.flag("webui", "the chat page at /", true);
    a.option("slot-save-path", "DIR", "",
             "a folder of your own (others may not write to it) for "
             "/slots/{id}?action=save|restore (the prompt cache on disk; files of mode 0600)");
    a.option("slot-save-max", "SIZE", "0",
             "with --slot-save-path: the most bytes its files may hold together; a save that "
             "would go over is refused (0: no limit; a save takes about the slot's cache)");
    add_vision_flags(a, false);
}

server::ServerOptions server_options(const Args& a) {
    server::ServerOptions so;
    so.host = a.get("host");
    so.port = int(a.get_int("port", 0, 65535));
    so.api_key = a.get("api-key");
    if (so.api_key.empty())
        if (const char* k = std::getenv("GLM5_API_KEY")) so.api_key = k;
    auto list = [](const std::string& v) {
        std::vector<std::string> out;
        for (size_t at = 0; at <= v.size();) {
            const size_t comma = std::min(v.find(',', at), v.size());
            std::string item = v.substr(at, comma - at);
            while (!item.empty() && item.back() == '/') item.pop_back();  // origins have none
            if (!item.empty()) out.push_back(item);
            at = comma + 1;
        }
        return out;
    };
    so.cors_origins = list(a.get("cors-origins"));
    so.allowed_hosts = list(a.get("allowed-hosts"));
    so.max_body_bytes = parse_size(a.get("max-body"), "max-body");
    if (so.max_body_bytes < 1024) throw UsageError("--max-body must be at least 1K");
    so.http_threads = int(a.get_int("http-threads", 0, 4096));
    so.max_connections = int(a.get_int("max-connections", 1, 65536));
    so.read_timeout =
        std::chrono::milliseconds(int64_t(a.get_double("read-timeout", 0.01, 86400) * 1000));
    so.write_timeout =
        std::chrono::milliseconds(int64_t(a.get_double("write-timeout", 0.01, 86400) * 1000));
    so.keep_alive =
        std::chrono::milliseconds(int64_t(a.get_double("keep-alive", 0.01, 86400) * 1000));
    so.log_requests = a.get_flag("log-requests");
    so.webui = a.get_flag("webui");
    so.slot_save_path = a.get("slot-save-path");
    if (!so.slot_save_path.empty()) {
        const std::string why = runtime::slot_folder_problem(so.slot_save_path);
        if (!why.empty()) throw UsageError("--slot-save-path: " + why);
    }
    so.slot_save_max = parse_size(a.get("slot-save-max"), "slot-save-max");
    return so;
}

runtime::EngineOptions engine_options(const Args& a) {
    runtime::EngineOptions eo;
    eo.n_parallel = int(a.get_int("parallel", 1, 1024));
    requested_context_check(a);
    eo.ubatch = a.get_int("ubatch", 1, 1 << 16);
    eo.prefix_cache = a.get_flag("prefix-cache");
    eo.cache_budget_bytes = parse_size(a.get("cache-budget"), "cache-budget");
    eo.max_queue = int(a.get_int("max-queue", 0, 1 << 20));
    return eo;
}

// What the HTTP layer knows of the model: its names, tokenizer and chat format, the
// request defaults and limits.
server::ModelContext model_context(const Args& a, const LoadedModel& m, const LoadedVision& vision,
                                   const text::Tokenizer& tok, const text::ChatFormat& format,
                                   const std::string& path, const runtime::SamplerParams& sp,
                                   int64_t seed) {
    server::ModelContext mc;
    mc.tok = &tok;
    mc.format = &format;
    mc.id = a.get("alias").empty() ? m.model->info().name : a.get("alias");
    mc.path = path;
    mc.names = {mc.id, m.model->info().name, base_name(path)};
    if (base_name(path).size() > 5 && base_name(path).ends_with(".gguf"))
        mc.names.push_back(base_name(path).substr(0, base_name(path).size() - 5));
    try {
        mc.json_vocab = std::make_shared<const runtime::JsonVocab>(tok);
    } catch (const Error& e) {
        log_info("glm5 serve: response_format is unavailable: %s\n", e.what());
    }
    mc.tool_vocab = std::make_shared<const server::ToolVocab>(tok);
    mc.sampling = sp;
    mc.seed_fixed = seed >= 0;
    mc.spec = m.spec;
    mc.can_mtp = m.model->can_draft();
    if (seed >= 0) mc.sampling.seed = uint64_t(seed);
    mc.default_max_tokens = a.get_int("max-tokens", 0, INT64_MAX / 4);
    mc.max_choices = int(a.get_int("max-choices", 1, 1024));
    mc.max_images = int(a.get_int("max-images", 0, 4096));
    mc.reasoning_budget = a.get_int("reasoning-budget", -1, INT64_MAX / 4);
    if (vision.tower) mc.vision = &vision.tower->hparams();
    return mc;
}

// Serves until a signal (or the listener's failure: false), then drains: the requests in
// flight may finish within `drain` seconds, a second signal cancels them.
bool serve_until_signalled(server::Server& srv, runtime::Engine& engine, double drain) {
    while (!wait_signal(1000))
        if (!srv.running()) {
            // The listener ended by itself (its socket failed).
            log_info("glm5 serve: the listener stopped unexpectedly\n");
            engine.shutdown(false);
            srv.stop();
            return false;
        }

    srv.begin_drain();
    log_info(
        "glm5 serve: shutting down: %d request(s) in flight, waiting up to %g s (signal again "
        "to cancel them)\n",
        srv.in_flight(), drain);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(drain);
    while (srv.in_flight() > 0 && g_signals.load() < 2 &&
           std::chrono::steady_clock::now() < deadline)
        srv.wait_idle(std::chrono::milliseconds(100));
    if (srv.in_flight() > 0) {
        log_info("glm5 serve: cancelling %d request(s)\n", srv.in_flight());
        engine.shutdown(false);
        srv.wait_idle(std::chrono::seconds(10));
    }
    srv.stop();
    engine.shutdown(true);
    return true;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
    Args a("serve",
           "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions "
           "(streaming or not), GET /v1/models, /health and /metrics. Requests beyond --parallel "
           "queue; SIGINT / SIGTERM finish the requests in flight (a second one cancels them) and "
           "exit with code 0.");
    declare_flags(a);
    if (!a.parse(argc, argv, 2)) return 0;
    server::ServerOptions so = server_options(a);
    runtime::EngineOptions eo = engine_options(a);
    const double drain = a.get_double("drain-timeout", 0, 86400);
    const runtime::SamplerParams sp = sampling_from_args(a, true);
    const int64_t seed = a.get_int("seed", -1, INT64_MAX);
    const std::string path = a.is_set("model") ? a.get("model") : ensure_default_model();
    LoadedModel m = open_model(a, path);
    LoadedVision vision = open_vision(a, m);  // --mmproj: image_url content parts
    eo.vision = vision.tower.get();
    eo.image_token = vision.image_token;
    std::unique_ptr<text::Tokenizer> tok = text::Tokenizer::from_gguf(*m.file);
    text::ChatFormat format = text::ChatFormat::from_gguf(*m.file);
    if (!format.template_warning().empty())
        log_info("glm5: %s\n", format.template_warning().c_str());
    server::ModelContext mc = model_context(a, m, vision, *tok, format, path, sp, seed);
    eo.checkpoint_tokens = text::message_start_ids(*tok);
    if (!so.slot_save_path.empty())
        so.slot_fingerprint = model_fingerprint(*m.file, a.get("cache-type"));

    eo.spec = m.spec;
    ContextRequest cr;
    cr.n_slots = eo.n_parallel;
    cr.ubatch = eo.ubatch;
    cr.draft_max = m.spec.type != runtime::DraftType::Off ? m.spec.draft_max : 0;
    cr.retained = eo.prefix_cache ? eo.cache_budget_bytes : 0;
    cr.can_change_slots = true;
    plan_vision(vision, cr);
    const ContextChoice ctx = plan_context(a, *m.model, cr);
    eo.n_ctx = ctx.n_ctx;
    eo.cache_pool_bytes = ctx.cache_pool;
    mc.n_ctx = eo.n_ctx;
    runtime::Engine engine(*m.model, eo);
    server::Server srv(engine, mc, so);
    install_signal_handlers();
    srv.start();
    log_info(
        "glm5 serve: listening on http://%s:%d (model '%s', %d slots, context %lld, prefix cache "
        "%s)\n",
        so.host.c_str(), srv.port(), mc.id.c_str(), eo.n_parallel, (long long)eo.n_ctx,
        eo.prefix_cache ? "on" : "off");

    if (!serve_until_signalled(srv, engine, drain)) return 1;
    log_info("glm5 serve: stopped\n");
    return 0;
}

}  // namespace glm5::app

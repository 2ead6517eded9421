// glm5 run: one chat turn (--prompt / --input), a raw completion (--raw), a
// scripted multi-turn conversation (--jsonl), or raw token ids (--tokens).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "args.h"
#include "chat_runner.h"
#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "default_model.h"
#include "model_setup.h"
#include "run_images.h"
#include "vision_setup.h"

namespace glm5::app {

namespace {

void write_out(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

nlohmann::ordered_json calls_json(const std::vector<text::ToolCall>& calls) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& c : calls) a.push_back({{"name", c.name}, {"arguments", c.arguments}});
    return a;
}

// Token ids in, token ids out: the interface the parity tests and tools use.
int run_tokens(const Args& a, LoadedModel& m) {
    const std::vector<int32_t> prompt = parse_token_list(a.get("tokens"), "tokens");
    const int64_t ubatch = a.get_int("ubatch", 1, 1 << 16);
    const ContextChoice ctx = plan_context(a, *m.model, cli_context_request(ubatch, m.spec));
    runtime::Engine engine(*m.model, cli_engine_options(ctx, ubatch, m.spec));
    runtime::RequestParams rp;
    rp.prompt = prompt;
    rp.sampling = sampling_from_args(a);
    rp.max_tokens = a.get_int("n-predict", 0, 1 << 24);
    rp.prefill_only = rp.max_tokens == 0;
    if (!a.get_flag("ignore-eos"))
        for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                              "tokenizer.ggml.eom_token_id"})
            if (const gguf::Value* v = m.file->find(k))
                if (auto u = v->as_uint()) rp.stop_ids.insert(int32_t(*u));
    const runtime::RequestResult g = run_request(engine, std::move(rp));
    if (a.get_flag("print-ids")) {
        std::string out;
        for (size_t i = 0; i < g.tokens.size(); ++i)
            out += (i ? " " : "") + std::to_string(g.tokens[i]);
        write_out(out + "\n");
    } else {
        auto tok = text::Tokenizer::from_gguf(*m.file);
        write_out(tok->decode(g.tokens) + "\n");
    }
    log_info("glm5: %s\n", timing_summary(g).c_str());
    if (m.spec.type != runtime::DraftType::Off)
        log_info("glm5: %s\n", spec_summary(g, m.spec.type).c_str());
    return 0;
}

// Each input line {"user": "...", "think": false} is one user turn; each
// output line {"user", "reasoning", "content", "tool_calls"} one reply.
int run_jsonl(const Args& a, ChatRunner& chat, text::ReasoningEffort effort) {
    std::ifstream in(a.get("jsonl"));
    if (!in) throw Error("cannot read " + a.get("jsonl"));
    FILE* out = stdout;
    std::string out_path = a.get("out");
    if (!out_path.empty()) {
        out = std::fopen(out_path.c_str(), "w");
        if (!out) throw Error("cannot write " + out_path);
    }
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
            throw Error(a.get("jsonl") + ":" + std::to_string(lineno) + ": not JSON: " + e.what());
        }
        if (!j.is_object() || !j.contains("user") || !j["user"].is_string())
            throw Error(a.get("jsonl") + ":" + std::to_string(lineno) +
                        ": expected {\"user\": \"...\"}");
        bool think = a.get_flag("think");
        if (j.contains("think")) {
            if (!j["think"].is_boolean())
                throw Error(a.get("jsonl") + ":" + std::to_string(lineno) +
                            ": \"think\" must be true or false");
            think = j["think"].get<bool>();
        }
        TurnResult r = chat.turn(j["user"].get<std::string>(), think, effort, {});
        nlohmann::ordered_json o;
        o["user"] = j["user"];
        o["reasoning"] = r.reply.reasoning;
        o["content"] = r.reply.content;
        o["tool_calls"] = calls_json(r.reply.tool_calls);
        const std::string s = o.dump() + "\n";
        std::fwrite(s.data(), 1, s.size(), out);
        std::fflush(out);
        log_info("glm5: turn %d: %s\n", lineno, timing_summary(r.gen).c_str());
    }
    if (out != stdout) std::fclose(out);
    return 0;
}

}  // namespace

void add_generation_flags(Args& a) {
    add_sampling_flags(a);
    a.option("n-predict", "N", "256", "most tokens to generate per reply", "-n");
    add_context_flags(a, "");
    a.option("system", "TEXT", "", "system message", "-sys");
    a.alias("system", "--system-prompt");
    a.flag("think", "let the model reason first (glm5next always does)");
    a.option("reasoning-effort", "LEVEL", "max", "with --think: low, medium (= max), high or max");
    a.ignored("-cnv", false, "glm5 run answers one turn; glm5 chat is the conversation");
    a.ignored("--conversation", false, "glm5 run answers one turn; glm5 chat is the conversation");
}

int cmd_run(int argc, char** argv) {
    Args a("run",
           "One chat turn from --prompt or --input, a raw completion (--raw), a multi-turn "
           "conversation "
           "(--jsonl), or raw token ids (--tokens). The reply goes to stdout, reasoning and "
           "timings to stderr.");
    add_model_flags(a, false);
    add_generation_flags(a);
    a.option("prompt", "TEXT", "", "the user message", "-p");
    a.option("input", "FILE", "", "read the user message from FILE", "-f");
    a.flag("raw", "feed the prompt as is, without the chat format");
    a.option("jsonl", "IN", "",
             "play a conversation: one {\"user\": ..., \"think\": bool} per line");
    a.option("out", "OUT", "", "with --jsonl: write the replies here (default stdout)");
    a.option("tokens", "IDS", "", "comma-separated prompt token ids (no chat format)");
    a.flag("print-ids", "with --tokens: print the generated ids, space separated");
    a.flag("ignore-eos", "with --tokens: never stop at end-of-generation tokens");
    add_vision_flags(a, true);
    if (!a.parse(argc, argv, 2)) return 0;

    const int modes =
        a.is_set("prompt") + a.is_set("input") + a.is_set("jsonl") + a.is_set("tokens");
    if (modes == 0) throw UsageError("give one of --prompt, --input, --jsonl or --tokens");
    if (modes > 1) throw UsageError("--prompt, --input, --jsonl and --tokens exclude each other");
    const text::ReasoningEffort effort = [&] {
        try {
            return text::parse_reasoning_effort(a.get("reasoning-effort"));
        } catch (const Error& e) {
            throw UsageError(std::string("--reasoning-effort: ") + e.what());
        }
    }();
    const runtime::SamplerParams sp = sampling_from_args(a);  // validate before loading
    const int64_t ubatch = a.get_int("ubatch", 1, 1 << 16);
    requested_context_check(a);
    const int64_t n_predict = a.get_int("n-predict", 0, 1 << 24);

    const std::string path = a.is_set("model") ? a.get("model") : ensure_default_model();
    LoadedModel m = open_model(a, path);
    if (LoadedVision v = open_vision(a, m); v.tower) return run_with_images(a, m, v);
    if (a.is_set("tokens")) return run_tokens(a, m);

    const ContextChoice ctx = plan_context(a, *m.model, cli_context_request(ubatch, m.spec));
    ChatRunner chat(m, ctx, ubatch, sp, n_predict);
    chat.set_reasoning_budget(a.get_int("reasoning-budget", -1, INT64_MAX / 4));
    if (!a.get("system").empty()) chat.set_system(a.get("system"));
    if (a.is_set("jsonl")) {
        const int rc = run_jsonl(a, chat, effort);
        if (m.spec.type != runtime::DraftType::Off)
            log_info("glm5: %s\n", spec_summary(chat.spec_totals(), m.spec.type).c_str());
        return rc;
    }

    const std::string prompt = a.is_set("prompt") ? a.get("prompt") : read_file(a.get("input"));
    StreamCallbacks cb;
    cb.reasoning = [](const std::string& s) { std::fprintf(stderr, "%s", s.c_str()); };
    cb.content = [](const std::string& s) { write_out(s); };
    TurnResult r = a.get_flag("raw") ? chat.raw(prompt, cb)
                                     : chat.turn(prompt, a.get_flag("think"), effort, cb);
    for (const auto& c : r.reply.tool_calls)
        write_out("\n<tool_call> " +
                  nlohmann::ordered_json{{"name", c.name}, {"arguments", c.arguments}}.dump());
    write_out("\n");
    log_info("glm5: %s\n", timing_summary(r.gen).c_str());
    if (m.spec.type != runtime::DraftType::Off)
        log_info("glm5: %s\n", spec_summary(r.gen, m.spec.type).c_str());
    return 0;
}

}  // namespace glm5::app

#include "run_images.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "chat_runner.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/engine.h"
#include "text/chat.h"
#include "text/reply_parser.h"
#include "text/tokenizer.h"

namespace glm5::app {

namespace {

void write_out(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

}  // namespace

int run_with_images(const Args& a, LoadedModel& m, LoadedVision& v) {
    auto tok = text::Tokenizer::from_gguf(*m.file);
    runtime::RequestParams p;
    p.images = load_images(a, v);
    p.sampling = sampling_from_args(a);
    p.max_tokens = std::max<int64_t>(1, a.get_int("n-predict", 0, 1 << 24));
    const bool tokens_mode = a.is_set("tokens");
    bool reasoning_open = false;
    if (tokens_mode) {
        // One <|image|> id per --image in the ids (no chat format).
        p.prompt = parse_token_list(a.get("tokens"), "tokens");
        if (!a.get_flag("ignore-eos"))
            for (int32_t s : tok->stop_ids()) p.stop_ids.insert(s);
    } else {
        if (a.get_flag("raw") || a.is_set("jsonl"))
            throw UsageError("--image works with --prompt, --input or --tokens");
        std::string user = a.get("prompt");
        if (a.is_set("input")) {
            std::ifstream f(a.get("input"), std::ios::binary);
            if (!f) throw Error("cannot read " + a.get("input"));
            std::stringstream ss;
            ss << f.rdbuf();
            user = ss.str();
        }
        text::ChatFormat format = text::ChatFormat::from_gguf(*m.file);
        std::vector<text::ChatMessage> msgs;
        if (!a.get("system").empty()) msgs.push_back(text::text_message("system", a.get("system")));
        text::ChatMessage um = text::text_message("user", user);
        for (size_t i = 0; i < p.images.size(); ++i) {
            um.image_at.push_back(0);  // the images first, then the question
            um.image_urls.push_back(a.get_all("image")[i]);
        }
        msgs.push_back(um);
        text::ChatOptions co;
        if (a.get_flag("think")) co.thinking = true;
        co.effort = text::parse_reasoning_effort(a.get("reasoning-effort"));
        if (!a.get_flag("think")) co.effort = text::ReasoningEffort::Default;
        const text::RenderedPrompt rp = format.render(msgs, nullptr, co);
        reasoning_open = rp.reasoning_open;
        p.prompt = text::encode_prompt(*tok, rp);
        for (int32_t s : tok->stop_ids()) p.stop_ids.insert(s);
        apply_reasoning_budget(p, *tok, reasoning_open,
                               a.get_int("reasoning-budget", -1, INT64_MAX / 4));
    }

    runtime::EngineOptions eo;
    eo.n_parallel = 1;
    eo.ubatch = a.get_int("ubatch", 1, 1 << 16);
    ContextRequest cr = cli_context_request(eo.ubatch, m.spec);
    plan_vision(v, cr);
    const ContextChoice ctx = plan_context(a, *m.model, cr);
    eo.n_ctx = ctx.n_ctx;
    eo.cache_pool_bytes = ctx.cache_pool;
    eo.prefix_cache = false;
    eo.vision = v.tower.get();
    eo.image_token = v.image_token;
    runtime::Engine engine(*m.model, eo);

    // Token callbacks run on the engine thread; this thread only waits.
    text::StreamDecoder dec(*tok);
    text::ReplyParserOptions po;
    po.reasoning_open = reasoning_open;
    text::ReplyParser parser(po);
    auto emit = [](const text::ReplyDelta& d) {
        if (!d.reasoning.empty()) std::fprintf(stderr, "%s", d.reasoning.c_str());
        if (!d.content.empty()) write_out(d.content);
    };
    runtime::TokenCallback on_token;
    if (!tokens_mode)
        on_token = [&](int32_t t) {
            emit(parser.feed(dec.push(t)));
            return true;
        };
    const runtime::RequestResult r = engine.submit(std::move(p), on_token)->wait();
    if (r.finish_reason == "error") throw Error(r.error);
    if (tokens_mode) {
        std::string out;
        if (a.get_flag("print-ids"))
            for (size_t i = 0; i < r.tokens.size(); ++i)
                out += (i ? " " : "") + std::to_string(r.tokens[i]);
        else
            out = tok->decode(r.tokens);
        write_out(out + "\n");
    } else {
        emit(parser.feed(dec.flush()));
        emit(parser.finish());
        for (const auto& c : parser.result().tool_calls)
            write_out("\n<tool_call> " + c.name + " " + c.arguments.dump());
        write_out("\n");
    }
    log_info(
        "glm5: prompt %lld tokens (images expanded) in %.3f s | generated %zu tokens in "
        "%.3f s\n",
        (long long)r.prompt_tokens, r.prompt_seconds, r.tokens.size(), r.gen_seconds);
    return 0;
}

}  // namespace glm5::app

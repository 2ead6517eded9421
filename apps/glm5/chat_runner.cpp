#include "chat_runner.h"

#include "split_setup.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "runtime/reasoning_budget.h"

namespace glm5::app {

void add_sampling_flags(Args& a, const std::string& seed_help) {
    // llama.cpp's (and llama-server's) defaults.
    a.option("temp", "T", "0.8", "temperature (0: greedy)");
    a.alias("temp", "--temperature");
    a.option("top-k", "K", "40", "top-k sampling (0: off)");
    a.option("top-p", "P", "0.95", "top-p sampling (1: off)");
    a.option("min-p", "P", "0.05", "min-p sampling (0: off)");
    a.option("repeat-penalty", "R", "1.0",
             "repetition penalty over the last --repeat-last-n tokens (1: off)");
    a.option("repeat-last-n", "N", "64",
             "tokens the penalties look back over (-1: the whole sequence, 0: none)");
    a.option("presence-penalty", "P", "0.0",
             "subtracted from the logit of a token seen in the window (0: off)");
    a.option("frequency-penalty", "P", "0.0",
             "subtracted from a token's logit once per time it was seen in the window (0: off)");
    a.option("seed", "N", "-1", seed_help, "-s");
    a.option("reasoning-budget", "N", "-1",
             "reasoning tokens a reply may spend before </think> is forced (-1: no bound)");
}

runtime::SamplerParams sampling_from_args(const Args& a, bool seed_per_request) {
    runtime::SamplerParams sp;
    sp.temperature = float(a.get_double("temp", 0.0, 100.0));
    sp.top_k = int32_t(a.get_int("top-k", 0, 1 << 30));
    sp.top_p = float(a.get_double("top-p", 0.0, 1.0));
    sp.min_p = float(a.get_double("min-p", 0.0, 1.0));
    sp.repeat_penalty = float(a.get_double("repeat-penalty", 0.01, 100.0));
    sp.repeat_last_n = int32_t(a.get_int("repeat-last-n", -1, 1 << 30));
    sp.presence_penalty = float(a.get_double("presence-penalty", -2.0, 2.0));
    sp.frequency_penalty = float(a.get_double("frequency-penalty", -2.0, 2.0));
    const int64_t seed = a.get_int("seed", -1, INT64_MAX);
    if (seed < 0 && seed_per_request) {
        sp.seed = 0;
    } else if (seed < 0) {
        sp.seed = std::random_device{}();
        if (sp.temperature > 0 && launched_rank() == 0)
            log_info("glm5: seed %llu\n", (unsigned long long)sp.seed);
    } else {
        sp.seed = uint64_t(seed);
    }
    return sp;
}

namespace {

runtime::EngineOptions with_vision(runtime::EngineOptions o, const LoadedVision* v) {
    if (v && v->tower) {
        o.vision = v->tower.get();
        o.image_token = v->image_token;
    }
    return o;
}

}  // namespace

ChatRunner::ChatRunner(LoadedModel& m, const ContextChoice& ctx, int64_t ubatch,
                       const runtime::SamplerParams& sp, int64_t n_predict,
                       const LoadedVision* vision)
    : m_(m),
      tok_(text::Tokenizer::from_gguf(*m.file)),
      chat_(text::ChatFormat::from_gguf(*m.file)),
      engine_(*m.model, with_vision(cli_engine_options(ctx, ubatch, m.spec), vision)),
      sampler_(std::make_shared<runtime::Sampler>(sp)),
      n_predict_(n_predict) {
    if (!chat_.template_warning().empty()) log_info("glm5: %s\n", chat_.template_warning().c_str());
}

runtime::EngineOptions cli_engine_options(const ContextChoice& ctx, int64_t ubatch,
                                          const runtime::SpecParams& spec) {
    runtime::EngineOptions o;
    o.spec = spec;
    o.n_parallel = 1;
    o.n_ctx = ctx.n_ctx;
    o.ubatch = ubatch;
    o.max_rewind = ctx.n_ctx;
    o.cache_budget_bytes = SIZE_MAX;
    // One slot, sized to the whole context once: each turn adopts the
    // previous one in place, never copying the conversation's caches.
    o.cache_pool_bytes = ctx.cache_pool;
    o.request_sized_states = false;
    o.checkpoint_interval = 0;  // (the pool holds the one state)
    o.checkpoint_tail = false;
    return o;
}

runtime::RequestResult run_request(runtime::Engine& e, runtime::RequestParams p,
                                   runtime::TokenCallback on_token) {
    runtime::RequestResult r = e.submit(std::move(p), std::move(on_token))->wait();
    if (r.finish_reason == "error") throw Error(r.error);
    return r;
}

void ChatRunner::attach_image(runtime::PreparedImage img, const std::string& path) {
    pending_.push_back(std::move(img));
    pending_paths_.push_back(path);
}

void ChatRunner::reset() {
    history_.clear();
    pending_.clear();
    pending_paths_.clear();
    images_.clear();
}

TurnResult ChatRunner::turn(const std::string& user, bool think, text::ReasoningEffort effort,
                            const StreamCallbacks& cb) {
    std::vector<text::ChatMessage> msgs;
    if (!system_.empty()) msgs.push_back(text::text_message("system", system_));
    msgs.insert(msgs.end(), history_.begin(), history_.end());
    text::ChatMessage um = text::text_message("user", user);
    for (const auto& path : pending_paths_) {
        um.image_at.push_back(0);
        um.image_urls.push_back(path);
    }
    msgs.push_back(um);
    text::ChatOptions opt;
    opt.thinking = think;
    opt.effort = think ? effort : text::ReasoningEffort::Default;
    const text::RenderedPrompt p = chat_.render(msgs, nullptr, opt);
    for (const auto& w : p.warnings) log_info("glm5: %s\n", w.c_str());
    const std::vector<int32_t> ids = tok_->encode(p.text);
    // Every image of the conversation goes with each turn: the engine reuses
    // its cached prefix across them only for the same bytes.
    images_.insert(images_.end(), std::make_move_iterator(pending_.begin()),
                   std::make_move_iterator(pending_.end()));
    pending_.clear();
    pending_paths_.clear();
    TurnResult r = run(ids, p.reasoning_open, true, cb, images_);
    history_.push_back(um);
    history_.push_back(text::assistant_message(r.reply));
    return r;
}

TurnResult ChatRunner::raw(const std::string& prompt, const StreamCallbacks& cb) {
    return run(tok_->encode(prompt), false, false, cb);
}

TurnResult ChatRunner::run(const std::vector<int32_t>& ids, bool reasoning_open, bool parse,
                           const StreamCallbacks& cb, std::vector<runtime::PreparedImage> images) {
    TurnResult r;
    text::StreamDecoder dec(*tok_);
    text::ReplyParserOptions po;
    po.reasoning_open = reasoning_open;
    text::ReplyParser parser(po);
    auto emit = [&](const text::ReplyDelta& d) {
        if (!d.reasoning.empty() && cb.reasoning) cb.reasoning(d.reasoning);
        if (!d.content.empty() && cb.content) cb.content(d.content);
        for (const auto& c : d.tool_calls)
            if (cb.tool_call) cb.tool_call(c);
    };
    runtime::RequestParams rp;
    rp.prompt = ids;
    rp.images = std::move(images);
    rp.max_tokens = n_predict_;
    rp.prefill_only = n_predict_ == 0;
    rp.sampler = sampler_;
    for (int32_t s : tok_->stop_ids()) rp.stop_ids.insert(s);
    apply_reasoning_budget(rp, *tok_, reasoning_open, reasoning_budget_);
    std::string raw_text;
    r.gen = run_request(engine_, std::move(rp), [&](int32_t t) {
        const std::string piece = dec.push(t);
        if (parse)
            emit(parser.feed(piece));
        else if (!piece.empty() && cb.content)
            cb.content(piece);
        raw_text += piece;
        return true;
    });
    totals_.draft_n += r.gen.draft_n;
    totals_.draft_accepted += r.gen.draft_accepted;
    totals_.verifies += r.gen.verifies;
    const std::string tail = dec.flush();
    if (parse) {
        emit(parser.feed(tail));
        emit(parser.finish());
        r.reply = parser.result();
    } else {
        if (!tail.empty() && cb.content) cb.content(tail);
        r.reply.content = raw_text + tail;
    }
    return r;
}

void apply_reasoning_budget(runtime::RequestParams& p, const text::Tokenizer& tok,
                            bool reasoning_open, int64_t budget) {
    if (!reasoning_open || budget < 0) return;
    const int32_t end = tok.find("</think>");
    if (end < 0) throw Error("--reasoning-budget: this model's vocabulary has no </think> token");
    p.constraint = std::make_unique<runtime::ReasoningBudget>(budget, end, std::move(p.constraint));
}

std::string timing_summary(const runtime::RequestResult& g) {
    char buf[256];
    const int64_t fed = g.prompt_tokens - g.cached_tokens;
    std::snprintf(buf, sizeof(buf),
                  "prompt %lld tokens (%lld reused) in %.3f s, %.1f tok/s | generated %zu tokens "
                  "in %.3f s, %.1f tok/s",
                  (long long)g.prompt_tokens, (long long)g.cached_tokens, g.prompt_seconds,
                  g.prompt_seconds > 0 ? double(fed) / g.prompt_seconds : 0.0, g.tokens.size(),
                  g.gen_seconds, g.gen_seconds > 0 ? double(g.tokens.size()) / g.gen_seconds : 0.0);
    return buf;
}

}  // namespace glm5::app

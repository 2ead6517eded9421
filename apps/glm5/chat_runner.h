// A conversation with a loaded model for the CLI: renders the history with the
// GLM chat format, generates with prefix reuse, streams reasoning / content /
// tool calls through callbacks, and keeps the reply in the history.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "model_setup.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "text/chat.h"
#include "text/reply_parser.h"
#include "text/tokenizer.h"
#include "vision_setup.h"

namespace glm5::app {

// --temp ... --seed plus --n-predict, --ctx-size, --ubatch, --system, --think,
// --reasoning-effort (shared by run and chat).
void add_generation_flags(Args& a);

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed on `a`.
// The sampling flags run, chat and serve share (llama.cpp's defaults), and
// --reasoning-budget.
void add_sampling_flags(Args& a, const std::string& seed_help =
                                     "sampling seed (-1: random, printed on "
                                     "stderr)");
// seed_per_request: -1 leaves the seed to each request (the server draws one per
// request) instead of drawing one here.
runtime::SamplerParams sampling_from_args(const Args& a, bool seed_per_request = false);

struct StreamCallbacks {
    std::function<void(const std::string&)> reasoning;
    std::function<void(const std::string&)> content;
    std::function<void(const text::ToolCall&)> tool_call;
};

struct TurnResult {
    text::ParsedReply reply;
    runtime::RequestResult gen;
};

// The engine the CLI drives as a one-slot client: one sequence, its previous
// turn kept as a retained prefix and rewound as far as needed (a chat's next
// turn extends the last one).
runtime::EngineOptions cli_engine_options(const ContextChoice& ctx, int64_t ubatch,
                                          const runtime::SpecParams& spec);

// Runs one request on `e` and waits for it; a request that fails throws its
// error (the CLI's exit code 2 path).
runtime::RequestResult run_request(runtime::Engine& e, runtime::RequestParams p,
                                   runtime::TokenCallback on_token = nullptr);

// --reasoning-budget for a request whose prompt leaves <think> open: </think> forced
// after that many reasoning tokens (nothing when the budget is -1 or reasoning is off).
void apply_reasoning_budget(runtime::RequestParams& p, const text::Tokenizer& tok,
                            bool reasoning_open, int64_t budget);

class ChatRunner {
  public:
    // With a vision tower (`vision`, outliving the runner) turns may carry images.
    ChatRunner(LoadedModel& m, const ContextChoice& ctx, int64_t ubatch,
               const runtime::SamplerParams& sp, int64_t n_predict,
               const LoadedVision* vision = nullptr);

    const text::Tokenizer& tokenizer() const { return *tok_; }
    const text::ChatFormat& format() const { return chat_; }

    // One chat turn: the user's message is appended, the reply generated and
    // appended too. `think` turns reasoning on (glm5next always reasons).
    TurnResult turn(const std::string& user, bool think, text::ReasoningEffort effort,
                    const StreamCallbacks& cb);
    // Raw completion of `prompt` (no chat format); streams text to cb.content.
    TurnResult raw(const std::string& prompt, const StreamCallbacks& cb);

    void set_system(const std::string& s) { system_ = s; }
    // Reasoning tokens a reply may spend before </think> is forced (-1: no bound).
    void set_reasoning_budget(int64_t n) { reasoning_budget_ = n; }
    // Speculative totals over every turn so far (draft_n, draft_accepted, verifies).
    const runtime::RequestResult& spec_totals() const { return totals_; }
    void reset();
    // Adds an image (its path names it) to the next user message, before its text.
    void attach_image(runtime::PreparedImage img, const std::string& path);

  private:
    TurnResult run(const std::vector<int32_t>& ids, bool reasoning_open, bool parse,
                   const StreamCallbacks& cb, std::vector<runtime::PreparedImage> images = {});

    LoadedModel& m_;
    std::unique_ptr<text::Tokenizer> tok_;
    text::ChatFormat chat_;
    runtime::Engine engine_;
    std::shared_ptr<runtime::Sampler> sampler_;
    int64_t n_predict_;
    int64_t reasoning_budget_ = -1;
    std::string system_;
    std::vector<text::ChatMessage> history_;
    runtime::RequestResult totals_;
    std::vector<runtime::PreparedImage> pending_;  // for the next user message
    std::vector<std::string> pending_paths_;
    std::vector<runtime::PreparedImage> images_;  // the conversation's, in order
};

// "prompt 12 tok (reused 4) 310.2 tok/s | generated 16 tok 45.1 tok/s"
std::string timing_summary(const runtime::RequestResult& g);

}  // namespace glm5::app

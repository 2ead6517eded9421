#include "runtime/engine.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace glm5::runtime {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}
constexpr size_t kMaxRetained = 64;
}  // namespace

struct Engine::Job {
    std::shared_ptr<Request> req;
    RequestParams params;
    TokenCallback on_token;
    DoneCallback on_done;
    Clock::time_point submitted;
};

struct Engine::Slot {
    std::unique_ptr<Job> job;
    std::unique_ptr<model::SequenceState> state;
    std::vector<int32_t> tokens;  // what the state holds, in order
    size_t prompt_pos = 0;        // next prompt token to evaluate
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> history;  // prompt + generated, for the repetition penalty
    int32_t pending = -1;          // sampled, emitted, not yet evaluated
    int64_t cached = 0;
    Clock::time_point admitted, first_token;
    bool sampled_any = false;
    bool done = false;
};

struct Engine::Retained {
    std::unique_ptr<model::SequenceState> state;
    std::vector<int32_t> tokens;
    size_t bytes = 0;
};

RequestResult Request::wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    return result_;
}

Engine::Engine(model::Model& m, const EngineOptions& opt) : model_(m), opt_(opt) {
    opt_.n_parallel = std::max(1, opt_.n_parallel);
    opt_.ubatch = std::max<int64_t>(1, opt_.ubatch);
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    shutdown(false);
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Request> Engine::submit(RequestParams p, TokenCallback on_token,
                                        DoneCallback on_done) {
    if (p.prompt.empty()) throw Error("the prompt is empty");
    if (int64_t(p.prompt.size()) >= opt_.n_ctx)
        throw Error("the prompt has " + std::to_string(p.prompt.size()) +
                    " tokens; the context holds " + std::to_string(opt_.n_ctx) +
                    " (prompt and reply together)");
    if (p.max_tokens < 1) throw Error("max_tokens must be at least 1");
    auto job = std::make_unique<Job>();
    job->req = std::make_shared<Request>();
    job->params = std::move(p);
    job->on_token = std::move(on_token);
    job->on_done = std::move(on_done);
    job->submitted = Clock::now();
    std::shared_ptr<Request> r = job->req;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!accepting_) throw Error("the server is shutting down");
        if (opt_.max_queue > 0 && queue_.size() >= size_t(opt_.max_queue)) {
            stats_.requests_refused++;
            throw QueueFull("the queue is full: " + std::to_string(queue_.size()) +
                            " requests are waiting for a slot");
        }
        r->id_ = next_id_++;
        queue_.push_back(std::move(job));
        stats_.requests_total++;
    }
    cv_.notify_all();
    return r;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    EngineStats s = stats_;
    s.queue_depth = int(queue_.size());
    s.busy_slots = busy_;
    s.retained_entries = int(retained_.size());
    s.retained_bytes = 0;
    for (const auto& r : retained_) s.retained_bytes += r.bytes;
    s.weight_bytes = model_.backend().counters().weight_bytes;
    return s;
}

void Engine::shutdown(bool finish_in_flight) {
    std::unique_lock<std::mutex> lk(mu_);
    accepting_ = false;
    if (!finish_in_flight) {
        for (auto& j : queue_) j->req->cancel();
        for (auto& s : slots_) s->job->req->cancel();
    }
    cv_.notify_all();
    cv_.wait(lk, [&] { return (queue_.empty() && slots_.empty()) || stopping_; });
}

void Engine::loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !slots_.empty(); });
            if (stopping_ && queue_.empty() && slots_.empty()) return;
            admit(lk);
        }
        step();
        std::lock_guard<std::mutex> lk(mu_);
        slots_.erase(
            std::remove_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->done; }),
            slots_.end());
        if (queue_.empty() && slots_.empty()) cv_.notify_all();  // shutdown() waits for this
    }
}

// Binds queued requests to free slots, adopting a retained prefix when one fits.
void Engine::admit(std::unique_lock<std::mutex>& lk) {
    // Requests cancelled while queued end here. They are taken out first and
    // finished after: finish() needs the lock released, and a submit() while
    // it is released may reallocate the queue under any iterator kept.
    std::vector<std::unique_ptr<Job>> cancelled;
    for (auto& j : queue_)
        if (j->req->cancelled()) cancelled.push_back(std::move(j));
    if (!cancelled.empty()) {
        queue_.erase(std::remove(queue_.begin(), queue_.end(), nullptr), queue_.end());
        lk.unlock();
        for (auto& j : cancelled) {
            Slot tmp;
            tmp.job = std::move(j);
            finish(tmp, "cancelled");
        }
        lk.lock();
    }
    while (!queue_.empty() && int(slots_.size()) < opt_.n_parallel) {
        auto s = std::make_unique<Slot>();
        s->job = std::move(queue_.front());
        queue_.pop_front();
        s->admitted = Clock::now();
        const std::vector<int32_t>& prompt = s->job->params.prompt;

        // The retained entry sharing the longest usable prefix.
        auto best = retained_.end();
        int64_t best_p = 0;
        if (opt_.prefix_cache && s->job->params.use_prefix_cache) {
            for (auto it = retained_.begin(); it != retained_.end(); ++it) {
                size_t lcp = 0;
                while (lcp < it->tokens.size() && lcp < prompt.size() &&
                       it->tokens[lcp] == prompt[lcp])
                    ++lcp;
                // Keep one prompt token to evaluate: its logits start the reply.
                const int64_t p = int64_t(std::min(lcp, prompt.size() - 1));
                if (p <= best_p) continue;
                if (int64_t(it->tokens.size()) - p > opt_.max_rewind) continue;
                if (!it->state->can_rewind(p)) continue;
                best = it;
                best_p = p;
            }
        }
        if (best != retained_.end()) {
            s->state = std::move(best->state);
            s->tokens = std::move(best->tokens);
            retained_.erase(best);
            s->state->rewind(best_p);
            s->tokens.resize(size_t(best_p));
            s->cached = best_p;
        }
        lk.unlock();
        if (!s->state) s->state = model_.new_state(opt_.n_ctx);
        s->prompt_pos = size_t(s->cached);
        s->sampler = std::make_unique<Sampler>(s->job->params.sampling);
        s->history = prompt;
        lk.lock();
        stats_.prompt_tokens += prompt.size();
        stats_.cached_tokens += uint64_t(s->cached);
        ++busy_;
        slots_.push_back(std::move(s));
    }
}

bool Engine::step() {
    // Slots are only touched by this thread; the lock guards the lists.
    std::vector<Slot*> active;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& s : slots_) active.push_back(s.get());
    }
    for (Slot* s : active)
        if (s->job->req->cancelled()) finish(*s, "cancelled");

    // One forward: a prompt chunk for slots still prefilling (sharing the
    // micro-batch budget), one token for slots that are generating.
    std::vector<model::SeqInput> inputs;
    std::vector<Slot*> owners;
    std::vector<bool> wants_logits;
    int64_t budget = opt_.ubatch;
    for (Slot* s : active) {
        if (s->done) continue;
        const std::vector<int32_t>& prompt = s->job->params.prompt;
        if (s->prompt_pos < prompt.size()) {
            if (budget <= 0) continue;
            const size_t n = std::min(prompt.size() - s->prompt_pos, size_t(budget));
            budget -= int64_t(n);
            const bool last = s->prompt_pos + n == prompt.size();
            inputs.push_back({s->state.get(),
                              std::span<const int32_t>(prompt.data() + s->prompt_pos, n), false,
                              last});
        } else if (s->pending >= 0) {
            inputs.push_back(
                {s->state.get(), std::span<const int32_t>(&s->pending, 1), false, true});
        } else {
            continue;
        }
        owners.push_back(s);
        wants_logits.push_back(inputs.back().logits);
    }
    if (inputs.empty()) return false;

    std::vector<float> logits;
    const auto t0 = Clock::now();
    try {
        model_.forward(inputs, logits);
    } catch (const std::exception& e) {
        log_info("glm5: forward failed: %s\n", e.what());
        for (Slot* s : owners) finish(*s, "error", e.what());
        return true;
    }
    const auto t1 = Clock::now();
    {
        std::lock_guard<std::mutex> lk(mu_);
        stats_.forwards++;
        stats_.busy_seconds += seconds(t0, t1);
    }

    const int64_t V = model_.info().n_vocab;
    size_t row = 0;
    for (size_t i = 0; i < owners.size(); ++i) {
        Slot& s = *owners[i];
        const model::SeqInput& in = inputs[i];
        s.tokens.insert(s.tokens.end(), in.tokens.begin(), in.tokens.end());
        if (s.prompt_pos < s.job->params.prompt.size()) s.prompt_pos += in.tokens.size();
        if (!wants_logits[i]) continue;
        std::span<const float> lg(logits.data() + row * size_t(V), size_t(V));
        ++row;

        RequestParams& p = s.job->params;
        if (!s.sampled_any) {
            s.first_token = Clock::now();
            s.sampled_any = true;
        }
        const int64_t produced = int64_t(s.history.size() - p.prompt.size());
        std::function<bool(int32_t)> allowed;
        if (p.constraint) {
            // What may still come: the reply budget or the context, whichever ends first.
            p.constraint->set_remaining(
                std::min(p.max_tokens - produced, opt_.n_ctx - s.state->n_past()));
            allowed = [&p](int32_t t) { return p.constraint->allows(t); };
        }
        int32_t tok;
        try {
            tok = s.sampler->sample(lg, s.history, allowed);
        } catch (const std::exception& e) {
            finish(s, "error", e.what());
            continue;
        }
        if (p.stop_ids.count(tok)) {
            finish(s, "stop");
            continue;
        }
        if (p.constraint) p.constraint->accept(tok);
        s.history.push_back(tok);
        {
            std::lock_guard<std::mutex> lk(mu_);
            stats_.generated_tokens++;
        }
        if (s.job->on_token && !s.job->on_token(tok)) {
            finish(s, "stop");
            continue;
        }
        if (produced + 1 >= p.max_tokens || s.state->n_past() + 1 > opt_.n_ctx) {
            finish(s, "length");
            continue;
        }
        s.pending = tok;
    }
    return true;
}

void Engine::finish(Slot& s, const std::string& reason, const std::string& error) {
    if (s.done) return;
    s.done = true;
    const auto now = Clock::now();
    RequestResult r;
    const RequestParams& p = s.job->params;
    r.tokens.assign(s.history.begin() + long(std::min(s.history.size(), p.prompt.size())),
                    s.history.end());
    r.finish_reason = reason;
    r.error = error;
    r.prompt_tokens = int64_t(p.prompt.size());
    r.cached_tokens = s.cached;
    if (s.admitted != Clock::time_point{}) {
        r.queue_seconds = seconds(s.job->submitted, s.admitted);
        if (s.sampled_any) {
            r.prompt_seconds = seconds(s.admitted, s.first_token);
            r.gen_seconds = seconds(s.first_token, now);
        } else {
            r.prompt_seconds = seconds(s.admitted, now);
        }
    } else {
        r.queue_seconds = seconds(s.job->submitted, now);
    }
    if (s.state) retain(s);
    {
        std::lock_guard<std::mutex> lk(mu_);
        stats_.requests_done++;
        if (s.admitted != Clock::time_point{}) --busy_;
        if (reason == "cancelled") stats_.requests_cancelled++;
        if (reason == "error") stats_.requests_failed++;
    }
    if (s.job->on_done) s.job->on_done(r);
    Request& req = *s.job->req;
    {
        std::lock_guard<std::mutex> lk(req.mu_);
        req.result_ = r;
        req.done_ = true;
    }
    req.cv_.notify_all();
}

// A finished sequence stays as a retained entry (not counted against
// n_parallel) for a later request sharing its prefix.
void Engine::retain(Slot& s) {
    if (!opt_.prefix_cache || s.tokens.empty() || int64_t(s.tokens.size()) != s.state->n_past())
        return;
    Retained r;
    r.bytes = s.state->memory_bytes();
    r.state = std::move(s.state);
    r.tokens = std::move(s.tokens);
    std::lock_guard<std::mutex> lk(mu_);
    retained_.push_front(std::move(r));
    evict_to_budget();
}

void Engine::evict_to_budget() {
    size_t total = 0;
    for (const auto& r : retained_) total += r.bytes;
    while (!retained_.empty() &&
           (total > opt_.cache_budget_bytes || retained_.size() > kMaxRetained)) {
        total -= retained_.back().bytes;
        retained_.pop_back();
    }
}

}  // namespace glm5::runtime

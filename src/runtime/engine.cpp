#include "runtime/engine.h"

#include "model/cache_alloc.h"
#include "runtime/slot_file.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "core/error.h"
#include "core/log.h"

namespace glm5::runtime {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}
constexpr size_t kMaxRetained = 64;
// A sequence's checkpoints past kMaxCheckpoints: the first ones (the system prompt and tools
// sub-agents share) and the latest are kept.
constexpr size_t kFirstCheckpoints = 3;
// Caches are sized in whole blocks of positions: an entry adopted by a
// slightly longer request often holds enough already.
constexpr int64_t kCacheBlock = 64;
int64_t whole_blocks(int64_t n) {
    return (n + kCacheBlock - 1) / kCacheBlock * kCacheBlock;
}
}  // namespace

struct Engine::Job {
    std::shared_ptr<Request> req;
    RequestParams params;
    // With images: the prompt as expanded (params.prompt holds its tokens),
    // each prompt token's content key (0 for text), and the rows once encoded.
    ExpandedPrompt expanded;
    std::vector<ImageEmbedding> rows;
    bool encoded = false;
    TokenCallback on_token;
    DoneCallback on_done;
    Clock::time_point submitted;
};

struct Engine::Slot {
    int id = 0;  // 0 .. n_parallel-1: the lowest free when admitted
    std::unique_ptr<Job> job;
    std::unique_ptr<model::SequenceState> state;
    std::vector<int32_t> tokens;  // what the state holds, in order
    size_t prompt_pos = 0;        // next prompt token to evaluate
    std::shared_ptr<Sampler> sampler;
    std::vector<int32_t> history;  // prompt + generated, for the repetition penalty
    int32_t pending = -1;          // sampled, emitted, not yet evaluated
    int64_t cached = 0;
    Clock::time_point admitted, first_token;
    bool sampled_any = false;
    bool done = false;
    int64_t forwards = 0;
    size_t bytes = 0;   // the cache memory it holds in the pool's count
    std::string error;  // why sampling failed
    // Speculative decoding.
    SpecParams spec;
    DraftType drafter = DraftType::Off;  // resolved from spec.type and the model
    std::unique_ptr<WindowGovernor> governor;
    std::vector<int32_t> drafts;                 // the window after `pending`
    std::vector<int32_t> refeed;                 // kept rows a recurrent rollback must re-feed
    std::unique_ptr<model::StateSnapshot> snap;  // taken before a verify
    int64_t draft_n = 0, draft_accepted = 0, verifies = 0;
    // Recurrent state: the prompt positions still to checkpoint, and those taken
    // (ascending; a retained entry's when adopted whole).
    std::vector<int64_t> checkpoint_at;
    std::vector<std::unique_ptr<model::StateSnapshot>> checkpoints;
    size_t checkpoint_bytes = 0;  // their share of `bytes`
};

struct Engine::Retained {
    std::unique_ptr<model::SequenceState> state;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> content;  // its prompt's content keys (past them: text)
    std::vector<std::unique_ptr<model::StateSnapshot>> checkpoints;  // ascending
    size_t bytes = 0;
    int slot = -1;  // the slot whose last sequence it is
};

// How a request takes up a retained prefix: the entry, the positions it keeps,
// the checkpoint they resume from (recurrent state that cannot be cut back),
// and whether the entry is taken and cut back or kept and its prefix copied.
struct Engine::Adoption {
    std::list<Retained>::iterator entry;
    int64_t keep = 0;
    const model::StateSnapshot* at = nullptr;
    bool copy = false;
};

RequestResult Request::wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    return result_;
}

Engine::Engine(model::Model& m, const EngineOptions& opt)
    : model_(m), opt_(opt), recurrent_(m.state_cost().snapshot > 0) {
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

std::unique_ptr<Engine::Job> Engine::make_job(RequestParams p, TokenCallback on_token,
                                              DoneCallback on_done) {
    if (p.prompt.empty()) throw Error("the prompt is empty");
    ExpandedPrompt expanded;
    if (!p.images.empty()) {
        if (!opt_.vision || opt_.image_token < 0)
            throw Error("this model takes no images (load a glm5next model with --mmproj)");
        std::vector<int64_t> counts;
        std::vector<Sha256> keys;
        for (const auto& im : p.images) {
            counts.push_back(im.n_tokens);
            keys.push_back(im.key);
        }
        expanded = expand_placeholders(p.prompt, opt_.image_token, counts, keys);
        p.prompt = expanded.tokens;
    }
    if (int64_t(p.prompt.size()) >= opt_.n_ctx)
        throw Error("the prompt has " + std::to_string(p.prompt.size()) +
                    " tokens; the context holds " + std::to_string(opt_.n_ctx) +
                    " (prompt and reply together)");
    if (p.max_tokens < 1 && !p.prefill_only) throw Error("max_tokens must be at least 1");
    const SpecParams& sp = p.spec ? *p.spec : opt_.spec;
    if (sp.type == DraftType::Mtp && !model_.can_draft())
        throw Error("speculative type mtp needs a NextN/MTP block, and this model has none loaded");
    if (sp.type != DraftType::Off && (sp.draft_max < 1 || sp.draft_max > VerifyCost::kMaxRows - 1))
        throw Error("the speculative window must be 1 to " +
                    std::to_string(VerifyCost::kMaxRows - 1) + " tokens");
    auto job = std::make_unique<Job>();
    job->req = std::make_shared<Request>();
    job->params = std::move(p);
    job->expanded = std::move(expanded);
    job->on_token = std::move(on_token);
    job->on_done = std::move(on_done);
    job->submitted = Clock::now();
    return job;
}

std::shared_ptr<Request> Engine::submit(RequestParams p, TokenCallback on_token,
                                        DoneCallback on_done) {
    auto job = make_job(std::move(p), std::move(on_token), std::move(on_done));
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

std::vector<std::shared_ptr<Request>> Engine::submit_group(std::vector<RequestParams> ps) {
    std::vector<Submission> subs;
    for (auto& p : ps) subs.push_back({std::move(p), nullptr, nullptr});
    return submit_group(std::move(subs));
}

std::vector<std::shared_ptr<Request>> Engine::submit_group(std::vector<Submission> subs) {
    std::vector<std::unique_ptr<Job>> jobs;
    for (auto& s : subs)
        jobs.push_back(make_job(std::move(s.params), std::move(s.on_token), std::move(s.on_done)));
    std::vector<std::shared_ptr<Request>> rs;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!accepting_) throw Error("the server is shutting down");
        // Those that free slots take at once do not wait.
        const size_t free = size_t(std::max(0, opt_.n_parallel - busy_));
        const size_t waiting = queue_.size() + jobs.size();
        if (opt_.max_queue > 0 && waiting > free && waiting - free > size_t(opt_.max_queue)) {
            stats_.requests_refused += jobs.size();
            throw QueueFull("the queue is full: " + std::to_string(queue_.size()) +
                            " requests are waiting for a slot");
        }
        for (auto& j : jobs) {
            j->req->id_ = next_id_++;
            rs.push_back(j->req);
            queue_.push_back(std::move(j));
            stats_.requests_total++;
        }
    }
    cv_.notify_all();
    return rs;
}

void Engine::drop_retained() {
    std::lock_guard<std::mutex> lk(mu_);
    retained_.clear();
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    EngineStats s = stats_;
    s.queue_depth = int(queue_.size());
    s.busy_slots = busy_;
    s.retained_entries = int(retained_.size());
    s.retained_bytes = retained_total();
    s.cache_pool_bytes = opt_.cache_pool_bytes;
    s.cache_used_bytes = active_bytes_ + s.retained_bytes;
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
            cv_.wait(lk, [&] {
                return stopping_ || !queue_.empty() || !slots_.empty() || !tasks_.empty();
            });
            while (!tasks_.empty()) {
                std::function<void()> t = std::move(tasks_.front());
                tasks_.pop_front();
                lk.unlock();
                t();
                lk.lock();
            }
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
    drop_cancelled(lk);
    while (!queue_.empty() && int(slots_.size()) < opt_.n_parallel) {
        const Job& job = *queue_.front();
        const int64_t want = reach(job.params);
        const size_t bytes = model_.state_cost().bytes(want);
        Adoption a = best_prefix(job);
        // Reserve the request's cache memory in the pool: an adopted entry that
        // holds enough moves over as it is; one that must grow keeps its old
        // caches until the copy is made, so both count, as do an entry copied
        // from and the fresh state; else a fresh state. Checkpoints of recurrent
        // state come on top where the memory allows (without them a later request
        // resumes from less, nothing else changes).
        const bool adopting = a.entry != retained_.end();
        const Retained* keep = adopting ? &*a.entry : nullptr;
        const bool as_is = adopting && !a.copy && a.entry->state->capacity() >= want;
        const size_t base = as_is ? 0 : bytes;
        std::vector<int64_t> plan = checkpoint_plan(job.params.prompt, adopting ? a.keep : 0);
        if (!fits(base + checkpoint_bytes(plan), keep)) plan.clear();
        size_t reserved = 0;
        if (adopting) {
            if (make_room(base + checkpoint_bytes(plan), keep)) {
                reserved = (as_is ? a.entry->bytes : 0) + base + checkpoint_bytes(plan);
            } else {
                if (!a.copy) retained_.erase(a.entry);
                a = Adoption{retained_.end()};
            }
        }
        if (a.entry == retained_.end()) {
            plan = checkpoint_plan(job.params.prompt, 0);
            if (!fits(bytes + checkpoint_bytes(plan), nullptr)) plan.clear();
            if (!make_room(bytes + checkpoint_bytes(plan), nullptr) &&
                !(shed_checkpoints() && make_room(bytes, nullptr))) {
                if (!slots_.empty()) break;  // waits for running requests to end
                // Nothing runs and nothing is retained: it can never fit.
                refuse_front(lk, "the request's caches need " + std::to_string(bytes) +
                                     " bytes; the planned cache memory holds " +
                                     std::to_string(opt_.cache_pool_bytes));
                continue;
            }
            reserved = bytes + checkpoint_bytes(plan);
        }
        start_slot(lk, a, reserved, want, std::move(plan));
    }
}

void Engine::drop_cancelled(std::unique_lock<std::mutex>& lk) {
    // Requests cancelled while queued end here. They are taken out first and
    // finished after: finish() needs the lock released, and a submit() while
    // it is released may reallocate the queue under any iterator kept.
    std::vector<std::unique_ptr<Job>> cancelled;
    for (auto& j : queue_)
        if (j->req->cancelled()) cancelled.push_back(std::move(j));
    if (cancelled.empty()) return;
    queue_.erase(std::remove(queue_.begin(), queue_.end(), nullptr), queue_.end());
    lk.unlock();
    for (auto& j : cancelled) {
        Slot tmp;
        tmp.job = std::move(j);
        finish(tmp, "cancelled");
    }
    lk.lock();
}

void Engine::refuse_front(std::unique_lock<std::mutex>& lk, const std::string& why) {
    auto j = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    Slot tmp;
    tmp.job = std::move(j);
    finish(tmp, "error", why);
    lk.lock();
}

Engine::Adoption Engine::best_prefix(const Job& job) {
    Adoption best{retained_.end()};
    if (!opt_.prefix_cache || !job.params.use_prefix_cache) return best;
    const std::vector<int32_t>& prompt = job.params.prompt;
    // Same ids, and the same image bytes under image tokens.
    const std::vector<uint64_t>& content = job.expanded.content;
    auto key = [](const std::vector<uint64_t>& c, size_t i) {
        return i < c.size() ? c[i] : uint64_t(0);
    };
    for (auto it = retained_.begin(); it != retained_.end(); ++it) {
        size_t lcp = 0;
        while (lcp < it->tokens.size() && lcp < prompt.size() && it->tokens[lcp] == prompt[lcp] &&
               key(it->content, lcp) == key(content, lcp))
            ++lcp;
        // Keep one prompt token to evaluate: its logits start the reply.
        int64_t p = int64_t(std::min(lcp, prompt.size() - 1));
        // Where the state cannot be cut back to p, the latest checkpoint below it.
        const model::StateSnapshot* at = nullptr;
        if (!it->state->can_rewind(p)) {
            for (const auto& c : it->checkpoints)
                if (c->n_past() <= p) at = c.get();
            p = at ? at->n_past() : 0;
        }
        if (p <= best.keep) continue;
        best = {it, p, at, int64_t(it->tokens.size()) - p > opt_.max_rewind};
    }
    return best;
}

void Engine::start_slot(std::unique_lock<std::mutex>& lk, Adoption a, size_t reserved, int64_t want,
                        std::vector<int64_t> plan) {
    auto s = std::make_unique<Slot>();
    for (bool taken = true; taken; ++s->id) {
        taken = false;
        for (const auto& o : slots_) taken = taken || o->id == s->id;
        if (!taken) break;
    }
    s->job = std::move(queue_.front());
    queue_.pop_front();
    s->admitted = Clock::now();
    const bool adopted = a.entry != retained_.end();
    // An entry copied from stays retained; it leaves the list while it is read
    // (drop_retained() may run meanwhile) and comes back as the most recently used.
    std::list<Retained> held;
    if (adopted && a.copy) {
        held.splice(held.begin(), retained_, a.entry);
    } else if (adopted) {
        Retained& e = *a.entry;
        s->state = std::move(e.state);
        s->tokens = std::move(e.tokens);
        s->checkpoints = std::move(e.checkpoints);
        retained_.erase(a.entry);
        // A checkpoint past what is kept would resume rows about to be overwritten.
        while (!s->checkpoints.empty() && s->checkpoints.back()->n_past() > a.keep)
            s->checkpoints.pop_back();
        if (a.at)  // (only where the state cannot be cut back)
            s->state->restore(*a.at);
        else
            s->state->rewind(a.keep);
        s->tokens.resize(size_t(a.keep));
        s->cached = a.keep;
    }
    s->bytes = reserved;
    s->checkpoint_bytes = checkpoint_bytes(plan);
    active_bytes_ += reserved;
    lk.unlock();
    std::string alloc_error;
    try {
        if (!s->state)
            s->state = model_.new_state(opt_.n_ctx, want);
        else if (s->state->capacity() < want)
            s->state->resize(want);
    } catch (const std::exception& e) {
        alloc_error = std::string("cannot allocate the sequence's caches: ") + e.what();
    }
    if (!alloc_error.empty()) {
        s->state.reset();
        s->admitted = {};
        finish(*s, "error", alloc_error);  // (returns the reservation)
        lk.lock();
        retained_.splice(retained_.begin(), held);
        return;
    }
    // The shared prefix copied; a copy that fails costs only the prefill it would
    // have saved.
    if (!held.empty()) {
        try {
            if (s->state->copy_prefix(*held.front().state, a.keep, a.at)) {
                s->tokens.assign(s->job->params.prompt.begin(),
                                 s->job->params.prompt.begin() + a.keep);
                s->cached = a.keep;
            }
        } catch (const std::exception& e) {
            log_info("glm5: a shared prefix was not copied: %s\n", e.what());
            s->state->reset();
        }
    }
    s->prompt_pos = size_t(s->cached);
    // (Planned from the adopted prefix; a copy that failed starts from 0.)
    if (!plan.empty() && !held.empty() && s->cached == 0)
        plan = checkpoint_plan(s->job->params.prompt, 0);
    s->checkpoint_at = std::move(plan);
    s->sampler = s->job->params.sampler ? s->job->params.sampler
                                        : std::make_shared<Sampler>(s->job->params.sampling);
    s->history = s->job->params.prompt;
    s->spec = s->job->params.spec ? *s->job->params.spec : opt_.spec;
    s->drafter = s->spec.type == DraftType::Auto
                     ? (model_.can_draft() ? DraftType::Mtp : DraftType::Ngram)
                     : s->spec.type;
    s->governor = std::make_unique<WindowGovernor>(s->spec);
    lk.lock();
    retained_.splice(retained_.begin(), held);
    stats_.prompt_tokens += s->job->params.prompt.size();
    stats_.cached_tokens += uint64_t(s->cached);
    ++busy_;
    slots_.push_back(std::move(s));
}

// At most kMaxCheckpoints past `from`, the first kFirstCheckpoints and the latest (a main
// agent's sub-agents share the first messages; a client's next request, most of the rest);
// none for states that can be cut back, or without a prefix cache.
std::vector<int64_t> Engine::checkpoint_plan(const std::vector<int32_t>& prompt,
                                             int64_t from) const {
    if (!recurrent_ || !opt_.prefix_cache) return {};
    // Candidates, the likelier places for a later request to diverge first: message starts;
    // then, since agents resend the conversation and change what comes last (a reminder
    // appended to the newest message, the reply's start), doubling distances from the end;
    // then every checkpoint_interval positions.
    struct Candidate {
        int64_t p;
        int rank;
    };
    std::vector<Candidate> c;
    const int64_t lo = std::max<int64_t>(from, 0) + 1, n = int64_t(prompt.size());
    const auto& marks = opt_.checkpoint_tokens;
    for (int64_t p = lo; p < n; ++p) {
        if (std::find(marks.begin(), marks.end(), prompt[size_t(p)]) != marks.end())
            c.push_back({p, 0});
        else if (opt_.checkpoint_interval > 0 && p % opt_.checkpoint_interval == 0)
            c.push_back({p, 2});
    }
    // (One before the end first of all: an exact resend evaluates one token, as fresh.)
    if (opt_.checkpoint_tail)
        for (int64_t d : {1, 32, 64, 128, 256, 512, 1024})
            if (n - d >= lo) c.push_back({n - d, d == 1 ? -1 : 1});
    // Each one ends a prefill chunk (a forward more, which reads every weight): none in a
    // prompt's first positions, cheap to evaluate again, and none close to another, the
    // likelier (then the later) kept.
    std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
        return a.rank != b.rank ? a.rank < b.rank : a.p > b.p;
    });
    std::vector<int64_t> at;
    for (const Candidate& x : c) {
        if (x.p < opt_.checkpoint_spacing.first) continue;
        bool near = false;
        for (int64_t q : at) near = near || std::llabs(x.p - q) < opt_.checkpoint_spacing.gap;
        if (!near) at.push_back(x.p);
    }
    std::sort(at.begin(), at.end());
    if (at.size() > EngineOptions::kMaxCheckpoints)
        at.erase(at.begin() + kFirstCheckpoints,
                 at.end() - ptrdiff_t(EngineOptions::kMaxCheckpoints - kFirstCheckpoints));
    return at;
}

size_t Engine::checkpoint_bytes(const std::vector<int64_t>& plan) const {
    return plan.size() * model_.state_cost().snapshot;
}

void Engine::take_checkpoint(Slot& s) {
    try {
        s.checkpoints.push_back(s.state->snapshot());
    } catch (const std::exception& e) {
        log_info("glm5: no checkpoint at %lld: %s\n", (long long)s.state->n_past(), e.what());
        return;
    }
    // An adopted entry's checkpoints come first: the plan's count stays the bound.
    if (s.checkpoints.size() > EngineOptions::kMaxCheckpoints)
        s.checkpoints.erase(s.checkpoints.begin() + kFirstCheckpoints);
}

int64_t Engine::reach(const RequestParams& p) const {
    if (!opt_.request_sized_states) return opt_.n_ctx;
    const int64_t n =
        int64_t(p.prompt.size()) + (p.prefill_only ? 0 : std::max<int64_t>(p.max_tokens, 1));
    return std::min(whole_blocks(n), opt_.n_ctx);
}

size_t Engine::retained_total() const {
    size_t total = 0;
    for (const auto& r : retained_) total += r.bytes;
    return total;
}

// Requests come before checkpoints: running slots give theirs up (what they took
// and what they would take) for a request that cannot fit otherwise.
bool Engine::shed_checkpoints() {
    size_t freed = 0;
    for (auto& s : slots_) {
        if (!s->checkpoint_bytes) continue;
        s->checkpoint_at.clear();
        s->checkpoints.clear();
        s->bytes -= s->checkpoint_bytes;
        freed += s->checkpoint_bytes;
        s->checkpoint_bytes = 0;
    }
    active_bytes_ -= freed;
    return freed > 0;
}

bool Engine::fits(size_t more, const Retained* keep) const {
    if (opt_.cache_pool_bytes == 0) return true;  // (retained entries alone have a budget)
    return active_bytes_ + (keep ? keep->bytes : 0) + more <= opt_.cache_pool_bytes;
}

bool Engine::make_room(size_t more, const Retained* keep) {
    // With a pool, running requests' states and retained entries share it;
    // without one, retained entries alone keep within cache_budget_bytes.
    const bool pool = opt_.cache_pool_bytes > 0;
    const size_t limit = pool ? opt_.cache_pool_bytes : opt_.cache_budget_bytes;
    if (!pool) more = 0;
    size_t used = (pool ? active_bytes_ : 0) + retained_total();
    for (auto it = retained_.end();
         (used + more > limit || retained_.size() > kMaxRetained) && it != retained_.begin();) {
        --it;
        if (&*it == keep) continue;
        used -= it->bytes;
        it = retained_.erase(it);
    }
    return used + more <= limit;
}

// One forward's rows: for slots still prefilling a prompt chunk (sharing the micro-batch
// budget); for slots that are generating, the rows a rollback left to re-feed, the pending
// token and the draft window. `feeds` and `embeds` hold what the inputs point into.
struct Engine::StepInputs {
    std::vector<model::SeqInput> inputs;
    std::vector<Slot*> owners;
    std::vector<std::vector<int32_t>> feeds;
    std::deque<std::vector<model::EmbedRows>> embeds;
    bool prefilling = false;
};

bool Engine::step() {
    // Slots are only touched by this thread; the lock guards the lists.
    std::vector<Slot*> active;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& s : slots_) active.push_back(s.get());
    }
    for (Slot* s : active)
        if (s->job->req->cancelled()) finish(*s, "cancelled");

    StepInputs in;
    gather(active, in);
    if (in.inputs.empty()) return false;
    std::vector<float> logits;
    const std::vector<bool> failed = forward(in, logits);

    const size_t V = size_t(model_.info().n_vocab);
    size_t row = 0;  // the next row of logits
    for (size_t i = 0; i < in.owners.size(); ++i) {
        if (failed[i]) continue;
        Slot& s = *in.owners[i];
        const model::SeqInput& si = in.inputs[i];
        const int64_t n_before = s.state->n_past() - int64_t(si.tokens.size());
        s.tokens.insert(s.tokens.end(), si.tokens.begin(), si.tokens.end());
        s.forwards++;
        if (s.prompt_pos < s.job->params.prompt.size()) {
            if (take_prompt(s, si, logits.data() + row * V)) ++row;
        } else {
            row += verify_window(s, n_before, logits.data() + row * V);
        }
    }

    std::vector<Slot*> drafting;
    for (Slot* s : in.owners)
        if (!s->done && s->pending >= 0) drafting.push_back(s);
    if (!drafting.empty()) plan_drafts(drafting);
    return true;
}

void Engine::gather(const std::vector<Slot*>& active, StepInputs& in) {
    in.feeds.reserve(active.size());  // inputs point into them
    int64_t budget = opt_.ubatch;
    for (Slot* s : active) {
        if (s->done) continue;
        const std::vector<int32_t>& prompt = s->job->params.prompt;
        if (s->prompt_pos < prompt.size()) {
            if (budget <= 0) continue;
            size_t n = std::min(prompt.size() - s->prompt_pos, size_t(budget));
            // A chunk ends where the slot takes a checkpoint.
            if (!s->checkpoint_at.empty())
                n = std::min(n, size_t(s->checkpoint_at.front()) - s->prompt_pos);
            budget -= int64_t(n);
            in.prefilling = true;
            const bool last = s->prompt_pos + n == prompt.size();
            if (!image_rows(*s, n, in.embeds)) continue;
            in.inputs.push_back({s->state.get(),
                                 std::span<const int32_t>(prompt.data() + s->prompt_pos, n), false,
                                 last && !s->job->params.prefill_only});
            in.inputs.back().embeds = in.embeds.back();
        } else if (s->pending >= 0) {
            std::vector<int32_t>& f = in.feeds.emplace_back(s->refeed);
            f.push_back(s->pending);
            f.insert(f.end(), s->drafts.begin(), s->drafts.end());
            model::SeqInput si{s->state.get(), f, false, true};
            si.logits_from = int64_t(s->refeed.size());
            if (!s->drafts.empty()) {
                try {
                    s->snap = s->state->snapshot();
                } catch (const std::exception& e) {
                    // Without a rollback point the window cannot be verified:
                    // this step decodes plainly (only speed is lost).
                    log_info("glm5: snapshot failed, decoding without a window: %s\n", e.what());
                    s->drafts.clear();
                    f.resize(s->refeed.size() + 1);
                    si.tokens = f;
                }
            }
            in.inputs.push_back(si);
        } else {
            continue;
        }
        in.owners.push_back(s);
    }
}

std::vector<bool> Engine::forward(StepInputs& in, std::vector<float>& logits) {
    const auto t0 = Clock::now();
    // A failed forward changes no state (states commit when a forward
    // completes), so it is retried sequence by sequence: only a sequence
    // that fails on its own gets the error.
    std::vector<bool> failed(in.owners.size(), false);
    try {
        model_.forward(in.inputs, logits);
    } catch (const std::exception& e) {
        log_info("glm5: forward of %zu sequences failed (%s)%s\n", in.inputs.size(), e.what(),
                 in.inputs.size() > 1 ? "; retrying each alone" : "");
        logits.clear();
        for (size_t i = 0; i < in.inputs.size(); ++i) {
            std::vector<float> one;
            try {
                if (in.inputs.size() == 1) throw;
                model_.forward({&in.inputs[i], 1}, one);
                logits.insert(logits.end(), one.begin(), one.end());
            } catch (const std::exception& e1) {
                failed[i] = true;
                in.owners[i]->snap.reset();
                finish(*in.owners[i], "error", e1.what());
            }
        }
    }
    const auto t1 = Clock::now();
    int64_t rows_total = 0;
    for (const auto& si : in.inputs) rows_total += int64_t(si.tokens.size());
    if (!in.prefilling) verify_cost_.record(int(rows_total), seconds(t0, t1));
    int windows = 0;
    for (const Slot* s : in.owners) windows += s->snap != nullptr;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.forwards++;
    if (windows >= 2) stats_.shared_verifies++;
    stats_.busy_seconds += seconds(t0, t1);
    return failed;
}

bool Engine::take_prompt(Slot& s, const model::SeqInput& in, const float* logits) {
    s.prompt_pos += in.tokens.size();
    if (!s.checkpoint_at.empty() && int64_t(s.prompt_pos) == s.checkpoint_at.front()) {
        s.checkpoint_at.erase(s.checkpoint_at.begin());
        take_checkpoint(s);
    }
    if (s.job->params.prefill_only && s.prompt_pos == s.job->params.prompt.size()) {
        finish(s, "length");  // (a prefill-only request asks for no logits)
        return false;
    }
    if (!in.logits) return false;
    // The last prompt chunk: its last row starts the reply.
    std::string reason;
    emit(s, {logits, size_t(model_.info().n_vocab)}, s.state->n_past(), reason);
    if (!reason.empty()) finish(s, reason);
    return true;
}

size_t Engine::verify_window(Slot& s, int64_t n_before, const float* logits) {
    // A window: rows [pending, d1..dK] after the re-fed ones. Row j's token is sampled
    // as plain decoding would sample it; while it equals the draft d(j+1) the next row
    // is valid too.
    const size_t V = size_t(model_.info().n_vocab);
    const int64_t first = int64_t(s.refeed.size());
    const int W = int(s.drafts.size());
    std::string reason;
    int j = 0;
    for (;; ++j) {
        std::span<const float> lg(logits + size_t(j) * V, V);
        const int32_t tok = emit(s, lg, n_before + first + 1 + j, reason);
        if (!reason.empty() || j == W || tok != s.drafts[size_t(j)]) break;
    }
    if (W > 0) record_window(s, W, j);
    // Rows past row j were drafts that plain decoding would not have fed.
    if (roll_back(s, n_before + first + 1 + j) && !reason.empty()) finish(s, reason);
    return size_t(W + 1);
}

void Engine::record_window(Slot& s, int W, int accepted) {
    s.verifies++;
    s.draft_n += W;
    s.draft_accepted += accepted;
    s.governor->record(W, accepted);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.verifies++;
    stats_.draft_tokens += uint64_t(W);
    stats_.draft_accepted += uint64_t(accepted);
    if (stats_.drafted_at.size() < size_t(W)) {
        stats_.drafted_at.resize(size_t(W), 0);
        stats_.accepted_at.resize(size_t(W), 0);
    }
    for (int k = 0; k < W && k <= accepted; ++k) {
        stats_.drafted_at[size_t(k)]++;
        if (k < accepted) stats_.accepted_at[size_t(k)]++;
    }
}

bool Engine::roll_back(Slot& s, int64_t keep) {
    s.refeed.clear();
    if (s.state->n_past() > keep && !s.state->rewind(keep)) {
        // Recurrent state cannot rewind: restore the snapshot taken before
        // the forward and re-feed the kept rows with the next forward.
        try {
            s.state->restore(*s.snap);
        } catch (const std::exception& e) {
            // The state is past what was emitted and cannot come back:
            // this sequence ends here (and is not retained).
            s.snap.reset();
            s.drafts.clear();
            s.state.reset();
            finish(s, "error", std::string("rollback failed: ") + e.what());
            return false;
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            stats_.rollbacks++;
        }
        const int64_t at = s.state->n_past();
        s.refeed.assign(s.tokens.begin() + at, s.tokens.begin() + keep);
        s.tokens.resize(size_t(at));
    } else {
        s.tokens.resize(size_t(keep));
    }
    s.snap.reset();
    s.drafts.clear();
    return true;
}

// Samples one token for slot `s` from `lg`, the logits of the row whose
// evaluation leaves the state at n_past tokens, exactly as plain decoding
// does; emits it, or sets `reason` when the request ends here. Returns the
// token (also when it ends the request).
int32_t Engine::emit(Slot& s, std::span<const float> lg, int64_t n_past, std::string& reason) {
    RequestParams& p = s.job->params;
    if (!s.sampled_any) {
        s.first_token = Clock::now();
        s.sampled_any = true;
    }
    const int64_t produced = int64_t(s.history.size() - p.prompt.size());
    std::function<bool(int32_t)> allowed;
    if (p.constraint) {
        // What may still come: the reply budget or the context, whichever ends first.
        p.constraint->set_remaining(std::min(p.max_tokens - produced, opt_.n_ctx - n_past));
        allowed = [&p](int32_t t) { return p.constraint->allows(t); };
    }
    int32_t tok;
    try {
        tok = produced < int64_t(p.forced.size()) ? p.forced[size_t(produced)]
                                                  : s.sampler->sample(lg, s.history, allowed);
    } catch (const std::exception& e) {
        reason = "error";
        s.error = e.what();
        return -1;
    }
    s.pending = -1;
    if (p.on_logits) p.on_logits(tok, lg);
    if (p.stop_ids.count(tok)) {
        reason = "stop";
        return tok;
    }
    if (p.constraint) p.constraint->accept(tok);
    s.history.push_back(tok);
    {
        std::lock_guard<std::mutex> lk(mu_);
        stats_.generated_tokens++;
    }
    if (s.job->on_token && !s.job->on_token(tok)) {
        reason = "stop";
        return tok;
    }
    if (produced + 1 >= p.max_tokens || n_past + 1 > opt_.n_ctx) {
        reason = "length";
        return tok;
    }
    s.pending = tok;
    return tok;
}

// Picks each generating slot's next window and drafts it: n-gram drafts from
// the slot's own text, NextN drafts in one batched chain for all slots.
void Engine::plan_drafts(const std::vector<Slot*>& slots) {
    std::vector<model::DraftRequest> mtp;
    std::vector<Slot*> mtp_slots;
    for (Slot* s : slots) {
        if (s->drafter == DraftType::Off) continue;
        const RequestParams& p = s->job->params;
        const int64_t produced = int64_t(s->history.size() - p.prompt.size());
        // Never draft past the reply budget or the context: the window's last
        // row must still have room for the token it yields.
        const int64_t room =
            std::min(p.max_tokens - produced,
                     s->state->capacity() - s->state->n_past() - int64_t(s->refeed.size()) - 1);
        int k = s->governor->choose(verify_cost_,
                                    s->drafter == DraftType::Mtp ? mtp_seconds_per_token_ : 0.0);
        k = int(std::min<int64_t>(k, room));
        if (k <= 0) continue;
        if (s->drafter == DraftType::Ngram) {
            s->drafts = ngram_draft(s->history, k);
        } else if (s->drafter == DraftType::External) {
            s->drafts = s->spec.external ? s->spec.external(s->history, k) : std::vector<int32_t>{};
            if (int(s->drafts.size()) > k) s->drafts.resize(size_t(k));
            // A bad id would fail the whole batch's forward: cut the window there.
            const int64_t V = model_.info().n_vocab;
            for (size_t i = 0; i < s->drafts.size(); ++i)
                if (s->drafts[i] < 0 || s->drafts[i] >= V) {
                    s->drafts.resize(i);
                    break;
                }
        } else if (s->refeed.empty()) {
            // (After a recurrent rollback the state lags behind the pending
            // token; such slots decode plainly this step.)
            model::DraftRequest d;
            d.state = s->state.get();
            d.token = s->pending;
            d.max_tokens = k;
            d.p_min = s->spec.p_min;
            mtp.push_back(std::move(d));
            mtp_slots.push_back(s);
        }
    }
    if (mtp.empty()) return;
    const auto t0 = Clock::now();
    try {
        model_.draft(mtp);
    } catch (const std::exception& e) {
        // A draft that fails costs only speed: decode plainly.
        log_info("glm5: NextN draft failed: %s\n", e.what());
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < mtp.size(); ++i) {
        mtp_slots[i]->drafts = std::move(mtp[i].out);
        n += std::max<size_t>(1, mtp_slots[i]->drafts.size());
    }
    const double per = seconds(t0, Clock::now()) / double(n);
    mtp_seconds_per_token_ =
        mtp_seconds_per_token_ == 0 ? per : 0.8 * mtp_seconds_per_token_ + 0.2 * per;
}

// The image rows of the prompt chunk [prompt_pos, +n) of a slot, appended to
// `out` (encoding the request's images on this thread the first time a chunk
// needs them). False when encoding failed: the request has ended.
bool Engine::image_rows(Slot& s, size_t n, std::deque<std::vector<model::EmbedRows>>& out) {
    Job& j = *s.job;
    const int64_t b = int64_t(s.prompt_pos), e = b + int64_t(n);
    bool needed = false;
    for (const auto& r : j.expanded.embeds) needed = needed || (r.at < e && r.at + r.n > b);
    if (needed && !j.encoded) {
        try {
            const auto t0 = Clock::now();
            j.rows = encode_prepared(*opt_.vision, j.params.images);
            set_rows(j.expanded, j.rows);
            j.encoded = true;
            std::lock_guard<std::mutex> lk(mu_);
            stats_.busy_seconds += seconds(t0, Clock::now());
        } catch (const std::exception& ex) {
            finish(s, "error", ex.what());
            return false;
        }
    }
    out.push_back(needed ? embeds_in(j.expanded, b, e, model_.info().n_embd)
                         : std::vector<model::EmbedRows>{});
    return true;
}

void Engine::finish(Slot& s, const std::string& reason, const std::string& error_in) {
    if (s.done) return;
    const std::string error = error_in.empty() ? s.error : error_in;
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
    r.forwards = s.forwards;
    r.draft_n = s.draft_n;
    r.draft_accepted = s.draft_accepted;
    r.verifies = s.verifies;
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
    {
        std::lock_guard<std::mutex> lk(mu_);
        active_bytes_ -= s.bytes;
    }
    // What an error touched is never kept for reuse.
    if (s.state && reason != "error") retain(s);
    s.bytes = 0;
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
    // Kept at what it holds (whole blocks of 64 positions), not at what its
    // request could have reached: a retained entry never pins a full context.
    if (opt_.request_sized_states) {
        const int64_t hold = std::min(opt_.n_ctx, whole_blocks(s.state->n_past()));
        if (hold < s.state->capacity()) {
            try {
                s.state->resize(hold);
            } catch (const std::exception& e) {
                log_info("glm5: a finished sequence is not retained: %s\n", e.what());
                return;
            }
        }
    }
    Retained r;
    r.bytes = model_.state_cost().bytes(s.state->capacity()) +
              s.checkpoints.size() * model_.state_cost().snapshot;
    r.state = std::move(s.state);
    r.checkpoints = std::move(s.checkpoints);
    r.tokens = std::move(s.tokens);
    r.content = s.job->expanded.content;
    r.slot = s.id;
    std::lock_guard<std::mutex> lk(mu_);
    // A slot's last sequence is the one it left last.
    for (auto& o : retained_)
        if (o.slot == r.slot) o.slot = -1;
    retained_.push_front(std::move(r));
    make_room(0, nullptr);
}

void Engine::run_task(std::function<void()> f) {
    std::exception_ptr err;
    bool done = false;
    std::mutex m;
    std::condition_variable cv;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) throw Error("the engine is stopping");
        tasks_.push_back([&] {
            try {
                f();
            } catch (...) {
                err = std::current_exception();
            }
            std::lock_guard<std::mutex> l(m);
            done = true;
            cv.notify_all();
        });
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return done; });
    if (err) std::rethrow_exception(err);
}

namespace {

void check_slot(int slot, int n) {
    if (slot < 0 || slot >= n)
        throw Error("slot " + std::to_string(slot) + " does not exist (slots 0.." +
                    std::to_string(n - 1) + ")");
}

}  // namespace

Engine::SlotIo Engine::save_slot(int slot, const std::string& folder, const std::string& name,
                                 const std::string& fingerprint, uint64_t folder_limit) {
    check_slot(slot, opt_.n_parallel);
    SlotIo io;
    const auto t0 = Clock::now();
    SlotFile f;
    run_task([&] {
        // The entry leaves the list while it is read (drop_retained() may run meanwhile).
        std::list<Retained> held;
        {
            std::lock_guard<std::mutex> lk(mu_);
            auto it = std::find_if(retained_.begin(), retained_.end(),
                                   [&](const Retained& r) { return r.slot == slot; });
            if (it == retained_.end())
                throw Error("slot " + std::to_string(slot) + " holds no sequence to save");
            held.splice(held.begin(), retained_, it);
        }
        struct PutBack {
            Engine& e;
            std::list<Retained>& l;
            ~PutBack() {
                std::lock_guard<std::mutex> lk(e.mu_);
                e.retained_.splice(e.retained_.begin(), l);
            }
        } put_back{*this, held};
        const Retained& r = held.front();
        for (uint64_t c : r.content)
            if (c)
                throw Error("slot " + std::to_string(slot) + "'s sequence holds images: not saved");
        f.tokens = r.tokens;
        model::StateWriter w(f.state);
        r.state->save(w);
    });
    io.bytes = write_slot_file(folder, name, fingerprint, f, folder_limit);
    io.tokens = int64_t(f.tokens.size());
    io.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return io;
}

Engine::SlotIo Engine::restore_slot(int slot, const std::string& path,
                                    const std::string& fingerprint) {
    check_slot(slot, opt_.n_parallel);
    SlotIo io;
    const auto t0 = Clock::now();
    // The largest file a sequence of this context makes (its state's memory and a MiB for
    // what the state's layout records besides): checked from the file's metadata and header
    // before it is read.
    const uint64_t most = 8 + 4 + 4 + uint64_t(fingerprint.size()) + 8 +
                          uint64_t(opt_.n_ctx) * sizeof(int32_t) + 8 +
                          model_.state_cost().bytes(opt_.n_ctx) + (uint64_t(1) << 20);
    SlotFile f = read_slot_file(path, fingerprint, most, &io.bytes);
    const int64_t n = int64_t(f.tokens.size());
    if (n == 0) throw Error(path + ": the saved sequence is empty");
    if (n >= opt_.n_ctx)
        throw Error(path + ": the saved sequence holds " + std::to_string(n) +
                    " tokens; this server's context holds " + std::to_string(opt_.n_ctx));
    for (int32_t t : f.tokens)
        if (t < 0 || t >= model_.info().n_vocab)
            throw Error(path + ": token " + std::to_string(t) + " is outside the vocabulary");
    run_task([&] {
        const int64_t cap = std::min(opt_.n_ctx, whole_blocks(n));
        const size_t bytes = model_.state_cost().bytes(cap);
        Retained r;
        r.state = model_.new_state(opt_.n_ctx, cap);
        model::StateReader rd(f.state);
        r.state->load(rd);
        if (!rd.at_end() || r.state->n_past() != n)
            throw Error(path + ": the state does not match its tokens (damaged)");
        r.tokens = std::move(f.tokens);
        r.bytes = bytes;
        r.slot = slot;
        std::lock_guard<std::mutex> lk(mu_);
        if (!make_room(bytes, nullptr))
            throw Error("no cache memory for the restored sequence (" + std::to_string(bytes) +
                        " bytes) while requests run");
        for (auto& o : retained_)
            if (o.slot == slot) o.slot = -1;
        retained_.push_front(std::move(r));
    });
    io.tokens = n;
    io.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return io;
}

int64_t Engine::erase_slot(int slot) {
    check_slot(slot, opt_.n_parallel);
    int64_t n = 0;
    run_task([&] {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = retained_.begin(); it != retained_.end();)
            if (it->slot == slot) {
                n += int64_t(it->tokens.size());
                it = retained_.erase(it);
            } else {
                ++it;
            }
    });
    return n;
}

}  // namespace glm5::runtime

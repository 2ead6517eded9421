// The generation loop of every command (run, chat, bench, serve): requests
// are bound to sequence slots that own their caches; every step runs ONE
// forward over all active slots' tokens (prompt chunks, decode tokens and
// speculative windows together), so each weight is read once for all of
// them. Finished sequences stay as retained entries that a later request
// sharing a prefix adopts instead of prefilling again. The CLI is a one-slot
// client of the same engine.
//
// Determinism: a token's logits do not depend on what shares its batch (the
// model guarantees it) and every request samples with its own seeded
// sampler, so a request's output is the same served alone or with others.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "runtime/images.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace glm5::runtime {

// Restricts which tokens may come next (grammar-constrained output, e.g. a
// JSON schema). One object per request; used only from the engine thread.
class TokenConstraint {
  public:
    virtual ~TokenConstraint() = default;
    // May `token` come next? Stop tokens are allowed exactly when the output
    // so far is complete.
    virtual bool allows(int32_t token) const = 0;
    // Records that `token` was emitted.
    virtual void accept(int32_t token) = 0;
    // Called before each sampling step with the tokens the request may still
    // generate, so the constraint can steer toward a complete output in time.
    virtual void set_remaining(int64_t n_tokens) { (void)n_tokens; }
};

struct RequestParams {
    std::vector<int32_t> prompt;
    SamplerParams sampling;
    int64_t max_tokens = 256;
    std::unordered_set<int32_t> stop_ids;  // end-of-generation tokens: not emitted, finish "stop"
    std::unique_ptr<TokenConstraint> constraint;  // optional
    bool use_prefix_cache = true;
    // Optional: sample with this sampler instead of a fresh one made from
    // `sampling`, so a conversation's random stream goes on across turns.
    std::shared_ptr<Sampler> sampler;
    // Optional: the reply is these tokens, not sampled ones (teacher forcing:
    // benchmarks decode a fixed random continuation). max_tokens still applies.
    std::vector<int32_t> forced;
    // Evaluate the prompt and end ("length") without generating: the state
    // is retained for a later request (benchmark depth, warm prefixes).
    bool prefill_only = false;
    // Speculative decoding for this request; none: the engine's default.
    std::optional<SpecParams> spec;
    // Optional, on the engine thread: each emitted token with the logits row
    // it was sampled from (tests and tools compare them across runs).
    std::function<void(int32_t token, std::span<const float> logits)> on_logits;
    // Images (runtime/images.h), one per <|image|> id in `prompt`, in order:
    // the engine expands each placeholder to the image's token count and
    // runs the vision tower on its own thread when a prompt chunk first needs
    // the rows (not at all when a retained prefix already holds them). A
    // retained prefix is reused across an image only for the same bytes.
    std::vector<PreparedImage> images;
};

struct RequestResult {
    std::vector<int32_t> tokens;  // generated (stop token excluded)
    // "stop" (stop token, or on_token asked to stop), "length" (max_tokens or
    // the context), "cancelled", "error"
    std::string finish_reason;
    std::string error;
    int64_t forwards = 0;                     // forwards this request took part in
    int64_t draft_n = 0, draft_accepted = 0;  // speculative tokens proposed / accepted
    int64_t verifies = 0;                     // forwards that verified a window
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;  // prompt tokens taken from a retained entry
    double queue_seconds = 0, prompt_seconds = 0, gen_seconds = 0;
};

// Called on the engine thread for every generated token; return false to
// stop the request (finish "stop"). Keep it quick: hand the token to another
// thread.
using TokenCallback = std::function<bool(int32_t token)>;
// Called once on the engine thread when the request ends, however it ends.
using DoneCallback = std::function<void(const RequestResult&)>;

class Request {
  public:
    uint64_t id() const { return id_; }
    // Thread-safe; the slot is freed at the next engine step.
    void cancel() { cancelled_ = true; }
    bool cancelled() const { return cancelled_; }
    // Blocks until the request has ended.
    RequestResult wait();

  private:
    friend class Engine;
    uint64_t id_ = 0;
    std::atomic<bool> cancelled_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    RequestResult result_;
};

struct EngineOptions {
    int n_parallel = 4;    // slots decoding at once; more requests queue
    int64_t n_ctx = 4096;  // most tokens a sequence may hold
    int64_t ubatch = 512;  // most prompt tokens per forward (all slots together)
    bool prefix_cache = true;
    size_t cache_budget_bytes = size_t(2) << 30;  // retained entries, evicted LRU beyond this
    // The memory plan's bound on cache memory (runtime/memory_plan.h): the
    // states of running requests plus retained entries never exceed it;
    // retained entries are evicted (least recently used first) to make room,
    // and a request that cannot fit waits in the queue. With a pool,
    // retained entries may use all of it that running requests leave free
    // (cache_budget_bytes is not applied). 0: no pool.
    size_t cache_pool_bytes = 0;
    // Size each sequence's caches to what its request can reach (prompt +
    // max_tokens, capped by n_ctx) and shrink retained entries to what they
    // hold, so no entry pins a full context. false: every state holds n_ctx
    // (the CLI's one slot, whose conversation grows turn by turn).
    bool request_sized_states = true;
    // A request reuses the longest prefix it shares with any retained entry. An
    // entry whose tokens past that prefix are at most max_rewind is taken and cut
    // back; one with more is kept for later requests and the prefix copied into
    // the request's own state (a main agent and its sub-agents share a system
    // prompt and tools, then differ).
    int64_t max_rewind = 16;
    // States that cannot be cut back by position (glm5next's recurrent KDA state)
    // resume a prefix from checkpoints taken while a prompt is evaluated: before
    // each of these tokens (the chat format's message starts) and every
    // checkpoint_interval positions, at most kMaxCheckpoints per sequence (the
    // first three and the latest), each counted in the cache memory.
    std::vector<int32_t> checkpoint_tokens;
    int64_t checkpoint_interval = 4096;
    // And at 1, 32, 64, ..., 1024 positions before the prompt's end: a client that resends
    // the conversation with its last part changed resumes close to the change.
    bool checkpoint_tail = true;
    // None before position `first` (a short prefix is cheap to evaluate again) and none
    // within `gap` of another (message starts kept first, then those near the end): each
    // ends a prefill chunk, a forward more.
    struct {
        int64_t first = 256, gap = 16;
    } checkpoint_spacing;
    static constexpr size_t kMaxCheckpoints = 16;
    SpecParams spec;  // speculative decoding for requests that do not say
    // Requests waiting for a slot; submit() beyond this throws QueueFull. 0: no
    // bound (the CLI's batch commands); the server sets one (--max-queue).
    int max_queue = 0;
    // The vision tower requests with images use (on the model's backend), and
    // the <|image|> token id; without them a request with images is refused.
    model::VisionTower* vision = nullptr;
    int32_t image_token = -1;
};

// submit() found the queue full (EngineOptions::max_queue): a transient refusal,
// the same request may succeed later (HTTP 429).
class QueueFull : public Error {
  public:
    using Error::Error;
};

struct EngineStats {
    uint64_t requests_total = 0, requests_done = 0, requests_cancelled = 0, requests_failed = 0;
    uint64_t requests_refused = 0;  // submit() threw QueueFull
    uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    uint64_t forwards = 0;
    int queue_depth = 0, busy_slots = 0, retained_entries = 0;
    size_t retained_bytes = 0;
    size_t cache_pool_bytes = 0;  // planned (EngineOptions::cache_pool_bytes)
    size_t cache_used_bytes = 0;  // held by running requests' states and retained entries
    double busy_seconds = 0;      // time spent in forwards
    uint64_t weight_bytes = 0;    // weight bytes the forwards read (the backend's count)
    // Speculative decoding: tokens drafted and accepted, verifies, and per
    // draft position (0 = first draft of a window) how often it was drafted
    // and accepted.
    uint64_t draft_tokens = 0, draft_accepted = 0, verifies = 0;
    uint64_t rollbacks = 0;        // recurrent states restored after a partial rejection
    uint64_t shared_verifies = 0;  // forwards that verified the windows of two or more slots
    std::vector<uint64_t> drafted_at, accepted_at;
};

class Engine {
  public:
    Engine(model::Model& m, const EngineOptions& opt);
    ~Engine();  // cancels what is left and stops the engine thread
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Queues a request. Throws glm5::Error for a request that can never run
    // (empty prompt, prompt longer than n_ctx, max_tokens < 1), QueueFull when
    // max_queue requests are already waiting.
    std::shared_ptr<Request> submit(RequestParams p, TokenCallback on_token = nullptr,
                                    DoneCallback on_done = nullptr);

    // Queues several requests at once: the engine admits them in the same
    // step (up to n_parallel), so they decode in lockstep (benchmarks, and the
    // server's choices of one HTTP request). All or none: QueueFull when those
    // that free slots cannot take at once do not all fit in max_queue.
    struct Submission {
        RequestParams params;
        TokenCallback on_token;
        DoneCallback on_done;
    };
    std::vector<std::shared_ptr<Request>> submit_group(std::vector<Submission> subs);
    std::vector<std::shared_ptr<Request>> submit_group(std::vector<RequestParams> ps);
    // Forgets every retained prefix entry.
    void drop_retained();

    // The persistent prompt cache (llama-server's /slots/{id}?action=...). Slot ids are
    // 0 .. n_parallel-1: a request runs in the lowest free one, and the sequence it
    // leaves (a retained entry) is that slot's until the next request there ends.
    // save writes the slot's sequence (its tokens and state) as `name` in `folder`
    // (runtime/slot_file.h: never through a link, never over another kind of file, within
    // `folder_limit` bytes of files, 0: no limit); restore reads one back as the slot's
    // sequence, which a later request sharing its prefix adopts as it would any retained
    // entry (so its logits are those of the prefix computed fresh, bit for bit); erase
    // forgets it. `fingerprint` names the model and cache type (a file of another is
    // refused). The state moves between the sequence and memory on the engine thread
    // between steps; the file is written and read on the caller's, so a slow disk or a
    // large file never stalls generation. Throw glm5::Error.
    struct SlotIo {
        int64_t tokens = 0;
        size_t bytes = 0;
        double seconds = 0;
    };
    SlotIo save_slot(int slot, const std::string& folder, const std::string& name,
                     const std::string& fingerprint, uint64_t folder_limit = 0);
    SlotIo restore_slot(int slot, const std::string& path, const std::string& fingerprint);
    int64_t erase_slot(int slot);

    EngineStats stats() const;
    const EngineOptions& options() const { return opt_; }

    // Stop taking requests; with finish_in_flight, let running and queued
    // requests complete, else cancel them. Returns when the engine is idle.
    void shutdown(bool finish_in_flight);

  private:
    struct Job;
    struct Slot;
    struct Retained;

    std::unique_ptr<Job> make_job(RequestParams p, TokenCallback on_token, DoneCallback on_done);
    void loop();
    bool step();  // one scheduling round; false when there was nothing to do
    // The stages of a step: the rows each slot feeds; the forward (each sequence alone
    // when the batch fails; true: that sequence's failed and it is finished); a prompt
    // chunk taken (true when it had a row of logits); a draft window verified, its
    // accepted tokens emitted and the rest rolled back (returns the rows it had).
    struct StepInputs;
    void gather(const std::vector<Slot*>& active, StepInputs& in);
    std::vector<bool> forward(StepInputs& in, std::vector<float>& logits);
    bool take_prompt(Slot& s, const model::SeqInput& in, const float* logits);
    size_t verify_window(Slot& s, int64_t n_before, const float* logits);
    void record_window(Slot& s, int drafted, int accepted);
    // Cuts the state back to `keep` tokens (restoring the snapshot and queueing a re-feed
    // where it cannot rewind); false when that failed and the slot was finished.
    bool roll_back(Slot& s, int64_t keep);
    void admit(std::unique_lock<std::mutex>& lk);
    // The stages of an admission (each takes the lock held, and may release it while it
    // finishes a request): queued requests cancelled end; the retained entry sharing the
    // longest usable prefix with a job's prompt, and how many tokens of it it keeps; the
    // front request refused; the front request bound to a slot, adopting `best` (or
    // retained_.end()) with `reserved` bytes of the pool.
    void drop_cancelled(std::unique_lock<std::mutex>& lk);
    struct Adoption;
    Adoption best_prefix(const Job& job);
    void refuse_front(std::unique_lock<std::mutex>& lk, const std::string& why);
    void start_slot(std::unique_lock<std::mutex>& lk, Adoption a, size_t reserved, int64_t want,
                    std::vector<int64_t> plan);
    bool shed_checkpoints();  // true when running slots gave some memory up
    // Checkpoints of recurrent state (EngineOptions::checkpoint_tokens): the positions
    // of a prompt past `from` where its slot takes one, and one taken.
    std::vector<int64_t> checkpoint_plan(const std::vector<int32_t>& prompt, int64_t from) const;
    void take_checkpoint(Slot& s);
    size_t checkpoint_bytes(const std::vector<int64_t>& plan) const;
    void finish(Slot& s, const std::string& reason, const std::string& error = "");
    bool image_rows(Slot& s, size_t n, std::deque<std::vector<model::EmbedRows>>& out);
    void retain(Slot& s);
    // Evicts retained entries, least recently used first and never `keep`,
    // until `more` bytes fit in the pool (without a pool: until retained
    // entries fit cache_budget_bytes) and at most kMaxRetained remain; false
    // when `more` cannot fit.
    bool make_room(size_t more, const Retained* keep);
    bool fits(size_t more, const Retained* keep) const;  // make_room's answer, evicting nothing
    size_t retained_total() const;
    int64_t reach(const RequestParams& p) const;  // positions a request can fill
    void plan_drafts(const std::vector<Slot*>& slots);
    int32_t emit(Slot& s, std::span<const float> lg, int64_t n_past, std::string& reason);

    model::Model& model_;
    EngineOptions opt_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Job>> queue_;
    std::deque<std::function<void()>> tasks_;   // run on the engine thread between steps
    void run_task(std::function<void()> f);     // queues f and waits for it
    std::vector<std::unique_ptr<Slot>> slots_;  // active
    std::list<Retained> retained_;              // most recently used first
    int busy_ = 0;                              // admitted requests not yet finished
    size_t active_bytes_ = 0;                   // running requests' states
    bool stopping_ = false;
    bool accepting_ = true;
    uint64_t next_id_ = 1;
    EngineStats stats_;
    VerifyCost verify_cost_;
    double mtp_seconds_per_token_ = 0;  // measured NextN draft cost
    const bool recurrent_;              // states keep checkpoints (Model::state_cost().snapshot)
    std::thread thread_;
};

}  // namespace glm5::runtime

// What every architecture's forward offers the runtime: per-sequence state
// (caches that belong to one sequence and can be rewound or snapshotted) and
// a batched forward over any number of sequences at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace glm5::gguf {
class File;
}

namespace glm5::model {

struct ModelInfo {
    std::string arch;  // "glm-dsa", "glm5next"
    std::string name;  // general.name or the file name
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;  // trunk layers
    int64_t n_ctx_train = 0;
    bool has_nextn = false;       // the file describes a NextN/MTP block
    bool nextn_loaded = false;    // ... and its weights were loaded (--spec)
    uint64_t weight_bytes = 0;    // bytes of weights the trunk uses
    uint64_t repacked_bytes = 0;  // of which repacked at load (--repack)
    uint64_t copied_bytes = 0;    // anonymous memory holding weight copies (--no-mmap, repacks)
    uint64_t mapped_bytes = 0;    // weights served from the file mapping (file-backed pages)
    // Why nothing was repacked although asked for (repack_if_fits and the
    // copies would not fit in memory); empty otherwise.
    std::string repack_skipped;
    // The trunk layers this process holds, [layer_first, layer_end), and
    // whether it holds the head (output norm, LM head, NextN): all of them
    // unless loaded with LoadOptions::layers (a layer split across processes).
    int64_t layer_first = 0;
    int64_t layer_end = 0;
    bool holds_head = true;
    int64_t head_first = 0, head_end = 0;  // the attention heads held (tensor parallel)
    // Tensor parallel: each routed expert's hidden units held [ff_first, ff_end)
    // of n_ff_exp; all of them when the experts are whole.
    int64_t ff_first = 0, ff_end = 0, n_ff_exp = 0;
    uint64_t skipped_bytes = 0;  // weights of the layers other processes hold (never read)
    // Routed experts in system RAM beside a device (LoadOptions::host_experts): the
    // MoE blocks loaded, how many of them keep their routed experts there, and those
    // experts' bytes (served from the file mapping, never copied).
    int64_t moe_blocks = 0;
    int64_t host_expert_blocks = 0;
    uint64_t host_expert_bytes = 0;
};

class StateWriter;
class StateReader;

// An opaque copy of the part of a sequence's state that a rewind cannot
// recover (speculative decoding's rollback point).
class StateSnapshot {
  public:
    virtual ~StateSnapshot() = default;
    virtual int64_t n_past() const = 0;
};

// The caches and recurrent state of one sequence. Positions start at 0 and
// are contiguous; n_past() tokens have been evaluated.
class SequenceState {
  public:
    virtual ~SequenceState() = default;
    virtual int64_t n_past() const = 0;
    virtual int64_t n_ctx() const = 0;  // the most tokens it may hold
    // Forget everything (n_past = 0).
    virtual void reset() = 0;
    // Rewind to n tokens (0 <= n <= n_past). Returns false (changing nothing)
    // when the architecture cannot rewind to n: positional caches (glm-dsa)
    // rewind anywhere; recurrent state (glm5next) only to 0 or n_past.
    virtual bool rewind(int64_t n) = 0;
    // Saves what rewinding cannot recover. After restore(), the state equals
    // the one snapshotted for every position below snapshot.n_past(); the
    // caller then re-forwards the tokens it keeps. Throws when the snapshot
    // belongs to another state or the state has been reset since.
    virtual std::unique_ptr<StateSnapshot> snapshot() const = 0;
    virtual void restore(const StateSnapshot& s) = 0;
    // Whether rewind(n) would succeed (changes nothing).
    virtual bool can_rewind(int64_t n) const = 0;
    // Makes this state hold the first n positions of `src`, another state of the
    // same model (a prefix two requests share), keeping `src` as it is: the
    // positional rows below n are copied. Recurrent state, which a position
    // cannot recover, comes from `at`: a snapshot of `src` taken at n since its
    // last reset (none needed where src can rewind to n). Returns false,
    // changing nothing, when that cannot be done; capacity() must hold n.
    virtual bool copy_prefix(const SequenceState& src, int64_t n, const StateSnapshot* at) = 0;
    // Bytes of memory the state holds now (Model::state_cost().bytes(capacity())).
    virtual size_t memory_bytes() const = 0;
    // Positions the caches hold: allocated once, never grown by a forward (a
    // forward past it throws). resize() reallocates to exactly `rows`
    // (n_past <= rows <= n_ctx), keeping what the state holds.
    virtual int64_t capacity() const = 0;
    virtual void resize(int64_t rows) = 0;
    // What the state holds as bytes (its caches' rows below n_past, its recurrent
    // state, the scalars that go with them), for a persistent prompt cache; load()
    // puts them into a fresh state of the same model (capacity at least the saved
    // n_past), which then answers every later forward bit for bit as the saved one
    // would. A state of another shape (model, cache type) is refused (glm5::Error).
    virtual void save(StateWriter& w) const = 0;
    virtual void load(StateReader& r) = 0;
};

// What sequence states cost, from the hyperparameters alone (memory planning).
struct StateCost {
    size_t per_token = 0;  // cache bytes per position: every layer's rows, the NextN block's
    // Bytes per `pool` positions (glm5next's pooled indexer keys; 0 when none).
    size_t per_pool = 0;
    int64_t pool = 1;
    size_t fixed = 0;     // per sequence, whatever its length (recurrent state, double-buffered)
    size_t snapshot = 0;  // what a speculative rollback point copies
    // Host rows a sequence keeps after each forward of `rows` tokens (the
    // NextN drafter's seeds), per row.
    size_t per_kept_row = 0;
    // Exactly what a state with `capacity` positions allocates.
    size_t bytes(int64_t capacity) const {
        return fixed + per_token * size_t(capacity) +
               per_pool * size_t((capacity + pool - 1) / pool);
    }
};

// Rows that replace the token embeddings of tokens [at, at + n) of one
// SeqInput after the lookup: n rows of n_embd floats in host memory (an
// image's rows from the vision tower, docs/glm5next-format.md 12.5). The
// tokens themselves stay in the sequence (the <|image|> placeholders).
struct EmbedRows {
    int64_t at = 0;
    int64_t n = 0;
    const float* rows = nullptr;
};

// One sequence's share of a batch: its new tokens, appended after n_past.
struct SeqInput {
    SequenceState* state = nullptr;
    std::span<const int32_t> tokens;
    bool all_logits = false;  // a logits row for every token, else for the last only
    bool logits = true;       // false: no logits rows at all (a prompt chunk that is not the last)
    // >= 0: a logits row for every token from this index on (a speculative
    // verify: the rows re-fed after a rollback want none, the window all).
    int64_t logits_from = -1;
    // Optional embedding overrides, disjoint, within `tokens`; only
    // architectures that take images accept them (glm5next), the others refuse.
    std::span<const EmbedRows> embeds = {};
};

// One sequence's NextN/MTP draft request: `token` was sampled from the
// state's last row and is not evaluated yet; the draft chain proposes what
// follows it, greedily, up to max_tokens, stopping early when a draft's
// probability (softmax over its ten most likely tokens) falls below p_min.
struct DraftRequest {
    SequenceState* state = nullptr;
    int32_t token = 0;
    int max_tokens = 0;
    float p_min = 0.0f;
    std::vector<int32_t> out;
};

// The layers one forward runs and what enters and leaves them: how a model is
// split by layers (each part runs its own; between parts flow the residual
// rows, Model::hidden_width() floats per token, in batch order, through the
// backend's receive_rows / send_rows).
struct LayerSpan {
    int64_t first = 0;  // the first trunk layer
    int64_t end = -1;   // one past the last; -1: through the last layer and the LM head
    // first > 0: where the rows entering layer `first` come from.
    backend::RowChannel* rows_in = nullptr;
    // A span that ends before the last layer sends the rows leaving it here.
    backend::RowChannel* rows_out = nullptr;
    // Whether the states commit this forward (positions advance, recurrent
    // state becomes current). One process running a sequence's layers in
    // several spans commits with the last; a process holding only some of
    // them runs uncommitted and calls Model::commit once every part succeeded.
    bool commit = true;
};

// A RowChannel over host memory: the rows a span receives are `in` (which
// must hold exactly what the batch needs), the rows it sends land in `*out`.
class HostRows final : public backend::RowChannel {
  public:
    explicit HostRows(std::span<const float> in = {}, std::vector<float>* out = nullptr)
        : in_(in), out_(out) {}
    void receive(float* host, size_t n) override;
    void send(const float* host, size_t n) override;

  private:
    std::span<const float> in_;
    std::vector<float>* out_;
};

// The part of a model one process holds: trunk layers [first, end), and the
// head (output norm, LM head, NextN block) when end is -1 (through the last
// layer). The other layers' tensors are checked but never read, and states
// hold caches for these layers only.
struct LayerRange {
    int64_t first = 0;
    int64_t end = -1;
    bool whole() const { return first == 0 && end < 0; }
};

struct LoadOptions {
    backend::CacheType cache_type = backend::CacheType::F16;
    LayerRange layers;  // everything unless a layer split says otherwise
    // Tensor parallelism: this process is rank tp_rank of tp_size sharing
    // every layer's attention heads and expert hidden units; the backend's
    // reducer sums the partial outputs.
    int tp_rank = 0;
    int tp_size = 1;
    bool load_nextn = false;  // --spec
    // --no-mmap: copy the weights into anonymous memory instead of serving
    // them from the read-only file mapping (the default).
    bool in_memory = false;
    // --repack: the backend may keep its own copy of each matrix it registers
    // (Backend::register_weight: the CPU backend repacks Q4_K, Q6_K, Q5_0 and Q8_0
    // for its AVX-512 VNNI GEMM); results are bit-identical, only faster.
    bool repack = false;
    // With repack: when the copies would not fit in available memory, serve
    // the weights from the file as they are (ModelInfo::repack_skipped says
    // why) instead of refusing. The CLI's default.
    bool repack_if_fits = false;
    // Check every tensor but hold none (no weight is read): a model to plan
    // with (layer costs), which cannot run.
    bool plan_only = false;
    // Routed experts in system RAM beside a device: the blocks (by GGUF index: the
    // trunk, then the NextN block) whose routed experts `experts_backend` computes;
    // the model's backend runs everything else and holds the activations. With an
    // experts backend every routed expert is loaded as stored in the file mapping (no
    // repacked copy), so that Model::place_experts can move it later.
    std::vector<bool> host_experts = {};
    backend::Backend* experts_backend = nullptr;
    // With experts in system RAM: the device computes the shared expert while the host
    // computes the routed ones, and adds the two (the same bits as taking turns);
    // false: the two take turns (--no-moe-overlap, for measuring).
    bool moe_overlap = true;
    // Diagnostic: attend to every cached token, ignoring the sparse selection
    // (used to show that the selection really drops tokens).
    bool dense_attention = false;
};

class Model {
  public:
    virtual ~Model() = default;
    const ModelInfo& info() const { return info_; }

    // A sequence of at most n_ctx positions whose caches hold `capacity` of
    // them (0: all n_ctx), allocated now.
    virtual std::unique_ptr<SequenceState> new_state(int64_t n_ctx, int64_t capacity = 0) = 0;

    // Memory planning: the bytes of a state, and the working memory (backend
    // scratch and host buffers) of the largest forward: `rows` tokens in one
    // pass of which `logit_rows` want logits, attending `depth` cached tokens.
    virtual StateCost state_cost() const = 0;
    // What trunk layer `il`'s caches cost a state (its share of state_cost()
    // when held; the head's NextN rows are not in it): how a layer split
    // balances memory.
    virtual StateCost layer_cost(int64_t il) const = 0;
    virtual size_t scratch_bytes(int64_t rows, int64_t logit_rows, int64_t depth) const = 0;

    // Evaluates every sequence's tokens in one pass (weights are read once for
    // all of them) and appends them to the states. Logits rows are written in
    // order: for each input, all its rows or only its last. A token's logits do
    // not depend on what else shares the batch.
    void forward(std::span<const SeqInput> inputs, std::vector<float>& logits) {
        forward(inputs, logits, LayerSpan{});
    }
    // The same over the layers of `span` only: the logits come from the span
    // that ends with the head, and are bitwise those of the whole forward,
    // however the layers are split (a sequence's states hold the caches of
    // every layer a span runs on them). Throws, changing no state, on a span
    // outside the trunk or hidden rows of the wrong size.
    virtual void forward(std::span<const SeqInput> inputs, std::vector<float>& logits,
                         const LayerSpan& span) = 0;
    // Commits what spans run with commit = false on these inputs wrote: each
    // input's state advances by its tokens (recurrent state becomes current).
    // A process that holds only some of a sequence's layers runs its span
    // uncommitted and commits once every other part has succeeded.
    virtual void commit(std::span<const SeqInput> inputs) = 0;
    // Floats per token between two layers (the residual stream).
    virtual int64_t hidden_width() const = 0;
    // Whether a span may start at `layer`: glm-dsa's shared-indexer layers
    // reuse the selection of the full layer before them, so a split goes
    // before a full layer.
    virtual bool can_split_before(int64_t layer) const {
        return layer >= 0 && layer < info_.n_layer;
    }

    // Routed experts in system RAM beside a device, chosen once the memory plan is
    // known: from now on the blocks (GGUF index) flagged in `host` have their routed
    // experts computed by LoadOptions::experts_backend, the others by the model's
    // backend (same bits either way). Refused (glm5::Error) without an experts backend.
    virtual void place_experts(const std::vector<bool>& host);

    // Whether draft() works: a NextN/MTP block was loaded (--spec).
    virtual bool can_draft() const { return false; }
    // Runs the draft chains of several sequences together (one MTP forward
    // per chain step for all of them). Changes no trunk state.
    virtual void draft(std::span<DraftRequest> reqs);

    backend::Backend& backend() { return *backend_; }

  protected:
    explicit Model(backend::Backend* be) : backend_(be) {}
    ModelInfo info_;
    backend::Backend* backend_;
};

// Opens a GGUF's architecture (refusing unsupported ones with the reason).
// The file must outlive the model: weights are served from its mapping.
std::unique_ptr<Model> load_model(const gguf::File& file, backend::Backend& be,
                                  const LoadOptions& opt);

}  // namespace glm5::model

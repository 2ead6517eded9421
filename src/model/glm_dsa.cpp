// glm-dsa forward. Reads top to bottom as the model: attention norm, q/kv
// projections, the lightning indexer, absorbed MLA, then the dense or MoE FFN.
// Every op runs on the backend; this file only wires buffers and shapes.
#include "model/glm_dsa.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/batch.h"
#include "model/cache_alloc.h"
#include "model/moe.h"

namespace glm5::model {

using backend::AttentionOps;
using backend::Backend;
using backend::CacheRows;
using backend::CacheType;
using backend::DevPtr;
using backend::MoeWeights;

// Per-sequence caches: for every trunk layer one MLA latent row
// [kv_lora | k_rope] per token, and on full indexer layers one indexer key row.
// Everything is indexed by position, so rewinding is just moving n_past.
// With the NextN block loaded, the block's own latent rows come along (kept in
// step by every trunk forward) with the trunk's last hidden rows, which seed
// the next draft.
class GlmDsaModel::DsaState final : public SequenceState {
  public:
    // Caches for the layers this process holds only (the others are empty).
    // key_type: the indexer keys' storage (AttentionOps::indexer_key_type).
    DsaState(backend::Backend& be, const GlmDsaHParams& hp, const HeldLayers& held, CacheType type,
             CacheType key_type, int64_t n_ctx, int64_t capacity, bool mtp)
        : be_(be), type_(type), n_ctx_(n_ctx), n_embd_(hp.n_embd) {
        for (int64_t il = 0; il < hp.n_layer; ++il) {
            const bool mine = held.holds_layer(il);
            latent_.push_back(CacheRows{nullptr, mine ? hp.kv_lora + hp.n_rot : 0, type});
            keys_.push_back(
                CacheRows{nullptr, mine && hp.idx_full[size_t(il)] ? hp.idx_dim : 0, key_type});
        }
        mtp_latent_ = CacheRows{nullptr, mtp ? hp.kv_lora + hp.n_rot : 0, type};
        try {
            resize(capacity);
        } catch (...) {
            release();
            throw;
        }
    }
    ~DsaState() override { release(); }

    int64_t n_past() const override { return n_past_; }
    int64_t n_ctx() const override { return n_ctx_; }
    void reset() override { set_past(0); }
    bool can_rewind(int64_t n) const override { return n >= 0 && n <= n_past_; }
    bool rewind(int64_t n) override {
        if (!can_rewind(n)) return false;
        set_past(n);
        return true;
    }
    // Every cache is positional, so a snapshot is just the position.
    struct Snapshot final : StateSnapshot {
        const DsaState* owner;
        int64_t n;
        Snapshot(const DsaState* o, int64_t n_) : owner(o), n(n_) {}
        int64_t n_past() const override { return n; }
    };
    std::unique_ptr<StateSnapshot> snapshot() const override {
        return std::make_unique<Snapshot>(this, n_past_);
    }
    void restore(const StateSnapshot& s) override {
        auto* snap = dynamic_cast<const Snapshot*>(&s);
        if (!snap || snap->owner != this) throw Error("restore: snapshot of another sequence");
        if (snap->n > n_past_)
            throw Error("restore: the sequence was reset or rewound past the snapshot");
        set_past(snap->n);
    }
    // Every cache is positional: the rows are all there is to copy. The NextN
    // seed rows are not: the forward that follows (at least one token) writes them.
    bool copy_prefix(const SequenceState& src_, int64_t n, const StateSnapshot*) override {
        auto* src = dynamic_cast<const DsaState*>(&src_);
        if (!src || src == this || n < 0 || n > src->n_past_ || n > capacity_ ||
            src->latent_.size() != latent_.size() || src->type_ != type_)
            return false;
        for (size_t i = 0; i < latent_.size(); ++i) {
            copy_rows(be_, latent_[i], src->latent_[i], n);
            copy_rows(be_, keys_[i], src->keys_[i], n);
        }
        const int64_t valid = std::min(src->mtp_valid, n);
        copy_rows(be_, mtp_latent_, src->mtp_latent_, valid);
        n_past_ = n;
        mtp_valid = valid;
        h_rows_.clear();
        h_first_ = h_count_ = 0;
        return true;
    }
    size_t memory_bytes() const override {
        size_t per_row = 0;
        for (size_t i = 0; i < latent_.size(); ++i)
            per_row += latent_[i].row_bytes() + keys_[i].row_bytes();
        per_row += mtp_latent_.row_bytes();
        return per_row * size_t(capacity_);
    }
    int64_t capacity() const override { return capacity_; }

    // Reallocates every cache to exactly `rows` positions, keeping the
    // n_past rows it holds (the engine sizes a sequence once per request:
    // caches never grow inside a forward).
    void resize(int64_t rows) override {
        check_capacity(rows, n_past_, n_ctx_);
        if (rows == capacity_) return;
        std::vector<CacheResize> all;
        for (auto& c : latent_) all.push_back({&c, rows, n_past_});
        for (auto& c : keys_) all.push_back({&c, rows, n_past_});
        all.push_back({&mtp_latent_, rows, n_past_});
        resize_caches(be_, all);
        capacity_ = rows;
    }
    void reserve(int64_t n) const { check_reserved(n, capacity_); }

    void save(StateWriter& w) const override {
        w.scalar(n_past_);
        w.scalar(mtp_valid);
        for (size_t i = 0; i < latent_.size(); ++i) {
            w.rows(be_, latent_[i], n_past_);
            w.rows(be_, keys_[i], n_past_);
        }
        w.rows(be_, mtp_latent_, n_past_);
        // The NextN drafter's seed rows (drafts only, but a restored state drafts the same).
        w.scalar(h_first_);
        w.scalar(h_count_);
        w.host(h_rows_.data(), h_rows_.size() * sizeof(float));
    }
    void load(StateReader& r) override {
        const int64_t n = r.scalar();
        if (n < 0 || n > capacity_)
            throw Error("state: " + std::to_string(n) + " positions saved, room for " +
                        std::to_string(capacity_));
        const int64_t valid = r.scalar();
        for (size_t i = 0; i < latent_.size(); ++i) {
            r.rows(be_, latent_[i], n);
            r.rows(be_, keys_[i], n);
        }
        r.rows(be_, mtp_latent_, n);
        const int64_t h_first = r.scalar(), h_count = r.scalar();
        if (h_count < 0 || h_count > n + 1) throw Error("state: bad drafter rows");
        std::vector<float> h(size_t(h_count * n_embd_));
        r.host(h.data(), h.size() * sizeof(float));
        n_past_ = n;
        mtp_valid = std::min(valid, n);
        h_rows_ = std::move(h);
        h_first_ = h_first;
        h_count_ = h_count;
    }

    void advance(int64_t n) { n_past_ += n; }
    const CacheRows& latent(int64_t il) const { return latent_[size_t(il)]; }
    const CacheRows& keys(int64_t il) const { return keys_[size_t(il)]; }

    // ---- NextN/MTP
    const CacheRows& mtp_latent() const { return mtp_latent_; }
    // The block's rows below this position were computed from trunk hidden
    // states (rows past it are drafts, overwritten later).
    int64_t mtp_valid = 0;
    // The trunk's hidden row (after output_norm) at `pos`, when the last
    // forward computed it; null otherwise.
    const float* hidden(int64_t pos) const {
        if (pos < h_first_ || pos >= h_first_ + h_count_) return nullptr;
        return h_rows_.data() + (pos - h_first_) * n_embd_;
    }
    void keep_hidden(const float* rows, int64_t first_pos, int64_t n) {
        h_rows_.assign(rows, rows + n * n_embd_);
        h_first_ = first_pos;
        h_count_ = n;
    }

  private:
    void release() {
        for (auto& c : latent_)
            if (c.data) be_.free_cache(c.data);
        for (auto& c : keys_)
            if (c.data) be_.free_cache(c.data);
        if (mtp_latent_.data) be_.free_cache(mtp_latent_.data);
    }

    void set_past(int64_t n) {
        n_past_ = n;
        mtp_valid = std::min(mtp_valid, n);
    }

    backend::Backend& be_;
    CacheType type_;
    int64_t n_ctx_;
    int64_t n_embd_;
    int64_t n_past_ = 0;
    int64_t capacity_ = 0;
    std::vector<CacheRows> latent_, keys_;
    CacheRows mtp_latent_;
    std::vector<float> h_rows_;
    int64_t h_first_ = 0, h_count_ = 0;
};

std::unique_ptr<SequenceState> GlmDsaModel::new_state(int64_t n_ctx, int64_t capacity) {
    if (n_ctx <= 0) throw Error("context size must be positive");
    return std::make_unique<DsaState>(*backend_, hp_, held_, cache_type_,
                                      attn_.indexer_key_type(cache_type_), n_ctx,
                                      capacity > 0 ? capacity : n_ctx, nextn_ != nullptr);
}

StateCost GlmDsaModel::layer_cost(int64_t il) const {
    const GlmDsaHParams& h = hp_;
    StateCost c;
    c.per_token = size_t(h.kv_lora + h.n_rot + (h.idx_full[size_t(il)] ? h.idx_dim : 0)) *
                  backend::cache_elem_size(cache_type_);
    return c;
}

StateCost GlmDsaModel::state_cost() const {
    const GlmDsaHParams& h = hp_;
    const size_t es = backend::cache_elem_size(cache_type_);
    StateCost c;
    for (int64_t il = held_.first; il < held_.end; ++il) c.per_token += layer_cost(il).per_token;
    if (nextn_) {
        c.per_token += size_t(h.kv_lora + h.n_rot) * es;
        c.per_kept_row = size_t(h.n_embd) * sizeof(float);
    }
    return c;
}

// Mirrors forward() (an upper estimate): the backend scratch (activations,
// Buffers, the head's rows; a second set for the NextN block's catch-up),
// the indexer's scores (one float per query and visible key: rows x depth),
// the attention's per-thread scores, the MoE and matmul activation copies
// (at most 4 bytes a value), and the host logits.
size_t GlmDsaModel::scratch_bytes(int64_t T, int64_t R, int64_t D) const {
    const GlmDsaHParams& h = hp_;
    const size_t E = size_t(h.n_embd), H = size_t(h.n_head), W = size_t(h.kv_lora + h.n_rot);
    const size_t Fd = size_t(h.n_ff), Fe = size_t(h.n_ff_exp);
    const size_t F = std::max(Fd, Fe), S = Fe * size_t(h.n_expert_shared);
    const size_t Hi = size_t(h.idx_heads), Di = size_t(h.idx_dim), V = size_t(h.n_vocab);
    const size_t rows = size_t(T), top_k = size_t(h.idx_top_k), depth = size_t(D);
    size_t per_row = E + E + size_t(h.q_lora) + H * size_t(h.k_mla) + W + H * W +
                     H * size_t(h.kv_lora) + H * size_t(h.v_mla) + E + Hi * Di + Di + Hi + 2 * F;
    if (nextn_) per_row = 2 * per_row + 6 * E;  // hn, and the block's own rows
    size_t b = rows * per_row * 4;
    b += size_t(R) * (E + 2 * V) * 4;          // head input, logits, host logits
    b += rows * (top_k * 4 + 16);              // selections, visibility
    if (depth > top_k) b += rows * depth * 4;  // indexer scores
    const size_t n_vis = std::min(depth, top_k);
    b += attn_.attention_scratch_bytes(int64_t(H), int64_t(n_vis));
    if (h.n_expert > 0)
        b += moe_scratch_bytes(T, h.n_embd, int64_t(F), h.n_expert_used, int64_t(S));
    b += rows * std::max({E, size_t(h.q_lora), F, H * size_t(h.v_mla), size_t(h.kv_lora)}) * 4;
    return b;
}

// The activations one decoder block needs for T rows.
struct GlmDsaModel::Buffers {
    DevPtr<float> xn, tmp, iq, ik, iw, fg, fu;
    MlaBuffers mla;
    DevPtr<int32_t> sel;  // the indexer's selection, reused by shared layers
    // What the attention sees: dense until a full layer's indexer has selected.
    backend::AttentionOps::Selection selection;
    // tmp holds the last block's FFN output, not yet added to the residual x: the next
    // block adds it with its norm in one op, settle() where no block follows.
    bool ffn_pending = false;
    void settle(backend::Backend& be, DevPtr<float> x, int64_t n) {
        if (ffn_pending) be.add(x, tmp, n);
        ffn_pending = false;
    }
    Buffers(backend::Backend& be, const GlmDsaHParams& h, int64_t T) {
        const int64_t E = h.n_embd, H = h.n_head, W = h.kv_lora + h.n_rot;
        const int64_t F = std::max(h.n_ff, h.n_ff_exp);
        xn = be.scratch(size_t(T * E));
        mla.qr = be.scratch(size_t(T * h.q_lora));
        mla.q = be.scratch(size_t(T * H * h.k_mla));
        mla.kv = be.scratch(size_t(T * W));
        mla.qfull = be.scratch(size_t(T * H * W));
        mla.olat = be.scratch(size_t(T * H * h.kv_lora));
        mla.ov = be.scratch(size_t(T * H * h.v_mla));
        tmp = be.scratch(size_t(T * E));
        iq = be.scratch(size_t(T * h.idx_heads * h.idx_dim));
        ik = be.scratch(size_t(T * h.idx_dim));
        iw = be.scratch(size_t(T * h.idx_heads));
        fg = be.scratch(size_t(T * F));
        fu = be.scratch(size_t(T * F));
        sel = be.scratch_ids(size_t(T * h.idx_top_k));
    }
};

// One decoder block over the rows of x: attention norm, q/kv projections,
// the lightning indexer (full layers), absorbed MLA, then the dense or MoE FFN, whose
// output the next block (or Buffers::settle) adds to x.
void GlmDsaModel::block(const Layer& L, Buffers& b, DevPtr<float> x, int64_t T,
                        DevPtr<const int32_t> dpos, std::span<const BlockSegment> segs) {
    backend::Backend& be = *backend_;
    const GlmDsaHParams& h = hp_;
    const int64_t E = h.n_embd, Di = h.idx_dim, Hi = h.idx_heads;
    // This rank's heads (all of them but under tensor parallelism).
    const MlaBlock mla(be, attn_, h.mla_shape(n_head_local_), L.attn, b.mla, T);

    // ---- attention input: the projections of the normed row and of the
    // query latent, the indexer's (full layers) in the same ops.
    if (b.ffn_pending)
        be.add_rms_norm(x, b.tmp, L.attn_norm, T, E, h.eps, b.xn);
    else
        be.rms_norm(x, E, L.attn_norm, T, E, h.eps, b.xn, E);
    b.ffn_pending = false;
    const MlaBlock::MatmulOut idx_from_xn[] = {{&L.idx_k, b.ik, Di}, {&L.idx_proj, b.iw, Hi}};
    const MlaBlock::MatmulOut idx_from_qr[] = {{&L.idx_q_b, b.iq, Hi * Di}};
    mla.project(b.xn, std::span(idx_from_xn, L.full ? 2 : 0),
                std::span(idx_from_qr, L.full ? 1 : 0));

    // ---- lightning indexer (full layers): which cached tokens each query sees
    if (L.full) {
        // Queries and keys RoPE'd and Hadamard-rotated, keys layer-normed first and cached,
        // head weights scaled by 1 / sqrt(dim * heads).
        std::vector<AttentionOps::Segment> keys;
        for (const BlockSegment& s : segs) keys.push_back({*s.keys, s.first, s.n});
        attn_.indexer_inputs(b.iq, b.ik, b.iw, dpos, keys, Hi, Di, h.n_rot, h.freq_base,
                             L.idx_k_norm, L.idx_k_norm_b, 1.0f / std::sqrt(float(Di * Hi)));

        // While a row sees no more than top_k tokens it keeps them all: the backend
        // decides per row from the plan's positions.
        if (!dense_attention_) {
            attn_.indexer_select(b.iq, b.iw, dpos, keys, 1, Hi, Di, h.idx_top_k, b.sel);
            b.selection = {b.sel, h.idx_top_k, h.idx_top_k, 1};
        }
    }

    // ---- MLA, absorbed: queries in latent space against [c | k_rope] rows
    std::vector<MlaSeq> seqs;
    for (const BlockSegment& s : segs) seqs.push_back({s.latent, s.first, s.n});
    mla.attend(dpos, seqs, b.selection, b.tmp);
    be.reduce_sum(b.tmp, T * E);  // tensor parallel: every rank's heads

    // ---- FFN, on the residual with the attention's output added
    be.add_rms_norm(x, b.tmp, L.ffn_norm, T, E, h.eps, b.xn);
    if (L.dense) {
        const backend::Backend::MatmulOut gu[] = {{&L.ffn_gate, b.fg, h.n_ff},
                                                  {&L.ffn_up, b.fu, h.n_ff}};
        be.matmuls(gu, b.xn, E, T);
        be.swiglu(b.fg, b.fu, T, h.n_ff, h.n_ff, 0.0f, b.fg);
        be.matmul(L.ffn_down, b.fg, h.n_ff, T, b.tmp, E);
    } else {
        // The router picks each row's experts (their ids and weights stay on the
        // backend); the routed experts run with the shared one in the same passes, or
        // where their weights are (in system RAM beside a device).
        moe_ffn(be, moe_, L.host_experts ? experts_be_ : nullptr, L.moe, b.xn, T, E, b.tmp,
                moe_overlap_);
        if (ff_split_) be.reduce_sum(b.tmp, T * E);  // tensor parallel: every rank's strip
    }
    b.ffn_pending = true;  // added to x with the next norm
}

void GlmDsaModel::commit(std::span<const SeqInput> inputs) {
    commit_inputs<DsaState>(inputs, "glm-dsa");
}

int64_t GlmDsaModel::hidden_width() const {
    return hp_.n_embd;
}

bool GlmDsaModel::can_split_before(int64_t layer) const {
    return layer >= 0 && layer < hp_.n_layer && hp_.idx_full[size_t(layer)];
}

void GlmDsaModel::forward(std::span<const SeqInput> inputs, std::vector<float>& logits,
                          const LayerSpan& span) {
    backend::Backend& be = *backend_;
    const GlmDsaHParams& h = hp_;
    const int64_t E = h.n_embd;

    // Flatten the batch: tokens, positions, and per-sequence segments.
    FlatBatch<DsaState> fb = flatten_batch<DsaState>(inputs, h.n_vocab, "glm-dsa");
    if (!fb.embeds.empty()) throw Error("glm-dsa models are text only: no image rows");
    const std::vector<int32_t>& out_rows = fb.out_rows;
    using Segment = FlatBatch<DsaState>::Segment;
    logits.clear();
    const int64_t T = fb.size();
    if (T == 0) return;
    const SpanRange sr = check_span(span, held_, "glm-dsa");
    if (!can_split_before(sr.first))
        throw Error("glm-dsa: a layer span cannot start at layer " + std::to_string(sr.first) +
                    ", which reuses the indexer selection of the layer before it");
    for (const Segment& s : fb.segs) s.state->reserve(s.n_past + s.n);

    be.reset_scratch();
    Backend::Step step(be);
    const Backend::PlanHandles plan = be.plan({fb.tokens, fb.pos, out_rows});
    const DevPtr<float> x = be.scratch(size_t(T * E));
    Buffers b(be, h, T);
    if (sr.first == 0)
        be.embed(tok_embd_, plan.tokens, T, x);
    else
        be.receive_rows(*span.rows_in, x, size_t(T * E));

    std::vector<BlockSegment> segs(fb.segs.size());
    for (int64_t il = sr.first; il < sr.end; ++il) {
        for (size_t i = 0; i < fb.segs.size(); ++i) {
            const Segment& s = fb.segs[i];
            segs[i] = {&s.state->latent(il), &s.state->keys(il), s.first, s.n};
        }
        block(layers_[size_t(il)], b, x, T, plan.pos, segs);
    }
    b.settle(be, x, T * E);
    if (!sr.head) {
        be.send_rows(*span.rows_out, x, size_t(T * E));
        step.end();
        if (span.commit)
            for (const Segment& s : fb.segs) s.state->advance(s.n);
        return;
    }

    // ---- output norm (every row when the NextN block needs the hidden
    // states) and the LM head, only for the rows that want logits
    const int64_t R = int64_t(out_rows.size());
    DevPtr<float> hn, lg;
    if (nextn_) {
        hn = be.scratch(size_t(T * E));
        be.rms_norm(x, E, output_norm_, T, E, h.eps, hn, E);
    }
    if (R > 0) {
        const DevPtr<float> xo = be.scratch(size_t(R * E));
        if (hn) {
            be.copy_rows(hn, E, plan.out_rows, R, E, xo, E);
        } else {
            be.copy_rows(x, E, plan.out_rows, R, E, xo, E);
            be.rms_norm(xo, E, output_norm_, R, E, h.eps, xo, E);
        }
        lg = be.scratch(size_t(R * h.n_vocab));
        be.matmul(output_, xo, E, R, lg, h.n_vocab);
    }
    std::vector<std::vector<float>> hidden;
    if (hn) hidden = mtp_catch_up(fb, hn);
    step.end();
    // The logits come back behind the step while the states advance.
    if (R > 0) {
        logits.resize(size_t(R * h.n_vocab));
        be.read_later(lg, logits.data(), logits.size());
    }
    if (span.commit)
        for (const Segment& s : fb.segs) s.state->advance(s.n);
    be.sync();
    if (hn) keep_rows(fb, hidden);
}

// Keeps the NextN block's cache in step with the trunk: the block's row at
// position p mixes the token at p with the trunk's hidden state at p - 1 (a
// zero row at position 0, or where that state is gone), as llama.cpp's MTP
// drafter does. A row a draft step already computed from the trunk's hidden
// state is not computed again.
std::vector<std::vector<float>> GlmDsaModel::mtp_catch_up(const FlatBatch<DsaState>& fb,
                                                          DevPtr<const float> hn) {
    backend::Backend& be = *backend_;
    const int64_t E = hp_.n_embd;
    std::vector<int32_t> tokens, pos;
    std::vector<BlockSegment> segs;
    // Each sequence's rows still to compute are the tail of its segment,
    // from i0 on: a row's hidden input is the trunk row before it (from the
    // seed kept by the previous forward for the segment's first row).
    struct Run {
        const DsaState* st;
        int64_t i0, first, n;  // segment offset, batch row, rows
        int64_t row;           // their first row in the block's input
    };
    std::vector<Run> runs;
    for (const auto& s : fb.segs) {
        DsaState& st = *s.state;
        const int64_t i0 = std::clamp<int64_t>(st.mtp_valid - s.n_past, 0, s.n);
        if (i0 == s.n) continue;
        runs.push_back({&st, i0, s.first, s.n, int64_t(tokens.size())});
        segs.push_back({&st.mtp_latent(), nullptr, int64_t(tokens.size()), s.n - i0});
        for (int64_t i = i0; i < s.n; ++i) {
            tokens.push_back(fb.tokens[size_t(s.first + i)]);
            pos.push_back(int32_t(s.n_past + i));
        }
    }
    if (!tokens.empty()) {
        const int64_t M = int64_t(tokens.size());
        const DevPtr<float> hin = be.scratch(size_t(M * E));
        for (const Run& r : runs) {
            int64_t i = r.i0, row = r.row;
            if (i == 0) {  // the seed: the trunk's row before this forward, or zeros
                const float* prev = r.st->hidden(pos[size_t(row)] - 1);
                const std::vector<float> zero(prev ? 0 : size_t(E), 0.0f);
                be.write(hin + row * E, prev ? prev : zero.data(), size_t(E));
                ++i, ++row;
            }
            be.copy_rows(hn + (r.first + i - 1) * E, E, nullptr, r.n - i, E, hin + row * E, E);
        }
        mtp_block(tokens, pos, hin, segs);
    }
    // Every row's hidden state is kept as the seed of the next draft, so a rollback to any
    // of them still finds it: read behind the step (no wait inside it).
    std::vector<std::vector<float>> rows;
    for (const auto& s : fb.segs) {
        rows.emplace_back(size_t(s.n * E));
        be.read_later(hn + s.first * E, rows.back().data(), rows.back().size());
    }
    return rows;
}

// Only a completed pass changes the states.
void GlmDsaModel::keep_rows(const FlatBatch<DsaState>& fb, std::vector<std::vector<float>>& rows) {
    for (size_t i = 0; i < fb.segs.size(); ++i) {
        const auto& s = fb.segs[i];
        s.state->keep_hidden(rows[i].data(), s.n_past, s.n);
        s.state->mtp_valid = s.n_past + s.n;
    }
}

// The NextN block over M rows: [enorm(embed(token)); hnorm(h)] through
// eh_proj, one decoder block attending densely over the block's own cache,
// and the shared head norm. Returns the normed rows (scratch, M x E).
DevPtr<float> GlmDsaModel::mtp_block(std::span<const int32_t> tokens, std::span<const int32_t> pos,
                                     DevPtr<const float> hh, std::span<const BlockSegment> segs) {
    backend::Backend& be = *backend_;
    const GlmDsaHParams& h = hp_;
    const NextN& nx = *nextn_;
    const int64_t E = h.n_embd, M = int64_t(tokens.size());
    // The block's own rows: its tokens and positions in backend memory.
    const Backend::PlanHandles plan = be.plan({tokens, pos, {}});
    const DevPtr<float> e = be.scratch(size_t(M * E));
    be.embed(nx.embed ? nx.embed : tok_embd_, plan.tokens, M, e);
    const DevPtr<float> cat = be.scratch(size_t(M * 2 * E));
    be.rms_norm(e, E, nx.enorm, M, E, h.eps, cat, 2 * E);
    be.rms_norm(hh, E, nx.hnorm, M, E, h.eps, cat + E, 2 * E);
    const DevPtr<float> x = be.scratch(size_t(M * E));
    be.matmul(nx.eh_proj, cat, 2 * E, M, x, E);
    Buffers b(be, h, M);  // no indexer: the block attends densely
    block(nx.block, b, x, M, plan.pos, segs);
    b.settle(be, x, M * E);
    be.rms_norm(x, E, nx.shared_head_norm, M, E, h.eps, x, E);
    return x;
}

void GlmDsaModel::draft(std::span<DraftRequest> reqs) {
    if (!nextn_) return Model::draft(reqs);
    backend::Backend& be = *backend_;
    const GlmDsaHParams& h = hp_;
    const int64_t E = h.n_embd, V = h.n_vocab;
    struct Chain {
        DraftRequest* r;
        DsaState* st;
        int32_t token;
        int32_t pos;
        std::vector<float> h;
    };
    std::vector<Chain> live;
    for (DraftRequest& r : reqs) {
        r.out.clear();
        auto* st = dynamic_cast<DsaState*>(r.state);
        if (!st) throw Error("glm-dsa: sequence state of another model");
        if (r.max_tokens <= 0) continue;
        if (r.token < 0 || r.token >= V) throw Error("draft: token id outside the vocabulary");
        const int64_t p = st->n_past();
        if (p + r.max_tokens > st->n_ctx()) throw Error("draft: the window passes the context");
        st->reserve(p + r.max_tokens);
        const float* hp = st->hidden(p - 1);
        Chain c{&r, st, r.token, int32_t(p), std::vector<float>(size_t(E), 0.0f)};
        if (hp) c.h.assign(hp, hp + E);
        live.push_back(std::move(c));
    }
    for (int step = 0; !live.empty(); ++step) {
        be.reset_scratch();
        Backend::Step forward(be);
        const int64_t M = int64_t(live.size());
        std::vector<int32_t> tokens, pos;
        std::vector<float> hin;
        std::vector<BlockSegment> segs;
        for (int64_t i = 0; i < M; ++i) {
            tokens.push_back(live[size_t(i)].token);
            pos.push_back(live[size_t(i)].pos);
            hin.insert(hin.end(), live[size_t(i)].h.begin(), live[size_t(i)].h.end());
            segs.push_back({&live[size_t(i)].st->mtp_latent(), nullptr, i, 1});
        }
        const DevPtr<float> hh = be.scratch(size_t(M * E));
        be.write(hh, hin.data(), hin.size());
        const DevPtr<float> hm = mtp_block(tokens, pos, hh, segs);
        const DevPtr<float> lg = be.scratch(size_t(M * V));
        be.matmul(nextn_->head ? nextn_->head : output_, hm, E, M, lg, V);
        // Greedy, with the probability of the pick among the ten most likely tokens
        // (llama.cpp's draft sampler is top-k 10), on the backend: only the picks and
        // their probabilities come back, not the logits.
        const DevPtr<int32_t> best = be.scratch_ids(size_t(M));
        const DevPtr<double> prob = be.scratch(size_t(2 * M)).as<double>();
        be.draft_pick(lg, M, V, best, prob);
        forward.end();
        std::vector<int32_t> picks(static_cast<size_t>(M));
        std::vector<double> probs(static_cast<size_t>(M));
        std::vector<float> hrows(size_t(M * E));
        be.read_later(best, picks.data(), picks.size());
        be.read_later(prob, probs.data(), probs.size());
        be.read_later(hm, hrows.data(), hrows.size());
        be.sync();
        std::vector<Chain> next;
        for (int64_t i = 0; i < M; ++i) {
            Chain& c = live[size_t(i)];
            // The first step's row mixes the trunk's own hidden state: it is
            // the row the next trunk forward would compute.
            if (step == 0) c.st->mtp_valid = std::max<int64_t>(c.st->mtp_valid, c.pos + 1);
            const int32_t best_id = picks[size_t(i)];
            if (probs[size_t(i)] < double(c.r->p_min)) continue;
            c.r->out.push_back(best_id);
            if (int(c.r->out.size()) >= c.r->max_tokens) continue;
            c.token = best_id;
            c.pos += 1;
            c.h.assign(hrows.begin() + i * E, hrows.begin() + (i + 1) * E);
            next.push_back(std::move(c));
        }
        live = std::move(next);
    }
}

}  // namespace glm5::model

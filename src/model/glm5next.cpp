// glm5next forward. Reads top to bottom as the model (docs/glm5next-format.md
// sections 5-8): embed and replicate into the hyper-connection streams; per
// block, the attention sublayer (KDA or MLA over the pooled indexer's cells)
// and the FFN sublayer, each between hc_coefficients/hc_reduce and hc_expand;
// the LM head on the stream mean. Every op runs on the backend; this file
// only wires buffers, shapes and the per-sequence state.
#include "model/glm5next.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

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
using backend::LinearOps;

namespace {

// The state of one sequence (spec section 7).
//  - per KDA layer: the q/k/v conv tails [3][K-1][di] and the delta-rule state
//    [H][D][D], F32, in one backend block so a snapshot is one copy; two such
//    blocks: a forward reads the current one and writes the other, and only a
//    forward that completes makes it current (a failed one changes nothing);
//  - per MLA layer: the latent rows (R), the indexer cell rows [key | gate]
//    and the compressed pool keys, all positional.
// Pool keys are only ever read for pools that are complete below n_past, and
// are (re)computed in the forward in which their last cell arrives: after a
// restore, a key that covered a stale cell is recomputed when its pool
// completes again, and never read before.
class NextState final : public SequenceState {
  public:
    // cell_width[il]: the indexer's cell row [key | gate] on layers with an
    // indexer, 0 elsewhere.
    // Caches and recurrent state for the layers this process holds only.
    NextState(Backend& be, const Glm5NextHParams& hp, const HeldLayers& held, CacheType type,
              int64_t n_ctx, int64_t capacity, const std::vector<int64_t>& cell_width)
        : be_(be), n_ctx_(n_ctx), pool_(hp.idx_pool) {
        layers_.resize(size_t(hp.n_layer));
        for (int64_t il = held.first; il < held.end; ++il) {
            LayerState& ls = layers_[size_t(il)];
            if (hp.is_mla[size_t(il)]) {
                const int64_t cw = cell_width[size_t(il)];
                ls.latent = CacheRows{nullptr, hp.kv_lora, type};
                ls.cells = CacheRows{nullptr, cw, type};
                ls.pools = CacheRows{nullptr, cw ? hp.idx_dim : 0, type};
            } else {
                const int64_t di = hp.n_head[size_t(il)] * hp.kda_dim;
                ls.tail_off = kda_floats_;
                ls.tail_size = 3 * (hp.conv_k - 1) * di;
                kda_floats_ += ls.tail_size;
                ls.delta_off = kda_floats_;
                kda_floats_ += hp.n_head[size_t(il)] * hp.kda_dim * hp.kda_dim;
            }
        }
        try {
            kda_ = be_.alloc_cache(kda_bytes()).as<float>();
            next_ = be_.alloc_cache(kda_bytes()).as<float>();
            resize(capacity);
        } catch (...) {
            release();
            throw;
        }
    }
    ~NextState() override { release(); }
    void release() {
        if (kda_) be_.free_cache(kda_.as<uint8_t>());
        if (next_) be_.free_cache(next_.as<uint8_t>());
        kda_ = next_ = nullptr;
        for (auto& ls : layers_)
            for (CacheRows* c : {&ls.latent, &ls.cells, &ls.pools})
                if (c->data) be_.free_cache(c->data);
    }
    int64_t n_past() const override { return n_past_; }
    int64_t n_ctx() const override { return n_ctx_; }

    void reset() override {
        // Fresh (zeroed) recurrent state; positional caches are simply reused.
        be_.free_cache(kda_.as<uint8_t>());
        kda_ = nullptr;
        kda_ = be_.alloc_cache(kda_bytes()).as<float>();
        n_past_ = 0;
        ++epoch_;
    }
    // The recurrent state cannot go back by position: only "no change" and
    // "start over" are possible.
    bool can_rewind(int64_t n) const override { return n == n_past_ || n == 0; }
    bool rewind(int64_t n) override {
        if (!can_rewind(n)) return false;
        if (n != n_past_) reset();
        return true;
    }

    struct Snapshot final : StateSnapshot {
        Backend& be;
        const NextState* owner;
        uint64_t epoch;
        int64_t n;
        DevPtr<uint8_t> kda;
        Snapshot(Backend& b, const NextState* o, uint64_t e, int64_t n_, DevPtr<uint8_t> k)
            : be(b), owner(o), epoch(e), n(n_), kda(k) {}
        ~Snapshot() override { be.free_cache(kda); }
        int64_t n_past() const override { return n; }
    };
    // Spec 8: the KDA tails and states plus the position; the positional
    // caches need no copy (rows past n_past are overwritten when re-forwarded).
    std::unique_ptr<StateSnapshot> snapshot() const override {
        const DevPtr<uint8_t> copy = be_.alloc_cache(kda_bytes());
        be_.copy_cache(copy, kda_.as<const uint8_t>(), kda_bytes(), "snapshot");
        return std::make_unique<Snapshot>(be_, this, epoch_, n_past_, copy);
    }
    void restore(const StateSnapshot& s) override {
        auto* snap = dynamic_cast<const Snapshot*>(&s);
        if (!snap || snap->owner != this) throw Error("restore: snapshot of another sequence");
        if (snap->epoch != epoch_ || snap->n > n_past_)
            throw Error("restore: the sequence was reset since the snapshot");
        be_.copy_cache(kda_.as<uint8_t>(), snap->kda, kda_bytes(), "restore");
        n_past_ = snap->n;
    }
    // The positional rows below n and the complete pools below it (as save()
    // writes them), and the KDA block of `at`, a snapshot of src at n (src's
    // own current block when n is where src stands).
    bool copy_prefix(const SequenceState& src_, int64_t n, const StateSnapshot* at) override {
        auto* src = dynamic_cast<const NextState*>(&src_);
        if (!src || src == this || n < 0 || n > src->n_past_ || n > capacity_ ||
            src->layers_.size() != layers_.size() || src->kda_floats_ != kda_floats_)
            return false;
        DevPtr<const uint8_t> kda = src->kda_.as<const uint8_t>();
        if (n != src->n_past_) {
            auto* snap = dynamic_cast<const Snapshot*>(at);
            if (!snap || snap->owner != src || snap->epoch != src->epoch_ || snap->n != n)
                return false;
            kda = snap->kda;
        }
        be_.copy_cache(kda_.as<uint8_t>(), kda, kda_bytes(), "copy_prefix");
        for (size_t i = 0; i < layers_.size(); ++i) {
            const LayerState &d = layers_[i], &s = src->layers_[i];
            copy_rows(be_, d.latent, s.latent, n);
            copy_rows(be_, d.cells, s.cells, n);
            copy_rows(be_, d.pools, s.pools, n / pool_);
        }
        n_past_ = n;
        ++epoch_;  // no snapshot taken before this applies
        return true;
    }
    size_t memory_bytes() const override {
        size_t per_row = 0, pool_rows = 0;
        for (const auto& ls : layers_) {
            per_row += ls.latent.row_bytes() + ls.cells.row_bytes();
            pool_rows += ls.pools.row_bytes();
        }
        return 2 * kda_bytes() + per_row * size_t(capacity_) +
               pool_rows * size_t((capacity_ + pool_ - 1) / pool_);
    }
    int64_t capacity() const override { return capacity_; }

    // Reallocates every positional cache to exactly `rows` positions, keeping
    // what the state holds (the engine sizes a sequence once per request:
    // caches never grow inside a forward).
    void resize(int64_t rows) override {
        check_capacity(rows, n_past_, n_ctx_);
        if (rows == capacity_) return;
        const int64_t pools = (rows + pool_ - 1) / pool_;
        std::vector<CacheResize> all;
        for (auto& ls : layers_) {
            all.push_back({&ls.latent, rows, n_past_});
            all.push_back({&ls.cells, rows, n_past_});
            all.push_back({&ls.pools, pools, n_past_ / pool_});
        }
        resize_caches(be_, all);
        capacity_ = rows;
    }
    void reserve(int64_t n) const { check_reserved(n, capacity_); }

    // The KDA tails and states (the current block) with every positional cache's
    // rows below n_past and the complete pools below it.
    void save(StateWriter& w) const override {
        w.scalar(n_past_);
        w.device(be_, kda_.as<const uint8_t>(), kda_bytes());
        for (const auto& ls : layers_) {
            w.rows(be_, ls.latent, n_past_);
            w.rows(be_, ls.cells, n_past_);
            w.rows(be_, ls.pools, n_past_ / pool_);
        }
    }
    void load(StateReader& r) override {
        const int64_t n = r.scalar();
        if (n < 0 || n > capacity_)
            throw Error("state: " + std::to_string(n) + " positions saved, room for " +
                        std::to_string(capacity_));
        r.device(be_, kda_.as<uint8_t>(), kda_bytes());
        for (const auto& ls : layers_) {
            r.rows(be_, ls.latent, n);
            r.rows(be_, ls.cells, n);
            r.rows(be_, ls.pools, n / pool_);
        }
        n_past_ = n;
        ++epoch_;  // no snapshot taken before this applies
    }
    // The forward completed: what it wrote becomes the state.
    void advance(int64_t n) {
        n_past_ += n;
        std::swap(kda_, next_);
    }

    // Where a forward reads a KDA layer's state (the current block) and where
    // it writes the new one (the other block).
    DevPtr<const float> conv_tail_in(int64_t il, int u, int64_t tail_rows_x_di) const {
        return kda_ + layers_[size_t(il)].tail_off + u * tail_rows_x_di;
    }
    DevPtr<float> conv_tail_out(int64_t il, int u, int64_t tail_rows_x_di) const {
        return next_ + layers_[size_t(il)].tail_off + u * tail_rows_x_di;
    }
    DevPtr<const float> delta_in(int64_t il) const { return kda_ + layers_[size_t(il)].delta_off; }
    DevPtr<float> delta_out(int64_t il) const { return next_ + layers_[size_t(il)].delta_off; }
    const CacheRows& latent(int64_t il) const { return layers_[size_t(il)].latent; }
    const CacheRows& cells(int64_t il) const { return layers_[size_t(il)].cells; }
    const CacheRows& pools(int64_t il) const { return layers_[size_t(il)].pools; }

  private:
    struct LayerState {
        CacheRows latent, cells, pools;
        int64_t tail_off = 0, tail_size = 0, delta_off = 0;  // in kda_, floats
    };
    size_t kda_bytes() const { return size_t(kda_floats_) * sizeof(float); }

    Backend& be_;
    int64_t n_ctx_;
    int64_t pool_;
    int64_t n_past_ = 0;
    int64_t capacity_ = 0;
    uint64_t epoch_ = 0;
    std::vector<LayerState> layers_;
    int64_t kda_floats_ = 0;
    DevPtr<float> kda_;   // the current KDA block
    DevPtr<float> next_;  // what the forward in flight writes
};

}  // namespace

// One contiguous run of the batch belonging to one sequence.
struct Glm5NextModel::Batch {
    struct Segment {
        NextState* state;
        int64_t first;  // index of its first token in the batch
        int64_t n;
        int64_t n_past;  // before this forward
    };
    std::vector<Segment> segs;
    std::vector<int32_t> pos;   // position of every token
    Backend::PlanHandles plan;  // the step's token ids, positions and logit rows, in backend memory
    int64_t T = 0;
    // Hyper-connection coefficients of the sublayer being evaluated.
    DevPtr<float> xhat, mix, pre, post, comb;
    // Work buffers, sized for the widest layer.
    DevPtr<float> w[10];
    DevPtr<float> lowrank;
};

std::unique_ptr<SequenceState> Glm5NextModel::new_state(int64_t n_ctx, int64_t capacity) {
    if (n_ctx <= 0) throw Error("context size must be positive");
    std::vector<int64_t> cells(size_t(hp_.n_layer), 0);
    for (int64_t il = 0; il < hp_.n_layer; ++il)
        if (layers_[size_t(il)].indexer)
            cells[size_t(il)] = hp_.idx_dim + layers_[size_t(il)].idx_gate_width;
    return std::make_unique<NextState>(*backend_, hp_, held_, cache_type_, n_ctx,
                                       capacity > 0 ? capacity : n_ctx, cells);
}

// The widest row any layer's work buffers hold (the forward's scratch).
Glm5NextModel::WorkWidths Glm5NextModel::work_widths() const {
    const Glm5NextHParams& h = hp_;
    WorkWidths w;
    w.width = std::max({h.n_ff, h.q_lora, h.kv_lora, h.idx_heads * h.idx_dim, 2 * h.idx_dim});
    w.width3 = w.width;
    for (const Layer& L : layers_) {
        w.heads = std::max(w.heads, L.n_head);
        if (L.mla) {
            w.width =
                std::max({w.width, L.n_head * h.k_mla, L.n_head * h.kv_lora, L.n_head * h.v_mla});
        } else {
            w.width = std::max(w.width, L.n_head * h.kda_dim);
            w.width3 = std::max(w.width3, 3 * L.n_head * h.kda_dim);
            // The decay's and the output gate's low-rank halves side by side.
            w.lowrank = std::max(w.lowrank, L.f_a.rows + (L.g_a ? L.g_a.rows : int64_t(0)));
        }
    }
    w.width3 = std::max(w.width3, w.width);
    return w;
}

StateCost Glm5NextModel::layer_cost(int64_t il) const {
    const Glm5NextHParams& h = hp_;
    const size_t es = backend::cache_elem_size(cache_type_);
    const Layer& L = layers_[size_t(il)];
    StateCost c;
    c.pool = std::max<int64_t>(1, h.idx_pool);
    if (h.is_mla[size_t(il)]) {
        c.per_token = size_t(h.kv_lora) * es;
        if (L.indexer) {
            c.per_token += size_t(h.idx_dim + L.idx_gate_width) * es;
            c.per_pool = size_t(h.idx_dim) * es;
        }
    } else {
        const size_t di = size_t(h.n_head[size_t(il)] * h.kda_dim);
        c.snapshot = (3 * size_t(h.conv_k - 1) * di + di * size_t(h.kda_dim)) * sizeof(float);
        c.fixed = 2 * c.snapshot;  // current and next (double-buffered)
    }
    return c;
}

StateCost Glm5NextModel::state_cost() const {
    StateCost c;
    c.pool = std::max<int64_t>(1, hp_.idx_pool);
    for (int64_t il = held_.first; il < held_.end; ++il) {
        const StateCost l = layer_cost(il);
        c.per_token += l.per_token;
        c.per_pool += l.per_pool;
        c.fixed += l.fixed;
        c.snapshot += l.snapshot;
    }
    return c;
}

// Mirrors forward() (an upper estimate): the streams and hyper-connection
// buffers, the ten work buffers of the widest layer, the indexer's pool
// scores (rows x depth / pool), per-thread attention scores over the visible
// cells, the MoE and matmul activation copies (at most 4 bytes a value) and
// the logits.
size_t Glm5NextModel::scratch_bytes(int64_t T, int64_t R, int64_t D) const {
    const Glm5NextHParams& h = hp_;
    const size_t E = size_t(h.n_embd), S = size_t(h.hc_streams), V = size_t(h.n_vocab);
    const size_t rows = size_t(T), depth = size_t(D);
    const WorkWidths ww = work_widths();
    const int64_t width = ww.width, width3 = ww.width3, heads = ww.heads;
    const size_t per_row = 3 * S * E + 2 * E + (2 + S) * S + 2 * S + S * S + 2 * size_t(width3) +
                           8 * size_t(width) + size_t(ww.lowrank);
    size_t b = rows * per_row * 4;
    b += size_t(R) * (S * E + E + 2 * V) * 4;  // head rows, logits, host logits
    const size_t B = size_t(std::max<int64_t>(1, h.idx_pool)), n_sel = size_t(h.n_sel_pools());
    b += rows * (n_sel + n_sel * B + B) * 4 + rows * 16;  // picks, cells, visibility
    if (depth / B > n_sel) b += rows * (depth / B) * 4;   // pool scores
    const size_t n_vis = std::min(depth, n_sel * B + B);
    b += attn_.attention_scratch_bytes(int64_t(heads), int64_t(n_vis));
    if (h.n_expert > 0)
        b += moe_scratch_bytes(T, h.n_embd, h.n_ff_exp, h.n_expert_used,
                               h.n_ff_exp * h.n_expert_shared);
    b += rows * size_t(std::max<int64_t>(width3, int64_t(E))) * 4;
    return b;
}

// (pre, post, C) of one sublayer from the streams X (spec 6.3).
void Glm5NextModel::hyper_coeffs(const Batch& b, const HyperConn& hc, DevPtr<const float> X) {
    Backend& be = *backend_;
    const int64_t S = hp_.hc_streams, SE = S * hp_.n_embd, T = b.T;
    be.rms_norm(X, SE, nullptr, T, SE, hp_.eps, b.xhat, SE);
    be.matmul(hc.fn, b.xhat, SE, T, b.mix, (2 + S) * S);
    linear_.hc_coefficients(b.mix, T, S, hc.base, hc.scale, hp_.hc_eps, hp_.hc_iters, b.pre, b.post,
                            b.comb);
}

// KDA linear attention (spec 6.4): x [T][E] normed input, out [T][E].
void Glm5NextModel::kda(const Batch& b, int64_t il, const Layer& L, DevPtr<const float> x,
                        DevPtr<float> out) {
    Backend& be = *backend_;
    const int64_t T = b.T, E = hp_.n_embd, H = L.n_head, D = hp_.kda_dim, di = H * D;
    const int64_t K = hp_.conv_k;
    DevPtr<float> raw = b.w[0];   // [3][T][di]: q, k, v projections before the conv
    DevPtr<float> qkv = b.w[1];   // [3][T][di]: after conv + SiLU
    DevPtr<float> g = b.w[2];     // [T][di] log-decay
    DevPtr<float> o = b.w[3];     // [T][di] delta-rule output
    DevPtr<float> gate = b.w[4];  // [T][di] output gate
    DevPtr<float> beta = b.w[5];  // [T][H]

    // 1. Every product of x in one op (q, k, v, beta, the decay's low-rank half and the
    // output gate's, or its full form), then the short convs of q, k and v, continuing
    // from each sequence's tail.
    const int64_t Rf = L.f_a.rows, LR = Rf + (L.g_a ? L.g_a.rows : 0);
    std::vector<Backend::MatmulOut> from_x = {{&L.wq, raw, di},
                                              {&L.wk, raw + T * di, di},
                                              {&L.wv, raw + 2 * T * di, di},
                                              {&L.beta, beta, H},
                                              {&L.f_a, b.lowrank, LR}};
    if (L.g_full)
        from_x.push_back({&L.g_full, gate, di});
    else
        from_x.push_back({&L.g_a, b.lowrank + Rf, LR});
    be.matmuls(from_x, x, E, T);
    std::vector<LinearOps::ConvSeq> cs(b.segs.size());
    for (int u = 0; u < 3; ++u) {
        DevPtr<float> r = raw + u * T * di;
        DevPtr<float> c = qkv + u * T * di;
        for (size_t i = 0; i < b.segs.size(); ++i) {
            const auto& s = b.segs[i];
            cs[i] = {r + s.first * di, s.state->conv_tail_out(il, u, (K - 1) * di),
                     c + s.first * di, s.n, s.state->conv_tail_in(il, u, (K - 1) * di)};
        }
        linear_.causal_conv(cs, di, L.conv[u], K, di, di, /*silu=*/true);
    }
    DevPtr<float> q = qkv;
    DevPtr<float> k = qkv + T * di;
    DevPtr<float> v = qkv + 2 * T * di;
    // 2. Unit-length query and key per head.
    linear_.l2_norm(q, T * H, D, hp_.eps, q);
    linear_.l2_norm(k, T * H, D, hp_.eps, k);

    // 3. Per-channel decay in (lower, 0) from the low-rank gate.
    be.matmul(L.f_b, b.lowrank, LR, T, g, di);
    linear_.bounded_decay(g, L.dt_bias, L.decay_rate.data(), T, H, D, hp_.gate_lower, g);

    // 4. Beta per head.
    linear_.apply_sigmoid(beta, T * H);

    // 5. The gated delta rule, token by token, on each sequence's state.
    std::vector<LinearOps::DeltaRuleSeq> ds(b.segs.size());
    for (size_t i = 0; i < b.segs.size(); ++i) {
        const auto& s = b.segs[i];
        const int64_t off = s.first * di;
        ds[i] = {q + off,
                 k + off,
                 v + off,
                 g + off,
                 beta + s.first * H,
                 s.state->delta_out(il),
                 o + off,
                 s.n,
                 s.state->delta_in(il)};
    }
    linear_.gated_delta_rule(ds, H, D, 1.0f / std::sqrt(float(D)));

    // 6. Output gate and the per-head RMSNorm shared by all heads.
    if (!L.g_full) be.matmul(L.g_b, b.lowrank + Rf, LR, T, gate, di);
    be.rms_norm(o, D, L.o_norm, T * H, D, hp_.eps, o, D);
    linear_.mul_sigmoid(o, gate, T * di);

    // 7. Output projection.
    be.matmul(L.wo, o, di, T, out, E);
}

// NoPE absorbed MLA over the cells the pooled indexer picks (spec 6.5, 6.6).
void Glm5NextModel::mla(const Batch& b, int64_t il, const Layer& L, DevPtr<const float> x,
                        DevPtr<float> out) {
    Backend& be = *backend_;
    const Glm5NextHParams& h = hp_;
    const int64_t T = b.T;
    const MlaBlock mla(
        be, attn_, h.mla_shape(L.n_head), L.attn,
        {.qr = b.w[0], .q = b.w[1], .kv = b.w[2], .qfull = b.w[3], .olat = b.w[4], .ov = b.w[5]},
        T);

    // Which cells each query attends to: all of them while no pool can be
    // dropped, else the picked pools plus the query's trailing partial pool (the
    // backend decides per row from the plan's positions).
    AttentionOps::Selection sel;
    if (!L.indexer) {
        mla.project(x);
    } else {
        const int64_t Di = h.idx_dim, Hi = h.idx_heads, B = h.idx_pool, Gw = L.idx_gate_width;
        const int64_t n_sel = h.n_sel_pools();
        const int64_t CW = Di + Gw;
        DevPtr<float> cellrow = b.w[6];  // [T][Di + Gw]: key | gate
        DevPtr<float> iq = b.w[7];       // [T][Hi*Di]
        DevPtr<float> iw = b.w[8];       // [T][Hi]

        // The indexer's projections go with the attention's: per-cell key and
        // gate, and the query side (every step: the op list does not depend on
        // positions, whether or not a row is past the dense limit yet).
        const bool select = !dense_attention_;
        const MlaBlock::MatmulOut from_x[] = {
            {&L.idx_kv, cellrow, CW}, {&L.idx_gate, cellrow + Di, CW}, {&L.idx_proj, iw, Hi}};
        const MlaBlock::MatmulOut from_qr[] = {{&L.idx_q_b, iq, Hi * Di}};
        mla.project(x, std::span(from_x, select ? 3 : 2), std::span(from_qr, select ? 1 : 0));

        // Cache each cell's key and gate; then the keys of the pools this
        // batch completes.
        for (const auto& s : b.segs) {
            be.cache_store(s.state->cells(il), cellrow + s.first * CW, CW, s.n,
                           b.plan.pos + s.first);
            attn_.pool_compress(s.state->cells(il), Di, Gw, B, L.idx_ape, L.idx_norm, h.eps,
                                s.state->pools(il), b.plan.pos + s.first, s.n);
        }

        // Queries past the dense limit score the complete pools; the picks
        // become cell rows on the backend (the picked pools ascending, then
        // the query's trailing partial pool).
        if (select) {
            const int64_t per_query = n_sel * B + B;
            const DevPtr<int32_t> picked = be.scratch_ids(size_t(T * n_sel));
            const DevPtr<int32_t> rows = be.scratch_ids(size_t(T * per_query));
            be.scale(iw, 1.0f / std::sqrt(float(Di * Hi)), T * Hi);
            std::vector<AttentionOps::Segment> pools;
            for (const auto& s : b.segs) pools.push_back({s.state->pools(il), s.first, s.n});
            attn_.indexer_select(iq, iw, b.plan.pos, pools, B, Hi, Di, n_sel, picked);
            attn_.pool_cells(picked, b.plan.pos, T, n_sel, B, rows, per_query);
            sel = {rows, per_query, n_sel, B};
            if (selection_hook_) {  // a diagnostic: the picks read back to the host
                std::vector<int32_t> picks(static_cast<size_t>(n_sel));
                for (const auto& s : b.segs)
                    for (int64_t i = 0; i < s.n; ++i) {
                        const int64_t t = s.first + i, n_vis = s.n_past + i + 1;
                        if (!sel.selects(n_vis)) continue;
                        be.read(picked + t * n_sel, picks.data(), picks.size());
                        selection_hook_(il, n_vis - 1, picks);
                    }
            }
        }
    }

    // Attention in latent space over the visible cache rows (width R, no rope).
    std::vector<MlaSeq> seqs;
    for (const auto& s : b.segs) seqs.push_back({&s.state->latent(il), s.first, s.n});
    mla.attend(b.plan.pos, seqs, sel, out);
}

// Dense SwiGLU (clamped with the shared-expert limit) or the MoE (spec 6.7, 6.8).
void Glm5NextModel::ffn(const Batch& b, const Layer& L, DevPtr<const float> x, DevPtr<float> out) {
    Backend& be = *backend_;
    const int64_t T = b.T, E = hp_.n_embd, F = hp_.n_ff;
    if (!L.dense) {
        // The router picks each row's experts (their ids and weights stay on the
        // backend); the routed experts run with the shared one in the same passes, or
        // where their weights are (in system RAM beside a device).
        moe_ffn(be, moe_, L.host_experts ? experts_be_ : nullptr, L.moe, x, T, E, out,
                moe_overlap_);
        return;
    }
    DevPtr<float> fg = b.w[0];
    DevPtr<float> fu = b.w[1];
    const Backend::MatmulOut gu[] = {{&L.ffn_gate, fg, F}, {&L.ffn_up, fu, F}};
    be.matmuls(gu, x, E, T);
    be.swiglu(fg, fu, T, F, F, L.dense_clamp, fg);
    be.matmul(L.ffn_down, fg, F, T, out, E);
}

void Glm5NextModel::commit(std::span<const SeqInput> inputs) {
    commit_inputs<NextState>(inputs, "glm5next");
}

int64_t Glm5NextModel::hidden_width() const {
    return hp_.hc_streams * hp_.n_embd;
}

void Glm5NextModel::forward(std::span<const SeqInput> inputs, std::vector<float>& logits,
                            const LayerSpan& span) {
    Backend& be = *backend_;
    const Glm5NextHParams& h = hp_;
    const int64_t E = h.n_embd, S = h.hc_streams, SE = S * E;

    // Flatten the batch: tokens, positions, and per-sequence segments.
    Batch b;
    FlatBatch<NextState> flat = flatten_batch<NextState>(inputs, h.n_vocab, "glm5next");
    const std::vector<int32_t>& tokens = flat.tokens;
    const std::vector<int32_t>& out_rows = flat.out_rows;
    b.pos = std::move(flat.pos);
    for (const auto& s : flat.segs) b.segs.push_back({s.state, s.first, s.n, s.n_past});
    logits.clear();
    const int64_t T = b.T = int64_t(tokens.size());
    if (T == 0) return;
    const SpanRange sr = check_span(span, held_, "glm5next");
    for (const auto& s : b.segs) s.state->reserve(s.n_past + s.n);

    // Scratch: the streams (twice, for hc_expand), the sublayer input/output,
    // the hyper-connection coefficients and work buffers for the widest layer.
    be.reset_scratch();
    Backend::Step step(be);
    b.plan = be.plan({tokens, b.pos, out_rows});
    DevPtr<float> X = be.scratch(size_t(T * SE));
    DevPtr<float> Xnext = be.scratch(size_t(T * SE));
    DevPtr<float> x = be.scratch(size_t(T * E));
    DevPtr<float> sub = be.scratch(size_t(T * E));
    b.xhat = be.scratch(size_t(T * SE));
    b.mix = be.scratch(size_t(T * (2 + S) * S));
    b.pre = be.scratch(size_t(T * S));
    b.post = be.scratch(size_t(T * S));
    b.comb = be.scratch(size_t(T * S * S));
    // (w[0] and w[1] hold the three KDA projections side by side.)
    const WorkWidths ww = work_widths();
    for (size_t i = 0; i < std::size(b.w); ++i)
        b.w[i] = be.scratch(size_t(T * (i < 2 ? ww.width3 : ww.width)));
    b.lowrank = be.scratch(size_t(T * ww.lowrank));

    // Embed, put image rows in place of their placeholders (spec 12.5: after
    // the lookup, before the streams), and replicate into the S streams.
    if (sr.first == 0) {
        be.embed(tok_embd_, b.plan.tokens, T, x);
        for (const auto& e : flat.embeds) be.write(x + e.row * E, e.rows, size_t(e.n * E));
        for (int64_t s = 0; s < S; ++s) be.copy_rows(x, E, nullptr, T, E, X + s * E, SE);
    } else {
        be.receive_rows(*span.rows_in, X, size_t(T * SE));
    }

    for (int64_t il = sr.first; il < sr.end; ++il) {
        const Layer& L = layers_[size_t(il)];

        // ---- attention sublayer between the hyper-connections
        hyper_coeffs(b, L.hc_attn, X);
        linear_.hc_reduce(X, b.pre, T, S, E, x);
        be.rms_norm(x, E, L.attn_norm, T, E, h.eps, x, E);
        if (L.mla)
            mla(b, il, L, x, sub);
        else
            kda(b, il, L, x, sub);
        be.reduce_sum(sub, T * E);  // tensor parallel: every rank's heads
        linear_.hc_expand(X, sub, b.post, b.comb, T, S, E, Xnext);
        std::swap(X, Xnext);

        // ---- FFN sublayer
        hyper_coeffs(b, L.hc_ffn, X);
        linear_.hc_reduce(X, b.pre, T, S, E, x);
        be.rms_norm(x, E, L.ffn_norm, T, E, h.eps, x, E);
        ffn(b, L, x, sub);
        if (ff_split_ && !L.dense) be.reduce_sum(sub, T * E);  // every rank's expert strips
        linear_.hc_expand(X, sub, b.post, b.comb, T, S, E, Xnext);
        std::swap(X, Xnext);
    }

    if (!sr.head) {
        be.send_rows(*span.rows_out, X, size_t(T * SE));
        step.end();
        if (span.commit)
            for (const auto& s : b.segs) s.state->advance(s.n);
        return;
    }

    // ---- LM head on the unweighted stream mean, only for the rows that want logits
    const int64_t R = int64_t(out_rows.size());
    if (R == 0) {
        step.end();
        if (span.commit)
            for (const auto& s : b.segs) s.state->advance(s.n);
        return;
    }
    DevPtr<float> Xo = be.scratch(size_t(R * SE));
    be.copy_rows(X, SE, b.plan.out_rows, R, SE, Xo, SE);
    DevPtr<float> xo = be.scratch(size_t(R * E));
    linear_.hc_reduce(Xo, nullptr, R, S, E, xo);
    be.rms_norm(xo, E, output_norm_, R, E, h.eps, xo, E);
    DevPtr<float> lg = be.scratch(size_t(R * h.n_vocab));
    be.matmul(output_, xo, E, R, lg, h.n_vocab);
    step.end();
    // The logits come back behind the step while the states advance.
    logits.resize(size_t(R * h.n_vocab));
    be.read_later(lg, logits.data(), logits.size());
    if (span.commit)
        for (const auto& s : b.segs) s.state->advance(s.n);
    be.sync();
}

}  // namespace glm5::model

// glm-dsa forward. Reads top to bottom as the model: attention norm, q/kv
// projections, the lightning indexer, absorbed MLA, then the dense or MoE FFN.
// Every op runs on the backend; this file only wires buffers and shapes.
#include "model/glm_dsa.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/batch.h"

namespace glm5::model {

using backend::CacheRows;
using backend::CacheType;

namespace {

// Per-sequence caches: for every trunk layer one MLA latent row
// [kv_lora | k_rope] per token, and on full indexer layers one indexer key row.
// Everything is indexed by position, so rewinding is just moving n_past.
class DsaState final : public SequenceState {
  public:
    DsaState(backend::Backend& be, const GlmDsaHParams& hp, CacheType type, int64_t n_ctx)
        : be_(be), type_(type), n_ctx_(n_ctx) {
        for (int64_t il = 0; il < hp.n_layer; ++il) {
            latent_.push_back(CacheRows{nullptr, hp.kv_lora + hp.n_rot, type});
            keys_.push_back(CacheRows{nullptr, hp.idx_full[size_t(il)] ? hp.idx_dim : 0, type});
        }
    }
    ~DsaState() override { release(); }

    int64_t n_past() const override { return n_past_; }
    int64_t n_ctx() const override { return n_ctx_; }
    void reset() override { n_past_ = 0; }
    bool can_rewind(int64_t n) const override { return n >= 0 && n <= n_past_; }
    bool rewind(int64_t n) override {
        if (!can_rewind(n)) return false;
        n_past_ = n;
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
        n_past_ = snap->n;
    }
    size_t memory_bytes() const override {
        size_t per_row = 0;
        for (size_t i = 0; i < latent_.size(); ++i)
            per_row += latent_[i].row_bytes() + keys_[i].row_bytes();
        return per_row * size_t(capacity_);
    }

    // Grows every cache to hold at least n rows (doubling, capped at n_ctx).
    void reserve(int64_t n) {
        if (n <= capacity_) return;
        int64_t cap = std::max<int64_t>(capacity_ ? capacity_ : 256, 256);
        while (cap < n) cap *= 2;
        cap = std::min(cap, n_ctx_);
        auto grow = [&](CacheRows& c) {
            if (c.width == 0) return;
            uint8_t* fresh = be_.alloc_cache(c.row_bytes() * size_t(cap));
            if (c.data) {
                be_.copy_cache(fresh, c.data, c.row_bytes() * size_t(n_past_));
                be_.free_cache(c.data);
            }
            c.data = fresh;
        };
        for (auto& c : latent_) grow(c);
        for (auto& c : keys_) grow(c);
        capacity_ = cap;
    }

    void advance(int64_t n) { n_past_ += n; }
    const CacheRows& latent(int64_t il) const { return latent_[size_t(il)]; }
    const CacheRows& keys(int64_t il) const { return keys_[size_t(il)]; }

  private:
    void release() {
        for (auto& c : latent_)
            if (c.data) be_.free_cache(c.data);
        for (auto& c : keys_)
            if (c.data) be_.free_cache(c.data);
    }

    backend::Backend& be_;
    CacheType type_;
    int64_t n_ctx_;
    int64_t n_past_ = 0;
    int64_t capacity_ = 0;
    std::vector<CacheRows> latent_, keys_;
};

}  // namespace

std::unique_ptr<SequenceState> GlmDsaModel::new_state(int64_t n_ctx) {
    if (n_ctx <= 0) throw Error("context size must be positive");
    return std::make_unique<DsaState>(*backend_, hp_, cache_type_, n_ctx);
}

void GlmDsaModel::forward(std::span<const SeqInput> inputs, std::vector<float>& logits) {
    backend::Backend& be = *backend_;
    const GlmDsaHParams& h = hp_;
    const int64_t E = h.n_embd, H = h.n_head;
    const int64_t W = h.kv_lora + h.n_rot;  // latent cache row: [c | k_rope]
    const int64_t Di = h.idx_dim, Hi = h.idx_heads;

    // Flatten the batch: tokens, positions, and per-sequence segments.
    FlatBatch<DsaState> b = flatten_batch<DsaState>(inputs, h.n_vocab, "glm-dsa");
    const std::vector<int32_t>& tokens = b.tokens;
    const std::vector<int32_t>& pos = b.pos;
    const std::vector<int32_t>& out_rows = b.out_rows;
    const auto& segs = b.segs;
    using Segment = FlatBatch<DsaState>::Segment;
    logits.clear();
    const int64_t T = b.size();
    if (T == 0) return;
    for (const Segment& s : segs) s.state->reserve(s.n_past + s.n);

    be.reset_scratch();
    float* x = be.scratch(size_t(T * E));
    float* xn = be.scratch(size_t(T * E));
    float* qr = be.scratch(size_t(T * h.q_lora));
    float* q = be.scratch(size_t(T * H * h.k_mla));
    float* kv = be.scratch(size_t(T * W));
    float* qfull = be.scratch(size_t(T * H * W));
    float* olat = be.scratch(size_t(T * H * h.kv_lora));
    float* ov = be.scratch(size_t(T * H * h.v_mla));
    float* tmp = be.scratch(size_t(T * E));
    float* iq = be.scratch(size_t(T * Hi * Di));
    float* ik = be.scratch(size_t(T * Di));
    float* iw = be.scratch(size_t(T * Hi));
    const int64_t F = std::max(h.n_ff, h.n_ff_exp);
    float* fg = be.scratch(size_t(T * F));
    float* fu = be.scratch(size_t(T * F));

    // The indexer's selection (top_k rows per token), reused by shared layers.
    std::vector<int32_t> sel(static_cast<size_t>(T * h.idx_top_k));
    std::vector<backend::Visible> visible(static_cast<size_t>(T));

    be.embed(tok_embd_, tokens, x);

    for (int64_t il = 0; il < h.n_layer; ++il) {
        const Layer& L = layers_[size_t(il)];

        // ---- attention input: the projections of the normed row (one op),
        // the query latent and what the query latent feeds.
        be.rms_norm(x, E, L.attn_norm, T, E, h.eps, xn, E);
        // (The indexer's projections, last in each list, only on full layers.)
        const backend::Backend::MatmulOut from_xn[] = {
            {&L.q_a, qr, h.q_lora}, {&L.kv_a, kv, W}, {&L.idx_k, ik, Di}, {&L.idx_proj, iw, Hi}};
        be.matmuls(std::span(from_xn, L.full ? 4 : 2), xn, E, T);
        be.rms_norm(qr, h.q_lora, L.q_a_norm, T, h.q_lora, h.eps, qr, h.q_lora);
        const backend::Backend::MatmulOut from_qr[] = {{&L.q_b, q, H * h.k_mla},
                                                       {&L.idx_q_b, iq, Hi * Di}};
        be.matmuls(std::span(from_qr, L.full ? 2 : 1), qr, h.q_lora, T);

        // ---- lightning indexer (full layers): which cached tokens each query sees
        if (L.full) {
            be.rope(iq, T, Hi * Di, Hi, Di, h.n_rot, pos.data(), h.freq_base);
            be.layer_norm(ik, L.idx_k_norm, L.idx_k_norm_b, T, Di, 0.0f, ik);
            be.rope(ik, T, Di, 1, Di, h.n_rot, pos.data(), h.freq_base);
            be.hadamard(iq, T * Hi, Di);
            be.hadamard(ik, T, Di);
            for (const Segment& s : segs)
                be.cache_store(s.state->keys(il), ik + s.first * Di, Di, s.n, pos.data() + s.first);
            be.scale(iw, 1.0f / std::sqrt(float(Di * Hi)), T * Hi);

            // While a query sees no more than top_k tokens it keeps them all.
            std::vector<backend::Backend::IndexerQuery> queries;
            for (const Segment& s : segs) {
                for (int64_t i = 0; i < s.n; ++i) {
                    const int64_t t = s.first + i;
                    const int32_t n_vis = pos[size_t(t)] + 1;
                    if (n_vis <= h.idx_top_k || dense_attention_) {
                        visible[size_t(t)] = backend::Visible{n_vis, nullptr, 0};
                        continue;
                    }
                    int32_t* rows = sel.data() + t * h.idx_top_k;
                    queries.push_back(
                        {iq + t * Hi * Di, iw + t * Hi, s.state->keys(il), n_vis, rows});
                    visible[size_t(t)] = backend::Visible{0, rows, int32_t(h.idx_top_k)};
                }
            }
            if (!queries.empty()) be.indexer_select(queries, Hi, Di, h.idx_top_k);
        }

        // ---- MLA, absorbed: queries in latent space against [c | k_rope] rows
        be.rms_norm(kv, W, L.kv_a_norm, T, h.kv_lora, h.eps, kv, W);
        be.rope(kv + h.kv_lora, T, W, 1, h.n_rot, h.n_rot, pos.data(), h.freq_base);
        for (const Segment& s : segs)
            be.cache_store(s.state->latent(il), kv + s.first * W, W, s.n, pos.data() + s.first);

        be.rope(q + h.nope, T, H * h.k_mla, H, h.k_mla, h.n_rot, pos.data(), h.freq_base);
        // q_abs = K_b[h] . q_nope[h] fills the latent part; q_rope is appended.
        be.matmul_slices(L.k_b, q, H * h.k_mla, h.k_mla, T, qfull, H * W, W);
        be.copy_rows(q + h.nope, h.k_mla, nullptr, T * H, h.n_rot, qfull + h.kv_lora, W);

        std::vector<backend::Backend::AttentionQuery> aq(static_cast<size_t>(T));
        for (const Segment& s : segs)
            for (int64_t i = 0; i < s.n; ++i) {
                const int64_t t = s.first + i;
                aq[size_t(t)] = {qfull + t * H * W, s.state->latent(il), visible[size_t(t)],
                                 olat + t * H * h.kv_lora};
            }
        be.mla_attention(aq, H, h.kv_lora, 1.0f / std::sqrt(float(h.k_mla)));

        // Decompress each head's latent output with V_b[h], then project out.
        be.matmul_slices(L.v_b, olat, H * h.kv_lora, h.kv_lora, T, ov, H * h.v_mla, h.v_mla);
        be.matmul(L.wo, ov, H * h.v_mla, T, tmp, E);
        be.add(x, tmp, T * E);

        // ---- FFN
        be.rms_norm(x, E, L.ffn_norm, T, E, h.eps, xn, E);
        if (L.dense) {
            const backend::Backend::MatmulOut gu[] = {{&L.ffn_gate, fg, h.n_ff},
                                                      {&L.ffn_up, fu, h.n_ff}};
            be.matmuls(gu, xn, E, T);
            be.swiglu(fg, fu, T, h.n_ff, h.n_ff, 0.0f, fg);
            be.matmul(L.ffn_down, fg, h.n_ff, T, tmp, E);
        } else {
            be.moe(L.moe, xn, T, tmp);
        }
        be.add(x, tmp, T * E);
    }

    // ---- output norm and LM head, only for the rows that want logits
    const int64_t R = int64_t(out_rows.size());
    if (R == 0) {
        for (const Segment& s : segs) s.state->advance(s.n);
        return;
    }
    float* xo = be.scratch(size_t(R * E));
    be.copy_rows(x, E, out_rows.data(), R, E, xo, E);
    be.rms_norm(xo, E, output_norm_, R, E, h.eps, xo, E);
    float* lg = be.scratch(size_t(R * h.n_vocab));
    be.matmul(output_, xo, E, R, lg, h.n_vocab);
    logits.resize(size_t(R * h.n_vocab));
    be.read(lg, logits.data(), logits.size());

    for (const Segment& s : segs) s.state->advance(s.n);
}

}  // namespace glm5::model

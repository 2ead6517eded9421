// glm5next (GLM-5.3-Flash): KDA linear-attention layers with a recurrent
// per-sequence state, NoPE absorbed MLA layers over the cells picked by a
// pooled indexer, 4-stream Sinkhorn hyper-connections around every sublayer,
// clamped SwiGLU everywhere, and the sigmoid-routed MoE of glm-dsa.
// Normative description: docs/glm5next-format.md.
#pragma once

#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/attention_ops.h"
#include "backend/linear_ops.h"
#include "backend/moe_ops.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/weights.h"

namespace glm5::model {

struct Glm5NextHParams {
    int64_t n_layer_all = 0;  // block_count: trunk + NextN
    int64_t n_nextn = 0;
    int64_t n_layer = 0;  // trunk
    int64_t n_embd = 0;
    int64_t n_vocab = 0;
    int64_t n_ctx_train = 0;
    float eps = 1e-6f;
    // Per block (NextN blocks included).
    std::vector<int64_t> n_head;     // KDA heads or MLA query heads
    std::vector<bool> is_mla;        // head_count_kv: 0 = KDA, 1 = MLA
    std::vector<float> clamp_exp;    // SwiGLU clamp of the routed experts
    std::vector<float> clamp_shexp;  // of the shared expert and the dense FFN
    // MLA (NoPE)
    int64_t q_lora = 0;
    int64_t kv_lora = 0;  // R: cache row width
    int64_t k_mla = 0;    // Dq: softmax scale 1/sqrt(Dq)
    int64_t v_mla = 0;    // Dv
    // Pooled indexer
    int64_t idx_heads = 0;
    int64_t idx_dim = 0;
    int64_t idx_top_k = 0;  // in cells, a multiple of idx_pool
    int64_t idx_pool = 0;   // B: cells per pool
    // KDA
    int64_t conv_k = 0;
    int64_t kda_dim = 0;
    float gate_lower = 0.0f;  // < 0
    // Hyper-connections
    int64_t hc_streams = 0;
    int64_t hc_iters = 0;
    float hc_eps = 0.0f;
    // FFN / MoE
    int64_t n_dense = 0;
    int64_t n_ff = 0;
    int64_t n_ff_exp = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t n_expert_shared = 0;
    bool expert_norm = false;
    float expert_scale = 1.0f;

    int64_t n_sel_pools() const { return idx_top_k / idx_pool; }
    // An MLA layer's sizes with n_head heads (the file's, or a rank's): NoPE.
    MlaShape mla_shape(int64_t n_head) const {
        return {n_head, q_lora, kv_lora, k_mla, v_mla, /*n_rot=*/0, /*freq_base=*/0.0f, eps};
    }

    // Reads and validates the glm5next.* keys; throws naming the key and the rule.
    static Glm5NextHParams from_gguf(const gguf::File& f);
};

class Glm5NextModel final : public Model {
  public:
    Glm5NextModel(const gguf::File& f, backend::Backend& be, const LoadOptions& opt);

    std::unique_ptr<SequenceState> new_state(int64_t n_ctx, int64_t capacity = 0) override;
    StateCost state_cost() const override;
    StateCost layer_cost(int64_t il) const override;
    size_t scratch_bytes(int64_t rows, int64_t logit_rows, int64_t depth) const override;
    void place_experts(const std::vector<bool>& host) override;
    using Model::forward;
    void forward(std::span<const SeqInput> inputs, std::vector<float>& logits,
                 const LayerSpan& span) override;
    void commit(std::span<const SeqInput> inputs) override;
    int64_t hidden_width() const override;

    const Glm5NextHParams& hparams() const { return hp_; }

    // Diagnostics: called for every query that takes the sparse path with
    // the trunk layer, the query position and the picked pools (ascending).
    using SelectionHook =
        std::function<void(int64_t layer, int32_t pos, std::span<const int32_t> pools)>;
    void set_selection_hook(SelectionHook hook) { selection_hook_ = std::move(hook); }

  private:
    struct HyperConn {
        backend::Weight fn;  // {S*E, (2+S)*S}
        const float* base = nullptr;
        const float* scale = nullptr;
    };
    struct Layer {
        bool mla = false;
        int64_t n_head = 0;
        HyperConn hc_attn, hc_ffn;
        const float* attn_norm = nullptr;
        const float* ffn_norm = nullptr;
        // KDA
        backend::Weight wq, wk, wv, wo;
        const float* conv[3] = {nullptr, nullptr, nullptr};  // q, k, v taps [di][K]
        backend::Weight f_a, f_b, beta, g_a, g_b, g_full;
        const float* dt_bias = nullptr;
        std::vector<float> decay_rate;  // A_h = -ssm_a[h] > 0
        const float* o_norm = nullptr;
        // MLA
        MlaWeights attn;
        // Pooled indexer (trunk MLA layers)
        bool indexer = false;
        backend::Weight idx_q_b, idx_proj, idx_kv, idx_gate;
        int64_t idx_gate_width = 0;  // idx_dim or 1
        const float* idx_ape = nullptr;
        const float* idx_norm = nullptr;
        // FFN
        bool dense = false;
        backend::Weight ffn_gate, ffn_up, ffn_down;
        float dense_clamp = 0.0f;
        backend::MoeWeights moe;
        bool host_experts = false;  // routed experts on experts_be_ (in system RAM)
    };
    struct NextN : NextNMix {
        Layer block;
    };

    struct Batch;  // the flattened batch of one forward (glm5next.cpp)

    void load_layer(int64_t il, Layer& L, bool with_indexer);
    // The work buffers' widths: widest layer, the three KDA projections side
    // by side, the low-rank gates; and the most heads of a layer.
    struct WorkWidths {
        int64_t width = 0, width3 = 0, lowrank = 1, heads = 1;
    };
    WorkWidths work_widths() const;
    // A small table the ops read as floats (conv taps, slot embeddings), in
    // any storage type; checked against its shape.
    const float* load_floats(const std::string& name, std::initializer_list<int64_t> ne);
    void hyper_coeffs(const Batch& b, const HyperConn& hc, backend::DevPtr<const float> X);
    void kda(const Batch& b, int64_t il, const Layer& L, backend::DevPtr<const float> x,
             backend::DevPtr<float> out);
    void mla(const Batch& b, int64_t il, const Layer& L, backend::DevPtr<const float> x,
             backend::DevPtr<float> out);
    void ffn(const Batch& b, const Layer& L, backend::DevPtr<const float> x,
             backend::DevPtr<float> out);

    Glm5NextHParams hp_;
    backend::CacheType cache_type_;
    bool dense_attention_ = false;
    const gguf::File& file_;
    // Tensor parallelism: the ranks sharing every layer's heads (hp_.n_head
    // holds this rank's counts, full_heads_ the file's) and the experts'
    // hidden units (when split).
    std::vector<int64_t> full_heads_;
    int tp_size_ = 1, tp_rank_ = 0;
    bool ff_split_ = false;
    int64_t ff_first_ = 0, ff_local_ = 0;
    HeldLayers held_;  // the layers this process holds (a layer split)
    // Computes the routed experts of the layers flagged host_experts (in system RAM
    // beside a device); with one, every routed expert is loaded as stored.
    backend::Backend* experts_be_ = nullptr;
    bool moe_overlap_ = true;  // LoadOptions::moe_overlap
    // The op families the forward is written in beside the core (refused at load when
    // the backend lacks one).
    backend::AttentionOps& attn_;
    backend::LinearOps& linear_;
    backend::MoeOps& moe_;
    TensorSource tensors_;
    backend::Weight tok_embd_, output_;
    const float* output_norm_ = nullptr;
    std::vector<Layer> layers_;
    std::unique_ptr<NextN> nextn_;
    SelectionHook selection_hook_;
    std::deque<std::vector<float>> converted_;  // tables stored in another type than F32
};

}  // namespace glm5::model

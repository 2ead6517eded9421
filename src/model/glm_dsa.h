// glm-dsa (GLM-5.2 / GLM-5.3): absorbed MLA, the DSA lightning indexer with
// full and shared layers, sigmoid-routed MoE with a shared expert, leading
// dense layers, and a trailing NextN/MTP block.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/attention_ops.h"
#include "backend/moe_ops.h"
#include "model/batch.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/weights.h"

namespace glm5::model {

struct GlmDsaHParams {
    int64_t n_layer_all = 0;  // block_count: trunk + NextN
    int64_t n_nextn = 0;
    int64_t n_layer = 0;  // trunk
    int64_t n_embd = 0;
    int64_t n_head = 0;
    int64_t q_lora = 0;
    int64_t kv_lora = 0;
    int64_t k_mla = 0;  // nope + rope per head (softmax scale 1/sqrt(k_mla))
    int64_t v_mla = 0;
    int64_t n_rot = 0;
    int64_t nope = 0;
    float freq_base = 10000.0f;
    float eps = 1e-6f;
    int64_t n_dense = 0;  // leading dense layers
    int64_t n_ff = 0;
    int64_t n_ff_exp = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t n_expert_shared = 0;
    bool expert_norm = false;
    float expert_scale = 1.0f;
    int64_t idx_heads = 0;
    int64_t idx_dim = 0;
    int64_t idx_top_k = 0;
    std::vector<bool> idx_full;  // per trunk layer
    int64_t n_ctx_train = 0;
    int64_t n_vocab = 0;

    // The attention's sizes with n_head heads (the file's, or a rank's).
    MlaShape mla_shape(int64_t n_head) const {
        return {n_head, q_lora, kv_lora, k_mla, v_mla, n_rot, freq_base, eps};
    }

    // Reads and validates the glm-dsa.* keys; throws naming the key.
    static GlmDsaHParams from_gguf(const gguf::File& f);
};

class GlmDsaModel final : public Model {
  public:
    GlmDsaModel(const gguf::File& f, backend::Backend& be, const LoadOptions& opt);

    std::unique_ptr<SequenceState> new_state(int64_t n_ctx, int64_t capacity = 0) override;
    StateCost state_cost() const override;
    StateCost layer_cost(int64_t il) const override;
    size_t scratch_bytes(int64_t rows, int64_t logit_rows, int64_t depth) const override;
    using Model::forward;
    void forward(std::span<const SeqInput> inputs, std::vector<float>& logits,
                 const LayerSpan& span) override;
    void commit(std::span<const SeqInput> inputs) override;
    int64_t hidden_width() const override;
    bool can_split_before(int64_t layer) const override;
    bool can_draft() const override { return nextn_ != nullptr; }
    void place_experts(const std::vector<bool>& host) override;
    void draft(std::span<DraftRequest> reqs) override;

    const GlmDsaHParams& hparams() const { return hp_; }
    backend::CacheType cache_type() const { return cache_type_; }

  private:
    struct Layer {
        const float* attn_norm = nullptr;
        MlaWeights attn;
        // Lightning indexer (full layers only).
        bool full = false;
        backend::Weight idx_q_b, idx_k, idx_proj;
        const float* idx_k_norm = nullptr;
        const float* idx_k_norm_b = nullptr;
        const float* ffn_norm = nullptr;
        // Dense FFN, or MoE.
        backend::Weight ffn_gate, ffn_up, ffn_down;
        backend::MoeWeights moe;
        bool dense = false;
        bool host_experts = false;  // routed experts on experts_be_ (in system RAM)
    };
    struct NextN : NextNMix {
        Layer block;
        // Its own embedding / LM head when the file carries them (else the trunk's).
        backend::Weight embed, head;
    };
    class DsaState;
    struct Buffers;
    // One sequence's rows of a block: where its caches are, and its rows.
    struct BlockSegment {
        const backend::CacheRows* latent;
        const backend::CacheRows* keys;  // indexer keys (full layers only)
        int64_t first, n;
    };

    void load_layer(TensorSource& ts, int64_t il, Layer& L, bool with_indexer);
    // dpos: every row's position, in the step's plan (the ops read it there, and
    // decide from it what each row sees).
    void block(const Layer& L, Buffers& b, backend::DevPtr<float> x, int64_t T,
               backend::DevPtr<const int32_t> dpos, std::span<const BlockSegment> segs);
    // Returns each segment's hidden rows, read behind the step (the host has them after the
    // backend's sync), for keep_rows.
    std::vector<std::vector<float>> mtp_catch_up(const FlatBatch<DsaState>& fb,
                                                 backend::DevPtr<const float> hn);
    void keep_rows(const FlatBatch<DsaState>& fb, std::vector<std::vector<float>>& rows);
    backend::DevPtr<float> mtp_block(std::span<const int32_t> tokens, std::span<const int32_t> pos,
                                     backend::DevPtr<const float> hh,
                                     std::span<const BlockSegment> segs);

    GlmDsaHParams hp_;
    backend::CacheType cache_type_;
    bool dense_attention_ = false;
    // Tensor parallelism: the ranks sharing the heads, and this rank's heads.
    int tp_size_ = 1, tp_rank_ = 0;
    int64_t n_head_local_ = 0, head_first_ = 0;
    // ... and the routed experts' hidden units (when they are split).
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
    backend::MoeOps& moe_;
    TensorSource tensors_;
    backend::Weight tok_embd_, output_;
    const float* output_norm_ = nullptr;
    std::vector<Layer> layers_;
    std::unique_ptr<NextN> nextn_;
};

}  // namespace glm5::model

// glm5next (GLM-5.3-Flash) hyperparameters for the synthetic model generator
// (generator.h, GenOptions::arch = Arch::Glm5Next). The layout follows
// docs/glm5next-format.md sections 3-4; "tiny" is the shape of
// tests/data/glm5next/tiny.gguf (with the generator's 768-token GLM vocabulary),
// "bench" a realistically shaped model in GLM-5.3-Flash's proportions whose
// decode reads about as many weight bytes per token as glm-dsa's bench model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glm5::synth {

struct Layout;

struct Glm5NextHParams {
    int64_t n_vocab = 768;
    int64_t n_embd = 64;
    int64_t n_layer = 8;    // trunk layers (block_count = n_layer + n_nextn)
    int64_t n_nextn = 1;    // appended NextN block: 0 or 1
    int64_t mla_every = 4;  // trunk layer il is MLA when il % mla_every == mla_every - 1
    int64_t n_dense = 1;    // leading dense (SwiGLU) layers
    int64_t n_ff = 96;
    int64_t n_expert = 16;
    int64_t n_expert_used = 4;
    int64_t n_expert_shared = 1;
    int64_t n_ff_exp = 32;
    // KDA
    int64_t kda_heads = 4;
    int64_t kda_dim = 16;
    int64_t kda_rank = 16;  // low-rank width of the decay and output gates
    int64_t conv_k = 4;
    float gate_lower = -5.0f;
    // MLA (NoPE) and the pooled indexer
    int64_t mla_heads = 4;
    int64_t q_lora = 32;
    int64_t kv_lora = 32;
    int64_t k_mla = 16;
    int64_t v_mla = 16;
    int64_t idx_heads = 8;
    int64_t idx_dim = 16;
    int64_t idx_top_k = 16;  // cells, a multiple of idx_pool
    int64_t idx_pool = 4;
    // Hyper-connections
    int64_t hc = 4;
    int64_t hc_iters = 20;
    float hc_eps = 1e-6f;
    // Per-block clamp limits: base + step * block (the fixture's small ones).
    float clamp_exp = 1.5f;
    float clamp_shexp = 1.25f;
    float clamp_step = 0.05f;
    int64_t n_ctx_train = 4096;
    float rms_eps = 1e-5f;
    float expert_weights_scale = 2.5f;
    bool expert_weights_norm = true;

    bool is_mla(int64_t il) const { return il >= n_layer || il % mla_every == mla_every - 1; }

    // "tiny": the glm5next fixture's shape; "bench": see glm5next.cpp.
    // Throws glm5::Error for another name.
    static Glm5NextHParams preset(std::string_view name);
    static std::vector<std::string> preset_names();
    // The --type a preset uses unless told otherwise (tiny F32, bench Q4_K_M).
    static std::string preset_default_type(std::string_view name);
    // Throws glm5::Error naming the first value the glm5next loader would refuse.
    void validate() const;
};

// Metadata keys and tensors in the fixture's order.
Layout build_glm5next_layout(const Glm5NextHParams& hp);

}  // namespace glm5::synth

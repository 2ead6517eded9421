// The glm5next layout for the synthetic model generator: metadata and tensors
// as docs/glm5next-format.md sections 3-4 describe them and as
// tests/data/glm5next/tiny.gguf carries them, with weight statistics like the
// fixture's (matrices 1/sqrt(fan_in), negative decay rates, a negative decay
// bias, hyper-connection bases and scales around 0 and 1).
#include "synth/glm5next.h"

#include <cmath>

#include "core/error.h"
#include "synth/layout.h"
#include "synth/vocab.h"

namespace glm5::synth {

Glm5NextHParams Glm5NextHParams::preset(std::string_view name) {
    Glm5NextHParams h;  // the defaults are the fixture's tiny model
    if (name == "tiny") return h;
    if (name == "bench") {
        // GLM-5.3-Flash (hidden 4096, 64 KDA heads of 128, NoPE MLA with a
        // 512 latent and 256-wide heads, pooled indexer top-2048 in pools of
        // 4, 4 hyper-connection streams, SwiGLU clamp 10, 288 experts top-8 +
        // 1 shared) scaled as glm-dsa's bench preset scales GLM-5.2: per-head
        // and per-cell dims stay (the shapes the kernels see), the width drops
        // to about a third (rounded up to whole 256-blocks), head and expert
        // counts to a quarter, the experts stay small (a third of the width,
        // GLM-5.2's ratio: two 256-blocks). Where the format leaves a value to
        // the file (MLA heads, q_lora, the indexer's heads and key length),
        // glm-dsa bench's is taken. 24 trunk layers (18 KDA, 6 MLA) make
        // decode read about as many weight bytes per token as glm-dsa bench
        // (decode_bytes_per_token: 593 against 633 MB at Q4_K_M), so that the
        // two benchmarks load the memory alike.
        h.n_vocab = 32768;
        h.n_embd = 1536;
        h.n_layer = 24;
        h.mla_every = 4;  // MLA at trunk layers 3, 7, 11, ...
        h.n_dense = 1;
        h.n_ff = 4608;
        h.n_expert = 72;
        h.n_expert_used = 8;
        h.n_expert_shared = 1;
        h.n_ff_exp = 512;
        h.kda_heads = 16;
        h.kda_dim = 128;
        h.kda_rank = 128;
        h.conv_k = 4;
        h.mla_heads = 16;
        h.q_lora = 768;
        h.kv_lora = 512;
        h.k_mla = 256;
        h.v_mla = 256;
        h.idx_heads = 8;
        h.idx_dim = 128;
        h.idx_top_k = 2048;
        h.idx_pool = 4;
        h.clamp_exp = 10.0f;
        h.clamp_shexp = 10.0f;
        h.clamp_step = 0.0f;
        h.n_ctx_train = 1048576;
        return h;
    }
    throw Error("unknown glm5next preset '" + std::string(name) + "' (tiny, bench)");
}

std::vector<std::string> Glm5NextHParams::preset_names() {
    return {"tiny", "bench"};
}

std::string Glm5NextHParams::preset_default_type(std::string_view name) {
    return name == "bench" ? "Q4_K_M" : "F32";
}

void Glm5NextHParams::validate() const {
    auto need = [](bool ok, const std::string& what) {
        if (!ok) throw Error("invalid glm5next hyperparameters: " + what);
    };
    constexpr int64_t kMaxDim = int64_t(1) << 20;
    for (auto [v, name] : {std::pair{n_embd, "n_embd"},
                           {n_layer, "n_layer"},
                           {n_ff, "n_ff"},
                           {n_expert, "n_expert"},
                           {n_expert_used, "n_expert_used"},
                           {n_ff_exp, "n_ff_exp"},
                           {kda_heads, "kda_heads"},
                           {kda_dim, "kda_dim"},
                           {kda_rank, "kda_rank"},
                           {conv_k, "conv_k"},
                           {mla_heads, "mla_heads"},
                           {q_lora, "q_lora"},
                           {kv_lora, "kv_lora"},
                           {k_mla, "k_mla"},
                           {v_mla, "v_mla"},
                           {idx_heads, "idx_heads"},
                           {idx_dim, "idx_dim"},
                           {idx_top_k, "idx_top_k"},
                           {idx_pool, "idx_pool"},
                           {hc, "hc"},
                           {hc_iters, "hc_iters"},
                           {mla_every, "mla_every"}})
        need(v >= 1 && v <= kMaxDim, std::string(name) + " = " + std::to_string(v) +
                                         " is outside [1, " + std::to_string(kMaxDim) + "]");
    need(n_vocab >= int64_t(glm_dsa_base_vocab().n_tokens) && n_vocab <= (int64_t(1) << 24),
         "n_vocab must be in [" + std::to_string(glm_dsa_base_vocab().n_tokens) + ", 16777216]");
    need(n_nextn == 0 || n_nextn == 1, "n_nextn must be 0 or 1");
    need(n_dense >= 0 && n_dense <= n_layer, "n_dense must be in [0, n_layer]");
    need(n_expert_used <= n_expert, "n_expert_used must not exceed n_expert");
    need(n_expert_shared >= 0 && n_expert_shared <= 16, "n_expert_shared must be in [0, 16]");
    need(idx_top_k % idx_pool == 0, "idx_top_k must be a multiple of idx_pool");
    need(std::isfinite(gate_lower) && gate_lower < 0, "gate_lower must be negative");
    need(std::isfinite(rms_eps) && rms_eps > 0, "rms_eps must be positive");
    need(std::isfinite(hc_eps) && hc_eps >= 0, "hc_eps must not be negative");
    need(std::isfinite(expert_weights_scale) && expert_weights_scale > 0,
         "expert_weights_scale must be positive");
    need(n_ctx_train >= 1 && n_ctx_train <= 0xffffffffll, "n_ctx_train must fit in 32 bits");
}

namespace {

using gguf::Value;
using gguf::ValueType;

void append_glm5next_metadata(const Glm5NextHParams& h,
                              std::vector<std::pair<std::string, Value>>& md) {
    const std::string p = "glm5next.";
    const int64_t n_blocks = h.n_layer + h.n_nextn;
    auto u32 = [&](const std::string& k, int64_t v) {
        md.emplace_back(p + k, Value::make_uint(ValueType::U32, uint64_t(v)));
    };
    auto f32 = [&](const std::string& k, double v) {
        md.emplace_back(p + k, Value::make_float(ValueType::F32, v));
    };
    auto per_block_f32 = [&](const std::string& k, float base) {
        std::vector<Value> v;
        for (int64_t il = 0; il < n_blocks; ++il)
            v.push_back(Value::make_float(ValueType::F32, base + h.clamp_step * float(il)));
        md.emplace_back(p + k, Value::make_array(ValueType::F32, std::move(v)));
    };

    u32("block_count", n_blocks);
    u32("nextn_predict_layers", h.n_nextn);
    u32("context_length", h.n_ctx_train);
    u32("embedding_length", h.n_embd);
    u32("vocab_size", h.n_vocab);
    u32("feed_forward_length", h.n_ff);
    u32("expert_feed_forward_length", h.n_ff_exp);
    u32("leading_dense_block_count", h.n_dense);
    u32("expert_count", h.n_expert);
    u32("expert_used_count", h.n_expert_used);
    u32("expert_shared_count", h.n_expert_shared);
    f32("expert_weights_scale", h.expert_weights_scale);
    md.emplace_back(p + "expert_weights_norm", Value::make_bool(h.expert_weights_norm));
    u32("expert_gating_func", 2);  // sigmoid
    per_block_f32("swiglu_clamp_exp", h.clamp_exp);
    per_block_f32("swiglu_clamp_shexp", h.clamp_shexp);
    // Head counts: a scalar when KDA and MLA layers agree, else one per block.
    if (h.kda_heads == h.mla_heads) {
        u32("attention.head_count", h.kda_heads);
    } else {
        std::vector<Value> v;
        for (int64_t il = 0; il < n_blocks; ++il)
            v.push_back(Value::make_uint(ValueType::U32,
                                         uint64_t(h.is_mla(il) ? h.mla_heads : h.kda_heads)));
        md.emplace_back(p + "attention.head_count",
                        Value::make_array(ValueType::U32, std::move(v)));
    }
    {
        std::vector<Value> kinds;  // 0 = KDA, 1 = MLA
        for (int64_t il = 0; il < n_blocks; ++il)
            kinds.push_back(Value::make_int(ValueType::I32, h.is_mla(il) ? 1 : 0));
        md.emplace_back(p + "attention.head_count_kv",
                        Value::make_array(ValueType::I32, std::move(kinds)));
    }
    f32("attention.layer_norm_rms_epsilon", h.rms_eps);
    u32("attention.q_lora_rank", h.q_lora);
    u32("attention.kv_lora_rank", h.kv_lora);
    u32("attention.key_length", h.kv_lora);  // the latent alone: no rope tail
    u32("attention.value_length", h.kv_lora);
    u32("attention.key_length_mla", h.k_mla);
    u32("attention.value_length_mla", h.v_mla);
    u32("attention.indexer.head_count", h.idx_heads);
    u32("attention.indexer.key_length", h.idx_dim);
    u32("attention.indexer.top_k", h.idx_top_k);
    u32("attention.indexer.block_size", h.idx_pool);
    u32("rope.dimension_count", 0);  // NoPE
    u32("ssm.conv_kernel", h.conv_k);
    u32("kda.head_dim", h.kda_dim);
    f32("kda.gate_lower_bound", h.gate_lower);
    u32("hyper_connection.count", h.hc);
    u32("hyper_connection.sinkhorn_iterations", h.hc_iters);
    f32("hyper_connection.epsilon", h.hc_eps);
    append_glm_tokenizer(md, h.n_vocab);
}

// A KDA block's attention: q/k/v with their short convolutions, the decay and
// output gates (low rank), beta, the gated norm and the output.
void kda_tensors(TensorList& tl, const std::string& b, const std::string& attn_norm,
                 const Glm5NextHParams& h, int64_t E) {
    const int64_t H = h.kda_heads, D = h.kda_dim, di = H * D, r = h.kda_rank;
    for (const char* u : {"q", "k", "v"}) {
        tl.mat(b + "attn_" + u + ".weight", {E, di}, 1.0, {attn_norm});
        tl.values(b + "ssm_conv1d_" + u + ".weight", {h.conv_k, 1, di}, 0.0,
                  TensorList::inv_sqrt(h.conv_k))
            .keep_f32 = true;
    }
    tl.mat(b + "ssm_f_a.weight", {E, r}, 1.0, {attn_norm});
    tl.mat(b + "ssm_f_b.weight", {r, di}, 1.0, {});
    tl.values(b + "ssm_dt.bias", {di}, -2.0, 0.5);
    tl.values(b + "ssm_a", {1, H}, -1.0, 0.15);  // -exp(A_log): negative
    tl.mat(b + "ssm_beta.weight", {E, H}, 1.0, {attn_norm});
    tl.mat(b + "ssm_g_a.weight", {E, r}, 1.0, {attn_norm});
    tl.mat(b + "ssm_g_b.weight", {r, di}, 1.0, {});
    tl.norm(b + "ssm_norm.weight", D);
    tl.mat(b + "attn_output.weight", {di, E}, 0.7, {});
}

// An MLA block's attention (NoPE) and its pooled indexer.
void mla_tensors(TensorList& tl, const std::string& b, const std::string& attn_norm,
                 const Glm5NextHParams& h, int64_t E) {
    const int64_t H = h.mla_heads, R = h.kv_lora, Di = h.idx_dim;
    const std::string q_norm = b + "attn_q_a_norm.weight", kv_norm = b + "attn_kv_a_norm.weight";
    tl.norm(q_norm, h.q_lora);
    tl.norm(kv_norm, R);
    tl.mat(b + "attn_q_a.weight", {E, h.q_lora}, 1.0, {attn_norm});
    tl.mat(b + "attn_q_b.weight", {h.q_lora, H * h.k_mla}, 1.0, {q_norm});
    tl.mat(b + "attn_kv_a_mqa.weight", {E, R}, 1.0, {attn_norm});
    tl.mat(b + "attn_k_b.weight", {h.k_mla, R, H}, 1.0, {});
    tl.mat(b + "attn_v_b.weight", {R, h.v_mla, H}, 1.0, {kv_norm});
    tl.mat(b + "attn_output.weight", {H * h.v_mla, E}, 0.7, {});
    tl.mat(b + "indexer.attn_q_b.weight", {h.q_lora, h.idx_heads * Di}, 1.0, {q_norm});
    tl.mat(b + "indexer.proj.weight", {E, h.idx_heads}, 1.0, {attn_norm}).f32_in_float_files = true;
    tl.mat(b + "indexer_compressor_kv.weight", {E, Di}, 1.0, {attn_norm});
    tl.mat(b + "indexer_compressor_gate.weight", {E, Di}, 2.0, {attn_norm});
    tl.values(b + "indexer_compressor_ape.weight", {Di, h.idx_pool}, 0.0, 0.75).keep_f32 = true;
    tl.norm(b + "indexer_compressor_norm.weight", Di);
}

}  // namespace

Layout build_glm5next_layout(const Glm5NextHParams& h) {
    h.validate();

    Layout L;
    L.arch = "glm5next";
    append_glm5next_metadata(h, L.metadata);
    const int64_t n_blocks = h.n_layer + h.n_nextn;

    const int64_t E = h.n_embd, V = h.n_vocab, S = h.hc;
    auto& T = L.tensors;
    TensorList tl(T, true);
    tl.embedding_and_head(E, V);

    for (int64_t il = 0; il < n_blocks; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        const bool is_nextn = il >= h.n_layer;
        const size_t first = T.size();
        const std::string attn_norm = b + "attn_norm.weight", ffn_norm = b + "ffn_norm.weight";
        tl.norm(attn_norm, E);
        tl.norm(ffn_norm, E);
        for (const char* sub : {"attn", "ffn"}) {
            const std::string hc = b + "hc_" + sub;
            // The mixing logits read RMSNorm(streams) with no weight.
            TensorSpec& fn = tl.mat(hc + "_fn.weight", {S * E, (2 + S) * S}, 1.0, {});
            fn.f32_in_float_files = fn.keep_f32 = true;  // F32 as the format has it
            tl.values(hc + "_base.weight", {(2 + S) * S}, 0.0, 0.7);
            tl.values(hc + "_scale.weight", {3}, 1.0, 0.2);
        }
        if (!h.is_mla(il)) {
            kda_tensors(tl, b, attn_norm, h, E);
        } else {
            mla_tensors(tl, b, attn_norm, h, E);
        }
        tl.ffn(b, ffn_norm, E, il < h.n_dense, h.n_ff, h.n_expert, h.n_ff_exp,
               h.n_ff_exp * h.n_expert_shared);
        if (is_nextn) tl.nextn(b, E);
        for (size_t i = first; i < T.size(); ++i) T[i].nextn = is_nextn;
    }

    L.mix.n_layer_all = int(n_blocks);
    L.mix.n_expert = int(h.n_expert);
    L.mix.n_head = int(h.kda_heads);
    L.mix.n_head_kv = 1;
    return L;
}

}  // namespace glm5::synth

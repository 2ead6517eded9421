// The glm-dsa (GLM-5.x) layout for the synthetic model generator: the
// metadata keys, value types and tensors that tests/data/glm-dsa/*.gguf carry
// (what llama.cpp's glm-dsa loader reads), in the same order.
#include <cmath>
#include <string>

#include "core/error.h"
#include "synth/layout.h"
#include "synth/vocab.h"

namespace glm5::synth {

namespace {

std::string lower(std::string_view s) {
    std::string r;
    for (char c : s) r += char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    return r;
}

}  // namespace

std::vector<bool> glm52_indexer_pattern(int64_t n_layer) {
    std::vector<bool> v(size_t(std::max<int64_t>(n_layer, 0)));
    for (int64_t i = 0; i < n_layer; ++i) v[size_t(i)] = i < 2 || (i - 2) % 4 == 0;
    return v;
}

GlmDsaHParams GlmDsaHParams::preset(std::string_view name) {
    const std::string n = lower(name);
    GlmDsaHParams h;  // the defaults are the fixtures' tiny model
    if (n == "tiny") return h;
    if (n == "small") {
        h.n_embd = 256;
        h.n_layer = 3;
        h.n_dense = 2;
        h.n_ff = 512;
        h.n_expert = 4;
        h.n_expert_used = 2;
        h.n_ff_exp = 256;
        h.n_head = 4;
        h.q_lora = 256;
        h.kv_lora = 256;
        h.qk_nope = 64;
        h.qk_rope = 32;
        h.v_head = 64;
        h.idx_n_head = 8;
        h.idx_head = 128;
        h.idx_top_k = 16;
        h.indexer_full = {true, false, true};
        return h;
    }
    if (n == "bench") {
        // GLM-5.2 (hidden 6144, 64 heads, q_lora 2048, kv_lora 512, nope/rope/v
        // 192/64/256, indexer 32x128 top-2048, 256 experts of 2048 top-8 + 1
        // shared, 3 dense) scaled to a third of the width: per-head and
        // per-token cache dims stay as in GLM-5.2 (the shapes the kernels see),
        // head counts drop to a quarter, q_lora and the expert width to about
        // a third (rounded up to whole 256-blocks), experts to a quarter.
        h.n_vocab = 32768;
        h.n_embd = 2048;
        h.n_layer = 16;
        h.n_dense = 3;
        h.n_ff = 6144;
        h.n_expert = 64;
        h.n_expert_used = 8;
        h.n_expert_shared = 1;
        h.n_ff_exp = 768;
        h.n_head = 16;
        h.q_lora = 768;
        h.kv_lora = 512;
        h.qk_nope = 192;
        h.qk_rope = 64;
        h.v_head = 256;
        h.idx_n_head = 8;
        h.idx_head = 128;
        h.idx_top_k = 2048;
        h.indexer_full = glm52_indexer_pattern(h.n_layer);
        return h;
    }
    throw Error("unknown preset '" + std::string(name) + "' (tiny, small, bench)");
}

std::vector<std::string> GlmDsaHParams::preset_names() {
    return {"tiny", "small", "bench"};
}

std::string GlmDsaHParams::preset_default_type(std::string_view name) {
    const std::string n = lower(name);
    if (n == "small") return "F16";
    if (n == "bench") return "Q4_K_M";
    return "F32";
}

std::vector<bool> GlmDsaHParams::indexer_pattern() const {
    return indexer_full.empty() ? glm52_indexer_pattern(n_layer) : indexer_full;
}

void GlmDsaHParams::validate() const {
    auto need = [](bool ok, const std::string& what) {
        if (!ok) throw Error("invalid glm-dsa hyperparameters: " + what);
    };
    constexpr int64_t kMaxDim = int64_t(1) << 20;
    auto dim = [&](int64_t v, const char* name, int64_t lo) {
        need(v >= lo && v <= kMaxDim, std::string(name) + " = " + std::to_string(v) +
                                          " is outside [" + std::to_string(lo) + ", " +
                                          std::to_string(kMaxDim) + "]");
    };
    dim(n_embd, "n_embd", 1);
    dim(n_layer, "n_layer", 1);
    dim(n_ff, "n_ff", 1);
    dim(n_expert, "n_expert", 1);
    dim(n_expert_used, "n_expert_used", 1);
    dim(n_expert_shared, "n_expert_shared", 1);
    dim(n_ff_exp, "n_ff_exp", 1);
    dim(n_head, "n_head", 1);
    dim(q_lora, "q_lora", 1);
    dim(kv_lora, "kv_lora", 1);
    dim(qk_nope, "qk_nope", 1);
    dim(qk_rope, "qk_rope", 2);
    dim(v_head, "v_head", 1);
    dim(idx_n_head, "idx_n_head", 1);
    dim(idx_head, "idx_head", 64);
    dim(idx_top_k, "idx_top_k", 1);
    need(n_vocab >= int64_t(glm_dsa_base_vocab().n_tokens) && n_vocab <= (int64_t(1) << 24),
         "n_vocab must be in [" + std::to_string(glm_dsa_base_vocab().n_tokens) + ", 16777216]");
    need(n_nextn == 0 || n_nextn == 1, "n_nextn must be 0 or 1");
    need(n_dense >= 0 && n_dense <= n_layer, "n_dense must be in [0, n_layer]");
    need(n_expert_used <= n_expert, "n_expert_used must not exceed n_expert");
    need(n_expert_shared <= 16, "n_expert_shared must be at most 16");
    need((idx_head & (idx_head - 1)) == 0,
         "the indexer key length must be a power of two (llama.cpp's Hadamard sizes)");
    need(qk_rope % 2 == 0, "the rope dimension must be even");
    need(qk_rope <= idx_head, "the rope dimension must not exceed the indexer key length");
    need(indexer_full.empty() || int64_t(indexer_full.size()) == n_layer,
         "the indexer pattern needs one entry per trunk layer (" + std::to_string(n_layer) + ")");
    need(indexer_pattern()[0], "the first trunk layer must have a full indexer");
    need(std::isfinite(rope_freq_base) && rope_freq_base > 0, "rope_freq_base must be positive");
    need(std::isfinite(rms_eps) && rms_eps > 0, "rms_eps must be positive");
    need(std::isfinite(expert_weights_scale) && expert_weights_scale > 0,
         "expert_weights_scale must be positive");
    need(n_ctx_train >= 1 && n_ctx_train <= 0xffffffffll, "n_ctx_train must fit in 32 bits");
}

Layout build_glm_dsa_layout(const GlmDsaHParams& h) {
    using gguf::Value;
    using gguf::ValueType;
    h.validate();

    Layout L;
    L.arch = "glm-dsa";
    const std::string p = "glm-dsa.";
    const int64_t n_blocks = h.n_layer + h.n_nextn;
    const std::vector<bool> pattern = h.indexer_pattern();
    auto& md = L.metadata;
    auto u32 = [&](const std::string& k, int64_t v) {
        md.emplace_back(p + k, Value::make_uint(ValueType::U32, uint64_t(v)));
    };
    auto f32 = [&](const std::string& k, double v) {
        md.emplace_back(p + k, Value::make_float(ValueType::F32, v));
    };

    u32("vocab_size", h.n_vocab);
    u32("context_length", h.n_ctx_train);
    u32("embedding_length", h.n_embd);
    u32("block_count", n_blocks);
    u32("leading_dense_block_count", h.n_dense);
    u32("feed_forward_length", h.n_ff);
    u32("attention.head_count", h.n_head);
    u32("attention.head_count_kv", 1);  // MLA: one shared latent
    f32("attention.layer_norm_rms_epsilon", h.rms_eps);
    f32("rope.freq_base", h.rope_freq_base);
    u32("rope.dimension_count", h.qk_rope);
    u32("attention.q_lora_rank", h.q_lora);
    u32("attention.kv_lora_rank", h.kv_lora);
    u32("attention.key_length", h.kv_lora + h.qk_rope);  // absorbed attention
    u32("attention.value_length", h.kv_lora);
    u32("attention.key_length_mla", h.qk_nope + h.qk_rope);
    u32("attention.value_length_mla", h.v_head);
    u32("expert_count", h.n_expert);
    u32("expert_used_count", h.n_expert_used);
    u32("expert_group_count", 1);
    u32("expert_group_used_count", 1);
    u32("expert_shared_count", h.n_expert_shared);
    u32("expert_feed_forward_length", h.n_ff_exp);
    f32("expert_weights_scale", h.expert_weights_scale);
    md.emplace_back(p + "expert_weights_norm", Value::make_bool(h.expert_weights_norm));
    u32("expert_gating_func", 2);  // sigmoid
    u32("nextn_predict_layers", h.n_nextn);
    u32("attention.indexer.head_count", h.idx_n_head);
    u32("attention.indexer.key_length", h.idx_head);
    u32("attention.indexer.top_k", h.idx_top_k);
    std::vector<Value> types;
    for (bool full : pattern) types.push_back(Value::make_bool(full));
    md.emplace_back(p + "attention.indexer.types",
                    Value::make_array(ValueType::BOOL, std::move(types)));
    append_glm_tokenizer(md, h.n_vocab);

    const int64_t E = h.n_embd, V = h.n_vocab, H = h.n_head;
    auto& T = L.tensors;
    TensorList tl(T, false);
    tl.embedding_and_head(E, V);

    for (int64_t il = 0; il < n_blocks; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        const bool is_nextn = il >= h.n_layer;
        const size_t first = T.size();
        const std::string attn_norm = b + "attn_norm.weight", q_norm = b + "attn_q_a_norm.weight",
                          kv_norm = b + "attn_kv_a_norm.weight", ffn_norm = b + "ffn_norm.weight";
        tl.norm(attn_norm, E);
        tl.norm(q_norm, h.q_lora);
        tl.norm(kv_norm, h.kv_lora);
        tl.mat(b + "attn_q_a.weight", {E, h.q_lora}, 1.0, {attn_norm});
        tl.mat(b + "attn_q_b.weight", {h.q_lora, H * (h.qk_nope + h.qk_rope)}, 1.0, {q_norm});
        tl.mat(b + "attn_kv_a_mqa.weight", {E, h.kv_lora + h.qk_rope}, 1.0, {attn_norm});
        tl.mat(b + "attn_k_b.weight", {h.qk_nope, h.kv_lora, H}, 1.0, {});  // input: q_nope
        tl.mat(b + "attn_v_b.weight", {h.kv_lora, h.v_head, H}, 1.0, {kv_norm});
        tl.mat(b + "attn_output.weight", {H * h.v_head, E}, 0.7, {});
        tl.norm(ffn_norm, E);
        // The NextN block carries its own indexer (llama.cpp's loader expects it).
        if (is_nextn || pattern[size_t(il)]) {
            tl.norm(b + "indexer.k_norm.weight", h.idx_head);
            tl.bias(b + "indexer.k_norm.bias", h.idx_head);
            tl.mat(b + "indexer.proj.weight", {E, h.idx_n_head}, 1.0, {attn_norm})
                .f32_in_float_files = true;
            tl.mat(b + "indexer.attn_k.weight", {E, h.idx_head}, 1.0, {attn_norm});
            tl.mat(b + "indexer.attn_q_b.weight", {h.q_lora, h.idx_n_head * h.idx_head}, 1.0,
                   {q_norm});
        }
        tl.ffn(b, ffn_norm, E, il < h.n_dense, h.n_ff, h.n_expert, h.n_ff_exp,
               h.n_ff_exp * h.n_expert_shared);
        if (is_nextn) tl.nextn(b, E);
        for (size_t i = first; i < T.size(); ++i) T[i].nextn = is_nextn;
    }

    L.mix.n_layer_all = int(n_blocks);
    L.mix.n_expert = int(h.n_expert);
    L.mix.n_head = int(h.n_head);
    L.mix.n_head_kv = 1;
    return L;
}

}  // namespace glm5::synth

// glm-dsa: hyperparameters and weight loading (the forward is glm_dsa.cpp).
#include <cmath>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/glm_dsa.h"
#include "model/moe.h"

namespace glm5::model {

namespace {

constexpr const char* kArch = "glm-dsa.";

std::string key(const char* k) {
    return std::string(kArch) + k;
}

// A key that may be a scalar or a per-layer array whose entries must agree.
int64_t uniform_uint(const gguf::File& f, const std::string& k) {
    const gguf::Value* v = f.find(k);
    if (!v) throw Error(f.path() + ": missing metadata key " + k);
    if (!v->is_array()) {
        auto u = v->as_uint();
        if (!u) throw Error(f.path() + ": metadata key " + k + " is not an unsigned integer");
        return hparam(f, k);
    }
    if (v->size() == 0) throw Error(f.path() + ": metadata key " + k + " is an empty array");
    auto first = (*v)[0].as_uint();
    for (size_t i = 0; i < v->size(); ++i) {
        auto u = (*v)[i].as_uint();
        if (!u || !first || *u != *first)
            throw Error(f.path() + ": metadata key " + k +
                        " varies per layer, which glm-dsa does not support");
    }
    if (*first > uint64_t(kMaxHParam))
        throw Error(f.path() + ": metadata key " + k + " is " + std::to_string(*first) +
                    ", more than the limit of " + std::to_string(kMaxHParam));
    return int64_t(*first);
}

bool is_pow2(int64_t v) {
    return v > 0 && (v & (v - 1)) == 0;
}

}  // namespace

GlmDsaHParams GlmDsaHParams::from_gguf(const gguf::File& f) {
    GlmDsaHParams h;
    const std::string& p = f.path();
    auto req = [&](const char* k) { return hparam(f, key(k)); };
    auto bad = [&](const std::string& what) { return Error(p + ": " + what); };

    h.n_layer_all = req("block_count");
    h.n_nextn = hparam(f, key("nextn_predict_layers"), 0);
    if (h.n_nextn >= h.n_layer_all)
        throw bad("glm-dsa.nextn_predict_layers (" + std::to_string(h.n_nextn) +
                  ") must be less than glm-dsa.block_count (" + std::to_string(h.n_layer_all) +
                  ")");
    h.n_layer = h.n_layer_all - h.n_nextn;
    check_layer_count(f, key("block_count"), h.n_layer_all);
    h.n_embd = req("embedding_length");
    h.n_head = uniform_uint(f, key("attention.head_count"));
    h.eps = float(f.get_float(key("attention.layer_norm_rms_epsilon")));
    h.q_lora = req("attention.q_lora_rank");
    h.kv_lora = req("attention.kv_lora_rank");
    h.k_mla = req("attention.key_length_mla");
    h.v_mla = req("attention.value_length_mla");
    h.n_rot = req("rope.dimension_count");
    h.freq_base = float(f.get_float(key("rope.freq_base"), 10000.0));
    h.n_dense = hparam(f, key("leading_dense_block_count"), 0);
    h.n_ff = h.n_dense > 0 ? uniform_uint(f, key("feed_forward_length")) : 0;
    h.n_ff_exp = req("expert_feed_forward_length");
    h.n_expert = req("expert_count");
    h.n_expert_used = req("expert_used_count");
    h.n_expert_shared = hparam(f, key("expert_shared_count"), 0);
    h.expert_norm = f.get_bool(key("expert_weights_norm"), false);
    h.expert_scale = float(f.get_float(key("expert_weights_scale"), 0.0));
    if (h.expert_scale == 0.0f) h.expert_scale = 1.0f;  // absent or 0: no scaling
    const int64_t gating = hparam(f, key("expert_gating_func"), 2);
    if (gating != 2 && gating != 0)
        throw bad("glm-dsa.expert_gating_func is " + std::to_string(gating) +
                  "; only sigmoid routing (2) is supported");
    if (f.get_uint(key("expert_group_count"), 1) > 1 &&
        f.get_uint(key("expert_group_used_count"), 1) < f.get_uint(key("expert_group_count"), 1))
        throw bad("group-limited expert routing (glm-dsa.expert_group_count > 1) is not supported");
    h.idx_heads = req("attention.indexer.head_count");
    h.idx_dim = req("attention.indexer.key_length");
    h.idx_top_k = req("attention.indexer.top_k");
    h.n_ctx_train = hparam(f, key("context_length"), 0);

    if (h.n_rot <= 0 || h.n_rot % 2 != 0 || h.n_rot >= h.k_mla)
        throw bad("glm-dsa.rope.dimension_count (" + std::to_string(h.n_rot) +
                  ") must be even and smaller than attention.key_length_mla (" +
                  std::to_string(h.k_mla) + ")");
    h.nope = h.k_mla - h.n_rot;
    if (!is_pow2(h.idx_dim) || h.idx_dim < h.n_rot)
        throw bad("glm-dsa.attention.indexer.key_length (" + std::to_string(h.idx_dim) +
                  ") must be a power of two no smaller than the rope dimension");
    if (h.idx_top_k <= 0) throw bad("glm-dsa.attention.indexer.top_k must be positive");
    if (h.n_expert_used <= 0 || h.n_expert_used > h.n_expert)
        throw bad("glm-dsa.expert_used_count must be in [1, expert_count]");
    if (h.n_dense > h.n_layer)
        throw bad("glm-dsa.leading_dense_block_count exceeds the trunk layers");
    if (!(h.eps >= 0.0f) || !std::isfinite(h.freq_base) || h.freq_base <= 0.0f)
        throw bad("glm-dsa: bad rms epsilon or rope.freq_base");

    // Which layers run the indexer ("full") and which reuse the previous
    // full layer's selection ("shared").
    h.idx_full.assign(size_t(h.n_layer), true);
    if (const gguf::Value* v = f.find(key("attention.indexer.types"))) {
        if (!v->is_array() || int64_t(v->size()) < h.n_layer)
            throw bad(
                "glm-dsa.attention.indexer.types must be an array with one entry per trunk layer");
        for (int64_t i = 0; i < h.n_layer; ++i) {
            const gguf::Value& e = (*v)[size_t(i)];
            auto b = e.as_bool();
            auto u = e.as_uint();
            if (!b && !u) throw bad("glm-dsa.attention.indexer.types has a non-boolean entry");
            h.idx_full[size_t(i)] = b ? *b : (*u != 0);
        }
    } else if (h.n_ctx_train >= 1048576) {
        // GLM-5.2's pattern: two full layers, then one full layer in every four.
        for (int64_t i = 0; i < h.n_layer; ++i) h.idx_full[size_t(i)] = i < 2 || (i - 2) % 4 == 0;
    }
    if (!h.idx_full[0]) throw bad("glm-dsa: the first trunk layer must be a full indexer layer");

    const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw bad("missing tensor token_embd.weight");
    h.n_vocab = emb->ne[1];
    return h;
}

GlmDsaModel::GlmDsaModel(const gguf::File& f, backend::Backend& be, const LoadOptions& opt)
    : Model(&be),
      hp_(GlmDsaHParams::from_gguf(f)),
      cache_type_(opt.cache_type),
      dense_attention_(opt.dense_attention),
      tp_size_(opt.tp_size),
      tp_rank_(opt.tp_rank),
      n_head_local_(hp_.n_head / std::max(1, opt.tp_size)),
      head_first_(n_head_local_ * opt.tp_rank),
      held_(resolve_layers(opt, hp_.n_layer, f.path())),
      experts_be_(opt.experts_backend),
      moe_overlap_(opt.moe_overlap),
      attn_(backend::require<backend::AttentionOps>(be, "glm-dsa")),
      moe_(backend::require<backend::MoeOps>(be, "glm-dsa")),
      tensors_(f, opt.in_memory, opt.repack, opt.repack_if_fits, held_, &be) {
    const int64_t E = hp_.n_embd, V = hp_.n_vocab;
    if (opt.tp_size > 1 && (hp_.n_head % opt.tp_size != 0 || opt.tp_rank < 0 ||
                            opt.tp_rank >= opt.tp_size || !opt.layers.whole()))
        throw Error(f.path() + ": " + std::to_string(hp_.n_head) +
                    " attention heads cannot be shared by " + std::to_string(opt.tp_size) +
                    " ranks (tensor parallelism needs a head count the rank count divides)");
    check_expert_placement(opt, f.path());
    if (opt.tp_size > 1 && hp_.n_expert > 0) {
        // The experts are split when each rank's strip of hidden units is
        // whole quant blocks of ffn_down_exps; otherwise they stay whole on
        // every rank (exact, slower), which the load banner says.
        const ExpertStrip es = expert_strip(f, hp_.n_ff_exp, opt.tp_rank, opt.tp_size);
        ff_split_ = es.split;
        ff_first_ = es.first;
        ff_local_ = es.n;
    }
    tok_embd_ = tensors_.matrix("token_embd.weight", {E, V}, TensorSource::Layout::Plain);
    tensors_.register_view(tok_embd_, "token_embd.weight");
    output_norm_ = tensors_.vector("output_norm.weight", E);
    output_ = tensors_.has("output.weight") ? tensors_.matrix("output.weight", {E, V}) : tok_embd_;

    layers_.resize(size_t(hp_.n_layer));
    for (int64_t il = 0; il < hp_.n_layer; ++il)
        load_layer(tensors_, il, layers_[size_t(il)], hp_.idx_full[size_t(il)]);

    info_.arch = "glm-dsa";
    info_.name = model_name(f);
    info_.n_vocab = V;
    info_.n_embd = E;
    info_.n_layer = hp_.n_layer;
    info_.n_ctx_train = hp_.n_ctx_train;
    info_.has_nextn = hp_.n_nextn > 0;
    info_.weight_bytes = tensors_.bytes_used();
    info_.repacked_bytes = tensors_.bytes_repacked();
    info_.copied_bytes = tensors_.bytes_copied();
    info_.mapped_bytes = tensors_.bytes_mapped();
    info_.repack_skipped = tensors_.repack_skipped();

    if (opt.load_nextn && hp_.n_nextn > 0 && held_.head) {
        // The NextN/MTP block: a full decoder block (its indexer tensors are
        // present but the draft attends densely) plus the embedding/hidden mix.
        const int64_t il = hp_.n_layer;
        nextn_ = std::make_unique<NextN>();
        load_layer(tensors_, il, nextn_->block, false);
        static_cast<NextNMix&>(*nextn_) = load_nextn_mix(tensors_, il, E, output_norm_);
        const std::string p = "blk." + std::to_string(il) + ".nextn.";
        if (tensors_.has(p + "embed_tokens.weight")) {
            nextn_->embed =
                tensors_.matrix(p + "embed_tokens.weight", {E, V}, TensorSource::Layout::Plain);
            tensors_.register_view(nextn_->embed, p + "embed_tokens.weight");
        }
        if (tensors_.has(p + "shared_head_head.weight"))
            nextn_->head = tensors_.matrix(p + "shared_head_head.weight", {E, V});
        info_.nextn_loaded = true;
        info_.copied_bytes = tensors_.bytes_copied();
        info_.mapped_bytes = tensors_.bytes_mapped();
    }
    info_.skipped_bytes = tensors_.bytes_skipped();
    place_experts(opt.host_experts);
    describe_layers(info_, held_);
    info_.head_first = head_first_;
    info_.head_end = head_first_ + n_head_local_;
    info_.n_ff_exp = hp_.n_ff_exp;
    info_.ff_first = ff_split_ ? ff_first_ : 0;
    info_.ff_end = ff_split_ ? ff_first_ + ff_local_ : hp_.n_ff_exp;
}

void GlmDsaModel::load_layer(TensorSource& ts, int64_t il, Layer& L, bool with_indexer) {
    const GlmDsaHParams& h = hp_;
    const int64_t E = h.n_embd, H = h.n_head;
    const std::string p = "blk." + std::to_string(il) + ".";
    L.attn_norm = ts.vector(p + "attn_norm.weight", E);
    // Tensor parallel: this rank's heads only; the block sums the ranks'
    // partial outputs.
    L.attn = load_mla(ts, p, E, h.mla_shape(H), tp_size_ > 1, head_first_, n_head_local_);
    L.full = with_indexer;
    if (with_indexer) {
        L.idx_q_b = ts.matrix(p + "indexer.attn_q_b.weight", {h.q_lora, h.idx_heads * h.idx_dim});
        L.idx_k = ts.matrix(p + "indexer.attn_k.weight", {E, h.idx_dim});
        L.idx_k_norm = ts.vector(p + "indexer.k_norm.weight", h.idx_dim);
        L.idx_k_norm_b = ts.vector(p + "indexer.k_norm.bias", h.idx_dim);
        L.idx_proj = ts.matrix(p + "indexer.proj.weight", {E, h.idx_heads});
    }
    L.ffn_norm = ts.vector(p + "ffn_norm.weight", E);
    L.dense = il < h.n_dense;
    if (L.dense) {
        L.ffn_gate = ts.matrix(p + "ffn_gate.weight", {E, h.n_ff});
        L.ffn_up = ts.matrix(p + "ffn_up.weight", {E, h.n_ff});
        L.ffn_down = ts.matrix(p + "ffn_down.weight", {h.n_ff, E});
        return;
    }
    backend::MoeWeights& m = L.moe;
    // Experts that may live in system RAM stay as stored in the file mapping (no
    // repacked copy).
    const auto experts_layout =
        ff_split_ || experts_be_ ? TensorSource::Layout::Plain : TensorSource::Layout::Products;
    m = load_moe(ts, p, E, h.n_ff_exp, h.n_expert, h.n_expert_shared, false, experts_layout);
    if (ff_split_) {
        // Each routed expert split along its hidden units: gate / up by
        // output rows, down by input columns; the router's top-k is the same
        // on every rank. The shared expert is whole, on rank 0 only, so that
        // the ranks' partial sums count it once.
        const int64_t f0 = ff_first_, n = ff_local_;
        m.experts.gate = rows_of(m.experts.gate, f0, n, p + "ffn_gate_exps.weight");
        m.experts.up = rows_of(m.experts.up, f0, n, p + "ffn_up_exps.weight");
        m.experts.down = columns_of(m.experts.down, f0, n, p + "ffn_down_exps.weight");
        if (tp_rank_ != 0) m.shared = backend::MoeFfn{};
    }
    m.route.n_used = int(h.n_expert_used);
    m.route.norm_weights = h.expert_norm;
    m.route.weights_scale = h.expert_scale;
}

void GlmDsaModel::place_experts(const std::vector<bool>& host) {
    place_layers(layers_, nextn_ ? &nextn_->block : nullptr, host, experts_be_, info_);
}

}  // namespace glm5::model

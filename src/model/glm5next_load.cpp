// glm5next: hyperparameters and weight loading (the forward is glm5next.cpp).
// Every refusal names the key or tensor and the rule of the specification
// (docs/glm5next-format.md sections 3 and 4) it breaks.
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/glm5next.h"
#include "model/moe.h"
#include "quant/quant.h"

namespace glm5::model {

namespace {

constexpr const char* kArch = "glm5next.";

std::string key(const char* k) {
    return std::string(kArch) + k;
}

// Keys that are a scalar for every block or an array with one entry per block.
template <typename T>
std::vector<T> per_block(const gguf::File& f, const std::string& k, int64_t n_blocks,
                         std::optional<T> (*get)(const gguf::Value&), const char* what) {
    const gguf::Value* v = f.find(k);
    if (!v) throw Error(f.path() + ": missing metadata key " + k);
    std::vector<T> out;
    if (!v->is_array()) {
        auto x = get(*v);
        if (!x) throw Error(f.path() + ": metadata key " + k + " is not " + what);
        out.assign(size_t(n_blocks), *x);
        return out;
    }
    if (int64_t(v->size()) != n_blocks)
        throw Error(f.path() + ": metadata key " + k + " has " + std::to_string(v->size()) +
                    " entries, expected one per block (block_count = " + std::to_string(n_blocks) +
                    ")");
    for (size_t i = 0; i < v->size(); ++i) {
        auto x = get((*v)[i]);
        if (!x) throw Error(f.path() + ": metadata key " + k + " has an entry that is not " + what);
        out.push_back(*x);
    }
    return out;
}

std::optional<int64_t> get_uint(const gguf::Value& v) {
    auto u = v.as_uint();
    return u && *u <= uint64_t(kMaxHParam) ? std::optional<int64_t>(int64_t(*u)) : std::nullopt;
}
std::optional<float> get_float(const gguf::Value& v) {
    auto d = v.as_float();
    return d ? std::optional<float>(float(*d)) : std::nullopt;
}

const gguf::TensorInfo& require_tensor(const gguf::File& f, const std::string& name) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) throw Error(f.path() + ": missing tensor " + name);
    return *t;
}

}  // namespace

namespace {

int64_t req(const gguf::File& f, const char* k) {
    return hparam(f, key(k));
}
Error bad(const gguf::File& f, const std::string& what) {
    return Error(f.path() + ": " + what);
}

// The block counts, width, context and norm epsilon; NoPE checked.
void read_blocks(const gguf::File& f, Glm5NextHParams& h) {
    h.n_layer_all = req(f, "block_count");
    if (h.n_layer_all <= 0) throw bad(f, "glm5next.block_count must be positive");
    check_layer_count(f, key("block_count"), h.n_layer_all);
    h.n_nextn = hparam(f, key("nextn_predict_layers"), 0);
    if (h.n_nextn >= h.n_layer_all)
        throw bad(f, "glm5next.nextn_predict_layers (" + std::to_string(h.n_nextn) +
                         ") must be less than glm5next.block_count (" +
                         std::to_string(h.n_layer_all) + "): no trunk layer would be left");
    h.n_layer = h.n_layer_all - h.n_nextn;
    h.n_embd = req(f, "embedding_length");
    h.n_ctx_train = hparam(f, key("context_length"), 0);
    h.eps = float(f.get_float(key("attention.layer_norm_rms_epsilon")));
    if (!(h.eps >= 0.0f) || !std::isfinite(h.eps))
        throw bad(f, "glm5next.attention.layer_norm_rms_epsilon must be a finite value >= 0");

    // NoPE everywhere: a rope dimension means a file for another architecture.
    const int64_t n_rot = hparam(f, key("rope.dimension_count"), 0);
    if (n_rot != 0)
        throw bad(f, "glm5next.rope.dimension_count is " + std::to_string(n_rot) +
                         "; glm5next is NoPE and requires 0");
}

// Layer kinds (KDA or MLA) and per-block head counts.
void read_layer_kinds(const gguf::File& f, Glm5NextHParams& h) {
    // Layer kinds and per-block head counts.
    const gguf::Value* kinds = f.find(key("attention.head_count_kv"));
    if (!kinds)
        throw bad(f, "missing metadata key glm5next.attention.head_count_kv (the layer kinds)");
    if (!kinds->is_array())
        throw bad(
            f, "glm5next.attention.head_count_kv must be an array with one layer kind per block");
    if (int64_t(kinds->size()) != h.n_layer_all)
        throw bad(f, "glm5next.attention.head_count_kv has " + std::to_string(kinds->size()) +
                         " entries, expected one per block (" + std::to_string(h.n_layer_all) +
                         ")");
    for (size_t i = 0; i < kinds->size(); ++i) {
        auto k = (*kinds)[i].as_int();
        if (!k || (*k != 0 && *k != 1))
            throw bad(f, "glm5next.attention.head_count_kv[" + std::to_string(i) + "] is " +
                             (*kinds)[i].to_display() +
                             "; a layer kind must be 0 (KDA) or 1 (MLA)");
        h.is_mla.push_back(*k == 1);
    }
    h.n_head = per_block(f, key("attention.head_count"), h.n_layer_all, get_uint,
                         "an unsigned integer below 2^31");
    for (size_t i = 0; i < h.n_head.size(); ++i)
        if (h.n_head[i] <= 0)
            throw bad(f, "glm5next.attention.head_count is 0 for block " + std::to_string(i));
}

void read_mla(const gguf::File& f, Glm5NextHParams& h) {
    // MLA
    h.q_lora = req(f, "attention.q_lora_rank");
    h.kv_lora = req(f, "attention.kv_lora_rank");
    h.k_mla = req(f, "attention.key_length_mla");
    h.v_mla = req(f, "attention.value_length_mla");
    for (const char* k : {"attention.key_length", "attention.value_length"})
        if (f.find(key(k)) && req(f, k) != h.kv_lora)
            throw bad(f, "glm5next." + std::string(k) + " (" + std::to_string(req(f, k)) +
                             ") must equal attention.kv_lora_rank (" + std::to_string(h.kv_lora) +
                             "): the MLA cache row is the latent alone, with no rope tail");
    if (h.q_lora <= 0 || h.kv_lora <= 0 || h.k_mla <= 0 || h.v_mla <= 0)
        throw bad(f, "glm5next: the MLA ranks and head sizes must be positive");
}

void read_indexer(const gguf::File& f, Glm5NextHParams& h) {
    // Pooled indexer
    h.idx_heads = req(f, "attention.indexer.head_count");
    h.idx_dim = req(f, "attention.indexer.key_length");
    h.idx_top_k = req(f, "attention.indexer.top_k");
    h.idx_pool = req(f, "attention.indexer.block_size");
    if (h.idx_heads <= 0 || h.idx_dim <= 0 || h.idx_pool <= 0 || h.idx_top_k <= 0)
        throw bad(f,
                  "glm5next: the indexer head count, key length, top_k and block size must be "
                  "positive");
    if (h.idx_top_k % h.idx_pool != 0)
        throw bad(f, "glm5next.attention.indexer.top_k (" + std::to_string(h.idx_top_k) +
                         ") is not a multiple of attention.indexer.block_size (" +
                         std::to_string(h.idx_pool) + "): the budget must select whole pools");
}

void read_kda(const gguf::File& f, Glm5NextHParams& h) {
    // KDA
    h.conv_k = req(f, "ssm.conv_kernel");
    h.kda_dim = req(f, "kda.head_dim");
    h.gate_lower = float(f.get_float(key("kda.gate_lower_bound")));
    if (h.conv_k <= 0 || h.kda_dim <= 0)
        throw bad(f, "glm5next: ssm.conv_kernel and kda.head_dim must be positive");
    if (!(h.gate_lower < 0.0f) || !std::isfinite(h.gate_lower))
        throw bad(f, "glm5next.kda.gate_lower_bound is " + std::to_string(h.gate_lower) +
                         "; the lower bound of the log-decay must be negative");
}

void read_hyper(const gguf::File& f, Glm5NextHParams& h) {
    // Hyper-connections
    h.hc_streams = req(f, "hyper_connection.count");
    h.hc_iters = req(f, "hyper_connection.sinkhorn_iterations");
    h.hc_eps = float(f.get_float(key("hyper_connection.epsilon")));
    if (h.hc_streams <= 0 || h.hc_iters <= 0)
        throw bad(f, "glm5next: hyper_connection.count and sinkhorn_iterations must be positive");
    if (h.hc_streams > backend::kMaxStreams)
        throw bad(f, "glm5next: hyper_connection.count is " + std::to_string(h.hc_streams) +
                         "; at most " + std::to_string(backend::kMaxStreams) +
                         " streams are supported");
}

void read_moe(const gguf::File& f, Glm5NextHParams& h) {
    // FFN / MoE
    h.n_dense = hparam(f, key("leading_dense_block_count"), 0);
    if (h.n_dense > h.n_layer)
        throw bad(f, "glm5next.leading_dense_block_count exceeds the trunk layers");
    h.n_ff = h.n_dense > 0 ? req(f, "feed_forward_length") : 0;
    h.n_ff_exp = req(f, "expert_feed_forward_length");
    h.n_expert = req(f, "expert_count");
    h.n_expert_used = req(f, "expert_used_count");
    h.n_expert_shared = hparam(f, key("expert_shared_count"), 0);
    h.expert_norm = f.get_bool(key("expert_weights_norm"), false);
    h.expert_scale = float(f.get_float(key("expert_weights_scale"), 1.0));
    const int64_t gating = hparam(f, key("expert_gating_func"), 2);
    if (gating != 2)
        throw bad(f, "glm5next.expert_gating_func is " + std::to_string(gating) +
                         "; glm5next routes with sigmoid gating (2) only");
    if (h.n_expert_used <= 0 || h.n_expert_used > h.n_expert)
        throw bad(f, "glm5next.expert_used_count must be in [1, expert_count]");
    if (f.find(key("swiglu_clamp_exp")))
        h.clamp_exp = per_block(f, key("swiglu_clamp_exp"), h.n_layer_all, get_float, "a number");
    else
        h.clamp_exp.assign(size_t(h.n_layer_all), 0.0f);  // no clamp
    if (f.find(key("swiglu_clamp_shexp")))
        h.clamp_shexp =
            per_block(f, key("swiglu_clamp_shexp"), h.n_layer_all, get_float, "a number");
    else
        h.clamp_shexp = h.clamp_exp;
}

}  // namespace

Glm5NextHParams Glm5NextHParams::from_gguf(const gguf::File& f) {
    Glm5NextHParams h;
    read_blocks(f, h);
    read_layer_kinds(f, h);
    read_mla(f, h);
    read_indexer(f, h);
    read_kda(f, h);
    read_hyper(f, h);
    read_moe(f, h);
    const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw bad(f, "missing tensor token_embd.weight");
    h.n_vocab = emb->ne[1];
    return h;
}

Glm5NextModel::Glm5NextModel(const gguf::File& f, backend::Backend& be, const LoadOptions& opt)
    : Model(&be),
      hp_(Glm5NextHParams::from_gguf(f)),
      cache_type_(opt.cache_type),
      dense_attention_(opt.dense_attention),
      file_(f),
      held_(resolve_layers(opt, hp_.n_layer, f.path())),
      experts_be_(opt.experts_backend),
      moe_overlap_(opt.moe_overlap),
      attn_(backend::require<backend::AttentionOps>(be, "glm5next")),
      linear_(backend::require<backend::LinearOps>(be, "glm5next")),
      moe_(backend::require<backend::MoeOps>(be, "glm5next")),
      tensors_(f, opt.in_memory, opt.repack, opt.repack_if_fits, held_, &be) {
    const int64_t E = hp_.n_embd, V = hp_.n_vocab;
    full_heads_ = hp_.n_head;
    check_expert_placement(opt, f.path());
    if (opt.tp_size > 1) {
        // Tensor parallel: every layer's heads (KDA and MLA) shared by the
        // ranks; from here on hp_.n_head holds this rank's count.
        if (opt.tp_rank < 0 || opt.tp_rank >= opt.tp_size || !opt.layers.whole())
            throw Error(f.path() + ": bad tensor-parallel rank");
        for (size_t il = 0; il < hp_.n_head.size(); ++il) {
            if (hp_.n_head[il] % opt.tp_size != 0)
                throw Error(f.path() + ": layer " + std::to_string(il) + "'s " +
                            std::to_string(hp_.n_head[il]) +
                            " attention heads cannot be shared by " + std::to_string(opt.tp_size) +
                            " ranks (tensor parallelism needs head counts the rank count divides)");
            hp_.n_head[il] /= opt.tp_size;
        }
        tp_size_ = opt.tp_size;
        tp_rank_ = opt.tp_rank;
        if (hp_.n_expert > 0) {
            // Experts split when each strip is whole quant blocks of ffn_down_exps.
            const ExpertStrip es = expert_strip(f, hp_.n_ff_exp, opt.tp_rank, opt.tp_size);
            ff_split_ = es.split;
            ff_first_ = es.first;
            ff_local_ = es.n;
        }
    }
    tok_embd_ = tensors_.matrix("token_embd.weight", {E, V}, TensorSource::Layout::Plain);
    tensors_.register_view(tok_embd_, "token_embd.weight");
    output_norm_ = tensors_.vector("output_norm.weight", E);
    output_ = tensors_.has("output.weight") ? tensors_.matrix("output.weight", {E, V}) : tok_embd_;

    layers_.resize(size_t(hp_.n_layer));
    for (int64_t il = 0; il < hp_.n_layer; ++il)
        load_layer(il, layers_[size_t(il)], hp_.is_mla[size_t(il)]);

    info_.arch = "glm5next";
    info_.name = model_name(f);
    info_.n_vocab = V;
    info_.n_embd = E;
    info_.n_layer = hp_.n_layer;
    info_.n_ctx_train = hp_.n_ctx_train;

    // A trunk-only file may declare the NextN block without shipping it.
    const int64_t il_nextn = hp_.n_layer;
    const std::string pn = "blk." + std::to_string(il_nextn) + ".";
    info_.has_nextn = hp_.n_nextn > 0 && tensors_.has(pn + "nextn.eh_proj.weight");
    if (opt.load_nextn && info_.has_nextn && held_.head) {
        // Loaded and validated for drafting (spec 6.9): an MLA block that
        // attends densely (its indexer tensors are never read) with a MoE FFN.
        if (!hp_.is_mla[size_t(il_nextn)])
            throw Error(f.path() + ": the NextN block " + std::to_string(il_nextn) +
                        " must be an MLA block (attention.head_count_kv = 1)");
        nextn_ = std::make_unique<NextN>();
        load_layer(il_nextn, nextn_->block, false);
        static_cast<NextNMix&>(*nextn_) = load_nextn_mix(tensors_, il_nextn, E, output_norm_);
        info_.nextn_loaded = true;
    }
    info_.weight_bytes = tensors_.bytes_used();
    info_.repacked_bytes = tensors_.bytes_repacked();
    info_.copied_bytes = tensors_.bytes_copied();
    info_.mapped_bytes = tensors_.bytes_mapped();
    info_.repack_skipped = tensors_.repack_skipped();
    info_.skipped_bytes = tensors_.bytes_skipped();
    place_experts(opt.host_experts);
    describe_layers(info_, held_);
    info_.head_first = hp_.n_head.empty() ? 0 : hp_.n_head[0] * tp_rank_;
    info_.head_end = hp_.n_head.empty() ? 0 : info_.head_first + hp_.n_head[0];
    info_.n_ff_exp = hp_.n_ff_exp;
    info_.ff_first = ff_split_ ? ff_first_ : 0;
    info_.ff_end = ff_split_ ? ff_first_ + ff_local_ : hp_.n_ff_exp;
}

const float* Glm5NextModel::load_floats(const std::string& name,
                                        std::initializer_list<int64_t> ne) {
    const backend::Weight w = tensors_.matrix(name, ne, TensorSource::Layout::Plain);
    if (!tensors_.holds(name)) return nullptr;  // another process's layer: never read
    const int64_t n = w.cols * w.rows * w.slices;
    const float* v = reinterpret_cast<const float*>(w.data);
    if (w.type != quant::Type::F32) {
        std::vector<float>& out = converted_.emplace_back(size_t(n));
        for (int64_t s = 0; s < w.slices; ++s)
            for (int64_t r = 0; r < w.rows; ++r)
                quant::dequantize_row(w.type, w.row(r, s), out.data() + (s * w.rows + r) * w.cols,
                                      w.cols);
        v = out.data();
    }
    tensors_.register_vector(v, n, name);
    return v;
}

void Glm5NextModel::load_layer(int64_t il, Layer& L, bool with_indexer) {
    const Glm5NextHParams& h = hp_;
    TensorSource& ts = tensors_;
    const gguf::File& f = file_;
    // H: the layer's heads (shapes in the file); Hl, h0: this rank's (all of
    // them but under tensor parallelism).
    const int64_t E = h.n_embd, S = h.hc_streams, H = full_heads_[size_t(il)];
    const int64_t Hl = h.n_head[size_t(il)], h0 = Hl * tp_rank_;
    const bool tp = tp_size_ > 1;
    const auto cut = tp ? TensorSource::Layout::Plain : TensorSource::Layout::Products;
    const std::string p = "blk." + std::to_string(il) + ".";
    L.mla = h.is_mla[size_t(il)];
    L.n_head = Hl;

    // Hyper-connections around both sublayers.
    for (auto [hc, sub] : {std::pair{&L.hc_attn, "attn"}, std::pair{&L.hc_ffn, "ffn"}}) {
        const std::string b = p + "hc_" + sub;
        hc->fn = ts.matrix(b + "_fn.weight", {S * E, (2 + S) * S});
        hc->base = ts.vector(b + "_base.weight", (2 + S) * S);
        hc->scale = ts.vector(b + "_scale.weight", 3);
    }
    L.attn_norm = ts.vector(p + "attn_norm.weight", E);
    L.ffn_norm = ts.vector(p + "ffn_norm.weight", E);

    if (!L.mla) {
        // KDA linear attention.
        const int64_t D = h.kda_dim, di = H * D, K = h.conv_k;
        const int64_t c0 = h0 * D, dl = Hl * D;  // this rank's channels
        L.wq = ts.matrix(p + "attn_q.weight", {E, di}, cut);
        L.wk = ts.matrix(p + "attn_k.weight", {E, di}, cut);
        L.wv = ts.matrix(p + "attn_v.weight", {E, di}, cut);
        const char* uvw[3] = {"q", "k", "v"};
        for (int u = 0; u < 3; ++u) {
            L.conv[u] = load_floats(p + "ssm_conv1d_" + uvw[u] + ".weight", {K, 1, di});
            if (L.conv[u]) L.conv[u] += c0 * K;  // K taps per channel
        }
        const gguf::TensorInfo& fa = require_tensor(f, p + "ssm_f_a.weight");
        const int64_t r = fa.ne[1];
        L.f_a = ts.matrix(p + "ssm_f_a.weight", {E, r});
        L.f_b = ts.matrix(p + "ssm_f_b.weight", {r, di}, cut);
        L.dt_bias = ts.vector(p + "ssm_dt.bias", di);
        if (L.dt_bias) L.dt_bias += c0;
        const float* a = ts.vector_any_shape(p + "ssm_a", H);
        L.decay_rate.resize(size_t(Hl));
        for (int64_t i = 0; a && i < Hl; ++i) L.decay_rate[size_t(i)] = -a[h0 + i];
        // Made here, so registered here: a device copies it once, not every step.
        if (a) ts.register_vector(L.decay_rate.data(), Hl, p + "ssm_a");
        L.beta = ts.matrix(p + "ssm_beta.weight", {E, H}, cut);
        if (ts.has(p + "ssm_g.weight")) {
            L.g_full = ts.matrix(p + "ssm_g.weight", {E, di}, cut);
        } else {
            const gguf::TensorInfo& ga = require_tensor(f, p + "ssm_g_a.weight");
            const int64_t rg = ga.ne[1];
            L.g_a = ts.matrix(p + "ssm_g_a.weight", {E, rg});
            L.g_b = ts.matrix(p + "ssm_g_b.weight", {rg, di}, cut);
        }
        L.o_norm = ts.vector(p + "ssm_norm.weight", D);
        L.wo = ts.matrix(p + "attn_output.weight", {di, E}, cut);
        if (tp) {
            // Column-parallel projections and gates, row-parallel output:
            // this rank's heads, their conv tails and delta states.
            L.wq = rows_of(L.wq, c0, dl, p + "attn_q.weight");
            L.wk = rows_of(L.wk, c0, dl, p + "attn_k.weight");
            L.wv = rows_of(L.wv, c0, dl, p + "attn_v.weight");
            L.f_b = rows_of(L.f_b, c0, dl, p + "ssm_f_b.weight");
            L.beta = rows_of(L.beta, h0, Hl, p + "ssm_beta.weight");
            if (L.g_full)
                L.g_full = rows_of(L.g_full, c0, dl, p + "ssm_g.weight");
            else
                L.g_b = rows_of(L.g_b, c0, dl, p + "ssm_g_b.weight");
            L.wo = columns_of(L.wo, c0, dl, p + "attn_output.weight");
        }
    } else {
        // NoPE absorbed MLA.
        L.attn = load_mla(ts, p, E, h.mla_shape(H), tp, h0, Hl);
        L.indexer = with_indexer;
        if (with_indexer) {
            const int64_t Di = h.idx_dim, B = h.idx_pool;
            L.idx_q_b = ts.matrix(p + "indexer.attn_q_b.weight", {h.q_lora, h.idx_heads * Di});
            L.idx_proj = ts.matrix(p + "indexer.proj.weight", {E, h.idx_heads});
            L.idx_kv = ts.matrix(p + "indexer_compressor_kv.weight", {E, Di});
            const gguf::TensorInfo& g = require_tensor(f, p + "indexer_compressor_gate.weight");
            L.idx_gate_width = g.ne[1] == 1 ? 1 : Di;  // one gate per cell, or per channel
            L.idx_gate = ts.matrix(p + "indexer_compressor_gate.weight", {E, L.idx_gate_width});
            L.idx_ape = load_floats(p + "indexer_compressor_ape.weight", {L.idx_gate_width, B});
            L.idx_norm = ts.vector(p + "indexer_compressor_norm.weight", Di);
        }
    }

    // FFN: dense SwiGLU on the leading trunk layers, MoE elsewhere (NextN too).
    L.dense = il < h.n_dense;
    if (L.dense) {
        L.ffn_gate = ts.matrix(p + "ffn_gate.weight", {E, h.n_ff});
        L.ffn_up = ts.matrix(p + "ffn_up.weight", {E, h.n_ff});
        L.ffn_down = ts.matrix(p + "ffn_down.weight", {h.n_ff, E});
        L.dense_clamp = h.clamp_shexp[size_t(il)];
        return;
    }
    backend::MoeWeights& m = L.moe;
    // Experts that may live in system RAM stay as stored in the file mapping (no
    // repacked copy).
    m = load_moe(
        ts, p, E, h.n_ff_exp, h.n_expert, h.n_expert_shared, true,
        ff_split_ || experts_be_ ? TensorSource::Layout::Plain : TensorSource::Layout::Products);
    if (ff_split_) {
        // Each routed expert's strip of hidden units (the SwiGLU clamp is per
        // unit); the shared expert whole, on rank 0 only.
        m.experts.gate = rows_of(m.experts.gate, ff_first_, ff_local_, p + "ffn_gate_exps.weight");
        m.experts.up = rows_of(m.experts.up, ff_first_, ff_local_, p + "ffn_up_exps.weight");
        m.experts.down =
            columns_of(m.experts.down, ff_first_, ff_local_, p + "ffn_down_exps.weight");
        if (tp_rank_ != 0) m.shared = backend::MoeFfn{};
    }
    m.route.n_used = int(h.n_expert_used);
    m.route.norm_weights = h.expert_norm;
    m.route.weights_scale = h.expert_scale;
    m.experts.clamp = h.clamp_exp[size_t(il)];
    m.shared.clamp = h.clamp_shexp[size_t(il)];
}

void Glm5NextModel::place_experts(const std::vector<bool>& host) {
    place_layers(layers_, nextn_ ? &nextn_->block : nullptr, host, experts_be_, info_);
}

}  // namespace glm5::model

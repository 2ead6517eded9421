// The glm5next mmproj: its keys and tensors (docs/glm5next-format.md 12.1),
// each refusal naming the key or tensor and the rule it breaks. The forward
// is glm5next_vision.cpp.
#include <cstring>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/glm5next_vision.h"
#include "quant/quant.h"

namespace glm5::model {

namespace {

std::string vkey(const char* k) {
    return std::string("clip.vision.") + k;
}

bool float_type(quant::Type t) {
    return t == quant::Type::F32 || t == quant::Type::F16 || t == quant::Type::BF16;
}

}  // namespace

VisionHParams VisionHParams::from_gguf(const gguf::File& f) {
    const std::string& p = f.path();
    auto bad = [&](const std::string& what) { return Error(p + ": " + what); };
    const std::string arch = f.get_string("general.architecture", "");
    if (arch != "clip")
        throw bad("not an mmproj file: general.architecture is '" + arch + "', expected 'clip'");
    const std::string proj = f.get_string("clip.projector_type", "");
    if (proj != "glm5next")
        throw bad("clip.projector_type is '" + proj +
                  "': this engine reads only 'glm5next' projectors (GLM-5.3-Flash)");
    if (!f.get_bool("clip.has_vision_encoder", false))
        throw bad("clip.has_vision_encoder is not true: the file has no vision tower");

    VisionHParams h;
    // Bounded as the text models' sizes are (hparam: below 2^31), so products
    // of two cannot overflow before the tensor shapes are checked.
    auto req = [&](const char* k) { return hparam(f, vkey(k)); };
    h.width = req("embedding_length");
    h.n_ff = req("feed_forward_length");
    h.n_block = req("block_count");
    h.n_head = req("attention.head_count");
    h.eps = float(f.get_float(vkey("attention.layer_norm_epsilon")));
    h.patch = req("patch_size");
    h.merge = req("spatial_merge_size");
    h.out = req("projection_dim");
    h.limit = float(f.get_float(vkey("swiglu_limit")));
    // Every block has tensors: the count may not size anything beyond the file.
    check_layer_count(f, vkey("block_count"), h.n_block);
    if (h.width <= 0 || h.n_ff <= 0 || h.n_block <= 0 || h.n_head <= 0 || h.out <= 0)
        throw bad(
            "clip.vision sizes (embedding_length, feed_forward_length, block_count, "
            "attention.head_count, projection_dim) must be positive");
    if (h.patch != 14)
        throw bad("clip.vision.patch_size is " + std::to_string(h.patch) + ", must be 14");
    if (h.merge != 2)
        throw bad("clip.vision.spatial_merge_size is " + std::to_string(h.merge) + ", must be 2");
    if (h.width % h.n_head != 0)
        throw bad("clip.vision.embedding_length (" + std::to_string(h.width) +
                  ") is not a multiple of attention.head_count (" + std::to_string(h.n_head) + ")");
    h.head_dim = h.width / h.n_head;
    if (h.head_dim % 4 != 0)
        throw bad("head dimension " + std::to_string(h.head_dim) +
                  " is not a multiple of 4 (2-D RoPE splits it in four)");
    if (!(h.eps > 0.0f)) throw bad("clip.vision.attention.layer_norm_epsilon must be positive");
    if (!(h.limit > 0.0f)) throw bad("clip.vision.swiglu_limit must be positive");
    for (const char* k : {"image_mean", "image_std"}) {
        const gguf::Value* v = f.find(vkey(k));
        if (!v || !v->is_array() || v->size() != 3)
            throw bad("clip.vision." + std::string(k) + " must be an array of 3 numbers");
        for (size_t c = 0; c < 3; ++c) {
            auto x = (*v)[c].as_float();
            if (!x)
                throw bad("clip.vision." + std::string(k) + " has an entry that is not a number");
            (std::strcmp(k, "image_mean") == 0 ? h.mean : h.std)[c] = float(*x);
        }
    }
    for (float s : h.std)
        if (!(s > 0.0f)) throw bad("clip.vision.image_std entries must be positive");
    return h;
}

std::vector<float> VisionTower::conv_floats(const std::string& name,
                                            std::initializer_list<int64_t> np) {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(file_.path() + ": missing tensor " + name);
    // numpy shape, outermost first: ggml's ne reversed.
    std::vector<int64_t> want(np.begin(), np.end());
    bool ok = t->n_dims == int(want.size());
    for (size_t i = 0; ok && i < want.size(); ++i) ok = t->ne[i] == want[want.size() - 1 - i];
    if (!ok) {
        std::string s = "[";
        for (size_t i = 0; i < want.size(); ++i)
            s += (i ? ", " : "") + std::to_string(want[want.size() - 1 - i]);
        throw Error(file_.path() + ": tensor " + name + " has shape " + t->shape_string() +
                    ", expected " + s + "]");
    }
    if (!float_type(t->type))
        throw Error(file_.path() + ": tensor " + name + " has type " + quant::name(t->type) +
                    ", expected F32, F16 or BF16");
    std::vector<float> out(size_t(t->nelements()));
    quant::dequantize_row(t->type, t->data, out.data(), t->nelements());
    weight_bytes_ += t->nbytes;
    return out;
}

backend::Weight VisionTower::product_matrix(const std::string& name, int64_t cols, int64_t rows) {
    // Any weight format (glm5 quantize writes quantized towers); the tower's source is
    // never repacked, so a fused matrix can be cut into row views.
    backend::Weight w = tensors_.matrix(name, {cols, rows});
    weight_bytes_ += w.bytes();
    return w;
}

const float* VisionTower::own_floats(std::vector<float> v) {
    owned_.push_back(std::move(v));
    return owned_.back().data();
}

backend::Weight VisionTower::own_matrix(const float* data, int64_t cols, int64_t rows) {
    backend::Weight w;
    w.type = quant::Type::F32;
    w.cols = cols;
    w.rows = rows;
    w.row_bytes = size_t(cols) * sizeof(float);
    w.slice_bytes = w.row_bytes * size_t(rows);
    w.data = reinterpret_cast<const uint8_t*>(data);
    return w;
}

VisionHParams VisionTower::checked_hparams(const gguf::File& f, const ModelInfo& text) {
    if (text.arch != "glm5next")
        throw Error(f.path() + ": --mmproj needs a glm5next model (GLM-5.3-Flash); " + text.arch +
                    " models are text only");
    return VisionHParams::from_gguf(f);
}

VisionTower::VisionTower(const gguf::File& f, backend::Backend& be, const ModelInfo& text,
                         const LoadOptions& opt)
    : file_(f),
      be_(be),
      ops_(backend::require<backend::VisionOps>(be, "the vision tower")),
      hp_(checked_hparams(f, text)),
      name_(model_name(f)),
      tensors_(f, opt.in_memory) {
    if (hp_.out != text.n_embd)
        throw Error(f.path() + ": clip.vision.projection_dim is " + std::to_string(hp_.out) +
                    ", but the text model's embedding_length is " + std::to_string(text.n_embd) +
                    ": the projector must output the text width");
    const int64_t D = hp_.width, F = hp_.n_ff, d = hp_.head_dim, E = hp_.out, P = hp_.patch;
    auto vec = [&](const std::string& n, int64_t len) {
        const float* v = tensors_.vector(n, len);
        weight_bytes_ += uint64_t(len) * sizeof(float);
        return v;
    };
    auto opt_vec = [&](const std::string& n, int64_t len) {
        return tensors_.has(n) ? vec(n, len) : nullptr;
    };

    // The Conv3d over two identical frames is one convolution with the two
    // temporal slices summed; as a product over patches unfolded in
    // (channel, row, column) order, its rows are the flattened kernels.
    {
        std::vector<float> w0 = conv_floats("v.patch_embd.weight", {D, 3, P, P});
        const std::vector<float> w1 = conv_floats("v.patch_embd.weight.1", {D, 3, P, P});
        for (size_t i = 0; i < w0.size(); ++i) w0[i] += w1[i];
        patch_embd_ = own_matrix(own_floats(std::move(w0)), 3 * P * P, D);
        patch_bias_ = vec("v.patch_embd.bias", D);
    }
    blocks_.resize(size_t(hp_.n_block));
    for (int64_t b = 0; b < hp_.n_block; ++b) {
        Block& B = blocks_[size_t(b)];
        const std::string p = "v.blk." + std::to_string(b) + ".";
        B.ln1 = vec(p + "ln1.weight", D);
        B.ln2 = vec(p + "ln2.weight", D);
        // q, k and v as row views of the fused matrix: three outputs of one op.
        const backend::Weight qkv = product_matrix(p + "attn_qkv.weight", D, 3 * D);
        for (int u = 0; u < 3; ++u) {
            backend::Weight w = qkv;
            w.rows = D;
            w.slice_bytes = w.row_bytes * size_t(D);
            w.data = qkv.data + size_t(u) * w.slice_bytes;
            (u == 0 ? B.q : u == 1 ? B.k : B.v) = w;
        }
        const float* qkv_bias = vec(p + "attn_qkv.bias", 3 * D);
        B.q_bias = qkv_bias;
        B.k_bias = qkv_bias + D;
        B.v_bias = qkv_bias + 2 * D;
        B.q_norm = vec(p + "attn_q_norm.weight", d);
        B.k_norm = vec(p + "attn_k_norm.weight", d);
        B.wo = product_matrix(p + "attn_out.weight", D, D);
        B.wo_bias = vec(p + "attn_out.bias", D);
        B.gate = product_matrix(p + "ffn_gate.weight", D, F);
        B.up = product_matrix(p + "ffn_up.weight", D, F);
        B.down = product_matrix(p + "ffn_down.weight", F, D);
        B.gate_bias = opt_vec(p + "ffn_gate.bias", F);
        B.up_bias = opt_vec(p + "ffn_up.bias", F);
        B.down_bias = opt_vec(p + "ffn_down.bias", D);
    }
    post_ln_ = vec("v.post_ln.weight", D);

    // The 2x2 merger reads a merged cell's four patch rows as one row of 4*Dv
    // in (ky, kx, channel) order; the file's kernels are (channel, ky, kx).
    {
        const std::vector<float> w = conv_floats("mm.patch_merger.weight", {E, D, 2, 2});
        std::vector<float> r(w.size());
        for (int64_t e = 0; e < E; ++e)
            for (int64_t c = 0; c < D; ++c)
                for (int64_t k = 0; k < 4; ++k)
                    r[size_t(e * 4 * D + k * D + c)] = w[size_t(e * 4 * D + c * 4 + k)];
        merger_ = own_matrix(own_floats(std::move(r)), 4 * D, E);
        merger_bias_ = vec("mm.patch_merger.bias", E);
    }
    fc_ = product_matrix("mm.model.fc.weight", E, E);
    post_norm_w_ = vec("mm.post_norm.weight", E);
    post_norm_b_ = vec("mm.post_norm.bias", E);
    const gguf::TensorInfo* g = f.find_tensor("mm.gate.weight");
    if (!g) throw Error(f.path() + ": missing tensor mm.gate.weight");
    hp_.proj_ff = g->ne[1];
    mm_gate_ = product_matrix("mm.gate.weight", E, hp_.proj_ff);
    mm_up_ = product_matrix("mm.up.weight", E, hp_.proj_ff);
    mm_down_ = product_matrix("mm.down.weight", hp_.proj_ff, E);
}

std::unique_ptr<VisionTower> load_vision_tower(const gguf::File& mmproj, backend::Backend& be,
                                               const Model& text, const LoadOptions& opt) {
    return std::make_unique<VisionTower>(mmproj, be, text.info(), opt);
}

}  // namespace glm5::model

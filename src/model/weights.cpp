#include "model/weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/format.h"
#include "core/memory.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace glm5::model {

namespace {

std::string shape_str(std::initializer_list<int64_t> ne) {
    std::string s = "[";
    bool first = true;
    for (int64_t v : ne) {
        if (!first) s += ", ";
        s += std::to_string(v);
        first = false;
    }
    return s + "]";
}

}  // namespace

int64_t tensor_layer(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    int64_t il = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 4 + 9; ++i)
        il = il * 10 + (name[i] - '0');
    return i > 4 && i < name.size() && name[i] == '.' ? il : -1;
}

bool HeldLayers::holds(const std::string& tensor) const {
    const int64_t il = tensor_layer(tensor);
    if (il >= 0) return holds_layer(il);
    if (tensor == "token_embd.weight") return (first == 0 && end > 0) || head;
    return head;
}

HeldLayers resolve_layers(const LoadOptions& opt, int64_t n_layer, const std::string& path) {
    const LayerRange& r = opt.layers;
    HeldLayers h;
    h.n_layer = n_layer;
    if (opt.plan_only) {
        h.first = h.end = 0;
        h.head = false;
        return h;
    }
    h.first = r.first;
    h.end = r.end < 0 ? n_layer : r.end;
    h.head = r.end < 0 || r.end == n_layer;
    if (h.first < 0 || h.first >= n_layer || h.end <= h.first || h.end > n_layer)
        throw Error(path + ": layers [" + std::to_string(r.first) + ", " + std::to_string(h.end) +
                    ") are outside the trunk's " + std::to_string(n_layer) + " layers");
    return h;
}

void describe_layers(ModelInfo& info, const HeldLayers& h) {
    info.layer_first = h.first;
    info.layer_end = h.end;
    info.holds_head = h.head;
}

TensorSource::TensorSource(const gguf::File& f, bool in_memory, bool repack, bool repack_if_fits,
                           HeldLayers held, backend::Backend* be)
    : file_(f),
      held_(held),
      whole_(held.n_layer == 0 || held.whole()),
      in_memory_(in_memory),
      repack_(repack && be),
      be_(be) {
    if (!in_memory_ && !repack_) return;
    uint64_t total = 0;
    for (const auto& t : f.tensors()) {
        if (!holds(t.name)) continue;
        const size_t copy = repack_ ? be_->weight_copy_bytes(t.type, t.ne[0], t.ne[1], t.ne[2]) : 0;
        total += copy ? copy : in_memory_ ? t.nbytes : 0;
    }
    const uint64_t avail = available_memory().bytes;
    // Reading the file fills the page cache too, but the kernel can drop
    // that; the copies themselves must fit.
    if (avail == 0 || total <= avail) return;
    if (!in_memory_ && repack_if_fits) {
        repack_ = false;
        repack_skipped_ = "repacking needs " + human_bytes(double(total)) +
                          " of memory, but only " + human_bytes(double(avail)) + " is available";
        return;
    }
    throw ResourceError(f.path() + ": " + (in_memory_ ? "--no-mmap" : "--repack") + " needs " +
                        human_bytes(double(total)) + " of memory for the weights, but only " +
                        human_bytes(double(avail)) +
                        " is available; run without it to serve the weights from the file");
}

TensorSource::~TensorSource() = default;

const uint8_t* TensorSource::own(size_t bytes, const std::string& what,
                                 const std::function<void(uint8_t*)>& fill) {
    copies_.emplace_back(bytes, "tensor " + what, fill);
    bytes_copied_ += copies_.back().size();
    return copies_.back().data();
}

const uint8_t* TensorSource::place(const gguf::TensorInfo& t) {
    if (!in_memory_ || t.nbytes == 0) {
        bytes_mapped_ += t.nbytes;
        return t.data;
    }
    return own(t.nbytes, t.name, [&](uint8_t* p) { std::memcpy(p, t.data, t.nbytes); });
}

std::string TensorSource::where() const {
    return file_.path();
}

bool TensorSource::has(const std::string& name) const {
    return file_.find_tensor(name) != nullptr;
}

const gguf::TensorInfo& TensorSource::find(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(where() + ": missing tensor " + name);
    return *t;
}

backend::Weight TensorSource::matrix(const std::string& name, std::initializer_list<int64_t> ne,
                                     Layout layout) {
    const gguf::TensorInfo& t = find(name);
    const size_t nd = ne.size();
    bool ok = nd >= 2 && nd <= 3;
    auto it = ne.begin();
    for (size_t i = 0; ok && i < 4; ++i) {
        const int64_t want = i < nd ? it[i] : 1;
        if (t.ne[i] != want) ok = false;
    }
    if (!ok)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected " + shape_str(ne));
    const quant::TypeTraits& tt = quant::traits(t.type);
    if (!tt.weight_format)
        throw Error(where() + ": tensor " + name + " has type " + tt.name +
                    ", which is not a weight format");
    backend::Weight w;
    w.type = t.type;
    w.cols = t.ne[0];
    w.rows = t.ne[1];
    w.slices = t.ne[2];
    w.row_bytes = quant::row_size(t.type, t.ne[0]);
    w.slice_bytes = w.row_bytes * size_t(t.ne[1]);
    if (!holds(name)) {
        w.data = t.data;  // never read here: another process holds it
        bytes_skipped_ += t.nbytes;
        return w;
    }
    bytes_used_ += t.nbytes;
    if (layout == Layout::Products && be_) {
        // The backend's copy in its own layout, made from the mapping; else the view.
        const size_t copy = repack_ ? be_->weight_copy_bytes(w.type, w.cols, w.rows, w.slices) : 0;
        if (copy) {
            w.data = t.data;
            w = be_->register_weight(w, true, name);
            bytes_repacked_ += t.nbytes;
            bytes_copied_ += SealedPages::rounded(copy);
            return w;
        }
        w.data = place(t);
        return be_->register_weight(w, false, name);
    }
    w.data = place(t);
    return w;
}

const float* TensorSource::vector_any_shape(const std::string& name, int64_t n) {
    const gguf::TensorInfo& t = find(name);
    if (t.nelements() != n)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected " + std::to_string(n) + " values");
    if (t.type != quant::Type::F32 && t.type != quant::Type::F16 && t.type != quant::Type::BF16)
        throw Error(where() + ": tensor " + name + " has type " + quant::name(t.type) +
                    ", expected F32, F16 or BF16");
    if (!holds(name)) {
        bytes_skipped_ += t.nbytes;
        return nullptr;
    }
    bytes_used_ += t.nbytes;
    const float* v;
    if (t.type == quant::Type::F32) {
        v = reinterpret_cast<const float*>(place(t));
    } else {
        converted_.emplace_back(size_t(n));
        quant::dequantize_row(t.type, t.data, converted_.back().data(), n);
        v = converted_.back().data();
    }
    if (be_) be_->register_vector(v, n, name);
    return v;
}

void TensorSource::register_view(const backend::Weight& w, const std::string& name) {
    if (be_ && w && holds(name)) be_->register_view(w, name);
}

void TensorSource::register_vector(const float* v, int64_t n, const std::string& name) {
    if (be_ && v) be_->register_vector(v, n, name);
}

const float* TensorSource::vector(const std::string& name, int64_t n) {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 1 || t.ne[0] != n)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected [" + std::to_string(n) + "]");
    return vector_any_shape(name, n);
}

backend::Weight rows_of(const backend::Weight& w, int64_t r0, int64_t n, const std::string& what) {
    if (w.repacked || r0 < 0 || n <= 0 || r0 + n > w.rows)
        throw Error(what + ": rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) +
                    ") cannot be cut from " + std::to_string(w.rows));
    backend::Weight v = w;  // slices keep their stride
    v.data = w.data + size_t(r0) * w.row_bytes;
    v.rows = n;
    return v;
}

backend::Weight slices_of(const backend::Weight& w, int64_t s0, int64_t n,
                          const std::string& what) {
    if (w.repacked || s0 < 0 || n <= 0 || s0 + n > w.slices)
        throw Error(what + ": slices [" + std::to_string(s0) + ", " + std::to_string(s0 + n) +
                    ") cannot be cut from " + std::to_string(w.slices));
    backend::Weight v = w;
    v.data = w.data + size_t(s0) * w.slice_bytes;
    v.slices = n;
    return v;
}

backend::Weight columns_of(const backend::Weight& w, int64_t c0, int64_t n,
                           const std::string& what) {
    const int64_t block = quant::traits(w.type).block_size;
    if (w.repacked || c0 < 0 || n <= 0 || c0 + n > w.cols || c0 % block || n % block)
        throw Error(what + ": columns [" + std::to_string(c0) + ", " + std::to_string(c0 + n) +
                    ") of " + std::to_string(w.cols) + " are not whole " + quant::name(w.type) +
                    " blocks of " + std::to_string(block) + " values");
    backend::Weight v = w;  // rows and slices keep their strides
    v.data = w.data + quant::row_size(w.type, c0);
    v.cols = n;
    return v;
}

ExpertStrip expert_strip(const gguf::File& f, int64_t n_ff_exp, int rank, int size) {
    int64_t block = 1;
    for (const auto& t : f.tensors())
        if (t.name.ends_with(".ffn_down_exps.weight"))
            block = std::max(block, quant::traits(t.type).block_size);
    ExpertStrip s;
    const int64_t n = n_ff_exp / std::max(size, 1);
    s.split = size > 1 && n_ff_exp % size == 0 && n % block == 0;
    s.n = s.split ? n : n_ff_exp;
    s.first = s.split ? n * rank : 0;
    return s;
}

backend::MoeWeights load_moe(TensorSource& ts, const std::string& p, int64_t E, int64_t F,
                             int64_t X, int64_t n_shared, bool bias_required,
                             TensorSource::Layout experts) {
    backend::MoeWeights m;
    m.route.router = ts.matrix(p + "ffn_gate_inp.weight", {E, X});
    const std::string bias = p + "exp_probs_b.bias";
    m.route.bias = bias_required || ts.has(bias) ? ts.vector(bias, X) : nullptr;
    m.experts.gate = ts.matrix(p + "ffn_gate_exps.weight", {E, F, X}, experts);
    m.experts.up = ts.matrix(p + "ffn_up_exps.weight", {E, F, X}, experts);
    m.experts.down = ts.matrix(p + "ffn_down_exps.weight", {F, E, X}, experts);
    if (n_shared > 0) {
        const int64_t S = F * n_shared;
        m.shared.gate = ts.matrix(p + "ffn_gate_shexp.weight", {E, S});
        m.shared.up = ts.matrix(p + "ffn_up_shexp.weight", {E, S});
        m.shared.down = ts.matrix(p + "ffn_down_shexp.weight", {S, E});
    }
    return m;
}

NextNMix load_nextn_mix(TensorSource& ts, int64_t il, int64_t n_embd, const float* output_norm) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t E = n_embd;
    NextNMix m;
    m.eh_proj = ts.matrix(p + "nextn.eh_proj.weight", {2 * E, E});
    m.enorm = ts.vector(p + "nextn.enorm.weight", E);
    m.hnorm = ts.vector(p + "nextn.hnorm.weight", E);
    m.shared_head_norm = ts.has(p + "nextn.shared_head_norm.weight")
                             ? ts.vector(p + "nextn.shared_head_norm.weight", E)
                             : output_norm;
    return m;
}

std::string model_name(const gguf::File& f) {
    std::string name = f.get_string("general.name", "");
    if (name.empty()) {
        name = f.path();
        if (auto s = name.find_last_of('/'); s != std::string::npos) name.erase(0, s + 1);
    }
    return name;
}

namespace {

int64_t hparam_checked(const gguf::File& f, const std::string& key, uint64_t v) {
    if (v > uint64_t(kMaxHParam))
        throw Error(f.path() + ": metadata key " + key + " is " + std::to_string(v) +
                    ", more than the limit of " + std::to_string(kMaxHParam));
    return int64_t(v);
}

}  // namespace

int64_t hparam(const gguf::File& f, const std::string& key) {
    return hparam_checked(f, key, f.get_uint(key));
}

int64_t hparam(const gguf::File& f, const std::string& key, int64_t dflt) {
    return hparam_checked(f, key, f.get_uint(key, uint64_t(dflt)));
}

void check_layer_count(const gguf::File& f, const std::string& key, int64_t n_layers) {
    if (n_layers > int64_t(f.tensors().size()))
        throw Error(f.path() + ": metadata key " + key + " is " + std::to_string(n_layers) +
                    " but the file holds only " + std::to_string(f.tensors().size()) + " tensors");
}

void check_vocab_rows(const gguf::File& f) {
    const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
    if (!toks || !toks->is_array()) return;  // no tokenizer: token ids only
    for (const char* name : {"token_embd.weight", "output.weight"}) {
        const gguf::TensorInfo* t = f.find_tensor(name);
        if (!t || t->n_dims < 2) continue;  // the shape checks name what is missing
        if (uint64_t(t->ne[1]) != toks->size())
            throw Error(f.path() + ": the tokenizer has " + std::to_string(toks->size()) +
                        " tokens but " + name + " has " + std::to_string(t->ne[1]) +
                        " rows; they must agree");
    }
}

}  // namespace glm5::model

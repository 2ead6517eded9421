// Typed, validated views of a GGUF's tensors for a model's forward. Every
// lookup checks presence, shape and type and refuses the file naming the
// tensor; weights stay in the file mapping (no copies) unless a small vector
// has to be converted to F32.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/moe_ops.h"
#include "core/mmap_file.h"
#include "model/model.h"

namespace glm5::gguf {
class File;
struct TensorInfo;
}  // namespace glm5::gguf

namespace glm5::model {

// N of a "blk.N.*" tensor name; -1 for any other name.
int64_t tensor_layer(const std::string& name);

// A LayerRange resolved against a trunk of n_layer layers: which tensors this
// process holds. Layers at or past n_layer (the NextN block) go with the head.
struct HeldLayers {
    int64_t first = 0, end = 0;
    bool head = true;
    int64_t n_layer = 0;
    bool holds_layer(int64_t il) const { return il >= n_layer ? head : il >= first && il < end; }
    // "blk.N.*" by its layer; the token embedding for the first layer's holder
    // and the head's (tied output, NextN); every other tensor with the head.
    bool holds(const std::string& tensor) const;
    bool whole() const { return first == 0 && end == n_layer && head; }
};
// opt.layers against the trunk (nothing at all with opt.plan_only). Throws,
// naming the file, on a range outside the trunk.
HeldLayers resolve_layers(const LoadOptions& opt, int64_t n_layer, const std::string& path);
// Fills ModelInfo's layer_first / layer_end / holds_head.
void describe_layers(ModelInfo& info, const HeldLayers& h);

class TensorSource {
  public:
    // in_memory: copy every tensor handed out into anonymous memory (the
    // explicit --no-mmap mode) instead of serving it from the file mapping.
    // Refuses (ResourceError, with the numbers) when the copies cannot fit.
    // be: the backend the products run on; every Layout::Products matrix is
    // registered with it (Backend::register_weight), and with `repack` the
    // backend may keep a copy in its own layout (the CPU backend's interleaved
    // GEMM); copies are refused like in_memory when they cannot fit, unless
    // repack_if_fits, which then asks for none and says why in repack_skipped().
    // held: the tensors this process reads (a layer split); the others are
    // checked like any (presence, shape, type) but never read, copied or
    // repacked: their matrices point into the mapping and vectors are null.
    explicit TensorSource(const gguf::File& f, bool in_memory = false, bool repack = false,
                          bool repack_if_fits = false, HeldLayers held = {},
                          backend::Backend* be = nullptr);
    ~TensorSource();
    TensorSource(const TensorSource&) = delete;
    TensorSource& operator=(const TensorSource&) = delete;

    bool has(const std::string& name) const;

    // Plain: the GGUF row layout, for tensors read row by row (embeddings,
    // weights converted at load). Products: any layout the matmuls accept.
    enum class Layout { Products, Plain };

    // A 2-D matrix {cols, rows} or a 3-D stack {cols, rows, slices} in any
    // weight format the engine computes with.
    backend::Weight matrix(const std::string& name, std::initializer_list<int64_t> ne,
                           Layout layout = Layout::Products);
    // A plain matrix an op reads at forward time (the token table): registered with the
    // backend (Backend::register_view), which a device answers with a copy of its own.
    void register_view(const backend::Weight& w, const std::string& name);
    // Values the model converted itself (n floats it keeps), registered like vector()'s.
    void register_vector(const float* v, int64_t n, const std::string& name);
    // A vector of n values as F32 (converted when stored as F16/BF16), registered with the
    // backend (Backend::register_vector).
    const float* vector(const std::string& name, int64_t n);
    // As vector(), but any shape with n elements (e.g. {1, H}).
    const float* vector_any_shape(const std::string& name, int64_t n);

    // Bytes of the tensors handed out so far.
    uint64_t bytes_used() const { return bytes_used_; }
    // Bytes (in the file) of the matrices repacked so far.
    uint64_t bytes_repacked() const { return bytes_repacked_; }
    // Bytes of anonymous memory holding copies (--no-mmap, repacks).
    uint64_t bytes_copied() const { return bytes_copied_; }
    // Bytes served from the file mapping as they are (file-backed pages).
    uint64_t bytes_mapped() const { return bytes_mapped_; }
    // Bytes of the tensors checked but not held (other processes' layers).
    uint64_t bytes_skipped() const { return bytes_skipped_; }
    bool holds(const std::string& name) const { return whole_ || held_.holds(name); }
    const std::string& repack_skipped() const { return repack_skipped_; }

  private:
    const gguf::TensorInfo& find(const std::string& name) const;
    // Where the model reads a tensor's bytes: the mapping, or its copy.
    const uint8_t* place(const gguf::TensorInfo& t);
    // Anonymous read-only memory of n bytes filled by fill(p).
    const uint8_t* own(size_t n, const std::string& what,
                       const std::function<void(uint8_t*)>& fill);
    std::string where() const;

    const gguf::File& file_;
    std::deque<std::vector<float>> converted_;
    uint64_t bytes_used_ = 0;
    uint64_t bytes_repacked_ = 0;
    uint64_t bytes_copied_ = 0;
    uint64_t bytes_mapped_ = 0;
    uint64_t bytes_skipped_ = 0;
    HeldLayers held_;
    bool whole_ = true;
    bool in_memory_ = false;
    bool repack_ = false;
    std::string repack_skipped_;
    std::deque<SealedPages> copies_;  // --no-mmap's copies
    backend::Backend* be_ = nullptr;
};

// Views of part of a matrix or stack (tensor parallelism), in the file's row
// layout: rows [r0, r0 + n) of every slice, slices [s0, s0 + n), or columns
// [c0, c0 + n) of every row (whole quant blocks only). Throw, naming `what`,
// when the part cannot be cut.
backend::Weight rows_of(const backend::Weight& w, int64_t r0, int64_t n, const std::string& what);
backend::Weight slices_of(const backend::Weight& w, int64_t s0, int64_t n, const std::string& what);
backend::Weight columns_of(const backend::Weight& w, int64_t c0, int64_t n,
                           const std::string& what);

// Tensor parallelism's share of every routed expert's hidden units for rank
// `rank` of `size`: a strip when every rank's strip is whole quant blocks of
// every ffn_down_exps stack in the file, else the whole expert (split false).
struct ExpertStrip {
    bool split = false;
    int64_t first = 0, n = 0;
};
ExpertStrip expert_strip(const gguf::File& f, int64_t n_ff_exp, int rank, int size);

// The MoE tensors of one block (p = "blk.N."): router, selection bias,
// expert stacks and, when n_shared > 0, the shared expert. The routing
// parameters (experts used, normalisation, scale, clamps) are the caller's.
// experts: the routed stacks' layout (Plain when a caller cuts views of them).
backend::MoeWeights load_moe(TensorSource& ts, const std::string& p, int64_t n_embd,
                             int64_t n_ff_exp, int64_t n_expert, int64_t n_shared,
                             bool bias_required,
                             TensorSource::Layout experts = TensorSource::Layout::Products);

// What the backend's MoE holds for `rows` tokens (memory planning): each
// token's routed copies of its hidden and output rows and the shared
// expert's, the gate/up outputs, and the activation copies (at most 4 bytes
// a value), with the routing's ids and weights. n_ff: the routed experts'
// width; shared: the shared expert's.
inline size_t moe_scratch_bytes(int64_t rows, int64_t n_embd, int64_t n_ff, int64_t n_used,
                                int64_t shared) {
    const size_t E = size_t(n_embd), F = size_t(n_ff), K = size_t(n_used), S = size_t(shared);
    return size_t(rows) * ((K * F + S) * 2 + (K + 1) * E + 2 * E + 2 * K * E + K * F + 2 * K) * 4;
}

// The NextN/MTP block's tensors besides its decoder block: eh_proj mixes
// [rms(embedding) * enorm, rms(hidden) * hnorm] into the block's input, and
// shared_head_norm (the model's output_norm when the file has none) precedes
// the LM head. Each architecture's NextN adds its own block to these.
struct NextNMix {
    backend::Weight eh_proj;
    const float* enorm = nullptr;
    const float* hnorm = nullptr;
    const float* shared_head_norm = nullptr;
};
// Block il's ("blk.il.") mix tensors.
NextNMix load_nextn_mix(TensorSource& ts, int64_t il, int64_t n_embd, const float* output_norm);

// The name a model goes by: general.name, or else the file name.
std::string model_name(const gguf::File& f);

// Hyperparameters that size tensors and loops are read through hparam(): a
// value above kMaxHParam (or past int64) is refused, so the loaders' products
// of two of them (head count x head size, ...) cannot overflow before the
// tensor shapes are checked.
constexpr int64_t kMaxHParam = (int64_t(1) << 31) - 1;
int64_t hparam(const gguf::File& f, const std::string& key);                // required
int64_t hparam(const gguf::File& f, const std::string& key, int64_t dflt);  // optional
// Every layer has tensors: a block count above the file's tensor count is
// refused before anything is sized by it.
void check_layer_count(const gguf::File& f, const std::string& key, int64_t n_layers);
// The tokenizer's vocabulary and the embedding / output rows must agree: a
// token id past the rows would read outside the matrices, a row without a
// token could be sampled and not decoded.
void check_vocab_rows(const gguf::File& f);

}  // namespace glm5::model

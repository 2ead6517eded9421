// Absorbed multi-head latent attention, the sublayer both architectures share
// (glm-dsa with RoPE on part of each head, glm5next NoPE): the query and kv
// LoRA projections with their norms, the k_b absorption, attention over the
// cached latent rows, v_b and the output projection. Which rows each query
// sees is the architecture's business (its indexer): it hands in the selection
// its indexer wrote, which the backend applies per row from the step's positions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backend/attention_ops.h"
#include "backend/backend.h"
#include "model/weights.h"

namespace glm5::model {

// The sizes of one MLA layer.
struct MlaShape {
    int64_t n_head = 0;  // query heads (this rank's under tensor parallelism)
    int64_t q_lora = 0;
    int64_t kv_lora = 0;  // the latent c
    int64_t k_mla = 0;    // a head's query [nope | rope]; softmax scale 1/sqrt(k_mla)
    int64_t v_mla = 0;
    int64_t n_rot = 0;  // RoPE dimensions of a head's query and of k_rope; 0: NoPE
    float freq_base = 10000.0f;
    float eps = 1e-6f;

    int64_t nope() const { return k_mla - n_rot; }
    int64_t row() const { return kv_lora + n_rot; }  // a latent cache row: [c | k_rope]
};

struct MlaWeights {
    backend::Weight q_a, q_b, kv_a, k_b, v_b, wo;
    const float* q_a_norm = nullptr;
    const float* kv_a_norm = nullptr;
};

// The MLA tensors of a layer (p: "blk.N."), checked against `s` with all the
// file's heads. With `split` (tensor parallelism) the heads' matrices are cut
// to heads [h0, h0 + n): q_b, k_b and v_b by head, attn_output by its input
// columns, so that the ranks' outputs sum to the whole.
MlaWeights load_mla(TensorSource& ts, const std::string& p, int64_t n_embd, const MlaShape& s,
                    bool split, int64_t h0, int64_t n);

// Activations for T rows (the caller's scratch), each row dense.
struct MlaBuffers {
    backend::DevPtr<float> qr;     // [T][q_lora]: the normed query latent (indexers read it too)
    backend::DevPtr<float> q;      // [T][n_head * k_mla]
    backend::DevPtr<float> kv;     // [T][row]: the rows the cache stores
    backend::DevPtr<float> qfull;  // [T][n_head * row]: absorbed queries [q_abs | q_rope]
    backend::DevPtr<float> olat;   // [T][n_head * kv_lora]
    backend::DevPtr<float> ov;     // [T][n_head * v_mla]
};

// One sequence's rows of the batch and its latent cache.
struct MlaSeq {
    const backend::CacheRows* latent;
    int64_t first, n;
};

// One layer's MLA over T rows, in two steps around the indexer.
class MlaBlock {
  public:
    using MatmulOut = backend::Backend::MatmulOut;
    MlaBlock(backend::Backend& be, backend::AttentionOps& attn, const MlaShape& s,
             const MlaWeights& w, const MlaBuffers& b, int64_t T)
        : be_(be), attn_(attn), s_(s), w_(w), b_(b), T_(T) {}

    // The projections of the normed input xn [T][n_embd]: the normed query
    // latent (qr), the heads' queries (q) and the latent rows (kv). from_x and
    // from_qr: other products of the same inputs (an indexer's), one op each
    // with these (Backend::matmuls: the bits of separate products).
    void project(backend::DevPtr<const float> xn, std::span<const MatmulOut> from_x = {},
                 std::span<const MatmulOut> from_qr = {}) const;

    // The rest, once the indexer has selected: the latent norm and k_rope's
    // position, the rows into each sequence's cache at `pos` (the step's plan), the
    // absorbed queries, attention over what `sel` lets each row see, and the heads'
    // outputs projected to out [T][n_embd] (under tensor parallelism this rank's
    // part of the sum).
    void attend(backend::DevPtr<const int32_t> pos, std::span<const MlaSeq> seqs,
                const backend::AttentionOps::Selection& sel, backend::DevPtr<float> out) const;

  private:
    backend::Backend& be_;
    backend::AttentionOps& attn_;
    MlaShape s_;
    const MlaWeights& w_;  // the layer's (outlives the block)
    MlaBuffers b_;
    int64_t T_;
};

}  // namespace glm5::model

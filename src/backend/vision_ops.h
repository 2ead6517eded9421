// The vision family: the ops of the glm5next vision tower
// (docs/glm5next-format.md section 12.4) beside the core's products and norms.
#pragma once

#include <cmath>
#include <vector>

#include "backend/backend.h"

namespace glm5::backend {

// rope_2d's frequencies f_i = theta^(-4i/dim), i < dim/4, in double: every backend's angles
// (position times f_i, rounded once) come from these.
inline std::vector<double> rope_2d_frequencies(int64_t dim, float theta) {
    const int64_t half = dim / 2, quarter = dim / 4;
    std::vector<double> f(static_cast<size_t>(quarter));
    for (int64_t i = 0; i < quarter; ++i)
        f[size_t(i)] = std::pow(double(theta), -double(2 * i) / double(half));
    return f;
}

class VisionOps {
  public:
    static constexpr const char* kWhat = "the vision tower's ops";
    virtual ~VisionOps() = default;

    // y[r][i] += b[i] for r < n_rows, i < dim (rows `stride` apart).
    virtual void add_bias(DevPtr<float> y, int64_t n_rows, int64_t dim, int64_t stride,
                          const float* b) = 0;
    // y = 0.5 y (1 + erf(y / sqrt 2)), n values in place.
    virtual void gelu_erf(DevPtr<float> y, int64_t n) = 0;
    // 2-D rotary embedding, rotate-half pairing, per head of `dim` values
    // (dim a multiple of 4) at x[t*tok_stride + h*dim]: with
    // f_i = theta^(-4i/dim) for i < dim/4 and the angles
    // a = [row[t] f | col[t] f] (dim/2 values),
    //   out[i] = x[i] cos a_i - x[i + dim/2] sin a_i,
    //   out[i + dim/2] = x[i + dim/2] cos a_i + x[i] sin a_i   (i < dim/2).
    virtual void rope_2d(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                         int64_t dim, const int32_t* row, const int32_t* col, float theta) = 0;
    // Non-causal attention of every token of a sequence to every token of it
    // (an image's patches): out = softmax(scale q k^T) v per head. q, k, v and
    // out are [n][stride], head h at columns h*dim.. . Streamed in tiles with
    // a running softmax: memory is O(n), never the n x n scores.
    struct FullAttentionSeq {
        DevPtr<const float> q, k, v;
        DevPtr<float> out;
        int64_t n = 0;
    };
    virtual void attention_full(std::span<const FullAttentionSeq> seqs, int64_t n_heads,
                                int64_t dim, int64_t stride, float scale) = 0;
};

}  // namespace glm5::backend

// Tile kernels of the vision tower's full (non-causal) attention
// (cpu_vision.cpp): plain C++ and AVX2+FMA versions, picked once at run time.
// Each output value is a fixed chain of operations over its own inputs, so
// the result does not depend on threads or on how queries are grouped.
#pragma once

#include <cstdint>

namespace glm5::backend::cpu {

struct AttnTileOps {
    // s[i*lds + j] = scale * (q[i*ldq ..] . kt[.. + j]) over c < dim, for
    // i < nq (<= kQueryTile), j < nk (a multiple of 8); kt is [dim][ldk].
    void (*scores)(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t ldk,
                   int64_t nk, int64_t dim, float scale, float* s, int64_t lds);
    // x[j] = exp(x[j] - m) for j < n; returns their sum (fixed order).
    float (*exp_sum)(float* x, int64_t n, float m);
    // o[i*ldo + c] += sum over j < nk (in order) of p[i*ldp + j] * v[j*ldv + c],
    // for i < nq, c < dim.
    void (*pv)(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t ldv, int64_t nk,
               int64_t dim, float* o, int64_t ldo);
};

constexpr int64_t kQueryTile = 32;  // queries per task
constexpr int64_t kKeyTile = 64;    // keys per step of the running softmax

// The AVX2 kernels need dim % 8 == 0.
const AttnTileOps& attn_tile_ops(int64_t dim);

namespace avx2 {
void attn_scores(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t ldk, int64_t nk,
                 int64_t dim, float scale, float* s, int64_t lds);
float attn_exp_sum(float* x, int64_t n, float m);
void attn_pv(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t ldv, int64_t nk,
             int64_t dim, float* o, int64_t ldo);
}  // namespace avx2

}  // namespace glm5::backend::cpu

// The mixture of experts on the GPU: the router's products and a top-k per token; the
// routed experts as products whose slice each (token, slot) pair names, so every pair
// is one launch's row whatever the batch; the shared expert as plain products; then
// each output value the pairs' weighted rows in selection order and the shared row, the
// CPU's combine.
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace glm5::backend::cuda {

namespace {

constexpr int kRouteWarps = 4;

// A warp per token: its lanes compute the experts' probabilities and selection scores
// into shared memory (the sigmoids were a thread's serial work per token), then lane 0
// applies the routing rule (moe_ops.h) to them, with the bits of the rule computing them
// itself. Dynamic shared memory: 2 * n_expert floats a warp.
__global__ void route_kernel(const float* logits, int64_t n_tok, int64_t n_expert, int n_used,
                             const float* bias, bool norm, float weights_scale, int32_t* ids,
                             float* weights) {
    GLM5_DYNAMIC_SHARED(float, sh);
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
    if (t >= n_tok) return;  // the whole warp
    float* p = sh + int64_t(warp) * 2 * n_expert;
    float* s = p + n_expert;
    const float* l = logits + t * n_expert;
    for (int64_t e = lane; e < n_expert; e += 32) {
        p[e] = hd_sigmoid(l[e]);
        s[e] = p[e] + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    if (lane != 0) return;
    auto prob = [&](int64_t e) { return p[e]; };
    auto sel = [&](int64_t e) { return s[e]; };
    route_pick(sel, prob, n_expert, n_used, norm, weights_scale, ids + t * n_used,
               weights + t * n_used);
}

// out[t][c] = sum_k w[t][k] * rows[t * K + k][c], in k order (the first a product, then
// each added), then + shared[t][c]; zero with neither.
__global__ void combine_kernel(const float* rows, const float* weights, int64_t n_tok, int K,
                               int64_t E, const float* shared, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tok * E) return;
    const int64_t t = i / E, c = i % E;
    float o = 0.f;
    for (int k = 0; k < K; ++k) {
        const float v = __fmul_rn(rows[(t * K + k) * E + c], weights[t * K + k]);
        o = k == 0 ? v : o + v;
    }
    if (shared) o = K > 0 ? o + shared[t * E + c] : shared[t * E + c];
    out[i] = o;
}

}  // namespace

void CudaBackend::moe_route(const MoeRouter& r, DevPtr<const float> x, int64_t n_tok,
                            DevPtr<int32_t> ids, DevPtr<float> weights) {
    Temporaries tmp(*this);
    op("moe.router", n_tok);
    if (n_tok <= 0) return;
    const int64_t X = r.router.rows;
    auto* logits = static_cast<float*>(scratch_bytes(size_t(n_tok * X) * sizeof(float)));
    dev_.matmul(matrix(r.router, "moe_route"), 0, dev(x), r.router.cols, n_tok, logits, X);
    GLM5_LAUNCH(route_kernel, grid_for(n_tok, kRouteWarps), kRouteWarps * 32,
                size_t(kRouteWarps) * 2 * size_t(X) * sizeof(float), stream(), logits, n_tok, X,
                r.n_used, vec(r.bias, X), r.norm_weights, r.weights_scale, dev(ids), dev(weights));
}

void CudaBackend::moe_experts(const MoeFfn& routed, DevPtr<const float> x_, int64_t T,
                              DevPtr<const int32_t> ids_, DevPtr<const float> wts_, int n_used,
                              const MoeFfn* shared, DevPtr<const float> shared_rows,
                              DevPtr<float> out) {
    Temporaries tmp(*this);
    op("moe", T);
    if (T <= 0) return;
    const float* x = dev(x_);
    const int K = routed ? n_used : 0;
    const int64_t E = routed ? routed.gate.cols : shared->gate.cols;
    const int64_t P = T * K;
    float* eo = nullptr;
    if (K > 0) {
        const Matrix g = matrix(routed.gate, "moe_experts"), u = matrix(routed.up, "moe_experts"),
                     d = matrix(routed.down, "moe_experts");
        const int64_t F = g.rows;
        auto* hg = static_cast<float*>(scratch_bytes(size_t(P * F) * sizeof(float)));
        eo = static_cast<float*>(scratch_bytes(size_t(P * E) * sizeof(float)));
        const int32_t* ids = dev(ids_);
        dev_.gate_up(g, u, ids, P, K, x, E, routed.clamp, hg);
        dev_.matmul_indexed(d, ids, P, 1, hg, F, eo, E);
        matmul_calls_ += 3;
    }
    const float* sh = dev(shared_rows);
    if (shared && *shared) {
        const Matrix g = matrix(shared->gate, "moe_shared"), u = matrix(shared->up, "moe_shared"),
                     d = matrix(shared->down, "moe_shared");
        const int64_t S = g.rows;
        auto* sg = static_cast<float*>(scratch_bytes(size_t(T * S) * sizeof(float)));
        auto* so = static_cast<float*>(scratch_bytes(size_t(T * E) * sizeof(float)));
        dev_.gate_up(g, u, nullptr, T, 1, x, E, shared->clamp, sg);
        dev_.matmul(d, 0, sg, S, T, so, E);
        matmul_calls_ += 3;
        sh = so;
    }
    GLM5_LAUNCH(combine_kernel, grid_for(T * E), kThreads, 0, stream(), eo, dev(wts_), T, K, E, sh,
                dev(out));
}

void CudaBackend::moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t n_tok,
                             DevPtr<float> out) {
    moe_experts(MoeFfn{}, x, n_tok, nullptr, nullptr, 0, &shared, nullptr, out);
}

}  // namespace glm5::backend::cuda

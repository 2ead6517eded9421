// The mixture-of-experts family: a sigmoid router's top-k, the routed SwiGLU experts and
// the shared expert, as three ops so that routing and the shared expert can run on one
// backend and a layer's routed experts on another (experts in system RAM beside a
// device). The routing rule itself lives here once (route_pick), as host-and-device code
// both backends run.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "core/hd.h"

namespace glm5::backend {

// A mixture of experts' routing: a sigmoid router with a selection-only bias, the top
// n_used experts, their weights renormalised and scaled.
struct MoeRouter {
    Weight router;                // [E -> n_expert], F32 in practice
    const float* bias = nullptr;  // selection-only bias [n_expert] (host memory of the weight file)
    int n_used = 0;
    bool norm_weights = true;
    float weights_scale = 1.0f;
};

// SwiGLU FFNs: the routed experts (stacks of n_expert matrices) or the shared expert.
struct MoeFfn {
    Weight gate, up, down;
    float clamp = 0.0f;  // SwiGLU clamp limit (<= 1e-6: none)
    explicit operator bool() const { return bool(gate); }
};

struct MoeWeights {
    MoeRouter route;
    MoeFfn experts;
    MoeFfn shared;  // optional
};

// The routing rule for one token, both backends' (host-and-device code). sel(e): expert
// e's selection score (its probability plus the selection-only bias); prob(e): its
// probability. The n_used highest selection scores, ties to the lower expert and a NaN
// score ranked below every number (so a router that produced one still fills each pick
// with a real expert); then each pick's weight: its probability, divided by the picks'
// sum (in double, at least 2^-14) when `norm`, times `scale`.
template <class Sel, class Prob>
GLM5_HD void route_pick(Sel sel, Prob prob, int64_t n_expert, int n_used, bool norm, float scale,
                        int32_t* ids, float* weights) {
    // The k-th pick is the best expert below the (k-1)-th in the order.
    float last = INFINITY;
    int64_t last_e = -1;
    double sum = 0.0;
    for (int k = 0; k < n_used; ++k) {
        int64_t best = -1;
        float bv = -INFINITY;
        for (int64_t e = 0; e < n_expert; ++e) {
            float v = sel(e);
            if (v != v) v = -INFINITY;
            const bool below = v < last || (v == last && e > last_e);
            if (below && (best < 0 || v > bv)) best = e, bv = v;
        }
        if (best < 0) best = 0;  // fewer experts than picks: refused at load
        ids[k] = int32_t(best);
        last = bv;
        last_e = best;
        sum += double(prob(best));
    }
    const float denom = fmaxf(float(sum), 6.103515625e-5f);
    for (int k = 0; k < n_used; ++k) {
        float w = prob(ids[k]);
        if (norm) w = w / denom;
        weights[k] = hd_mul(w, scale);
    }
}

class MoeOps {
  public:
    static constexpr const char* kWhat = "the mixture-of-experts ops";
    virtual ~MoeOps() = default;

    // x: [n_tok][E] (the normed FFN input).
    // Three ops, so that routing and the shared expert can run on one backend and a
    // layer's routed experts on another. x: [n_tok][E] (the normed FFN input).
    //
    // The routing: ids and weights [n_tok][n_used] in backend memory (they never
    // visit the host).
    virtual void moe_route(const MoeRouter& r, DevPtr<const float> x, int64_t n_tok,
                           DevPtr<int32_t> ids, DevPtr<float> weights) = 0;
    // out [n_tok][E] (overwritten) = the routed experts' outputs summed in selection
    // order with their weights, then the shared expert's added: computed here within
    // the same passes when `fused_shared` is given (one backend holds both), else the
    // rows `shared_rows` that moe_shared wrote (elsewhere, maybe), or none when both
    // are null.
    virtual void moe_experts(const MoeFfn& experts, DevPtr<const float> x, int64_t n_tok,
                             DevPtr<const int32_t> ids, DevPtr<const float> weights, int n_used,
                             const MoeFfn* fused_shared, DevPtr<const float> shared_rows,
                             DevPtr<float> out) = 0;
    // The shared expert alone: out [n_tok][E] (overwritten), the rows moe_experts' fused
    // form adds, bit for bit.
    virtual void moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t n_tok,
                            DevPtr<float> out) = 0;
};

// All of a layer's mixture on one backend, the shared expert fused (ids and weights in
// its scratch).
inline void moe_all(Backend& be, MoeOps& ops, const MoeWeights& m, DevPtr<const float> x,
                    int64_t n_tok, DevPtr<float> out) {
    const size_t n = size_t(n_tok) * size_t(m.route.n_used);
    const DevPtr<int32_t> ids = be.scratch_ids(n);
    const DevPtr<float> weights = be.scratch(n);
    ops.moe_route(m.route, x, n_tok, ids, weights);
    ops.moe_experts(m.experts, x, n_tok, ids, weights, m.route.n_used,
                    m.shared ? &m.shared : nullptr, nullptr, out);
}

}  // namespace glm5::backend

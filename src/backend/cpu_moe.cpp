// Mixture-of-experts FFN on the CPU: route, group the (token, slot) pairs by
// expert so each expert's weights are read once per batch, then combine.
#include "backend/cpu_backend.h"

namespace glm5::backend::cpu {

void CpuBackend::moe(const MoeWeights& m, const float* x, int64_t T, float* out) {
    const int64_t E = m.router.cols, X = m.router.rows, K = m.n_used, F = m.gate.rows;

    // Route: sigmoid probabilities; the bias only decides which experts run.
    std::vector<float> logits(static_cast<size_t>(T * X));
    products(m.router, 1, x, E, 0, T, logits.data(), X, 0);
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> wts(static_cast<size_t>(T * K));
    {
        std::vector<float> p(static_cast<size_t>(X)), sel(static_cast<size_t>(X));
        std::vector<int32_t> order(static_cast<size_t>(X));
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t e = 0; e < X; ++e) {
                p[size_t(e)] = sigmoid(logits[size_t(t * X + e)]);
                sel[size_t(e)] = p[size_t(e)] + (m.bias ? m.bias[e] : 0.0f);
            }
            kernels::top_k_desc(sel.data(), X, K, order);
            double sum = 0.0;
            for (int64_t k = 0; k < K; ++k) sum += double(p[size_t(order[size_t(k)])]);
            const float denom = std::max(float(sum), 6.103515625e-5f);
            for (int64_t k = 0; k < K; ++k) {
                const int32_t e = order[size_t(k)];
                float wk = p[size_t(e)];
                if (m.norm_weights) wk = wk / denom;
                wk *= m.weights_scale;
                ids[size_t(t * K + k)] = e;
                wts[size_t(t * K + k)] = wk;
            }
        }
    }

    // Group the (token, slot) pairs by expert so each expert's weights are
    // read once for all the tokens routed to it.
    std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(X));
    for (int64_t i = 0; i < T * K; ++i) by_expert[size_t(ids[size_t(i)])].push_back(int32_t(i));
    std::vector<int32_t> active;
    for (int64_t e = 0; e < X; ++e)
        if (!by_expert[size_t(e)].empty()) active.push_back(int32_t(e));

    // Gate and up projections for every pair.
    size_t arow_x = 0, arow_xu = 0;
    const uint8_t* ax = quantize_acts(act_buf_, m.gate.type, E, 1, x, E, 0, T, arow_x);
    const uint8_t* axu = ax;
    if (quant::traits(m.up.type).vec_dot_type != quant::traits(m.gate.type).vec_dot_type)
        axu = quantize_acts(act_buf2_, m.up.type, E, 1, x, E, 0, T, arow_xu);
    else
        arow_xu = arow_x;
    std::vector<float> g(static_cast<size_t>(T * K * F)), u(static_cast<size_t>(T * K * F));
    {
        const quant::VecDotFn dg = quant::vec_dot_fn(m.gate.type),
                              du = quant::vec_dot_fn(m.up.type);
        const int64_t grain =
            std::clamp<int64_t>(F * int64_t(active.size()) / (8 * pool_.size()), 1, 64);
        const int64_t chunks = (F + grain - 1) / grain;
        pool_.parallel_for(int64_t(active.size()) * chunks, 1, [&](int64_t b, int64_t e_, int) {
            for (int64_t task = b; task < e_; ++task) {
                const int32_t e = active[size_t(task / chunks)];
                const int64_t r0 = (task % chunks) * grain, r1 = std::min(F, r0 + grain);
                for (int64_t r = r0; r < r1; ++r) {
                    const uint8_t* wg = m.gate.row(r, e);
                    const uint8_t* wu = m.up.row(r, e);
                    for (int32_t pair : by_expert[size_t(e)]) {
                        const int64_t t = pair / K;
                        g[size_t(pair * F + r)] = dg(E, wg, ax + size_t(t) * arow_x);
                        u[size_t(pair * F + r)] = du(E, wu, axu + size_t(t) * arow_xu);
                    }
                }
            }
        });
    }
    swiglu(g.data(), u.data(), T * K, F, F, m.clamp_routed, g.data());

    // Down projections.
    size_t arow_h = 0;
    const uint8_t* ah = quantize_acts(act_buf_, m.down.type, F, 1, g.data(), F, 0, T * K, arow_h);
    std::vector<float> eo(static_cast<size_t>(T * K * E));
    {
        const quant::VecDotFn dd = quant::vec_dot_fn(m.down.type);
        const int64_t grain =
            std::clamp<int64_t>(E * int64_t(active.size()) / (8 * pool_.size()), 1, 64);
        const int64_t chunks = (E + grain - 1) / grain;
        pool_.parallel_for(int64_t(active.size()) * chunks, 1, [&](int64_t b, int64_t e_, int) {
            for (int64_t task = b; task < e_; ++task) {
                const int32_t e = active[size_t(task / chunks)];
                const int64_t r0 = (task % chunks) * grain, r1 = std::min(E, r0 + grain);
                for (int64_t r = r0; r < r1; ++r) {
                    const uint8_t* wd = m.down.row(r, e);
                    for (int32_t pair : by_expert[size_t(e)])
                        eo[size_t(pair * E + r)] = dd(F, wd, ah + size_t(pair) * arow_h);
                }
            }
        });
    }
    weight_bytes_ += active.size() * (m.gate.slice_bytes + m.up.slice_bytes + m.down.slice_bytes);

    // Weighted sum in selection order.
    for (int64_t t = 0; t < T; ++t) {
        float* o = out + t * E;
        for (int64_t k = 0; k < K; ++k) {
            const float wk = wts[size_t(t * K + k)];
            const float* src = eo.data() + (t * K + k) * E;
            if (k == 0)
                for (int64_t i = 0; i < E; ++i) o[i] = src[i] * wk;
            else
                for (int64_t i = 0; i < E; ++i) o[i] += src[i] * wk;
        }
    }

    // The shared expert sees every token, unweighted.
    if (m.shared_gate) {
        const int64_t S = m.shared_gate.rows;
        std::vector<float> sg(static_cast<size_t>(T * S)), su(static_cast<size_t>(T * S)),
            so(static_cast<size_t>(T * E));
        products(m.shared_gate, 1, x, E, 0, T, sg.data(), S, 0);
        products(m.shared_up, 1, x, E, 0, T, su.data(), S, 0);
        swiglu(sg.data(), su.data(), T, S, S, m.clamp_shared, sg.data());
        products(m.shared_down, 1, sg.data(), S, 0, T, so.data(), E, 0);
        for (int64_t i = 0; i < T * E; ++i) out[i] += so[size_t(i)];
    }
}

}  // namespace glm5::backend::cpu

// Mixture-of-experts FFN on the CPU: route, group the (token, slot) pairs by
// expert so each expert's weights are read once per batch, then combine.
#include "backend/cpu_backend.h"

#include <functional>
#include <optional>

namespace glm5::backend::cpu {

void CpuBackend::moe(const MoeWeights& m, const float* x, int64_t T, float* out) {
    OpTimer timer_(profile_, "moe");
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

    // Phases timed apart under GLM5_PROFILE.
    std::optional<OpTimer> phase;
    phase.emplace(profile_, "moe.route");
    // Sort the (token, k) pairs by expert: expert e's pairs take the slots
    // [first[e], first[e+1]), so its activations are contiguous rows and each
    // weight row is read once and applied to all of them (the multi kernels).
    std::vector<int64_t> first(static_cast<size_t>(X + 1), 0);
    for (int64_t i = 0; i < T * K; ++i) ++first[size_t(ids[size_t(i)] + 1)];
    for (int64_t e = 0; e < X; ++e) first[size_t(e + 1)] += first[size_t(e)];
    std::vector<int64_t> slot_of(static_cast<size_t>(T * K)),
        cursor(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) slot_of[size_t(i)] = cursor[size_t(ids[size_t(i)])]++;
    std::vector<int32_t> active;
    for (int64_t e = 0; e < X; ++e)
        if (first[size_t(e + 1)] > first[size_t(e)]) active.push_back(int32_t(e));
    const int64_t P = T * K;

    // Activations of every slot, in slot order, for the gate and up types.
    auto gather = [&](ByteBuffer& buf, quant::Type type, size_t& arow) {
        const uint8_t* a = quantize_acts(act_buf_, type, E, 1, x, E, 0, T, arow);
        uint8_t* g = buf.get(arow * size_t(P));
        for (int64_t i = 0; i < P; ++i)
            std::memcpy(g + size_t(slot_of[size_t(i)]) * arow, a + size_t(i / K) * arow, arow);
        return static_cast<const uint8_t*>(g);
    };
    size_t arow_g = 0, arow_u = 0;
    const uint8_t* xg = gather(moe_gate_buf_, m.gate.type, arow_g);
    const uint8_t* xu = xg;
    if (quant::traits(m.up.type).vec_dot_type != quant::traits(m.gate.type).vec_dot_type)
        xu = gather(moe_up_buf_, m.up.type, arow_u);
    else
        arow_u = arow_g;

    // out[(slot)][r] = W_e row r . act[slot] for the slots of expert e.
    auto expert_rows = [&](const Weight& w, const uint8_t* act, size_t arow, float* out_rows,
                           int64_t ld, int64_t i0, int64_t i1, int64_t e, std::vector<float>& tmp) {
        const quant::VecDotFn dot = quant::vec_dot_fn(w.type);
        const quant::VecDotMultiFn multi = quant::vec_dot_multi_fn(w.type);
        const int64_t s0 = first[size_t(e)], n = first[size_t(e + 1)] - s0;
        if (w.repacked) {
            repacked_rows(w, e, i0, i1, act + size_t(s0) * arow, arow, n, out_rows + s0 * ld, ld);
            return;
        }
        tmp.resize(size_t(n));
        for (int64_t r = i0; r < i1; ++r) {
            const uint8_t* wr = w.row(r, e);
            const uint8_t* a0 = act + size_t(s0) * arow;
            if (multi && n > 1)
                multi(w.cols, wr, a0, arow, n, tmp.data());
            else
                for (int64_t j = 0; j < n; ++j)
                    tmp[size_t(j)] = dot(w.cols, wr, a0 + size_t(j) * arow);
            for (int64_t j = 0; j < n; ++j) out_rows[(s0 + j) * ld + r] = tmp[size_t(j)];
        }
    };
    // Row chunks are whole groups when either weight of the pass is repacked.
    auto for_expert_rows = [&](const Weight& w1, const Weight& w2, int64_t rows,
                               const std::function<void(int64_t, int64_t, int64_t, int)>& fn) {
        const int64_t want = rows * int64_t(active.size()) / (8 * pool_.size());
        const int64_t grain = std::max(row_grain(w1, want), row_grain(w2, want));
        const int64_t chunks = (rows + grain - 1) / grain;
        pool_.parallel_for(int64_t(active.size()) * chunks, 1, [&](int64_t b, int64_t e_, int ith) {
            for (int64_t task = b; task < e_; ++task) {
                const int64_t r0 = (task % chunks) * grain;
                fn(active[size_t(task / chunks)], r0, std::min(rows, r0 + grain), ith);
            }
        });
    };

    phase.reset();
    phase.emplace(profile_, "moe.gate_up");
    // Gate and up projections, SwiGLU.
    // Persistent, uninitialised buffers: these are tens of MB in prefill, and
    // fresh zeroed allocations cost page faults on every layer.
    float* g = moe_floats(moe_g_, size_t(P * F));
    float* u = moe_floats(moe_u_, size_t(P * F));
    for_expert_rows(m.gate, m.up, F, [&](int64_t e, int64_t r0, int64_t r1, int ith) {
        std::vector<float>& tmp = per_thread_[size_t(ith)].row;
        expert_rows(m.gate, xg, arow_g, g, F, r0, r1, e, tmp);
        expert_rows(m.up, xu, arow_u, u, F, r0, r1, e, tmp);
    });
    swiglu(g, u, P, F, F, m.clamp_routed, g);

    phase.reset();
    phase.emplace(profile_, "moe.down");
    // Down projections (the hidden rows are already in slot order).
    size_t arow_h = 0;
    const uint8_t* ah = quantize_acts(act_buf_, m.down.type, F, 1, g, F, 0, P, arow_h);
    float* eo = moe_floats(moe_eo_, size_t(P * E));
    for_expert_rows(m.down, m.down, E, [&](int64_t e, int64_t r0, int64_t r1, int ith) {
        expert_rows(m.down, ah, arow_h, eo, E, r0, r1, e, per_thread_[size_t(ith)].row);
    });
    weight_bytes_ += active.size() * (m.gate.slice_bytes + m.up.slice_bytes + m.down.slice_bytes);

    // Weighted sum in selection order.
    for (int64_t t = 0; t < T; ++t) {
        float* o = out + t * E;
        for (int64_t k = 0; k < K; ++k) {
            const float wk = wts[size_t(t * K + k)];
            const float* src = eo + slot_of[size_t(t * K + k)] * E;
            if (k == 0)
                for (int64_t i = 0; i < E; ++i) o[i] = src[i] * wk;
            else
                for (int64_t i = 0; i < E; ++i) o[i] += src[i] * wk;
        }
    }

    phase.reset();
    phase.emplace(profile_, "moe.shared");
    // The shared expert sees every token, unweighted.
    if (m.shared_gate) {
        const int64_t S = m.shared_gate.rows;
        float* sg = moe_floats(moe_g_, size_t(T * S));
        float* su = moe_floats(moe_u_, size_t(T * S));
        float* so = moe_floats(moe_eo_, size_t(T * E));
        products(m.shared_gate, 1, x, E, 0, T, sg, S, 0);
        products(m.shared_up, 1, x, E, 0, T, su, S, 0);
        swiglu(sg, su, T, S, S, m.clamp_shared, sg);
        products(m.shared_down, 1, sg, S, 0, T, so, E, 0);
        for (int64_t i = 0; i < T * E; ++i) out[i] += so[i];
    }
}

}  // namespace glm5::backend::cpu

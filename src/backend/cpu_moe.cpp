// Mixture-of-experts FFN on the CPU: route, group the (token, slot) pairs by
// expert so each expert's weights are read once per batch, then combine.
#include "backend/cpu_backend.h"

#include <functional>
#include <optional>

namespace glm5::backend::cpu {

void CpuBackend::moe_route(const MoeRouter& m, DevPtr<const float> x_, int64_t T,
                           DevPtr<int32_t> ids_, DevPtr<float> wts_) {
    const float* x = host(x_);
    int32_t* ids = host(ids_);
    float* wts = host(wts_);
    OpTimer timer_(profile_, "moe.router", T);
    const int64_t E = m.router.cols, X = m.router.rows, K = m.n_used;
    // Route: sigmoid probabilities; the bias only decides which experts run.
    std::vector<float> logits(static_cast<size_t>(T * X));
    products(m.router, 1, x, E, 0, T, logits.data(), X, 0);
    std::vector<float> p(static_cast<size_t>(X)), sel(static_cast<size_t>(X));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < X; ++e) {
            p[size_t(e)] = hd_sigmoid(logits[size_t(t * X + e)]);
            sel[size_t(e)] = p[size_t(e)] + (m.bias ? m.bias[e] : 0.0f);
        }
        route_pick([&](int64_t e) { return sel[size_t(e)]; },
                   [&](int64_t e) { return p[size_t(e)]; }, X, int(K), m.norm_weights,
                   m.weights_scale, ids + t * K, wts + t * K);
    }
}

void CpuBackend::moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t T,
                            DevPtr<float> out) {
    // The fused form's shared unit with no routed pairs: the same activations and
    // products, so the rows are those moe_experts adds.
    moe_experts(MoeFfn{}, x, T, nullptr, nullptr, 0, &shared, nullptr, out);
}

void CpuBackend::moe_experts(const MoeFfn& routed, DevPtr<const float> x_, int64_t T,
                             DevPtr<const int32_t> ids_, DevPtr<const float> wts_, int n_used,
                             const MoeFfn* shared_ffn, DevPtr<const float> shared_rows_,
                             DevPtr<float> out_) {
    const float* x = host(x_);
    float* out = host(out_);
    const int32_t* ids = host(ids_);
    const float* wts = host(wts_);
    const float* shared_rows = host(shared_rows_);
    OpTimer timer_(profile_, "moe", T);
    const int64_t K = n_used;
    const int64_t X = routed ? routed.gate.slices : 0, F = routed ? routed.gate.rows : 0;
    const int64_t E = routed ? routed.gate.cols : shared_ffn->gate.cols;
    // Written as one MoeWeights-like view for the code below.
    struct View {
        Weight gate, up, down, shared_gate, shared_up, shared_down;
        float clamp_routed, clamp_shared;
    } m{routed.gate,
        routed.up,
        routed.down,
        shared_ffn ? shared_ffn->gate : Weight{},
        shared_ffn ? shared_ffn->up : Weight{},
        shared_ffn ? shared_ffn->down : Weight{},
        routed.clamp,
        shared_ffn ? shared_ffn->clamp : 0.0f};

    // Phases timed apart under GLM5_PROFILE.
    std::optional<OpTimer> phase;
    phase.reset();
    phase.emplace(profile_, "moe.route", T);
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

    // The shared expert runs as one more unit of the same passes (one task
    // pool per phase instead of three products of its own), on every token.
    const bool shared = bool(m.shared_gate);
    const int64_t S = shared ? m.shared_gate.rows : 0;

    // Activations of every token in the gate and up formats (token order,
    // kept for the shared expert), and of every slot in slot order.
    auto same_acts = [](const Weight& a, const Weight& b) {
        return quant::traits(a.type).vec_dot_type == quant::traits(b.type).vec_dot_type;
    };
    auto gather = [&](ByteBuffer& buf, const uint8_t* a, size_t arow) {
        uint8_t* g = buf.get(arow * size_t(P));
        for (int64_t i = 0; i < P; ++i)
            std::memcpy(g + size_t(slot_of[size_t(i)]) * arow, a + size_t(i / K) * arow, arow);
        return static_cast<const uint8_t*>(g);
    };
    // (With no routed experts, moe_shared's form: the shared gate's and up's formats.)
    const Weight& act_g = routed ? m.gate : m.shared_gate;
    const Weight& act_u = routed ? m.up : m.shared_up;
    size_t arow_g = 0;
    const uint8_t* tg = quantize_acts(moe_tok_g_, act_g.type, E, 1, x, E, 0, T, arow_g);
    const uint8_t* tu = tg;
    size_t arow_u = arow_g;
    if (!same_acts(act_u, act_g))
        tu = quantize_acts(moe_tok_u_, act_u.type, E, 1, x, E, 0, T, arow_u);
    const uint8_t* xg = gather(moe_gate_buf_, tg, arow_g);
    const uint8_t* xu = tu == tg ? xg : gather(moe_up_buf_, tu, arow_u);

    // A unit is one expert's three matrices applied to its n activation rows,
    // rows [a0, a0 + n) of its phase's activations and outputs.
    struct Unit {
        const Weight *gate, *up, *down;
        int64_t slice, a0, n, width;  // width: the hidden rows' (gate.rows)
        const uint8_t *ag, *au, *ad;
        size_t arow_g, arow_u, arow_d;
        float *g, *u, *o;  // first output row of each projection
    };
    // Gate and up outputs: routed rows are F wide (slot order), the shared
    // expert's S wide after them. Persistent, uninitialised buffers: these
    // are tens of MB in prefill, and fresh zeroed allocations cost page
    // faults on every layer.
    const size_t hidden = size_t(P * F + T * S);
    float* g = float_buffer(moe_g_, hidden);
    float* u = float_buffer(moe_u_, hidden);
    float* eo = float_buffer(moe_eo_, size_t((P + (shared ? T : 0)) * E));
    std::vector<Unit> units;
    for (int32_t e : active) {
        const int64_t s0 = first[size_t(e)];
        units.push_back({&m.gate, &m.up, &m.down, e, s0, first[size_t(e + 1)] - s0, F,
                         xg + size_t(s0) * arow_g, xu + size_t(s0) * arow_u, nullptr, arow_g,
                         arow_u, 0, g + s0 * F, u + s0 * F, eo + s0 * E});
    }
    if (shared) {
        // Token order: the routed experts' token-order activations serve
        // where the formats agree.
        Unit sh{};
        sh.gate = &m.shared_gate;
        sh.up = &m.shared_up;
        sh.down = &m.shared_down;
        sh.n = T;
        sh.width = S;
        sh.g = g + P * F;
        sh.u = u + P * F;
        sh.o = eo + P * E;
        auto token_acts = [&](const Weight& w, ByteBuffer& own, size_t& arow) {
            if (same_acts(w, act_g)) {
                arow = arow_g;
                return tg;
            }
            if (same_acts(w, act_u)) {
                arow = arow_u;
                return tu;
            }
            return quantize_acts(own, w.type, E, 1, x, E, 0, T, arow);
        };
        sh.ag = token_acts(m.shared_gate, act_buf_, sh.arow_g);
        sh.au = token_acts(m.shared_up, act_buf2_, sh.arow_u);
        units.push_back(sh);
    }

    // fn(unit, matrix, r0, r1) over the rows of matrices [0, n_mat) of every
    // unit (weight_of(unit, matrix)), all in one guided pass.
    auto for_unit_rows = [&](int n_mat, auto weight_of, auto fn) {
        for_weight_rows(
            units.size() * size_t(n_mat),
            [&](size_t k) -> const Weight& { return *weight_of(units[k / n_mat], int(k % n_mat)); },
            [&](size_t k, int64_t r0, int64_t r1) {
                fn(units[k / n_mat], int(k % n_mat), r0, r1);
            });
    };

    phase.reset();
    phase.emplace(profile_, "moe.gate_up", T);
    // Gate and up projections, SwiGLU.
    for_unit_rows(
        2, [](const Unit& un, int mat) { return mat == 0 ? un.gate : un.up; },
        [&](const Unit& un, int mat, int64_t r0, int64_t r1) {
            if (mat == 0)
                product_rows(*un.gate, un.slice, r0, r1, un.ag, un.arow_g, un.n, un.g, un.width);
            else
                product_rows(*un.up, un.slice, r0, r1, un.au, un.arow_u, un.n, un.u, un.width);
        });
    if (P > 0) swiglu(dev(g), dev(u), P, F, F, m.clamp_routed, dev(g));
    if (shared) swiglu(dev(g + P * F), dev(u + P * F), T, S, S, m.clamp_shared, dev(g + P * F));

    phase.reset();
    phase.emplace(profile_, "moe.down", T);
    // Down projections (the hidden rows are already in unit order).
    size_t arow_h = 0;
    const uint8_t* ah =
        P > 0 ? quantize_acts(act_buf_, m.down.type, F, 1, g, F, 0, P, arow_h) : nullptr;
    for (Unit& un : units)
        if (un.down == &m.down) {
            un.ad = ah + size_t(un.a0) * arow_h;
            un.arow_d = arow_h;
        }
    if (shared) {
        Unit& sh = units.back();
        sh.ad = quantize_acts(act_buf2_, m.shared_down.type, S, 1, g + P * F, S, 0, T, sh.arow_d);
    }
    for_unit_rows(
        1, [](const Unit& un, int) { return un.down; },
        [&](const Unit& un, int, int64_t r0, int64_t r1) {
            product_rows(*un.down, un.slice, r0, r1, un.ad, un.arow_d, un.n, un.o, E);
        });
    if (routed)
        weight_bytes_ += active.size() *
                         (m.gate.payload_bytes() + m.up.payload_bytes() + m.down.payload_bytes());
    if (shared)
        weight_bytes_ += m.shared_gate.payload_bytes() + m.shared_up.payload_bytes() +
                         m.shared_down.payload_bytes();

    phase.reset();
    phase.emplace(profile_, "moe.combine", T);
    // Weighted sum in selection order, then the shared expert (unweighted).
    // Every element gets the same rounded products and sums in the same
    // order however the pool splits the (token, column block) pieces; done
    // serially it left the other threads idle for a measurable part of a
    // decode step.
    constexpr int64_t kCols = 512;
    const int64_t n_blk = (E + kCols - 1) / kCols;
    pool_.parallel_for(T * n_blk, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; ++task) {
            const int64_t t = task / n_blk, c0 = task % n_blk * kCols;
            const int64_t n = std::min(kCols, E - c0);
            float* o = out + t * E + c0;
            // Source k < K: the token's k-th selected expert; K: the shared one.
            auto src = [&](int64_t k) {
                return eo + (k < K ? slot_of[size_t(t * K + k)] : P + t) * E + c0;
            };
            // The sources were written by both threads in the down phase:
            // ask for all of them before the first is read.
            for (int64_t k = 0; k < K + (shared ? 1 : 0); ++k)
                for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(src(k) + i, 0, 3);
            for (int64_t k = 0; k < K; ++k)
                kernels::weigh_row(o, src(k), wts[size_t(t * K + k)], n, k == 0);
            // The shared expert's rows, computed here or by moe_shared; alone (moe_shared
            // itself) they are the output.
            const float* sh = shared ? src(K) : shared_rows ? shared_rows + t * E + c0 : nullptr;
            if (sh && K > 0)
                kernels::add_row(o, sh, n);
            else if (sh)
                std::memcpy(o, sh, size_t(n) * sizeof(float));
            else if (K == 0)
                std::memset(o, 0, size_t(n) * sizeof(float));
        }
    });
}

}  // namespace glm5::backend::cpu

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
    observe(m.router, x, E, 0, T);
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

// One moe_experts call. The (token, slot) pairs are sorted by expert so that
// expert e's activations are contiguous rows and each weight row is read once
// for all of them; a unit is one expert's three matrices applied to its rows,
// and the shared expert is one more unit, on every token. Each phase (gate and
// up, down) hands all units' rows to the pool as one list.
struct CpuBackend::MoeWork {
    struct Unit {
        const Weight *gate, *up, *down;
        int64_t slice, a0, n, width;  // rows [a0, a0 + n); width: the hidden rows' (gate.rows)
        const uint8_t *ag, *au, *ad;
        size_t arow_g, arow_u, arow_d;
        float *g, *u, *o;  // first output row of each projection
    };

    CpuBackend& be;
    const MoeFfn& routed;
    const MoeFfn* shared_ffn;  // null: no shared expert in this call
    const float* x;
    const int32_t* ids;
    const float* wts;
    const float* shared_rows;  // moe_shared's rows to add, if computed apart
    int64_t T, K, X, F, E, P, S;

    std::vector<int64_t> first;                  // expert e's slots: [first[e], first[e+1])
    std::vector<int64_t> slot_of;                // pair (t, k) -> its slot
    std::vector<int32_t> active;                 // experts with at least one slot
    const uint8_t *tg = nullptr, *tu = nullptr;  // token-order activations, gate/up formats
    size_t arow_g = 0, arow_u = 0;
    float *g = nullptr, *u = nullptr, *eo = nullptr;  // hidden rows, expert outputs
    std::vector<Unit> units;

    MoeWork(CpuBackend& b, const MoeFfn& r, const MoeFfn* sh, const float* x_, int64_t T_,
            const int32_t* ids_, const float* wts_, int n_used, const float* shared_rows_)
        : be(b),
          routed(r),
          shared_ffn(sh),
          x(x_),
          ids(ids_),
          wts(wts_),
          shared_rows(shared_rows_),
          T(T_),
          K(n_used),
          X(r ? r.gate.slices : 0),
          F(r ? r.gate.rows : 0),
          E(r ? r.gate.cols : sh->gate.cols),
          P(T_ * n_used),
          S(sh ? sh->gate.rows : 0) {}

    bool shared() const { return shared_ffn != nullptr && bool(shared_ffn->gate); }
    // (With no routed experts, moe_shared's form: the shared gate's and up's formats.)
    const Weight& act_gate() const { return routed ? routed.gate : shared_ffn->gate; }
    const Weight& act_up() const { return routed ? routed.up : shared_ffn->up; }
    static bool same_acts(const Weight& a, const Weight& b) {
        return quant::traits(a.type).vec_dot_type == quant::traits(b.type).vec_dot_type;
    }

    void sort_by_expert() {
        first.assign(size_t(X + 1), 0);
        for (int64_t i = 0; i < P; ++i) ++first[size_t(ids[size_t(i)] + 1)];
        for (int64_t e = 0; e < X; ++e) first[size_t(e + 1)] += first[size_t(e)];
        slot_of.resize(size_t(P));
        std::vector<int64_t> cursor(first.begin(), first.end() - 1);
        for (int64_t i = 0; i < P; ++i) slot_of[size_t(i)] = cursor[size_t(ids[size_t(i)])]++;
        for (int64_t e = 0; e < X; ++e)
            if (first[size_t(e + 1)] > first[size_t(e)]) active.push_back(int32_t(e));
    }

    // Token-order activations of `a`'s rows, copied into slot order.
    const uint8_t* gather(ByteBuffer& buf, const uint8_t* a, size_t arow) const {
        uint8_t* dst = buf.get(arow * size_t(P));
        for (int64_t i = 0; i < P; ++i)
            std::memcpy(dst + size_t(slot_of[size_t(i)]) * arow, a + size_t(i / K) * arow, arow);
        return dst;
    }

    // Activations of every token in the gate and up formats (token order, kept
    // for the shared expert) and of every slot in slot order; the units.
    void make_units() {
        tg = be.quantize_acts(be.moe_tok_g_, act_gate().type, E, 1, x, E, 0, T, arow_g);
        tu = tg;
        arow_u = arow_g;
        if (!same_acts(act_up(), act_gate()))
            tu = be.quantize_acts(be.moe_tok_u_, act_up().type, E, 1, x, E, 0, T, arow_u);
        observe_inputs();
        const uint8_t* xg = gather(be.moe_gate_buf_, tg, arow_g);
        const uint8_t* xu = tu == tg ? xg : gather(be.moe_up_buf_, tu, arow_u);

        // Gate and up outputs: routed rows are F wide (slot order), the shared
        // expert's S wide after them. Persistent, uninitialised buffers: these
        // are tens of MB in prefill, and fresh zeroed allocations cost page
        // faults on every layer.
        const size_t hidden = size_t(P * F + T * S);
        g = float_buffer(be.moe_g_, hidden);
        u = float_buffer(be.moe_u_, hidden);
        eo = float_buffer(be.moe_eo_, size_t((P + (shared() ? T : 0)) * E));
        for (int32_t e : active) {
            const int64_t s0 = first[size_t(e)];
            units.push_back({&routed.gate, &routed.up, &routed.down, e, s0,
                             first[size_t(e + 1)] - s0, F, xg + size_t(s0) * arow_g,
                             xu + size_t(s0) * arow_u, nullptr, arow_g, arow_u, 0, g + s0 * F,
                             u + s0 * F, eo + s0 * E});
        }
        if (shared()) units.push_back(shared_unit());
    }

    // The gate and up products' inputs, for an observer: each (token, slot) pair's row
    // for the expert it was routed to; every token's for the shared expert.
    void observe_inputs() const {
        if (!be.observer_) return;
        for (int64_t i = 0; i < P && routed; ++i)
            for (const Weight* w : {&routed.gate, &routed.up})
                be.observe_routed(*w, ids[size_t(i)], x + (i / K) * E, E, 1);
        if (shared())
            for (const Weight* w : {&shared_ffn->gate, &shared_ffn->up}) be.observe(*w, x, E, 0, T);
    }

    // Token order: the routed experts' token-order activations serve where
    // the formats agree.
    Unit shared_unit() {
        Unit sh{};
        sh.gate = &shared_ffn->gate;
        sh.up = &shared_ffn->up;
        sh.down = &shared_ffn->down;
        sh.n = T;
        sh.width = S;
        sh.g = g + P * F;
        sh.u = u + P * F;
        sh.o = eo + P * E;
        auto token_acts = [&](const Weight& w, ByteBuffer& own, size_t& arow) {
            if (same_acts(w, act_gate())) {
                arow = arow_g;
                return tg;
            }
            if (same_acts(w, act_up())) {
                arow = arow_u;
                return tu;
            }
            return be.quantize_acts(own, w.type, E, 1, x, E, 0, T, arow);
        };
        sh.ag = token_acts(shared_ffn->gate, be.act_buf_, sh.arow_g);
        sh.au = token_acts(shared_ffn->up, be.act_buf2_, sh.arow_u);
        return sh;
    }

    // fn(unit, matrix, r0, r1) over the rows of matrices [0, n_mat) of every
    // unit (weight_of(unit, matrix)), all in one guided pass.
    template <class WeightOf, class Fn>
    void for_unit_rows(int n_mat, WeightOf weight_of, Fn fn) {
        be.for_weight_rows(
            units.size() * size_t(n_mat),
            [&](size_t k) -> const Weight& { return *weight_of(units[k / n_mat], int(k % n_mat)); },
            [&](size_t k, int64_t r0, int64_t r1) {
                fn(units[k / n_mat], int(k % n_mat), r0, r1);
            });
    }

    // Gate and up projections, SwiGLU.
    void gate_up() {
        for_unit_rows(
            2, [](const Unit& un, int mat) { return mat == 0 ? un.gate : un.up; },
            [&](const Unit& un, int mat, int64_t r0, int64_t r1) {
                if (mat == 0)
                    product_rows(*un.gate, un.slice, r0, r1, un.ag, un.arow_g, un.n, un.g,
                                 un.width);
                else
                    product_rows(*un.up, un.slice, r0, r1, un.au, un.arow_u, un.n, un.u, un.width);
            });
        if (P > 0) be.swiglu(dev(g), dev(u), P, F, F, routed.clamp, dev(g));
        if (shared())
            be.swiglu(dev(g + P * F), dev(u + P * F), T, S, S, shared_ffn->clamp, dev(g + P * F));
    }

    // Down projections (the hidden rows are already in unit order).
    void down() {
        for (int32_t e : active)
            be.observe_routed(routed.down, e, g + first[size_t(e)] * F, F,
                              first[size_t(e + 1)] - first[size_t(e)]);
        if (shared()) be.observe(shared_ffn->down, g + P * F, S, 0, T);
        size_t arow_h = 0;
        const uint8_t* ah =
            P > 0 ? be.quantize_acts(be.act_buf_, routed.down.type, F, 1, g, F, 0, P, arow_h)
                  : nullptr;
        for (Unit& un : units)
            if (un.down == &routed.down) {
                un.ad = ah + size_t(un.a0) * arow_h;
                un.arow_d = arow_h;
            }
        if (shared()) {
            Unit& sh = units.back();
            sh.ad = be.quantize_acts(be.act_buf2_, shared_ffn->down.type, S, 1, g + P * F, S, 0, T,
                                     sh.arow_d);
        }
        for_unit_rows(
            1, [](const Unit& un, int) { return un.down; },
            [&](const Unit& un, int, int64_t r0, int64_t r1) {
                product_rows(*un.down, un.slice, r0, r1, un.ad, un.arow_d, un.n, un.o, E);
            });
        if (routed)
            be.weight_bytes_ +=
                active.size() * (routed.gate.payload_bytes() + routed.up.payload_bytes() +
                                 routed.down.payload_bytes());
        if (shared())
            be.weight_bytes_ += shared_ffn->gate.payload_bytes() + shared_ffn->up.payload_bytes() +
                                shared_ffn->down.payload_bytes();
    }

    // Weighted sum in selection order, then the shared expert (unweighted).
    // Every element gets the same rounded products and sums in the same order
    // however the pool splits the (token, column block) pieces; done serially
    // it left the other threads idle for a measurable part of a decode step.
    void combine(float* out) {
        constexpr int64_t kCols = 512;
        const int64_t n_blk = (E + kCols - 1) / kCols;
        const bool sh_unit = shared();
        be.pool_.parallel_for(T * n_blk, 1, [&](int64_t b, int64_t e, int) {
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
                for (int64_t k = 0; k < K + (sh_unit ? 1 : 0); ++k)
                    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(src(k) + i, 0, 3);
                for (int64_t k = 0; k < K; ++k)
                    kernels::weigh_row(o, src(k), wts[size_t(t * K + k)], n, k == 0);
                // The shared expert's rows, computed here or by moe_shared; alone
                // (moe_shared itself) they are the output.
                const float* sh = sh_unit       ? src(K)
                                  : shared_rows ? shared_rows + t * E + c0
                                                : nullptr;
                if (sh && K > 0)
                    kernels::add_row(o, sh, n);
                else if (sh)
                    std::memcpy(o, sh, size_t(n) * sizeof(float));
                else if (K == 0)
                    std::memset(o, 0, size_t(n) * sizeof(float));
            }
        });
    }
};

void CpuBackend::moe_experts(const MoeFfn& routed, DevPtr<const float> x, int64_t T,
                             DevPtr<const int32_t> ids, DevPtr<const float> wts, int n_used,
                             const MoeFfn* shared_ffn, DevPtr<const float> shared_rows,
                             DevPtr<float> out) {
    OpTimer timer_(profile_, "moe", T);
    MoeWork work(*this, routed, shared_ffn, host(x), T, host(ids), host(wts), n_used,
                 host(shared_rows));
    // Phases timed apart under GLM5_PROFILE.
    std::optional<OpTimer> phase;
    phase.emplace(profile_, "moe.route", T);
    work.sort_by_expert();
    work.make_units();
    phase.reset();
    phase.emplace(profile_, "moe.gate_up", T);
    work.gate_up();
    phase.reset();
    phase.emplace(profile_, "moe.down", T);
    work.down();
    phase.reset();
    phase.emplace(profile_, "moe.combine", T);
    work.combine(host(out));
}

}  // namespace glm5::backend::cpu

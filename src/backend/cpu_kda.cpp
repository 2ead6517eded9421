// Linear-attention ops on the CPU: the short causal convolution with its
// carried tail, the bounded decay gate and the gated delta rule. The delta
// rule walks a sequence's tokens strictly in order with the same per-element
// arithmetic for a batch of one or of many, so prefill, chunked prefill and
// decode agree bitwise.
#include "backend/cpu_backend.h"
#include "backend/cpu_simd.h"

namespace glm5::backend::cpu {

void CpuBackend::l2_norm(DevPtr<const float> x_, int64_t n_rows, int64_t dim, float eps,
                         DevPtr<float> y_) {
    const float* x = host(x_);
    float* y = host(y_);
    pool_.parallel_for(n_rows, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
            const float* xr = x + r * dim;
            float* yr = y + r * dim;
            double sum = 0.0;
            for (int64_t i = 0; i < dim; ++i) sum += double(xr[i]) * double(xr[i]);
            const float norm = std::max(float(std::sqrt(sum)), eps);
            const float inv = 1.0f / norm;
            for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
        }
    });
}

void CpuBackend::apply_sigmoid(DevPtr<float> y_, int64_t n) {
    float* y = host(y_);
    for (int64_t i = 0; i < n; ++i) y[i] = hd_sigmoid(y[i]);
}

void CpuBackend::mul_sigmoid(DevPtr<float> y_, DevPtr<const float> gate_, int64_t n) {
    float* y = host(y_);
    const float* gate = host(gate_);
    for (int64_t i = 0; i < n; ++i) y[i] *= hd_sigmoid(gate[i]);
}

void CpuBackend::causal_conv(std::span<const ConvSeq> seqs, int64_t C, const float* taps, int64_t K,
                             int64_t xs, int64_t ys, bool use_silu) {
    // One task per (sequence, block of channels): a channel's outputs and its
    // tail update belong to one thread, so the tail can be updated in place.
    int64_t rows = 0;
    for (const ConvSeq& s : seqs) rows += s.n_tok;
    OpTimer timer_(profile_, "causal_conv", rows);
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (C + kBlock - 1) / kBlock;
    const int64_t n_tail = K - 1;
    pool_.parallel_for(int64_t(seqs.size()) * blocks, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; ++task) {
            const ConvSeq& s = seqs[size_t(task / blocks)];
            const int64_t c0 = (task % blocks) * kBlock, c1 = std::min(C, c0 + kBlock);
            const int64_t n = s.n_tok;
            const float* old_tail = host(s.tail_in ? s.tail_in : DevPtr<const float>(s.tail));
            const float* sx = host(s.x);
            float* sy = host(s.y);
            float* stail = host(s.tail);
            // Input at (relative) time tau: from the tail before the batch,
            // from the batch itself from 0 on.
            auto in = [&](int64_t tau, int64_t c) {
                return tau < 0 ? old_tail[(n_tail + tau) * C + c] : sx[tau * xs + c];
            };
            for (int64_t c = c0; c < c1; ++c) {
                const float* w = taps + c * K;
                for (int64_t t = 0; t < n; ++t) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < K; ++j) acc += w[j] * in(t - n_tail + j, c);
                    sy[t * ys + c] = use_silu ? silu(acc) : acc;
                }
                // New tail row i is the input at time n - (K-1) + i; in place,
                // reading old tail rows i + n > i before overwriting row i is safe.
                for (int64_t i = 0; i < n_tail && n > 0; ++i)
                    stail[i * C + c] = in(n - n_tail + i, c);
            }
        }
    });
}

void CpuBackend::bounded_decay(DevPtr<const float> z_, const float* bias, const float* rate,
                               int64_t n_tok, int64_t H, int64_t D, float lower, DevPtr<float> g_) {
    const float* z = host(z_);
    float* g = host(g_);
    pool_.parallel_for(n_tok, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < D; ++i) {
                    const int64_t c = h * D + i;
                    g[t * H * D + c] = lower * hd_sigmoid(rate[h] * (z[t * H * D + c] + bias[c]));
                }
    });
}

void CpuBackend::gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t H, int64_t D,
                                  float scale) {
    int64_t rows = 0;
    for (const DeltaRuleSeq& s : seqs) rows += s.n_tok;
    OpTimer timer_(profile_, "gated_delta_rule", rows);
    // Each sequence's recurrent state is read once per call (then kept in
    // cache across its tokens).
    cache_bytes_ += uint64_t(seqs.size()) * uint64_t(H * D * D) * sizeof(float);
    const int64_t HD = H * D;
    const SimdOps& sv = simd();
    pool_.parallel_for(int64_t(seqs.size()) * H, 1, [&](int64_t b, int64_t e, int ith) {
        std::vector<float>& buf = per_thread_[size_t(ith)].acc;
        buf.resize(size_t(3 * D));
        float* decay = buf.data();
        float* acc = decay + D;
        float* upd = acc + D;
        for (int64_t task = b; task < e; ++task) {
            const DeltaRuleSeq& s = seqs[size_t(task / H)];
            const int64_t h = task % H;
            float* S = host(s.state) + h * D * D;  // S[i][j]: key channel i, value channel j
            // The first token reads the old state where it lives.
            const float* S0 = s.state_in ? host(s.state_in) + h * D * D : S;
            for (int64_t t = 0; t < s.n_tok; ++t) {
                const float* Sr = t == 0 ? S0 : S;
                const float* q = host(s.q) + t * HD + h * D;
                const float* k = host(s.k) + t * HD + h * D;
                const float* v = host(s.v) + t * HD + h * D;
                const float* g = host(s.g) + t * HD + h * D;
                const float beta = host(s.beta)[t * H + h];
                for (int64_t i = 0; i < D; ++i) decay[i] = std::exp(g[i]);
                // Decay the state, then read it with the key: acc = S^T k.
                sv.delta_decay(D, Sr, decay, k, S, acc);
                // The write (beta-weighted prediction error), then the output
                // read from the updated state: acc = S^T q.
                for (int64_t j = 0; j < D; ++j) upd[j] = beta * (v[j] - acc[j]);
                sv.delta_update(D, k, upd, q, S, acc);
                float* o = host(s.out) + t * HD + h * D;
                for (int64_t j = 0; j < D; ++j) o[j] = scale * acc[j];
            }
        }
    });
}

}  // namespace glm5::backend::cpu

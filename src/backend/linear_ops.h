// The linear-attention family of the glm5next forward: KDA (a short causal convolution,
// a bounded decay and the gated delta rule over a recurrent state) and Sinkhorn
// hyper-connections (the streams' mixing coefficients, their reduction and expansion).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "core/hd.h"

namespace glm5::backend {

// The most hyper-connection streams the ops take (a token's S x S Sinkhorn matrix is
// iterated in registers; the models have 4). Loaders refuse more.
constexpr int64_t kMaxStreams = 8;

// The Sinkhorn rule of hc_coefficients (below) for one token's mixing logits m
// [(2+S)*S], both backends' (host-and-device code): the S x S matrix iterated in double,
// rounded once at the end.
GLM5_HD void hc_token(const float* m, int64_t S, const float* base, const float* scale, float eps,
                      int64_t iterations, float* pre, float* post, float* comb) {
    double C[kMaxStreams * kMaxStreams];
    auto at = [&](int64_t d, int64_t s) -> double& { return C[d * S + s]; };
    const double ep = double(eps);
    for (int64_t s = 0; s < S; ++s) {
        pre[s] = hd_sigmoid(hd_mul(scale[0], m[s]) + base[s]) + eps;
        post[s] = hd_mul(2.0f, hd_sigmoid(hd_mul(scale[1], m[S + s]) + base[S + s]));
    }
    // Logits L[d][s] (d = destination, s = source), softmax over d per source.
    for (int64_t s = 0; s < S; ++s) {
        double mx = -INFINITY;
        for (int64_t d = 0; d < S; ++d) {
            const int64_t i = 2 * S + d + S * s;
            at(d, s) = double(hd_mul(scale[2], m[i]) + base[i]);
            mx = fmax(mx, at(d, s));
        }
        double sum = 0.0;
        for (int64_t d = 0; d < S; ++d) {
            at(d, s) = exp(at(d, s) - mx);
            sum += at(d, s);
        }
        for (int64_t d = 0; d < S; ++d) at(d, s) = at(d, s) / sum + ep;
    }
    auto rows = [&] {  // per destination, over sources
        for (int64_t d = 0; d < S; ++d) {
            double sum = 0.0;
            for (int64_t s = 0; s < S; ++s) sum += at(d, s);
            for (int64_t s = 0; s < S; ++s) at(d, s) /= (sum + ep);
        }
    };
    auto cols = [&] {  // per source, over destinations
        for (int64_t s = 0; s < S; ++s) {
            double sum = 0.0;
            for (int64_t d = 0; d < S; ++d) sum += at(d, s);
            for (int64_t d = 0; d < S; ++d) at(d, s) /= (sum + ep);
        }
    };
    rows();
    for (int64_t it = 1; it < iterations; ++it) {
        cols();
        rows();
    }
    for (int64_t i = 0; i < S * S; ++i) comb[i] = float(C[i]);
}

class LinearOps {
  public:
    static constexpr const char* kWhat = "the linear-attention and hyper-connection ops";
    virtual ~LinearOps() = default;
    static void check_streams(int64_t n_streams) {
        if (n_streams < 1 || n_streams > kMaxStreams)
            throw Error("hyper-connections of " + std::to_string(n_streams) +
                        " streams: the ops take 1 to " + std::to_string(kMaxStreams));
    }

    // Each op keeps a fixed per-element reduction order, so a token's result does not
    // depend on how the tokens were batched.

    // L2 normalisation per row: y = x / max(||x||_2, eps); in place allowed.
    virtual void l2_norm(DevPtr<const float> x, int64_t n_rows, int64_t dim, float eps,
                         DevPtr<float> y) = 0;
    // y = sigmoid(y), n values in place.
    virtual void apply_sigmoid(DevPtr<float> y, int64_t n) = 0;
    // y *= sigmoid(gate), n values.
    virtual void mul_sigmoid(DevPtr<float> y, DevPtr<const float> gate, int64_t n) = 0;

    // Depthwise causal convolution of one sequence's new tokens, continuing
    // from the K-1 inputs before them:
    //   y[t][c] = sum_{j<K} taps[c*K + j] * in[t-K+1+j][c]   (j = K-1: token t)
    // where inputs before the first new token come from `tail` ([K-1][channels],
    // oldest first). Afterwards `tail` holds the last K-1 inputs. With
    // `silu`, y = SiLU(conv). x and y must not overlap.
    struct ConvSeq {
        DevPtr<const float> x;  // [n_tok][x_stride]
        DevPtr<float> tail;     // [K-1][channels]: the new tail (the old one too when in place)
        DevPtr<float> y;        // [n_tok][y_stride]
        int64_t n_tok = 0;
        // The old tail, when it lives elsewhere (double-buffered state: a
        // forward that fails leaves it untouched); null: `tail` in place.
        DevPtr<const float> tail_in;
    };
    virtual void causal_conv(std::span<const ConvSeq> seqs, int64_t channels, const float* taps,
                             int64_t kernel, int64_t x_stride, int64_t y_stride, bool silu) = 0;

    // Per-channel log-decay bounded to (lower, 0):
    //   g[t][h*dim + i] = lower * sigmoid(rate[h] * (z[t][h*dim + i] + bias[h*dim + i])).
    virtual void bounded_decay(DevPtr<const float> z, const float* bias, const float* rate,
                               int64_t n_tok, int64_t n_heads, int64_t dim, float lower,
                               DevPtr<float> g) = 0;

    // Gated delta rule, token by token in order, per head h with state
    // S [dim(key i)][dim(value j)]:
    //   S <- diag(exp(g_t)) S;  e = v_t - S^T k_t;  S <- S + k_t (beta_t e)^T;
    //   out_t = scale * S^T q_t.
    // q, k, v, g, out: [n_tok][n_heads*dim]; beta: [n_tok][n_heads];
    // state: [n_heads][dim][dim], updated in place, or read from state_in and
    // written to state (double-buffered state; same bits either way).
    struct DeltaRuleSeq {
        DevPtr<const float> q, k, v, g, beta;
        DevPtr<float> state;
        DevPtr<float> out;
        int64_t n_tok = 0;
        DevPtr<const float> state_in;
    };
    virtual void gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t n_heads, int64_t dim,
                                  float scale) = 0;

    // Sinkhorn hyper-connection coefficients for S streams from the mixing
    // logits mix [n_tok][(2+S)*S] (fn . RMSNorm(streams)):
    //   pre[s]  = sigmoid(scale[0]*mix[s] + base[s]) + eps
    //   post[d] = 2 sigmoid(scale[1]*mix[S+d] + base[S+d])
    //   comb[d][s]: softmax over d of scale[2]*mix[2S+d+S*s] + base[..], + eps,
    //   then rows (over s) normalised, then iterations-1 times columns (over d)
    //   and rows; every normalisation divides by (sum + eps).
    // pre, post: [n_tok][S]; comb: [n_tok][S (destination)][S (source)].
    // (At most kMaxStreams streams: check_streams refuses more.)
    virtual void hc_coefficients(DevPtr<const float> mix, int64_t n_tok, int64_t n_streams,
                                 const float* base, const float* scale, float eps,
                                 int64_t iterations, DevPtr<float> pre, DevPtr<float> post,
                                 DevPtr<float> comb) = 0;
    // y[t] = sum_s w[t][s] * X[t][s] (w == nullptr: the plain mean over streams).
    // X: [n_tok][n_streams][dim]; y: [n_tok][dim].
    virtual void hc_reduce(DevPtr<const float> X, DevPtr<const float> w, int64_t n_tok,
                           int64_t n_streams, int64_t dim, DevPtr<float> y) = 0;
    // out[t][d] = post[t][d] * f[t] + sum_s comb[t][d][s] * X[t][s] (out != X).
    virtual void hc_expand(DevPtr<const float> X, DevPtr<const float> f, DevPtr<const float> post,
                           DevPtr<const float> comb, int64_t n_tok, int64_t n_streams, int64_t dim,
                           DevPtr<float> out) = 0;
};

}  // namespace glm5::backend

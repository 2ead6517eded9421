// Hyper-connection ops on the CPU: Sinkhorn mixing coefficients per token,
// the weighted reduction of the streams into one sublayer input, and the
// expansion of a sublayer output back into the streams. All per token.
#include "backend/cpu_backend.h"

namespace glm5::backend::cpu {

void CpuBackend::hc_coefficients(DevPtr<const float> mix_, int64_t T, int64_t S, const float* base,
                                 const float* scale, float eps, int64_t iterations,
                                 DevPtr<float> pre_, DevPtr<float> post_, DevPtr<float> comb_) {
    const float* mix = host(mix_);
    float* pre = host(pre_);
    float* post = host(post_);
    float* comb = host(comb_);
    check_streams(S);
    const int64_t M = (2 + S) * S;
    pool_.parallel_for(T, 8, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t)
            hc_token(mix + t * M, S, base, scale, eps, iterations, pre + t * S, post + t * S,
                     comb + t * S * S);
    });
}

void CpuBackend::hc_reduce(DevPtr<const float> X_, DevPtr<const float> w_, int64_t T, int64_t S,
                           int64_t E, DevPtr<float> y_) {
    const float* X = host(X_);
    const float* w = host(w_);
    float* y = host(y_);
    pool_.parallel_for(T, 4, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            const float* x = X + t * S * E;
            float* yt = y + t * E;
            if (w) {
                const float* wt = w + t * S;
                for (int64_t i = 0; i < E; ++i) {
                    float acc = wt[0] * x[i];
                    for (int64_t s = 1; s < S; ++s) acc += wt[s] * x[s * E + i];
                    yt[i] = acc;
                }
            } else {
                const float inv = 1.0f / float(S);
                for (int64_t i = 0; i < E; ++i) {
                    float acc = x[i];
                    for (int64_t s = 1; s < S; ++s) acc += x[s * E + i];
                    yt[i] = acc * inv;
                }
            }
        }
    });
}

void CpuBackend::hc_expand(DevPtr<const float> X_, DevPtr<const float> f_,
                           DevPtr<const float> post_, DevPtr<const float> comb_, int64_t T,
                           int64_t S, int64_t E, DevPtr<float> out_) {
    const float* X = host(X_);
    const float* f = host(f_);
    const float* post = host(post_);
    const float* comb = host(comb_);
    float* out = host(out_);
    pool_.parallel_for(T, 4, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            const float* x = X + t * S * E;
            const float* ft = f + t * E;
            const float* c = comb + t * S * S;
            for (int64_t d = 0; d < S; ++d) {
                float* o = out + (t * S + d) * E;
                const float pd = post[t * S + d];
                for (int64_t i = 0; i < E; ++i) {
                    float acc = c[d * S] * x[i];
                    for (int64_t s = 1; s < S; ++s) acc += c[d * S + s] * x[s * E + i];
                    o[i] = pd * ft[i] + acc;
                }
            }
        }
    });
}

}  // namespace glm5::backend::cpu

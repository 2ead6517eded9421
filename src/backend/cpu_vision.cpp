// The CPU backend's vision tower ops (backend.h, "vision tower ops"): bias
// rows, exact GELU, 2-D RoPE, and full attention streamed in tiles.
#include <cmath>

#include "backend/cpu_backend.h"
#include "backend/cpu_vision_kernels.h"
#include "quant/ops.h"

namespace glm5::backend::cpu {

namespace {

void scores_scalar(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t ldk,
                   int64_t nk, int64_t dim, float scale, float* s, int64_t lds) {
    for (int64_t i = 0; i < nq; ++i)
        for (int64_t j = 0; j < nk; ++j) {
            float a = 0.0f;
            for (int64_t c = 0; c < dim; ++c) a = std::fma(q[i * ldq + c], kt[c * ldk + j], a);
            s[i * lds + j] = a * scale;
        }
}

float exp_sum_scalar(float* x, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        x[j] = std::exp(x[j] - m);
        sum += x[j];
    }
    return sum;
}

void pv_scalar(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t ldv, int64_t nk,
               int64_t dim, float* o, int64_t ldo) {
    for (int64_t i = 0; i < nq; ++i)
        for (int64_t j = 0; j < nk; ++j) {
            const float pj = p[i * ldp + j];
            for (int64_t c = 0; c < dim; ++c)
                o[i * ldo + c] = std::fma(pj, v[j * ldv + c], o[i * ldo + c]);
        }
}

}  // namespace

const AttnTileOps& attn_tile_ops(int64_t dim) {
    static const AttnTileOps scalar{scores_scalar, exp_sum_scalar, pv_scalar};
    static const AttnTileOps fast{avx2::attn_scores, avx2::attn_exp_sum, avx2::attn_pv};
    static const bool have_avx2 = quant::cpu_has_avx2();
    return have_avx2 && dim % 8 == 0 ? fast : scalar;
}

void CpuBackend::add_bias(DevPtr<float> y_, int64_t n_rows, int64_t dim, int64_t stride,
                          const float* b) {
    float* y = host(y_);
    OpTimer timer_(profile_, "add_bias", n_rows);
    pool_.parallel_for(n_rows, 64, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) kernels::add_row(y + r * stride, b, dim);
    });
}

void CpuBackend::gelu_erf(DevPtr<float> y_, int64_t n) {
    float* y = host(y_);
    OpTimer timer_(profile_, "gelu_erf", n);
    pool_.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i)
            y[i] = 0.5f * y[i] * (1.0f + std::erf(y[i] * 0.70710678118654752f));
    });
}

void CpuBackend::rope_2d(DevPtr<float> x_, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                         int64_t dim, const int32_t* row, const int32_t* col, float theta) {
    float* x = host(x_);
    OpTimer timer_(profile_, "rope_2d", n_tok);
    const int64_t half = dim / 2, quarter = dim / 4;
    // Angles in double (positions reach a few hundred), rounded once.
    const std::vector<double> freq = rope_2d_frequencies(dim, theta);
    pool_.parallel_for(n_tok, 16, [&](int64_t b, int64_t e, int ith) {
        std::vector<float>& cs = per_thread_[size_t(ith)].rope;
        cs.resize(size_t(dim));  // cos[half] | sin[half]
        for (int64_t t = b; t < e; ++t) {
            for (int64_t i = 0; i < half; ++i) {
                const double a = double(i < quarter ? row[t] : col[t]) * freq[size_t(i % quarter)];
                cs[size_t(i)] = float(std::cos(a));
                cs[size_t(half + i)] = float(std::sin(a));
            }
            for (int64_t h = 0; h < n_heads; ++h) {
                float* v = x + t * tok_stride + h * dim;
                for (int64_t i = 0; i < half; ++i) {
                    const float c = cs[size_t(i)], s = cs[size_t(half + i)];
                    const float x0 = v[i], x1 = v[half + i];
                    v[i] = x0 * c - x1 * s;
                    v[half + i] = x1 * c + x0 * s;
                }
            }
        }
    });
}

// Flash-style attention: per (sequence, head, block of kQueryTile queries),
// key tiles of kKeyTile in order with a running maximum and sum; the output
// block is rescaled when the maximum grows and divided by the sum at the end.
// Keys are transposed per head once ([dim][n] padded to whole tiles) so a
// score tile is outer products of query values and key rows.
void CpuBackend::attention_full(std::span<const FullAttentionSeq> seqs, int64_t H, int64_t D,
                                int64_t stride, float scale) {
    int64_t total = 0;
    for (const auto& s : seqs) total += s.n;
    OpTimer timer_(profile_, "attention_full", total);
    const AttnTileOps& ops = attn_tile_ops(D);
    for (const FullAttentionSeq& sq : seqs) {
        const int64_t n = sq.n;
        if (n <= 0) continue;
        const int64_t npad = (n + kKeyTile - 1) / kKeyTile * kKeyTile;
        float* kt = reinterpret_cast<float*>(vision_kt_.get(size_t(H * D * npad) * sizeof(float)));
        pool_.parallel_for(H * D, 8, [&](int64_t b, int64_t e, int) {
            for (int64_t hc = b; hc < e; ++hc) {
                const int64_t h = hc / D, c = hc % D;
                float* dst = kt + hc * npad;
                const float* src = host(sq.k) + h * D + c;
                for (int64_t j = 0; j < n; ++j) dst[j] = src[j * stride];
                for (int64_t j = n; j < npad; ++j) dst[j] = 0.0f;
            }
        });
        const int64_t qblocks = (n + kQueryTile - 1) / kQueryTile;
        pool_.parallel_for(H * qblocks, 1, [&](int64_t b, int64_t e, int ith) {
            PerThread& pt = per_thread_[size_t(ith)];
            pt.scores.resize(size_t(kQueryTile * kKeyTile));
            pt.acc.resize(size_t(kQueryTile * D + 2 * kQueryTile));
            float* S = pt.scores.data();
            float* O = pt.acc.data();
            float* mx = O + kQueryTile * D;
            float* sum = mx + kQueryTile;
            for (int64_t task = b; task < e; ++task) {
                const int64_t h = task / qblocks, i0 = (task % qblocks) * kQueryTile;
                const int64_t nq = std::min(kQueryTile, n - i0);
                const float* q = host(sq.q) + i0 * stride + h * D;
                const float* khead = kt + h * D * npad;
                std::fill(O, O + nq * D, 0.0f);
                for (int64_t i = 0; i < nq; ++i) {
                    mx[i] = -INFINITY;
                    sum[i] = 0.0f;
                }
                for (int64_t j0 = 0; j0 < n; j0 += kKeyTile) {
                    const int64_t nk = std::min(kKeyTile, n - j0);
                    ops.scores(q, stride, nq, khead + j0, npad, (nk + 7) / 8 * 8, D, scale, S,
                               kKeyTile);
                    for (int64_t i = 0; i < nq; ++i) {
                        float* si = S + i * kKeyTile;
                        float m = mx[i];
                        for (int64_t j = 0; j < nk; ++j) m = std::max(m, si[j]);
                        if (m > mx[i]) {
                            // exp(-inf) = 0 on the first tile: nothing to rescale.
                            const float corr = std::exp(mx[i] - m);
                            sum[i] *= corr;
                            for (int64_t c = 0; c < D; ++c) O[i * D + c] *= corr;
                            mx[i] = m;
                        }
                        sum[i] += ops.exp_sum(si, nk, m);
                    }
                    ops.pv(S, kKeyTile, nq, host(sq.v) + j0 * stride + h * D, stride, nk, D, O, D);
                }
                for (int64_t i = 0; i < nq; ++i) {
                    const float inv = 1.0f / sum[i];
                    float* out = host(sq.out) + (i0 + i) * stride + h * D;
                    for (int64_t c = 0; c < D; ++c) out[c] = O[i * D + c] * inv;
                }
            }
        });
    }
}

}  // namespace glm5::backend::cpu

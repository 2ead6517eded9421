// GLM-5.3-Flash's own ops on the GPU: the linear attention's short causal convolution
// (its tail carried), the bounded decay and the gated delta rule, recurrent one token at
// a time as on the CPU; the Sinkhorn hyper-connections; the pooled keys and the cells a
// pooled selection lets a row see. Products and sums are rounded apart (__fmul_rn), in the
// CPU's order, so the values are the CPU's but for the exp and sqrt of the device.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace glm5::backend::cuda {

namespace {

__global__ void l2_norm_kernel(const float* x, int64_t dim, float eps, float* y) {
    GLM5_SHARED(double, sh, kThreads);
    const float* xr = x + int64_t(blockIdx.x) * dim;
    float* yr = y + int64_t(blockIdx.x) * dim;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) acc += double(xr[i]) * double(xr[i]);
    const float norm = fmaxf(float(sqrt(block_sum(acc, sh))), eps);
    const float inv = 1.0f / norm;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = __fmul_rn(xr[i], inv);
}

__global__ void sigmoid_kernel(float* y, const float* gate, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = gate ? __fmul_rn(y[i], hd_sigmoid(gate[i])) : hd_sigmoid(y[i]);
}

// Per-sequence descriptors passed by value, kSeqs a launch (a launch copies nothing from
// the host); more sequences take more launches.
constexpr int kSeqs = 16;
template <class D>
struct SeqBatch {
    D d[kSeqs];
};

struct ConvDesc {
    const float* x;
    float* tail;
    const float* tail_in;
    float* y;
    int64_t n_tok;
};

// Thread per (sequence, channel): its outputs in token order, then its new tail.
__global__ void conv_kernel(SeqBatch<ConvDesc> seqs, int64_t C, const float* taps, int64_t K,
                            int64_t xs, int64_t ys, bool use_silu) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const ConvDesc s = seqs.d[blockIdx.y];
    const float* old_tail = s.tail_in ? s.tail_in : s.tail;
    const int64_t n_tail = K - 1, n = s.n_tok;
    auto in = [&](int64_t tau) {
        return tau < 0 ? old_tail[(n_tail + tau) * C + c] : s.x[tau * xs + c];
    };
    const float* w = taps + c * K;
    for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc += __fmul_rn(w[j], in(t - n_tail + j));
        s.y[t * ys + c] = use_silu ? silu_of(acc) : acc;
    }
    for (int64_t i = 0; i < n_tail && n > 0; ++i) s.tail[i * C + c] = in(n - n_tail + i);
}

__global__ void decay_kernel(const float* z, const float* bias, const float* rate, int64_t n_tok,
                             int64_t H, int64_t D, float lower, float* g) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tok * H * D) return;
    const int64_t c = i % (H * D), h = c / D;
    g[i] = __fmul_rn(lower, hd_sigmoid(__fmul_rn(rate[h], z[i] + bias[c])));
}

struct DeltaDesc {
    const float *q, *k, *v, *g, *beta;
    float* state;
    const float* state_in;
    float* out;
    int64_t n_tok;
};

// Block (sequence, head), thread j: column j of the state S[i][j] (key i, value j),
// walked token by token; a column's sums run over i in order, as the CPU's loops.
__global__ void delta_rule_kernel(SeqBatch<DeltaDesc> seqs, int64_t H, int64_t D, float scale) {
    GLM5_DYNAMIC_SHARED(float, sh);  // decay, k, q of the token: 3 D floats
    float* decay = sh;
    float* kk = sh + D;
    float* qq = sh + 2 * D;
    const DeltaDesc s = seqs.d[blockIdx.x / H];
    const int64_t h = blockIdx.x % H, HD = H * D;
    float* S = s.state + h * D * D;
    const float* S0 = s.state_in ? s.state_in + h * D * D : S;
    for (int64_t t = 0; t < s.n_tok; ++t) {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            decay[i] = expf(s.g[t * HD + h * D + i]);
            kk[i] = s.k[t * HD + h * D + i];
            qq[i] = s.q[t * HD + h * D + i];
        }
        __syncthreads();
        const float beta = s.beta[t * H + h];
        const float* Sr = t == 0 ? S0 : S;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float acc = 0.0f;
            for (int64_t i = 0; i < D; ++i) {
                const float v = __fmul_rn(Sr[i * D + j], decay[i]);
                S[i * D + j] = v;
                acc += __fmul_rn(v, kk[i]);
            }
            const float upd = __fmul_rn(beta, s.v[t * HD + h * D + j] - acc);
            float out = 0.0f;
            for (int64_t i = 0; i < D; ++i) {
                const float v = S[i * D + j] + __fmul_rn(kk[i], upd);
                S[i * D + j] = v;
                out += __fmul_rn(v, qq[i]);
            }
            s.out[t * HD + h * D + j] = __fmul_rn(scale, out);
        }
        __syncthreads();
    }
}

// Thread per token: the Sinkhorn rule (linear_ops.h).
__global__ void hc_coeff_kernel(const float* mix, int64_t T, int64_t S, const float* base,
                                const float* scale, float eps, int64_t iterations, float* pre,
                                float* post, float* comb) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    hc_token(mix + t * (2 + S) * S, S, base, scale, eps, iterations, pre + t * S, post + t * S,
             comb + t * S * S);
}

__global__ void hc_reduce_kernel(const float* X, const float* w, int64_t T, int64_t S, int64_t E,
                                 float* y) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * E) return;
    const int64_t t = i / E, c = i % E;
    const float* x = X + t * S * E;
    if (w) {
        const float* wt = w + t * S;
        float acc = __fmul_rn(wt[0], x[c]);
        for (int64_t s = 1; s < S; ++s) acc += __fmul_rn(wt[s], x[s * E + c]);
        y[i] = acc;
    } else {
        float acc = x[c];
        for (int64_t s = 1; s < S; ++s) acc += x[s * E + c];
        y[i] = __fmul_rn(acc, 1.0f / float(S));
    }
}

__global__ void hc_expand_kernel(const float* X, const float* f, const float* post,
                                 const float* comb, int64_t T, int64_t S, int64_t E, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= T * S * E) return;
    const int64_t t = i / (S * E), d = (i / E) % S, c = i % E;
    const float* x = X + t * S * E;
    const float* cm = comb + t * S * S + d * S;
    float acc = __fmul_rn(cm[0], x[c]);
    for (int64_t s = 1; s < S; ++s) acc += __fmul_rn(cm[s], x[s * E + c]);
    out[i] = __fmul_rn(post[t * S + d], f[t * E + c]) + acc;
}

// Block per completed pool j: the slots' softmax per gate channel, the weighted key, its
// RMSNorm, stored as row j of the pool cache.
__global__ void pool_kernel(const uint8_t* cells, size_t cell_bytes, bool cells_f16, int64_t Dk,
                            int64_t Gw, int64_t B, const float* ape, const float* norm_w, float eps,
                            uint8_t* pools, size_t pool_bytes, bool pools_f16, const int32_t* pos,
                            int64_t n_rows) {
    GLM5_DYNAMIC_SHARED(float, sm);  // weights [B][Gw], then the pooled key [Dk]
    GLM5_SHARED(double, red, kThreads);
    // The pools the rows complete, from the plan's positions (a launch of a bound on their
    // count is the same launch at every step).
    const int64_t first = int64_t(pos[0]) / B;
    if (int64_t(blockIdx.x) >= (int64_t(pos[n_rows - 1]) + 1) / B - first) return;
    float* a = sm;
    float* pooled = sm + B * Gw;
    const int64_t j = first + blockIdx.x;
    auto cell = [&](int64_t s, int64_t i) {  // value i of slot s of pool j
        return load_value(cells + size_t(j * B + s) * cell_bytes, i, cells_f16);
    };
    for (int64_t i = threadIdx.x; i < Gw; i += blockDim.x) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < B; ++s) {
            const float z = cell(s, Dk + i) + ape[s * Gw + i];
            a[s * Gw + i] = z;
            mx = fmaxf(mx, z);
        }
        float sum = 0.0f;
        for (int64_t s = 0; s < B; ++s) {
            const float e = expf(a[s * Gw + i] - mx);
            a[s * Gw + i] = e;
            sum += e;
        }
        for (int64_t s = 0; s < B; ++s) a[s * Gw + i] = a[s * Gw + i] / sum;
    }
    __syncthreads();
    double sq = 0.0;
    for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
        const int64_t gi = Gw == 1 ? 0 : i;
        float acc = 0.0f;
        for (int64_t s = 0; s < B; ++s) acc += __fmul_rn(a[s * Gw + gi], cell(s, i));
        pooled[i] = acc;
        sq += double(__fmul_rn(acc, acc));
    }
    const float mean = float(block_sum(sq, red) / double(Dk));
    const float scale = 1.0f / sqrtf(mean + eps);
    uint8_t* row = pools + size_t(j) * pool_bytes;
    for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
        float v = __fmul_rn(pooled[i], scale);
        if (norm_w) v = __fmul_rn(v, norm_w[i]);
        store_value(row, i, v, pools_f16);
    }
}

__global__ void pool_cells_kernel(const int32_t* picked, const int32_t* pos, int64_t n_rows,
                                  int64_t n_sel, int64_t B, int32_t* rows, int64_t stride) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n_rows) return;
    const int64_t n_vis = int64_t(pos[t]) + 1;
    if (!AttentionOps::Selection::selects(n_vis, B, n_sel)) return;
    const int32_t* p = picked + t * n_sel;
    int32_t* r = rows + t * stride;
    int64_t n = 0;
    for (int64_t j = 0; j < n_sel; ++j)
        for (int64_t s = 0; s < B; ++s) r[n++] = int32_t(p[j] * B + s);
    for (int64_t cell = (n_vis / B) * B; cell < n_vis; ++cell) r[n++] = int32_t(cell);
}

}  // namespace

void CudaBackend::l2_norm(DevPtr<const float> x, int64_t n_rows, int64_t dim, float eps,
                          DevPtr<float> y) {
    op("l2_norm", n_rows);
    if (n_rows <= 0) return;
    GLM5_LAUNCH(l2_norm_kernel, unsigned(n_rows), kThreads, 0, stream(), dev(x), dim, eps, dev(y));
}

void CudaBackend::apply_sigmoid(DevPtr<float> y, int64_t n) {
    if (n <= 0) return;
    GLM5_LAUNCH(sigmoid_kernel, grid_for(n), kThreads, 0, stream(), dev(y), nullptr, n);
}

void CudaBackend::mul_sigmoid(DevPtr<float> y, DevPtr<const float> gate, int64_t n) {
    if (n <= 0) return;
    GLM5_LAUNCH(sigmoid_kernel, grid_for(n), kThreads, 0, stream(), dev(y), dev(gate), n);
}

void CudaBackend::causal_conv(std::span<const ConvSeq> seqs, int64_t channels, const float* taps,
                              int64_t kernel, int64_t x_stride, int64_t y_stride, bool silu) {
    Temporaries tmp(*this);
    int64_t rows = 0;
    std::vector<ConvDesc> d;
    for (const ConvSeq& s : seqs) {
        rows += s.n_tok;
        d.push_back({dev(s.x), dev(s.tail), dev(s.tail_in), dev(s.y), s.n_tok});
    }
    op("causal_conv", rows);
    if (d.empty() || channels <= 0) return;
    const float* w = vec(taps, channels * kernel);
    for (size_t at = 0; at < d.size(); at += kSeqs) {
        SeqBatch<ConvDesc> b{};
        const size_t n = std::min(d.size() - at, size_t(kSeqs));
        std::copy_n(d.begin() + int64_t(at), n, b.d);
        const dim3 grid(grid_for(channels), unsigned(n));
        GLM5_LAUNCH(conv_kernel, grid, kThreads, 0, stream(), b, channels, w, kernel, x_stride,
                    y_stride, silu);
    }
}

void CudaBackend::bounded_decay(DevPtr<const float> z, const float* bias, const float* rate,
                                int64_t n_tok, int64_t n_heads, int64_t dim, float lower,
                                DevPtr<float> g) {
    Temporaries tmp(*this);
    const int64_t n = n_tok * n_heads * dim;
    if (n <= 0) return;
    GLM5_LAUNCH(decay_kernel, grid_for(n), kThreads, 0, stream(), dev(z), vec(bias, n_heads * dim),
                vec(rate, n_heads), n_tok, n_heads, dim, lower, dev(g));
}

void CudaBackend::gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t n_heads, int64_t dim,
                                   float scale) {
    Temporaries tmp(*this);
    int64_t rows = 0;
    std::vector<DeltaDesc> d;
    for (const DeltaRuleSeq& s : seqs) {
        rows += s.n_tok;
        d.push_back({dev(s.q), dev(s.k), dev(s.v), dev(s.g), dev(s.beta), dev(s.state),
                     dev(s.state_in), dev(s.out), s.n_tok});
    }
    op("gated_delta_rule", rows);
    if (d.empty()) return;
    if (3 * dim * sizeof(float) > 48 * 1024)
        throw Error("gated_delta_rule: heads of " + std::to_string(dim) + " values");
    cache_bytes_ += uint64_t(d.size()) * uint64_t(n_heads * dim * dim) * sizeof(float);
    const int threads = int(std::min<int64_t>(kThreads, (dim + 31) / 32 * 32));
    for (size_t at = 0; at < d.size(); at += kSeqs) {
        SeqBatch<DeltaDesc> b{};
        const size_t n = std::min(d.size() - at, size_t(kSeqs));
        std::copy_n(d.begin() + int64_t(at), n, b.d);
        GLM5_LAUNCH(delta_rule_kernel, unsigned(int64_t(n) * n_heads), threads,
                    size_t(3 * dim) * sizeof(float), stream(), b, n_heads, dim, scale);
    }
}

void CudaBackend::hc_coefficients(DevPtr<const float> mix, int64_t n_tok, int64_t n_streams,
                                  const float* base, const float* scale, float eps,
                                  int64_t iterations, DevPtr<float> pre, DevPtr<float> post,
                                  DevPtr<float> comb) {
    Temporaries tmp(*this);
    if (n_tok <= 0) return;
    check_streams(n_streams);
    const int64_t M = (2 + n_streams) * n_streams;
    GLM5_LAUNCH(hc_coeff_kernel, grid_for(n_tok, 64), 64, 0, stream(), dev(mix), n_tok, n_streams,
                vec(base, M), vec(scale, 3), eps, iterations, dev(pre), dev(post), dev(comb));
}

void CudaBackend::hc_reduce(DevPtr<const float> X, DevPtr<const float> w, int64_t n_tok,
                            int64_t n_streams, int64_t dim, DevPtr<float> y) {
    if (n_tok * dim <= 0) return;
    GLM5_LAUNCH(hc_reduce_kernel, grid_for(n_tok * dim), kThreads, 0, stream(), dev(X), dev(w),
                n_tok, n_streams, dim, dev(y));
}

void CudaBackend::hc_expand(DevPtr<const float> X, DevPtr<const float> f, DevPtr<const float> post,
                            DevPtr<const float> comb, int64_t n_tok, int64_t n_streams, int64_t dim,
                            DevPtr<float> out) {
    const int64_t n = n_tok * n_streams * dim;
    if (n <= 0) return;
    GLM5_LAUNCH(hc_expand_kernel, grid_for(n), kThreads, 0, stream(), dev(X), dev(f), dev(post),
                dev(comb), n_tok, n_streams, dim, dev(out));
}

void CudaBackend::pool_compress(const CacheRows& cells, int64_t key_width, int64_t gate_width,
                                int64_t pool_size, const float* ape, const float* norm_w, float eps,
                                const CacheRows& pools, DevPtr<const int32_t> pos, int64_t n_rows) {
    Temporaries tmp(*this);
    op("pool_compress", n_rows);
    if (n_rows <= 0) return;
    if (cells.type == CacheType::BF16 || pools.type == CacheType::BF16)
        throw Error("pool_compress: BF16 caches are the CPU's --attn-bf16");
    // Rows at consecutive positions complete at most n_rows / pool_size + 1 pools; the
    // kernel works out which from the positions.
    const int64_t most_pools = n_rows / pool_size + 1;
    const size_t shared = size_t(pool_size * gate_width + key_width) * sizeof(float);
    if (shared + kThreads * sizeof(double) > 48 * 1024)  // beside the kernel's own sums
        throw Error("pool_compress: pools of " + std::to_string(pool_size) + " x " +
                    std::to_string(gate_width) + " gates do not fit a block's shared memory");
    GLM5_LAUNCH(pool_kernel, unsigned(most_pools), kThreads, shared, stream(), dev(cells.data),
                cells.row_bytes(), cells.type == CacheType::F16, key_width, gate_width, pool_size,
                vec(ape, pool_size * gate_width), vec(norm_w, key_width), eps, dev(pools.data),
                pools.row_bytes(), pools.type == CacheType::F16, dev(pos), n_rows);
}

void CudaBackend::pool_cells(DevPtr<const int32_t> picked, DevPtr<const int32_t> pos,
                             int64_t n_rows, int64_t n_sel, int64_t pool_size, DevPtr<int32_t> rows,
                             int64_t stride) {
    if (n_rows <= 0) return;
    GLM5_LAUNCH(pool_cells_kernel, grid_for(n_rows, 64), 64, 0, stream(), dev(picked), dev(pos),
                n_rows, n_sel, pool_size, dev(rows), stride);
}

}  // namespace glm5::backend::cuda

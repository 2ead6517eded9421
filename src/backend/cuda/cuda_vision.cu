// The vision tower's ops on the GPU (backend/vision_ops.h): bias rows, the exact GELU, the
// 2-D rotary embedding (angles from the CPU's double frequencies) and non-causal attention
// with a running softmax, a warp per (query, head) taking the keys 32 at a time in order,
// so every sum runs in one fixed order whatever the launch. The values are the CPU's but
// for the device's exp, erf, sin and cos and the order of the attention's sums.
#include <cmath>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace glm5::backend::cuda {

namespace {

__global__ void add_bias_kernel(float* y, int64_t n_rows, int64_t dim, int64_t stride,
                                const float* b) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * dim) return;
    const int64_t r = i / dim, c = i % dim;
    y[r * stride + c] = __fadd_rn(y[r * stride + c], b[c]);
}

__global__ void gelu_erf_kernel(float* y, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = y[i];
    y[i] = __fmul_rn(__fmul_rn(0.5f, v), 1.0f + erff(__fmul_rn(v, 0.70710678118654752f)));
}

// Thread per (token, pair i < dim/2): its angle, for every head.
__global__ void rope_2d_kernel(float* x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                               int64_t dim, const int32_t* row, const int32_t* col,
                               const double* freq) {
    const int64_t half = dim / 2, quarter = dim / 4;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tok * half) return;
    const int64_t t = idx / half, i = idx % half;
    const double a = double(i < quarter ? row[t] : col[t]) * freq[i % quarter];
    const float c = float(cos(a)), s = float(sin(a));
    for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + t * tok_stride + h * dim;
        const float x0 = v[i], x1 = v[half + i];
        v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[half + i] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

struct AttnSeq {
    const float *q, *k, *v;
    float* out;
    int64_t n;
};

// Warp per (query, head) of sequence blockIdx.y: lane l scores key j0 + l of each chunk of
// 32; the chunk's maximum and sum by butterflies (the same bits on every lane); each lane
// accumulates the output dims l, l + 32, ... (kSlots of them) over the chunk's keys in order.
template <int kSlots>
__global__ void attention_full_kernel(const AttnSeq* seqs, int64_t H, int64_t D, int64_t stride,
                                      float scale) {
    const AttnSeq s = seqs[blockIdx.y];
    const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = int(threadIdx.x % 32);
    if (w >= s.n * H) return;  // (the whole warp: w is the warp's)
    const int64_t i = w / H, h = w % H;
    const float* q = s.q + i * stride + h * D;
    float acc[kSlots];
    for (int r = 0; r < kSlots; ++r) acc[r] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j0 = 0; j0 < s.n; j0 += 32) {
        const int64_t j = j0 + lane;
        float sc = -INFINITY;
        if (j < s.n) {
            const float* k = s.k + j * stride + h * D;
            float a = 0.0f;
            for (int64_t c = 0; c < D; ++c) a = fmaf(q[c], k[c], a);
            sc = __fmul_rn(a, scale);
        }
        float cm = sc;
        for (int off = 16; off > 0; off /= 2) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
        const float m_new = fmaxf(m, cm);
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        const float p = j < s.n ? expf(sc - m_new) : 0.0f;
        float ps = p;
        for (int off = 16; off > 0; off /= 2) ps += __shfl_xor_sync(0xffffffffu, ps, off);
        sum = fmaf(sum, corr, ps);
        for (int r = 0; r < kSlots; ++r) acc[r] = __fmul_rn(acc[r], corr);
        const int64_t nk = s.n - j0 < 32 ? s.n - j0 : 32;
        for (int64_t jj = 0; jj < nk; ++jj) {
            const float pj = __shfl_sync(0xffffffffu, p, int(jj));
            const float* v = s.v + (j0 + jj) * stride + h * D;
            for (int r = 0; r < kSlots; ++r) {
                const int64_t c = lane + 32 * r;
                if (c < D) acc[r] = fmaf(pj, v[c], acc[r]);
            }
        }
        m = m_new;
    }
    const float inv = 1.0f / sum;
    for (int r = 0; r < kSlots; ++r) {
        const int64_t c = lane + 32 * r;
        if (c < D) s.out[i * stride + h * D + c] = __fmul_rn(acc[r], inv);
    }
}

}  // namespace

void CudaBackend::add_bias(DevPtr<float> y, int64_t n_rows, int64_t dim, int64_t stride,
                           const float* b) {
    op("add_bias", n_rows);
    if (n_rows <= 0 || dim <= 0) return;
    GLM5_LAUNCH(add_bias_kernel, grid_for(n_rows * dim), kThreads, 0, stream(), dev(y), n_rows, dim,
                stride, vec(b, dim));
}

void CudaBackend::gelu_erf(DevPtr<float> y, int64_t n) {
    op("gelu_erf", n);
    if (n <= 0) return;
    GLM5_LAUNCH(gelu_erf_kernel, grid_for(n), kThreads, 0, stream(), dev(y), n);
}

void CudaBackend::rope_2d(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                          int64_t dim, const int32_t* row, const int32_t* col, float theta) {
    op("rope_2d", n_tok);
    if (n_tok <= 0) return;
    Temporaries t(*this);
    const int64_t half = dim / 2;
    const double* f = stage(rope_2d_frequencies(dim, theta));  // the CPU's, on the host
    const int32_t* r = stage(std::vector<int32_t>(row, row + n_tok));
    const int32_t* c = stage(std::vector<int32_t>(col, col + n_tok));
    GLM5_LAUNCH(rope_2d_kernel, grid_for(n_tok * half), kThreads, 0, stream(), dev(x), n_tok,
                tok_stride, n_heads, dim, r, c, f);
}

void CudaBackend::attention_full(std::span<const FullAttentionSeq> seqs, int64_t H, int64_t D,
                                 int64_t stride, float scale) {
    int64_t total = 0, most = 0;
    std::vector<AttnSeq> desc;
    for (const FullAttentionSeq& s : seqs) {
        total += s.n;
        most = std::max(most, s.n);
        desc.push_back({dev(s.q), dev(s.k), dev(s.v), dev(s.out), s.n});
    }
    op("attention_full", total);
    if (most <= 0 || H <= 0) return;
    if (D > 256)
        throw Error("attention_full: head width " + std::to_string(D) +
                    " is over the 256 the CUDA kernel holds");
    Temporaries t(*this);
    const AttnSeq* d = stage(desc);
    constexpr int kWarps = 4;
    const dim3 grid(grid_for(most * H, kWarps), unsigned(desc.size()));
    const unsigned block = kWarps * 32;
    if (D <= 32)
        GLM5_LAUNCH(attention_full_kernel<1>, grid, block, 0, stream(), d, H, D, stride, scale);
    else if (D <= 64)
        GLM5_LAUNCH(attention_full_kernel<2>, grid, block, 0, stream(), d, H, D, stride, scale);
    else if (D <= 128)
        GLM5_LAUNCH(attention_full_kernel<4>, grid, block, 0, stream(), d, H, D, stride, scale);
    else
        GLM5_LAUNCH(attention_full_kernel<8>, grid, block, 0, stream(), d, H, D, stride, scale);
}

}  // namespace glm5::backend::cuda

// The matrix products of every weight format (cuda_device.h). One kernel serves every
// format: the format is a launch argument and quant::groups decodes it, so adding a format
// adds no instantiation.
#include <algorithm>
#include <span>

#include "backend/cuda/cuda_internal.cuh"

namespace glm5::backend::cuda {

namespace {

namespace groups = quant::groups;

constexpr int kWarps = 4;       // weight rows per block of the vector form
constexpr int kTokenChunk = 8;  // tokens a lane keeps sums for at once

// Weight row `row` (cols values of `type`) against the N tokens from t0 of x that are below
// n_tok: acc[k] is token t0 + k's sum, in every lane. Lane l decodes groups l, l + 32, ...
// and keeps one chain of FMAs per token, then the lanes' sums meet in the butterfly of
// quant::groups::row_dot. Every product form calls this, so a row's bits do not depend on
// the launch that computed it, nor on how many tokens it shared (N = 1 or kTokenChunk).
template <int N>
__device__ inline void row_dots(quant::Type type, const uint8_t* row, int64_t cols, const float* x,
                                int64_t x_stride, int64_t t0, int64_t n_tok,
                                const groups::Tables& tab, float (&acc)[N]) {
    const int lane = int(threadIdx.x) & 31;
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.f;
    float v[groups::kGroup];
    const int64_t n_groups = groups::row_groups(cols);
    for (int64_t g = lane; g < n_groups; g += 32) {
        const int nv = groups::group_values(cols, g);
        groups::decode_group(type, row, g, tab, v, nv);
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (t0 + k < n_tok)
                acc[k] =
                    groups::group_dot(v, x + (t0 + k) * x_stride + groups::kGroup * g, acc[k], nv);
    }
    // Only the chunk's tokens (the test is the same for the whole warp).
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (t0 + k < n_tok)
            for (int off = 16; off >= 1; off /= 2)
                acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
}

// row_dots over a chunk of tokens, written to y[t * y_stride] by lane 0.
__device__ inline void row_products(quant::Type type, const uint8_t* row, int64_t cols,
                                    const float* x, int64_t x_stride, int64_t t0, int64_t n_tok,
                                    float* y, int64_t y_stride, const groups::Tables& tab) {
    float acc[kTokenChunk];
    row_dots(type, row, cols, x, x_stride, t0, n_tok, tab, acc);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < kTokenChunk; ++k)
            if (t0 + k < n_tok) y[(t0 + k) * y_stride] = acc[k];
    }
}

// A warp per weight row, kWarps rows a block, a chunk of tokens per blockIdx.y. Slice
// blockIdx.z of a stack: its weights at w + z * slice_bytes, its tokens and outputs
// x_slice and y_slice further on.
__global__ void __launch_bounds__(kWarps * 32)
    vector_kernel(quant::Type type, const uint8_t* w, size_t row_bytes, size_t slice_bytes,
                  int64_t cols, int64_t rows, const float* x, int64_t x_stride, int64_t x_slice,
                  int64_t n_tok, float* y, int64_t y_stride, int64_t y_slice, groups::Tables tab) {
    const int64_t r = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x >> 5);
    if (r >= rows) return;  // the whole warp: r is the same for its lanes
    w += size_t(blockIdx.z) * slice_bytes;
    x += int64_t(blockIdx.z) * x_slice;
    y += int64_t(blockIdx.z) * y_slice;
    row_products(type, w + size_t(r) * row_bytes, cols, x, x_stride,
                 int64_t(blockIdx.y) * kTokenChunk, n_tok, y + r, y_stride, tab);
}

// Several matrices against the same input in one launch (the projections of one
// normalised row): the blocks of output j are [first[j], first[j + 1]). Passed by value,
// so a launch copies nothing from the host.
// (Fields of 64 bits, or a 32-bit pair: no padding, so a launch's bytes are its values.)
struct MultiOut {
    quant::Type type;
    uint32_t unused = 0;
    const uint8_t* w;
    size_t row_bytes;
    int64_t cols, rows;
    float* y;
    int64_t y_stride;
};
struct MultiArgs {
    int64_t n;
    MultiOut out[Device::kMaxMulti];
    uint64_t first[Device::kMaxMulti + 1];
};

__global__ void __launch_bounds__(kWarps * 32)
    multi_kernel(MultiArgs a, const float* x, int64_t x_stride, int64_t n_tok, groups::Tables tab) {
    int j = 0;
    while (j + 1 < a.n && blockIdx.x >= a.first[j + 1]) ++j;
    const MultiOut& o = a.out[j];
    const int64_t r = int64_t(blockIdx.x - a.first[j]) * kWarps + int64_t(threadIdx.x >> 5);
    if (r >= o.rows) return;
    row_products(o.type, o.w + size_t(r) * o.row_bytes, o.cols, x, x_stride,
                 int64_t(blockIdx.y) * kTokenChunk, n_tok, o.y + r, o.y_stride, tab);
}

// One row of output per (weight row, pair p): the slice is ids[p], the input row
// p / x_every. The vector kernel's lanes and butterfly for a single token.
__global__ void __launch_bounds__(kWarps * 32)
    indexed_kernel(quant::Type type, const uint8_t* w, size_t row_bytes, size_t slice_bytes,
                   int64_t cols, int64_t rows, const int32_t* ids, int64_t x_every, const float* x,
                   int64_t x_stride, float* y, int64_t y_stride, groups::Tables tab) {
    // Pairs on x (many in a prefill), weight rows on y (at most 65535 blocks of them).
    const int64_t r = int64_t(blockIdx.y) * kWarps + int64_t(threadIdx.x >> 5);
    const int64_t p = blockIdx.x;
    if (r >= rows) return;
    const uint8_t* row = w + size_t(ids[p]) * slice_bytes + size_t(r) * row_bytes;
    float acc[1];
    row_dots(type, row, cols, x + (p / x_every) * x_stride, 0, 0, 1, tab, acc);
    if ((threadIdx.x & 31) == 0) y[p * y_stride + r] = acc[0];
}

// A SwiGLU hidden row from its gate and up rows in one pass: out[p * rows + r] =
// swiglu(gate row r . x_p, up row r . x_p), each product with row_dots' bits. With ids,
// pair p (blockIdx.x) reads slice ids[p] and input row p / x_every; without, blockIdx.x is
// a chunk of kTokenChunk tokens and the slice is 0.
__global__ void __launch_bounds__(kWarps * 32)
    gate_up_kernel(quant::Type tg, const uint8_t* wg, quant::Type tu, const uint8_t* wu,
                   size_t row_bytes_g, size_t row_bytes_u, size_t slice_g, size_t slice_u,
                   int64_t cols, int64_t rows, const int32_t* ids, int64_t x_every, const float* x,
                   int64_t x_stride, int64_t n, float clamp, float* out, groups::Tables tab) {
    const int64_t r = int64_t(blockIdx.y) * kWarps + int64_t(threadIdx.x >> 5);
    if (r >= rows) return;
    if (ids) {
        const int64_t p = blockIdx.x;
        const float* xp = x + (p / x_every) * x_stride;
        float g[1], u[1];
        row_dots(tg, wg + size_t(ids[p]) * slice_g + size_t(r) * row_bytes_g, cols, xp, 0, 0, 1,
                 tab, g);
        row_dots(tu, wu + size_t(ids[p]) * slice_u + size_t(r) * row_bytes_u, cols, xp, 0, 0, 1,
                 tab, u);
        if ((threadIdx.x & 31) == 0) out[p * rows + r] = swiglu_value(g[0], u[0], clamp);
        return;
    }
    const int64_t t0 = int64_t(blockIdx.x) * kTokenChunk;
    float g[kTokenChunk], u[kTokenChunk];
    row_dots(tg, wg + size_t(r) * row_bytes_g, cols, x, x_stride, t0, n, tab, g);
    row_dots(tu, wu + size_t(r) * row_bytes_u, cols, x, x_stride, t0, n, tab, u);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < kTokenChunk; ++k)
            if (t0 + k < n) out[(t0 + k) * rows + r] = swiglu_value(g[k], u[k], clamp);
    }
}

unsigned blocks_for(int64_t n, int threads) {
    return unsigned((n + threads - 1) / threads);
}

}  // namespace

void Device::matmul(const Matrix& w, int64_t slice, const float* x, int64_t x_stride, int64_t n_tok,
                    float* y, int64_t y_stride) {
    if (n_tok <= 0 || w.rows <= 0) return;
    bind();
    const dim3 grid(blocks_for(w.rows, kWarps), blocks_for(n_tok, kTokenChunk));
    GLM5_LAUNCH(vector_kernel, grid, kWarps * 32, 0, impl_->stream, w.type,
                w.data + size_t(slice) * w.slice_bytes, w.row_bytes, w.slice_bytes, w.cols, w.rows,
                x, x_stride, 0, n_tok, y, y_stride, 0, impl_->tables);
    impl_->weight_bytes += uint64_t(w.slice_bytes) * grid.y;
}

void Device::matmuls(std::span<const MatmulTarget> outs, const float* x, int64_t x_stride,
                     int64_t n_tok) {
    if (n_tok <= 0 || outs.empty()) return;
    bind();
    for (size_t at = 0; at < outs.size(); at += kMaxMulti) {
        MultiArgs a{};
        a.n = int64_t(std::min(outs.size() - at, size_t(kMaxMulti)));
        unsigned blocks = 0;
        for (int j = 0; j < a.n; ++j) {
            const MatmulTarget& t = outs[at + size_t(j)];
            a.out[j] = {t.w->type, 0,         t.w->data, t.w->row_bytes,
                        t.w->cols, t.w->rows, t.y,       t.y_stride};
            a.first[j] = blocks;
            blocks += blocks_for(t.w->rows, kWarps);
            impl_->weight_bytes += uint64_t(t.w->slice_bytes) * blocks_for(n_tok, kTokenChunk);
        }
        a.first[a.n] = blocks;
        const dim3 grid(blocks, blocks_for(n_tok, kTokenChunk));
        GLM5_LAUNCH(multi_kernel, grid, kWarps * 32, 0, impl_->stream, a, x, x_stride, n_tok,
                    impl_->tables);
    }
}

void Device::gate_up(const Matrix& gate, const Matrix& up, const int32_t* ids, int64_t n,
                     int64_t x_every, const float* x, int64_t x_stride, float clamp, float* out) {
    if (n <= 0 || gate.rows <= 0) return;
    bind();
    const unsigned along = ids ? unsigned(n) : blocks_for(n, kTokenChunk);
    const dim3 grid(along, blocks_for(gate.rows, kWarps));
    GLM5_LAUNCH(gate_up_kernel, grid, kWarps * 32, 0, impl_->stream, gate.type, gate.data, up.type,
                up.data, gate.row_bytes, up.row_bytes, gate.slice_bytes, up.slice_bytes, gate.cols,
                gate.rows, ids, x_every, x, x_stride, n, clamp, out, impl_->tables);
    impl_->weight_bytes += uint64_t(gate.slice_bytes + up.slice_bytes) * along;
}

void Device::matmul_slices(const Matrix& w, const float* x, int64_t x_tok, int64_t x_slice,
                           int64_t n_tok, float* y, int64_t y_tok, int64_t y_slice) {
    if (n_tok <= 0 || w.rows <= 0 || w.slices <= 0) return;
    bind();
    const dim3 grid(blocks_for(w.rows, kWarps), blocks_for(n_tok, kTokenChunk), unsigned(w.slices));
    GLM5_LAUNCH(vector_kernel, grid, kWarps * 32, 0, impl_->stream, w.type, w.data, w.row_bytes,
                w.slice_bytes, w.cols, w.rows, x, x_tok, x_slice, n_tok, y, y_tok, y_slice,
                impl_->tables);
    impl_->weight_bytes += uint64_t(w.slice_bytes) * uint64_t(w.slices) * grid.y;
}

void Device::matmul_indexed(const Matrix& w, const int32_t* ids, int64_t n, int64_t x_every,
                            const float* x, int64_t x_stride, float* y, int64_t y_stride) {
    if (n <= 0 || w.rows <= 0) return;
    bind();
    const dim3 grid(unsigned(n), blocks_for(w.rows, kWarps));
    GLM5_LAUNCH(indexed_kernel, grid, kWarps * 32, 0, impl_->stream, w.type, w.data, w.row_bytes,
                w.slice_bytes, w.cols, w.rows, ids, x_every, x, x_stride, y, y_stride,
                impl_->tables);
    impl_->weight_bytes += uint64_t(w.slice_bytes) * uint64_t(n);
}

}  // namespace glm5::backend::cuda

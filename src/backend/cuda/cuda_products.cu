// The matrix products of every weight format (cuda_device.h). One kernel serves every
// format: the format is a launch argument and quant::groups decodes it, so adding a format
// adds no instantiation.
#include <algorithm>

#include "backend/cuda/cuda_internal.cuh"

namespace glm5::backend::cuda {

namespace {

namespace groups = quant::groups;

constexpr int kWarps = 4;       // weight rows per block of the vector form
constexpr int kTokenChunk = 8;  // tokens a lane keeps sums for at once

// A warp per weight row: lane l decodes groups l, l + 32, ... and keeps one chain of
// FMAs per token of its chunk (blockIdx.y), then the lanes' sums meet in the butterfly
// of quant::groups::row_dot.
// Slice blockIdx.z of a stack: its weights at w + z * slice_bytes, its tokens and outputs
// x_slice and y_slice further on.
__global__ void __launch_bounds__(kWarps * 32)
    vector_kernel(quant::Type type, const uint8_t* w, size_t row_bytes, size_t slice_bytes,
                  int64_t cols, int64_t rows, const float* x, int64_t x_stride, int64_t x_slice,
                  int64_t n_tok, float* y, int64_t y_stride, int64_t y_slice, groups::Tables tab) {
    const int lane = int(threadIdx.x) & 31;
    const int64_t r = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x >> 5);
    const int64_t t0 = int64_t(blockIdx.y) * kTokenChunk;
    if (r >= rows) return;  // the whole warp: r is the same for its lanes
    w += size_t(blockIdx.z) * slice_bytes;
    x += int64_t(blockIdx.z) * x_slice;
    y += int64_t(blockIdx.z) * y_slice;
    const uint8_t* row = w + size_t(r) * row_bytes;
    float acc[kTokenChunk];
#pragma unroll
    for (int k = 0; k < kTokenChunk; ++k) acc[k] = 0.f;
    float v[groups::kGroup];
    const int64_t n_groups = groups::row_groups(cols);
    for (int64_t g = lane; g < n_groups; g += 32) {
        const int nv = groups::group_values(cols, g);
        groups::decode_group(type, row, g, tab, v, nv);
#pragma unroll
        for (int k = 0; k < kTokenChunk; ++k)
            if (t0 + k < n_tok)
                acc[k] =
                    groups::group_dot(v, x + (t0 + k) * x_stride + groups::kGroup * g, acc[k], nv);
    }
    // Only the chunk's tokens (the test is the same for the whole warp).
#pragma unroll
    for (int k = 0; k < kTokenChunk; ++k)
        if (t0 + k < n_tok)
            for (int off = 16; off >= 1; off /= 2)
                acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < kTokenChunk; ++k)
            if (t0 + k < n_tok) y[(t0 + k) * y_stride + r] = acc[k];
    }
}

// One row of output per (weight row, pair p): the slice is ids[p], the input row
// p / x_every. The vector kernel's lanes and butterfly for a single token.
__global__ void __launch_bounds__(kWarps * 32)
    indexed_kernel(quant::Type type, const uint8_t* w, size_t row_bytes, size_t slice_bytes,
                   int64_t cols, int64_t rows, const int32_t* ids, int64_t x_every, const float* x,
                   int64_t x_stride, float* y, int64_t y_stride, groups::Tables tab) {
    const int lane = int(threadIdx.x) & 31;
    // Pairs on x (many in a prefill), weight rows on y (at most 65535 blocks of them).
    const int64_t r = int64_t(blockIdx.y) * kWarps + int64_t(threadIdx.x >> 5);
    const int64_t p = blockIdx.x;
    if (r >= rows) return;
    const uint8_t* row = w + size_t(ids[p]) * slice_bytes + size_t(r) * row_bytes;
    const float* xp = x + (p / x_every) * x_stride;
    float acc = 0.f;
    float v[groups::kGroup];
    for (int64_t g = lane; g < groups::row_groups(cols); g += 32) {
        const int nv = groups::group_values(cols, g);
        groups::decode_group(type, row, g, tab, v, nv);
        acc = groups::group_dot(v, xp + groups::kGroup * g, acc, nv);
    }
    for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) y[p * y_stride + r] = acc;
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

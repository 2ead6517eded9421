// The matrix products of every weight format (cuda_device.h says which form runs when).
// One kernel of each form serves every format: the format is a launch argument and
// quant::groups decodes it, so adding a format adds no instantiation.
#include <cuda_fp16.h>

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
    const int64_t n_groups = cols / groups::kGroup;
    for (int64_t g = lane; g < n_groups; g += 32) {
        groups::decode_group(type, row, g, tab, v);
#pragma unroll
        for (int k = 0; k < kTokenChunk; ++k)
            if (t0 + k < n_tok)
                acc[k] = groups::group_dot(v, x + (t0 + k) * x_stride + groups::kGroup * g, acc[k]);
    }
#pragma unroll
    for (int k = 0; k < kTokenChunk; ++k)
        for (int off = 16; off >= 1; off /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
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
    for (int64_t g = lane; g < cols / groups::kGroup; g += 32) {
        groups::decode_group(type, row, g, tab, v);
        acc = groups::group_dot(v, xp + groups::kGroup * g, acc);
    }
    for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) y[p * y_stride + r] = acc;
}

// Rows [r0, r0 + n_rows) of a matrix decoded to F16, packed [n_rows][cols]: a thread
// per group.
__global__ void decode_f16_kernel(quant::Type type, const uint8_t* w, size_t row_bytes,
                                  int64_t cols, int64_t r0, int64_t n_rows, __half* out,
                                  groups::Tables tab) {
    const int64_t per_row = cols / groups::kGroup;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * per_row) return;
    const int64_t r = i / per_row, g = i % per_row;
    float v[groups::kGroup];
    groups::decode_group(type, w + size_t(r0 + r) * row_bytes, g, tab, v);
    __half* o = out + r * cols + g * groups::kGroup;
#pragma unroll
    for (int j = 0; j < groups::kGroup; ++j) o[j] = __float2half_rn(v[j]);
}

// x [n_tok][x_stride] to F16 [n_tok][cols].
__global__ void tokens_f16_kernel(const float* x, int64_t x_stride, int64_t n_tok, int64_t cols,
                                  __half* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tok * cols) return;
    out[i] = __float2half_rn(x[(i / cols) * x_stride + i % cols]);
}

unsigned blocks_for(int64_t n, int threads) {
    return unsigned((n + threads - 1) / threads);
}

}  // namespace

void Device::matmul(const Matrix& w, int64_t slice, const float* x, int64_t x_stride, int64_t n_tok,
                    float* y, int64_t y_stride) {
    matmul_vector(w, slice, x, x_stride, n_tok, y, y_stride);
}

void Device::matmul_vector(const Matrix& w, int64_t slice, const float* x, int64_t x_stride,
                           int64_t n_tok, float* y, int64_t y_stride) {
    if (n_tok <= 0 || w.rows <= 0) return;
    const dim3 grid(blocks_for(w.rows, kWarps), blocks_for(n_tok, kTokenChunk));
    vector_kernel<<<grid, kWarps * 32, 0, impl_->stream>>>(
        w.type, w.data + size_t(slice) * w.slice_bytes, w.row_bytes, w.slice_bytes, w.cols, w.rows,
        x, x_stride, 0, n_tok, y, y_stride, 0, impl_->tables);
    check(cudaGetLastError(), "the vector product's launch");
    impl_->weight_bytes += uint64_t(w.slice_bytes) * grid.y;
}

void Device::matmul_slices(const Matrix& w, const float* x, int64_t x_tok, int64_t x_slice,
                           int64_t n_tok, float* y, int64_t y_tok, int64_t y_slice) {
    if (n_tok <= 0 || w.rows <= 0 || w.slices <= 0) return;
    const dim3 grid(blocks_for(w.rows, kWarps), blocks_for(n_tok, kTokenChunk), unsigned(w.slices));
    vector_kernel<<<grid, kWarps * 32, 0, impl_->stream>>>(
        w.type, w.data, w.row_bytes, w.slice_bytes, w.cols, w.rows, x, x_tok, x_slice, n_tok, y,
        y_tok, y_slice, impl_->tables);
    check(cudaGetLastError(), "the sliced product's launch");
    impl_->weight_bytes += uint64_t(w.slice_bytes) * uint64_t(w.slices) * grid.y;
}

void Device::matmul_indexed(const Matrix& w, const int32_t* ids, int64_t n, int64_t x_every,
                            const float* x, int64_t x_stride, float* y, int64_t y_stride) {
    if (n <= 0 || w.rows <= 0) return;
    const dim3 grid(unsigned(n), blocks_for(w.rows, kWarps));
    indexed_kernel<<<grid, kWarps * 32, 0, impl_->stream>>>(
        w.type, w.data, w.row_bytes, w.slice_bytes, w.cols, w.rows, ids, x_every, x, x_stride, y,
        y_stride, impl_->tables);
    check(cudaGetLastError(), "the indexed product's launch");
    impl_->weight_bytes += uint64_t(w.slice_bytes) * uint64_t(n);
}

void Device::matmul_tiled(const Matrix& w, int64_t slice, const float* x, int64_t x_stride,
                          int64_t n_tok, float* y, int64_t y_stride) {
    if (n_tok <= 0 || w.rows <= 0) return;
    // Weight tiles of at most 64 MiB of F16: the scratch stays small beside the
    // weights, and a GEMM of that size keeps the tensor cores busy.
    const int64_t tile_rows =
        std::min(w.rows, std::max<int64_t>((int64_t(64) << 20) / (2 * w.cols) / 128 * 128, 128));
    auto* xh = static_cast<__half*>(impl_->scratch_bytes(0, size_t(n_tok * w.cols) * 2));
    auto* wh = static_cast<__half*>(impl_->scratch_bytes(1, size_t(tile_rows * w.cols) * 2));
    tokens_f16_kernel<<<blocks_for(n_tok * w.cols, 256), 256, 0, impl_->stream>>>(
        x, x_stride, n_tok, w.cols, xh);
    check(cudaGetLastError(), "the tokens' F16 rounding launch");
    const uint8_t* base = w.data + size_t(slice) * w.slice_bytes;
    const float one = 1.f, zero = 0.f;
    for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
        const int64_t n = std::min(tile_rows, w.rows - r0);
        decode_f16_kernel<<<blocks_for(n * (w.cols / 32), 128), 128, 0, impl_->stream>>>(
            w.type, base, w.row_bytes, w.cols, r0, n, wh, impl_->tables);
        check(cudaGetLastError(), "the weight tile's decode launch");
        // Column-major view: C (n x n_tok, ldc y_stride) = A^T B with A the tile
        // (cols x n, lda cols) and B the tokens (cols x n_tok, ldb cols).
        check_blas(cublasGemmEx(impl_->blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n_tok),
                                int(w.cols), &one, wh, CUDA_R_16F, int(w.cols), xh, CUDA_R_16F,
                                int(w.cols), &zero, y + r0, CUDA_R_32F, int(y_stride),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
    impl_->weight_bytes += uint64_t(w.slice_bytes);
}

}  // namespace glm5::backend::cuda

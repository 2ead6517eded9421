// The CUDA backend's class, shared by its .cu files (memory and elementwise ops in
// cuda_backend.cu, attention in cuda_attention.cu, the mixture of experts in cuda_moe.cu,
// GLM-5.3-Flash's own ops in cuda_glm5next.cu, the vision tower's in cuda_vision.cu).
#pragma once

#include <cuda_fp16.h>

#include <functional>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/attention_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/linear_ops.h"
#include "backend/moe_ops.h"
#include "backend/vision_ops.h"

namespace glm5::backend::cuda {

constexpr int kThreads = 256;
inline unsigned grid_for(int64_t n, int threads = kThreads) {
    return unsigned((n + threads - 1) / threads);
}

// ---- what the kernels share --------------------------------------------------------

// A block's sum of one double per thread, in a fixed tree (blockDim.x a power of two,
// at most kThreads; `sh` kThreads doubles of shared memory): every thread gets it.
__device__ inline double block_sum(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

// Row xr's RMS norm (w may be null) to yr, by the block (`sh` as block_sum's).
__device__ inline void rms_norm_row(const float* xr, const float* w, int64_t dim, float eps,
                                    float* yr, double* sh) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) acc += double(__fmul_rn(xr[i], xr[i]));
    const double sum = block_sum(acc, sh);
    const float mean = float(sum / double(dim));
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = w ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

// Row xr's layer norm (w, b may be null) to yr, by the block (`sh` as block_sum's).
__device__ inline void layer_norm_row(const float* xr, const float* w, const float* b, int64_t dim,
                                      float eps, float* yr, double* sh) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) acc += double(xr[i]);
    const float mean = float(block_sum(acc, sh) / double(dim));
    double acc2 = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] - mean;
        acc2 += double(__fmul_rn(v, v));
    }
    const float var = float(block_sum(acc2, sh) / double(dim));
    const float scale = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = __fmul_rn(xr[i] - mean, scale);
        if (w) v = __fmul_rn(v, w[i]);
        if (b) v += b[i];
        yr[i] = v;
    }
}

// RoPE of pair k (values 2k and 2k + 1 of x) at position p: the angle by repeated
// multiplication, as the CPU forms it.
__device__ inline void rope_pair(float* x, int32_t p, int64_t k, float theta_scale) {
    float theta = float(p);
    for (int64_t j = 0; j < k; ++j) theta = __fmul_rn(theta, theta_scale);
    const float c = cosf(theta), s = sinf(theta);
    const float x0 = x[2 * k], x1 = x[2 * k + 1];
    x[2 * k] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
    x[2 * k + 1] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
}

// The normalised Hadamard transform of v[0, dim) (shared memory, the block's values, dim a
// power of two) to out; v is left transformed but not scaled.
__device__ inline void hadamard_shared(float* v, int64_t dim, float* out) {
    for (int64_t len = 1; len < dim; len <<= 1) {
        for (int64_t k = threadIdx.x; k < dim / 2; k += blockDim.x) {
            const int64_t i = (k / len) * 2 * len + k % len;
            const float a = v[i], b = v[i + len];
            v[i] = a + b;
            v[i + len] = a - b;
        }
        __syncthreads();
    }
    const float s = 1.0f / sqrtf(float(dim));
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[i] = __fmul_rn(v[i], s);
}

// Value i of a cache row held as F16 or F32.
__device__ inline float load_value(const uint8_t* row, int64_t i, bool f16) {
    return f16 ? __half2float(reinterpret_cast<const __half*>(row)[i])
               : reinterpret_cast<const float*>(row)[i];
}
__device__ inline void store_value(uint8_t* row, int64_t i, float v, bool f16) {
    if (f16)
        reinterpret_cast<__half*>(row)[i] = __float2half_rn(v);
    else
        reinterpret_cast<float*>(row)[i] = v;
}

class CudaBackend final : public Backend,
                          public MoeOps,
                          public AttentionOps,
                          public LinearOps,
                          public VisionOps {
  public:
    explicit CudaBackend(int ordinal);
    ~CudaBackend() override;
    std::string name() const override;
    size_t attention_scratch_bytes(int64_t n_heads, int64_t n_visible) const override;

    void reduce_sum(DevPtr<float> x, int64_t n) override;
    void receive_rows(RowChannel& from, DevPtr<float> x, size_t n) override;
    void send_rows(RowChannel& to, DevPtr<const float> x, size_t n) override;

    DevPtr<float> scratch(size_t n_floats) override;
    void reset_scratch() override;
    DevPtr<uint8_t> alloc_cache(size_t bytes) override;
    void free_cache(DevPtr<uint8_t> p) override;
    void read_bytes(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) override;
    void write_bytes(DevPtr<uint8_t> dst, const void* host_src, size_t bytes) override;
    Weight register_weight(const Weight& w, bool copy, const std::string& name) override;
    void register_vector(const float* v, int64_t n, const std::string& name) override;
    void register_view(const Weight& w, const std::string& name) override;
    size_t weight_copy_bytes(quant::Type t, int64_t cols, int64_t rows,
                             int64_t slices) const override;
    void read_async(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) override;
    void sync() override;
    // A step's work is recorded and launched at its end as one CUDA graph (Device's
    // begin_graph); a step inside another is part of it.
    void begin_step() override;
    void end_step() override;
    void copy_cache(DevPtr<uint8_t> dst, DevPtr<const uint8_t> src, size_t bytes,
                    const char* why) override;
    void planned(const PlanArrays& a, const PlanHandles& h) override;

    void embed(const Weight& table, DevPtr<const int32_t> ids, int64_t n,
               DevPtr<float> out) override;
    void rms_norm(DevPtr<const float> x, int64_t x_stride, const float* w, int64_t n_rows,
                  int64_t dim, float eps, DevPtr<float> y, int64_t y_stride) override;
    void add_rms_norm(DevPtr<float> x, DevPtr<const float> d, const float* w, int64_t n_rows,
                      int64_t dim, float eps, DevPtr<float> y) override;
    void layer_norm(DevPtr<const float> x, const float* w, const float* b, int64_t n_rows,
                    int64_t dim, float eps, DevPtr<float> y) override;
    void rope(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
              int64_t head_stride, int64_t n_rot, DevPtr<const int32_t> pos,
              float freq_base) override;
    void hadamard(DevPtr<float> x, int64_t n_vec, int64_t dim) override;
    void copy_rows(DevPtr<const float> src, int64_t src_stride, DevPtr<const int32_t> rows,
                   int64_t n_rows, int64_t n_cols, DevPtr<float> dst, int64_t dst_stride) override;
    void add(DevPtr<float> y, DevPtr<const float> x, int64_t n) override;
    void scale(DevPtr<float> y, float s, int64_t n) override;
    void swiglu(DevPtr<const float> g, DevPtr<const float> u, int64_t n_rows, int64_t n,
                int64_t in_stride, float clamp, DevPtr<float> out) override;
    void matmul(const Weight& w, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                DevPtr<float> y, int64_t y_stride) override;
    void matmuls(std::span<const MatmulOut> outs, DevPtr<const float> x, int64_t x_stride,
                 int64_t n_tok) override;
    void matmul_slices(const Weight& w, DevPtr<const float> x, int64_t x_tok, int64_t x_slice,
                       int64_t n_tok, DevPtr<float> y, int64_t y_tok, int64_t y_slice) override;
    void cache_store(const CacheRows& cache, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                     DevPtr<const int32_t> pos) override;
    void mla_rows(const MlaRows& m, DevPtr<const int32_t> pos,
                  std::span<const Segment> segs) override;
    void indexer_inputs(DevPtr<float> q, DevPtr<float> k, DevPtr<float> w,
                        DevPtr<const int32_t> pos, std::span<const Segment> keys, int64_t n_heads,
                        int64_t dim, int64_t n_rot, float freq_base, const float* norm_w,
                        const float* norm_b, float w_scale) override;
    void indexer_select(DevPtr<const float> q, DevPtr<const float> w, DevPtr<const int32_t> pos,
                        std::span<const Segment> keys, int64_t pool, int64_t n_heads, int64_t dim,
                        int64_t top_k, DevPtr<int32_t> out) override;
    void mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos,
                       std::span<const Segment> segs, const Selection& sel, int64_t n_heads,
                       int64_t v_width, float scale, DevPtr<float> out) override;
    void draft_pick(DevPtr<const float> logits, int64_t n_rows, int64_t n_vocab,
                    DevPtr<int32_t> best, DevPtr<double> prob) override;
    void moe_route(const MoeRouter& r, DevPtr<const float> x, int64_t n_tok, DevPtr<int32_t> ids,
                   DevPtr<float> weights) override;
    void moe_experts(const MoeFfn& experts, DevPtr<const float> x, int64_t n_tok,
                     DevPtr<const int32_t> ids, DevPtr<const float> weights, int n_used,
                     const MoeFfn* fused_shared, DevPtr<const float> shared_rows,
                     DevPtr<float> out) override;
    void moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t n_tok,
                    DevPtr<float> out) override;
    Counters counters() const override;
    void reset_counters() override;

    // GLM-5.3-Flash's ops (cuda_glm5next.cu).
    void l2_norm(DevPtr<const float>, int64_t, int64_t, float, DevPtr<float>) override;
    void apply_sigmoid(DevPtr<float>, int64_t) override;
    void mul_sigmoid(DevPtr<float>, DevPtr<const float>, int64_t) override;
    void causal_conv(std::span<const ConvSeq>, int64_t, const float*, int64_t, int64_t, int64_t,
                     bool) override;
    void bounded_decay(DevPtr<const float>, const float*, const float*, int64_t, int64_t, int64_t,
                       float, DevPtr<float>) override;
    void gated_delta_rule(std::span<const DeltaRuleSeq>, int64_t, int64_t, float) override;
    void hc_coefficients(DevPtr<const float>, int64_t, int64_t, const float*, const float*, float,
                         int64_t, DevPtr<float>, DevPtr<float>, DevPtr<float>) override;
    void hc_reduce(DevPtr<const float>, DevPtr<const float>, int64_t, int64_t, int64_t,
                   DevPtr<float>) override;
    void hc_expand(DevPtr<const float>, DevPtr<const float>, DevPtr<const float>,
                   DevPtr<const float>, int64_t, int64_t, int64_t, DevPtr<float>) override;
    void pool_compress(const CacheRows&, int64_t, int64_t, int64_t, const float*, const float*,
                       float, const CacheRows&, DevPtr<const int32_t>, int64_t) override;
    void pool_cells(DevPtr<const int32_t>, DevPtr<const int32_t>, int64_t, int64_t, int64_t,
                    DevPtr<int32_t>, int64_t) override;

    // The vision tower's ops (cuda_vision.cu).
    void add_bias(DevPtr<float> y, int64_t n_rows, int64_t dim, int64_t stride,
                  const float* b) override;
    void gelu_erf(DevPtr<float> y, int64_t n) override;
    void rope_2d(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads, int64_t dim,
                 const int32_t* row, const int32_t* col, float theta) override;
    void attention_full(std::span<const FullAttentionSeq> seqs, int64_t n_heads, int64_t dim,
                        int64_t stride, float scale) override;

    // ---- for the kernels' files --------------------------------------------
    template <class T>
    T* dev(DevPtr<T> p) const {
        if (!p) return nullptr;
        if (p.owner() != id()) foreign(p.owner());
        return reinterpret_cast<T*>(p.handle());
    }
    using Backend::owned;
    cudaStream_t stream() const { return static_cast<cudaStream_t>(dev_.stream()); }
    Device& device() { return dev_; }
    // The device view of a weight: a registered one as it is; a view of the host's (the
    // loader keeps the token table, and matrices that are cut later, as plain views) in the
    // copy register_view made of it; any other host view copied into scratch for this step.
    Matrix matrix(const Weight& w, const char* op);
    // The device copy of a weight vector of n floats (null stays null): the one
    // register_vector made, or a copy in scratch for this step.
    const float* vec(const float* host, int64_t n);
    // The step's positions on the host, rows [0, n): the plan's copy, or read back. The
    // attention ops size their launches from them, so a step captured as a CUDA graph
    // would replay stale sizes: capture needs bounds the kernels read on the device.
    const int32_t* host_positions(DevPtr<const int32_t> pos, int64_t n);
    // Scratch of `bytes` on the device, valid until reset_scratch() (or the end of the
    // Temporaries scope it was taken in).
    void* scratch_bytes(size_t bytes);
    // A host array copied into scratch (descriptors of an op's rows).
    template <class T>
    T* stage(const std::vector<T>& host) {
        auto* d = static_cast<T*>(scratch_bytes(std::max<size_t>(1, host.size()) * sizeof(T)));
        dev_.upload(d, host.data(), host.size() * sizeof(T));
        return d;
    }
    // An op's temporaries: the scratch taken while one is alive is given back when it ends
    // (the stream runs in order, so the op's kernels are queued before anything that reuses
    // it), so that a step's scratch is one layer's worth, not every layer's.
    class Temporaries {
      public:
        explicit Temporaries(CudaBackend& b);
        ~Temporaries();
        Temporaries(const Temporaries&) = delete;
        Temporaries& operator=(const Temporaries&) = delete;

      private:
        CudaBackend& b_;
        size_t block_, used_;
    };
    void op(const char* name, int64_t rows) { op_hook(name, rows); }
    uint64_t cache_bytes_ = 0;
    uint64_t matmul_calls_ = 0;

  private:
    // Gives back the scratch taken after (block, used).
    void rewind(size_t block, size_t used);

    Device dev_;
    // The scratch arena: blocks of device memory, bump-allocated; at reset the blocks of a
    // step that needed more than one become one block of the step's size.
    struct Block {
        uint8_t* p = nullptr;
        size_t cap = 0, used = 0;
    };
    std::vector<Block> blocks_;
    size_t cur_ = 0;
    size_t high_water_ = 0;  // the most scratch held at once since reset_counters
    size_t most_held_ = 0;   // ... ever (the size of the arena's one block)
    std::vector<Matrix> weights_;
    std::map<uintptr_t, size_t> registered_;  // device ranges of weights_: start -> bytes
    // register_view's copies: host range start -> (end, device start). A later registration
    // of the same start replaces the copy (a model loaded where another was).
    struct ViewCopy {
        uintptr_t end;
        uint8_t* dev;
    };
    std::map<uintptr_t, ViewCopy> views_;
    // register_vector's copies, by host address (replaced likewise).
    std::unordered_map<const float*, std::pair<float*, int64_t>> vecs_;
    std::vector<int32_t> plan_pos_;
    const int32_t* plan_pos_dev_ = nullptr;
    std::vector<int32_t> pos_tmp_;
    int steps_open_ = 0;
    int exceptions_at_step_ = 0;
};

}  // namespace glm5::backend::cuda

// An NVIDIA GPU as the engine uses it: found and opened with the reason when it
// cannot be, its memory counted and allocated with the numbers when it does not fit,
// weight matrices uploaded once in their GGUF formats, and the matrix products of
// every weight format (quant/groups.h decodes them). Host C++ only here: the CUDA
// runtime stays inside the .cu files, so the apps and the tests include this header
// from plain C++.
//
// Products, y[t][0..rows) = W[slice] . x[t] for t < n_tok, in the vector form: a warp per
// weight row; each lane decodes its groups once for eight tokens at a time and keeps a chain
// of FMAs per token; the lanes meet in a fixed butterfly. A token's result is
// quant::groups::row_dot's, bit for bit, whatever the token count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "quant/groups.h"

namespace glm5::backend::cuda {

struct DeviceInfo {
    int ordinal = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    uint64_t total_bytes = 0;
};

// The devices this process can use. Empty, with the CUDA runtime's reason in `why`
// (no driver, no device, a device this build has no code for), when there are none. Opens
// no device (a context costs memory on every GPU it touches).
std::vector<DeviceInfo> list_devices(std::string* why);
// The free memory of device `ordinal` now (its context opened, no other's); throws
// glm5::Error with the reason when it cannot be read.
uint64_t device_free_bytes(int ordinal);

// Whether this build runs kernels in the CUDA simulator (GLM5_CUDA_SIM) rather than on a GPU.
bool simulated();

// The GPU architectures this build carries code for ("80 89 90").
std::string built_architectures();

// A matrix, or a stack of slices, in device memory in its storage format: row r of
// slice s at data + s * slice_bytes + r * row_bytes. A float matrix may have any number of
// columns: the products decode the values of a row's last group, partial or whole, only.
struct Matrix {
    quant::Type type = quant::Type::F32;
    int64_t cols = 0, rows = 0, slices = 1;
    size_t row_bytes = 0, slice_bytes = 0;
    const uint8_t* data = nullptr;  // device memory
};

struct DeviceTraffic {
    uint64_t launches = 0, syncs = 0, uploads = 0, downloads = 0;
    // Steps launched as one CUDA graph, and the graphs captured for them.
    uint64_t graphs = 0, captures = 0;
};

class Device {
  public:
    // Opens device `ordinal` (cudaSetDevice, a stream, pinned staging, the i-quant tables);
    // throws glm5::Error naming the device and the reason.
    explicit Device(int ordinal);
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    const DeviceInfo& info() const;
    // Makes this device the calling thread's current one (every entry point does: a
    // model's steps run on the engine's thread, not the one that opened the device).
    void bind() const;
    // Free and total device memory now.
    uint64_t free_bytes() const;

    // ---- memory ------------------------------------------------------------
    // Device memory of `bytes`; what does not fit throws glm5::ResourceError with the
    // bytes asked, the bytes free and `what` it was for.
    void* alloc(size_t bytes, const std::string& what);
    void free(void* p);
    // Copies queued on the device's stream, in order with its ops. An upload has taken the
    // host's bytes when it returns; a download has filled host_dst when synchronize() has
    // returned, and the caller leaves host_dst alone until then.
    void upload(void* dst, const void* host_src, size_t bytes);
    void download(void* host_dst, const void* src, size_t bytes);
    // Device memory to device memory, queued likewise.
    void copy(void* dst, const void* src, size_t bytes);
    // Waits for everything queued and completes the downloads; a failed op surfaces here as
    // glm5::Error.
    void synchronize();

    // The simulator's watch of scratch memory (a no-op on a GPU), queued in order with the
    // work: `in_use` bytes at p are carved for an op (readable), or else released (filled
    // with NaN and watched by AddressSanitizer).
    void watch_scratch(const void* p, size_t bytes, bool in_use);

    // ---- steps as graphs ----------------------------------------------------
    // Between begin_graph() and end_graph() the kernels and copies queued on the stream are
    // recorded, not queued. end_graph() launches the CUDA graph of an earlier step whose work
    // was the same (the same kernels, launch sizes and argument bytes, the same copies: a
    // step's key), or captures one from the recorded work and keeps it (the last kGraphs).
    // A replay is that work, bit for bit. What needs the recorded work to have been queued
    // (a wait for the device, a free, a copy the recorder does not see) calls eager() first:
    // the step's work so far is queued and the rest of the step is queued as it comes.
    // After kGraphs steps in a row that found no graph to replay, the next kEagerSteps steps
    // are queued as they come (a batch that changes every step would pay for a capture each).
    // Graphs are off with GLM5_CUDA_GRAPHS=0 or GLM5_CUDA_SYNC=1 in the environment.
    static constexpr size_t kGraphs = 8;
    static constexpr int kEagerSteps = 64;
    void begin_graph();
    // `complete`: the step ended normally (not by an exception): its work may become a graph.
    void end_graph(bool complete);
    void eager();
    void set_graphs(bool on);

    // ---- weights -----------------------------------------------------------
    // One copy of w's payload, in its format (each slice's rows packed, the slice
    // stride kept). Refuses a repacked view or a type without groups, naming `name`.
    Matrix upload_matrix(const Weight& w, const std::string& name);
    void free_matrix(Matrix& m);

    // ---- products ----------------------------------------------------------
    // y[t * y_stride + r] = W[slice] row r . x[t * x_stride ..] for r < rows, t < n_tok
    // (device memory). The vector form at every token count, so a row's result is the
    // same whatever shares its step (a decode row beside a prompt chunk too).
    void matmul(const Matrix& w, int64_t slice, const float* x, int64_t x_stride, int64_t n_tok,
                float* y, int64_t y_stride);

    // Several matrices against the same input, in one launch
    // per kMaxMulti of them: for every j, outs[j].y[t * y_stride + r] = outs[j].w row r .
    // x[t * x_stride ..], the bits of matmul.
    static constexpr int kMaxMulti = 8;
    struct MatmulTarget {
        const Matrix* w;
        float* y;
        int64_t y_stride;
    };
    void matmuls(std::span<const MatmulTarget> outs, const float* x, int64_t x_stride,
                 int64_t n_tok);

    // A SwiGLU FFN's hidden rows in one launch: out[p * gate.rows + r] = swiglu(gate row r .
    // x_p, up row r . x_p) (clamped as backend::swiglu), the bits of the two products and
    // the swiglu op. With ids (device memory), pair p < n reads slice ids[p] and x_p = x +
    // (p / x_every) * x_stride (a mixture's experts); without, slice 0 and x_p = x + p *
    // x_stride.
    void gate_up(const Matrix& gate, const Matrix& up, const int32_t* ids, int64_t n,
                 int64_t x_every, const float* x, int64_t x_stride, float clamp, float* out);

    // Per-slice products, slices s < w.slices: y[t * y_tok + s * y_slice + r] =
    // W[s] row r . x[t * x_tok + s * x_slice ..] (the vector form).
    void matmul_slices(const Matrix& w, const float* x, int64_t x_tok, int64_t x_slice,
                       int64_t n_tok, float* y, int64_t y_tok, int64_t y_slice);
    // Products whose slice each row names (a mixture's experts): for p < n,
    // y[p * y_stride + r] = W[ids[p]] row r . x[(p / x_every) * x_stride ..], ids in
    // device memory. The vector form's bits, one row at a time.
    void matmul_indexed(const Matrix& w, const int32_t* ids, int64_t n, int64_t x_every,
                        const float* x, int64_t x_stride, float* y, int64_t y_stride);

    // The stream the products and copies are queued on (a cudaStream_t), for the
    // backend's own kernels.
    void* stream() const;
    // The i-quant tables in device memory.
    const quant::groups::Tables& tables() const;

    // Bytes of weights the products have read since the last reset.
    uint64_t weight_bytes_read() const;
    // Kernels launched on this device's stream, host waits, copies each way since the reset.
    DeviceTraffic traffic() const;
    void reset_counters();

    struct Impl;

  private:
    // A copy kept in the step being recorded (kind: a cudaMemcpyKind).
    void record_copy(void* dst, const void* src, size_t bytes, int kind);
    std::unique_ptr<Impl> impl_;
};

}  // namespace glm5::backend::cuda

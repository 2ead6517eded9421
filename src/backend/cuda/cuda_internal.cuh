// What the device's .cu files share: the state behind Device and the checks.
#pragma once

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernel.cuh"
#include "core/error.h"
#include "quant/groups.h"

namespace glm5::backend::cuda {

// Throws glm5::Error naming `what` and the runtime's reason.
void check(cudaError_t e, const char* what);

// Pinned host memory that copies between the host and the device pass through, so that a
// copy is queued and the host goes on (from pageable memory a copy to the host waits for
// the device, and one to the device is staged by the driver first). Regions are handed out
// in turn around a ring; one is reused once the copy that read or wrote it has finished.
class StagingRing {
  public:
    StagingRing(cudaStream_t s, size_t bytes);
    ~StagingRing();
    // `bytes` of pinned memory for a copy about to be queued, or null when the request is
    // larger than half the ring (the caller copies from pageable memory instead), or when
    // it would have to wait for an earlier copy and `may_wait` is false (a step being
    // recorded: its copies are not queued yet).
    void* take(size_t bytes, bool may_wait = true);
    // The copy that uses the region take() just gave is queued: its region is free again
    // once the stream passes this point. A download names where its bytes go: they are
    // copied there once the copy has finished (at the latest by complete()). `marked`: an
    // event marks the point (a recorded copy has none: its region is free after complete()
    // or a wait for the whole stream).
    void queued(void* host_dst = nullptr, size_t bytes = 0, bool marked = true);
    // After the stream has been synchronised: every download delivered, every region free.
    void complete();

  private:
    struct Piece {
        size_t at, bytes;
        cudaEvent_t done;  // null: unmarked
        void* host;        // a download's destination
        size_t host_bytes;
    };
    void retire_oldest(bool stream_done);
    cudaStream_t stream_;
    uint8_t* base_ = nullptr;
    size_t bytes_ = 0, head_ = 0;
    std::vector<Piece> pieces_;  // oldest first
    std::vector<cudaEvent_t> spare_;
    Piece pending_{};
};

// The CPU's form (backend/cpu_kernels.h): x / (1 + exp(-x)); the sigmoid is core/hd.h's.
__device__ inline float silu_of(float x) {
    return x / (1.0f + expf(-x));
}

// One SwiGLU value as backend::swiglu computes it: clamped (limit > 1e-6: g to at most the
// limit, u to [-limit, limit]), then silu(g) * u.
__device__ inline float swiglu_value(float g, float u, float clamp) {
    if (clamp > 1e-6f) {
        g = fminf(g, clamp);
        u = fminf(fmaxf(u, -clamp), clamp);
    }
    return __fmul_rn(silu_of(g), u);
}

struct Device::Impl {
    DeviceInfo info;
    int ordinal = 0;
    cudaStream_t stream = nullptr;
    quant::groups::Tables tables;  // device pointers
    void* table_memory = nullptr;
    std::unique_ptr<StagingRing> staging;
    uint64_t weight_bytes = 0;
    DeviceTraffic traffic;  // since the last reset_counters
    // Steps as graphs: the step being recorded, and the graphs kept, least recently used first.
    bool graphs_on = true;
    bool recording = false;
    StepRecorder recorder;
    struct Kept {
        std::vector<unsigned char> key;
        cudaGraphExec_t exec;
    };
    std::vector<Kept> kept;
    size_t captures_in_a_row = 0;  // steps captured since a step last replayed a graph
    int eager_steps = 0;           // steps still to launch as they come
};

}  // namespace glm5::backend::cuda

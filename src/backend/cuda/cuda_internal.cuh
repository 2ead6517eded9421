// What the device's .cu files share: the state behind Device and the checks.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "core/error.h"
#include "quant/groups.h"

namespace glm5::backend::cuda {

// Throws glm5::Error naming `what` and the runtime's reason.
void check(cudaError_t e, const char* what);
void check_blas(cublasStatus_t s, const char* what);

struct Device::Impl {
    DeviceInfo info;
    int ordinal = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    quant::groups::Tables tables;  // device pointers
    void* table_memory = nullptr;
    // Scratch buffers the products reuse, one per slot, grown when too small.
    struct Scratch {
        void* p = nullptr;
        size_t cap = 0;
    };
    std::vector<Scratch> scratch;
    void* scratch_bytes(int slot, size_t bytes);
    uint64_t weight_bytes = 0;
};

}  // namespace glm5::backend::cuda

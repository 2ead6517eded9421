// What a command line asks of a GPU (--device cuda[:N], llama.cpp's -ngl), checked
// against this build and this machine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"

namespace glm5::app {

// The ordinal --device names: "cuda" is 0, "cuda:N" is N; nullopt for another device.
// Throws UsageError for a malformed ordinal.
std::optional<int> cuda_ordinal(const std::string& device);

// --device cuda[:N]: throws ResourceError (exit 2) naming why no GPU is usable (a
// build without the CUDA backend, no driver, no device, no such ordinal).
void require_gpu(int ordinal);

// -ngl / --n-gpu-layers as llama.cpp users type it, for a model of n_layer blocks:
// 0 runs on the CPU; -1, "all" or n_layer and more ask for the whole model on the GPU;
// a count in between is refused (UsageError) naming --n-cpu-moe, the partial offload
// this engine has. A whole-model request without a usable GPU warns and runs on the
// CPU, as llama.cpp does. Returns whether the model goes to GPU 0.
bool apply_gpu_layers(const std::string& value, int64_t n_layer);

// The free memory of GPU `ordinal` now (require_gpu first).
uint64_t gpu_free_bytes(int ordinal);

// Whether GLM5_CUDA_FORWARD=1 lets the model run on a GPU: the CUDA forward has not yet
// been checked on one, so it runs only when asked for by name.
bool gpu_forward_enabled();

// The CUDA backend on GPU `ordinal` (require_gpu first); refused without
// GLM5_CUDA_FORWARD=1.
std::unique_ptr<backend::Backend> open_gpu(int ordinal);

// What runs on a GPU in this build (glm-dsa, GLM-5.3-Flash's text tower): refuses
// (Error) another architecture.
void check_gpu_architecture(const std::string& arch);

}  // namespace glm5::app

// What a command line asks of a GPU (--device cuda[:N], llama.cpp's -ngl), checked
// against this build and this machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace glm5::app {

// The ordinal --device names: "cuda" is 0, "cuda:N" is N; nullopt for another device.
// Throws UsageError for a malformed ordinal.
std::optional<int> cuda_ordinal(const std::string& device);

// --device cuda[:N]: throws ResourceError (exit 2) naming why no GPU is usable (a
// build without the CUDA backend, no driver, no device, no such ordinal); with the
// GPU found, an Error saying what of the model runs on it in this build.
[[noreturn]] void refuse_cuda_device(int ordinal);

// -ngl / --n-gpu-layers as llama.cpp users type it, for a model of n_layer blocks:
// 0 runs on the CPU; -1, "all" or n_layer and more ask for the whole model on the GPU;
// a count in between is refused (UsageError) naming --n-cpu-moe, the partial offload
// this engine has. A whole-model request without a GPU that runs the forward warns and
// runs on the CPU, as llama.cpp does. Returns whether the request was for the GPU.
bool apply_gpu_layers(const std::string& value, int64_t n_layer);

}  // namespace glm5::app

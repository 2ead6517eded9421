// The CUDA backend: the core contract and the MoE, attention, linear-attention and
// vision families on an NVIDIA GPU (plain C++ here; the kernels live in the .cu files
// beside it): glm-dsa's and GLM-5.3-Flash's forwards and the vision tower run on the device.
//
// Memory is the device's: activations and selections in a scratch arena, caches in
// allocations of their own, weight matrices uploaded once when the loader registers
// them, and the `const float*` weight vectors of the ops (norm weights, the router's
// bias) copied on their first use and kept, keyed by their host address (they are views
// of the model file, which never changes). Every op keeps a fixed order of reduction
// per output, so a row's result does not depend on the other rows of its step.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace glm5::backend::cuda {

// Opens GPU `ordinal` (cuda:N); throws glm5::Error with the reason when it cannot.
std::unique_ptr<Backend> make_cuda_backend(int ordinal);

}  // namespace glm5::backend::cuda

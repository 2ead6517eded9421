// Synthetic glm5next mmproj files (docs/glm5next-format.md 12.1): random
// weights in the real key and tensor layout, for benchmarks and tests of the
// vision tower at shapes the fixtures do not have.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace glm5::synth {

struct MmprojHParams {
    int64_t width = 32;  // Dv
    int64_t n_ff = 64;   // Fv
    int64_t n_block = 2;
    int64_t n_head = 2;
    int64_t out = 64;                     // projection_dim: the text model's width
    int64_t proj_ff = 96;                 // Fp
    float limit = 1.25f;                  // swiglu_limit
    quant::Type type = quant::Type::F32;  // of the matrices (F32, F16 or BF16)

    // "tiny": the fixture's shape (for tiny.gguf); "flash": GLM-5.3-Flash's
    // (Dv 1024, 24 blocks, 16 heads, Fv 4096, projector 4096 with 10240 inside,
    // limit 10), BF16. Throws glm5::Error for another name.
    static MmprojHParams preset(std::string_view name);
    static std::vector<std::string> preset_names();
};

// Writes the file (weights ~ N(0, 1/fan_in), norm weights ~ 1 + 0.05 N(0, 1),
// biases ~ 0.02 N(0, 1); the same seed gives the same bytes). Returns the bytes written.
uint64_t write_mmproj(const MmprojHParams& hp, uint64_t seed, const std::string& path,
                      int n_threads, const std::function<void(uint64_t, uint64_t)>& progress);

}  // namespace glm5::synth

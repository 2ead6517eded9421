// How an architecture describes itself to the generator core: its metadata
// (in file order) and one TensorSpec per tensor. The core does the rest.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "model/gen_quant_mix.h"
#include "model/generator.h"

namespace glm5::model::gen {

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;  // ggml order
    // Samples are mean + stddev * z, z ~ Irwin–Hall(12) (see gen_random.h).
    double mean = 0;
    double stddev = 0;
    // The input of this matrix in the forward pass is an RMS-normed vector
    // times these norm weights (concatenated, in order, ne0 values in all):
    // its importance is E[x_j^2] ∝ w_j^2. Empty: an input with no per-channel
    // scale (importance 1 everywhere).
    std::vector<std::string> input_norms;
    bool is_lookup = false;  // an embedding table: no matmul input, no importance data
    bool f32_in_float_files = false;
    bool nextn = false;  // belongs to a NextN/MTP block
};

struct Layout {
    std::string arch;
    // Keys after general.architecture/name/type/file_type/quantization_version.
    std::vector<std::pair<std::string, gguf::Value>> metadata;
    std::vector<TensorSpec> tensors;
    MixModel mix;
};

// glm-dsa: metadata keys and tensors exactly as the fixtures carry them.
Layout build_glm_dsa_layout(const GlmDsaHParams& hp);

// tokenizer.* keys for the GLM vocabulary padded to n_vocab, in the fixtures' order.
void append_glm_tokenizer(std::vector<std::pair<std::string, gguf::Value>>& md, int64_t n_vocab);

}  // namespace glm5::model::gen

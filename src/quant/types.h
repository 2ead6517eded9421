// Tensor storage formats, numbered as in GGUF files (ggml's type ids).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace glm5::quant {

enum class Type : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
};

struct TypeTraits {
    const char* name;    // "Q4_K"
    int64_t block_size;  // values per block (1 for plain floats/ints)
    size_t type_size;    // bytes per block
    bool quantized;      // a block format
    bool weight_format;  // the engine computes with it as a weight (dequantize + dot)
    Type vec_dot_type;   // activation format its dot product takes
    bool needs_imatrix;  // quantizing it without importance data gives poor results
};

// Traits of a type the engine knows; nullptr for an id it does not know (the
// GGUF reader refuses such files).
const TypeTraits* find_traits(uint32_t raw_type);
const TypeTraits& traits(Type t);
inline const char* name(Type t) {
    return traits(t).name;
}

// Case-insensitive lookup by name ("q4_k", "IQ2_XXS", "f16").
std::optional<Type> type_from_name(std::string_view name);

// Bytes of n values stored as t; n must be a multiple of the block size.
inline size_t row_size(Type t, int64_t n) {
    const TypeTraits& tt = traits(t);
    return size_t(n / tt.block_size) * tt.type_size;
}

}  // namespace glm5::quant

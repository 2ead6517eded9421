#include "quant/types.h"

#include <array>
#include <cctype>
#include <string>

#include "core/error.h"

namespace glm5::quant {

namespace {

// Block layouts follow the GGUF/ggml definitions of each format.
struct Entry {
    uint32_t id;
    TypeTraits t;
};

constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, false, true, Type::F32, false}},
    {1, {"F16", 1, 2, false, true, Type::F16, false}},
    {2, {"Q4_0", 32, 18, true, true, Type::Q8_0, false}},
    {3, {"Q4_1", 32, 20, true, true, Type::Q8_1, false}},
    {6, {"Q5_0", 32, 22, true, true, Type::Q8_0, false}},
    {7, {"Q5_1", 32, 24, true, true, Type::Q8_1, false}},
    {8, {"Q8_0", 32, 34, true, true, Type::Q8_0, false}},
    {9, {"Q8_1", 32, 36, true, false, Type::Q8_1, false}},
    {10, {"Q2_K", 256, 84, true, true, Type::Q8_K, false}},
    {11, {"Q3_K", 256, 110, true, true, Type::Q8_K, false}},
    {12, {"Q4_K", 256, 144, true, true, Type::Q8_K, false}},
    {13, {"Q5_K", 256, 176, true, true, Type::Q8_K, false}},
    {14, {"Q6_K", 256, 210, true, true, Type::Q8_K, false}},
    {15, {"Q8_K", 256, 292, true, false, Type::Q8_K, false}},
    {16, {"IQ2_XXS", 256, 66, true, true, Type::Q8_K, true}},
    {17, {"IQ2_XS", 256, 74, true, true, Type::Q8_K, true}},
    {18, {"IQ3_XXS", 256, 98, true, true, Type::Q8_K, false}},
    {19, {"IQ1_S", 256, 50, true, true, Type::Q8_K, true}},
    {20, {"IQ4_NL", 32, 18, true, true, Type::Q8_0, false}},
    {21, {"IQ3_S", 256, 110, true, true, Type::Q8_K, false}},
    {22, {"IQ2_S", 256, 82, true, true, Type::Q8_K, true}},
    {23, {"IQ4_XS", 256, 136, true, true, Type::Q8_K, false}},
    {24, {"I8", 1, 1, false, false, Type::I8, false}},
    {25, {"I16", 1, 2, false, false, Type::I16, false}},
    {26, {"I32", 1, 4, false, false, Type::I32, false}},
    {27, {"I64", 1, 8, false, false, Type::I64, false}},
    {28, {"F64", 1, 8, false, false, Type::F64, false}},
    {29, {"IQ1_M", 256, 56, true, true, Type::Q8_K, true}},
    {30, {"BF16", 1, 2, false, true, Type::BF16, false}},
};

}  // namespace

const TypeTraits* find_traits(uint32_t raw_type) {
    for (const auto& e : kTypes)
        if (e.id == raw_type) return &e.t;
    return nullptr;
}

const TypeTraits& traits(Type t) {
    const TypeTraits* tt = find_traits(uint32_t(t));
    if (!tt) throw Error("unknown tensor type id " + std::to_string(uint32_t(t)));
    return *tt;
}

std::optional<Type> type_from_name(std::string_view name) {
    std::string up;
    for (char c : name) up += char(std::toupper((unsigned char)c));
    for (const auto& e : kTypes)
        if (up == e.t.name) return Type(e.id);
    return std::nullopt;
}

}  // namespace glm5::quant

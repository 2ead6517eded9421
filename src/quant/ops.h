// Internal: how each format family plugs its row functions into the dispatch
// in quant.cpp. One family per file (float.cpp, legacy.cpp, kquants.cpp,
// iquants.cpp); SIMD variants live in *_avx2.cpp / *_avx512.cpp files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace glm5::quant {

struct FormatOps {
    void (*dequantize)(const void* src, float* dst, int64_t n) = nullptr;
    // Quantize n_rows rows; returns bytes written.
    size_t (*quantize)(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                       const float* imatrix) = nullptr;
    // For activation formats (Q8_0, Q8_1, Q8_K, F16, BF16, F32): one row.
    void (*quantize_activation)(const float* x, void* dst, int64_t n) = nullptr;
    VecDotFn vec_dot_ref = nullptr;
    VecDotFn vec_dot_avx2 = nullptr;    // null when the family has none
    VecDotFn vec_dot_avx512 = nullptr;  // null when the family has none
    // Multi-activation kernels (see quant.h), bit-identical to the vec_dot of
    // the same ISA.
    VecDotMultiFn vec_dot_multi_avx2 = nullptr;
    VecDotMultiFn vec_dot_multi_avx512 = nullptr;
};

// Each returns nullptr for a type it does not handle.
const FormatOps* float_ops(Type t);
const FormatOps* legacy_ops(Type t);
const FormatOps* kquant_ops(Type t);
const FormatOps* iquant_ops(Type t);

// Runtime CPU features (checked once), at the level cpu_level() allows.
bool cpu_has_avx2();      // AVX2 + FMA + F16C
bool cpu_has_avx512();    // AVX-512 F/BW/VL/DQ/VNNI
bool cpu_has_amx();       // and AMX-TILE/INT8, AVX-512 VBMI, the tile state granted by the OS
bool cpu_has_amx_bf16();  // and AMX-BF16, AVX-512 BF16 (the --attn-bf16 attention)
// AVX-512 BF16 dot products and VBMI at the VNNI level, on a CPU without
// AMX-BF16 (where it has the tiles, the --attn-bf16 attention runs on them only)
bool cpu_has_bf16_vectors();

// Kernel levels, each including the ones below. Every AVX-512 kernel here also
// uses VNNI, so the Avx512 level (F/BW/VL/DQ without VNNI) runs the AVX2 ones.
// Amx adds the tile GEMM of the repacked K-quants (many tokens).
enum class CpuLevel { Scalar, Avx2, Avx512, Vnni, Amx };
const char* cpu_level_name(CpuLevel l);  // "scalar", "avx2", "avx512", "vnni", "amx"
CpuLevel cpu_detected_level();           // what this CPU has
// The level kernels are picked at: the CPU's, or the one GLM5_CPU names
// (scalar | avx2 | avx512 | vnni | amx), which dispatches nothing above it.
// Throws glm5::Error when GLM5_CPU names an unknown level or one this CPU
// lacks.
CpuLevel cpu_level();
// cpu_level()'s rule for a GLM5_CPU value (null or empty: not set).
CpuLevel cpu_level_for(const char* requested, CpuLevel detected);

}  // namespace glm5::quant

#include "quant/quant.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/kernels.h"
#include "quant/ops.h"

namespace glm5::quant {

namespace {

const FormatOps& ops_for(Type t) {
    const FormatOps* o = float_ops(t);
    if (!o) o = legacy_ops(t);
    if (!o) o = kquant_ops(t);
    if (!o) o = iquant_ops(t);
    if (!o) throw Error(std::string("tensor type ") + name(t) + " is not supported");
    return *o;
}

void check_blocks(Type t, int64_t n) {
    const int64_t bs = traits(t).block_size;
    if (n % bs != 0)
        throw Error(std::string(name(t)) + ": row of " + std::to_string(n) +
                    " values is not a multiple of the block size " + std::to_string(bs));
}

}  // namespace

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c").
static bool cpu_has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25) and AVX-512 VBMI
// (ECX bit 1), which the AMX kernels also use.
static bool cpu_has_amx_int8() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 25)) &&
           (c & (1u << 1));
}

// Linux hands out the tile registers' state only on request
// (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the first tile
// instruction kills the process.
static bool amx_granted() {
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}

CpuLevel cpu_detected_level() {
    static const CpuLevel v = [] {
        if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()))
            return CpuLevel::Scalar;
        if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
            return CpuLevel::Avx2;
        if (!__builtin_cpu_supports("avx512vnni")) return CpuLevel::Avx512;
        return cpu_has_amx_int8() && amx_granted() ? CpuLevel::Amx : CpuLevel::Vnni;
    }();
    return v;
}

const char* cpu_level_name(CpuLevel l) {
    switch (l) {
        case CpuLevel::Scalar:
            return "scalar";
        case CpuLevel::Avx2:
            return "avx2";
        case CpuLevel::Avx512:
            return "avx512";
        case CpuLevel::Vnni:
            return "vnni";
        case CpuLevel::Amx:
            return "amx";
    }
    return "?";
}

CpuLevel cpu_level_for(const char* requested, CpuLevel detected) {
    if (!requested || !*requested) return detected;
    const std::string r = requested;
    for (CpuLevel l :
         {CpuLevel::Scalar, CpuLevel::Avx2, CpuLevel::Avx512, CpuLevel::Vnni, CpuLevel::Amx}) {
        if (r != cpu_level_name(l)) continue;
        if (l > detected)
            throw Error("GLM5_CPU=" + r + ": this CPU does not have it (it has " +
                        cpu_level_name(detected) + ")");
        return l;
    }
    throw Error("GLM5_CPU=" + r + ": unknown kernel level (scalar, avx2, avx512, vnni, amx)");
}

CpuLevel cpu_level() {
    static const CpuLevel v = cpu_level_for(std::getenv("GLM5_CPU"), cpu_detected_level());
    return v;
}

bool cpu_has_avx2() {
    return cpu_level() >= CpuLevel::Avx2;
}

bool cpu_has_avx512() {
    return cpu_level() >= CpuLevel::Vnni;
}

bool cpu_has_amx() {
    return cpu_level() >= CpuLevel::Amx;
}

// AMX-BF16 (CPUID leaf 7: EDX bit 22) and AVX-512 BF16 (leaf 7 subleaf 1:
// EAX bit 5) on top of the AMX level.
bool cpu_has_amx_bf16() {
    unsigned a = 0, b = 0, c = 0, d = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    return cpu_has_amx() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) &&
           __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
}

// AVX-512 BF16 and VBMI at the VNNI level, on a CPU without AMX-BF16 tiles.
// Where the tiles exist the BF16 attention runs on them alone, whatever
// GLM5_CPU says, so that its results are one machine's, not one level's.
bool cpu_has_bf16_vectors() {
    unsigned a = 0, b = 0, c = 0, d = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (!(cpu_has_avx512() && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
          __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)))
        return false;
    const bool tiles = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
    return !tiles && (c & (1u << 1)) && (a1 & (1u << 5));
}

void dequantize_row(Type t, const void* src, float* dst, int64_t n) {
    check_blocks(t, n);
    const FormatOps& o = ops_for(t);
    if (!o.dequantize) throw Error(std::string(name(t)) + ": no dequantization");
    o.dequantize(src, dst, n);
}

size_t quantize_rows(Type t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                     const float* imatrix) {
    check_blocks(t, n_per_row);
    const FormatOps& o = ops_for(t);
    if (!o.quantize) throw Error(std::string(name(t)) + ": quantization is not supported");
    return o.quantize(src, dst, n_rows, n_per_row, imatrix);
}

void quantize_activation_row(Type act_type, const float* x, void* dst, int64_t n) {
    check_blocks(act_type, n);
    const FormatOps& o = ops_for(act_type);
    if (!o.quantize_activation)
        throw Error(std::string(name(act_type)) + " is not an activation format");
    o.quantize_activation(x, dst, n);
}

float vec_dot_ref(Type t, int64_t n, const void* w, const void* act) {
    return ops_for(t).vec_dot_ref(n, w, act);
}

VecDotMultiFn vec_dot_multi_fn(Type t) {
    const FormatOps& o = ops_for(t);
    // Only paired with the single-row kernel it must match bit for bit.
    if (o.vec_dot_avx512 && cpu_has_avx512()) return o.vec_dot_multi_avx512;
    if (o.vec_dot_avx2 && cpu_has_avx2()) return o.vec_dot_multi_avx2;
    return nullptr;
}

VecDotMultiFn bf16_dot_multi_f32act_fn() {
    return cpu_has_avx512() ? kernels::dot_bf16_f32act_multi_avx512 : nullptr;
}

void expand_bf16_activation(const float* x, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

VecDotFn vec_dot_fn(Type t) {
    const FormatOps& o = ops_for(t);
    if (o.vec_dot_avx512 && cpu_has_avx512()) return o.vec_dot_avx512;
    if (o.vec_dot_avx2 && cpu_has_avx2()) return o.vec_dot_avx2;
    return o.vec_dot_ref;
}

}  // namespace glm5::quant

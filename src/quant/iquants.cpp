// The i-quant family's entries in the format dispatch table.
#include "quant/blocks.h"
#include "quant/iq_impl.h"
#include "quant/iq_kernels.h"
#include "quant/ops.h"
#include "quant/quantize_fast.h"

namespace glm5::quant {

namespace {

using namespace iq;

// multi512: the multi-token kernel where the format has one (IQ2_XXS: the
// MoE's experts in batched decode and prefill decode each row once for all
// their tokens).
#define GLM5_IQ_OPS(fmt, avx512, multi512)                                                       \
    FormatOps {                                                                                  \
        dequant_##fmt, quant_##fmt, nullptr, dot_##fmt##_ref, dot_##fmt##_avx2, avx512, nullptr, \
            multi512                                                                             \
    }

const FormatOps kIq2Xxs = GLM5_IQ_OPS(iq2_xxs, dot_iq2_xxs_avx512, dot_iq2_xxs_multi_avx512);
const FormatOps kIq2Xs = GLM5_IQ_OPS(iq2_xs, nullptr, nullptr);
const FormatOps kIq2S = GLM5_IQ_OPS(iq2_s, nullptr, nullptr);
const FormatOps kIq3Xxs = GLM5_IQ_OPS(iq3_xxs, nullptr, nullptr);
const FormatOps kIq3S = GLM5_IQ_OPS(iq3_s, nullptr, nullptr);
const FormatOps kIq1S = GLM5_IQ_OPS(iq1_s, nullptr, nullptr);
const FormatOps kIq1M = GLM5_IQ_OPS(iq1_m, nullptr, nullptr);
const FormatOps kIq4Nl = GLM5_IQ_OPS(iq4_nl, dot_iq4_nl_avx512, nullptr);
const FormatOps kIq4Xs = GLM5_IQ_OPS(iq4_xs, dot_iq4_xs_avx512, nullptr);

#undef GLM5_IQ_OPS

}  // namespace

const FormatOps* iquant_ops(Type t) {
    switch (t) {
        case Type::IQ2_XXS:
            return &kIq2Xxs;
        case Type::IQ2_XS:
            return &kIq2Xs;
        case Type::IQ2_S:
            return &kIq2S;
        case Type::IQ3_XXS:
            return &kIq3Xxs;
        case Type::IQ3_S:
            return &kIq3S;
        case Type::IQ1_S:
            return &kIq1S;
        case Type::IQ1_M:
            return &kIq1M;
        case Type::IQ4_NL:
            return &kIq4Nl;
        case Type::IQ4_XS:
            return &kIq4Xs;
        default:
            return nullptr;
    }
}

bool has_fast_quantize(Type t) {
    return t == Type::IQ2_XXS;
}

size_t quantize_rows_fast(Type t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* imatrix) {
    if (t != Type::IQ2_XXS) return quantize_rows(t, src, dst, n_rows, n_per_row, imatrix);
    // Same argument checks as quantize_rows.
    if (n_per_row % QK_K != 0) return quantize_rows(t, src, dst, n_rows, n_per_row, imatrix);
    return iq::quant_iq2_xxs_fast(src, dst, n_rows, n_per_row, imatrix);
}

}  // namespace glm5::quant

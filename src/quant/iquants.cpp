// The i-quant family's entries in the format dispatch table.
#include "quant/iq_impl.h"
#include "quant/iq_kernels.h"
#include "quant/ops.h"

namespace glm5::quant {

namespace {

using namespace iq;

#define GLM5_IQ_OPS(fmt, avx512)                                                       \
    FormatOps {                                                                        \
        dequant_##fmt, quant_##fmt, nullptr, dot_##fmt##_ref, dot_##fmt##_avx2, avx512 \
    }

const FormatOps kIq2Xxs = GLM5_IQ_OPS(iq2_xxs, dot_iq2_xxs_avx512);
const FormatOps kIq2Xs = GLM5_IQ_OPS(iq2_xs, nullptr);
const FormatOps kIq2S = GLM5_IQ_OPS(iq2_s, nullptr);
const FormatOps kIq3Xxs = GLM5_IQ_OPS(iq3_xxs, nullptr);
const FormatOps kIq3S = GLM5_IQ_OPS(iq3_s, nullptr);
const FormatOps kIq1S = GLM5_IQ_OPS(iq1_s, nullptr);
const FormatOps kIq1M = GLM5_IQ_OPS(iq1_m, nullptr);
const FormatOps kIq4Nl = GLM5_IQ_OPS(iq4_nl, dot_iq4_nl_avx512);
const FormatOps kIq4Xs = GLM5_IQ_OPS(iq4_xs, dot_iq4_xs_avx512);

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

}  // namespace glm5::quant

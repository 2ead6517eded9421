// AVX-512 dot products of the k-quants against Q8_K, bit-identical to the
// scalar references (see kq_avx512.h).
// GCC 12 warns about the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics headers (GCC bug 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "quant/kernels.h"
#include "quant/kq_avx512.h"

namespace glm5::quant::kernels {

using avx2::fp16_scalar;
using avx2::kq_finish;
using avx2::KSums;

namespace {

template <typename Block, KSums (*Kernel)(const Block&, const BlockQ8_K&)>
float dot_with_mins(int64_t n, const void* w, const void* a) {
    const Block* x = static_cast<const Block*>(w);
    const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const KSums s = Kernel(x[i], y[i]);
        sum = kq_finish(sum, fp16_scalar(x[i].d) * y[i].d, s.isum, fp16_scalar(x[i].dmin) * y[i].d,
                        s.summs);
    }
    return sum;
}

template <typename Block, KSums (*Kernel)(const Block&, const BlockQ8_K&)>
float dot_no_mins(int64_t n, const void* w, const void* a) {
    const Block* x = static_cast<const Block*>(w);
    const BlockQ8_K* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; ++i)
        sum = kq_finish(sum, fp16_scalar(x[i].d) * y[i].d, Kernel(x[i], y[i]).isum);
    return sum;
}

}  // namespace

float dot_q2_K_avx512(int64_t n, const void* w, const void* a) {
    return dot_with_mins<BlockQ2_K, avx512::q2_K_block>(n, w, a);
}
float dot_q3_K_avx512(int64_t n, const void* w, const void* a) {
    return dot_no_mins<BlockQ3_K, avx512::q3_K_block>(n, w, a);
}
float dot_q4_K_avx512(int64_t n, const void* w, const void* a) {
    return dot_with_mins<BlockQ4_K, avx512::q4_K_block>(n, w, a);
}
float dot_q5_K_avx512(int64_t n, const void* w, const void* a) {
    return dot_with_mins<BlockQ5_K, avx512::q5_K_block>(n, w, a);
}
float dot_q6_K_avx512(int64_t n, const void* w, const void* a) {
    return dot_no_mins<BlockQ6_K, avx512::q6_K_block>(n, w, a);
}

}  // namespace glm5::quant::kernels

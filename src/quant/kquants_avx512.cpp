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

float dot_q2_K_avx512(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ2_K, avx512::q2_K_block, true>(
        n, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
}
float dot_q3_K_avx512(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ3_K, avx512::q3_K_block, false>(
        n, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
}
float dot_q4_K_avx512(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ4_K, avx512::q4_K_block, true>(
        n, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
}
float dot_q5_K_avx512(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ5_K, avx512::q5_K_block, true>(
        n, static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a));
}
float dot_q6_K_avx512(int64_t n, const void* w, const void* a) {
    return avx2::kq_dot_row<BlockQ6_K, avx512::q6_K_block, false>(
        n, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
}

}  // namespace glm5::quant::kernels

// AVX-512 dot products of the k-quants against Q8_K, bit-identical to the
// scalar references (see kq_avx512.h).
// GCC 12 warns about the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics headers (GCC bug 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <algorithm>

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

// ---- one weight row against several activation rows ---------------------
// A row's super-block is decoded once (levels and scale vectors kept in
// registers), then multiplied with up to kTile activation blocks. Every pair
// gets the exact integer sums of the single-row kernel and the same float
// finish per block, so results are bit-identical to dot_*_avx512.
namespace glm5::quant::kernels {

namespace {

constexpr int64_t kTile = 4;

template <bool kFive, typename Block>
void q45_K_multi(int64_t n, const Block* x, const uint8_t* act, size_t stride, int64_t n_act,
                 float* out) {
    const int64_t nb = n / QK_K;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t t0 = 0; t0 < n_act; t0 += kTile) {
        const int64_t nt = std::min(kTile, n_act - t0);
        const BlockQ8_K* ys[kTile];
        float sum[kTile] = {0, 0, 0, 0};
        for (int64_t t = 0; t < nt; ++t)
            ys[t] = reinterpret_cast<const BlockQ8_K*>(act + size_t(t0 + t) * stride);
        for (int64_t b = 0; b < nb; ++b) {
            const Block& xb = x[b];
            uint32_t sc[2], mn[2];
            avx2::k4_scales_mins(xb.scales, sc, mn);
            const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(sc[1]), int(sc[0])));
            const __m256i scales = _mm256_broadcastsi128_si256(sc16);
            __m256i lv[8], sv[8];
            __m256i qh = _mm256_setzero_si256();
            if constexpr (kFive) qh = avx512::load256(xb.qh);
            auto decode = [&]<int k>() {
                const __m256i q = avx512::load256(xb.qs + 32 * k);
                __m256i lo = _mm256_and_si256(q, low4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if constexpr (kFive) {
                    lo = _mm256_or_si256(lo, avx2::move_bit<2 * k, 4>(qh));
                    hi = _mm256_or_si256(hi, avx2::move_bit<2 * k + 1, 4>(qh));
                }
                lv[2 * k] = lo;
                lv[2 * k + 1] = hi;
                sv[2 * k] = _mm256_shuffle_epi8(scales, avx2::scale_one_mask(2 * k));
                sv[2 * k + 1] = _mm256_shuffle_epi8(scales, avx2::scale_one_mask(2 * k + 1));
            };
            decode.template operator()<0>();
            decode.template operator()<1>();
            decode.template operator()<2>();
            decode.template operator()<3>();
            const float dx = avx2::fp16_scalar(xb.d), mx = avx2::fp16_scalar(xb.dmin);
            for (int64_t t = 0; t < nt; ++t) {
                const BlockQ8_K& y = ys[t][b];
                __m256i acc = _mm256_setzero_si256();
                for (int j = 0; j < 8; ++j)
                    acc = _mm256_dpwssd_epi32(
                        acc, _mm256_maddubs_epi16(lv[j], avx512::load256(y.qs + 32 * j)), sv[j]);
                const avx2::KSums s = avx2::hsum_pair(acc, avx2::mins_times_bsums(mn, y.bsums));
                sum[t] = avx2::kq_finish(sum[t], dx * y.d, s.isum, mx * y.d, s.summs);
            }
        }
        for (int64_t t = 0; t < nt; ++t) out[t0 + t] = sum[t];
    }
}

}  // namespace

void dot_q4_K_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                           float* out) {
    q45_K_multi<false>(n, static_cast<const BlockQ4_K*>(w), static_cast<const uint8_t*>(a), stride,
                       n_act, out);
}
void dot_q5_K_multi_avx512(int64_t n, const void* w, const void* a, size_t stride, int64_t n_act,
                           float* out) {
    q45_K_multi<true>(n, static_cast<const BlockQ5_K*>(w), static_cast<const uint8_t*>(a), stride,
                      n_act, out);
}

}  // namespace glm5::quant::kernels

// AVX-512 VNNI GEMM over the repacked 16-row groups (repack.h,
// repack_kernels.h): weights of the 16 rows in the 16 int32 lanes, one
// token's 4 activation bytes broadcast to all lanes, vpdpbusd accumulates.
// A group's super-block is decoded once per tile of up to 16 tokens.
//
// Exactness: per (row, token, super-block) the kernels form the same integers
// as the single-row kernels (isum = sum_j scale_j * dot_j, and summs for the
// mins), exact in int32; the float finish is the reference's
//   d = fp16(x.d) * y.d;  sum = sum + (d * isum - (fp16(x.dmin) * y.d) * summs)
// per block in order, each product rounded on its own (the products pass an
// optimisation barrier so the compiler cannot contract them into FMAs).
//
// GCC 12 warns about the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics headers (GCC bug 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "quant/repack_kernels.h"

namespace glm5::quant::repacked {

namespace {

constexpr int kTile = 16;  // tokens per decoded group block

inline __m512 unfused(__m512 v) {
    asm("" : "+v"(v));
    return v;
}

inline __m512i load(const void* p) {
    return _mm512_loadu_si512(p);
}

// 4 activation bytes in every lane (vpdpbusd's embedded broadcast).
inline __m512i bcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// sum = sum + (dx*dy * isum - mx*dy * summs) in 16 lanes, as the reference.
inline __m512 finish(__m512 sum, __m512 dx, __m512 mx, float dy, __m512i isum, __m512i summs) {
    const __m512 d = _mm512_set1_ps(dy);
    const __m512 p1 = unfused(_mm512_mul_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(isum)));
    const __m512 p2 = unfused(_mm512_mul_ps(_mm512_mul_ps(mx, d), _mm512_cvtepi32_ps(summs)));
    return _mm512_add_ps(sum, _mm512_sub_ps(p1, p2));
}

inline __m512 finish(__m512 sum, __m512 dx, float dy, __m512i isum) {
    const __m512 p =
        unfused(_mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(isum)));
    return _mm512_add_ps(sum, p);
}

// ---------------------------------------------------------------- activations
// A tile of up to kTile tokens is copied once per call into one buffer per
// super-block, so the kernels address every token's bytes from one base
// pointer with constant offsets (16 token pointers would not fit the general
// registers) and the per-token extras are computed once for all groups.
struct ActBlock {
    int8_t qs[kTile][QK_K];
    float d[kTile];
    // Q4_K: the int16 pairs (B[2i], B[2i+1]) of the 32-value sums
    // B[j] = bsums[2j] + bsums[2j+1], against which the mins (m[2i], m[2i+1])
    // of each row go through one vpdpwssd per pair.
    int32_t pairs[kTile][4];
    int16_t bsums[kTile][QK_K / 16];  // Q6_K
};

void load_tile(const BlockQ8_K* const* acts, int64_t nt, int64_t nb, ActBlock* out) {
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t t = 0; t < nt; ++t) {
            const BlockQ8_K& y = acts[t][b];
            ActBlock& a = out[b];
            std::memcpy(a.qs[t], y.qs, QK_K);
            a.d[t] = y.d;
            std::memcpy(a.bsums[t], y.bsums, sizeof y.bsums);
            const __m256i v =
                _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)),
                                  _mm256_set1_epi16(1));
            const __m256i p = _mm256_packs_epi32(v, v);  // |B| <= 32 * 127: no saturation
            _mm_storeu_si128(reinterpret_cast<__m128i*>(a.pairs[t]),
                             _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
        }
}

// Float sums of a tile, kept in memory: the integer sums need the registers.
struct alignas(64) TileSums {
    float v[kTile][kRows];
};

// ---------------------------------------------------------------- Q4_K
// Sub-block j of all tokens: w holds its 32 levels of the 16 rows (8 x 4).
template <int T>
inline void q4k_sub_block(const __m512i* w, __m512i sc, const int8_t* q, __m512i* isum) {
    const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
        const int8_t* qt = q + t * QK_K;
        __m512i s0 = _mm512_dpbusd_epi32(zero, w[0], bcast4(qt));
        __m512i s1 = _mm512_dpbusd_epi32(zero, w[1], bcast4(qt + 4));
        s0 = _mm512_dpbusd_epi32(s0, w[2], bcast4(qt + 8));
        s1 = _mm512_dpbusd_epi32(s1, w[3], bcast4(qt + 12));
        s0 = _mm512_dpbusd_epi32(s0, w[4], bcast4(qt + 16));
        s1 = _mm512_dpbusd_epi32(s1, w[5], bcast4(qt + 20));
        s0 = _mm512_dpbusd_epi32(s0, w[6], bcast4(qt + 24));
        s1 = _mm512_dpbusd_epi32(s1, w[7], bcast4(qt + 28));
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
    }
}

template <int T>
void q4k_tile(int64_t nb, const Q4KGroupBlock* gb, const ActBlock* ab, float* const* out,
              int64_t off) {
    TileSums acc;
    for (int t = 0; t < T; ++t) _mm512_store_ps(acc.v[t], _mm512_setzero_ps());
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const Q4KGroupBlock& g = gb[b];
        const ActBlock& a = ab[b];
        __m512i isum[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int k = 0; k < 4; ++k) {
            __m512i w[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) w[c] = _mm512_and_si512(load(g.qs[k][c]), low4);
            q4k_sub_block<T>(w,
                             _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(g.scales[2 * k]))),
                             a.qs[0] + 64 * k, isum);
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c)
                w[c] = _mm512_and_si512(_mm512_srli_epi16(load(g.qs[k][c]), 4), low4);
            q4k_sub_block<T>(w,
                             _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(g.scales[2 * k + 1]))),
                             a.qs[0] + 64 * k + 32, isum);
        }
        __m512i mp[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
            mp[i] = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.mins[i])));
        const __m512 dx =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.d)));
        const __m512 mx =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.dmin)));
        const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            __m512i sm = _mm512_dpwssd_epi32(zero, mp[0], _mm512_set1_epi32(a.pairs[t][0]));
            sm = _mm512_dpwssd_epi32(sm, mp[1], _mm512_set1_epi32(a.pairs[t][1]));
            sm = _mm512_dpwssd_epi32(sm, mp[2], _mm512_set1_epi32(a.pairs[t][2]));
            sm = _mm512_dpwssd_epi32(sm, mp[3], _mm512_set1_epi32(a.pairs[t][3]));
            _mm512_store_ps(acc.v[t],
                            finish(_mm512_load_ps(acc.v[t]), dx, mx, a.d[t], isum[t], sm));
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out[t] + off, _mm512_load_ps(acc.v[t]));
}

// ---------------------------------------------------------------- Q6_K
// u6 = low nibble | top bits << 4; q = u6 - 32, so per sub-block
// sum(q * y) = sum(u6 * y) - 32 * bsum, and the correction of the whole block
// is 32 * sum_j scale_j * bsum_j (one vpdpwssd per pair of sub-blocks).
template <int T>
inline void q6k_sub_block(const __m512i* w, __m512i sc, const int8_t* q, __m512i* isum) {
    const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
        const int8_t* qt = q + t * QK_K;
        __m512i s0 = _mm512_dpbusd_epi32(zero, w[0], bcast4(qt));
        __m512i s1 = _mm512_dpbusd_epi32(zero, w[1], bcast4(qt + 4));
        s0 = _mm512_dpbusd_epi32(s0, w[2], bcast4(qt + 8));
        s1 = _mm512_dpbusd_epi32(s1, w[3], bcast4(qt + 12));
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
    }
}

// The levels of sub-block 8h + 2s + ch (values 128h + 32s + 16ch ..).
template <int s>
inline void q6k_levels(const Q6KGroupBlock& g, int h, int ch, __m512i* w) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const int c = 4 * ch + k;
        const __m512i l = load(g.ql[h][s & 1][c]);
        const __m512i lo = _mm512_and_si512(s < 2 ? l : _mm512_srli_epi16(l, 4), low4);
        const __m512i hb = load(g.qh[h][c]);
        // Bits 2s, 2s+1 of each byte moved to bits 4, 5.
        __m512i hi;
        if constexpr (s == 0)
            hi = _mm512_slli_epi16(hb, 4);
        else if constexpr (s == 1)
            hi = _mm512_slli_epi16(hb, 2);
        else if constexpr (s == 2)
            hi = hb;
        else
            hi = _mm512_srli_epi16(hb, 2);
        w[k] = _mm512_ternarylogic_epi32(lo, hi, top2, 0xD8);  // top2 ? hi : lo
    }
}

template <int T, int s>
inline void q6k_pair(const Q6KGroupBlock& g, const ActBlock& a, int h, __m512i* isum) {
    // Scales of sub-blocks 8h + 2s (low words) and 8h + 2s + 1 (high words).
    const __m512i pair = _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.scales[4 * h + s])));
    __m512i w[4];
    q6k_levels<s>(g, h, 0, w);
    q6k_sub_block<T>(w, _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16),
                     a.qs[0] + 128 * h + 32 * s, isum);
    q6k_levels<s>(g, h, 1, w);
    q6k_sub_block<T>(w, _mm512_srai_epi32(pair, 16), a.qs[0] + 128 * h + 32 * s + 16, isum);
}

template <int T>
void q6k_tile(int64_t nb, const Q6KGroupBlock* gb, const ActBlock* ab, float* const* out,
              int64_t off) {
    TileSums acc;
    for (int t = 0; t < T; ++t) _mm512_store_ps(acc.v[t], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const Q6KGroupBlock& g = gb[b];
        const ActBlock& a = ab[b];
        __m512i isum[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int h = 0; h < 2; ++h) {
            q6k_pair<T, 0>(g, a, h, isum);
            q6k_pair<T, 1>(g, a, h, isum);
            q6k_pair<T, 2>(g, a, h, isum);
            q6k_pair<T, 3>(g, a, h, isum);
        }
        const __m512 dx =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.d)));
        const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            const int16_t* bs = a.bsums[t];
            __m512i c0 = zero, c1 = zero;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i += 2) {
                c0 = _mm512_dpwssd_epi32(c0,
                                         _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                             reinterpret_cast<const __m256i*>(g.scales[i]))),
                                         bcast4(bs + 2 * i));
                c1 = _mm512_dpwssd_epi32(c1,
                                         _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                             reinterpret_cast<const __m256i*>(g.scales[i + 1]))),
                                         bcast4(bs + 2 * i + 2));
            }
            const __m512i corr = _mm512_slli_epi32(_mm512_add_epi32(c0, c1), 5);
            _mm512_store_ps(acc.v[t], finish(_mm512_load_ps(acc.v[t]), dx, a.d[t],
                                             _mm512_sub_epi32(isum[t], corr)));
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out[t] + off, _mm512_load_ps(acc.v[t]));
}

// Tile kernels for 1..kTile tokens, so a remainder costs one decode too.
template <typename Group, template <int> class K, int... Ts>
constexpr auto tile_table(std::integer_sequence<int, Ts...>) {
    return std::array{&K<Ts + 1>::run...};
}

template <int T>
struct Q4KTile {
    static void run(int64_t nb, const void* gb, const ActBlock* ab, float* const* out,
                    int64_t off) {
        q4k_tile<T>(nb, static_cast<const Q4KGroupBlock*>(gb), ab, out, off);
    }
};

template <int T>
struct Q6KTile {
    static void run(int64_t nb, const void* gb, const ActBlock* ab, float* const* out,
                    int64_t off) {
        q6k_tile<T>(nb, static_cast<const Q6KGroupBlock*>(gb), ab, out, off);
    }
};

using TileFn = void (*)(int64_t, const void*, const ActBlock*, float* const*, int64_t);

void gemm(int64_t nb, const uint8_t* groups, size_t group_bytes, int64_t n_groups,
          const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows, const TileFn* tiles) {
    thread_local std::vector<ActBlock> tile;
    if (tile.size() < size_t(nb)) tile.resize(size_t(nb));
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTile) {
        const int64_t nt = std::min<int64_t>(kTile, n_tok - t0);
        load_tile(acts + t0, nt, nb, tile.data());
        for (int64_t g = 0; g < n_groups; ++g)
            tiles[nt - 1](nb, groups + size_t(g) * group_bytes, tile.data(), y_rows + t0,
                          kRows * g);
    }
}

}  // namespace

void gemm_q4_K_avx512(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    static constexpr auto kTiles =
        tile_table<Q4KGroupBlock, Q4KTile>(std::make_integer_sequence<int, kTile>());
    gemm(nb, reinterpret_cast<const uint8_t*>(groups), size_t(nb) * sizeof(Q4KGroupBlock), n_groups,
         acts, n_tok, y_rows, kTiles.data());
}

void gemm_q6_K_avx512(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    static constexpr auto kTiles =
        tile_table<Q6KGroupBlock, Q6KTile>(std::make_integer_sequence<int, kTile>());
    gemm(nb, reinterpret_cast<const uint8_t*>(groups), size_t(nb) * sizeof(Q6KGroupBlock), n_groups,
         acts, n_tok, y_rows, kTiles.data());
}

}  // namespace glm5::quant::repacked

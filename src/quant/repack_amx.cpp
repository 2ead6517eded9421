// AMX-INT8 GEMM over the repacked 16-row groups (repack.h): the products of
// prefill and of batches of many tokens, on the tile unit. A tile product
// (TDPBSSD) multiplies 16 tokens x 64 activation bytes by 64 weight bytes of
// 16 rows, so a block's per-sub-block scales cannot be applied between its
// sub-blocks; instead they are folded into the weight bytes, split into
// digits small enough that weight x digit stays a signed byte:
//   Q4_K: scale s (6 bits) = 8 * hi + lo, hi and lo in 0..7, weight levels
//         0..15: isum = dot(a, w * lo) + 8 * dot(a, w * hi), 2 products;
//   Q6_K: scale s (signed 8 bits) = d0 + 7 d1 + 49 d2 in balanced base 7
//         (digits -3..3), levels q = u6 - 32 in -32..31: isum = sum_k 7^k
//         dot(a, q * d_k), 3 products (and no bsums correction).
// Each is the same integer as the VNNI kernels' (exact in int32: |isum| <
// 2^27), finished per block by the same float operations (repack_simd.h),
// so every output has the bits of the single-row kernel. The weight bytes of
// one group block are expanded once into tile rows and used by every token
// tile of the call; the activations are copied once per call into aligned
// tiles of 16 tokens (zero rows pad the last one).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "quant/amx_tiles.h"
#include "quant/repack_kernels.h"
#include "quant/repack_simd.h"

namespace glm5::quant::repacked {

namespace {

constexpr int kTok = 16;    // tokens (rows) of an activation tile
constexpr int kBytes = 64;  // bytes of a tile row: 64 values of K

// The call's activations, copied once per call into 64-byte aligned tiles
// (a tile row split over two cache lines made each tile load several times
// slower; Q8_K's values start 4 bytes into a 292-byte block, so they cannot
// be read in place): qs[b][t][256] for the tokens padded to whole tiles
// (padding all zero). The scales, and for Q4_K the 32-value sums as
// q4k_summs takes them, per block and token.
struct alignas(64) Line {
    int8_t v[64];
};

struct Acts {
    int64_t n_tok = 0, tpad = 0;
    std::vector<Line> qs;
    std::vector<float> d;
    std::vector<std::array<int32_t, 4>> pairs;
    // Tile (b, t0)'s first row; rows are QK_K bytes apart.
    const int8_t* tile(int64_t b, int64_t t0) const {
        return qs[size_t(b * tpad + t0) * (QK_K / 64)].v;
    }
    int8_t* row(int64_t b, int64_t t) { return qs[size_t(b * tpad + t) * (QK_K / 64)].v; }
};

void load_acts(const BlockQ8_K* const* acts, int64_t n_tok, int64_t nb, bool pairs, Acts& a) {
    a.n_tok = n_tok;
    a.tpad = (n_tok + kTok - 1) / kTok * kTok;
    a.qs.resize(size_t(nb * a.tpad) * (QK_K / 64));
    a.d.resize(size_t(nb * n_tok));
    if (pairs) a.pairs.resize(size_t(nb * n_tok));
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t t = 0; t < a.tpad; ++t) {
            int8_t* q = a.row(b, t);
            if (t >= n_tok) {
                std::memset(q, 0, QK_K);
                continue;
            }
            const BlockQ8_K& y = acts[t][b];
            std::memcpy(q, y.qs, QK_K);
            a.d[size_t(b * n_tok + t)] = y.d;
            if (pairs) q4k_pairs(y, a.pairs[size_t(b * n_tok + t)].data());
        }
}

// Float sums of the call's tokens for one group, 16 rows each.
struct alignas(64) RowSums {
    float v[kRows];
};

// ---------------------------------------------------------------- Q4_K
// B tiles of one group block: [chunk k of 64 values][lo, hi][K/4 row][64]:
// tile row c < 8 holds values 64k + 4c.. (sub-block 2k) of the 16 rows, row
// 8 + c values 64k + 32 + 4c.. (sub-block 2k + 1), as the activation bytes
// 64k.. of a tile row line up with them.
struct alignas(64) Q4KTiles {
    int8_t b[4][2][16][kBytes];
};

// w * m for a level w (0..15) and a digit m (0..7), at index w + 16 m.
constexpr std::array<int8_t, 128> product_table() {
    std::array<int8_t, 128> t{};
    for (int m = 0; m < 8; ++m)
        for (int w = 0; w < 16; ++w) t[size_t(w + 16 * m)] = int8_t(w * m);
    return t;
}
alignas(64) constexpr std::array<int8_t, 128> kQ4KProducts = product_table();

void q4k_expand(const Q4KGroupBlock& g, Q4KTiles& out) {
    const __m512i t0 = _mm512_load_si512(kQ4KProducts.data());
    const __m512i t1 = _mm512_load_si512(kQ4KProducts.data() + 64);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
        __m512i lo[2], hi[2];  // the digits times 16, in every byte of a row's lane
        for (int e = 0; e < 2; ++e) {
            const __m512i s = _mm512_mullo_epi32(
                _mm512_cvtepu8_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.scales[2 * k + e]))),
                _mm512_set1_epi32(0x01010101));
            lo[e] = _mm512_slli_epi16(_mm512_and_si512(s, _mm512_set1_epi8(0x07)), 4);
            hi[e] = _mm512_and_si512(_mm512_slli_epi16(s, 1), _mm512_set1_epi8(0x70));
        }
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
            const __m512i v = _mm512_loadu_si512(g.qs[k][c]);
            const __m512i w0 = _mm512_and_si512(v, low4);
            const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            auto put = [&](int8_t* dst, __m512i w, __m512i m) {
                _mm512_store_si512(dst, _mm512_permutex2var_epi8(t0, _mm512_or_si512(w, m), t1));
            };
            put(out.b[k][0][c], w0, lo[0]);
            put(out.b[k][0][8 + c], w1, lo[1]);
            put(out.b[k][1][c], w0, hi[0]);
            put(out.b[k][1][8 + c], w1, hi[1]);
        }
    }
}

// Integer sums of NT token tiles (a: the first one's bytes of this block,
// tiles QK_K * kTok bytes apart) against one expanded block: c[i][lo/hi].
template <int NT>
inline void q4k_products(const Q4KTiles& w, const int8_t* a, int32_t (*c)[2][kTok * kRows]) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NT == 2) {
        _tile_zero(2);
        _tile_zero(3);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        _tile_loadd(4, a + kBytes * k, QK_K);
        if constexpr (NT == 2) _tile_loadd(5, a + kTok * QK_K + kBytes * k, QK_K);
        _tile_loadd(6, w.b[k][0], kBytes);
        _tile_loadd(7, w.b[k][1], kBytes);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        if constexpr (NT == 2) {
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    }
    _tile_stored(0, c[0][0], kRows * 4);
    _tile_stored(1, c[0][1], kRows * 4);
    if constexpr (NT == 2) {
        _tile_stored(2, c[1][0], kRows * 4);
        _tile_stored(3, c[1][1], kRows * 4);
    }
}

// ---------------------------------------------------------------- Q6_K
// B tiles of one group block: [chunk m of 64 values][digit][K/4 row][64]:
// chunk m covers values 64m.. (half h = m / 2); tile row c < 8 holds values
// 128h + 32 j0 + 4c.. with j0 = 2 (m % 2), row 8 + c those of j0 + 1 (the
// layout's level vectors, q6k_level).
struct alignas(64) Q6KTiles {
    int8_t b[4][3][16][kBytes];
};

// The balanced base-7 digits (d0, d1, d2) of every int8 scale, as bytes 0..2
// of the entry at index scale + 128.
constexpr std::array<int32_t, 256> digit_table() {
    std::array<int32_t, 256> t{};
    for (int s = -128; s < 128; ++s) {
        int rest = s, packed = 0;
        for (int k = 0; k < 3; ++k) {
            int d = ((rest % 7) + 7) % 7;
            if (d > 3) d -= 7;
            rest = (rest - d) / 7;
            packed |= (d & 0xFF) << (8 * k);
        }
        t[size_t(s + 128)] = packed;
    }
    return t;
}
constexpr std::array<int32_t, 256> kQ6KDigits = digit_table();

// Tile rows 8 * (J % 2) .. + 7 of chunk 2h + J / 2: levels times each digit
// of their sub-block's scale, one 16-bit product per byte.
template <int J>
inline void q6k_expand_rows(const Q6KGroupBlock& g, int h, Q6KTiles& out) {
    const __m512i sign_bytes = _mm512_set1_epi8(32);
    __m512i dw[2][3];  // [ch][digit]: the digit in both 16-bit words of a row's lane
    for (int ch = 0; ch < 2; ++ch) {
        const __m512i sc = q6k_scale(g, h, J, ch);
        const __m512i packed = _mm512_i32gather_epi32(_mm512_add_epi32(sc, _mm512_set1_epi32(128)),
                                                      kQ6KDigits.data(), 4);
        for (int k = 0; k < 3; ++k) {
            __m512i d = packed;
            if (k == 0) d = _mm512_slli_epi32(d, 24);
            if (k == 1) d = _mm512_slli_epi32(d, 16);
            if (k == 2) d = _mm512_slli_epi32(d, 8);
            d = _mm512_srai_epi32(d, 24);
            dw[ch][k] = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(0xFFFF)),
                                        _mm512_slli_epi32(d, 16));
        }
    }
    const Q6KGroupBlock::Half& hf = g.half[h];
    const int m = 2 * h + J / 2, row0 = 8 * (J % 2);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
        const __m512i u6 = q6k_level<J>(_mm512_loadu_si512(J % 2 == 0 ? hf.lq[c].ql : hf.lq[c].ql1),
                                        _mm512_loadu_si512(hf.lq[c].qh));
        const __m512i q = _mm512_sub_epi8(u6, sign_bytes);
        const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(q, 8), 8);
        const __m512i odd = _mm512_srai_epi16(q, 8);
        for (int k = 0; k < 3; ++k) {
            const __m512i pe = _mm512_mullo_epi16(even, dw[c / 4][k]);
            const __m512i po = _mm512_mullo_epi16(odd, dw[c / 4][k]);
            _mm512_store_si512(out.b[m][k][row0 + c],
                               _mm512_mask_blend_epi8(__mmask64(0xAAAAAAAAAAAAAAAAull), pe,
                                                      _mm512_slli_epi16(po, 8)));
        }
    }
}

void q6k_expand(const Q6KGroupBlock& g, Q6KTiles& out) {
    for (int h = 0; h < 2; ++h) {
        q6k_expand_rows<0>(g, h, out);
        q6k_expand_rows<1>(g, h, out);
        q6k_expand_rows<2>(g, h, out);
        q6k_expand_rows<3>(g, h, out);
    }
}

inline void q6k_products(const Q6KTiles& w, const int8_t* a, int32_t (*c)[kTok * kRows]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
        _tile_loadd(3, a + kBytes * m, QK_K);
        _tile_loadd(4, w.b[m][0], kBytes);
        _tile_loadd(5, w.b[m][1], kBytes);
        _tile_loadd(6, w.b[m][2], kBytes);
        _tile_dpbssd(0, 3, 4);
        _tile_dpbssd(1, 3, 5);
        _tile_dpbssd(2, 3, 6);
    }
    _tile_stored(0, c[0], kRows * 4);
    _tile_stored(1, c[1], kRows * 4);
    _tile_stored(2, c[2], kRows * 4);
}

}  // namespace

void gemm_q4_K_amx(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                   const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    thread_local Acts a;
    thread_local std::vector<RowSums> acc;
    load_acts(acts, n_tok, nb, true, a);
    acc.resize(size_t(a.tpad));
    const AmxTiles tiles;
    alignas(64) Q4KTiles w;
    alignas(64) int32_t c[2][2][kTok * kRows];
    for (int64_t g = 0; g < n_groups; ++g) {
        for (int64_t t = 0; t < n_tok; ++t) _mm512_store_ps(acc[size_t(t)].v, _mm512_setzero_ps());
        for (int64_t b = 0; b < nb; ++b) {
            const Q4KGroupBlock& blk = groups[g * nb + b];
            q4k_expand(blk, w);
            __m512i mp[4];
            q4k_mins(blk, mp);
            const __m512 dx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d)));
            const __m512 mx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.dmin)));
            // Pairs of tiles share the weight tiles' loads.
            for (int64_t t0 = 0; t0 < a.tpad;) {
                const bool two = t0 + kTok < a.tpad;
                if (two)
                    q4k_products<2>(w, a.tile(b, t0), c);
                else
                    q4k_products<1>(w, a.tile(b, t0), c);
                const int64_t t1 = std::min<int64_t>(n_tok, t0 + (two ? 2 : 1) * kTok);
                for (int64_t t = t0; t < t1; ++t) {
                    const int i = int(t - t0) / kTok, r = int(t - t0) % kTok;
                    const __m512i isum = _mm512_add_epi32(
                        _mm512_load_si512(c[i][0] + r * kRows),
                        _mm512_slli_epi32(_mm512_load_si512(c[i][1] + r * kRows), 3));
                    const size_t ai = size_t(b * n_tok + t);
                    float* s = acc[size_t(t)].v;
                    _mm512_store_ps(s, finish(_mm512_load_ps(s), dx, mx, a.d[ai], isum,
                                              q4k_summs(mp, a.pairs[ai].data())));
                }
                t0 += (two ? 2 : 1) * kTok;
            }
        }
        for (int64_t t = 0; t < n_tok; ++t)
            _mm512_storeu_ps(y_rows[t] + kRows * g, _mm512_load_ps(acc[size_t(t)].v));
    }
}

void gemm_q6_K_amx(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                   const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    thread_local Acts a;
    thread_local std::vector<RowSums> acc;
    load_acts(acts, n_tok, nb, false, a);
    acc.resize(size_t(a.tpad));
    const AmxTiles tiles;
    alignas(64) Q6KTiles w;
    alignas(64) int32_t c[3][kTok * kRows];
    for (int64_t g = 0; g < n_groups; ++g) {
        for (int64_t t = 0; t < n_tok; ++t) _mm512_store_ps(acc[size_t(t)].v, _mm512_setzero_ps());
        for (int64_t b = 0; b < nb; ++b) {
            const Q6KGroupBlock& blk = groups[g * nb + b];
            q6k_expand(blk, w);
            const __m512 dx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.d)));
            for (int64_t t0 = 0; t0 < a.tpad; t0 += kTok) {
                q6k_products(w, a.tile(b, t0), c);
                const int64_t t1 = std::min<int64_t>(n_tok, t0 + kTok);
                for (int64_t t = t0; t < t1; ++t) {
                    const int r = int(t - t0);
                    const __m512i c0 = _mm512_load_si512(c[0] + r * kRows);
                    const __m512i c1 = _mm512_load_si512(c[1] + r * kRows);
                    const __m512i c2 = _mm512_load_si512(c[2] + r * kRows);
                    // c0 + 7 c1 + 49 c2, by shifts
                    const __m512i isum = _mm512_add_epi32(
                        _mm512_add_epi32(c0, _mm512_sub_epi32(_mm512_slli_epi32(c1, 3), c1)),
                        _mm512_add_epi32(
                            _mm512_sub_epi32(_mm512_slli_epi32(c2, 6), _mm512_slli_epi32(c2, 4)),
                            c2));
                    float* s = acc[size_t(t)].v;
                    _mm512_store_ps(
                        s, finish(_mm512_load_ps(s), dx, a.d[size_t(b * n_tok + t)], isum));
                }
            }
        }
        for (int64_t t = 0; t < n_tok; ++t)
            _mm512_storeu_ps(y_rows[t] + kRows * g, _mm512_load_ps(acc[size_t(t)].v));
    }
}

}  // namespace glm5::quant::repacked

// AVX-512 row helpers: the tiles of MLA attention over an F16 cache, its
// softmax, and SwiGLU. Blocks of a few cache rows are scored against every
// head of the query from L1, each F16 value converted as a tile loads it
// (once per group of four heads): the row-at-a-time helpers converted each
// row once per head and kept a quarter of the FMA units busy.
//
// Determinism: a score is a fixed function of its query row and cache row
// (lane-wise FMAs over 16-value chunks in order, then one fixed horizontal
// sum), and an output value is a chain of FMAs over the rows in order, so no
// result depends on how many heads, rows or queries share a call.
// GCC 12's AVX-512 intrinsics pass an undefined vector as the merge source,
// which its uninitialised-use warnings report at every inlined use (GCC bug
// 105593); the code is fine.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/avx512_exp.h"
#include "backend/cpu_kernels.h"
#include "backend/cpu_prefetch.h"
#include "backend/cpu_simd.h"

namespace glm5::backend::cpu::avx512 {

namespace {

constexpr int64_t kLanes = 16;
// Cache rows per score block (every head of the query scores them, from L1)
// and the blocks ahead whose rows are asked for meanwhile.
constexpr int64_t kScoreRows = 4, kScoreAhead = 4;
constexpr int64_t kValueRows = 32;  // cache rows per output block

int64_t padded(int64_t n) {
    return (n + kLanes - 1) / kLanes * kLanes;
}

__mmask16 lanes(int64_t n) {
    return n >= kLanes ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Per-thread buffers (a task computes one query's heads on one thread).
struct Scratch {
    std::vector<float> q, out;
};
// 64-byte aligned n floats in v: every zmm load of a query row is then one
// cache line (a std::vector's 16-byte alignment split most of them).
float* aligned(std::vector<float>& v, size_t n) {
    v.resize(n + 16);
    const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

// 16 F16 cache values as floats (masked: zero past the mask).
template <bool Masked>
inline __m512 load_f16(const uint16_t* p, __mmask16 m) {
    if constexpr (Masked) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Scores and weighted sums ask for the rows a few blocks on one line every few
// FMAs from inside their tiles (cpu_prefetch.h): a block's 144 lines asked for
// at once ran the scores ~1.7x slower from DRAM than from cache.
using RowPrefetch = cpu::RowPrefetch<F16Rows>;

// s[a*ld + b] = q row a . cache row k[b], A query rows by B cache rows over
// the first w values (query rows wp wide, zero past w). The cache values are
// converted as they are used: converting a block into a buffer first took a
// fifth of the time and a third of L1.
template <int A, int B>
void score_tile(const float* q, const uint16_t* const* k, int64_t w, int64_t wp, float* s,
                int64_t ld, RowPrefetch& pf) {
    __m512 acc[A][B];
#pragma GCC unroll 4
    for (int a = 0; a < A; ++a)
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) acc[a][b] = _mm512_setzero_ps();
    auto chunk = [&]<bool Masked>(int64_t i, __mmask16 m) {
        __m512 kv[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) kv[b] = load_f16<Masked>(k[b] + i, m);
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) {
            const __m512 qa = _mm512_loadu_ps(q + a * wp + i);
#pragma GCC unroll 4
            for (int b = 0; b < B; ++b) acc[a][b] = _mm512_fmadd_ps(qa, kv[b], acc[a][b]);
        }
    };
    const int64_t whole = w / kLanes * kLanes;
    for (int64_t i = 0; i < whole; i += kLanes) {
        if ((i & (2 * kLanes - 1)) == 0) pf.step();
        chunk.template operator()<false>(i, 0);
    }
    if (whole < wp) chunk.template operator()<true>(whole, lanes(w - whole));
#pragma GCC unroll 4
    for (int a = 0; a < A; ++a)
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) s[a * ld + b] = _mm512_reduce_add_ps(acc[a][b]);
}

using ScoreTile = void (*)(const float*, const uint16_t* const*, int64_t, int64_t, float*, int64_t,
                           RowPrefetch&);

template <int A, int... Bs>
constexpr std::array<ScoreTile, 4> score_row(std::integer_sequence<int, Bs...>) {
    return {score_tile<A, Bs + 1>...};
}

constexpr std::array<std::array<ScoreTile, 4>, 4> kScoreTiles = {
    score_row<1>(std::make_integer_sequence<int, 4>{}),
    score_row<2>(std::make_integer_sequence<int, 4>{}),
    score_row<3>(std::make_integer_sequence<int, 4>{}),
    score_row<4>(std::make_integer_sequence<int, 4>{})};

// out[h][c0 .. c0 + 16C) += p[h][j] * v[j][c0 ..] over nr cache rows v[j] (F16,
// the columns of chunk c masked by m[c]) in order, for H heads; out rows are vp
// wide, p rows ld wide (p already offset to the block).
template <int H, int C>
void value_tile(const float* p, int64_t ld, const uint16_t* const* v, int64_t nr,
                const __mmask16* m, int64_t vp, float* out, int64_t c0, RowPrefetch& pf) {
    __m512 acc[H][C];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 2
        for (int c = 0; c < C; ++c) acc[h][c] = _mm512_loadu_ps(out + h * vp + c0 + c * kLanes);
    for (int64_t r = 0; r < nr; ++r) {
        pf.step();
        __m512 vv[C];
#pragma GCC unroll 2
        for (int c = 0; c < C; ++c) vv[c] = load_f16<true>(v[r] + c0 + c * kLanes, m[c]);
#pragma GCC unroll 8
        for (int h = 0; h < H; ++h) {
            const __m512 ph = _mm512_set1_ps(p[h * ld + r]);
#pragma GCC unroll 2
            for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(ph, vv[c], acc[h][c]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 2
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + h * vp + c0 + c * kLanes, acc[h][c]);
}

using ValueTile = void (*)(const float*, int64_t, const uint16_t* const*, int64_t, const __mmask16*,
                           int64_t, float*, int64_t, RowPrefetch&);

template <int... Hs>
constexpr std::array<std::array<ValueTile, 2>, 8> value_tiles(std::integer_sequence<int, Hs...>) {
    return {std::array<ValueTile, 2>{value_tile<Hs + 1, 1>, value_tile<Hs + 1, 2>}...};
}

constexpr auto kValueTiles = value_tiles(std::make_integer_sequence<int, 8>{});

}  // namespace

void softmax(float* x, int64_t n, bool round_f16) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += kLanes)
        mv =
            _mm512_max_ps(mv, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), lanes(n - j), x + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    // The sum in double, eight lanes per half, combined in a fixed order.
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t j = 0; j < n; j += kLanes) {
        const __mmask16 m = lanes(n - j);
        const __m512 e =
            _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), mx)));
        _mm512_mask_storeu_ps(x + j, m, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    const __m512d s = _mm512_add_pd(s0, s1);
    const __m256d q = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd(q, 1));
    const double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    const __m512 inv = _mm512_set1_ps(float(1.0 / sum));
    for (int64_t j = 0; j < n; j += kLanes) {
        const __mmask16 m = lanes(n - j);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), inv);
        if (round_f16)
            v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(x + j, m, v);
    }
}

void swiglu(int64_t n, const float* g, const float* u, float clamp, float* out) {
    const bool clamped = clamp > 1e-6f;
    const __m512 hi = _mm512_set1_ps(clamp), lo = _mm512_set1_ps(-clamp);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = lanes(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        if (clamped) {
            gv = _mm512_min_ps(gv, hi);
            uv = _mm512_min_ps(_mm512_max_ps(uv, lo), hi);
        }
        // silu(g) = g / (1 + e^-g)
        const __m512 s =
            _mm512_div_ps(gv, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, uv));
    }
}

void scores_f16(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n, float* s,
                int64_t ld) {
    Scratch& sc = scratch();
    const int64_t wp = padded(w);
    // The query rows padded with zeros like the masked cache values; rows of
    // whole vectors on a cache line (the MLA width) are read in place: in
    // decode the copy was one more cold buffer per query.
    const float* sq = q;
    if (wp != w || reinterpret_cast<uintptr_t>(q) % 64 != 0) {
        float* const pq = aligned(sc.q, size_t(nh * wp));
        std::fill(pq, pq + nh * wp, 0.0f);
        for (int64_t h = 0; h < nh; ++h)
            std::memcpy(pq + h * wp, q + h * w, size_t(w) * sizeof(float));
        sq = pq;
    }
    // Each block's tiles ask for the rows kScoreAhead blocks on, the first
    // blocks' rows asked for at once.
    RowPrefetch pf(rows, n, w * int64_t(sizeof(uint16_t)));
    pf.queue(0, kScoreAhead * kScoreRows, 1);
    pf.step();
    // Tile steps a block takes (a step is two 16-value chunks of every tile).
    const int64_t steps = (nh + 3) / 4 * ((w / kLanes + 1) / 2);
    for (int64_t j0 = 0; j0 < n; j0 += kScoreRows) {
        const int64_t nr = std::min(kScoreRows, n - j0);
        pf.queue(j0 + kScoreAhead * kScoreRows, kScoreRows, steps);
        const uint16_t* k[kScoreRows];
        for (int64_t r = 0; r < nr; ++r) k[r] = rows.row(j0 + r);
        for (int64_t h0 = 0; h0 < nh; h0 += 4) {
            const int64_t a = std::min<int64_t>(4, nh - h0);
            kScoreTiles[size_t(a - 1)][size_t(nr - 1)](sq + h0 * wp, k, w, wp, s + h0 * ld + j0, ld,
                                                       pf);
        }
    }
}

void weighted_sum_f16(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                      int64_t vw, float* out) {
    Scratch& sc = scratch();
    const int64_t vp = padded(vw);
    // Sums in whole vectors: out itself when its rows are (the MLA width),
    // else a padded buffer copied out at the end.
    const bool direct = vp == vw;
    float* const so = direct ? out : aligned(sc.out, size_t(nh * vp));
    std::fill(so, so + nh * vp, 0.0f);
    // As in scores_f16: the next block's rows asked for over this block's tiles.
    RowPrefetch pf(rows, n, vw * int64_t(sizeof(uint16_t)));
    const int64_t steps = (nh + 7) / 8 * ((vp / kLanes + 1) / 2);
    for (int64_t j0 = 0; j0 < n; j0 += kValueRows) {
        const int64_t nr = std::min(kValueRows, n - j0);
        pf.queue(j0 + kValueRows, kValueRows, steps * nr);
        const uint16_t* v[kValueRows];
        for (int64_t r = 0; r < nr; ++r) v[r] = rows.row(j0 + r);
        for (int64_t h0 = 0; h0 < nh; h0 += 8) {
            const int64_t hh = std::min<int64_t>(8, nh - h0);
            for (int64_t c0 = 0; c0 < vp; c0 += 2 * kLanes) {
                const int64_t cc = std::min<int64_t>(2, (vp - c0) / kLanes);
                const __mmask16 m[2] = {lanes(vw - c0), lanes(vw - c0 - kLanes)};
                kValueTiles[size_t(hh - 1)][size_t(cc - 1)](p + h0 * ld + j0, ld, v, nr, m, vp,
                                                            so + h0 * vp, c0, pf);
            }
        }
    }
    if (!direct)
        for (int64_t h = 0; h < nh; ++h)
            std::memcpy(out + h * vw, so + h * vp, size_t(vw) * sizeof(float));
}

namespace {

// The product rounded before it is added: GCC may not contract the two.
inline __m512 product(__m512 a, __m512 b) {
    __m512 p = _mm512_mul_ps(a, b);
    asm("" : "+v"(p));
    return p;
}

// The delta rule's passes over columns [j0, j0 + 16 C) of the state (C vectors,
// the last one masked to d - j0 - 16 (C - 1) columns), the sums in registers.
template <int C, bool Decay>
void delta_columns(int64_t d, int64_t j0, const float* src, const float* a, const float* b,
                   const float* u, float* S, float* acc) {
    __m512 sum[C];
    __mmask16 m[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
        sum[c] = _mm512_setzero_ps();
        m[c] = lanes(d - j0 - kLanes * c);
    }
    __m512 uv[C];
    if constexpr (!Decay)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) uv[c] = _mm512_maskz_loadu_ps(m[c], u + j0 + kLanes * c);
    for (int64_t i = 0; i < d; ++i) {
        float* row = S + i * d + j0;
        const __m512 ai = _mm512_set1_ps(a[i]), bi = _mm512_set1_ps(b[i]);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            __m512 r;
            if constexpr (Decay)  // S = src * decay; acc += S * k
                r = product(_mm512_maskz_loadu_ps(m[c], src + i * d + j0 + kLanes * c), ai);
            else  // S += k * u; acc += S * q
                r = _mm512_add_ps(_mm512_maskz_loadu_ps(m[c], row + kLanes * c),
                                  product(ai, uv[c]));
            _mm512_mask_storeu_ps(row + kLanes * c, m[c], r);
            sum[c] = _mm512_add_ps(sum[c], product(r, bi));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(acc + j0 + kLanes * c, m[c], sum[c]);
}

// delta_columns for 1..8 vectors of columns.
template <bool Decay, int... Cs>
constexpr auto delta_table(std::integer_sequence<int, Cs...>) {
    return std::array<void (*)(int64_t, int64_t, const float*, const float*, const float*,
                               const float*, float*, float*),
                      sizeof...(Cs)>{delta_columns<Cs + 1, Decay>...};
}

template <bool Decay>
void delta_pass(int64_t d, const float* src, const float* a, const float* b, const float* u,
                float* S, float* acc) {
    static constexpr auto kColumns = delta_table<Decay>(std::make_integer_sequence<int, 8>{});
    // Up to 128 columns (8 vectors) per walk down the rows.
    for (int64_t j0 = 0; j0 < d; j0 += 8 * kLanes) {
        const int64_t c = std::min<int64_t>(8, (d - j0 + kLanes - 1) / kLanes);
        kColumns[size_t(c - 1)](d, j0, src, a, b, u, S, acc);
    }
}

}  // namespace

void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc) {
    delta_pass<true>(d, src, decay, k, nullptr, S, acc);
}

void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc) {
    delta_pass<false>(d, nullptr, k, q, u, S, acc);
}

void top_k_rows(const float* v, int64_t n, int64_t k, std::vector<int32_t>& tmp, int32_t* out) {
    // kernels::top_k_rows's bucket select, its passes over the rows on 16 at
    // a time: the order keys with their range, the rows of the k-th key's
    // bucket, and the rows taken. The histogram stays scalar, spread over
    // four copies so that runs of rows in one bucket do not wait on each
    // other's increments.
    k = std::min(k, n);
    if (k <= 0) return;
    constexpr int64_t kBuckets = 2048, kHists = 4;
    tmp.resize(size_t(2 * n + kHists * kBuckets + kLanes));
    uint32_t* key = reinterpret_cast<uint32_t*>(tmp.data());
    int32_t* hist = tmp.data() + n;
    uint32_t* cand = reinterpret_cast<uint32_t*>(hist + kHists * kBuckets);
    auto lanes = [n](int64_t i) {
        return i + kLanes <= n ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    };
    const __m512 zero = _mm512_setzero_ps();
    const __m512i ones = _mm512_set1_epi32(-1), sign = _mm512_set1_epi32(INT32_MIN);
    __m512i lo = ones, hi = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += kLanes) {
        const __mmask16 m = lanes(i);
        __m512 x = _mm512_maskz_loadu_ps(m, v + i);
        x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), zero);  // -0: +0
        const __m512i u = _mm512_castps_si512(x);
        const __m512i kk =
            _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), _mm512_movepi32_mask(u), u, ones);
        _mm512_mask_storeu_epi32(key + i, m, kk);
        lo = _mm512_mask_min_epu32(lo, m, lo, kk);
        hi = _mm512_mask_max_epu32(hi, m, hi, kk);
    }
    const uint32_t klo = _mm512_reduce_min_epu32(lo), khi = _mm512_reduce_max_epu32(hi);
    const int shift = kernels::bucket_shift(klo, khi, kBuckets);
    std::fill(hist, hist + kHists * kBuckets, 0);
    int64_t i = 0;
    for (; i + kHists <= n; i += kHists)
        for (int64_t h = 0; h < kHists; ++h) ++hist[h * kBuckets + ((key[i + h] - klo) >> shift)];
    for (; i < n; ++i) ++hist[(key[i] - klo) >> shift];
    for (int64_t h = 1; h < kHists; ++h)
        for (int64_t j = 0; j < kBuckets; j += kLanes)
            _mm512_storeu_si512(hist + j,
                                _mm512_add_epi32(_mm512_loadu_si512(hist + j),
                                                 _mm512_loadu_si512(hist + h * kBuckets + j)));
    int64_t above = 0;
    const int64_t b = kernels::kth_bucket(hist, int64_t((khi - klo) >> shift), k, above);
    // The bucket's keys; the (k - above)-th largest of them is the k-th key.
    const __m512i vlo = _mm512_set1_epi32(int32_t(klo)), vb = _mm512_set1_epi32(int32_t(b));
    const __m128i sh = _mm_cvtsi32_si128(shift);
    int64_t nc = 0;
    for (i = 0; i < n; i += kLanes) {
        const __m512i kk = _mm512_maskz_loadu_epi32(lanes(i), key + i);
        const __mmask16 in = _mm512_mask_cmpeq_epi32_mask(
            lanes(i), _mm512_srl_epi32(_mm512_sub_epi32(kk, vlo), sh), vb);
        _mm512_storeu_si512(cand + nc, _mm512_maskz_compress_epi32(in, kk));
        nc += __builtin_popcount(in);
    }
    int64_t equal = 0;  // rows equal to the k-th that are taken
    const uint32_t kth = kernels::kth_key(cand, nc, k - above, equal);
    // Every row above the k-th key, and the lowest-indexed rows equal to it.
    const __m512i vk = _mm512_set1_epi32(int32_t(kth)), step = _mm512_set1_epi32(kLanes);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t m = 0;
    for (i = 0; i < n; i += kLanes, idx = _mm512_add_epi32(idx, step)) {
        const __m512i kk = _mm512_maskz_loadu_epi32(lanes(i), key + i);
        const __mmask16 gt = _mm512_mask_cmpgt_epu32_mask(lanes(i), kk, vk);
        uint32_t eq = _mm512_mask_cmpeq_epu32_mask(lanes(i), kk, vk);
        const int64_t c = __builtin_popcount(eq);
        if (c > equal) eq = _pdep_u32((1u << equal) - 1, eq);  // the lowest `equal` of them
        equal -= std::min(c, equal);
        const __mmask16 take = __mmask16(gt | eq);
        const int nt = __builtin_popcount(take);
        _mm512_mask_storeu_epi32(out + m, __mmask16((1u << nt) - 1),
                                 _mm512_maskz_compress_epi32(take, idx));
        m += nt;
    }
}

namespace {

// quant's AVX-512 F32 dot (kernels::dot_f32_avx512) ends in
// _mm512_reduce_add_ps, a tree that adds lanes i and i+8, then i and i+4,
// i and i+2, i and i+1. The same tree over 16 vectors at once: each level
// folds two vectors into one holding both halves' sums, so 16 dots take 15
// adds instead of 16 horizontal reductions.
inline __m512 fold8(__m512 a, __m512 b) {  // a's i + (i+8) in lanes 0-7, b's in 8-15
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
inline __m512 fold4(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
inline __m512 fold2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
inline __m512 fold1(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// The lanes of one dot of dot_f32_avx512 before its reduction: four
// accumulators over 64-value steps, 16-value steps into the first, then
// (a0 + a1) + (a2 + a3). The query's NC vectors are in registers.
template <int NC>
inline __m512 dot_lanes(const __m512 (&qv)[NC], const float* k) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
#pragma GCC unroll 8
    for (int c = 0; c < NC / 4 * 4; ++c)
        acc[c % 4] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + kLanes * c), acc[c % 4]);
#pragma GCC unroll 4
    for (int c = NC / 4 * 4; c < NC; ++c)
        acc[0] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + kLanes * c), acc[0]);
    return _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
}

// The relu-weighted head sum of 16 keys, key 4 (b % 4) + b / 4 at kp[b]: the
// tree leaves sum b's dot in lane 4 (b % 4) + b / 4, so the lanes come out
// in key order.
template <int NC>
inline __m512 relu_block(const float* q, int64_t nq, const float* w, const float* const* kp) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 score = zero;
    for (int64_t a = 0; a < nq; ++a) {
        __m512 qv[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + a * NC * kLanes + kLanes * c);
        __m512 f8[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t)
            f8[t] = fold8(dot_lanes<NC>(qv, kp[2 * t]), dot_lanes<NC>(qv, kp[2 * t + 1]));
        const __m512 d = fold1(fold2(fold4(f8[0], f8[1]), fold4(f8[2], f8[3])),
                               fold2(fold4(f8[4], f8[5]), fold4(f8[6], f8[7])));
        // max(0, d) keeps d when it is a NaN or -0, as std::max(d, 0.0f).
        score = _mm512_add_ps(score, product(_mm512_max_ps(zero, d), _mm512_set1_ps(w[a])));
    }
    return score;
}

// Keys 16 at a time; past nk the last key stands in and its lanes are not
// stored.
template <int NC>
void relu_scores(const float* q, int64_t nq, const float* w, const float* k, int64_t ks, int64_t nk,
                 float* out) {
    for (int64_t j0 = 0; j0 < nk; j0 += kLanes) {
        const float* kp[kLanes];
        for (int b = 0; b < kLanes; ++b)
            kp[b] = k + std::min<int64_t>(j0 + 4 * (b % 4) + b / 4, nk - 1) * ks;
        _mm512_mask_storeu_ps(out + j0, lanes(nk - j0), relu_block<NC>(q, nq, w, kp));
    }
}

// The same over F16 keys: each 16 converted once into a buffer that stays in
// L1 while every head reads it (a separate conversion pass over a whole
// chunk took a third of decode's scoring time), and the keys two blocks on
// asked for meanwhile.
template <int NC>
void relu_scores_f16(const float* q, int64_t nq, const float* w, const uint16_t* k, int64_t ks,
                     int64_t nk, float* out) {
    constexpr int64_t kAhead = 2 * kLanes;
    alignas(64) float kb[kLanes][NC * kLanes];
    const float* kp[kLanes];
    for (int b = 0; b < kLanes; ++b) kp[b] = kb[4 * (b % 4) + b / 4];
    for (int64_t j0 = 0; j0 < nk; j0 += kLanes) {
        for (int64_t j = 0; j < kLanes; ++j) {
            if (j0 + j + kAhead < nk) {
                const char* ahead = reinterpret_cast<const char*>(k + (j0 + j + kAhead) * ks);
#pragma GCC unroll 4
                for (int o = 0; o < NC * kLanes * 2; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
            }
            const uint16_t* src = k + std::min(j0 + j, nk - 1) * ks;
#pragma GCC unroll 8
            for (int c = 0; c < NC; ++c)
                _mm512_store_ps(kb[j] + kLanes * c,
                                _mm512_cvtph_ps(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(src + kLanes * c))));
        }
        _mm512_mask_storeu_ps(out + j0, lanes(nk - j0), relu_block<NC>(q, nq, w, kp));
    }
}

// Keys of type K (float or F16 bits) through the form for dim = 16 NC.
template <class K, int NC>
void relu_scores_of(const float* q, int64_t nq, const float* w, const K* k, int64_t ks, int64_t nk,
                    float* out) {
    if constexpr (std::is_same_v<K, float>)
        relu_scores<NC>(q, nq, w, k, ks, nk, out);
    else
        relu_scores_f16<NC>(q, nq, w, k, ks, nk, out);
}

template <class K, int... Ns>
constexpr auto relu_scores_table(std::integer_sequence<int, Ns...>) {
    return std::array<void (*)(const float*, int64_t, const float*, const K*, int64_t, int64_t,
                               float*),
                      sizeof...(Ns)>{relu_scores_of<K, Ns + 1>...};
}

template <class K>
bool relu_scores_by_dim(const float* q, int64_t nq, const float* w, const K* k, int64_t ks,
                        int64_t nk, int64_t dim, float* out) {
    if (dim % kLanes != 0 || dim > 8 * kLanes || dim == 0) return false;
    static constexpr auto kForms = relu_scores_table<K>(std::make_integer_sequence<int, 8>{});
    kForms[size_t(dim / kLanes - 1)](q, nq, w, k, ks, nk, out);
    return true;
}

}  // namespace

bool indexer_scores(const float* q, int64_t nq, const float* w, const float* k, int64_t ks,
                    int64_t nk, int64_t dim, float* out) {
    return relu_scores_by_dim(q, nq, w, k, ks, nk, dim, out);
}

bool indexer_scores_f16(const float* q, int64_t nq, const float* w, const uint16_t* k, int64_t ks,
                        int64_t nk, int64_t dim, float* out) {
    return relu_scores_by_dim(q, nq, w, k, ks, nk, dim, out);
}

}  // namespace glm5::backend::cpu::avx512

// AVX-512 VNNI GEMM over the repacked 16-row groups (repack.h,
// repack_kernels.h): weights of the 16 rows in the 16 int32 lanes, one
// token's 4 activation bytes broadcast to all lanes, vpdpbusd accumulates.
// Q4_K: a group's super-block is decoded once per tile of up to 16 tokens.
// Q6_K: one token chunk by chunk; passes of up to 8 tokens one sub-block at
// a time. Q5_0 / Q8_0: see their section below. With few tokens a large
// matrix is read from DRAM once per call, and the kernels prefetch ahead in
// software (see prefetch()).
//
// Exactness (K-quants): per (row, token, super-block) the kernels form the
// same integers as the single-row kernels (isum = sum_j scale_j * dot_j, and
// summs for the mins), exact in int32; the float finish is the reference's
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
#include "quant/repack_simd.h"

namespace glm5::quant::repacked {

namespace {

constexpr int kTile = 16;  // tokens per decoded group block
// Groups the few-token kernels read side by side (see the tile tables).
constexpr int kStreams = 4;

// Groups [0, n) as kStreams runs of q = n / kStreams: f(gs) with group i of
// every run (gs[s] = s * q + i) for each i, so the runs are read side by
// side; returns the groups covered (the rest go one at a time).
template <typename F>
int64_t side_by_side(int64_t n, F f) {
    const int64_t q = n / kStreams;
    for (int64_t i = 0; i < q; ++i) {
        int64_t gs[kStreams];
        for (int s = 0; s < kStreams; ++s) gs[s] = s * q + i;
        f(static_cast<const int64_t*>(gs));
    }
    return kStreams * q;
}

inline __m512i load(const void* p) {
    return _mm512_loadu_si512(p);
}

// Asks for the Bytes at base + ahead into L1 (and the outer caches). The
// K-quant kernels stream a matrix once per call (memory bound when it is
// large and the tokens few) and prefetch the block two ahead of the one they
// compute, a few lines per step: the hardware prefetchers alone reach a
// fraction of the bandwidth on these streams. prefetcht0, not prefetchnta:
// NTA gained a few percent of decode on some CPUs but lost more on others,
// up to 2x with several tokens per pass (longer between prefetch and use),
// the lines apparently leaving L1 before they were read. Two blocks ahead
// measured best (one or three slower with NTA, four no better with T0).
//
// The address is computed as an integer: past the end of the matrix it is
// harmless (prefetches do not fault). Volatile asm rather than _mm_prefetch:
// GCC counts the prefetch builtin as free of side effects, so a function
// holding only prefetches that is not inlined early is found const and its
// calls deleted (which is how the Q5_0 / Q8_0 GEMV's prefetch had silently
// vanished).
template <int Bytes>
inline void prefetch(const void* base, size_t ahead) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(base) + ahead;
#pragma GCC unroll 8
    for (int i = 0; i < Bytes; i += 64)
        asm volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(p + size_t(i))));
}

// 4 bytes in every lane (the Q6_K bsums pairs of q6k_finish's vpdpwssd).
inline __m512i bcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// s = w . (the 4 bytes at q in every lane), from zero / accumulated: the
// bytes through vpdpbusd's embedded broadcast (GCC loads them with a separate
// vpbroadcastd, or shuffles them out of a wider load: one more port 5 op per
// dot), the zero an xor idiom (GCC copies a zero register). In cache: Q4_K
// GEMM 1.13-1.22x faster, Q6_K 1.05-1.19x, Q5_0 at 4 tokens 1.04-1.11x.
inline __m512i dp_first(__m512i w, const int8_t* q) {
    __m512i s;
    asm("vpxord %0, %0, %0\n\tvpdpbusd %2%{1to16%}, %1, %0"
        : "=&v"(s)
        : "v"(w), "m"(*reinterpret_cast<const int32_t*>(q)));
    return s;
}

inline void dp_next(__m512i& s, __m512i w, const int8_t* q) {
    asm("vpdpbusd %2%{1to16%}, %1, %0"
        : "+v"(s)
        : "v"(w), "m"(*reinterpret_cast<const int32_t*>(q)));
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
            q4k_pairs(y, a.pairs[t]);
        }
}

// Float sums of a tile, kept in memory: the integer sums need the registers.
struct alignas(64) TileSums {
    float v[kTile][kRows];
};

// ---------------------------------------------------------------- Q4_K
// Tokens up to which a token's integer sum is split over two accumulators:
// with few tokens the chain of vpdpwssd through one sum would be the
// critical path.
template <int T>
constexpr int kQ4KSplit = T <= 2 ? 2 : 1;

// Sub-block j of all tokens: w holds its 32 levels of the 16 rows (8 x 4),
// sc the sub-block's scale in the low half of each lane (high half zero).
// Each half-dot s0 / s1 covers 16 values: |s| <= 16 * 15 * 128 < 2^15, so its
// low 16 bits are the whole value and one vpdpwssd against sc adds s * scale
// (the high half meets the zero) -- 2 instructions where vpmulld + vpaddd
// cost 3 micro-ops on the ports the vpdpbusd need: 1.11-1.17x faster GEMM at
// 2-8 tokens with the same integers.
template <int T>
inline void q4k_sub_block(const __m512i* w, __m512i sc, const int8_t* q, __m512i* isum) {
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
        const int8_t* qt = q + t * QK_K;
        __m512i s0 = dp_first(w[0], qt);
        __m512i s1 = dp_first(w[1], qt + 4);
        dp_next(s0, w[2], qt + 8);
        dp_next(s1, w[3], qt + 12);
        dp_next(s0, w[4], qt + 16);
        dp_next(s1, w[5], qt + 20);
        dp_next(s0, w[6], qt + 24);
        dp_next(s1, w[7], qt + 28);
        isum[t] = _mm512_dpwssd_epi32(isum[t], s0, sc);
        __m512i& other = isum[(kQ4KSplit<T> - 1) * T + t];
        other = _mm512_dpwssd_epi32(other, s1, sc);
    }
}

// Groups gb[0 .. S) side by side (kStreams), each a stream of its own: the
// k-th 512 bytes of every group's block in turn. Each group's sums are the
// single group's, in the same order.
template <int T, int S>
void q4k_tile(int64_t nb, const Q4KGroupBlock* const* gb, const ActBlock* ab, float* const* out,
              const int64_t* off) {
    TileSums acc[S];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
        for (int t = 0; t < T; ++t) _mm512_store_ps(acc[s].v[t], _mm512_setzero_ps());
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const ActBlock& a = ab[b];
        constexpr size_t ahead = 2 * sizeof(Q4KGroupBlock);
        __m512i isum[S][kQ4KSplit<T> * T];
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            prefetch<320>(&gb[s][b], ahead);  // d, dmin, scales and mins
#pragma GCC unroll 16
            for (int t = 0; t < kQ4KSplit<T> * T; ++t) isum[s][t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 1
        for (int k = 0; k < 4; ++k) {
#pragma GCC unroll 4
            for (int s = 0; s < S; ++s) {
                const Q4KGroupBlock& g = gb[s][b];
                prefetch<512>(&g.qs[k][0], ahead);
                __m512i w[8];
#pragma GCC unroll 8
                for (int c = 0; c < 8; ++c) w[c] = _mm512_and_si512(load(g.qs[k][c]), low4);
                q4k_sub_block<T>(w,
                                 _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(g.scales[2 * k]))),
                                 a.qs[0] + 64 * k, isum[s]);
#pragma GCC unroll 8
                for (int c = 0; c < 8; ++c)
                    w[c] = _mm512_and_si512(_mm512_srli_epi16(load(g.qs[k][c]), 4), low4);
                q4k_sub_block<T>(w,
                                 _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(g.scales[2 * k + 1]))),
                                 a.qs[0] + 64 * k + 32, isum[s]);
            }
        }
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            const Q4KGroupBlock& g = gb[s][b];
            if constexpr (kQ4KSplit<T> == 2)
#pragma GCC unroll 2
                for (int t = 0; t < T; ++t)
                    isum[s][t] = _mm512_add_epi32(isum[s][t], isum[s][T + t]);
            __m512i mp[4];
            q4k_mins(g, mp);
            const __m512 dx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.d)));
            const __m512 mx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.dmin)));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t)
                _mm512_store_ps(acc[s].v[t], finish(_mm512_load_ps(acc[s].v[t]), dx, mx, a.d[t],
                                                    isum[s][t], q4k_summs(mp, a.pairs[t])));
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
        for (int t = 0; t < T; ++t) _mm512_storeu_ps(out[t] + off[s], _mm512_load_ps(acc[s].v[t]));
}

// ---------------------------------------------------------------- Q6_K
// Per chunk c of half h the three vectors ql, qh, ql1 give the levels
// u6 = low nibble | top bits << 4 of values 128h + 32j + 4c.. for j = 0..3
// (sub-block 8h + 2j + c / 4); q6k_level<j>(l, qh) makes row j's from l = ql
// (j even) or ql1 (j odd).
// The level is q = u6 - 32, so per sub-block sum(q * y) = sum(u6 * y) - 32 *
// bsum, and the correction of the whole block is 32 * sum_j scale_j * bsum_j
// (one vpdpwssd per pair of sub-blocks, q6k_finish()). isum = sum_j scale_j *
// dot_j is the single-row kernel's integer, summed in another order (exact in
// int32).

// acc + dx * d * (isum - 32 * sum_j scale_j * bsum_j) for one token.
inline __m512 q6k_finish(__m512 acc, const Q6KGroupBlock& g, __m512 dx, const int16_t* bs, float d,
                         __m512i isum) {
    __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        c0 = _mm512_dpwssd_epi32(
            c0,
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.scales[i]))),
            bcast4(bs + 2 * i));
        c1 = _mm512_dpwssd_epi32(c1,
                                 _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                     reinterpret_cast<const __m256i*>(g.scales[i + 1]))),
                                 bcast4(bs + 2 * i + 2));
    }
    const __m512i corr = _mm512_slli_epi32(_mm512_add_epi32(c0, c1), 5);
    return finish(acc, dx, d, _mm512_sub_epi32(isum, corr));
}

// One token (decode's GEMV): every weight vector is loaded once, in layout
// order, the four sub-blocks of a chunk in flight together (latency, not
// registers, bounds one token). The first pass over a group prefetches two
// blocks ahead (the hardware prefetchers alone left the stream at half the
// bandwidth). S groups side by side as in q4k_tile, 768 bytes of each in turn
// (four of a half's eight chunks).
template <int T0, int S>
void q6k_one(int64_t nb, const Q6KGroupBlock* const* gb, const ActBlock* ab, float* const* out,
             const int64_t* off) {
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[S];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) acc[s] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const int8_t* q = ab[b].qs[T0];
        constexpr size_t ahead = 2 * sizeof(Q6KGroupBlock);
        constexpr bool pf = T0 == 0;  // later passes over the group find it in cache
        __m512i isum[S];
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            if constexpr (pf) prefetch<320>(&gb[s][b], ahead);  // d and scales
            isum[s] = zero;
        }
#pragma GCC unroll 1
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
            for (int ch = 0; ch < 2; ++ch) {
#pragma GCC unroll 1
                for (int s = 0; s < S; ++s) {
                    const Q6KGroupBlock::Half& hf = gb[s][b].half[h];
                    __m512i sj[4];
#pragma GCC unroll 4
                    for (int k = 0; k < 4; ++k) {
                        const int c = 4 * ch + k;
                        if constexpr (pf) prefetch<192>(&hf.lq[c], ahead);
                        const __m512i l0 = load(hf.lq[c].ql), l1 = load(hf.lq[c].ql1);
                        const __m512i qh = load(hf.lq[c].qh);
                        const int8_t* qc = q + 128 * h + 4 * c;
                        const __m512i v[4] = {q6k_level<0>(l0, qh), q6k_level<1>(l1, qh),
                                              q6k_level<2>(l0, qh), q6k_level<3>(l1, qh)};
#pragma GCC unroll 4
                        for (int j = 0; j < 4; ++j) {
                            if (k == 0)
                                sj[j] = dp_first(v[j], qc + 32 * j);
                            else
                                dp_next(sj[j], v[j], qc + 32 * j);
                        }
                    }
#pragma GCC unroll 4
                    for (int j = 0; j < 4; ++j)
                        isum[s] = _mm512_add_epi32(
                            isum[s], _mm512_mullo_epi32(sj[j], q6k_scale(gb[s][b], h, j, ch)));
                }
            }
        }
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            const __m512 dx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[s][b].d)));
            acc[s] = q6k_finish(acc[s], gb[s][b], dx, ab[b].bsums[T0], ab[b].d[T0], isum[s]);
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) _mm512_storeu_ps(out[T0] + off[s], acc[s]);
}

// Tokens T0 .. T0 + T - 1 (2 <= T <= 8): one sub-block at a time, T sums in
// registers. Sub-block j of a chunk reloads the chunk's vectors it needs (L1
// hits); in flight together, the sub-blocks' 4 x T sums spilled (the earlier
// chunk-major kernel, which also ran 4 tokens per pass, streamed a large
// matrix 1.1-1.25x slower at 2-4 tokens and 1.9-2.3x slower at 6-8).
template <int J, int T>
inline void q6k_sub_block(const Q6KGroupBlock& g, int h, int ch, const int8_t* q, bool pf,
                          __m512i* isum) {
    const Q6KGroupBlock::Half& hf = g.half[h];
    __m512i s[T];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const int c = 4 * ch + k;
        if (J == 0 && pf) prefetch<192>(&hf.lq[c], 2 * sizeof(Q6KGroupBlock));
        const __m512i qh = load(hf.lq[c].qh);
        const __m512i w = q6k_level<J>(load(J % 2 == 0 ? hf.lq[c].ql : hf.lq[c].ql1), qh);
        const int8_t* qc = q + 128 * h + 4 * c + 32 * J;
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
            if (k == 0)
                s[t] = dp_first(w, qc + t * QK_K);
            else
                dp_next(s[t], w, qc + t * QK_K);
        }
    }
    const __m512i sc = q6k_scale(g, h, J, ch);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s[t], sc));
        // Pins the product here: GCC otherwise sinks the multiplies past the
        // next sub-blocks and spills their sums.
        asm volatile("" : "+v"(isum[t]));
    }
}

// S groups side by side (as q6k_one), each group's sums the single group's.
template <int T, int T0, int S>
void q6k_tokens(int64_t nb, const Q6KGroupBlock* const* gb, const ActBlock* ab, float* const* out,
                const int64_t* off) {
    static_assert(T >= 2 && T <= 8);
    TileSums acc[S];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) _mm512_store_ps(acc[s].v[t], _mm512_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const int8_t* q = ab[b].qs[T0];
        constexpr bool pf = T0 == 0;
        __m512i isum[S][T];
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            if constexpr (pf) prefetch<320>(&gb[s][b], 2 * sizeof(Q6KGroupBlock));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t) isum[s][t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 1
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 1
            for (int ch = 0; ch < 2; ++ch)
#pragma GCC unroll 1
                for (int s = 0; s < S; ++s) {
                    const Q6KGroupBlock& g = gb[s][b];
                    q6k_sub_block<0, T>(g, h, ch, q, pf, isum[s]);
                    q6k_sub_block<1, T>(g, h, ch, q, pf, isum[s]);
                    q6k_sub_block<2, T>(g, h, ch, q, pf, isum[s]);
                    q6k_sub_block<3, T>(g, h, ch, q, pf, isum[s]);
                }
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) {
            const Q6KGroupBlock& g = gb[s][b];
            const __m512 dx =
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.d)));
#pragma GCC unroll 16
            for (int t = 0; t < T; ++t)
                _mm512_store_ps(acc[s].v[t],
                                q6k_finish(_mm512_load_ps(acc[s].v[t]), g, dx, ab[b].bsums[T0 + t],
                                           ab[b].d[T0 + t], isum[s][t]));
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t)
            _mm512_storeu_ps(out[T0 + t] + off[s], _mm512_load_ps(acc[s].v[t]));
}

// ---------------------------------------------------------------- Q8_0 / Q5_0
// The reference (dot_q8_0_avx512 / dot_q5_0_avx512) keeps 16 float lanes:
// lane c (< 8) accumulates d_b * isum_b,c for the even blocks b of the row
// and lane 8 + c for the odd ones, one FMA per block pair, where isum_b,c is
// the exact integer dot of values 4c..4c+3 of block b and d_b = fp16(x.d) *
// fp16(y.d) rounded; then the lanes are summed as GCC's _mm512_reduce_add_ps
// does (halves, quarters, pairs); an odd last block adds d * isum (its integer
// sum exact) with one FMA (the reference's std::fma). Here each of those 16 lanes is one zmm
// accumulator holding the 16 rows, so a token needs 16 registers: tokens are done one at a time,
// each a pass over the group's blocks (Q5_0: the group decoded once per run of tokens into a
// buffer).
//
// The integer dots are exact. The reference's Q8_0 product moves the weight's
// sign onto the activation, which wraps for an activation of -128; the
// activation quantizer writes no -128 for finite inputs, and for those both
// are the true dot.
//
// Each pair prefetches the one four ahead (prefetch()): one thread streaming
// a large matrix ran 1.2-1.3x faster with it (Q8_0, one token) and 1.3-1.5x
// (Q5_0, 2-4 tokens); two ahead gained less, six or eight no more.

// One Q8_0 activation block, prepared once per call.
struct alignas(32) LegacyAct {
    int32_t q[8];     // bytes 4c..4c+3 (the broadcast operand of vpdpbusd)
    int32_t bias[8];  // -K * (sum of those 4 bytes): the weights are stored + K
    float d;
};

// K = the offset of the stored unsigned levels: 128 for Q8_0, 16 for Q5_0.
void load_legacy_acts(const BlockQ8_0* const* acts, int64_t nt, int64_t nb, int K, LegacyAct* out) {
    const __m256i k = _mm256_set1_epi8(char(K));
    for (int64_t t = 0; t < nt; ++t)
        for (int64_t b = 0; b < nb; ++b) {
            const BlockQ8_0& y = acts[t][b];
            LegacyAct& a = out[t * nb + b];
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q), q);
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), k, q);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.bias),
                                _mm256_sub_epi32(_mm256_setzero_si256(), s));
            a.d = _cvtsh_ss(y.d);
        }
}

// Integer dots of one block's 8 groups of 4 values (w: levels + K of the 16
// rows) with the token's block: exact, the offset K removed (the sums start
// from the bias). An earlier in-lane shuffle of a 16-byte broadcast had beaten
// a separate broadcast load per group; the embedded broadcast beats both.
inline void legacy_dots(const __m512i* w, const LegacyAct& y, __m512i* dot) {
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
        __m512i s = _mm512_set1_epi32(y.bias[c]);
        dp_next(s, w[c], reinterpret_cast<const int8_t*>(y.q + c));
        dot[c] = s;
    }
}

// Block b of a group for one token: acc[c] += d_b * isum_b,c (acc: the 8
// lanes of b's parity). Src gives block b's 8 level vectors and its 16
// weight scales as floats.
template <typename Src>
[[gnu::always_inline]] inline void legacy_step(const Src& src, int64_t b, const LegacyAct& y,
                                               __m512* acc) {
    __m512i w[8];
    __m512 dx;
    src.block(b, w, dx);
    const __m512 d = _mm512_mul_ps(dx, _mm512_set1_ps(y.d));
    __m512i dot[8];
    legacy_dots(w, y, dot);
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot[c]), acc[c]);
}

// The 16 rows' results from a group's lane sums (the reference's reduction),
// with an odd last block added.
template <typename Src>
inline __m512 legacy_sum(const __m512* acc, int64_t nb, const Src& src, const LegacyAct* a) {
    __m512 h[8], q[4];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) h[j] = _mm512_add_ps(acc[8 + j], acc[j]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) q[j] = _mm512_add_ps(h[4 + j], h[j]);
    __m512 sum = _mm512_add_ps(_mm512_add_ps(q[0], q[2]), _mm512_add_ps(q[1], q[3]));
    if (nb % 2 == 1) {
        __m512i w[8];
        __m512 dx;
        src.block(nb - 1, w, dx);
        const LegacyAct& y = a[nb - 1];
        __m512i dot[8];
        legacy_dots(w, y, dot);
        __m512i is = dot[0];
#pragma GCC unroll 8
        for (int c = 1; c < 8; ++c) is = _mm512_add_epi32(is, dot[c]);
        sum = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(y.d)), _mm512_cvtepi32_ps(is), sum);
    }
    return sum;
}

// One token against one group: the 16 rows' results.
template <typename Src>
inline __m512 legacy_row(int64_t nb, const Src& src, const LegacyAct* a) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
    for (int64_t p = 0; p < nb / 2; ++p) {
        legacy_step(src, 2 * p, a[2 * p], acc);
        legacy_step(src, 2 * p + 1, a[2 * p + 1], acc + 8);
    }
    return legacy_sum(acc, nb, src, a);
}

// One token against kStreams groups side by side, a pair of blocks of each
// in turn (the streams of q4k_tile); their 16 lane sums each live in L1, as
// a group's alone fill half the registers. The same sums as legacy_row's.
template <typename Src>
inline void legacy_rows(int64_t nb, const Src* src, const LegacyAct* a, float* const* out) {
    __m512 acc[kStreams][16];
#pragma GCC unroll 1
    for (int s = 0; s < kStreams; ++s)
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) acc[s][l] = _mm512_setzero_ps();
    for (int64_t p = 0; p < nb / 2; ++p)
#pragma GCC unroll 1
        for (int s = 0; s < kStreams; ++s) {
            legacy_step(src[s], 2 * p, a[2 * p], acc[s]);
            legacy_step(src[s], 2 * p + 1, a[2 * p + 1], acc[s] + 8);
        }
#pragma GCC unroll 1
    for (int s = 0; s < kStreams; ++s) _mm512_storeu_ps(out[s], legacy_sum(acc[s], nb, src[s], a));
}

// Block b of a group: pair b / 2, or the single block after the pairs.
// Forced inline with the Src::block callers: GCC kept it a call that passed
// the 8 level vectors through memory, 1.12-1.22x slower for Q5_0.
template <typename Pair, typename One, typename F>
[[gnu::always_inline]] inline void legacy_unit(const uint8_t* group, int64_t nb, int64_t b, F f) {
    if (b % 2 == 0) prefetch<sizeof(Pair)>(group + size_t(b / 2) * sizeof(Pair), 4 * sizeof(Pair));
    if (nb % 2 == 1 && b == nb - 1)
        f(*reinterpret_cast<const One*>(group + size_t(nb / 2) * sizeof(Pair)), 0);
    else
        f(reinterpret_cast<const Pair*>(group)[b / 2], int(b % 2));
}

inline __m512 scales16(const uint16_t* d) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
}

// Q8_0 levels are stored ready (+128).
struct Q80Src {
    const uint8_t* group;
    int64_t nb;
    [[gnu::always_inline]] void block(int64_t b, __m512i* w, __m512& dx) const {
        auto levels = [&](const auto& u, int e) [[gnu::always_inline]] {
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) w[c] = load(u.qs[e][c]);
            dx = scales16(u.d[e]);
        };
        legacy_unit<Q80GroupPair, Q80GroupOne>(group, nb, b, levels);
    }
};

// Q5_0 levels: the nibble, plus 16 where the fifth-bit mask is set.
struct Q50Src {
    const uint8_t* group;
    int64_t nb;
    [[gnu::always_inline]] void block(int64_t b, __m512i* w, __m512& dx) const {
        auto levels = [&](const auto& u, int e) [[gnu::always_inline]] {
            const __m512i low4 = _mm512_set1_epi8(0x0F), five = _mm512_set1_epi8(0x10);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const __m512i v = load(u.qs[e][c]);
                const __m512i lo = _mm512_and_si512(v, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                w[c] = _mm512_mask_add_epi8(lo, _cvtu64_mask64(u.qh[e][c]), lo, five);
                w[c + 4] = _mm512_mask_add_epi8(hi, _cvtu64_mask64(u.qh[e][c + 4]), hi, five);
            }
            dx = scales16(u.d[e]);
        };
        legacy_unit<Q50GroupPair, Q50GroupOne>(group, nb, b, levels);
    }
};

// A group decoded once for a run of tokens: per block 8 level vectors and
// the scales.
struct alignas(64) DecodedBlock {
    uint8_t w[8][64];
    float dx[kRows];
};

struct DecodedSrc {
    const DecodedBlock* blocks;
    void block(int64_t b, __m512i* out, __m512& d) const {
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) out[c] = _mm512_load_si512(blocks[b].w[c]);
        d = _mm512_load_ps(blocks[b].dx);
    }
};

// Blocks per row from which one token reads groups side by side: a large
// Q8_0 matrix of 2048-value rows streamed 1.12x faster that way, but
// attn_k_b's 192-value rows (a short run of small groups per call) 1.15x
// slower, the sums in L1 costing more than the streams gained.
constexpr int64_t kLegacyStreamBlocks = 16;

template <typename Src>
void legacy_gemm(int64_t nb, const uint8_t* groups, size_t group_bytes, int64_t n_groups,
                 const BlockQ8_0* const* acts, int64_t n_tok, float* const* y_rows, int K,
                 bool decode_once) {
    // Tokens per call to the preparation: their activations stay in L2.
    const int64_t chunk =
        std::clamp<int64_t>((int64_t(1) << 18) / (nb * int64_t(sizeof(LegacyAct))), 1, 64);
    thread_local std::vector<LegacyAct> act;
    thread_local std::vector<DecodedBlock> dec_buf;
    if (act.size() < size_t(chunk * nb)) act.resize(size_t(chunk * nb));
    if (decode_once && dec_buf.size() < size_t(nb)) dec_buf.resize(size_t(nb));
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const int64_t nt = std::min(chunk, n_tok - t0);
        load_legacy_acts(acts + t0, nt, nb, K, act.data());
        int64_t g = 0;
        if (nt == 1 && n_groups >= kStreams && nb >= kLegacyStreamBlocks) {
            g = side_by_side(n_groups, [&](const int64_t* gs) {
                Src src[kStreams];
                float* out[kStreams];
                for (int s = 0; s < kStreams; ++s) {
                    src[s] = Src{groups + size_t(gs[s]) * group_bytes, nb};
                    out[s] = y_rows[t0] + kRows * gs[s];
                }
                legacy_rows(nb, src, act.data(), out);
            });
        }
        for (; g < n_groups; ++g) {
            const Src src{groups + size_t(g) * group_bytes, nb};
            if (decode_once && nt > 1) {
                for (int64_t b = 0; b < nb; ++b) {
                    __m512i w[8];
                    __m512 dx;
                    src.block(b, w, dx);
                    DecodedBlock& o = dec_buf[size_t(b)];
                    for (int c = 0; c < 8; ++c) _mm512_store_si512(o.w[c], w[c]);
                    _mm512_store_ps(o.dx, dx);
                }
                const DecodedSrc dec{dec_buf.data()};
                for (int64_t t = 0; t < nt; ++t)
                    _mm512_storeu_ps(y_rows[t0 + t] + kRows * g,
                                     legacy_row(nb, dec, act.data() + t * nb));
            } else if (nt == 1) {
                _mm512_storeu_ps(y_rows[t0] + kRows * g, legacy_row(nb, src, act.data()));
            } else {
                for (int64_t t = 0; t < nt; ++t)
                    _mm512_storeu_ps(y_rows[t0 + t] + kRows * g,
                                     legacy_row(nb, src, act.data() + t * nb));
            }
        }
    }
}

size_t legacy_bytes(int64_t nb, size_t pair, size_t one) {
    return size_t(nb / 2) * pair + size_t(nb % 2) * one;
}

// Tile kernels for 1..kTile tokens (so a remainder costs one decode too),
// one group at a time; and for the fewest tokens, kStreams groups side by
// side. DRAM serves several interleaved streams per core faster than one
// (four streams in 512-byte pieces read about a quarter faster than one
// where measured); coarser pieces (a whole 2.3 KB block) lose most of it, so
// the interleave lives inside the kernels. It pays on a large matrix (as
// batched decode reads its dense matrices) for Q4_K at 1-8 tokens and Q6_K at
// 1-4, though slower in cache: one thread over 256 MiB, one stream against
// four, Q4_K 26.8 -> 22.5 ms at 8 tokens and 25.0 -> 18.2 at 5; Q6_K 27.0 ->
// 17.5 at 2 and 24.0 -> 19.7 at 4 (at 8 no gain: compute bound).
using TileFn = void (*)(int64_t, const uint8_t* const*, const ActBlock*, float* const*,
                        const int64_t*);

template <template <int, int> class K, int S, int... Ts>
constexpr auto tile_table(std::integer_sequence<int, Ts...>) {
    return std::array<TileFn, sizeof...(Ts)>{&K<Ts + 1, S>::run...};
}

template <int T, int S>
struct Q4KTile {
    static void run(int64_t nb, const uint8_t* const* gb, const ActBlock* ab, float* const* out,
                    const int64_t* off) {
        q4k_tile<T, S>(nb, reinterpret_cast<const Q4KGroupBlock* const*>(gb), ab, out, off);
    }
};

// Tokens T0 .. T0 + T - 1 in passes of up to 8 over the groups, the later
// passes from cache.
template <int T, int T0, int S>
void q6k_passes(int64_t nb, const Q6KGroupBlock* const* g, const ActBlock* ab, float* const* out,
                const int64_t* off) {
    if constexpr (T == 1) {
        q6k_one<T0, S>(nb, g, ab, out, off);
    } else if constexpr (T <= 8) {
        q6k_tokens<T, T0, S>(nb, g, ab, out, off);
    } else {
        q6k_tokens<8, T0, S>(nb, g, ab, out, off);
        q6k_passes<T - 8, T0 + 8, S>(nb, g, ab, out, off);
    }
}

template <int T, int S>
struct Q6KTile {
    static void run(int64_t nb, const uint8_t* const* gb, const ActBlock* ab, float* const* out,
                    const int64_t* off) {
        q6k_passes<T, 0, S>(nb, reinterpret_cast<const Q6KGroupBlock* const*>(gb), ab, out, off);
    }
};

// The kernels of K<T, S> for 1..kTile tokens one group at a time, and for
// 1..Streamed tokens kStreams groups side by side.
template <template <int, int> class K, int Streamed>
struct TileTables {
    static constexpr auto one = tile_table<K, 1>(std::make_integer_sequence<int, kTile>());
    static constexpr auto streams =
        tile_table<K, kStreams>(std::make_integer_sequence<int, Streamed>());
};

// Groups [0, n_groups): with few tokens in kStreams runs of q groups read
// side by side (group i of each run together), then the rest one at a time.
template <template <int, int> class K, int Streamed>
void gemm(int64_t nb, const uint8_t* groups, size_t group_bytes, int64_t n_groups,
          const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    thread_local std::vector<ActBlock> tile;
    if (tile.size() < size_t(nb)) tile.resize(size_t(nb));
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTile) {
        const int64_t nt = std::min<int64_t>(kTile, n_tok - t0);
        load_tile(acts + t0, nt, nb, tile.data());
        int64_t g = 0;
        if (nt <= Streamed && n_groups >= kStreams) {
            g = side_by_side(n_groups, [&](const int64_t* gs) {
                const uint8_t* gb[kStreams];
                int64_t off[kStreams];
                for (int s = 0; s < kStreams; ++s) {
                    gb[s] = groups + size_t(gs[s]) * group_bytes;
                    off[s] = kRows * gs[s];
                }
                TileTables<K, Streamed>::streams[size_t(nt - 1)](nb, gb, tile.data(), y_rows + t0,
                                                                 off);
            });
        }
        for (; g < n_groups; ++g) {
            const uint8_t* gb = groups + size_t(g) * group_bytes;
            const int64_t off = kRows * g;
            TileTables<K, Streamed>::one[size_t(nt - 1)](nb, &gb, tile.data(), y_rows + t0, &off);
        }
    }
}

}  // namespace

void gemm_q8_0_avx512(int64_t nb, const void* groups, int64_t n_groups,
                      const BlockQ8_0* const* acts, int64_t n_tok, float* const* y_rows) {
    legacy_gemm<Q80Src>(nb, static_cast<const uint8_t*>(groups),
                        legacy_bytes(nb, sizeof(Q80GroupPair), sizeof(Q80GroupOne)), n_groups, acts,
                        n_tok, y_rows, 128, false);
}

void gemm_q5_0_avx512(int64_t nb, const void* groups, int64_t n_groups,
                      const BlockQ8_0* const* acts, int64_t n_tok, float* const* y_rows) {
    legacy_gemm<Q50Src>(nb, static_cast<const uint8_t*>(groups),
                        legacy_bytes(nb, sizeof(Q50GroupPair), sizeof(Q50GroupOne)), n_groups, acts,
                        n_tok, y_rows, 16, true);
}

void gemm_q4_K_avx512(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    gemm<Q4KTile, 8>(nb, reinterpret_cast<const uint8_t*>(groups),
                     size_t(nb) * sizeof(Q4KGroupBlock), n_groups, acts, n_tok, y_rows);
}

void gemm_q6_K_avx512(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows) {
    gemm<Q6KTile, 4>(nb, reinterpret_cast<const uint8_t*>(groups),
                     size_t(nb) * sizeof(Q6KGroupBlock), n_groups, acts, n_tok, y_rows);
}

}  // namespace glm5::quant::repacked

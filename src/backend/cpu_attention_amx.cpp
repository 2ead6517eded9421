// MLA attention of one query on AMX-BF16 tiles (cpu_attention_amx.h).
//   scores: C[key][head] += K (16 keys x 32 dims) . Q^T (32 dims x 16 heads),
//           the cache rows converted to BF16 in blocks, in their natural layout;
//   softmax over the keys of each head (one vector holds a key's 16 heads),
//           then the probabilities transposed to [head][key] BF16;
//   values: C[head][col] += P (16 heads x 32 keys) . V (32 keys x 16 cols),
//           pairs of value rows interleaved as the tile product reads them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "backend/cpu_attention_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "backend/avx512_exp.h"
#include "quant/amx_tiles.h"
#include "quant/ops.h"

namespace glm5::backend::cpu::amx_bf16 {

namespace {

__mmask16 lanes(int64_t n) {
    return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

__m512i to_bf16(__m512 hi, __m512 lo) {
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// 16 values [c, c + 16) of an F16 or F32 row as floats, zero from w on.
__m512 load16(const uint8_t* r, Elem e, int64_t c, int64_t w) {
    const __mmask16 m = lanes(w - c);
    if (e == Elem::F16)
        return _mm512_cvtph_ps(
            _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(r) + c));
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(r) + c);
}

// 32 values [c, c + 32) of a row as BF16, zero from w on. Inlined: the
// gathers call it for every 64 bytes they read.
[[gnu::always_inline]] inline __m512i load32_bf16(const uint8_t* r, Elem e, int64_t c, int64_t w) {
    if (e == Elem::F16 && c + 32 <= w) {  // the common case: whole, no masks
        const auto* h = reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(r) + c);
        return to_bf16(_mm512_cvtph_ps(_mm256_loadu_si256(h + 1)),
                       _mm512_cvtph_ps(_mm256_loadu_si256(h)));
    }
    if (e == Elem::BF16) {
        const int64_t n = std::clamp<int64_t>(w - c, 0, 32);
        const __mmask32 m = n == 32 ? __mmask32(~0u) : __mmask32((1u << n) - 1);
        return _mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(r) + c);
    }
    return to_bf16(load16(r, e, c + 16, w), load16(r, e, c, w));
}

// r[i] (16 floats each) becomes column i of the 16 x 16 block.
void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    auto lo = [](__m512 a, __m512 b) {
        return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    auto hi = [](__m512 a, __m512 b) {
        return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    for (int i = 0; i < 4; ++i) {
        r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
    }
    // r[4i + e] now holds, in 128-bit block b, element 4b + e of rows 4i .. 4i + 3.
    __m512 o[16];
    for (int e = 0; e < 4; ++e) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
        const __m512 u1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
        const __m512 v0 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
        o[e] = _mm512_shuffle_f32x4(u0, v0, 0x88);
        o[8 + e] = _mm512_shuffle_f32x4(u0, v0, 0xdd);
        o[4 + e] = _mm512_shuffle_f32x4(u1, v1, 0x88);
        o[12 + e] = _mm512_shuffle_f32x4(u1, v1, 0xdd);
    }
    for (int i = 0; i < 16; ++i) r[i] = o[i];
}

// Asks for a row's cache lines (into L2): the rows the kernels read are scattered.
void prefetch_row(const uint8_t* row, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(row) + off, _MM_HINT_T1);
}

// Up to 16 heads' rows (w floats each, w apart) as B tiles: [wp/32 chunks]
// [16 dim pairs][16 heads][2] BF16, zero past w and for heads past nh.
void heads_as_b_tiles(const float* q, int64_t nh, int64_t w, int64_t wp, uint16_t* out) {
    LineVector<uint16_t> qb(size_t(16 * wp), 0);
    for (int64_t h = 0; h < nh; ++h) {
        const auto* row = reinterpret_cast<const uint8_t*>(q + h * w);
        for (int64_t c = 0; c < wp; c += 32)
            _mm512_store_si512(qb.data() + h * wp + c, load32_bf16(row, Elem::F32, c, w));
    }
    const __m512i heads =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(int32_t(wp / 2)));
    for (int64_t d = 0; d < wp / 2; ++d)  // dim pair d: its dword for each head
        _mm512_storeu_si512(out + d * 32, _mm512_i32gather_epi32(heads, qb.data() + 2 * d, 4));
}

}  // namespace

void round_row(const float* x, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes(n - i);
        const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_mask_storeu_epi16(out + i, m, reinterpret_cast<const __m256i&>(v));
    }
}

bool available() {
    return quant::cpu_has_amx_bf16() || quant::cpu_has_bf16_vectors();
}

namespace {

// The tile operations the kernels below are written in, on the AMX unit. The
// intrinsics spell a tile's number into their instruction, so it must be a
// literal: each template picks its literal.
#define GLM5_TILE_LITERAL(I, CALL) \
    if constexpr (I == 0)          \
        CALL(0);                   \
    else if constexpr (I == 1)     \
        CALL(1);                   \
    else if constexpr (I == 2)     \
        CALL(2);                   \
    else if constexpr (I == 3)     \
        CALL(3);                   \
    else if constexpr (I == 4)     \
        CALL(4);                   \
    else if constexpr (I == 5)     \
        CALL(5);                   \
    else if constexpr (I == 6)     \
        CALL(6);                   \
    else                           \
        CALL(7)
struct AmxTileOps {
    static constexpr bool kScoreUnion = true;     // a run's queries score their rows' union
    static constexpr bool kPrefetchNext = false;  // not measured on the tiles
    quant::AmxTiles config;                       // the tiles are the thread's while this lives
    template <int I>
    void zero() {
#define GLM5_ZERO(t) _tile_zero(t)
        GLM5_TILE_LITERAL(I, GLM5_ZERO);
#undef GLM5_ZERO
    }
    template <int I>
    void load(const void* p, int64_t ld) {
#define GLM5_LOAD(t) _tile_loadd(t, p, ld)
        GLM5_TILE_LITERAL(I, GLM5_LOAD);
#undef GLM5_LOAD
    }
    // C += A . B for the (C, A, B) the kernels use.
    template <int C, int A, int B>
    void dp() {
#define GLM5_DP(c, a, b) else if constexpr (C == c && A == a && B == b) _tile_dpbf16ps(c, a, b)
        if constexpr (false) {
        }
        GLM5_DP(0, 4, 5);
        GLM5_DP(1, 6, 5);
        GLM5_DP(2, 4, 5);
        GLM5_DP(3, 6, 5);
        GLM5_DP(1, 4, 7);
        GLM5_DP(3, 4, 7);
        GLM5_DP(0, 4, 6);
        GLM5_DP(1, 5, 6);
        GLM5_DP(2, 4, 7);
        GLM5_DP(3, 5, 7);
        else static_assert(C < 0, "a tile product the kernels do not use: add it here");
#undef GLM5_DP
    }
    template <int I>
    void store(void* p, int64_t ld) {
#define GLM5_STORE(t) _tile_stored(t, p, ld)
        GLM5_TILE_LITERAL(I, GLM5_STORE);
#undef GLM5_STORE
    }
};
#undef GLM5_TILE_LITERAL

// The same operations on AVX-512 BF16 dot products, for CPUs without the
// tiles: C[m][n] += A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1] over k, as
// _tile_dpbf16ps, with each C row a vector and each A pair broadcast. The
// math of the tile product, not its bits (the tile unit's rounding inside a
// product is its own). A loaded tile is its source's address: the kernels
// leave a source unchanged until the products that read it are done.
struct VectorTileOps {
    static constexpr bool kScoreUnion = false;   // each query of a run scores its own rows
    static constexpr bool kPrefetchNext = true;  // asks for the next block's rows (decode)
    const uint8_t* src[8];
    int64_t ld[8];
    alignas(64) float acc[8][16 * 16];
    template <int I>
    void zero() {
        for (int m = 0; m < 16; ++m) _mm512_store_ps(acc[I] + 16 * m, _mm512_setzero_ps());
    }
    template <int I>
    void load(const void* p, int64_t stride) {
        src[I] = static_cast<const uint8_t*>(p);
        ld[I] = stride;
    }
    template <int C, int A, int B>
    void dp() {
        const uint8_t* a = src[A];
        const uint8_t* b = src[B];
        __m512 c[16];
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m) c[m] = _mm512_load_ps(acc[C] + 16 * m);
        // Eight of B's pair rows at a time stay in registers with the 16 sums.
        for (int k0 = 0; k0 < 16; k0 += 8) {
            __m512bh bk[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k)
                bk[k] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + (k0 + k) * ld[B]));
#pragma GCC unroll 16
            for (int m = 0; m < 16; ++m)
#pragma GCC unroll 8
                for (int k = 0; k < 8; ++k) {
                    int32_t pair;
                    std::memcpy(&pair, a + m * ld[A] + 4 * (k0 + k), 4);
                    c[m] = _mm512_dpbf16_ps(c[m], bk[k],
                                            reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)));
                }
        }
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m) _mm512_store_ps(acc[C] + 16 * m, c[m]);
    }
    template <int I>
    void store(void* p, int64_t stride) {
        auto* out = static_cast<uint8_t*>(p);
        for (int m = 0; m < 16; ++m)
            _mm512_storeu_ps(reinterpret_cast<float*>(out + m * stride),
                             _mm512_load_ps(acc[I] + 16 * m));
    }
};

bool on_tiles() {
    static const bool v = quant::cpu_has_amx_bf16();
    return v;
}

}  // namespace

Query::Query(const float* q, int64_t n_heads, int64_t w, int64_t v, int64_t n, float scale)
    : heads_(n_heads),
      w_(w),
      wp_((w + 31) / 32 * 32),
      v_(v),
      vp_((v + 31) / 32 * 32),
      ldo_(vp_ + 16),
      n_(n),
      scale_(scale) {
    qt_.resize(size_t(wp_ / 32 * 16 * 32));
    heads_as_b_tiles(q, heads_, w, wp_, qt_.data());
    max_.resize(size_t(blocks() * kHeads));
    sum_.resize(size_t(blocks() * kHeads));
    part_.reset(static_cast<float*>(
        ::operator new(size_t(blocks() * kHeads * ldo_) * sizeof(float), std::align_val_t(64))));
}

namespace {

// A block's working set, per thread: the rows of a run's blocks converted to
// BF16 (all of them, gathered in one pass), the value pairs of two 64-column
// groups as the tile product reads them, the scores and the probabilities by head.
constexpr int64_t kGroup = 64;
constexpr int64_t kAhead = 16;  // rows prefetched ahead of the conversion (into L2)
constexpr int64_t kPtStride = Query::kBlockKeys + 32;  // BF16s between heads (off 4K strides)
// The widest span of rows a run's blocks share through one table; wider (rows
// picked far apart) the queries' blocks share few rows and each runs alone.
constexpr int64_t kMaxSpan = 8 * Query::kRunQueries * Query::kBlockKeys;
struct BlockWork {
    LineVector<uint16_t> kb, vb, pt;
    LineVector<float> s;
    std::vector<const uint8_t*> src;  // the rows kb holds
    std::vector<int32_t> map;         // [query][row of its block]: its row in kb
    std::vector<int32_t> slot;        // per row of the run's span: its row in kb
};

BlockWork& block_work() {
    thread_local BlockWork w;
    return w;
}

// The rows the queries of a run read, each once, ascending, into bw.src: the
// rows of one query (or of one query's head groups) as they are (kb row j its
// row j, zero up to a whole pair tile); a run's from a table over their span
// [lo, hi] that marks the rows read and numbers them (map: [query][row of its
// block] -> kb row, a zero row past its rows). Returns the rows read and the
// end of the zero rows after them.
template <class Index>
std::pair<int64_t, int64_t> number_rows(BlockWork& bw, const Rows& rows0, int64_t j0,
                                        const int64_t* nk, int64_t nq, bool same, int64_t lo,
                                        int64_t hi, Index index) {
    int64_t nu = 0;
    if (same) {
        for (int64_t j = 0; j < nk[0]; ++j) bw.src[size_t(j)] = rows0.row(j0 + j);
        nu = nk[0];
        return {nu, (nu + 31) / 32 * 32};
    }
    bw.slot.assign(size_t(hi - lo + 1), 0);
    for (int64_t i = 0; i < nq; ++i)
        for (int64_t j = 0; j < nk[i]; ++j) bw.slot[size_t(index(i, j) - lo)] = 1;
    for (int64_t x = 0; x <= hi - lo; ++x) {  // branch-free: most rows of the span are read
        const int32_t read = bw.slot[size_t(x)];
        bw.slot[size_t(x)] = int32_t(nu);
        bw.src[size_t(nu)] = rows0.base + size_t(lo + x) * rows0.row_bytes;
        nu += read;
    }
    const int64_t zero = (nu + 15) / 16 * 16;  // after the last whole tile
    for (int64_t i = 0; i < nq; ++i) {
        int32_t* m = bw.map.data() + i * Query::kBlockKeys;
        for (int64_t j = 0; j < nk[i]; ++j) m[j] = bw.slot[size_t(index(i, j) - lo)];
        for (int64_t j = nk[i]; j < (nk[i] + 31) / 32 * 32; ++j) m[j] = int32_t(zero);
    }
    return {nu, zero + 1};
}

// Rows [0, nu) of bw.src as BF16 into bw.kb (wp BF16s apart), zero rows up to
// zero_to, gathered in one pass: the loads of one uninterrupted stream keep the
// most lines in flight.
void convert_rows(BlockWork& bw, Elem elem, size_t row_bytes, int64_t nu, int64_t zero_to,
                  int64_t wp, int64_t w) {
    for (int64_t u = 0; u < zero_to; ++u) {
        uint16_t* dst = bw.kb.data() + u * wp;
        if (u + kAhead < nu)  // the rows are scattered: ask for a later one now
            prefetch_row(bw.src[size_t(u + kAhead)], row_bytes);
        if (u < nu) {
            for (int64_t c = 0; c < wp; c += 32)
                _mm512_store_si512(dst + c, load32_bf16(bw.src[size_t(u)], elem, c, w));
        } else {
            std::memset(dst, 0, size_t(wp) * 2);
        }
    }
}

}  // namespace

void Query::block_of_run(std::span<Query* const> run, std::span<const Rows> rows, int64_t b,
                         int64_t next) {
    if (on_tiles())
        block_of_run_on<AmxTileOps>(run, rows, b, next);
    else
        block_of_run_on<VectorTileOps>(run, rows, b, next);
}

template <class Tiles>
void Query::block_of_run_on(std::span<Query* const> run, std::span<const Rows> rows, int64_t b,
                            int64_t next) {
    const int64_t nq = int64_t(run.size());
    const int64_t j0 = b * kBlockKeys, wp = run[0]->wp_;
    auto index = [&](int64_t i, int64_t j) -> int64_t {
        const Rows& r = rows[size_t(i)];
        return r.idx ? r.idx[j0 + j] : j0 + j;
    };
    int64_t nk[kMaxRun], lo = INT64_MAX, hi = -1;
    bool shared = true;  // the rows of one cache
    bool same = true;    // the same rows (head groups of one query)
    for (int64_t i = 0; i < nq; ++i) {
        nk[i] = std::min(kBlockKeys, run[size_t(i)]->n_ - j0);
        const Rows& r = rows[size_t(i)];
        shared &=
            r.base == rows[0].base && r.elem == rows[0].elem && r.row_bytes == rows[0].row_bytes;
        same &= r.idx == rows[0].idx && nk[i] == nk[0];
    }
    same &= shared;
    // Queries that read different rows share them through a table over the
    // rows' span, and each scores every row any of them reads: cheap on the
    // tile unit, but with vector products the extra scores cost more than the
    // shared gather saves (Tiles::kScoreUnion). Rows of two caches, or a span
    // too wide for the table: each query's block alone.
    const bool union_ok = !same && shared && Tiles::kScoreUnion;
    for (int64_t i = 0; i < nq && union_ok; ++i)
        for (int64_t j = 0; j < nk[i]; ++j) {
            lo = std::min(lo, index(i, j));
            hi = std::max(hi, index(i, j));
        }
    if (!same && (!union_ok || hi - lo >= kMaxSpan)) {
        for (int64_t i = 0; i < nq; ++i) run[size_t(i)]->block(rows[size_t(i)], b);
        return;
    }
    BlockWork& bw = block_work();
    // Grown only: a vector grown within its capacity would zero the new part.
    auto at_least = [](auto& v, int64_t n) {
        if (int64_t(v.size()) < n) v.resize(size_t(n));
    };
    at_least(bw.src, nq * kBlockKeys + 1);
    at_least(bw.map, nq * kBlockKeys);

    const auto [nu, zero_to] = number_rows(bw, rows[0], j0, nk, nq, same, lo, hi, index);
    const int64_t nu16 = (nu + 15) / 16 * 16;  // the rows the scores cover
    at_least(bw.kb, zero_to * wp);
    at_least(bw.s, nq * nu16 * kHeads);

    const size_t row_bytes = rows[0].row_bytes;
    convert_rows(bw, rows[0].elem, row_bytes, nu, zero_to, wp, run[0]->w_);

    // The rows of this thread's next block (decode: one query's rows),
    // asked for over this block's score and value steps.
    RowPrefetch<Rows> pf(rows[0], run[0]->n_, int64_t(row_bytes));
    if (Tiles::kPrefetchNext && same && next >= 0) {
        // A step before each tile product: up to 4 per chunk of a row group.
        const int64_t score_steps = nq * ((nu + 15) / 16) * (wp / 32);
        const int64_t value_steps = nq * ((run[0]->vp_ + 15) / 16) * (kBlockKeys / 32);
        pf.queue(next * kBlockKeys, kBlockKeys, score_steps + value_steps);
    }

    // Scores of every row against every query: C[row][head] per query, query
    // i's at s + i * nu16 * kHeads.
    float* const s = bw.s.data();
    for (int64_t i = 0; i < nq; ++i)
        run[size_t(i)]->scores<Tiles>(bw.kb.data(), nu, s + i * nu16 * kHeads, pf);
    for (int64_t i = 0; i < nq; ++i)
        run[size_t(i)]->softmax_values<Tiles>(b, nk[i],
                                              same ? nullptr : bw.map.data() + i * kBlockKeys,
                                              bw.kb.data(), s + i * nu16 * kHeads, pf);
}

// Query by query (its tiles stay in L1 while the rows stream from L2), 64
// rows at a time (4 tiles).
template <class Tiles>
void Query::scores(const uint16_t* kb, int64_t nu, float* s, RowPrefetch<Rows>& pf) const {
    const int64_t wp = wp_, ldk = wp * 2;  // ldk: bytes between converted rows
    Tiles tl;
    const uint16_t* qt = qt_.data();
    for (int64_t g0 = 0; g0 < nu; g0 += kGroup) {
        const int64_t nt = (std::min(kGroup, nu - g0) + 15) / 16;
        tl.template zero<0>();
        tl.template zero<1>();
        tl.template zero<2>();
        tl.template zero<3>();
        const uint16_t* k0 = kb + g0 * wp;
        for (int64_t k = 0; k < wp / 32; ++k) {
            pf.step();
            tl.template load<5>(qt + k * 512, 64);
            tl.template load<4>(k0 + k * 32, ldk);
            tl.template dp<0, 4, 5>();
            if (nt > 1) {
                pf.step();
                tl.template load<6>(k0 + 16 * wp + k * 32, ldk);
                tl.template dp<1, 6, 5>();
            }
            if (nt > 2) {
                pf.step();
                tl.template load<4>(k0 + 32 * wp + k * 32, ldk);
                tl.template dp<2, 4, 5>();
            }
            if (nt > 3) {
                pf.step();
                tl.template load<6>(k0 + 48 * wp + k * 32, ldk);
                tl.template dp<3, 6, 5>();
            }
        }
        float* sg = s + g0 * kHeads;
        tl.template store<0>(sg, 64);
        if (nt > 1) tl.template store<1>(sg + 16 * kHeads, 64);
        if (nt > 2) tl.template store<2>(sg + 32 * kHeads, 64);
        if (nt > 3) tl.template store<3>(sg + 48 * kHeads, 64);
    }
}

template <class Tiles>
void Query::softmax_values(int64_t b, int64_t nk, const int32_t* map, const uint16_t* kb,
                           const float* s, RowPrefetch<Rows>& pf) {
    // The same code with and without the map (one query's kb rows are its own).
    auto run_with = [&](auto at) {
        const int64_t nk32 = (nk + 31) / 32 * 32;
        // BF16s between the value pairs of one 64-column group (off 4K strides)
        constexpr int64_t vrow = 2 * 64 + 32;
        BlockWork& bw = block_work();
        bw.vb.resize(size_t(kBlockKeys * vrow));  // two groups' kBlockKeys / 2 pairs
        bw.pt.resize(size_t(kHeads * kPtStride));
        Tiles tl;
        // Interleave the BF16 words of two rows: [a0, b0, a1, b1, ...] for columns
        // 0..15 of a 32-column chunk, and for 16..31.
        alignas(64) static const uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                     37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                     11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
        const __m512i lo_idx = _mm512_load_si512(kLo);
        const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));

        // ---- softmax against the block's maximum, transposed to [head][key]
        const __m512 sc = _mm512_set1_ps(scale_);
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < nk; ++j)
            mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_load_ps(s + at(j) * kHeads), sc));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j0t = 0; j0t < nk32; j0t += 32) {
            __m512 a[16], c[16];
            for (int64_t i = 0; i < 32; ++i) {
                const int64_t j = j0t + i;
                __m512 e = _mm512_setzero_ps();
                if (j < nk) {
                    e = exp_ps(
                        _mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(s + at(j) * kHeads), sc), mx));
                    sum = _mm512_add_ps(sum, e);
                }
                (i < 16 ? a[i] : c[i - 16]) = e;
            }
            transpose16(a);
            transpose16(c);
            for (int64_t h = 0; h < kHeads; ++h)
                _mm512_store_si512(bw.pt.data() + h * kPtStride + j0t, to_bf16(c[h], a[h]));
        }
        _mm512_store_ps(max_.data() + b * kHeads, mx);
        _mm512_store_ps(sum_.data() + b * kHeads, sum);

        // ---- values: C[head][col] over the block's keys, 4 column tiles (64
        // columns) at a time, from the value pairs of those columns. The pairs of
        // the next 64 columns are written between the tile products of these
        // (two buffers, each small enough for L1): the tiles work meanwhile.
        float* part = part_.get() + b * kHeads * ldo_;
        uint16_t* const pairs[2] = {bw.vb.data(), bw.vb.data() + kBlockKeys / 2 * vrow};
        auto build_pairs = [&](int64_t g, int64_t p0, int64_t p1, uint16_t* out) {
            const int64_t cols = std::min<int64_t>(64, vp_ - g);
            for (int64_t p = p0; p < p1; ++p) {
                const uint16_t* ra = kb + at(2 * p) * wp_ + g;
                const uint16_t* rb = kb + at(2 * p + 1) * wp_ + g;
                uint16_t* dst = out + p * vrow;
                for (int64_t c = 0; c < cols; c += 32) {
                    const __m512i x = _mm512_load_si512(ra + c), y = _mm512_load_si512(rb + c);
                    _mm512_store_si512(dst + 2 * c, _mm512_permutex2var_epi16(x, lo_idx, y));
                    _mm512_store_si512(dst + 2 * c + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
                }
            }
        };
        build_pairs(0, 0, nk32 / 2, pairs[0]);
        for (int64_t g = 0; g < vp_; g += 64) {
            const int64_t nt = std::min<int64_t>(4, (vp_ - g) / 16);
            const uint16_t* cur = pairs[g / 64 % 2];
            uint16_t* next = g + 64 < vp_ ? pairs[(g / 64 + 1) % 2] : nullptr;
            tl.template zero<0>();
            tl.template zero<1>();
            tl.template zero<2>();
            tl.template zero<3>();
            for (int64_t kc = 0; kc < nk32 / 32; ++kc) {
                pf.step();
                if (next) build_pairs(g + 64, 16 * kc, 16 * kc + 16, next);
                tl.template load<4>(bw.pt.data() + 32 * kc, kPtStride * 2);
                const uint16_t* vr = cur + 16 * kc * vrow;
                tl.template load<5>(vr, vrow * 2);
                tl.template dp<0, 4, 5>();
                if (nt > 1) {
                    pf.step();
                    tl.template load<7>(vr + 32, vrow * 2);
                    tl.template dp<1, 4, 7>();
                }
                if (nt > 2) {
                    pf.step();
                    tl.template load<5>(vr + 64, vrow * 2);
                    tl.template dp<2, 4, 5>();
                }
                if (nt > 3) {
                    pf.step();
                    tl.template load<7>(vr + 96, vrow * 2);
                    tl.template dp<3, 4, 7>();
                }
            }
            tl.template store<0>(part + g, ldo_ * 4);
            if (nt > 1) tl.template store<1>(part + g + 16, ldo_ * 4);
            if (nt > 2) tl.template store<2>(part + g + 32, ldo_ * 4);
            if (nt > 3) tl.template store<3>(part + g + 48, ldo_ * 4);
        }
    };
    if (map)
        run_with([map](int64_t j) { return int64_t(map[j]); });
    else
        run_with([](int64_t j) { return j; });
}

void Query::finish(float* out, int64_t out_stride) const {
    const int64_t nb = blocks();
    thread_local std::vector<float> w;  // each block's weight e^(max_b - max) / sum
    w.resize(size_t(nb));
    for (int64_t h = 0; h < heads_; ++h) {
        float m = -INFINITY;
        for (int64_t b = 0; b < nb; ++b) m = std::max(m, max_[size_t(b * kHeads + h)]);
        float l = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
            w[size_t(b)] = std::exp(max_[size_t(b * kHeads + h)] - m);
            l += w[size_t(b)] * sum_[size_t(b * kHeads + h)];
        }
        for (float& x : w) x /= l;
        float* o = out + h * out_stride;
        for (int64_t c = 0; c < v_; c += 16) {
            const __mmask16 mk = lanes(v_ - c);
            __m512 acc = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; ++b)
                acc = _mm512_fmadd_ps(
                    _mm512_set1_ps(w[size_t(b)]),
                    _mm512_maskz_loadu_ps(mk, part_.get() + (b * kHeads + h) * ldo_ + c), acc);
            _mm512_mask_storeu_ps(o + c, mk, acc);
        }
    }
}

void IndexerKeys::reset(const Rows& rows, int64_t n, int64_t dim) {
    rows_ = rows;
    n_ = n;
    dim_ = dim;
    dp_ = (dim + 31) / 32 * 32;
    in_place_ = rows.elem == Elem::BF16 && dim % 32 == 0 && rows.row_bytes % 64 == 0;
    if (!in_place_) buf_.resize(size_t(tiles() * 16 * dp_));
}

void IndexerKeys::convert(int64_t t) {
    // The next tile's rows into L2 while this one converts.
    for (int64_t i = 16 * (t + 2); i < std::min(n_, 16 * (t + 3)); ++i)
        prefetch_row(rows_.row(i), rows_.row_bytes);
    for (int64_t s = 16 * t; s < 16 * (t + 1); ++s)
        for (int64_t c = 0; c < dp_; c += 32)
            _mm512_store_si512(
                buf_.data() + s * dp_ + c,
                s < n_ ? load32_bf16(rows_.row(s), rows_.elem, c, dim_) : _mm512_setzero_si512());
}

void IndexerKeys::convert_query(const float* q, int64_t n_heads, uint16_t* out) const {
    // Each group of 16 heads as the B tiles of its chunks.
    for (int64_t g = 0; g < (n_heads + 15) / 16; ++g)
        heads_as_b_tiles(q + 16 * g * dim_, std::min<int64_t>(16, n_heads - 16 * g), dim_, dp_,
                         out + g * (dp_ / 32) * 512);
}

void IndexerKeys::scores(const uint16_t* qb, int64_t n_heads, const float* w, int64_t s0,
                         int64_t s1, float* out) const {
    if (on_tiles())
        scores_on<AmxTileOps>(qb, n_heads, w, s0, s1, out);
    else
        scores_on<VectorTileOps>(qb, n_heads, w, s0, s1, out);
}

template <class Tiles>
void IndexerKeys::scores_on(const uint16_t* qb, int64_t n_heads, const float* w, int64_t s0,
                            int64_t s1, float* out) const {
    const int64_t chunks = dp_ / 32, groups = (n_heads + 15) / 16;
    thread_local LineVector<float> cb;       // [group][32 keys][16 heads]
    thread_local LineVector<uint16_t> tail;  // a last, partial tile read in place, padded
    cb.resize(size_t(groups * 32 * 16));
    Tiles tl;
    // Key tile t as A tiles: its rows and their stride in bytes.
    auto key_tile = [&](int64_t t, const uint8_t*& p, int64_t& ld) {
        if (!in_place_) {
            p = reinterpret_cast<const uint8_t*>(buf_.data() + t * 16 * dp_);
            ld = dp_ * 2;
        } else if (16 * (t + 1) <= n_) {
            p = rows_.row(16 * t);
            ld = int64_t(rows_.row_bytes);
        } else {  // rows past n may lie past the cache's end
            tail.assign(size_t(16 * dp_), 0);
            for (int64_t s = 16 * t; s < n_; ++s)
                std::memcpy(tail.data() + (s - 16 * t) * dp_, rows_.row(s), size_t(dp_) * 2);
            p = reinterpret_cast<const uint8_t*>(tail.data());
            ld = dp_ * 2;
        }
    };
    const __m512 zero = _mm512_setzero_ps();
    // 32 keys at a time: C tiles 0, 1 for the two key tiles and heads
    // [16g, 16g + 16), 2 and 3 for the next 16 heads.
    for (int64_t k0 = s0; k0 < s1; k0 += 32) {
        const bool two = k0 + 16 < s1;
        const uint8_t *a0 = nullptr, *a1 = nullptr;
        int64_t ld0 = 0, ld1 = 0;
        key_tile(k0 / 16, a0, ld0);
        if (two) key_tile(k0 / 16 + 1, a1, ld1);
        for (int64_t g = 0; g < groups; g += 2) {
            const bool g2 = g + 1 < groups;
            const uint16_t* b0 = qb + g * chunks * 512;
            const uint16_t* b1 = b0 + chunks * 512;
            tl.template zero<0>();
            tl.template zero<1>();
            tl.template zero<2>();
            tl.template zero<3>();
            for (int64_t c = 0; c < chunks; ++c) {
                tl.template load<4>(a0 + c * 64, ld0);
                tl.template load<6>(b0 + c * 512, 64);
                tl.template dp<0, 4, 6>();
                if (two) {
                    tl.template load<5>(a1 + c * 64, ld1);
                    tl.template dp<1, 5, 6>();
                }
                if (g2) {
                    tl.template load<7>(b1 + c * 512, 64);
                    tl.template dp<2, 4, 7>();
                    if (two) tl.template dp<3, 5, 7>();
                }
            }
            float* c0 = cb.data() + g * 32 * 16;
            tl.template store<0>(c0, 64);
            if (two) tl.template store<1>(c0 + 16 * 16, 64);
            if (g2) {
                tl.template store<2>(c0 + 32 * 16, 64);
                if (two) tl.template store<3>(c0 + 48 * 16, 64);
            }
        }
        for (int64_t kt = 0; kt < (two ? 2 : 1); ++kt) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t g = 0; g < groups; ++g) {
                __m512 r[16];  // key i's 16 heads; transposed, head h of the 16 keys
                for (int64_t i = 0; i < 16; ++i)
                    r[i] = _mm512_load_ps(cb.data() + ((g * 32) + kt * 16 + i) * 16);
                transpose16(r);
                for (int64_t h = 0; h < std::min<int64_t>(16, n_heads - 16 * g); ++h)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(w[16 * g + h]), _mm512_max_ps(r[h], zero),
                                          acc);
            }
            const int64_t k = k0 + 16 * kt;
            _mm512_mask_storeu_ps(out + (k - s0), lanes(s1 - k), acc);
        }
    }
}

}  // namespace glm5::backend::cpu::amx_bf16

// AVX2 + FMA + F16C versions of the row helpers in cpu_simd.h. Intrinsics
// only: no inline function here is shared with baseline code.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu_simd.h"

namespace glm5::backend::cpu::avx2 {

namespace {
inline __m256 load_h(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float h2f(uint16_t h) {
    return _cvtsh_ss(h);
}
inline float fma1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}
inline float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// Per-thread buffers of the attention tiles: cache rows converted to floats
// and padded output sums.
struct Scratch {
    std::vector<float> rows, out;
};
Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

// Tiles of A query rows by B key rows, 9 accumulators at most: with the
// A + B loads of a step that fits the 16 vector registers, and every load
// feeds A or B fused multiply-adds. One tile pass computes one of a dot
// product's lane accumulators (those that sum every `step`-th 8-value chunk
// from chunk `first` on); the caller combines them in the row helpers'
// order, so each result has the bits of the one-pair helper.
template <int A, int B>
void lane_tile(const float* q, int64_t qs, const float* k, int64_t ks, int64_t first, int64_t step,
               int64_t nc, __m256* part) {
    __m256 acc[A][B];
#pragma GCC unroll 4
    for (int a = 0; a < A; ++a)
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) acc[a][b] = _mm256_setzero_ps();
    for (int64_t c = first; c < nc; c += step) {
        __m256 kv[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) kv[b] = _mm256_loadu_ps(k + b * ks + c * 8);
#pragma GCC unroll 4
        for (int a = 0; a < A; ++a) {
            const __m256 qa = _mm256_loadu_ps(q + a * qs + c * 8);
#pragma GCC unroll 4
            for (int b = 0; b < B; ++b) acc[a][b] = _mm256_fmadd_ps(qa, kv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < A; ++a)
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) part[a * 3 + b] = acc[a][b];
}

using LaneTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                          __m256*);
constexpr LaneTile kLaneTiles[3][3] = {{lane_tile<1, 1>, lane_tile<1, 2>, lane_tile<1, 3>},
                                       {lane_tile<2, 1>, lane_tile<2, 2>, lane_tile<2, 3>},
                                       {lane_tile<3, 1>, lane_tile<3, 2>, lane_tile<3, 3>}};

// out[h][c0 .. c0 + 8C) += p[h][r] * v[r][..] over nr rows in order, H heads:
// each output value is a chain of fused multiply-adds over the rows, as
// axpy_f16 row after row makes it.
template <int H, int C>
void value_tile(const float* p, int64_t ld, const float* v, int64_t nr, int64_t vp, float* out,
                int64_t c0) {
    __m256 acc[H][C];
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[h][c] = _mm256_loadu_ps(out + h * vp + c0 + c * 8);
    for (int64_t r = 0; r < nr; ++r) {
        __m256 vv[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(v + r * vp + c0 + c * 8);
#pragma GCC unroll 4
        for (int h = 0; h < H; ++h) {
            const __m256 ph = _mm256_broadcast_ss(p + h * ld + r);
#pragma GCC unroll 4
            for (int c = 0; c < C; ++c) acc[h][c] = _mm256_fmadd_ps(ph, vv[c], acc[h][c]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + h * vp + c0 + c * 8, acc[h][c]);
}

using ValueTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
constexpr ValueTile kValueTiles[4][3] = {{value_tile<1, 1>, value_tile<1, 2>, value_tile<1, 3>},
                                         {value_tile<2, 1>, value_tile<2, 2>, value_tile<2, 3>},
                                         {value_tile<3, 1>, value_tile<3, 2>, value_tile<3, 3>},
                                         {value_tile<4, 1>, value_tile<4, 2>, value_tile<4, 3>}};

// Rows converted per block: 16 rows of the MLA width (36 KB) stay near L1.
constexpr int64_t kBlockRows = 16;

// dst[r][0..wp) = row j0 + r's values [0, w) as floats, zeros up to wp.
void convert(const F16Rows& rows, int64_t j0, int64_t nr, int64_t w, int64_t wp, float* dst) {
    const int64_t w8 = w / 8 * 8;
    for (int64_t r = 0; r < nr; ++r) {
        const uint16_t* src = rows.row(j0 + r);
        float* d = dst + r * wp;
        int64_t i = 0;
        for (; i < w8; i += 8) _mm256_storeu_ps(d + i, load_h(src + i));
        for (; i < w; ++i) d[i] = h2f(src[i]);
        for (; i < wp; ++i) d[i] = 0.0f;
    }
}
}  // namespace

// The scalar rms_norm_row's arithmetic (cpu_kernels.h), lane for lane: the
// eight partial sums are the two double vectors' lanes.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double acc[8];
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) sum += double(x[i] * x[i]);
    const float mean = float(sum / double(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

void axpy_f32(int64_t n, float a, const float* x, float* y) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(
            y + i + 8, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] = fma1(a, x[i], y[i]);
}

void axpy_f16(int64_t n, float a, const uint16_t* x, float* y) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_h(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(y + i + 8,
                         _mm256_fmadd_ps(va, load_h(x + i + 8), _mm256_loadu_ps(y + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_h(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] = fma1(a, h2f(x[i]), y[i]);
}

void f16_to_f32(int64_t n, const uint16_t* src, float* dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_h(src + i));
    for (; i < n; ++i) dst[i] = h2f(src[i]);
}

void f32_to_f16(int64_t n, const float* src, uint16_t* dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void round_f16(int64_t n, const float* x, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; ++i) y[i] = h2f(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

float dot_f32_f16(int64_t n, const float* a, const uint16_t* b) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_h(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_h(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_h(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) s = fma1(a[i], h2f(b[i]), s);
    return s;
}

// dot_f32_f16's order for every (head, row): the even 8-value chunks chain
// in one lane accumulator, the odd ones in another; their sum is reduced
// like its horizontal sum, and the last w % 8 values are added one by one.
void scores_f16(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n, float* s,
                int64_t ld) {
    Scratch& sc = scratch();
    const int64_t nc = w / 8, w8 = nc * 8;
    sc.rows.resize(size_t(kBlockRows * std::max<int64_t>(w8, 8)));
    float* const kr = sc.rows.data();
    __m256 part[2][9];
    for (int64_t j0 = 0; j0 < n; j0 += kBlockRows) {
        const int64_t nr = std::min(kBlockRows, n - j0);
        convert(rows, j0, nr, w8, w8, kr);
        for (int64_t h0 = 0; h0 < nh; h0 += 3) {
            const int64_t a = std::min<int64_t>(3, nh - h0);
            for (int64_t b0 = 0; b0 < nr; b0 += 3) {
                const int64_t b = std::min<int64_t>(3, nr - b0);
                const LaneTile tile = kLaneTiles[a - 1][b - 1];
                tile(q + h0 * w, w, kr + b0 * w8, w8, 0, 2, nc, part[0]);
                tile(q + h0 * w, w, kr + b0 * w8, w8, 1, 2, nc, part[1]);
                for (int64_t x = 0; x < a; ++x)
                    for (int64_t y = 0; y < b; ++y) {
                        float v = hsum(_mm256_add_ps(part[0][x * 3 + y], part[1][x * 3 + y]));
                        const float* qh = q + (h0 + x) * w;
                        const uint16_t* r = rows.row(j0 + b0 + y);
                        for (int64_t i = w8; i < w; ++i) v = fma1(qh[i], h2f(r[i]), v);
                        s[(h0 + x) * ld + j0 + b0 + y] = v;
                    }
            }
        }
    }
}

void weighted_sum_f16(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                      int64_t vw, float* out) {
    Scratch& sc = scratch();
    const int64_t vp = (vw + 7) / 8 * 8;
    const bool direct = vp == vw;
    if (!direct) sc.out.resize(size_t(nh * vp));
    float* const so = direct ? out : sc.out.data();
    std::fill(so, so + nh * vp, 0.0f);
    sc.rows.resize(size_t(kBlockRows * vp));
    float* const vr = sc.rows.data();
    for (int64_t j0 = 0; j0 < n; j0 += kBlockRows) {
        const int64_t nr = std::min(kBlockRows, n - j0);
        convert(rows, j0, nr, vw, vp, vr);
        for (int64_t h0 = 0; h0 < nh; h0 += 4) {
            const int64_t hh = std::min<int64_t>(4, nh - h0);
            for (int64_t c0 = 0; c0 < vp; c0 += 24) {
                const int64_t cc = std::min<int64_t>(3, (vp - c0) / 8);
                kValueTiles[hh - 1][cc - 1](p + h0 * ld + j0, ld, vr, nr, vp, so + h0 * vp, c0);
            }
        }
    }
    if (!direct)
        for (int64_t h = 0; h < nh; ++h)
            std::memcpy(out + h * vw, so + h * vp, size_t(vw) * sizeof(float));
}

// The F32 dot product of quant's AVX2 kernel (four lane accumulators over
// 32-value steps, summed pairwise, then horizontally) for every (key,
// query) pair; dim a multiple of 32, where that kernel has no tail.
void dots_f32(const float* q, int64_t nq, const float* k, int64_t ks, int64_t nk, int64_t dim,
              float* out, int64_t ld) {
    const int64_t nc = dim / 8;
    __m256 part[4][9];
    for (int64_t a0 = 0; a0 < nq; a0 += 3) {
        const int64_t a = std::min<int64_t>(3, nq - a0);
        for (int64_t b0 = 0; b0 < nk; b0 += 3) {
            const int64_t b = std::min<int64_t>(3, nk - b0);
            const LaneTile tile = kLaneTiles[a - 1][b - 1];
            for (int l = 0; l < 4; ++l) tile(q + a0 * dim, dim, k + b0 * ks, ks, l, 4, nc, part[l]);
            for (int64_t x = 0; x < a; ++x)
                for (int64_t y = 0; y < b; ++y) {
                    const int64_t t = x * 3 + y;
                    out[(b0 + y) * ld + a0 + x] =
                        hsum(_mm256_add_ps(_mm256_add_ps(part[0][t], part[1][t]),
                                           _mm256_add_ps(part[2][t], part[3][t])));
                }
        }
    }
}

namespace {

// The product rounded before it is added: GCC may not contract the two.
inline __m256 product(__m256 a, __m256 b) {
    __m256 p = _mm256_mul_ps(a, b);
    asm("" : "+x"(p));
    return p;
}

// The delta rule's passes over columns [j0, j0 + 8 C) of the state, the sums
// in registers (see cpu_simd.h).
template <int C, bool Decay>
void delta_columns(int64_t d, int64_t j0, const float* src, const float* a, const float* b,
                   const float* u, float* S, float* acc) {
    __m256 sum[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) sum[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
        float* row = S + i * d + j0;
        const __m256 ai = _mm256_set1_ps(a[i]), bi = _mm256_set1_ps(b[i]);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            __m256 r;
            if constexpr (Decay)  // S = src * decay; acc += S * k
                r = product(_mm256_loadu_ps(src + i * d + j0 + 8 * c), ai);
            else  // S += k * u; acc += S * q
                r = _mm256_add_ps(_mm256_loadu_ps(row + 8 * c),
                                  product(ai, _mm256_loadu_ps(u + j0 + 8 * c)));
            _mm256_storeu_ps(row + 8 * c, r);
            sum[c] = _mm256_add_ps(sum[c], product(r, bi));
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + j0 + 8 * c, sum[c]);
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
    // Up to 64 columns (8 vectors) per walk down the rows.
    for (int64_t j0 = 0; j0 < d; j0 += 64)
        kColumns[size_t(std::min<int64_t>(8, (d - j0) / 8) - 1)](d, j0, src, a, b, u, S, acc);
}

}  // namespace

// Whole vectors of 8 columns; other widths take the plain loops.
void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc) {
    if (d % 8 != 0) return scalar::delta_decay(d, src, decay, k, S, acc);
    delta_pass<true>(d, src, decay, k, nullptr, S, acc);
}

void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc) {
    if (d % 8 != 0) return scalar::delta_update(d, k, u, q, S, acc);
    delta_pass<false>(d, nullptr, k, q, u, S, acc);
}

}  // namespace glm5::backend::cpu::avx2

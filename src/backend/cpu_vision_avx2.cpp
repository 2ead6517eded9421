// AVX2 + FMA tile kernels of the vision tower's attention (cpu_vision_kernels.h).
#include <immintrin.h>

#include <cmath>

#include "backend/cpu_vision_kernels.h"

namespace glm5::backend::cpu::avx2 {

namespace {

// e^x: 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2 (ln 2 in two
// parts so r is exact), e^r by its Taylor series to degree 7. x is clamped
// to [-87, 88]; callers pass x <= 0 (scores minus their running maximum).
inline __m256 exp_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace

// Four queries against 16 keys per register block: 8 accumulators, each key
// vector loaded once for the four queries.
void attn_scores(const float* q, int64_t ldq, int64_t nq, const float* kt, int64_t ldk, int64_t nk,
                 int64_t dim, float scale, float* s, int64_t lds) {
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 4 <= nq; i += 4) {
        const float* q0 = q + i * ldq;
        for (int64_t j = 0; j < nk; j += 16) {
            const bool two = j + 16 <= nk;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
                   a30 = a00, a31 = a00;
            for (int64_t c = 0; c < dim; ++c) {
                const float* kr = kt + c * ldk + j;
                const __m256 k0 = _mm256_loadu_ps(kr);
                const __m256 k1 = two ? _mm256_loadu_ps(kr + 8) : _mm256_setzero_ps();
                __m256 b = _mm256_broadcast_ss(q0 + c);
                a00 = _mm256_fmadd_ps(b, k0, a00);
                a01 = _mm256_fmadd_ps(b, k1, a01);
                b = _mm256_broadcast_ss(q0 + ldq + c);
                a10 = _mm256_fmadd_ps(b, k0, a10);
                a11 = _mm256_fmadd_ps(b, k1, a11);
                b = _mm256_broadcast_ss(q0 + 2 * ldq + c);
                a20 = _mm256_fmadd_ps(b, k0, a20);
                a21 = _mm256_fmadd_ps(b, k1, a21);
                b = _mm256_broadcast_ss(q0 + 3 * ldq + c);
                a30 = _mm256_fmadd_ps(b, k0, a30);
                a31 = _mm256_fmadd_ps(b, k1, a31);
            }
            float* o = s + i * lds + j;
            _mm256_storeu_ps(o, _mm256_mul_ps(a00, vs));
            _mm256_storeu_ps(o + lds, _mm256_mul_ps(a10, vs));
            _mm256_storeu_ps(o + 2 * lds, _mm256_mul_ps(a20, vs));
            _mm256_storeu_ps(o + 3 * lds, _mm256_mul_ps(a30, vs));
            if (two) {
                _mm256_storeu_ps(o + 8, _mm256_mul_ps(a01, vs));
                _mm256_storeu_ps(o + lds + 8, _mm256_mul_ps(a11, vs));
                _mm256_storeu_ps(o + 2 * lds + 8, _mm256_mul_ps(a21, vs));
                _mm256_storeu_ps(o + 3 * lds + 8, _mm256_mul_ps(a31, vs));
            }
        }
    }
    // Leftover queries one at a time: the same chain per value.
    for (; i < nq; ++i)
        for (int64_t j = 0; j < nk; j += 8) {
            __m256 a = _mm256_setzero_ps();
            for (int64_t c = 0; c < dim; ++c)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(q + i * ldq + c),
                                    _mm256_loadu_ps(kt + c * ldk + j), a);
            _mm256_storeu_ps(s + i * lds + j, _mm256_mul_ps(a, vs));
        }
}

float attn_exp_sum(float* x, int64_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    if (j < n) {
        alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t k = j; k < n; ++k) t[k - j] = x[k] - m;
        __m256 e = exp_ps(_mm256_load_ps(t));
        _mm256_store_ps(t, e);
        for (int64_t k = j; k < n; ++k) {
            x[k] = t[k - j];
            sum += t[k - j];
        }
    }
    return sum;
}

// Two queries by 32 value columns per register block: 8 accumulators, each
// value row read once for both queries.
void attn_pv(const float* p, int64_t ldp, int64_t nq, const float* v, int64_t ldv, int64_t nk,
             int64_t dim, float* o, int64_t ldo) {
    for (int64_t i = 0; i < nq; i += 2) {
        const bool two = i + 1 < nq;
        const float* p0 = p + i * ldp;
        const float* p1 = two ? p0 + ldp : p0;
        for (int64_t c = 0; c < dim; c += 32) {
            const int64_t w = dim - c < 32 ? dim - c : 32;  // 8, 16, 24 or 32
            float* o0 = o + i * ldo + c;
            float* o1 = two ? o0 + ldo : o0;
            __m256 a[2][4];
            for (int u = 0; u < 4; ++u) {
                a[0][u] = u * 8 < w ? _mm256_loadu_ps(o0 + u * 8) : _mm256_setzero_ps();
                a[1][u] = u * 8 < w ? _mm256_loadu_ps(o1 + u * 8) : _mm256_setzero_ps();
            }
            if (w == 32) {
                for (int64_t j = 0; j < nk; ++j) {
                    const float* vr = v + j * ldv + c;
                    const __m256 b0 = _mm256_broadcast_ss(p0 + j), b1 = _mm256_broadcast_ss(p1 + j);
                    for (int u = 0; u < 4; ++u) {
                        const __m256 vv = _mm256_loadu_ps(vr + u * 8);
                        a[0][u] = _mm256_fmadd_ps(b0, vv, a[0][u]);
                        a[1][u] = _mm256_fmadd_ps(b1, vv, a[1][u]);
                    }
                }
            } else {
                for (int64_t j = 0; j < nk; ++j) {
                    const float* vr = v + j * ldv + c;
                    const __m256 b0 = _mm256_broadcast_ss(p0 + j), b1 = _mm256_broadcast_ss(p1 + j);
                    for (int u = 0; u * 8 < w; ++u) {
                        const __m256 vv = _mm256_loadu_ps(vr + u * 8);
                        a[0][u] = _mm256_fmadd_ps(b0, vv, a[0][u]);
                        a[1][u] = _mm256_fmadd_ps(b1, vv, a[1][u]);
                    }
                }
            }
            for (int u = 0; u * 8 < w; ++u) {
                if (two) _mm256_storeu_ps(o1 + u * 8, a[1][u]);
                _mm256_storeu_ps(o0 + u * 8, a[0][u]);
            }
        }
    }
}

}  // namespace glm5::backend::cpu::avx2

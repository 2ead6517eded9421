// Twelve independent 16-lane FMA chains.
#include <immintrin.h>

#include "core/compute_peak.h"

namespace glm5::detail {

double fma_chains_avx512(long iters) {
    // Twelve named accumulators: an array in a loop stays in memory at -O2.
    __m512 a0 = _mm512_set1_ps(0.0f), a1 = _mm512_set1_ps(1e-3f), a2 = _mm512_set1_ps(2e-3f),
           a3 = _mm512_set1_ps(3e-3f), a4 = _mm512_set1_ps(4e-3f), a5 = _mm512_set1_ps(5e-3f),
           a6 = _mm512_set1_ps(6e-3f), a7 = _mm512_set1_ps(7e-3f), a8 = _mm512_set1_ps(8e-3f),
           a9 = _mm512_set1_ps(9e-3f), a10 = _mm512_set1_ps(1e-2f), a11 = _mm512_set1_ps(1.1e-2f);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (long it = 0; it < iters; ++it) {
        a0 = _mm512_fmadd_ps(a0, m, c);
        a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c);
        a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c);
        a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c);
        a10 = _mm512_fmadd_ps(a10, m, c);
        a11 = _mm512_fmadd_ps(a11, m, c);
    }
    const __m512 s =
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                      _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, s);
    volatile float sink = lanes[0] + lanes[15];
    (void)sink;
    return double(iters) * 12 * 16 * 2;
}

}  // namespace glm5::detail

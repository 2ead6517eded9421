// Internal: the scale searches of ggml's reference quantizers (legacy and
// k-quant formats). Each reproduces ggml's float arithmetic step for step so a
// tensor we quantize matches llama-quantize's output byte for byte.
#pragma once

#include <cstdint>

namespace glm5::quant {

// Symmetric quantization of n values to integers in [-nmax, nmax-1]: tries the
// scale -nmax/max and 18 nearby ones, keeping the one that minimises the
// weighted squared error (weights w, or x^2 when w is null). L receives
// l + nmax. Returns the scale (x ≈ scale * l).
float search_symmetric(int n, int nmax, const float* x, int8_t* L, const float* w);

// 3-bit variant for Q3_K without importance weights: start from -nmax/max and
// refine each element's level in turn (weights x^2). L receives l + nmax.
float search_symmetric_refine(int n, int nmax, const float* x, int8_t* L);

// Asymmetric quantization x ≈ scale * l - min with l in [0, nmax]. Tries
// nstep+1 candidate scales (nmax + rmin + rdelta*k) / (max - min), fitting scale
// and min by weighted least squares for each; `weights` null means x^2.
// `use_mad` measures the error as |diff| instead of diff^2. Returns the scale,
// stores min (>= 0, subtracted) in *the_min and the levels in L; Laux is n bytes
// of scratch.
float search_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad);

// search_scale_min for 8 groups at once (group g = x[g*n .. g*n+n-1], same for
// weights, which must not be null; L likewise), one group per AVX2 lane. Each
// lane performs exactly the scalar operations, so results are bit-identical to
// 8 calls of search_scale_min. Needs AVX2 (cpu_has_avx2()); n <= 32.
void search_scale_min_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                         float* scales, float* the_mins, float rmin, float rdelta, int nstep,
                         bool use_mad);

// search_scale_min over `groups` consecutive groups of n values (scales[g],
// the_mins[g] per group), 8 at a time on AVX2 machines. Same results either way.
void search_scale_min_groups(int groups, int n, int nmax, const float* x, const float* weights,
                             uint8_t* L, float* scales, float* the_mins, float rmin, float rdelta,
                             int nstep, bool use_mad);

// search_symmetric for 8 groups at once (group g = x[g*n ..], w likewise or
// null, L likewise), bit-identical to 8 scalar calls. Needs AVX2; n <= 32.
void search_symmetric_x8(int n, int nmax, const float* x, int8_t* L, const float* w, float* scales);

// search_symmetric over `groups` consecutive groups of n values.
void search_symmetric_groups(int groups, int n, int nmax, const float* x, int8_t* L, const float* w,
                             float* scales);

// Quantize n non-negative values (sub-block scales or mins) to [0, nmax] with
// one positive scale, minimising the error weighted by `weights`.
float search_positive(int n, int nmax, const float* x, uint8_t* L, const float* weights);

}  // namespace glm5::quant

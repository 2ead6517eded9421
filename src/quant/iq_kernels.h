// Internal to src/quant: the SIMD dot products of the i-quant formats, defined
// in iquants_avx2.cpp / iquants_avx512.cpp (compiled for those ISAs only and
// called after a CPU check). Declarations only: this header is included by
// files built with different ISA flags, so it must not define inline code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace glm5::quant::iq {

float dot_iq2_xxs_avx2(int64_t n, const void* w, const void* act);
float dot_iq2_xs_avx2(int64_t n, const void* w, const void* act);
float dot_iq2_s_avx2(int64_t n, const void* w, const void* act);
float dot_iq3_xxs_avx2(int64_t n, const void* w, const void* act);
float dot_iq3_s_avx2(int64_t n, const void* w, const void* act);
float dot_iq1_s_avx2(int64_t n, const void* w, const void* act);
float dot_iq1_m_avx2(int64_t n, const void* w, const void* act);
float dot_iq4_nl_avx2(int64_t n, const void* w, const void* act);
float dot_iq4_xs_avx2(int64_t n, const void* w, const void* act);

float dot_iq2_xxs_avx512(int64_t n, const void* w, const void* act);  // picks one of:
float dot_iq2_xxs_avx512bw(int64_t n, const void* w, const void* act);
float dot_iq2_xxs_avx512vbmi(int64_t n, const void* w, const void* act);  // needs AVX512-VBMI
// Several activation rows (VecDotMultiFn): the same bits as dot_iq2_xxs_avx512.
void dot_iq2_xxs_multi_avx512(int64_t n, const void* w, const void* act, size_t act_stride,
                              int64_t n_act, float* out);
float dot_iq4_nl_avx512(int64_t n, const void* w, const void* act);
float dot_iq4_xs_avx512(int64_t n, const void* w, const void* act);

}  // namespace glm5::quant::iq

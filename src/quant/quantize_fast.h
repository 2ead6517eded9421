// Faster, approximate quantization for formats whose reference search is
// slow, for callers that need volume more than the last bit of accuracy (the
// synthetic benchmark-model generator).
//
// quantize_rows reproduces ggml's quantizers byte for byte. IQ2_XXS's search
// then costs tens of microseconds of CPU per 256 values (minutes per GB of
// output). The fast mode of IQ2_XXS tries 2 of ggml's 13 trial scales and
// snaps trial groups to the nearest grid point, keeping ggml's full neighbour
// search only for the final fit: about 4x faster. On Gaussian rows its squared error is 1% above
// the full search's without an imatrix and its imatrix-weighted error 5% above with one. Output is
// valid IQ2_XXS, but not byte-identical to llama-quantize.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace glm5::quant {

// Whether quantize_rows_fast differs from quantize_rows for t (IQ2_XXS).
bool has_fast_quantize(Type t);

// Same contract as quantize_rows (thread-safe, deterministic); for types
// without a fast mode it is quantize_rows.
size_t quantize_rows_fast(Type t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* imatrix);

}  // namespace glm5::quant

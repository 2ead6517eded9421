// Per-format row operations. Every weight format is data plus three
// functions: dequantize a row, quantize a row, and a dot product against the
// activation format it pairs with (Q8_0 / Q8_1 / Q8_K / F16 / BF16 / F32 —
// the same pairing ggml uses, so activations are rounded as llama.cpp rounds them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace glm5::quant {

// Dequantize n values (a multiple of the block size) bit-exactly as ggml does.
void dequantize_row(Type t, const void* src, float* dst, int64_t n);

// Quantize n_rows rows of n_per_row values. `imatrix` (n_per_row importance
// weights, may be null) steers formats that use one; i-quants without it fall
// back to x^2 weighting. Returns the number of bytes written.
size_t quantize_rows(Type t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                     const float* imatrix);

// Convert one activation row of n floats into act_type (the vec_dot_type of a
// weight format): Q8_0, Q8_1, Q8_K, F16, BF16 or F32.
void quantize_activation_row(Type act_type, const float* x, void* dst, int64_t n);

// Dot product of one weight row (type t, n values) with one activation row
// already in traits(t).vec_dot_type. The scalar reference: the oracle for SIMD.
float vec_dot_ref(Type t, int64_t n, const void* w, const void* act);

// The fastest dot product this CPU supports for t; same contract as vec_dot_ref.
using VecDotFn = float (*)(int64_t n, const void* w, const void* act);
VecDotFn vec_dot_fn(Type t);

// One weight row against n_act activation rows (act + i * act_stride bytes):
// out[i] = vec_dot_fn(t)(n, w, act_i), bit for bit, with the row's blocks
// decoded once for all of them (the prefill matmul's inner kernel). Null
// when the format has no such kernel on this CPU (loop over vec_dot_fn).
using VecDotMultiFn = void (*)(int64_t n, const void* w, const void* act, size_t act_stride,
                               int64_t n_act, float* out);
VecDotMultiFn vec_dot_multi_fn(Type t);

// BF16 weights against activations expanded to float once (each value the
// float of its BF16 rounding, expand_bf16_activation): out[i] is the bits of
// vec_dot_fn(BF16) on the BF16 rows, but no activation is converted again for
// every weight row. Null where the CPU has no such kernel.
VecDotMultiFn bf16_dot_multi_f32act_fn();
// dst[i] = float(bf16(x[i])), rounded to nearest even as BF16's activation format.
void expand_bf16_activation(const float* x, float* dst, int64_t n);

}  // namespace glm5::quant

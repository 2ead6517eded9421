// Interleaved ("repacked") weight layouts and their GEMM kernels.
//
// A matrix of `rows` rows x `cols` values (Q4_K, Q6_K, Q5_0 or Q8_0) is
// repacked at load time into groups of R = repack_rows(t) = 16 consecutive
// rows, interleaved block by block so that one 64-byte load holds 4
// consecutive values of all 16 rows (Q5_0 / Q8_0 in pairs of 32-value blocks,
// the unit their reference kernels scale together; see repack_kernels.h). The
// GEMM then works as outer products: the weights of the 16 rows sit in the 16
// int32 lanes of a zmm register, one token's 4 activation bytes are broadcast
// to every lane, and vpdpbusd accumulates; no horizontal sums in the inner
// loop. The same kernels with one token are the GEMV of decode.
//
// Contract (the same as VecDotMultiFn): every output y[t][r] has exactly the
// bits of quant::vec_dot_fn(t)(cols, row r, act row t) on this machine. The
// integer part of each block is exact in int32 however it is computed; the
// float finish is the reference kernel's fixed sequence, done in vector lanes
// with the scalar ops in the same order (FMAs exactly where it has them).
//
// Layout of a repacked matrix (repacked_bytes(t, cols, rows) bytes):
//   n_groups = rows / R groups, each repacked_group_bytes(t, cols) bytes (the
//   group's blocks in order), then the rows % R remaining rows verbatim in
//   their plain GGUF layout (repacked_tail()), to be handled with the
//   ordinary kernels (vec_dot_fn / vec_dot_multi_fn). Group g covers rows
//   R*g .. R*g + R-1, so group g starts at packed + g * repacked_group_bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace glm5 {
class ThreadPool;
}

namespace glm5::quant {

// Rows per group (16) for a type this CPU can repack, 0 otherwise.
int repack_rows(Type t);

// True when t has a repacked GEMM on this CPU (AVX-512 F/BW/VL/DQ/VNNI) and
// cols is a positive multiple of its block: 256 values for Q4_K and Q6_K, 32
// for Q5_0 and Q8_0.
bool repack_supported(Type t, int64_t cols);

// Bytes of one group of repack_rows(t) rows.
size_t repacked_group_bytes(Type t, int64_t cols);

// Bytes of a whole repacked matrix: whole groups plus the plain tail rows. This
// is row_size(t, cols) * rows (the layout only moves bytes), plus 64 bytes per
// group and super-block for Q4_K, and 32 bytes per group for Q5_0 / Q8_0 rows
// of an odd block count.
size_t repacked_bytes(Type t, int64_t cols, int64_t rows);

// Repack `rows` plain rows (row_size(t, cols) bytes each, contiguous) into dst
// (repacked_bytes(t, cols, rows) bytes). Pure byte shuffling, any CPU.
void repack(Type t, const void* src_rows, void* dst, int64_t cols, int64_t rows);

// repack() of `slices` matrices stored one after another (src: `rows` plain
// rows each; dst: repacked_bytes(t, cols, rows) each), spread over the
// pool's threads in pieces of whole groups: the same bytes as one repack()
// call per slice.
void repack_slices(Type t, const void* src, void* dst, int64_t cols, int64_t rows, int64_t slices,
                   ThreadPool& pool);

// The plain-layout rows after the last whole group (rows % R of them).
const void* repacked_tail(Type t, const void* packed, int64_t cols, int64_t rows);

// Row r of a repacked matrix back in its plain layout (row_size(t, cols)
// bytes): for the rare consumer that needs one row (a get_rows of a repacked
// embedding) and for tests. unrepack does it for every row.
void repacked_row(Type t, const void* packed, int64_t cols, int64_t rows, int64_t r, void* out);
void unrepack(Type t, const void* packed, void* dst_rows, int64_t cols, int64_t rows);

// y[t * y_tok_stride + i] = dot(row i, activation row t) for the rows i in
// [0, R * n_groups) of the n_groups consecutive groups starting at `groups`
// (a group boundary of a repacked matrix: packed + g0 * repacked_group_bytes
// gives rows R*g0 ... as i = 0 ...), and tokens t in [0, n_tok). Activation
// row t is `act + t * act_stride` bytes, in the weight's vec_dot_type (Q8_K
// for the K-quants, Q8_0 for Q5_0 / Q8_0), cols values. Requires
// repack_supported(t, cols).
//
// Work is ordered token tiles outside, groups inside: a call reads its
// activations once per group and its weights once per token tile (K-quants:
// 16 tokens, the group's block decoded once per 16 for Q4_K and once per pass of
// up to 8 for Q6_K; Q5_0 / Q8_0: up to 64
// tokens, one pass over the group per token). For large products, call it on
// blocks that fit the L2 cache together (e.g. 64 tokens x 4-16 groups) and
// spread such blocks over threads. At the AMX level, Q4_K and Q6_K products
// where amx_gemm(t, n_tok) holds run on the tile unit instead (the same
// bits): groups outside, each block expanded once into tiles for every token
// of the call (up to 256 at a time).
void gemm_repacked(Type t, int64_t cols, const void* groups, int64_t n_groups, const void* act,
                   size_t act_stride, int64_t n_tok, float* y, size_t y_tok_stride);

// True when a product of n_tok tokens on a repacked t matrix runs on the AMX
// tile unit (only at the AMX level, for Q4_K and Q6_K).
bool amx_gemm(Type t, int64_t n_tok);

// The same with one pointer per token for the activation row and for the
// output row (y_rows[t][i] for i in [0, R * n_groups)): for gathered tokens,
// such as the MoE's pairs routed to one expert.
void gemm_repacked_rows(Type t, int64_t cols, const void* groups, int64_t n_groups,
                        const void* const* act_rows, int64_t n_tok, float* const* y_rows);

}  // namespace glm5::quant

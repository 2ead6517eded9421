// Internal to src/quant: the repacked block layouts (repack.h) and the GEMM
// kernels over them, defined in repack_avx512.cpp. Declarations and plain
// structs only: this header is included by files built with different ISA
// flags, so it must not define inline code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/blocks.h"

namespace glm5::quant::repacked {

constexpr int kRows = 16;  // rows per group: the 16 int32 lanes of a zmm

// One super-block (256 values) of 16 Q4_K rows. qs[k][c][r] holds the 4
// bytes qs[32k + 4c .. 32k + 4c + 3] of row r's block: low nibbles are values
// 64k + 4c.. of sub-block 2k, high nibbles values 64k + 32 + 4c.. of 2k + 1.
struct Q4KGroupBlock {
    uint16_t d[kRows];
    uint16_t dmin[kRows];
    uint8_t scales[8][kRows];   // [sub-block j][row], 6-bit
    uint8_t mins[4][kRows][2];  // [pair i][row][e] = min of sub-block 2i + e
    uint8_t qs[4][8][kRows][4];
};

// One super-block of 16 Q6_K rows, per 128-value half h: ql[h][p][c][r] holds
// bytes ql[64h + 32p + 4c ..+3] of row r (low nibbles: values 128h + 32p +
// 4c.., high nibbles: 128h + 64 + 32p + 4c..), qh[h][c][r] bytes qh[32h + 4c
// ..+3] (bits 2s..2s+1: top bits of value 128h + 32s + 4c..).
struct Q6KGroupBlock {
    uint16_t d[kRows];
    int8_t scales[8][kRows][2];  // [pair i][row][e] = scale of sub-block 2i + e
    uint8_t ql[2][2][8][kRows][4];
    uint8_t qh[2][8][kRows][4];
};

static_assert(sizeof(Q4KGroupBlock) == 2368 && sizeof(Q6KGroupBlock) == 16 * sizeof(BlockQ6_K));

// y_rows[t][16 * g + r] for groups g < n_groups (each nb group-blocks,
// consecutive), tokens t < n_tok; acts[t] are Q8_K rows of nb blocks.
void gemm_q4_K_avx512(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);
void gemm_q6_K_avx512(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);

}  // namespace glm5::quant::repacked

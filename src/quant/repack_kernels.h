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

// One super-block of 16 Q6_K rows. Per 128-value half h the bytes are in the
// order the kernel first reads them, so a stream of groups is read front to
// back and the hardware prefetchers keep up (with each qh vector 2 KiB after
// its ql vector the memory-bound GEMV ran at half the speed). For c < 8:
// half[h].lq[c].ql[r] = bytes ql[64h + 4c ..+3] of row r (low nibbles: values
// 128h + 4c.., high: 128h + 64 + 4c..), half[h].lq[c].qh[r] = bytes
// qh[32h + 4c ..+3] (bits 2s..2s+1: top bits of value 128h + 32s + 4c..),
// half[h].ql1[c][r] = bytes ql[64h + 32 + 4c ..+3] (values 128h + 32 + 4c..
// and 128h + 96 + 4c..).
struct Q6KGroupBlock {
    uint16_t d[kRows];
    int8_t scales[8][kRows][2];  // [pair i][row][e] = scale of sub-block 2i + e
    struct Half {
        struct {
            uint8_t ql[kRows][4];
            uint8_t qh[kRows][4];
            uint8_t ql1[kRows][4];
        } lq[8];
    } half[2];
};

// Q8_0 and Q5_0 (32-value blocks, Q8_0 activations). The reference kernels
// scale and accumulate two blocks per step, so a group stores its blocks in
// pairs (the unit the GEMM consumes), and one single block last when the row
// has an odd block count. Every 64-byte vector starts on a 64-byte boundary
// of the group, and each unit is read front to back.
//
// Q8_0: qs[e][c][r] holds bytes qs[4c ..+3] of row r's block e of the unit,
// each plus 128 (stored as unsigned, the operand vpdpbusd wants unsigned; the
// GEMM subtracts 128 * sum(activations) exactly).
struct Q80GroupPair {
    uint16_t d[2][kRows];
    uint8_t qs[2][8][kRows][4];
};
struct Q80GroupOne {
    uint16_t d[1][kRows];
    uint8_t pad[32];
    uint8_t qs[1][8][kRows][4];
};

// Q5_0: qs[e][c][r] holds bytes qs[4c ..+3] of row r (low nibbles: values
// 4c.., high nibbles: 16 + 4c..); qh[e][c] has bit 4r + i set when value
// 4c + i of row r has its fifth bit, ready as a byte mask for 64-byte vectors.
struct Q50GroupPair {
    uint16_t d[2][kRows];
    uint64_t qh[2][8];
    uint8_t qs[2][4][kRows][4];
};
struct Q50GroupOne {
    uint16_t d[1][kRows];
    uint8_t pad[32];
    uint64_t qh[1][8];
    uint8_t qs[1][4][kRows][4];
};

static_assert(sizeof(Q4KGroupBlock) == 2368 && sizeof(Q6KGroupBlock) == 16 * sizeof(BlockQ6_K));
static_assert(sizeof(Q80GroupPair) == 17 * 64 && sizeof(Q80GroupOne) == 9 * 64);
static_assert(sizeof(Q50GroupPair) == 11 * 64 && sizeof(Q50GroupOne) == 6 * 64);

// y_rows[t][16 * g + r] for groups g < n_groups (each nb group-blocks,
// consecutive), tokens t < n_tok; acts[t] are Q8_K rows of nb blocks.
void gemm_q4_K_avx512(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);
void gemm_q6_K_avx512(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                      const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);
// The same outputs, bit for bit, on the AMX tile unit (repack_amx.cpp): for
// many tokens; the caller checks cpu_has_amx().
void gemm_q4_K_amx(int64_t nb, const Q4KGroupBlock* groups, int64_t n_groups,
                   const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);
void gemm_q6_K_amx(int64_t nb, const Q6KGroupBlock* groups, int64_t n_groups,
                   const BlockQ8_K* const* acts, int64_t n_tok, float* const* y_rows);
// nb: 32-value blocks per row; acts[t] are Q8_0 rows of nb blocks; a group is
// nb / 2 pairs then nb % 2 single blocks.
void gemm_q8_0_avx512(int64_t nb, const void* groups, int64_t n_groups,
                      const BlockQ8_0* const* acts, int64_t n_tok, float* const* y_rows);
void gemm_q5_0_avx512(int64_t nb, const void* groups, int64_t n_groups,
                      const BlockQ8_0* const* acts, int64_t n_tok, float* const* y_rows);

}  // namespace glm5::quant::repacked

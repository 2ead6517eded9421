// Repacking of Q4_K / Q6_K / Q5_0 / Q8_0 matrices into 16-row interleaved groups (see
// repack.h and the layouts in repack_kernels.h), and the dispatch to the
// AVX-512 GEMM kernels. The byte shuffling here is plain C++ for any CPU.
#include "quant/repack.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/common.h"
#include "quant/ops.h"
#include "quant/repack_kernels.h"

namespace glm5::quant {

namespace {

using repacked::kRows;
using repacked::Q4KGroupBlock;
using repacked::Q50GroupOne;
using repacked::Q50GroupPair;
using repacked::Q6KGroupBlock;
using repacked::Q80GroupOne;
using repacked::Q80GroupPair;

bool is_legacy(Type t) {
    return t == Type::Q5_0 || t == Type::Q8_0;
}

bool is_repackable(Type t) {
    return t == Type::Q4_K || t == Type::Q6_K || is_legacy(t);
}

// Values per block: the unit a row length must be a multiple of.
int64_t block_values(Type t) {
    return is_legacy(t) ? QK : QK_K;
}

bool cols_ok(Type t, int64_t cols) {
    return cols > 0 && cols % block_values(t) == 0;
}

void check(Type t, int64_t cols) {
    if (!is_repackable(t) || !cols_ok(t, cols))
        throw Error(std::string("repack: ") + name(t) + " rows of " + std::to_string(cols) +
                    " values have no repacked layout");
}

template <typename Pair, typename One>
size_t legacy_group_bytes(int64_t nb) {
    return size_t(nb / 2) * sizeof(Pair) + size_t(nb % 2) * sizeof(One);
}

size_t group_bytes(Type t, int64_t nb) {
    switch (t) {
        case Type::Q4_K:
            return size_t(nb) * sizeof(Q4KGroupBlock);
        case Type::Q6_K:
            return size_t(nb) * sizeof(Q6KGroupBlock);
        case Type::Q8_0:
            return legacy_group_bytes<Q80GroupPair, Q80GroupOne>(nb);
        default:
            return legacy_group_bytes<Q50GroupPair, Q50GroupOne>(nb);
    }
}

// Row r (< 16) of `rows`: block b <-> group block position. `to_group` picks
// the direction, so packing and unpacking share one description of the layout.
template <bool to_group>
void move_q4_K(BlockQ4_K& x, Q4KGroupBlock& g, int r) {
    auto mv = [](auto& plain, auto& packed) {
        if constexpr (to_group)
            packed = plain;
        else
            plain = packed;
    };
    mv(x.d, g.d[r]);
    mv(x.dmin, g.dmin[r]);
    // The 12 packed scale bytes are unpacked to 8 scales and 8 mins; packing
    // them back is exact (each is 6 bits).
    if constexpr (to_group) {
        uint8_t sc[8], mn[8];
        unpack_k4_scales(x.scales, sc, mn);
        for (int j = 0; j < 8; ++j) {
            g.scales[j][r] = sc[j];
            g.mins[j / 2][r][j % 2] = mn[j];
        }
    } else {
        uint8_t* q = x.scales;
        for (int j = 0; j < 4; ++j) {
            q[j] = uint8_t((g.scales[j][r] & 63) | ((g.scales[j + 4][r] >> 4) << 6));
            q[j + 4] = uint8_t((g.mins[j / 2][r][j % 2] & 63) |
                               ((g.mins[(j + 4) / 2][r][j % 2] >> 4) << 6));
            q[j + 8] =
                uint8_t((g.scales[j + 4][r] & 0xF) | ((g.mins[(j + 4) / 2][r][j % 2] & 0xF) << 4));
        }
    }
    for (int k = 0; k < 4; ++k)
        for (int c = 0; c < 8; ++c)
            for (int b = 0; b < 4; ++b) mv(x.qs[32 * k + 4 * c + b], g.qs[k][c][r][b]);
}

template <bool to_group>
void move_q6_K(BlockQ6_K& x, Q6KGroupBlock& g, int r) {
    auto mv = [](auto& plain, auto& packed) {
        if constexpr (to_group)
            packed = plain;
        else
            plain = packed;
    };
    mv(x.d, g.d[r]);
    for (int j = 0; j < 16; ++j) mv(x.scales[j], g.scales[j / 2][r][j % 2]);
    for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 8; ++c)
            for (int b = 0; b < 4; ++b) {
                mv(x.ql[64 * h + 4 * c + b], g.half[h].lq[c].ql[r][b]);
                mv(x.ql[64 * h + 32 + 4 * c + b], g.half[h].lq[c].ql1[r][b]);
                mv(x.qh[32 * h + 4 * c + b], g.half[h].lq[c].qh[r][b]);
            }
}

// Block e of a Q8_0 pair (or single) <-> row r's plain block.
template <bool to_group, typename Unit>
void move_q8_0(BlockQ8_0& x, Unit& g, int e, int r) {
    if constexpr (to_group) {
        g.d[e][r] = x.d;
        for (int c = 0; c < 8; ++c)
            for (int i = 0; i < 4; ++i) g.qs[e][c][r][i] = uint8_t(x.qs[4 * c + i] ^ 0x80);
    } else {
        x.d = g.d[e][r];
        for (int c = 0; c < 8; ++c)
            for (int i = 0; i < 4; ++i) x.qs[4 * c + i] = int8_t(g.qs[e][c][r][i] ^ 0x80);
    }
}

template <bool to_group, typename Unit>
void move_q5_0(BlockQ5_0& x, Unit& g, int e, int r) {
    if constexpr (to_group) {
        g.d[e][r] = x.d;
        uint32_t qh;
        std::memcpy(&qh, x.qh, 4);
        for (int c = 0; c < 8; ++c) {
            g.qh[e][c] |= uint64_t((qh >> (4 * c)) & 0xF) << (4 * r);
        }
    } else {
        x.d = g.d[e][r];
        uint32_t qh = 0;
        for (int c = 0; c < 8; ++c) qh |= uint32_t((g.qh[e][c] >> (4 * r)) & 0xF) << (4 * c);
        std::memcpy(x.qh, &qh, 4);
    }
    for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i) {
            if constexpr (to_group)
                g.qs[e][c][r][i] = x.qs[4 * c + i];
            else
                x.qs[4 * c + i] = g.qs[e][c][r][i];
        }
}

// Block b (of nb) of a legacy group: pairs first, then the single last block
// of an odd count.
template <bool to_group, typename Block, typename Pair, typename One, typename Move>
void move_legacy(Block& x, uint8_t* group, int64_t nb, int64_t b, int r, Move move) {
    if (nb % 2 == 1 && b == nb - 1)
        move(x, *reinterpret_cast<One*>(group + size_t(nb / 2) * sizeof(Pair)), 0, r);
    else
        move(x, reinterpret_cast<Pair*>(group)[b / 2], int(b % 2), r);
}

// Moves rows r0..r1-1 of one group between plain rows (the first at `plain`)
// and the group's blocks.
template <bool to_group>
void move_group(Type t, uint8_t* plain, size_t row_bytes, uint8_t* group, int64_t nb, int r0,
                int r1) {
    for (int r = r0; r < r1; ++r) {
        uint8_t* row = plain + size_t(r - r0) * row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
            switch (t) {
                case Type::Q4_K:
                    move_q4_K<to_group>(reinterpret_cast<BlockQ4_K*>(row)[b],
                                        reinterpret_cast<Q4KGroupBlock*>(group)[b], r);
                    break;
                case Type::Q6_K:
                    move_q6_K<to_group>(reinterpret_cast<BlockQ6_K*>(row)[b],
                                        reinterpret_cast<Q6KGroupBlock*>(group)[b], r);
                    break;
                case Type::Q8_0:
                    move_legacy<to_group, BlockQ8_0, Q80GroupPair, Q80GroupOne>(
                        reinterpret_cast<BlockQ8_0*>(row)[b], group, nb, b, r,
                        [](auto& x, auto& g, int e, int rr) { move_q8_0<to_group>(x, g, e, rr); });
                    break;
                default:
                    move_legacy<to_group, BlockQ5_0, Q50GroupPair, Q50GroupOne>(
                        reinterpret_cast<BlockQ5_0*>(row)[b], group, nb, b, r,
                        [](auto& x, auto& g, int e, int rr) { move_q5_0<to_group>(x, g, e, rr); });
                    break;
            }
        }
    }
}

}  // namespace

int repack_rows(Type t) {
    return is_repackable(t) && cpu_has_avx512() ? kRows : 0;
}

bool repack_supported(Type t, int64_t cols) {
    return repack_rows(t) != 0 && cols_ok(t, cols);
}

size_t repacked_group_bytes(Type t, int64_t cols) {
    check(t, cols);
    return group_bytes(t, cols / block_values(t));
}

size_t repacked_bytes(Type t, int64_t cols, int64_t rows) {
    return size_t(rows / kRows) * repacked_group_bytes(t, cols) +
           size_t(rows % kRows) * row_size(t, cols);
}

const void* repacked_tail(Type t, const void* packed, int64_t cols, int64_t rows) {
    return static_cast<const uint8_t*>(packed) +
           size_t(rows / kRows) * repacked_group_bytes(t, cols);
}

void repack(Type t, const void* src_rows, void* dst, int64_t cols, int64_t rows) {
    const size_t gb = repacked_group_bytes(t, cols), rb = row_size(t, cols);
    const int64_t nb = cols / block_values(t), n_groups = rows / kRows;
    // Plain blocks are read through non-const pointers by the shared mover;
    // they are never written when packing.
    auto* src = static_cast<uint8_t*>(const_cast<void*>(src_rows));
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t g = 0; g < n_groups; ++g) {
        // Zeroed first: padding is deterministic and Q5_0's bit masks are
        // assembled row by row.
        std::memset(out + size_t(g) * gb, 0, gb);
        move_group<true>(t, src + size_t(g * kRows) * rb, rb, out + size_t(g) * gb, nb, 0, kRows);
    }
    std::memcpy(out + size_t(n_groups) * gb, src + size_t(n_groups * kRows) * rb,
                size_t(rows % kRows) * rb);
}

void repack_slices(Type t, const void* src, void* dst, int64_t cols, int64_t rows, int64_t slices,
                   ThreadPool& pool) {
    // Pieces of 64 groups; the last piece of a slice also takes its tail rows.
    constexpr int64_t kPieceRows = 64 * kRows;
    const int64_t per_slice = std::max<int64_t>(1, rows / kPieceRows);
    const int64_t n = slices * per_slice;
    const size_t rb = row_size(t, cols), gb = repacked_group_bytes(t, cols);
    const size_t packed = repacked_bytes(t, cols, rows);
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
            const int64_t s = i / per_slice, k = i % per_slice;
            const int64_t r0 = k * kPieceRows, r1 = k + 1 == per_slice ? rows : r0 + kPieceRows;
            repack(t,
                   static_cast<const uint8_t*>(src) + (size_t(s) * size_t(rows) + size_t(r0)) * rb,
                   static_cast<uint8_t*>(dst) + size_t(s) * packed + size_t(r0 / kRows) * gb, cols,
                   r1 - r0);
        }
    });
}

void repacked_row(Type t, const void* packed, int64_t cols, int64_t rows, int64_t r, void* out) {
    const size_t gb = repacked_group_bytes(t, cols), rb = row_size(t, cols);
    const int64_t n_groups = rows / kRows;
    auto* p = static_cast<uint8_t*>(const_cast<void*>(packed));
    if (r >= n_groups * kRows) {
        std::memcpy(out, p + size_t(n_groups) * gb + size_t(r - n_groups * kRows) * rb, rb);
        return;
    }
    const int lane = int(r % kRows);
    // Unpacking only writes `out`; the group blocks are read.
    move_group<false>(t, static_cast<uint8_t*>(out), rb, p + size_t(r / kRows) * gb,
                      cols / block_values(t), lane, lane + 1);
}

void unrepack(Type t, const void* packed, void* dst_rows, int64_t cols, int64_t rows) {
    const size_t rb = row_size(t, cols);
    for (int64_t r = 0; r < rows; ++r)
        repacked_row(t, packed, cols, rows, r, static_cast<uint8_t*>(dst_rows) + size_t(r) * rb);
}

bool amx_gemm(Type t, int64_t n_tok) {
    if (!cpu_has_amx()) return false;
    // Below these token counts (measured) expanding a group's weight bytes into tiles
    // costs more than the tile products save (bench/bench_gemm.cpp).
    if (t == Type::Q4_K) return n_tok >= 16;
    if (t == Type::Q6_K) return n_tok >= 32;
    return false;
}

void gemm_repacked_rows(Type t, int64_t cols, const void* groups, int64_t n_groups,
                        const void* const* act_rows, int64_t n_tok, float* const* y_rows) {
    if (!repack_supported(t, cols))
        throw Error(std::string("gemm_repacked: no repacked kernel for ") + name(t) + " x " +
                    std::to_string(cols) + " on this CPU");
    if (n_groups <= 0 || n_tok <= 0) return;
    const auto* const* acts = reinterpret_cast<const BlockQ8_K* const*>(act_rows);
    const auto* const* acts_q8_0 = reinterpret_cast<const BlockQ8_0* const*>(act_rows);
    switch (t) {
        case Type::Q4_K:
            (amx_gemm(t, n_tok) ? repacked::gemm_q4_K_amx : repacked::gemm_q4_K_avx512)(
                cols / QK_K, static_cast<const Q4KGroupBlock*>(groups), n_groups, acts, n_tok,
                y_rows);
            break;
        case Type::Q6_K:
            (amx_gemm(t, n_tok) ? repacked::gemm_q6_K_amx : repacked::gemm_q6_K_avx512)(
                cols / QK_K, static_cast<const Q6KGroupBlock*>(groups), n_groups, acts, n_tok,
                y_rows);
            break;
        case Type::Q8_0:
            repacked::gemm_q8_0_avx512(cols / QK, groups, n_groups, acts_q8_0, n_tok, y_rows);
            break;
        default:
            repacked::gemm_q5_0_avx512(cols / QK, groups, n_groups, acts_q8_0, n_tok, y_rows);
            break;
    }
}

void gemm_repacked(Type t, int64_t cols, const void* groups, int64_t n_groups, const void* act,
                   size_t act_stride, int64_t n_tok, float* y, size_t y_tok_stride) {
    // Pointers per token tile, so long token ranges need no allocation. The
    // AMX kernels expand each weight block once per call: the more tokens a
    // call takes, the fewer times.
    constexpr int64_t kChunk = 256;
    const void* a[kChunk];
    float* o[kChunk];
    for (int64_t t0 = 0; t0 < n_tok; t0 += kChunk) {
        const int64_t nt = std::min(kChunk, n_tok - t0);
        for (int64_t i = 0; i < nt; ++i) {
            a[i] = static_cast<const uint8_t*>(act) + size_t(t0 + i) * act_stride;
            o[i] = y + size_t(t0 + i) * y_tok_stride;
        }
        gemm_repacked_rows(t, cols, groups, n_groups, a, nt, o);
    }
}

}  // namespace glm5::quant

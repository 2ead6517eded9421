// The repacked (16-row interleaved) Q4_K / Q6_K / Q5_0 / Q8_0 layouts and their
// GEMM: the layout is a lossless rearrangement of the bytes, and every (row,
// token) output of the GEMM has exactly the bits of the single-row kernel
// (vec_dot_fn), for whole groups, group sub-ranges, gathered tokens, token
// counts that are not a multiple of the tile, rows of an odd number of
// 32-value blocks (Q5_0 / Q8_0: 192 values as attn_k_b, 224, 32), and extreme
// block contents.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "quant/ops.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "quant_test_util.h"

using namespace glm5;
using namespace glm5::quant;

namespace {

const Type kTypes[] = {Type::Q4_K, Type::Q6_K, Type::Q5_0, Type::Q8_0};

bool is_legacy(Type t) {
    return t == Type::Q5_0 || t == Type::Q8_0;
}

// Values per block: row lengths are multiples of it.
int64_t unit(Type t) {
    return is_legacy(t) ? 32 : 256;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// rows x cols weights: quantized varied data, or raw random blocks (every
// level, scale and min bit pattern, including the largest magnitudes).
std::vector<uint8_t> make_weights(Type t, int64_t cols, int64_t rows, uint32_t seed, bool raw) {
    if (raw) return test::random_blocks(t, cols * rows, seed);
    return test::quantize(t, test::varied_floats(size_t(cols * rows), seed), rows);
}

// Activation rows in t's vec_dot_type (Q8_K or Q8_0): rounded normal data at
// several magnitudes, one all zero row (d = 0), and one of saturated levels
// (+-127, with exact bsums for Q8_K).
std::vector<uint8_t> make_acts(Type t, int64_t cols, int64_t n_tok, uint32_t seed) {
    const Type at = traits(t).vec_dot_type;
    const size_t arow = row_size(at, cols);
    std::vector<uint8_t> acts(arow * size_t(n_tok));
    std::mt19937 rng(seed);
    for (int64_t tk = 0; tk < n_tok; ++tk) {
        uint8_t* a = acts.data() + arow * size_t(tk);
        if (tk % 7 == 3) {
            std::vector<float> zero(size_t(cols), 0.0f);
            quantize_activation_row(at, zero.data(), a, cols);
        } else if (tk % 7 == 5 && at == Type::Q8_K) {
            auto* blocks = reinterpret_cast<BlockQ8_K*>(a);
            for (int64_t b = 0; b < cols / QK_K; ++b) {
                blocks[b].d = 0.01f * float(1 + rng() % 100);
                for (auto& q : blocks[b].qs) q = (rng() & 1) ? 127 : -127;
                for (int j = 0; j < QK_K / 16; ++j) {
                    int s = 0;
                    for (int l = 0; l < 16; ++l) s += blocks[b].qs[16 * j + l];
                    blocks[b].bsums[j] = int16_t(s);
                }
            }
        } else if (tk % 7 == 5) {
            auto* blocks = reinterpret_cast<BlockQ8_0*>(a);
            for (int64_t b = 0; b < cols / QK; ++b) {
                blocks[b].d = fp32_to_fp16(0.01f * float(1 + rng() % 100));
                for (auto& q : blocks[b].qs) q = (rng() & 1) ? 127 : -127;
            }
        } else {
            const float sigma = (tk % 3 == 0) ? 30.0f : (tk % 3 == 1 ? 1.0f : 1e-3f);
            const auto x = test::normal_floats(size_t(cols), seed * 131 + uint32_t(tk), sigma);
            quantize_activation_row(at, x.data(), a, cols);
        }
    }
    return acts;
}

TEST(QuantRepack, SupportedOnlyWhereAKernelRuns) {
    for (Type t : {Type::Q4_0, Type::Q4_1, Type::Q5_1, Type::Q5_K, Type::IQ2_XXS, Type::F32})
        EXPECT_FALSE(repack_supported(t, 2048)) << name(t);
    for (Type t : kTypes) {
        const int64_t u = unit(t);
        EXPECT_EQ(repack_supported(t, 2048), cpu_has_avx512()) << name(t);
        EXPECT_EQ(repack_supported(t, 6 * u), cpu_has_avx512()) << name(t);
        EXPECT_EQ(repack_rows(t), cpu_has_avx512() ? 16 : 0) << name(t);
        EXPECT_FALSE(repack_supported(t, 0));
        EXPECT_FALSE(repack_supported(t, -u));
        EXPECT_FALSE(repack_supported(t, u + 16)) << name(t);
        EXPECT_EQ(repacked_bytes(t, 2 * u, 37),
                  2 * repacked_group_bytes(t, 2 * u) + 5 * row_size(t, 2 * u));
    }
    EXPECT_FALSE(repack_supported(Type::Q4_K, 192));  // K-quants: whole super-blocks only
    // Q6_K, and Q5_0 / Q8_0 with an even block count, only move bytes; Q4_K's
    // unpacked scales and mins take 64 more per block, an odd legacy block
    // count one half line of padding.
    EXPECT_EQ(repacked_group_bytes(Type::Q6_K, 768), 16 * row_size(Type::Q6_K, 768));
    EXPECT_EQ(repacked_group_bytes(Type::Q4_K, 768), 16 * row_size(Type::Q4_K, 768) + 3 * 64);
    for (Type t : {Type::Q5_0, Type::Q8_0}) {
        EXPECT_EQ(repacked_group_bytes(t, 192), 16 * row_size(t, 192)) << name(t);
        EXPECT_EQ(repacked_group_bytes(t, 224), 16 * row_size(t, 224) + 32) << name(t);
        EXPECT_EQ(repacked_group_bytes(t, 32), 16 * row_size(t, 32) + 32) << name(t);
    }
}

// Packing then unpacking gives the original bytes back, row by row and
// whole, and the tail rows are stored verbatim.
TEST(QuantRepack, RoundTripIsLossless) {
    for (Type t : kTypes)
        for (int64_t cols :
             is_legacy(t) ? std::vector<int64_t>{192, 224, 32} : std::vector<int64_t>{768})
            for (int64_t rows : {1, 15, 16, 17, 37, 64}) {
                const auto w = make_weights(t, cols, rows, uint32_t(rows) * 7 + 1, true);
                std::vector<uint8_t> packed(repacked_bytes(t, cols, rows));
                repack(t, w.data(), packed.data(), cols, rows);
                std::vector<uint8_t> back(w.size(), 0xAA);
                unrepack(t, packed.data(), back.data(), cols, rows);
                ASSERT_EQ(back, w) << name(t) << " cols=" << cols << " rows=" << rows;
                const size_t rb = row_size(t, cols);
                for (int64_t r : {int64_t(0), rows / 2, rows - 1}) {
                    std::vector<uint8_t> one(rb);
                    repacked_row(t, packed.data(), cols, rows, r, one.data());
                    ASSERT_EQ(0, std::memcmp(one.data(), w.data() + size_t(r) * rb, rb))
                        << name(t) << " row " << r;
                }
                const int64_t whole = rows / 16 * 16;
                ASSERT_EQ(0, std::memcmp(repacked_tail(t, packed.data(), cols, rows),
                                         w.data() + size_t(whole) * rb, size_t(rows - whole) * rb));
            }
}

// The threaded repack of a stack of matrices (the loader's path) writes the
// bytes of one repack() per slice: several pieces per slice, a tail, and more
// threads than pieces.
TEST(QuantRepack, SlicesOnThreadsMatchOneCallPerSlice) {
    for (Type t : {Type::Q4_K, Type::Q8_0})
        for (int64_t rows : {int64_t(2 * 1024 + 16 + 5), int64_t(40)}) {
            const int64_t cols = is_legacy(t) ? 64 : 256, slices = 3;
            const size_t rb = row_size(t, cols), packed = repacked_bytes(t, cols, rows);
            std::vector<uint8_t> w;
            for (int64_t s = 0; s < slices; ++s) {
                const auto ws = make_weights(t, cols, rows, uint32_t(s + 11), true);
                w.insert(w.end(), ws.begin(), ws.end());
            }
            ASSERT_EQ(w.size(), rb * size_t(rows * slices));
            std::vector<uint8_t> want(packed * size_t(slices)), got(want.size(), 0xAA);
            for (int64_t s = 0; s < slices; ++s)
                repack(t, w.data() + size_t(s * rows) * rb, want.data() + size_t(s) * packed, cols,
                       rows);
            for (int n_threads : {1, 3, 16}) {
                std::fill(got.begin(), got.end(), uint8_t(0xAA));
                glm5::ThreadPool pool(n_threads);
                repack_slices(t, w.data(), got.data(), cols, rows, slices, pool);
                ASSERT_EQ(got, want) << name(t) << " rows " << rows << " threads " << n_threads;
            }
        }
}

// Every output of the GEMM against the single-row kernel, bit for bit.
void check_gemm(Type t, int64_t cols, int64_t rows, int64_t n_tok, bool raw, uint32_t seed) {
    const auto w = make_weights(t, cols, rows, seed, raw);
    const auto acts = make_acts(t, cols, n_tok, seed + 1);
    const size_t rb = row_size(t, cols), arow = row_size(traits(t).vec_dot_type, cols);
    std::vector<uint8_t> packed(repacked_bytes(t, cols, rows));
    repack(t, w.data(), packed.data(), cols, rows);
    const int64_t n_groups = rows / 16;
    const VecDotFn dot = vec_dot_fn(t);

    // Whole matrix, strided outputs with padding between tokens.
    const size_t ys = size_t(rows) + 3;
    std::vector<float> y(ys * size_t(n_tok), -1.0f);
    gemm_repacked(t, cols, packed.data(), n_groups, acts.data(), arow, n_tok, y.data(), ys);
    for (int64_t tk = 0; tk < n_tok; ++tk)
        for (int64_t r = 0; r < n_groups * 16; ++r) {
            const float want =
                dot(cols, w.data() + size_t(r) * rb, acts.data() + size_t(tk) * arow);
            const float got = y[size_t(tk) * ys + size_t(r)];
            ASSERT_EQ(bits(want), bits(got)) << name(t) << " cols=" << cols << " rows=" << rows
                                             << " n_tok=" << n_tok << " raw=" << raw << " row " << r
                                             << " token " << tk << ": " << want << " vs " << got;
        }
    // Nothing written past the groups (the tail is the caller's).
    for (int64_t tk = 0; tk < n_tok; ++tk)
        for (size_t i = size_t(n_groups * 16); i < ys; ++i)
            ASSERT_EQ(y[size_t(tk) * ys + i], -1.0f);

    // From the second group on, with gathered tokens in reverse order.
    if (n_groups >= 2) {
        std::vector<const void*> ap(static_cast<size_t>(n_tok));
        std::vector<std::vector<float>> out(size_t(n_tok),
                                            std::vector<float>(size_t(n_groups - 1) * 16));
        std::vector<float*> op(static_cast<size_t>(n_tok));
        for (int64_t i = 0; i < n_tok; ++i) {
            ap[size_t(i)] = acts.data() + size_t(n_tok - 1 - i) * arow;
            op[size_t(i)] = out[size_t(i)].data();
        }
        gemm_repacked_rows(t, cols, packed.data() + repacked_group_bytes(t, cols), n_groups - 1,
                           ap.data(), n_tok, op.data());
        for (int64_t i = 0; i < n_tok; ++i)
            for (int64_t r = 16; r < n_groups * 16; ++r) {
                const float want = dot(cols, w.data() + size_t(r) * rb,
                                       static_cast<const uint8_t*>(ap[size_t(i)]));
                ASSERT_EQ(bits(want), bits(out[size_t(i)][size_t(r - 16)]))
                    << name(t) << " gathered token " << i << " row " << r;
            }
    }
}

TEST(QuantRepack, GemmBitIdenticalToSingleRowKernel) {
    ASSERT_EQ(repack_supported(Type::Q4_K, 256), cpu_has_avx512());
    // The tile unit takes the K-quants' many-token products exactly at the AMX level.
    for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0})
        EXPECT_EQ(amx_gemm(t, 64), t != Type::Q8_0 && cpu_level() >= CpuLevel::Amx) << name(t);
    EXPECT_FALSE(amx_gemm(Type::Q4_K, 1));
    if (!cpu_has_avx512()) return;  // nothing to run: checked above that none is offered
    uint32_t seed = 1;
    for (Type t : kTypes) {
        const int64_t u = unit(t);
        // Token counts around the K-quant tile (16) and a legacy row of
        // attn_k_b's length (192 values: 6 blocks, 3 pairs).
        const int64_t c0 = is_legacy(t) ? 192 : 512;
        for (int64_t n_tok = 1; n_tok <= 17; ++n_tok)
            check_gemm(t, c0, 37, n_tok, (n_tok & 1) != 0, seed++);
        for (int64_t cols : {u, 3 * u, 7 * u, 8 * u})
            for (int64_t n_tok : {int64_t(1), int64_t(16), int64_t(33)}) {
                check_gemm(t, cols, 48, n_tok, false, seed++);
                check_gemm(t, cols, 32, n_tok, true, seed++);
            }
        check_gemm(t, 6 * u, 16, 5, false, seed++);
        // Prefill's token counts: on the AMX tile unit at that level (pairs of
        // 16-token tiles, a last tile alone, zero padding).
        if (!is_legacy(t))
            for (int64_t n_tok : {8, 31, 40, 100, 300})
                check_gemm(t, 3 * u, 32, n_tok, (n_tok & 1) == 0, seed++);
        // Enough groups for the few-token kernels that read several side by
        // side (9 groups: two runs of four, one group alone, then a tail;
        // Q4_K up to 8 tokens, Q6_K up to 4); the legacy ones only on rows
        // of 16 blocks or more.
        for (int64_t n_tok = 1; n_tok <= 9; ++n_tok)
            check_gemm(t, (is_legacy(t) ? 16 : 2) * u, 16 * 9 + 5, n_tok, (n_tok & 1) == 0, seed++);
        // Long legacy rows (a Q8_0 model's 2048 and 6144 values); more tokens
        // than one activation chunk of the legacy kernels.
        if (is_legacy(t)) {
            check_gemm(t, 2048, 32, 3, true, seed++);
            check_gemm(t, 6144, 16, 2, false, seed++);
            check_gemm(t, 192, 32, 70, false, seed++);
        }
    }
}

}  // namespace

namespace {

// Q4_K at the largest half sub-block sums: every level 15 against activations
// of all -128 or all +127, so each 16-value half-dot is +-30720 or 30480 (the
// GEMM scales those halves as int16: one more bit of headroom would be gone).
TEST(QuantRepack, Q4KGemmExactAtTheLargestHalfSums) {
    if (!repack_supported(Type::Q4_K, 512)) GTEST_SKIP() << "no repacked GEMM on this CPU";
    const int64_t cols = 512, rows = 32;
    auto w = test::random_blocks(Type::Q4_K, cols * rows, 7);
    for (size_t b = 0; b < w.size(); b += sizeof(BlockQ4_K))
        std::memset(reinterpret_cast<BlockQ4_K*>(w.data() + b)->qs, 0xFF, QK_K / 2);
    std::vector<uint8_t> packed(repacked_bytes(Type::Q4_K, cols, rows));
    repack(Type::Q4_K, w.data(), packed.data(), cols, rows);
    const size_t rb = row_size(Type::Q4_K, cols), arow = row_size(Type::Q8_K, cols);
    const VecDotFn dot = vec_dot_fn(Type::Q4_K);
    for (int64_t n_tok : {1, 2, 3, 4, 16}) {
        std::vector<uint8_t> acts(arow * size_t(n_tok));
        for (int64_t tk = 0; tk < n_tok; ++tk) {
            auto* blocks = reinterpret_cast<BlockQ8_K*>(acts.data() + arow * size_t(tk));
            const int8_t level = tk % 2 == 0 ? -128 : 127;
            for (int64_t b = 0; b < cols / QK_K; ++b) {
                blocks[b].d = 0.5f + float(tk);
                std::memset(blocks[b].qs, static_cast<uint8_t>(level), QK_K);
                for (auto& s : blocks[b].bsums) s = int16_t(16 * level);
            }
        }
        std::vector<float> y(size_t(rows * n_tok));
        gemm_repacked(Type::Q4_K, cols, packed.data(), rows / 16, acts.data(), arow, n_tok,
                      y.data(), size_t(rows));
        for (int64_t tk = 0; tk < n_tok; ++tk)
            for (int64_t r = 0; r < rows; ++r) {
                const float want =
                    dot(cols, w.data() + size_t(r) * rb, acts.data() + size_t(tk) * arow);
                ASSERT_EQ(bits(want), bits(y[size_t(tk * rows + r)]))
                    << "n_tok " << n_tok << " token " << tk << " row " << r;
            }
    }
}

}  // namespace

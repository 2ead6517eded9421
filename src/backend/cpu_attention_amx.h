// MLA attention and indexer scores on AMX-BF16 tiles (the --attn-bf16 mode): the
// query, the cache rows and the probabilities are rounded to BF16 and the
// products summed in F32 by the tile unit, about ten times the F32 FMA rate
// of these cores. CPUs without the tiles but with AVX-512 BF16 run the same
// kernels with each tile product as vector dot products (twice the F32 FMA
// rate). The results differ from the exact path's (its F16/F32
// products) in the last bits of the scores, so the mode is opt-in and never
// verifies speculative drafts. A result depends only on its query and rows:
// each score tile and each output tile is one fixed sequence of tile
// products, whichever thread runs it and however keys or columns are split.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "backend/cpu_prefetch.h"

namespace glm5::backend::cpu::amx_bf16 {

// Tile rows on whole cache lines: a row split over two lines made each tile
// load several times slower.
template <class T>
struct LineAlloc {
    using value_type = T;
    LineAlloc() = default;
    template <class U>
    LineAlloc(const LineAlloc<U>&) {}
    T* allocate(size_t n) {
        return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
    }
    void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
    bool operator==(const LineAlloc&) const { return true; }
};
template <class T>
using LineVector = std::vector<T, LineAlloc<T>>;

// The element type of cache rows.
enum class Elem : uint8_t { F32, F16, BF16 };

// The visible cache rows of a query: row j is base + (idx ? idx[j] : j) * row_bytes.
struct Rows {
    const uint8_t* base = nullptr;
    size_t row_bytes = 0;
    const int32_t* idx = nullptr;
    Elem elem = Elem::F16;
    const uint8_t* row(int64_t j) const { return base + size_t(idx ? idx[j] : j) * row_bytes; }
};

// One query's attention for up to 16 heads, in blocks of kBlockKeys visible
// rows that threads may take in any order: each block converts its rows once,
// scores them, takes their softmax against the block's own maximum and sums
// its values; finish() combines the blocks in order (the running-maximum
// rescaling of flash attention, with a fixed block size, so the bits do not
// depend on which thread ran which block).
class Query {
  public:
    static constexpr int64_t kHeads = 16;
    static constexpr int64_t kBlockKeys = 256;
    static constexpr int64_t kMaxRun = 16;  // Query objects one block_of_run() takes
    // Distinct queries (rows) among them: a prefill run. Eight measured no
    // faster than four at depth 1024 or 4096 and leaves longer last runs.
    static constexpr int64_t kRunQueries = 4;

    // q: [n_heads][w] floats; n visible rows of width w whose first v values are the values.
    Query(const float* q, int64_t n_heads, int64_t w, int64_t v, int64_t n, float scale);
    int64_t blocks() const { return (n_ + kBlockKeys - 1) / kBlockKeys; }
    void block(const Rows& rows, int64_t b, int64_t next = -1) {
        Query* self = this;
        block_of_run({&self, 1}, {&rows, 1}, b, next);
    }
    // Block b of up to kMaxRun queries of one shape (head groups of one
    // layer, of up to kRunQueries queries), query i reading rows[i] and having
    // more than b blocks. Each row that any of them reads is converted once
    // and scored against all of their heads; each query then takes its own
    // rows' scores and values. The bits are those of block() alone: a score
    // depends only on its row and head.
    // next: the block of the same rows this thread takes after b (-1: none),
    // whose rows the vector form asks for while it computes b.
    static void block_of_run(std::span<Query* const> run, std::span<const Rows> rows, int64_t b,
                             int64_t next = -1);
    // out[h * out_stride + c] for h < n_heads, c < v.
    void finish(float* out, int64_t out_stride) const;

  private:
    // block_of_run on the AMX unit or its vector form (Tiles: the tile
    // operations, cpu_attention_amx.cpp).
    template <class Tiles>
    static void block_of_run_on(std::span<Query* const> run, std::span<const Rows> rows, int64_t b,
                                int64_t next);
    // The softmax and values of block b: its row j is row map[j] of the
    // converted rows kb (map[j] for j up to a whole pair tile: a zero row; no
    // map: row j), with scores s[that row * kHeads + head].
    template <class Tiles>
    void softmax_values(int64_t b, int64_t nk, const int32_t* map, const uint16_t* kb,
                        const float* s, RowPrefetch<Rows>& pf);
    // This query's scores of kb's rows [0, nu) (BF16, wp_ apart): s[row][head].
    template <class Tiles>
    void scores(const uint16_t* kb, int64_t nu, float* s, RowPrefetch<Rows>& pf) const;
    int64_t heads_, w_, wp_, v_, vp_, ldo_, n_;
    float scale_;
    LineVector<uint16_t> qt_;      // the query as B tiles: [wp/32][16 dim pairs][16 heads][2]
    LineVector<float> max_, sum_;  // per block and head: the scores' maximum, sum of e^(s - max)
    // Per block: [16 heads][ldo] sums of e^(s - max) v (every value written by its block).
    struct LineFree {
        void operator()(float* p) const { ::operator delete(p, std::align_val_t(64)); }
    };
    std::unique_ptr<float[], LineFree> part_;
};

// Lightning-indexer scores on tiles (the same mode): C[key][head] += K (16
// keys x 32 dims) . Q^T (32 dims x 16 heads), then each key's score
// sum_h w[h] * relu(C[key][h]) in head order. BF16 keys whose rows hold
// whole tile rows are read in place; others are converted once per call (in
// tiles of 16 keys) into a buffer that every query of their cache shares.
class IndexerKeys {
  public:
    // Prepares keys [0, n) of dense `rows`, dim values each.
    void reset(const Rows& rows, int64_t n, int64_t dim);
    // Tiles of 16 keys that convert() must prepare first (0: read in place).
    int64_t tiles() const { return in_place_ ? 0 : (n_ + 15) / 16; }
    void convert(int64_t t);  // keys [16 t, 16 t + 16), zero past n
    // The query as B tiles: out gets query_size(n_heads) BF16s.
    int64_t query_size(int64_t n_heads) const { return (n_heads + 15) / 16 * 16 * dp_; }
    void convert_query(const float* q, int64_t n_heads, uint16_t* out) const;
    // out[s - s0] = the score of key s, for s in [s0, s1) (s0 a multiple of 16).
    void scores(const uint16_t* qb, int64_t n_heads, const float* w, int64_t s0, int64_t s1,
                float* out) const;

  private:
    template <class Tiles>
    void scores_on(const uint16_t* qb, int64_t n_heads, const float* w, int64_t s0, int64_t s1,
                   float* out) const;
    Rows rows_;
    int64_t n_ = 0, dim_ = 0, dp_ = 0;  // dp_: dim rounded up to 32
    bool in_place_ = false;
    LineVector<uint16_t> buf_;  // converted keys: [key][dp_] BF16
};

// n floats rounded to BF16 (to nearest, ties to even): a BF16 cache row.
void round_row(const float* x, int64_t n, uint16_t* out);

// AMX-BF16 tiles, or (on a CPU without them) AVX-512 BF16 dot products, usable here
bool available();

}  // namespace glm5::backend::cpu::amx_bf16

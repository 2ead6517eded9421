// Attention on the GPU: the lightning indexer's scores and top k, absorbed MLA over the
// rows a query sees (dense, or only the selected ones), and the drafter's pick. Which
// rows a query sees is decided per row from the step's positions, as on the CPU.
//
// The launches are sized from a bound on the rows a query sees, rounded up to kRowBucket
// rows (the kernels read each row's own count from the positions), so that a decode step
// is the same launch for kRowBucket steps and replays one graph.
//
// One block per (query, head) for attention: scores of the visible rows, a softmax
// (maximum, then the sum in double, in a fixed tree), then each output column a sum over
// the rows in order. One block per query for the top k: backend/device_math.h's radix
// select (integer counts, so the same answer whatever the threads' timing), then the
// rows taken in ascending order.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/device_math.h"

namespace glm5::backend::cuda {

namespace {

GLM5_HD int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

__device__ float f16_round(float v) {
    return __half2float(__float2half_rn(v));
}

// The segments of a launch's rows, passed by value (a launch copies nothing from the host):
// segment i holds batch rows [first[i], end[i]) and its cache rows at data[i].
constexpr int kMaxSegs = 16;
struct SegTable {
    int64_t n = 0;  // (64 bits: no padding, so a launch's bytes are its values)
    const uint8_t* data[kMaxSegs];
    int64_t first[kMaxSegs], end[kMaxSegs];
};

__device__ inline int seg_of(const SegTable& s, int64_t t) {
    for (int i = 0; i < s.n; ++i)
        if (t >= s.first[i] && t < s.end[i]) return i;
    return -1;
}

// Batch row t's `width` values, by the block, as row p of its segment's cache (a row of no
// segment is not stored).
__device__ inline void store_row(const SegTable& segs, int64_t t, int32_t p, const float* row,
                                 int64_t width, size_t row_bytes, bool f16) {
    const int s = seg_of(segs, t);
    if (s < 0) return;
    uint8_t* dst = const_cast<uint8_t*>(segs.data[s]) + size_t(p) * row_bytes;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) store_value(dst, i, row[i], f16);
}

// What a batch row sees, worked out by the kernel from the step's plan (the positions in
// device memory) and the segments: the rule the CPU applies (attention_ops.h).
struct RowRule {
    SegTable segs;
    const int32_t* pos;
    const int32_t* sel_rows;  // the indexer's selection, or null
    int64_t sel_stride, pool, keep;
};

struct IndexerRow {
    const uint8_t* keys;  // the segment's key cache
    int64_t t;            // the batch row
    int64_t n_keys;       // candidates (n_vis / pool); 0: the row does not select
};

__device__ inline IndexerRow indexer_row(const RowRule& r, int64_t t) {
    const int s = seg_of(r.segs, t);
    if (s < 0) return {nullptr, t, 0};
    const int64_t n_vis = int64_t(r.pos[t]) + 1;
    if (!AttentionOps::Selection::selects(n_vis, r.pool, r.keep)) return {nullptr, t, 0};
    return {r.segs.data[s], t, n_vis / r.pool};
}

// Block (key chunk, query): the chunk's keys read once, together (each warp's loads one
// stretch of memory), into shared memory; then one thread per key, every head's dot and the
// relu-weighted sum in head order.
constexpr int kScoreKeys = 64;
size_t score_tile_bytes(int64_t dim) {
    return size_t(kScoreKeys) * size_t(dim + 1) * sizeof(float);
}
__global__ void indexer_scores_kernel(RowRule rule, int64_t t0, const float* q, const float* w,
                                      int64_t n_heads, int64_t dim, size_t row_bytes, bool f16,
                                      float* scores, int64_t ld) {
    GLM5_DYNAMIC_SHARED(float, tile);  // a row of dim + 1 floats a key (no bank conflicts)
    // Query rows on x (any number), key chunks on y (up to 65535 x kScoreKeys keys).
    const IndexerRow r = indexer_row(rule, t0 + blockIdx.x);
    const int64_t j0 = int64_t(blockIdx.y) * blockDim.x;
    if (j0 >= r.n_keys) return;  // the whole block
    const int64_t left = r.n_keys - j0, n = left < blockDim.x ? left : blockDim.x;
    const int64_t stride = dim + 1;
    for (int64_t e = threadIdx.x; e < n * dim; e += blockDim.x) {
        const int64_t k = e / dim, i = e % dim;
        tile[k * stride + i] = load_value(r.keys + size_t(j0 + k) * row_bytes, i, f16);
    }
    __syncthreads();
    if (int64_t(threadIdx.x) >= n) return;
    const float* key = tile + threadIdx.x * stride;
    const float* qt = q + r.t * n_heads * dim;
    const float* wt = w + r.t * n_heads;
    float s = 0.f;
    for (int64_t h = 0; h < n_heads; ++h) {
        float d = 0.f;
        for (int64_t i = 0; i < dim; ++i) d = fmaf(qt[h * dim + i], key[i], d);
        s += __fmul_rn(fmaxf(d, 0.f), wt[h]);
    }
    scores[int64_t(blockIdx.x) * ld + j0 + threadIdx.x] = s;
}

// One block per query: the top_k rows by score (ties to the lower row), ascending.
__global__ void top_k_kernel(RowRule rule, int64_t t0, const float* scores, int64_t ld,
                             int64_t top_k, int32_t* out) {
    GLM5_SHARED(int, hist, 256);
    GLM5_SHARED(int64_t, out_at, kThreads);
    GLM5_SHARED(int64_t, equal_at, kThreads);
    GLM5_SHARED_VAR(uint32_t, prefix_sh);
    GLM5_SHARED_VAR(int64_t, remaining_sh);
    const IndexerRow r = indexer_row(rule, t0 + blockIdx.x);
    if (r.n_keys == 0) return;  // a row that does not select: left alone (whole block)
    const float* sc = scores + int64_t(blockIdx.x) * ld;
    const int64_t n = r.n_keys;
    if (threadIdx.x == 0) {
        prefix_sh = 0;
        remaining_sh = top_k;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = prefix_sh;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t k = device::order_key(sc[j]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = 255;
            int64_t rem = remaining_sh;
            while (hist[b] < rem) rem -= hist[b--];
            remaining_sh = rem;
            prefix_sh = prefix | uint32_t(b) << shift;
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    // The rows taken, ascending: each thread counts its own run of rows (those above the
    // k-th key, and those equal to it), the runs' offsets follow in thread order, then each
    // thread writes its run's rows.
    const uint32_t kth = prefix_sh;
    const int64_t equal = remaining_sh;
    const int64_t per = (n + blockDim.x - 1) / blockDim.x;
    const int64_t b = min64(n, int64_t(threadIdx.x) * per), e = min64(n, b + per);
    int64_t above = 0, eq = 0;
    for (int64_t j = b; j < e; ++j) {
        const uint32_t k = device::order_key(sc[j]);
        above += k > kth;
        eq += k == kth;
    }
    out_at[threadIdx.x] = above;
    equal_at[threadIdx.x] = eq;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t m = 0, eb = 0;
        for (unsigned i = 0; i < blockDim.x; ++i) {
            const int64_t a = out_at[i], q = equal_at[i];
            out_at[i] = m;
            equal_at[i] = eb;
            const int64_t left = equal - eb;  // k-th keys still to take
            m += a + min64(q, left > 0 ? left : 0);
            eb += q;
        }
    }
    __syncthreads();
    int32_t* o = out + r.t * top_k;
    int64_t m = out_at[threadIdx.x], equal_before = equal_at[threadIdx.x];
    for (int64_t j = b; j < e; ++j) {
        const uint32_t k = device::order_key(sc[j]);
        if (device::takes(k, kth, equal_before, equal)) o[m++] = int32_t(j);
        equal_before += k == kth;
    }
}

struct AttentionRow {
    const uint8_t* cache;  // the segment's latent rows
    const int32_t* rows;   // the selection's rows, or null: rows 0 .. n-1
    int64_t n;             // rows seen
};

__device__ inline AttentionRow attention_row(const RowRule& r, int64_t t) {
    const int s = seg_of(r.segs, t);
    if (s < 0) return {nullptr, nullptr, 0};
    const int64_t n_vis = int64_t(r.pos[t]) + 1;
    if (r.sel_rows && AttentionOps::Selection::selects(n_vis, r.pool, r.keep))
        return {r.segs.data[s], r.sel_rows + t * r.sel_stride,
                AttentionOps::Selection::n_selected(n_vis, r.pool, r.keep)};
    return {r.segs.data[s], nullptr, n_vis};
}

// Block (query t0 + t, head h); q, scores and out start at row t0.
__global__ void mla_kernel(RowRule rule, int64_t t0, const float* q, int64_t n_heads, int64_t width,
                           int64_t v_width, size_t row_bytes, bool f16, float scale, float* scores,
                           int64_t ld, float* out) {
    GLM5_DYNAMIC_SHARED(float, qs);  // the query, rounded to F16 with an F16 cache
    GLM5_SHARED(double, sh, kThreads);
    GLM5_SHARED(float, red, kThreads);
    const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const AttentionRow a = attention_row(rule, t0 + t);
    if (a.n == 0) return;  // a row of no segment: left alone, as on the CPU (whole block)
    const float* qh = q + (t * n_heads + h) * width;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
        qs[i] = f16 ? f16_round(qh[i]) : qh[i];
    __syncthreads();
    float* sc = scores + int64_t(blockIdx.x) * ld;
    auto row_of = [&](int64_t j) { return a.cache + size_t(a.rows ? a.rows[j] : j) * row_bytes; };
    float mx = -3.402823466e38f;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
        const uint8_t* r = row_of(j);
        float d = 0.f;
        for (int64_t i = 0; i < width; ++i) d = fmaf(qs[i], load_value(r, i, f16), d);
        sc[j] = __fmul_rn(d, scale);
        mx = fmaxf(mx, sc[j]);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    mx = red[0];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += double(e);
    }
    const float inv = float(1.0 / block_sum(sum, sh));
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x)
        sc[j] = f16 ? f16_round(__fmul_rn(sc[j], inv)) : __fmul_rn(sc[j], inv);
    __syncthreads();
    float* o = out + (t * n_heads + h) * v_width;
    for (int64_t c = threadIdx.x; c < v_width; c += blockDim.x) {
        float acc = 0.f;
        for (int64_t j = 0; j < a.n; ++j) acc += __fmul_rn(sc[j], load_value(row_of(j), c, f16));
        o[c] = acc;
    }
}

// The scores an op keeps at once: its query rows go in chunks of at most kChunkRows, and of
// no more than kScoreBytes of scores (a dense prompt deep in a context would otherwise ask
// for rows x heads x depth floats), and of at most kMaxSegs segments (a launch's table).
constexpr size_t kScoreBytes = size_t(64) << 20;
constexpr int64_t kChunkRows = 256;
constexpr int64_t kRowBucket = 256;
int64_t bucket(int64_t rows) {
    return (rows + kRowBucket - 1) / kRowBucket * kRowBucket;
}
int64_t rows_per_chunk(int64_t floats_per_row) {
    return std::clamp<int64_t>(int64_t(kScoreBytes / (size_t(floats_per_row) * sizeof(float))), 1,
                               kChunkRows);
}

// The table of the segments that rows [t0, t0 + n) belong to, n first cut where it would
// take more than kMaxSegs of them, their caches in `be`'s memory.
SegTable seg_table(const CudaBackend& be, std::span<const AttentionOps::Segment> segs, int64_t t0,
                   int64_t& n) {
    std::vector<const AttentionOps::Segment*> order;
    for (const auto& s : segs)
        if (s.n > 0 && s.first + s.n > t0 && s.first < t0 + n) order.push_back(&s);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
    SegTable t{};  // (unused entries zero: a launch's bytes are its values)
    for (const AttentionOps::Segment* s : order) {
        if (t.n == kMaxSegs) {
            n = s->first - t0;
            break;
        }
        t.data[t.n] = be.dev(s->cache.data);
        t.first[t.n] = s->first;
        t.end[t.n] = s->first + s->n;
        ++t.n;
    }
    return t;
}

// Rows [0, T) in launches of at most `chunk` rows and kMaxSegs segments: launch(t0, n,
// table) for each.
template <class Launch>
void each_launch(const CudaBackend& be, std::span<const AttentionOps::Segment> segs, int64_t T,
                 int64_t chunk, Launch launch) {
    for (int64_t t0 = 0; t0 < T;) {
        int64_t n = std::min(chunk, T - t0);
        const SegTable table = seg_table(be, segs, t0, n);
        launch(t0, n, table);
        t0 += n;
    }
}

// MLA's rows t0 + blockIdx.x, a block each: the cache row [c | k_rope] normed, RoPE'd and
// stored in its segment's cache; the query heads' rope parts RoPE'd into the full queries.
struct MlaRowArgs {
    float* kv;
    int64_t kv_stride, R, n_rot;
    const float* norm_w;
    const float* q;
    int64_t n_heads, q_width, nope;
    float* qfull;
    int64_t qfull_width;
};
__global__ void mla_rows_kernel(MlaRowArgs a, float eps, float theta_scale, const int32_t* pos,
                                int64_t t0, SegTable segs, size_t row_bytes, int64_t width,
                                bool f16) {
    GLM5_SHARED(double, sh, kThreads);
    const int64_t t = t0 + blockIdx.x;
    float* row = a.kv + t * a.kv_stride;
    rms_norm_row(row, a.norm_w, a.R, eps, row, sh);
    __syncthreads();
    const int64_t pairs = a.n_rot / 2;
    for (int64_t k = threadIdx.x; k < pairs; k += blockDim.x)
        rope_pair(row + a.R, pos[t], k, theta_scale);
    __syncthreads();
    store_row(segs, t, pos[t], row, width, row_bytes, f16);
    for (int64_t i = threadIdx.x; i < a.n_heads * pairs; i += blockDim.x) {
        const int64_t h = i / pairs, k = i % pairs;
        const float* src = a.q + (t * a.n_heads + h) * a.q_width + a.nope;
        float* dst = a.qfull + (t * a.n_heads + h) * a.qfull_width + a.R;
        dst[2 * k] = src[2 * k];
        dst[2 * k + 1] = src[2 * k + 1];
        rope_pair(dst, pos[t], k, theta_scale);
    }
}

// The indexer's query heads, a block each: RoPE, then the Hadamard rotation.
__global__ void indexer_query_kernel(float* q, int64_t n_heads, int64_t dim, int64_t n_rot,
                                     const int32_t* pos, float theta_scale) {
    GLM5_DYNAMIC_SHARED(float, v);
    const int64_t t = blockIdx.x / n_heads;
    float* row = q + int64_t(blockIdx.x) * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = row[i];
    __syncthreads();
    for (int64_t k = threadIdx.x; k < n_rot / 2; k += blockDim.x)
        rope_pair(v, pos[t], k, theta_scale);
    __syncthreads();
    hadamard_shared(v, dim, row);
}

// The indexer's keys of rows t0 + blockIdx.x, a block each: layer norm, RoPE, the Hadamard
// rotation, the row stored in its segment's key cache; and the row's head weights scaled.
__global__ void indexer_key_kernel(float* k, float* w, int64_t t0, SegTable segs, size_t row_bytes,
                                   bool f16, int64_t n_heads, int64_t dim, int64_t n_rot,
                                   const int32_t* pos, float theta_scale, const float* norm_w,
                                   const float* norm_b, float w_scale) {
    GLM5_DYNAMIC_SHARED(float, v);
    GLM5_SHARED(double, sh, kThreads);
    const int64_t t = t0 + blockIdx.x;
    float* row = k + t * dim;
    layer_norm_row(row, norm_w, norm_b, dim, 0.0f, v, sh);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n_rot / 2; j += blockDim.x)
        rope_pair(v, pos[t], j, theta_scale);
    __syncthreads();
    hadamard_shared(v, dim, row);
    store_row(segs, t, pos[t], row, dim, row_bytes, f16);
    for (int64_t h = threadIdx.x; h < n_heads; h += blockDim.x)
        w[t * n_heads + h] = __fmul_rn(w[t * n_heads + h], w_scale);
}

constexpr int kPick = 10;

// (x, xi) into a list of the kPick best, kept in order (value descending, the lower id
// first among equal values); what falls off the end is dropped.
__device__ void insert_best(float* v, int32_t* id, float x, int32_t xi) {
    for (int k = 0; k < kPick; ++k)
        if (x > v[k] || (x == v[k] && xi < id[k])) {
            const float tv = v[k];
            const int32_t ti = id[k];
            v[k] = x, id[k] = xi;
            x = tv, xi = ti;
        }
}

// One block per row of logits: each thread's ten best (value descending, lower id first
// among equal values), then thread 0 merges them.
__global__ void draft_pick_kernel(const float* logits, int64_t n_vocab, int32_t* best,
                                  double* prob) {
    GLM5_SHARED(float, val, kThreads* kPick);
    GLM5_SHARED(int32_t, idx, kThreads * kPick);
    const float* l = logits + int64_t(blockIdx.x) * n_vocab;
    float v[kPick];
    int32_t id[kPick];
    for (int k = 0; k < kPick; ++k) v[k] = -INFINITY, id[k] = INT32_MAX;
    for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x)
        insert_best(v, id, l[i], int32_t(i));
    for (int k = 0; k < kPick; ++k) {
        val[threadIdx.x * kPick + k] = v[k];
        idx[threadIdx.x * kPick + k] = id[k];
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float top[kPick];
    int32_t top_id[kPick];
    for (int k = 0; k < kPick; ++k) top[k] = -INFINITY, top_id[k] = INT32_MAX;
    for (int i = 0; i < int(blockDim.x) * kPick; ++i) insert_best(top, top_id, val[i], idx[i]);
    double z = 0.0;
    const int n = n_vocab < kPick ? int(n_vocab) : kPick;
    for (int k = 0; k < n; ++k) z += exp(double(top[k]) - double(top[0]));
    best[blockIdx.x] = top_id[0];
    prob[blockIdx.x] = 1.0 / z;
}

// The rows a step's segments cover (0 to the end of the last) and their caches' one layout:
// BF16 caches (the CPU's --attn-bf16) and segments whose caches differ are refused, naming
// the op.
struct SegLayout {
    int64_t rows = 0, width = 0;
    size_t row_bytes = 0;
    bool f16 = false;
};
SegLayout seg_layout(std::span<const AttentionOps::Segment> segs, const char* op) {
    SegLayout l;
    l.rows = AttentionOps::rows_of(segs);
    bool first = true;
    for (const AttentionOps::Segment& s : segs) {
        if (s.cache.type == CacheType::BF16)
            throw Error(std::string(op) + ": BF16 caches are the CPU's --attn-bf16");
        const bool f16 = s.cache.type == CacheType::F16;
        if (!first && (s.cache.width != l.width || f16 != l.f16))
            throw Error(std::string(op) + ": the segments' caches differ in layout");
        l.width = s.cache.width, l.row_bytes = s.cache.row_bytes(), l.f16 = f16;
        first = false;
    }
    return l;
}

}  // namespace

void CudaBackend::mla_rows(const MlaRows& m, DevPtr<const int32_t> pos,
                           std::span<const Segment> segs) {
    Temporaries tmp(*this);
    const SegLayout l = seg_layout(segs, "mla_rows");
    const int64_t T = l.rows;
    op("mla_rows", T);
    if (T == 0) return;
    const MlaRowArgs a{dev(m.kv), m.kv_stride, m.R,    m.n_rot,      vec(m.norm_w, m.R), dev(m.q),
                       m.n_heads, m.q_width,   m.nope, dev(m.qfull), m.qfull_width};
    // The host's pow, as the CPU computes the angle step.
    const float theta_scale = m.n_rot > 0 ? std::pow(m.freq_base, -2.0f / float(m.n_rot)) : 0.0f;
    each_launch(*this, segs, T, T, [&](int64_t t0, int64_t n, const SegTable& st) {
        GLM5_LAUNCH(mla_rows_kernel, unsigned(n), kThreads, 0, stream(), a, m.eps, theta_scale,
                    dev(pos), t0, st, l.row_bytes, l.width, l.f16);
    });
}

void CudaBackend::indexer_inputs(DevPtr<float> q, DevPtr<float> k, DevPtr<float> w,
                                 DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                 int64_t n_heads, int64_t dim, int64_t n_rot, float freq_base,
                                 const float* norm_w, const float* norm_b, float w_scale) {
    Temporaries tmp(*this);
    const SegLayout l = seg_layout(keys, "indexer_inputs");
    const int64_t T = l.rows;
    op("indexer_inputs", T);
    if (T == 0) return;
    if (dim > 8192 || (dim & (dim - 1)) != 0)
        throw Error("indexer_inputs: keys of " + std::to_string(dim) + " values");
    // The host's pow, as the CPU computes the angle step.
    const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
    const size_t shared = size_t(dim) * sizeof(float);
    GLM5_LAUNCH(indexer_query_kernel, unsigned(T * n_heads), kThreads, shared, stream(), dev(q),
                n_heads, dim, n_rot, dev(pos), theta_scale);
    const float *nw = vec(norm_w, dim), *nb = vec(norm_b, dim);
    each_launch(*this, keys, T, T, [&](int64_t t0, int64_t n, const SegTable& st) {
        GLM5_LAUNCH(indexer_key_kernel, unsigned(n), kThreads, shared, stream(), dev(k), dev(w), t0,
                    st, l.row_bytes, l.f16, n_heads, dim, n_rot, dev(pos), theta_scale, nw, nb,
                    w_scale);
    });
}

void CudaBackend::indexer_select(DevPtr<const float> q, DevPtr<const float> w,
                                 DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                 int64_t pool, int64_t n_heads, int64_t dim, int64_t top_k,
                                 DevPtr<int32_t> out) {
    Temporaries tmp(*this);
    const SegLayout l = seg_layout(keys, "indexer_select");
    const int64_t T = l.rows;
    const size_t row_bytes = l.row_bytes;
    op("indexer_select", T);
    if (T == 0) return;
    // The host's copy of the plan bounds the launches (and counts the reads); the kernels
    // read the positions and work out each row's candidates themselves.
    const int32_t* p = host_positions(pos, T);
    int64_t most = 0;
    for (const Segment& s : keys) {
        for (int64_t t = s.first; t < s.first + s.n; ++t) {
            const int64_t n_vis = int64_t(p[t]) + 1;
            if (!Selection::selects(n_vis, pool, top_k)) continue;
            most = std::max(most, n_vis / pool);
            cache_bytes_ += uint64_t(n_vis / pool) * row_bytes;
        }
    }
    if (most == 0) return;
    most = bucket(most);
    const int64_t chunk = rows_per_chunk(most);
    const size_t tile = score_tile_bytes(dim);
    if (tile > 48 * 1024)  // past the default a block may take: asked for once
        check(cudaFuncSetAttribute(indexer_scores_kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, int(tile)),
              "indexer_select: keys too wide for a block's shared memory");
    each_launch(*this, keys, T, chunk, [&](int64_t t0, int64_t m, const SegTable& st) {
        Temporaries part(*this);
        const RowRule rule{st, dev(pos), nullptr, 0, pool, top_k};
        auto* scores = static_cast<float*>(scratch_bytes(size_t(m * most) * sizeof(float)));
        const dim3 grid(unsigned(m), grid_for(most, kScoreKeys));
        GLM5_LAUNCH(indexer_scores_kernel, grid, kScoreKeys, tile, stream(), rule, t0, dev(q),
                    dev(w), n_heads, dim, row_bytes, l.f16, scores, most);
        GLM5_LAUNCH(top_k_kernel, unsigned(m), kThreads, 0, stream(), rule, t0, scores, most, top_k,
                    dev(out));
    });
}

void CudaBackend::mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos,
                                std::span<const Segment> segs, const Selection& sel,
                                int64_t n_heads, int64_t v_width, float scale, DevPtr<float> out) {
    Temporaries tmp(*this);
    const SegLayout l = seg_layout(segs, "mla_attention");
    const int64_t T = l.rows, width = l.width;
    const size_t row_bytes = l.row_bytes;
    op("mla_attention", T);
    if (T == 0) return;
    const int32_t* p = host_positions(pos, T);
    int64_t most = 1;
    for (const Segment& s : segs) {
        for (int64_t t = s.first; t < s.first + s.n; ++t) {
            const int64_t n_vis = int64_t(p[t]) + 1;
            const int64_t n = sel.selects(n_vis) ? sel.n_selected(n_vis) : n_vis;
            most = std::max(most, n);
            cache_bytes_ += uint64_t(n) * row_bytes;
        }
    }
    most = bucket(most);
    const int64_t per_query = n_heads * most, chunk = rows_per_chunk(per_query);
    each_launch(*this, segs, T, chunk, [&](int64_t t0, int64_t n, const SegTable& st) {
        Temporaries part(*this);
        const RowRule rule{st,         dev(pos), sel.rows ? dev(sel.rows) : nullptr,
                           sel.stride, sel.pool, sel.keep};
        auto* scores = static_cast<float*>(scratch_bytes(size_t(n * per_query) * sizeof(float)));
        GLM5_LAUNCH(mla_kernel, unsigned(n * n_heads), kThreads, size_t(width) * sizeof(float),
                    stream(), rule, t0, dev(q) + t0 * n_heads * width, n_heads, width, v_width,
                    row_bytes, l.f16, scale, scores, most, dev(out) + t0 * n_heads * v_width);
    });
}

size_t CudaBackend::attention_scratch_bytes(int64_t n_heads, int64_t n_visible) const {
    // One chunk of mla_attention's queries: its scores and row descriptors (with the
    // arena's alignment).
    const size_t per_query = size_t(n_heads * bucket(n_visible)) * sizeof(float);
    const size_t scores =
        std::max(per_query, std::min(kScoreBytes, size_t(kChunkRows) * per_query));
    return scores + size_t(kChunkRows) * sizeof(AttentionRow) + 512;
}

void CudaBackend::draft_pick(DevPtr<const float> logits, int64_t n_rows, int64_t n_vocab,
                             DevPtr<int32_t> best, DevPtr<double> prob) {
    op("draft_pick", n_rows);
    if (n_rows <= 0) return;
    GLM5_LAUNCH(draft_pick_kernel, unsigned(n_rows), kThreads, 0, stream(), dev(logits), n_vocab,
                dev(best), dev(prob));
}

}  // namespace glm5::backend::cuda

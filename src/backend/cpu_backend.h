// The CPU backend's class, shared by the files that implement its ops
// (cpu_backend.cpp: memory, elementwise ops and products; cpu_attention.cpp;
// cpu_moe.cpp; and one file per family of glm5next and vision ops).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "backend/attention_ops.h"
#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cpu_attention_amx.h"
#include "backend/cpu_kernels.h"
#include "backend/cpu_memory.h"
#include "backend/cpu_simd.h"
#include "backend/linear_ops.h"
#include "backend/moe_ops.h"
#include "backend/vision_ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/mmap_file.h"
#include "core/thread_pool.h"
#include "quant/quant.h"
#include "quant/repack.h"

namespace glm5::backend::cpu {

constexpr size_t kAlign = 64;

inline void* aligned_malloc(size_t bytes) {
    bytes = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes ? bytes : kAlign);
    if (!p) throw ResourceError("out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
}

struct AlignedFree {
    void operator()(void* p) const { std::free(p); }
};

// A growable aligned byte buffer whose contents need not survive growth.
class ByteBuffer {
  public:
    uint8_t* get(size_t bytes) {
        if (bytes > cap_) {
            cap_ = std::max(bytes, cap_ * 2);
            p_.reset(static_cast<uint8_t*>(aligned_malloc(cap_)));
        }
        return p_.get();
    }

  private:
    std::unique_ptr<uint8_t, AlignedFree> p_;
    size_t cap_ = 0;
};

using kernels::silu;

// GLM5_PROFILE=1 in the environment: wall time per op and per rows in the
// call (tokens for products, attention and the MoE; single and sliced products by
// weight type), printed to stderr when the backend is destroyed (a
// development aid for performance work: batched decode's ops next to single
// decode's).
class OpProfile {
  public:
    OpProfile() : on_(std::getenv("GLM5_PROFILE") != nullptr) {}
    std::function<void(const char*, int64_t)> fault_hook;  // Backend::set_op_hook's
    ~OpProfile();
    bool on() const { return on_; }
    // kind (optional) splits an op further, e.g. a product by weight type.
    void add(const char* op, const char* kind, int64_t rows, double s) {
        auto& e = ops_[{kind ? std::string(op) + "." + kind : std::string(op), rows}];
        e.first += s;
        e.second += 1;
    }

  private:
    bool on_;
    std::map<std::pair<std::string, int64_t>, std::pair<double, uint64_t>> ops_;
};

class OpTimer {
  public:
    OpTimer(OpProfile& p, const char* op, int64_t rows, const char* kind = nullptr)
        : p_(p), op_(op), kind_(kind), rows_(rows) {
        if (p_.fault_hook) p_.fault_hook(op, rows);
        if (p_.on()) t0_ = std::chrono::steady_clock::now();
    }
    ~OpTimer() {
        if (p_.on())
            p_.add(op_, kind_, rows_,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    }

  private:
    OpProfile& p_;
    const char* op_;
    const char* kind_;
    int64_t rows_;
    std::chrono::steady_clock::time_point t0_;
};

class CpuBackend final : public Backend,
                         public MoeOps,
                         public AttentionOps,
                         public LinearOps,
                         public VisionOps {
  public:
    explicit CpuBackend(const CpuOptions& opt);
    ~CpuBackend() override = default;

    std::string name() const override { return "cpu"; }
    int n_threads() const { return pool_.size(); }
    // Each worker's scores, and the caller's.
    size_t attention_scratch_bytes(int64_t n_heads, int64_t n_visible) const override {
        return (size_t(pool_.size()) + 1) * size_t(n_heads) * size_t(n_visible) * 4;
    }

    // A handle's address, refusing one another backend owns (handles of no backend,
    // host arrays handed in, are this backend's memory too). Every op reads its
    // arguments through it (the name hides cpu::host inside the class).
    template <class T>
    T* host(DevPtr<T> p) const {
        if (p.owner() != 0 && p.owner() != id()) [[unlikely]]
            foreign(p.owner());
        return cpu::host(p);
    }

    // A step keeps the workers awake between its ops (a forward's serial host work
    // between two ops would otherwise send them to sleep and cost a wake-up each op).
    void begin_step() override { pool_.hold(); }
    void end_step() override { pool_.release(); }
    bool threads_pinned() const { return pool_.pinned(); }

    // ---- weights -----------------------------------------------------------------
    // With `copy`, the matrices its interleaved GEMM reads (quant/repack.h: Q4_K, Q6_K,
    // Q5_0, Q8_0 with AVX-512 VNNI) repacked on the pool's threads into read-only
    // anonymous memory; anything else keeps its view.
    Weight register_weight(const Weight& w, bool copy, const std::string& name) override;
    size_t weight_copy_bytes(quant::Type t, int64_t cols, int64_t rows,
                             int64_t slices) const override;
    void set_product_observer(ProductObserver* o) override { observer_ = o; }

    // ---- memory ------------------------------------------------------------
    DevPtr<float> scratch(size_t n_floats) override;
    void reset_scratch() override;
    // Large caches are anonymous mappings: zero without being written, and
    // resident only as their rows are filled (the memory plan counts the
    // whole size; a full context is not touched before it is used).
    DevPtr<uint8_t> alloc_cache(size_t bytes) override;
    void free_cache(DevPtr<uint8_t> p) override;
    void read_bytes(DevPtr<const uint8_t> src, void* dst, size_t bytes) override {
        std::memcpy(dst, host(src), bytes);
    }
    void write_bytes(DevPtr<uint8_t> dst, const void* src, size_t bytes) override {
        std::memcpy(host(dst), src, bytes);
    }
    // Multi-rank exchanges: the CPU backend's memory is the host's.
    void reduce_sum(DevPtr<float> x, int64_t n) override;
    void receive_rows(RowChannel& from, DevPtr<float> x, size_t n) override;
    void send_rows(RowChannel& to, DevPtr<const float> x, size_t n) override;
    void copy_cache(DevPtr<uint8_t> dst, DevPtr<const uint8_t> src, size_t bytes,
                    const char* why = "copy_cache") override;

    // ---- elementwise ---------------------------------------------------------
    void embed(const Weight& table, DevPtr<const int32_t> ids, int64_t n,
               DevPtr<float> out) override;

    void rms_norm(DevPtr<const float> x, int64_t x_stride, const float* w, int64_t n_rows,
                  int64_t dim, float eps, DevPtr<float> y, int64_t y_stride) override;

    void layer_norm(DevPtr<const float> x, const float* w, const float* b, int64_t n_rows,
                    int64_t dim, float eps, DevPtr<float> y) override;

    void rope(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
              int64_t head_stride, int64_t n_rot, DevPtr<const int32_t> pos,
              float freq_base) override;

    void hadamard(DevPtr<float> x, int64_t n_vec, int64_t dim) override;

    void copy_rows(DevPtr<const float> src, int64_t src_stride, DevPtr<const int32_t> rows,
                   int64_t n_rows, int64_t n_cols, DevPtr<float> dst, int64_t dst_stride) override;

    void add(DevPtr<float> y, DevPtr<const float> x, int64_t n) override {
        kernels::add_row(host(y), host(x), n);
    }

    void scale(DevPtr<float> y, float s, int64_t n) override;

    void swiglu(DevPtr<const float> g, DevPtr<const float> u, int64_t n_rows, int64_t n,
                int64_t in_stride, float clamp, DevPtr<float> out) override;

    // ---- matrix products -------------------------------------------------------
    void matmul(const Weight& w, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                DevPtr<float> y, int64_t y_stride) override;

    void matmuls(std::span<const MatmulOut> outs, DevPtr<const float> x, int64_t x_stride,
                 int64_t n_tok) override;

    void matmul_slices(const Weight& w, DevPtr<const float> x, int64_t x_tok, int64_t x_slice,
                       int64_t n_tok, DevPtr<float> y, int64_t y_tok, int64_t y_slice) override;

    // ---- caches and attention ----------------------------------------------------
    CacheType indexer_key_type(CacheType requested) const override {
        return attention_bf16_ && requested == CacheType::F16 ? CacheType::BF16 : requested;
    }
    void cache_store(const CacheRows& cache, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                     DevPtr<const int32_t> pos) override;

    void mla_rows(const MlaRows& m, DevPtr<const int32_t> pos,
                  std::span<const Segment> segs) override;
    void indexer_inputs(DevPtr<float> q, DevPtr<float> k, DevPtr<float> w,
                        DevPtr<const int32_t> pos, std::span<const Segment> keys, int64_t n_heads,
                        int64_t dim, int64_t n_rot, float freq_base, const float* norm_w,
                        const float* norm_b, float w_scale) override;
    void indexer_select(DevPtr<const float> q, DevPtr<const float> w, DevPtr<const int32_t> pos,
                        std::span<const Segment> keys, int64_t pool, int64_t n_heads, int64_t dim,
                        int64_t top_k, DevPtr<int32_t> out) override;
    void mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos,
                       std::span<const Segment> segs, const Selection& sel, int64_t n_heads,
                       int64_t v_width, float scale, DevPtr<float> out) override;

    // The same ops over explicit per-query lists (what the step forms above build from
    // the plan; the kernels' tests drive them directly).
    //
    // Which cached rows one query attends to: the dense prefix [0, n_dense) or the
    // n_rows listed rows.
    struct Visible {
        int32_t n_dense = 0;
        DevPtr<const int32_t> rows;
        int32_t n_rows = 0;
    };
    // One indexer query: its top_k of keys s < n_keys into out_rows.
    struct IndexerQuery {
        DevPtr<const float> q;  // [n_heads][dim]
        DevPtr<const float> w;  // [n_heads]
        CacheRows keys;         // this query's sequence's key cache
        int32_t n_keys = 0;
        DevPtr<int32_t> out_rows;  // top_k entries
    };
    void indexer_select(std::span<const IndexerQuery> queries, int64_t n_heads, int64_t dim,
                        int64_t top_k);
    struct AttentionQuery {
        DevPtr<const float> q;  // [n_heads][width]
        CacheRows cache;
        Visible visible;
        DevPtr<float> out;  // [n_heads][v_width]
    };
    void mla_attention(std::span<const AttentionQuery> queries, int64_t n_heads, int64_t v_width,
                       float scale);

    // ---- mixture of experts ----------------------------------------------------
    void draft_pick(DevPtr<const float> logits, int64_t n_rows, int64_t n_vocab,
                    DevPtr<int32_t> best, DevPtr<double> prob) override;
    // cpu_moe.cpp
    void moe_route(const MoeRouter& r, DevPtr<const float> x, int64_t n_tok, DevPtr<int32_t> ids,
                   DevPtr<float> weights) override;
    void moe_experts(const MoeFfn& experts, DevPtr<const float> x, int64_t n_tok,
                     DevPtr<const int32_t> ids, DevPtr<const float> weights, int n_used,
                     const MoeFfn* fused_shared, DevPtr<const float> shared_rows,
                     DevPtr<float> out) override;
    void moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t n_tok,
                    DevPtr<float> out) override;

    // ==== glm5next ops (cpu_kda.cpp, cpu_hyper.cpp, cpu_pool_indexer.cpp) ======
    void l2_norm(DevPtr<const float> x, int64_t n_rows, int64_t dim, float eps,
                 DevPtr<float> y) override;
    void apply_sigmoid(DevPtr<float> y, int64_t n) override;
    void mul_sigmoid(DevPtr<float> y, DevPtr<const float> gate, int64_t n) override;
    void causal_conv(std::span<const ConvSeq> seqs, int64_t channels, const float* taps,
                     int64_t kernel, int64_t x_stride, int64_t y_stride, bool silu) override;
    void bounded_decay(DevPtr<const float> z, const float* bias, const float* rate, int64_t n_tok,
                       int64_t n_heads, int64_t dim, float lower, DevPtr<float> g) override;
    void gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t n_heads, int64_t dim,
                          float scale) override;
    void hc_coefficients(DevPtr<const float> mix, int64_t n_tok, int64_t n_streams,
                         const float* base, const float* scale, float eps, int64_t iterations,
                         DevPtr<float> pre, DevPtr<float> post, DevPtr<float> comb) override;
    void hc_reduce(DevPtr<const float> X, DevPtr<const float> w, int64_t n_tok, int64_t n_streams,
                   int64_t dim, DevPtr<float> y) override;
    void hc_expand(DevPtr<const float> X, DevPtr<const float> f, DevPtr<const float> post,
                   DevPtr<const float> comb, int64_t n_tok, int64_t n_streams, int64_t dim,
                   DevPtr<float> out) override;
    void pool_compress(const CacheRows& cells, int64_t key_width, int64_t gate_width,
                       int64_t pool_size, const float* ape, const float* norm_w, float eps,
                       const CacheRows& pools, DevPtr<const int32_t> pos, int64_t n_rows) override;
    void pool_cells(DevPtr<const int32_t> picked, DevPtr<const int32_t> pos, int64_t n_rows,
                    int64_t n_sel, int64_t pool_size, DevPtr<int32_t> rows,
                    int64_t stride) override;
    // ==== end of glm5next ops =====================================================

    // ==== vision tower ops (cpu_vision.cpp) ========================================
    void add_bias(DevPtr<float> y, int64_t n_rows, int64_t dim, int64_t stride,
                  const float* b) override;
    void gelu_erf(DevPtr<float> y, int64_t n) override;
    void rope_2d(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads, int64_t dim,
                 const int32_t* row, const int32_t* col, float theta) override;
    void attention_full(std::span<const FullAttentionSeq> seqs, int64_t n_heads, int64_t dim,
                        int64_t stride, float scale) override;

    Counters counters() const override {
        const ThreadPool::Stats p = pool_.stats();
        return Counters{weight_bytes_.load(), matmul_calls_.load(), cache_bytes_.load(),
                        p.ops - pool_base_.ops, p.rendezvous - pool_base_.rendezvous};
    }
    void reset_counters() override {
        weight_bytes_ = 0;
        cache_bytes_ = 0;
        matmul_calls_ = 0;
        pool_base_ = pool_.stats();
    }

  private:
    struct Block {
        std::unique_ptr<uint8_t, AlignedFree> p;
        size_t cap = 0, used = 0;
    };
    struct PerThread {
        ByteBuffer q;
        std::vector<float> rope, row, scores, acc;
        std::vector<int32_t> idx;
    };

    static amx_bf16::Elem elem_of(CacheType t) {
        return t == CacheType::F32   ? amx_bf16::Elem::F32
               : t == CacheType::F16 ? amx_bf16::Elem::F16
                                     : amx_bf16::Elem::BF16;
    }

    // Row s of an F16 or F32 cache as floats (a pointer into the cache when it is F32).
    static const float* load_row(const CacheRows& c, int64_t s, float* buf) {
        const uint8_t* p = cpu::host(c.data) + size_t(s) * c.row_bytes();
        if (c.type == CacheType::F32) return reinterpret_cast<const float*>(p);
        simd().f16_to_f32(c.width, reinterpret_cast<const uint16_t*>(p), buf);
        return buf;
    }

    // Each query's heads in `groups` tasks, one attend() per task.
    // --attn-bf16: the queries on AMX-BF16 tiles (cpu_attention_amx.h).
    void attend_bf16(std::span<const AttentionQuery> queries, int64_t n_heads, int64_t v_width,
                     float scale);
    // The indexer's scores into scores[score_off[i] + s]. A call's queries
    // grouped by the key cache they read (prefill: all of a sequence's
    // queries read one): each distinct cache, the most keys any of its
    // queries reads, and its queries in call order.
    struct KeyCaches {
        std::vector<const CacheRows*> keys;
        std::vector<int64_t> n_keys;
        std::vector<std::vector<size_t>> members;
        std::vector<size_t> cache_of;  // per query
    };
    static KeyCaches key_caches(std::span<const IndexerQuery> queries);
    // Tasks of kIndexerChunk keys of one cache for a run of up to
    // kIndexerRun of its queries; each block of kIndexerBlock keys converted
    // once and scored for the run while it is in L1. A cache that one query
    // reads (decode) is cut into about four stretches per thread instead,
    // scored by the form that converts its F16 keys as it goes.
    static constexpr int64_t kIndexerChunk = 256;
    static constexpr int64_t kIndexerRun = 64;
    static constexpr int64_t kIndexerBlock = 32;
    void indexer_scores(std::span<const IndexerQuery> queries, const KeyCaches& kc, int64_t n_heads,
                        int64_t dim, const std::vector<int64_t>& score_off, float* scores);
    // --attn-bf16: on tiles, tasks of kIndexerChunk keys per query.
    void indexer_scores_bf16(std::span<const IndexerQuery> queries, const KeyCaches& kc,
                             int64_t n_heads, int64_t dim, const std::vector<int64_t>& score_off,
                             float* scores);
    std::vector<amx_bf16::IndexerKeys> idx_keys_;  // per distinct key cache of a call
    amx_bf16::LineVector<uint16_t> idx_q_;         // the call's queries as B tiles
    bool attention_bf16_ = false;

    void attend_split(std::span<const AttentionQuery> queries, int64_t groups, int64_t n_heads,
                      int64_t v_width, float scale);

    // Rows a query reads: the dense prefix, else its selection.
    static int64_t n_visible(const AttentionQuery& q) {
        return q.visible.n_dense > 0 ? q.visible.n_dense : q.visible.n_rows;
    }

    // Decode deep into a context (one query, many visible rows, F16 cache):
    // the threads split the rows, then the heads, then the value columns,
    // so each row is read and converted once in each pass instead of once
    // per thread. Every score, softmax and output sum is the one attend()
    // computes (scores_f16 and weighted_sum_f16 give each value
    // independently of how rows, heads or columns are grouped), so the
    // split changes no bit. At depth 2048 (the indexer's top_k: every token
    // of a longer conversation) the head split read each layer's 2.4 MB of
    // rows in every thread; splitting by rows measured faster decode there,
    // about even near 1200 rows and slower at 600 (three passes' overhead),
    // hence the threshold.
    static constexpr int64_t kWideRows = 1536;
    void attend_wide(const AttentionQuery& q, int64_t H, int64_t v_width, float scale);

    // MLA for heads [h0, h1) of one query. Rows are the outer loop so each
    // cached row is read once for all the heads (MQA); every (head, row)
    // score and every output sum runs in row order, whatever the grouping.
    void attend(const AttentionQuery& q, int64_t h0, int64_t h1, int64_t v_width, float scale,
                PerThread& pt);

    // Rounds n rows of `cols` floats (row (s, t) at x + t*x_tok + s*x_slice)
    // into the activation format of `type`. Returns the buffer and row bytes.
    // With `expanded` (BF16 weights, where the CPU has the kernel): the rows
    // are floats holding the BF16 values instead, and *expanded is set.
    const uint8_t* quantize_acts(ByteBuffer& buf, quant::Type type, int64_t cols, int64_t S,
                                 const float* x, int64_t x_tok, int64_t x_slice, int64_t n,
                                 size_t& arow, bool* expanded = nullptr);

    // y[(s, t)][r] = W[s] row r . x[(s, t)] for every slice s < S.
    void products(const Weight& w, int64_t S, const float* x, int64_t x_tok, int64_t x_slice,
                  int64_t n, float* y, int64_t y_tok, int64_t y_slice);

    // One moe_experts call's work, in phases (cpu_moe.cpp).
    struct MoeWork;

    // y[t * y_tok + r] = row r of slice s . activation row t (act + t*arow),
    // for rows [r0, r1).
    // `expanded`: the activation rows are quantize_acts' expanded BF16 floats.
    static void product_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1, const uint8_t* act,
                             size_t arow, int64_t n, float* y, int64_t y_tok,
                             bool expanded = false);

    // Scheduling units of a weight's rows: whole groups when it is repacked
    // (the plain rows after the last group are one more unit), 16 rows
    // otherwise.
    static int64_t unit_rows(const Weight& w) {
        return w.repacked ? quant::repack_rows(w.type) : 16;
    }

    // fn(i, r0, r1) over the rows of weights weight_of(0 .. n-1): their
    // scheduling units form one list, handed out in guided chunks
    // (ThreadPool::parallel_for_guided), and fn runs for each weight's part
    // of a chunk. One list for all the matrices of an op: the threads finish
    // together whatever the matrices' sizes.
    template <class WeightOf, class F>
    void for_weight_rows(size_t n, WeightOf&& weight_of, F&& fn);

    // y[t * y_tok + r] = row r of slice s . activation row t (act + t*arow),
    // for rows [r0, r1) of a repacked weight, r0 on a group boundary and r1 on
    // one or at the end; the tail rows after the last group are plain.
    static void repacked_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1,
                              const uint8_t* act, size_t arow, int64_t n, float* y, int64_t y_tok);

    OpProfile profile_;  // first member destroyed last: reports after the pool stops
    ThreadPool pool_;
    ThreadPool::Stats pool_base_;  // at the last reset_counters()
    static constexpr size_t kMappedCache = size_t(1) << 20;
    std::mutex mapped_mu_;
    std::map<uint8_t*, size_t> mapped_;      // cache mappings and their sizes
    std::deque<SealedPages> weight_copies_;  // registered repacks
    // Each registered matrix's name, by the data the products get (for the observer).
    std::unordered_map<const uint8_t*, std::string> weight_names_;
    ProductObserver* observer_ = nullptr;
    // The observer told of a product's input (nothing without one, or for a matrix that was
    // never registered).
    void observe(const Weight& w, const float* x, int64_t stride, int64_t slice_stride,
                 int64_t n) const;
    void observe_routed(const Weight& w, int64_t slice, const float* x, int64_t stride,
                        int64_t n) const;
    std::vector<PerThread> per_thread_;
    std::vector<Block> blocks_;
    size_t cur_ = 0;
    static float* float_buffer(ByteBuffer& b, size_t n) {
        return reinterpret_cast<float*>(b.get(n * sizeof(float)));
    }

    ByteBuffer wide_q_;     // attend_wide
    ByteBuffer vision_kt_;  // attention_full: the keys transposed per head
    std::vector<float> wide_scores_;
    std::vector<ByteBuffer> multi_act_;  // matmuls: one per activation format
    ByteBuffer act_buf_, act_buf2_, moe_gate_buf_, moe_up_buf_, moe_tok_g_, moe_tok_u_, moe_g_,
        moe_u_, moe_eo_;
    std::atomic<uint64_t> weight_bytes_{0}, matmul_calls_{0}, cache_bytes_{0};
};

// A template: cpu_moe.cpp instantiates it too.
template <class WeightOf, class F>
void CpuBackend::for_weight_rows(size_t n, WeightOf&& weight_of, F&& fn) {
    std::vector<int64_t> off(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
        const Weight& w = weight_of(i);
        off[i + 1] = off[i] + (w.rows + unit_rows(w) - 1) / unit_rows(w);
    }
    pool_.parallel_for_guided(off.back(), 1, [&](int64_t b, int64_t e, int) {
        size_t i = size_t(std::upper_bound(off.begin(), off.end(), b) - off.begin()) - 1;
        for (; b < e; ++i) {
            const int64_t end = std::min(e, off[i + 1]);
            if (end > b) {
                const Weight& w = weight_of(i);
                const int64_t R = unit_rows(w);
                fn(i, (b - off[i]) * R, std::min(w.rows, (end - off[i]) * R));
            }
            b = end;
        }
    });
}

}  // namespace glm5::backend::cpu

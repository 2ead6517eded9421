// The CPU backend's class, shared by the files that implement its ops
// (cpu_backend.cpp, cpu_moe.cpp, and one file per family of ops).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include "backend/backend.h"
#include "backend/cpu_kernels.h"
#include "backend/cpu_simd.h"
#include "core/error.h"
#include "core/fp16.h"
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

inline float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}
using kernels::silu;

// GLM5_PROFILE=1 in the environment: wall time per op and per rows in the
// call (tokens for products, attention and the MoE; single and sliced products by
// weight type), printed to stderr when the backend is destroyed (a
// development aid for performance work: batched decode's ops next to single
// decode's).
class OpProfile {
  public:
    OpProfile() : on_(std::getenv("GLM5_PROFILE") != nullptr) {}
    std::function<void(const char*, int64_t)> fault_hook;  // BackendOptions::fault_hook
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

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(const BackendOptions& opt)
        : pool_(opt.n_threads > 0 ? opt.n_threads : ThreadPool::default_threads()) {
        per_thread_.resize(size_t(pool_.size()));
        profile_.fault_hook = opt.fault_hook;
    }
    ~CpuBackend() override = default;

    std::string name() const override { return "cpu"; }
    int n_threads() const override { return pool_.size(); }

    // ---- memory ------------------------------------------------------------
    float* scratch(size_t n) override {
        const size_t bytes = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
        while (cur_ < blocks_.size() && blocks_[cur_].used + bytes > blocks_[cur_].cap) ++cur_;
        if (cur_ == blocks_.size()) {
            Block b;
            b.cap = std::max<size_t>(bytes, size_t(64) << 20);
            b.p.reset(static_cast<uint8_t*>(aligned_malloc(b.cap)));
            blocks_.push_back(std::move(b));
        }
        Block& b = blocks_[cur_];
        float* p = reinterpret_cast<float*>(b.p.get() + b.used);
        b.used += bytes;
        return p;
    }
    void reset_scratch() override {
        for (auto& b : blocks_) b.used = 0;
        cur_ = 0;
    }
    // Large caches are anonymous mappings: zero without being written, and
    // resident only as their rows are filled (the memory plan counts the
    // whole size; a full context is not touched before it is used).
    uint8_t* alloc_cache(size_t bytes) override {
        if (bytes >= kMappedCache) {
            void* m =
                ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                throw ResourceError("out of memory mapping " + std::to_string(bytes) +
                                    " bytes of cache");
            std::lock_guard<std::mutex> lk(mapped_mu_);
            mapped_[static_cast<uint8_t*>(m)] = bytes;
            return static_cast<uint8_t*>(m);
        }
        auto* p = static_cast<uint8_t*>(aligned_malloc(std::max<size_t>(bytes, 1)));
        std::memset(p, 0, bytes);
        return p;
    }
    void free_cache(uint8_t* p) override {
        if (!p) return;
        {
            std::lock_guard<std::mutex> lk(mapped_mu_);
            auto it = mapped_.find(p);
            if (it != mapped_.end()) {
                ::munmap(p, it->second);
                mapped_.erase(it);
                return;
            }
        }
        std::free(p);
    }
    void read(const float* src, float* dst, size_t n) override {
        std::memcpy(dst, src, n * sizeof(float));
    }
    void write(float* dst, const float* src, size_t n) override {
        std::memcpy(dst, src, n * sizeof(float));
    }
    void copy_cache(uint8_t* dst, const uint8_t* src, size_t bytes,
                    const char* why = "copy_cache") override {
        OpTimer timer_(profile_, why, int64_t(bytes));
        std::memcpy(dst, src, bytes);
    }

    // ---- elementwise ---------------------------------------------------------
    void embed(const Weight& table, std::span<const int32_t> ids, float* out) override {
        OpTimer timer_(profile_, "embed", int64_t(ids.size()));
        if (table.repacked) throw Error("embed: a repacked table has no plain rows");
        const int64_t E = table.cols;
        pool_.parallel_for(int64_t(ids.size()), 16, [&](int64_t b, int64_t e, int) {
            for (int64_t t = b; t < e; ++t)
                quant::dequantize_row(table.type, table.row(ids[size_t(t)]), out + t * E, E);
        });
    }

    void rms_norm(const float* x, int64_t xs, const float* w, int64_t n_rows, int64_t dim,
                  float eps, float* y, int64_t ys) override {
        OpTimer timer_(profile_, "rms_norm", n_rows);
        pool_.parallel_for(n_rows, 8, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) simd().rms_norm(x + r * xs, w, dim, eps, y + r * ys);
        });
    }

    void layer_norm(const float* x, const float* w, const float* bias, int64_t n_rows, int64_t dim,
                    float eps, float* y) override {
        OpTimer timer_(profile_, "layer_norm", n_rows);
        pool_.parallel_for(n_rows, 8, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r)
                kernels::layer_norm_row(x + r * dim, w, bias, dim, eps, y + r * dim);
        });
    }

    void rope(float* x, int64_t n_tok, int64_t tok_stride, int64_t n_heads, int64_t head_stride,
              int64_t n_rot, const int32_t* pos, float freq_base) override {
        OpTimer timer_(profile_, "rope", n_tok);
        pool_.parallel_for(n_tok, 4, [&](int64_t b, int64_t e, int ith) {
            std::vector<float>& cs = per_thread_[size_t(ith)].rope;
            cs.resize(size_t(n_rot));
            for (int64_t t = b; t < e; ++t) {
                kernels::rope_cos_sin(pos[t], n_rot, freq_base, cs.data());
                for (int64_t hh = 0; hh < n_heads; ++hh)
                    kernels::rope_apply(x + t * tok_stride + hh * head_stride, n_rot, cs.data());
            }
        });
    }

    void hadamard(float* x, int64_t n_vec, int64_t dim) override {
        OpTimer timer_(profile_, "hadamard", n_vec);
        pool_.parallel_for(n_vec, 16, [&](int64_t b, int64_t e, int) {
            for (int64_t v = b; v < e; ++v) kernels::hadamard_row(x + v * dim, dim);
        });
    }

    void copy_rows(const float* src, int64_t ss, const int32_t* rows, int64_t n_rows,
                   int64_t n_cols, float* dst, int64_t ds) override {
        for (int64_t i = 0; i < n_rows; ++i)
            std::memcpy(dst + i * ds, src + (rows ? rows[i] : i) * ss,
                        size_t(n_cols) * sizeof(float));
    }

    void add(float* y, const float* x, int64_t n) override { kernels::add_row(y, x, n); }

    void scale(float* y, float s, int64_t n) override {
        for (int64_t i = 0; i < n; ++i) y[i] *= s;
    }

    void swiglu(const float* g, const float* u, int64_t n_rows, int64_t n, int64_t in_stride,
                float clamp, float* out) override {
        OpTimer timer_(profile_, "swiglu", n_rows);
        pool_.parallel_for(n_rows, 16, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r)
                simd().swiglu(n, g + r * in_stride, u + r * in_stride, clamp, out + r * n);
        });
    }

    // ---- matrix products -------------------------------------------------------
    void matmul(const Weight& w, const float* x, int64_t xs, int64_t n_tok, float* y,
                int64_t ys) override {
        OpTimer timer_(profile_, "matmul", n_tok, quant::name(w.type));
        products(w, 1, x, xs, 0, n_tok, y, ys, 0);
    }

    void matmuls(std::span<const MatmulOut> outs, const float* x, int64_t xs,
                 int64_t n_tok) override {
        OpTimer timer_(profile_, "matmuls", n_tok);
        if (n_tok <= 0 || outs.empty()) return;
        // One quantized copy of x per activation format (outs share few).
        struct Act {
            quant::Type type;
            const uint8_t* data;
            size_t arow;
        };
        std::vector<Act> acts;
        std::vector<size_t> act_of(outs.size());
        for (size_t j = 0; j < outs.size(); ++j) {
            const Weight& w = *outs[j].w;
            const quant::Type at = quant::traits(w.type).vec_dot_type;
            size_t a = 0;
            while (a < acts.size() && acts[a].type != at) ++a;
            if (a == acts.size()) {
                if (a >= multi_act_.size()) multi_act_.resize(a + 1);
                size_t arow = 0;
                const uint8_t* d =
                    quantize_acts(multi_act_[a], w.type, w.cols, 1, x, xs, 0, n_tok, arow);
                acts.push_back({at, d, arow});
            }
            act_of[j] = a;
        }
        for_weight_rows(
            outs.size(), [&](size_t j) -> const Weight& { return *outs[j].w; },
            [&](size_t j, int64_t r0, int64_t r1) {
                const Act& a = acts[act_of[j]];
                product_rows(*outs[j].w, 0, r0, r1, a.data, a.arow, n_tok, outs[j].y,
                             outs[j].y_stride);
            });
        for (const MatmulOut& o : outs) weight_bytes_ += o.w->payload_bytes();
        matmul_calls_ += outs.size();
    }

    void matmul_slices(const Weight& w, const float* x, int64_t x_tok, int64_t x_slice,
                       int64_t n_tok, float* y, int64_t y_tok, int64_t y_slice) override {
        OpTimer timer_(profile_, "matmul_slices", n_tok, quant::name(w.type));
        products(w, w.slices, x, x_tok, x_slice, n_tok, y, y_tok, y_slice);
    }

    // ---- caches and attention ----------------------------------------------------
    void cache_store(const CacheRows& c, const float* x, int64_t xs, int64_t n_tok,
                     const int32_t* pos) override {
        OpTimer timer_(profile_, "cache_store", n_tok);
        for (int64_t t = 0; t < n_tok; ++t) {
            uint8_t* dst = c.data + size_t(pos[t]) * c.row_bytes();
            const float* src = x + t * xs;
            if (c.type == CacheType::F32) {
                std::memcpy(dst, src, size_t(c.width) * sizeof(float));
            } else {
                simd().f32_to_f16(c.width, src, reinterpret_cast<uint16_t*>(dst));
            }
        }
    }

    void indexer_select(std::span<const IndexerQuery> queries, int64_t n_heads, int64_t dim,
                        int64_t top_k) override {
        OpTimer timer_(profile_, "indexer_select", int64_t(queries.size()));
        // Scores for every (query, key chunk), then a top-k per query.
        constexpr int64_t kChunk = 256;
        std::vector<int64_t> first_task(queries.size() + 1, 0);
        std::vector<int64_t> score_off(queries.size() + 1, 0);
        for (size_t i = 0; i < queries.size(); ++i) {
            first_task[i + 1] = first_task[i] + (queries[i].n_keys + kChunk - 1) / kChunk;
            score_off[i + 1] = score_off[i] + queries[i].n_keys;
        }
        std::vector<float> scores(static_cast<size_t>(score_off.back()));
        const quant::VecDotFn dot32 = quant::vec_dot_fn(quant::Type::F32);
        pool_.parallel_for(first_task.back(), 1, [&](int64_t b, int64_t e, int ith) {
            std::vector<float>& kf = per_thread_[size_t(ith)].row;
            kf.resize(size_t(dim));
            for (int64_t task = b; task < e; ++task) {
                const size_t qi =
                    size_t(std::upper_bound(first_task.begin(), first_task.end(), task) -
                           first_task.begin() - 1);
                const IndexerQuery& q = queries[qi];
                const int64_t s0 = (task - first_task[qi]) * kChunk;
                const int64_t s1 = std::min<int64_t>(q.n_keys, s0 + kChunk);
                for (int64_t s = s0; s < s1; ++s) {
                    const float* k = load_row(q.keys, s, kf.data());
                    float score = 0.0f;
                    for (int64_t hh = 0; hh < n_heads; ++hh) {
                        const float qk = dot32(dim, q.q + hh * dim, k);
                        score += std::max(qk, 0.0f) * q.w[hh];
                    }
                    scores[size_t(score_off[qi] + s)] = score;
                }
            }
        });
        pool_.parallel_for(int64_t(queries.size()), 1, [&](int64_t b, int64_t e, int ith) {
            std::vector<int32_t>& idx = per_thread_[size_t(ith)].idx;
            for (int64_t qi = b; qi < e; ++qi) {
                const IndexerQuery& q = queries[size_t(qi)];
                const float* sc = scores.data() + score_off[size_t(qi)];
                kernels::top_k_rows(sc, q.n_keys, top_k, idx, q.out_rows);
            }
        });
    }

    void mla_attention(std::span<const AttentionQuery> queries, int64_t n_heads, int64_t v_width,
                       float scale) override {
        OpTimer timer_(profile_, "mla_attention", int64_t(queries.size()));
        // Few queries (decode): split each query's heads across threads, one
        // group per thread (every group converts all the rows it reads, so
        // more groups cost more conversions: two per thread were 10% slower
        // decode at depth 2048); many (prefill): one task per query, all
        // heads sharing each row read.
        const int64_t nq = int64_t(queries.size());
        if (nq < pool_.size() && queries[0].cache.type == CacheType::F16) {
            for (const AttentionQuery& q : queries) {
                if (n_visible(q) < kWideRows)
                    attend_split({&q, 1}, pool_.size(), n_heads, v_width, scale);
                else
                    attend_wide(q, n_heads, v_width, scale);
            }
            return;
        }
        attend_split(queries, std::clamp<int64_t>((pool_.size() + nq - 1) / nq, 1, n_heads),
                     n_heads, v_width, scale);
    }

    // ---- mixture of experts ----------------------------------------------------
    void moe(const MoeWeights& m, const float* x, int64_t T, float* out) override;  // cpu_moe.cpp

    // ==== glm5next ops (cpu_kda.cpp, cpu_hyper.cpp, cpu_pool_indexer.cpp) ======
    void l2_norm(const float* x, int64_t n_rows, int64_t dim, float eps, float* y) override;
    void apply_sigmoid(float* y, int64_t n) override;
    void mul_sigmoid(float* y, const float* gate, int64_t n) override;
    void causal_conv(std::span<const ConvSeq> seqs, int64_t channels, const float* taps,
                     int64_t kernel, int64_t x_stride, int64_t y_stride, bool silu) override;
    void bounded_decay(const float* z, const float* bias, const float* rate, int64_t n_tok,
                       int64_t n_heads, int64_t dim, float lower, float* g) override;
    void gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t n_heads, int64_t dim,
                          float scale) override;
    void hc_coefficients(const float* mix, int64_t n_tok, int64_t n_streams, const float* base,
                         const float* scale, float eps, int64_t iterations, float* pre, float* post,
                         float* comb) override;
    void hc_reduce(const float* X, const float* w, int64_t n_tok, int64_t n_streams, int64_t dim,
                   float* y) override;
    void hc_expand(const float* X, const float* f, const float* post, const float* comb,
                   int64_t n_tok, int64_t n_streams, int64_t dim, float* out) override;
    void pool_compress(const CacheRows& cells, int64_t key_width, int64_t gate_width,
                       int64_t pool_size, const float* ape, const float* norm_w, float eps,
                       const CacheRows& pools, int64_t first_pool, int64_t n_pools) override;
    // ==== end of glm5next ops =====================================================

    // ==== vision tower ops (cpu_vision.cpp) ========================================
    void add_bias(float* y, int64_t n_rows, int64_t dim, int64_t stride, const float* b) override;
    void gelu_erf(float* y, int64_t n) override;
    void rope_2d(float* x, int64_t n_tok, int64_t tok_stride, int64_t n_heads, int64_t dim,
                 const int32_t* row, const int32_t* col, float theta) override;
    void attention_full(std::span<const FullAttentionSeq> seqs, int64_t n_heads, int64_t dim,
                        int64_t stride, float scale) override;

    Counters counters() const override {
        return Counters{weight_bytes_.load(), matmul_calls_.load()};
    }
    void reset_counters() override {
        weight_bytes_ = 0;
        matmul_calls_ = 0;
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

    // Row s of a cache as floats (a pointer into the cache when it is F32).
    static const float* load_row(const CacheRows& c, int64_t s, float* buf) {
        const uint8_t* p = c.data + size_t(s) * c.row_bytes();
        if (c.type == CacheType::F32) return reinterpret_cast<const float*>(p);
        simd().f16_to_f32(c.width, reinterpret_cast<const uint16_t*>(p), buf);
        return buf;
    }

    // Each query's heads in `groups` tasks, one attend() per task.
    void attend_split(std::span<const AttentionQuery> queries, int64_t groups, int64_t n_heads,
                      int64_t v_width, float scale) {
        pool_.parallel_for(int64_t(queries.size()) * groups, 1, [&](int64_t b, int64_t e, int ith) {
            PerThread& pt = per_thread_[size_t(ith)];
            for (int64_t task = b; task < e; ++task) {
                const int64_t g = task % groups;
                attend(queries[size_t(task / groups)], g * n_heads / groups,
                       (g + 1) * n_heads / groups, v_width, scale, pt);
            }
        });
    }

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
    // rows in every thread; per-token A/B runs: 6-7% faster decode there,
    // neutral at 1200 rows, 5% slower at 600 (three passes' overhead), hence
    // the threshold.
    static constexpr int64_t kWideRows = 1536;
    void attend_wide(const AttentionQuery& q, int64_t H, int64_t v_width, float scale) {
        const CacheRows& c = q.cache;
        const int64_t W = c.width;
        const int64_t n = n_visible(q);
        const int32_t* idx = q.visible.n_dense > 0 ? nullptr : q.visible.rows;
        const SimdOps& sv = simd();
        // Rows [j0, ..) of the visible set, columns from c0 on.
        auto rows_from = [&](int64_t j0, int64_t c0) {
            const uint8_t* base = c.data + size_t(c0) * sizeof(uint16_t);
            if (idx) return F16Rows{base, c.row_bytes(), idx + j0};
            return F16Rows{base + size_t(j0) * c.row_bytes(), c.row_bytes(), nullptr};
        };
        // Aligned: every thread's scores_f16 reads it in place.
        float* const wq = reinterpret_cast<float*>(wide_q_.get(size_t(H * W) * sizeof(float)));
        sv.round_f16(H * W, q.q, wq);
        wide_scores_.resize(size_t(H * n));
        float* sc = wide_scores_.data();
        const int64_t T = pool_.size();
        const int64_t rgrain = (n / (4 * T) + 15) / 16 * 16;
        pool_.parallel_for(n, std::max<int64_t>(16, rgrain), [&](int64_t b, int64_t e, int) {
            sv.scores_f16(wq, H, W, rows_from(b, 0), e - b, sc + b, n);
            for (int64_t h = 0; h < H; ++h)
                for (int64_t j = b; j < e; ++j) sc[h * n + j] *= scale;
        });
        pool_.parallel_for(H, 1, [&](int64_t b, int64_t e, int) {
            for (int64_t h = b; h < e; ++h) sv.softmax(sc + h * n, n, true);
        });
        // Value columns in pieces of 64 (whole tiles), all heads per piece.
        const int64_t cw = 64, pieces = (v_width + cw - 1) / cw;
        pool_.parallel_for(pieces, 1, [&](int64_t b, int64_t e, int ith) {
            std::vector<float>& part = per_thread_[size_t(ith)].acc;
            for (int64_t k = b; k < e; ++k) {
                const int64_t c0 = k * cw, w = std::min(cw, v_width - c0);
                part.resize(size_t(H * w));
                sv.weighted_sum_f16(sc, n, H, rows_from(0, c0), n, w, part.data());
                for (int64_t h = 0; h < H; ++h)
                    std::memcpy(q.out + h * v_width + c0, part.data() + h * w,
                                size_t(w) * sizeof(float));
            }
        });
    }

    // MLA for heads [h0, h1) of one query. Rows are the outer loop so each
    // cached row is read once for all the heads (MQA); every (head, row)
    // score and every output sum runs in row order, whatever the grouping.
    void attend(const AttentionQuery& q, int64_t h0, int64_t h1, int64_t v_width, float scale,
                PerThread& pt) {
        const CacheRows& c = q.cache;
        const int64_t W = c.width, nh = h1 - h0;
        const bool f16 = c.type == CacheType::F16;
        const int64_t n = n_visible(q);
        const SimdOps& sv = simd();
        const quant::VecDotFn dot32 = quant::vec_dot_fn(quant::Type::F32);
        auto row_ptr = [&](int64_t j) {
            const int64_t r = q.visible.n_dense > 0 ? j : q.visible.rows[j];
            return c.data + size_t(r) * c.row_bytes();
        };
        // An F16 K cache makes the query F16 too (the activation of an F16
        // product). 64-byte aligned: scores_f16 reads it in place.
        float* const qh = reinterpret_cast<float*>(pt.q.get(size_t(nh * W) * sizeof(float)));
        if (f16)
            sv.round_f16(nh * W, q.q + h0 * W, qh);
        else
            std::memcpy(qh, q.q + h0 * W, size_t(nh * W) * sizeof(float));
        pt.scores.resize(size_t(nh * n));
        const F16Rows rows{c.data, c.row_bytes(), q.visible.n_dense > 0 ? nullptr : q.visible.rows};
        if (f16) {
            sv.scores_f16(qh, nh, W, rows, n, pt.scores.data(), n);
            for (float& v : pt.scores) v *= scale;
        } else {
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t* r = row_ptr(j);
                for (int64_t h = 0; h < nh; ++h)
                    pt.scores[size_t(h * n + j)] = dot32(W, qh + h * W, r) * scale;
            }
        }
        for (int64_t h = 0; h < nh; ++h) sv.softmax(pt.scores.data() + h * n, n, f16);
        if (f16) {
            sv.weighted_sum_f16(pt.scores.data(), n, nh, rows, n, v_width, q.out + h0 * v_width);
            return;
        }
        pt.acc.assign(size_t(nh * v_width), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
            const uint8_t* r = row_ptr(j);
            for (int64_t h = 0; h < nh; ++h)
                sv.axpy_f32(v_width, pt.scores[size_t(h * n + j)],
                            reinterpret_cast<const float*>(r), pt.acc.data() + h * v_width);
        }
        for (int64_t h = 0; h < nh; ++h)
            std::memcpy(q.out + (h0 + h) * v_width, pt.acc.data() + h * v_width,
                        size_t(v_width) * sizeof(float));
    }

    // Rounds n rows of `cols` floats (row (s, t) at x + t*x_tok + s*x_slice)
    // into the activation format of `type`. Returns the buffer and row bytes.
    const uint8_t* quantize_acts(ByteBuffer& buf, quant::Type type, int64_t cols, int64_t S,
                                 const float* x, int64_t x_tok, int64_t x_slice, int64_t n,
                                 size_t& arow) {
        const quant::Type at = quant::traits(type).vec_dot_type;
        arow = quant::row_size(at, cols);
        uint8_t* act = buf.get(arow * size_t(S * n));
        // At least 16K values per chunk: decode's few rows (16 heads of a
        // slice product, 8 experts' hidden rows) take about a microsecond,
        // less than handing them to the pool and waiting for it.
        const int64_t grain = std::max<int64_t>(4, (int64_t(1) << 14) / std::max<int64_t>(1, cols));
        pool_.parallel_for(S * n, grain, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) {
                const int64_t s = i / n, t = i % n;
                quant::quantize_activation_row(at, x + t * x_tok + s * x_slice,
                                               act + size_t(i) * arow, cols);
            }
        });
        return act;
    }

    // y[(s, t)][r] = W[s] row r . x[(s, t)] for every slice s < S.
    void products(const Weight& w, int64_t S, const float* x, int64_t x_tok, int64_t x_slice,
                  int64_t n, float* y, int64_t y_tok, int64_t y_slice) {
        if (n <= 0) return;
        size_t arow = 0;
        const uint8_t* act = quantize_acts(act_buf_, w.type, w.cols, S, x, x_tok, x_slice, n, arow);
        for_weight_rows(
            size_t(S), [&](size_t) -> const Weight& { return w; },
            [&](size_t s, int64_t r0, int64_t r1) {
                product_rows(w, int64_t(s), r0, r1, act + size_t(int64_t(s) * n) * arow, arow, n,
                             y + int64_t(s) * y_slice, y_tok);
            });
        weight_bytes_ += uint64_t(S) * w.payload_bytes();
        matmul_calls_ += 1;
    }

    // y[t * y_tok + r] = row r of slice s . activation row t (act + t*arow),
    // for rows [r0, r1).
    static void product_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1, const uint8_t* act,
                             size_t arow, int64_t n, float* y, int64_t y_tok) {
        if (w.repacked) {
            repacked_rows(w, s, r0, r1, act, arow, n, y, y_tok);
            return;
        }
        const quant::VecDotFn dot = quant::vec_dot_fn(w.type);
        const quant::VecDotMultiFn multi = quant::vec_dot_multi_fn(w.type);
        for (int64_t t0 = 0; t0 < n; t0 += 8) {
            const int64_t t1 = std::min(n, t0 + 8);
            for (int64_t r = r0; r < r1; ++r) {
                const uint8_t* wr = w.row(r, s);
                const uint8_t* a0 = act + size_t(t0) * arow;
                if (multi && t1 - t0 > 1) {
                    float o[8];
                    multi(w.cols, wr, a0, arow, t1 - t0, o);
                    for (int64_t t = t0; t < t1; ++t) y[t * y_tok + r] = o[t - t0];
                } else {
                    for (int64_t t = t0; t < t1; ++t)
                        y[t * y_tok + r] = dot(w.cols, wr, a0 + size_t(t - t0) * arow);
                }
            }
        }
    }

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
    void for_weight_rows(size_t n, WeightOf&& weight_of, F&& fn) {
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

    // y[t * y_tok + r] = row r of slice s . activation row t (act + t*arow),
    // for rows [r0, r1) of a repacked weight, r0 on a group boundary and r1 on
    // one or at the end; the tail rows after the last group are plain.
    static void repacked_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1,
                              const uint8_t* act, size_t arow, int64_t n, float* y, int64_t y_tok) {
        const int64_t R = quant::repack_rows(w.type), G = w.rows / R;
        const uint8_t* base = w.data + size_t(s) * w.slice_bytes;
        const int64_t g0 = r0 / R, g1 = std::min(r1, G * R) / R;
        if (g1 > g0)
            quant::gemm_repacked(w.type, w.cols,
                                 base + size_t(g0) * quant::repacked_group_bytes(w.type, w.cols),
                                 g1 - g0, act, arow, n, y + g0 * R, size_t(y_tok));
        if (r1 <= G * R) return;
        const auto* tail =
            static_cast<const uint8_t*>(quant::repacked_tail(w.type, base, w.cols, w.rows));
        const quant::VecDotFn dot = quant::vec_dot_fn(w.type);
        for (int64_t r = std::max(r0, G * R); r < r1; ++r)
            for (int64_t t = 0; t < n; ++t)
                y[t * y_tok + r] =
                    dot(w.cols, tail + size_t(r - G * R) * w.row_bytes, act + size_t(t) * arow);
    }

    OpProfile profile_;  // first member destroyed last: reports after the pool stops
    ThreadPool pool_;
    static constexpr size_t kMappedCache = size_t(1) << 20;
    std::mutex mapped_mu_;
    std::map<uint8_t*, size_t> mapped_;  // cache mappings and their sizes
    std::vector<PerThread> per_thread_;
    std::vector<Block> blocks_;
    size_t cur_ = 0;
    static float* moe_floats(ByteBuffer& b, size_t n) {
        return reinterpret_cast<float*>(b.get(n * sizeof(float)));
    }

    ByteBuffer wide_q_;     // attend_wide
    ByteBuffer vision_kt_;  // attention_full: the keys transposed per head
    std::vector<float> wide_scores_;
    std::vector<ByteBuffer> multi_act_;  // matmuls: one per activation format
    ByteBuffer act_buf_, act_buf2_, moe_gate_buf_, moe_up_buf_, moe_tok_g_, moe_tok_u_, moe_g_,
        moe_u_, moe_eo_;
    std::atomic<uint64_t> weight_bytes_{0}, matmul_calls_{0};
};

}  // namespace glm5::backend::cpu

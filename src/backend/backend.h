// The operations the model forwards are written in. Ops are coarse (a whole
// matmul over a batch, a whole MLA attention, a whole MoE FFN) and generic over
// shapes: they know formats and sizes, never model names. The CPU backend
// implements them with a persistent thread pool; another backend (CUDA) can
// implement the same interface without touching src/model/.
//
// Memory the ops work on is the backend's: activations, caches, recurrent
// state and the indexer's selections are DevPtr handles, which model code
// offsets and passes between ops but cannot dereference (what they point at
// is an incomplete type). Host memory enters and leaves only through explicit
// copies (write, read: token rows in, logits out), and the step's plan (token ids,
// positions, the rows that want logits), written once per step (plan()) and read by
// the ops through handles.
// Weights are host views of the model file (Weight, `const float*` vectors):
// a device backend makes its own copies of what it reads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/hd.h"
#include "quant/types.h"

namespace glm5::backend {

// What a DevPtr points at: declared, never defined. Only a backend knows how
// its handles map to memory (the CPU backend's are addresses).
struct DeviceMemory;

// A position in backend memory holding T values: offsets in elements like a
// pointer, converts to a DevPtr of const T or of bytes, never to T*. It carries the
// backend that owns the memory (Backend::id(); 0: memory of no backend, host arrays a
// caller hands a CPU backend), so that a handle passed to another backend is refused
// instead of misread; Backend::copy_from moves values between backends.
template <class T>
class DevPtr {
  public:
    DevPtr() = default;
    DevPtr(std::nullptr_t) {}
    template <class U>
    requires(!std::is_same_v<U, T> && std::is_convertible_v<U*, T*>) DevPtr(DevPtr<U> o)
        : p_(o.handle()), owner_(o.owner()) {}

    static DevPtr from_handle(DeviceMemory* p, uint32_t owner = 0) {
        DevPtr d;
        d.p_ = p;
        d.owner_ = owner;
        return d;
    }
    DeviceMemory* handle() const { return p_; }
    uint32_t owner() const { return owner_; }
    explicit operator bool() const { return p_ != nullptr; }
    bool operator==(const DevPtr& o) const { return p_ == o.p_; }

    DevPtr operator+(int64_t n) const requires(!std::is_void_v<T>) {
        return from_handle(
            reinterpret_cast<DeviceMemory*>(reinterpret_cast<char*>(p_) + n * int64_t(sizeof(T))),
            owner_);
    }
    DevPtr& operator+=(int64_t n) requires(!std::is_void_v<T>) { return *this = *this + n; }
    // The same memory seen as other values (a byte cache holding floats).
    template <class U>
    DevPtr<U> as() const {
        return DevPtr<U>::from_handle(p_, owner_);
    }

  private:
    DeviceMemory* p_ = nullptr;
    uint32_t owner_ = 0;
};

// A weight matrix, or a stack of matrices (experts, per-head slices), in its
// storage format. Row r of slice s starts at data + s*slice_bytes + r*row_bytes.
struct Weight {
    quant::Type type = quant::Type::F32;
    int64_t cols = 0;    // ne0: values per row (the input dimension)
    int64_t rows = 0;    // ne1: output dimension
    int64_t slices = 1;  // ne2: experts or heads
    size_t row_bytes = 0;
    size_t slice_bytes = 0;
    const uint8_t* data = nullptr;
    // Each slice in quant::repack's interleaved layout (groups of 16 rows,
    // slice_bytes = quant::repacked_bytes): only the matrix products read it,
    // and row() does not apply. Made by the loader's --repack option.
    bool repacked = false;

    explicit operator bool() const { return data != nullptr; }
    const uint8_t* row(int64_t r, int64_t s = 0) const {
        return data + size_t(s) * slice_bytes + size_t(r) * row_bytes;
    }
    size_t bytes() const { return size_t(slices) * slice_bytes; }
    // The bytes a product reads from one slice (slice_bytes is the stride
    // between slices: a view of some rows or columns reads less).
    size_t payload_bytes() const {
        return repacked ? slice_bytes : quant::row_size(type, cols) * size_t(rows);
    }
};

// Storage type of attention caches (MLA latent rows, indexer keys).
// BF16 only where the backend asks for it (indexer_key_type).
enum class CacheType { F32, F16, BF16 };
const char* cache_type_name(CacheType t);
size_t cache_elem_size(CacheType t);

// A contiguous block of rows in a cache: row i is at data + i*row_bytes.
// Cache memory is allocated by the backend (alloc_cache) and owned by a
// sequence's state.
struct CacheRows {
    DevPtr<uint8_t> data;
    int64_t width = 0;  // values per row
    CacheType type = CacheType::F32;
    size_t row_bytes() const { return size_t(width) * cache_elem_size(type); }
};

// A mixture of experts' routing: a sigmoid router with a selection-only bias, the top
// n_used experts, their weights renormalised and scaled.
struct MoeRouter {
    Weight router;                // [E -> n_expert], F32 in practice
    const float* bias = nullptr;  // selection-only bias [n_expert] (host memory of the weight file)
    int n_used = 0;
    bool norm_weights = true;
    float weights_scale = 1.0f;
};

// SwiGLU FFNs: the routed experts (stacks of n_expert matrices) or the shared expert.
struct MoeFfn {
    Weight gate, up, down;
    float clamp = 0.0f;  // SwiGLU clamp limit (<= 1e-6: none)
    explicit operator bool() const { return bool(gate); }
};

struct MoeWeights {
    MoeRouter route;
    MoeFfn experts;
    MoeFfn shared;  // optional
};

// Bytes of weights read by the kernels, counted as they run (for the
// decode roofline in `glm5 bench`).
struct Counters {
    uint64_t weight_bytes = 0;
    uint64_t matmul_calls = 0;
    // Attention cache and recurrent state bytes the ops read: each attention
    // or indexer query counts the rows it sees, each linear-attention
    // sequence its state (decode's traffic; in prefill the rows that queries
    // share are counted once per query).
    uint64_t cache_bytes = 0;
    // Work handed to a parallel executor (a CPU backend's thread pool), and the
    // handings that waited until every thread had met.
    uint64_t parallel_ops = 0;
    uint64_t rendezvous = 0;
    // The most scratch memory held at once (bytes; a device backend's arena; 0 where the
    // backend does not count it): what the memory plan's scratch figure must cover.
    uint64_t scratch_peak = 0;
    // Two backends' reads together (a device and the CPU beside it).
    Counters& operator+=(const Counters& o) {
        weight_bytes += o.weight_bytes;
        matmul_calls += o.matmul_calls;
        cache_bytes += o.cache_bytes;
        parallel_ops += o.parallel_ops;
        rendezvous += o.rendezvous;
        scratch_peak = std::max(scratch_peak, o.scratch_peak);
        return *this;
    }
};

// Tensor parallelism: sums a partial result over the ranks that share a
// layer's weights (provided by the multi-rank runtime, which moves host
// memory; a backend whose memory is elsewhere stages through it, or talks to
// its peers directly).
class Reducer {
  public:
    virtual ~Reducer() = default;
    // x (n floats, host memory) becomes the sum of every rank's x, added in
    // rank order, so every rank gets the same bits.
    virtual void sum(float* x, int64_t n) = 0;
};

// Layer split: where the residual rows entering a process's first layer come
// from, and where those leaving its last layer go (another rank, or a test's
// host buffer). Host memory at this interface, as for Reducer.
class RowChannel {
  public:
    virtual ~RowChannel() = default;
    // n floats, in batch order.
    virtual void receive(float* host, size_t n) = 0;
    virtual void send(const float* host, size_t n) = 0;
};

class Backend {
  public:
    Backend();
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // This backend's number, carried by every handle it makes (DevPtr::owner()).
    uint32_t id() const { return id_; }
    // The one way values cross between backends: `bytes` from `from` (memory of `src`)
    // to `to` (this backend's). Staged through the host here; a device backend may copy
    // directly from a peer.
    virtual void copy_from(Backend& src, DevPtr<const uint8_t> from, DevPtr<uint8_t> to,
                           size_t bytes);
    // The scratch mla_attention takes beside its arguments for a batch's queries of
    // n_heads heads over at most n_visible rows each (the memory plan counts it): what
    // the backend keeps per worker is its own business.
    virtual size_t attention_scratch_bytes(int64_t n_heads, int64_t n_visible) const = 0;

    // ---- tensor parallelism ---------------------------------------------
    // The partial sums of a layer whose weights are split across ranks
    // become the whole sum (unchanged without a reducer: one process).
    virtual void reduce_sum(DevPtr<float> x, int64_t n) = 0;
    void set_reducer(Reducer* r) { reducer_ = r; }
    // Layer split: n floats of residual rows from / to the neighbouring part.
    virtual void receive_rows(RowChannel& from, DevPtr<float> x, size_t n) = 0;
    virtual void send_rows(RowChannel& to, DevPtr<const float> x, size_t n) = 0;

    // ---- memory --------------------------------------------------------
    // Scratch activations: valid until reset_scratch(). Sizes in floats.
    virtual DevPtr<float> scratch(size_t n_floats) = 0;
    // Scratch row indices (selections), from the same arena.
    DevPtr<int32_t> scratch_ids(size_t n) { return scratch(n).as<int32_t>(); }
    virtual void reset_scratch() = 0;
    // Long-lived cache memory (zeroed). Freed with free_cache.
    virtual DevPtr<uint8_t> alloc_cache(size_t bytes) = 0;
    virtual void free_cache(DevPtr<uint8_t> p) = 0;
    // Copies between backend memory and the host: the only way values cross.
    virtual void read_bytes(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) = 0;
    virtual void write_bytes(DevPtr<uint8_t> dst, const void* host_src, size_t bytes) = 0;
    template <class T>
    void read(DevPtr<T> src, std::remove_const_t<T>* host_dst, size_t n) {
        read_bytes(src.template as<const uint8_t>(), host_dst, n * sizeof(T));
    }
    template <class T>
    void write(DevPtr<T> dst, const T* host_src, size_t n) {
        write_bytes(dst.template as<uint8_t>(), host_src, n * sizeof(T));
    }
    // ---- weights -----------------------------------------------------------
    // Each matrix the products read is registered once, at load, and the products take
    // the Weight registration returns. The CPU backend returns the view as it is or, with
    // `copy`, its matrices repacked into the interleaved layout of its GEMM, in memory it
    // owns until it is destroyed; a device backend would copy each into its memory. The
    // bits do not depend on which. `name` names the matrix in errors.
    virtual Weight register_weight(const Weight& w, bool copy, const std::string& name) {
        (void)copy;
        (void)name;
        return w;
    }
    // The weight vectors the ops take as `const float*` (norm weights, biases, taps), and
    // the plain views an op reads at forward time (the token table), registered once at
    // load: a device backend copies them into its memory then, so that a step copies no
    // weights (a vector or view it was not told of is copied for the step that uses it). A
    // later registration at the same address replaces the copy. The CPU reads them in place.
    virtual void register_vector(const float* v, int64_t n, const std::string& name) {
        (void)v, (void)n, (void)name;
    }
    virtual void register_view(const Weight& w, const std::string& name) { (void)w, (void)name; }
    // The bytes register_weight(copy = true) allocates for such a matrix (0: it keeps the
    // view): what the loader plans with before it asks.
    virtual size_t weight_copy_bytes(quant::Type t, int64_t cols, int64_t rows,
                                     int64_t slices) const {
        (void)t, (void)cols, (void)rows, (void)slices;
        return 0;
    }

    // A read queued behind the ops issued so far: host_dst holds the values once sync()
    // has returned, and is not touched by the caller before (a device overlaps the copy
    // with the host's next work). The CPU backend's memory is the host's: it copies at once.
    virtual void read_async(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) {
        read_bytes(src, host_dst, bytes);
    }
    virtual void sync() {}
    template <class T>
    void read_later(DevPtr<T> src, std::remove_const_t<T>* host_dst, size_t n) {
        read_async(src.template as<const uint8_t>(), host_dst, n * sizeof(T));
    }

    // `why` names the copy ("snapshot", "restore", "grow") for the profile
    // and BackendOptions::fault_hook.
    virtual void copy_cache(DevPtr<uint8_t> dst, DevPtr<const uint8_t> src, size_t bytes,
                            const char* why = "copy_cache") = 0;

    // ---- steps -----------------------------------------------------------
    // A forward is a step: begin_step() opens it, plan() writes the step's index arrays
    // (the batch's token ids, positions and the rows that want logits) into backend
    // memory in one copy, and the ops take handles into them; end_step() closes it.
    // (A device copies the plan once per step instead of once per op.)
    struct PlanArrays {
        std::span<const int32_t> tokens, pos, out_rows;
    };
    struct PlanHandles {
        DevPtr<const int32_t> tokens, pos, out_rows;
    };
    virtual void begin_step() {}
    // Scratch memory: valid until reset_scratch().
    PlanHandles plan(const PlanArrays& a) {
        const size_t n = a.tokens.size() + a.pos.size() + a.out_rows.size();
        const DevPtr<int32_t> d = scratch_ids(std::max<size_t>(n, 1));
        std::vector<int32_t> all;
        all.reserve(n);
        all.insert(all.end(), a.tokens.begin(), a.tokens.end());
        all.insert(all.end(), a.pos.begin(), a.pos.end());
        all.insert(all.end(), a.out_rows.begin(), a.out_rows.end());
        write(d, all.data(), all.size());
        PlanHandles h;
        h.tokens = d;
        h.pos = d + int64_t(a.tokens.size());
        h.out_rows = d + int64_t(a.tokens.size() + a.pos.size());
        planned(a, h);
        return h;
    }
    virtual void end_step() {}
    // The plan just written, as the host had it: a device backend keeps the positions to
    // size its launches (how many cache rows a row of the step can see) without reading
    // them back; the ops still read the values through the handles.
    virtual void planned(const PlanArrays& a, const PlanHandles& h) {
        (void)a;
        (void)h;
    }
    // A step held open for a scope: end() closes it where the forward's work ends; an
    // exception that leaves the scope closes it too.
    class Step {
      public:
        explicit Step(Backend& be) : be_(&be) { be.begin_step(); }
        ~Step() { end(); }
        Step(const Step&) = delete;
        Step& operator=(const Step&) = delete;
        void end() {
            if (be_) std::exchange(be_, nullptr)->end_step();
        }

      private:
        Backend* be_;
    };

    // ---- elementwise and norms -----------------------------------------
    // out[t] = table row ids[t] (dequantized), t < n.
    virtual void embed(const Weight& table, DevPtr<const int32_t> ids, int64_t n,
                       DevPtr<float> out) = 0;
    // y = x / sqrt(mean(x^2) + eps) (* w when w != null), per row of `dim`.
    virtual void rms_norm(DevPtr<const float> x, int64_t x_stride, const float* w, int64_t n_rows,
                          int64_t dim, float eps, DevPtr<float> y, int64_t y_stride) = 0;
    // y = (x - mean) / sqrt(var + eps) * w + b, per row.
    virtual void layer_norm(DevPtr<const float> x, const float* w, const float* b, int64_t n_rows,
                            int64_t dim, float eps, DevPtr<float> y) = 0;
    // x[t][h*head_stride + 0..n_rot) rotated in place, GGML "normal" mode
    // (adjacent pairs), angle pos[t] * freq_base^(-2i/n_rot).
    virtual void rope(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                      int64_t head_stride, int64_t n_rot, DevPtr<const int32_t> pos,
                      float freq_base) = 0;
    // Normalised Walsh-Hadamard transform of n_vec vectors of `dim` (power of two), in place.
    virtual void hadamard(DevPtr<float> x, int64_t n_vec, int64_t dim) = 0;
    // dst[i][0..n_cols) = src[rows ? rows[i] : i][0..n_cols) for i < n_rows.
    virtual void copy_rows(DevPtr<const float> src, int64_t src_stride, DevPtr<const int32_t> rows,
                           int64_t n_rows, int64_t n_cols, DevPtr<float> dst,
                           int64_t dst_stride) = 0;
    // y += x (n values)
    virtual void add(DevPtr<float> y, DevPtr<const float> x, int64_t n) = 0;
    // y *= s
    virtual void scale(DevPtr<float> y, float s, int64_t n) = 0;
    // out = silu(g) * u with optional clamp (limit > 1e-6: u clamped to
    // [-limit, limit], g to at most limit); rows of n with strides.
    virtual void swiglu(DevPtr<const float> g, DevPtr<const float> u, int64_t n_rows, int64_t n,
                        int64_t in_stride, float clamp, DevPtr<float> out) = 0;

    // ---- matrix products -------------------------------------------------
    // y[t][0..rows) = W . x[t] for t < n_tok. The input is rounded to the
    // weight's activation format first (Q8_0 / Q8_K / F16...), as llama.cpp does.
    virtual void matmul(const Weight& w, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                        DevPtr<float> y, int64_t y_stride) = 0;
    // Several weights against the same input, as one op: for every j,
    // outs[j].y[t*outs[j].y_stride ..] = outs[j].w . x[t], with the results of
    // separate matmul calls, bit for bit. The input is rounded once per
    // activation format and the rows of all the weights share one parallel
    // pass (decode's projections of one normalised row are too small to be
    // worth an op each).
    struct MatmulOut {
        const Weight* w;
        DevPtr<float> y;
        int64_t y_stride;
    };
    virtual void matmuls(std::span<const MatmulOut> outs, DevPtr<const float> x, int64_t x_stride,
                         int64_t n_tok) = 0;
    // Per-slice products: for every slice s and token t,
    // y[t*y_tok + s*y_slice .. +rows) = W[s] . x[t*x_tok + s*x_slice .. +cols).
    virtual void matmul_slices(const Weight& w, DevPtr<const float> x, int64_t x_tok,
                               int64_t x_slice, int64_t n_tok, DevPtr<float> y, int64_t y_tok,
                               int64_t y_slice) = 0;

    // ---- caches and attention --------------------------------------------
    // Store n_tok rows (each `width` floats, x_stride apart) at cache rows pos[t].
    // The storage to allocate for indexer key caches where the model would
    // use `requested` (same bytes per value): the CPU backend under
    // --attn-bf16 keeps F16 keys as BF16, which its tile product reads in place.
    virtual CacheType indexer_key_type(CacheType requested) const { return requested; }

    virtual void cache_store(const CacheRows& cache, DevPtr<const float> x, int64_t x_stride,
                             int64_t n_tok, DevPtr<const int32_t> pos) = 0;

    // A step's rows come in segments, one per sequence: batch rows [first, first + n),
    // with that sequence's cache for the op's layer. What a row sees follows from its
    // position in the step's plan alone (causal: n_vis = pos[t] + 1 cells), so the op
    // list of one shape of step is the same whatever the positions: the ops decide per
    // row, on the backend, what is dense and what is selected.
    struct Segment {
        CacheRows cache;
        int64_t first = 0, n = 0;
    };
    // A sparse selection. A row with more than `keep` candidates (cells, or complete
    // pools of `pool` cells: n_vis / pool of them) sees the keep * pool + n_vis % pool
    // cells listed at rows[t * stride ..]; a row with fewer sees all of its n_vis cells.
    // A null `rows`: every row sees all of them.
    struct Selection {
        DevPtr<const int32_t> rows;
        int64_t stride = 0;
        int64_t keep = 0;
        int64_t pool = 1;
        // The rule every op of a step applies to a row that sees n_vis cells: whether
        // it has more candidates than are kept, and then how many cells it sees (on a
        // device's kernels too: host-and-device code).
        static GLM5_HD bool selects(int64_t n_vis, int64_t pool, int64_t keep) {
            return n_vis / pool > keep;
        }
        bool selects(int64_t n_vis) const { return rows && selects(n_vis, pool, keep); }
        int64_t n_selected(int64_t n_vis) const { return keep * pool + n_vis % pool; }
    };

    // Lightning-indexer selection: for each of the segments' rows t with more than top_k
    // candidates (n_vis / pool: tokens when pool is 1, complete pools otherwise),
    // score(s) = sum_h w[t][h] * relu(q[t][h] . key_s) over its candidates (rows of its
    // segment's cache); the indices of the top_k highest scores (ties to the lower index),
    // ascending, to out[t * top_k ..]. Other rows are left alone. q: [T][n_heads][dim]
    // (rounded to the cache type like the keys), w: [T][n_heads].
    virtual void indexer_select(DevPtr<const float> q, DevPtr<const float> w,
                                DevPtr<const int32_t> pos, std::span<const Segment> keys,
                                int64_t pool, int64_t n_heads, int64_t dim, int64_t top_k,
                                DevPtr<int32_t> out) = 0;

    // MLA (absorbed, MQA over latent rows) for the segments' rows. For each row t and
    // head h: s_j = scale * q[t][h] . row_j over the cache rows `sel` lets t see
    // (rows are [latent | rope], width = q width), p = softmax(s),
    // out[t][h] = sum_j p_j * row_j[0..v_width). q: [T][n_heads][width],
    // out: [T][n_heads][v_width]. With an F16 cache the query and the probabilities are
    // rounded to F16, as llama.cpp's F16 path does.
    virtual void mla_attention(DevPtr<const float> q, DevPtr<const int32_t> pos,
                               std::span<const Segment> segs, const Selection& sel, int64_t n_heads,
                               int64_t v_width, float scale, DevPtr<float> out) = 0;

    // For each of n_rows rows of logits [n_rows][n_vocab]: the greedy pick (ties to the
    // lowest id) and its probability among the ten most likely tokens (the softmax over
    // them, in double): a drafter's pick and confidence, as llama.cpp's top-k 10 draft
    // sampler. Only these come back to the host, not the logits.
    virtual void draft_pick(DevPtr<const float> logits, int64_t n_rows, int64_t n_vocab,
                            DevPtr<int32_t> best, DevPtr<double> prob) = 0;

    // ---- mixture of experts ------------------------------------------------
    // Three ops, so that routing and the shared expert can run on one backend and a
    // layer's routed experts on another. x: [n_tok][E] (the normed FFN input).
    //
    // The routing: ids and weights [n_tok][n_used] in backend memory (they never
    // visit the host).
    virtual void moe_route(const MoeRouter& r, DevPtr<const float> x, int64_t n_tok,
                           DevPtr<int32_t> ids, DevPtr<float> weights) = 0;
    // out [n_tok][E] (overwritten) = the routed experts' outputs summed in selection
    // order with their weights, then the shared expert's added: computed here within
    // the same passes when `fused_shared` is given (one backend holds both), else the
    // rows `shared_rows` that moe_shared wrote (elsewhere, maybe), or none when both
    // are null.
    virtual void moe_experts(const MoeFfn& experts, DevPtr<const float> x, int64_t n_tok,
                             DevPtr<const int32_t> ids, DevPtr<const float> weights, int n_used,
                             const MoeFfn* fused_shared, DevPtr<const float> shared_rows,
                             DevPtr<float> out) = 0;
    // The shared expert alone: out [n_tok][E] (overwritten), the rows moe_experts' fused
    // form adds, bit for bit.
    virtual void moe_shared(const MoeFfn& shared, DevPtr<const float> x, int64_t n_tok,
                            DevPtr<float> out) = 0;
    // All of it on this backend, the shared expert fused (ids and weights in scratch).
    void moe(const MoeWeights& m, DevPtr<const float> x, int64_t n_tok, DevPtr<float> out) {
        const size_t n = size_t(n_tok) * size_t(m.route.n_used);
        const DevPtr<int32_t> ids = scratch_ids(n);
        const DevPtr<float> weights = scratch(n);
        moe_route(m.route, x, n_tok, ids, weights);
        moe_experts(m.experts, x, n_tok, ids, weights, m.route.n_used,
                    m.shared ? &m.shared : nullptr, nullptr, out);
    }

    // ---- accounting --------------------------------------------------------
    virtual Counters counters() const = 0;
    virtual void reset_counters() = 0;

    // ==== glm5next ops ==========================================================
    // Linear attention with a recurrent state (short causal conv + gated delta
    // rule), multi-stream hyper-connections and pooled key compression. Each op
    // keeps a fixed per-element reduction order, so a token's result does not
    // depend on how the tokens were batched.

    // L2 normalisation per row: y = x / max(||x||_2, eps); in place allowed.
    virtual void l2_norm(DevPtr<const float> x, int64_t n_rows, int64_t dim, float eps,
                         DevPtr<float> y) = 0;
    // y = sigmoid(y), n values in place.
    virtual void apply_sigmoid(DevPtr<float> y, int64_t n) = 0;
    // y *= sigmoid(gate), n values.
    virtual void mul_sigmoid(DevPtr<float> y, DevPtr<const float> gate, int64_t n) = 0;

    // Depthwise causal convolution of one sequence's new tokens, continuing
    // from the K-1 inputs before them:
    //   y[t][c] = sum_{j<K} taps[c*K + j] * in[t-K+1+j][c]   (j = K-1: token t)
    // where inputs before the first new token come from `tail` ([K-1][channels],
    // oldest first). Afterwards `tail` holds the last K-1 inputs. With
    // `silu`, y = SiLU(conv). x and y must not overlap.
    struct ConvSeq {
        DevPtr<const float> x;  // [n_tok][x_stride]
        DevPtr<float> tail;     // [K-1][channels]: the new tail (the old one too when in place)
        DevPtr<float> y;        // [n_tok][y_stride]
        int64_t n_tok = 0;
        // The old tail, when it lives elsewhere (double-buffered state: a
        // forward that fails leaves it untouched); null: `tail` in place.
        DevPtr<const float> tail_in;
    };
    virtual void causal_conv(std::span<const ConvSeq> seqs, int64_t channels, const float* taps,
                             int64_t kernel, int64_t x_stride, int64_t y_stride, bool silu) = 0;

    // Per-channel log-decay bounded to (lower, 0):
    //   g[t][h*dim + i] = lower * sigmoid(rate[h] * (z[t][h*dim + i] + bias[h*dim + i])).
    virtual void bounded_decay(DevPtr<const float> z, const float* bias, const float* rate,
                               int64_t n_tok, int64_t n_heads, int64_t dim, float lower,
                               DevPtr<float> g) = 0;

    // Gated delta rule, token by token in order, per head h with state
    // S [dim(key i)][dim(value j)]:
    //   S <- diag(exp(g_t)) S;  e = v_t - S^T k_t;  S <- S + k_t (beta_t e)^T;
    //   out_t = scale * S^T q_t.
    // q, k, v, g, out: [n_tok][n_heads*dim]; beta: [n_tok][n_heads];
    // state: [n_heads][dim][dim], updated in place, or read from state_in and
    // written to state (double-buffered state; same bits either way).
    struct DeltaRuleSeq {
        DevPtr<const float> q, k, v, g, beta;
        DevPtr<float> state;
        DevPtr<float> out;
        int64_t n_tok = 0;
        DevPtr<const float> state_in;
    };
    virtual void gated_delta_rule(std::span<const DeltaRuleSeq> seqs, int64_t n_heads, int64_t dim,
                                  float scale) = 0;

    // Sinkhorn hyper-connection coefficients for S streams from the mixing
    // logits mix [n_tok][(2+S)*S] (fn . RMSNorm(streams)):
    //   pre[s]  = sigmoid(scale[0]*mix[s] + base[s]) + eps
    //   post[d] = 2 sigmoid(scale[1]*mix[S+d] + base[S+d])
    //   comb[d][s]: softmax over d of scale[2]*mix[2S+d+S*s] + base[..], + eps,
    //   then rows (over s) normalised, then iterations-1 times columns (over d)
    //   and rows; every normalisation divides by (sum + eps).
    // pre, post: [n_tok][S]; comb: [n_tok][S (destination)][S (source)].
    virtual void hc_coefficients(DevPtr<const float> mix, int64_t n_tok, int64_t n_streams,
                                 const float* base, const float* scale, float eps,
                                 int64_t iterations, DevPtr<float> pre, DevPtr<float> post,
                                 DevPtr<float> comb) = 0;
    // y[t] = sum_s w[t][s] * X[t][s] (w == nullptr: the plain mean over streams).
    // X: [n_tok][n_streams][dim]; y: [n_tok][dim].
    virtual void hc_reduce(DevPtr<const float> X, DevPtr<const float> w, int64_t n_tok,
                           int64_t n_streams, int64_t dim, DevPtr<float> y) = 0;
    // out[t][d] = post[t][d] * f[t] + sum_s comb[t][d][s] * X[t][s] (out != X).
    virtual void hc_expand(DevPtr<const float> X, DevPtr<const float> f, DevPtr<const float> post,
                           DevPtr<const float> comb, int64_t n_tok, int64_t n_streams, int64_t dim,
                           DevPtr<float> out) = 0;

    // Compressed keys of complete pools of `pool_size` consecutive cache rows.
    // Row r of `cells` is [key (key_width) | gate (gate_width: key_width or 1)].
    // For pool j (rows j*B .. j*B+B-1), per channel i:
    //   a_s = softmax over slots s of (gate[jB+s][i] + ape[s*gate_width + i])
    //   out_j = RMSNorm(sum_s a_s * key[jB+s]; norm_w)
    // (a width-1 gate gives one weight per slot for every channel), stored as
    // row j of `pools` for the pools that n_rows new cells at positions pos[0 ..]
    // (one sequence's, in order: the step's plan) complete.
    virtual void pool_compress(const CacheRows& cells, int64_t key_width, int64_t gate_width,
                               int64_t pool_size, const float* ape, const float* norm_w, float eps,
                               const CacheRows& pools, DevPtr<const int32_t> pos,
                               int64_t n_rows) = 0;
    // The cells a pooled selection lets each of n_rows rows see, for the rows past
    // the dense limit (n_vis / pool_size > n_sel, n_vis = pos[t] + 1): its n_sel picked
    // pools (picked[t * n_sel ..], ascending: indexer_select's output) expanded to their
    // cells j*B .. j*B+B-1, then the cells of its trailing partial pool
    // [(n_vis / B) * B, n_vis), to rows[t * stride ..] (n_sel*B + n_vis % B indices).
    virtual void pool_cells(DevPtr<const int32_t> picked, DevPtr<const int32_t> pos, int64_t n_rows,
                            int64_t n_sel, int64_t pool_size, DevPtr<int32_t> rows,
                            int64_t stride) = 0;
    // ==== end of glm5next ops ===================================================

    // ==== vision tower ops (docs/glm5next-format.md section 12.4) ================
    // y[r][i] += b[i] for r < n_rows, i < dim (rows `stride` apart).
    virtual void add_bias(DevPtr<float> y, int64_t n_rows, int64_t dim, int64_t stride,
                          const float* b) = 0;
    // y = 0.5 y (1 + erf(y / sqrt 2)), n values in place.
    virtual void gelu_erf(DevPtr<float> y, int64_t n) = 0;
    // 2-D rotary embedding, rotate-half pairing, per head of `dim` values
    // (dim a multiple of 4) at x[t*tok_stride + h*dim]: with
    // f_i = theta^(-4i/dim) for i < dim/4 and the angles
    // a = [row[t] f | col[t] f] (dim/2 values),
    //   out[i] = x[i] cos a_i - x[i + dim/2] sin a_i,
    //   out[i + dim/2] = x[i + dim/2] cos a_i + x[i] sin a_i   (i < dim/2).
    virtual void rope_2d(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                         int64_t dim, const int32_t* row, const int32_t* col, float theta) = 0;
    // Non-causal attention of every token of a sequence to every token of it
    // (an image's patches): out = softmax(scale q k^T) v per head. q, k, v and
    // out are [n][stride], head h at columns h*dim.. . Streamed in tiles with
    // a running softmax: memory is O(n), never the n x n scores.
    struct FullAttentionSeq {
        DevPtr<const float> q, k, v;
        DevPtr<float> out;
        int64_t n = 0;
    };
    virtual void attention_full(std::span<const FullAttentionSeq> seqs, int64_t n_heads,
                                int64_t dim, int64_t stride, float scale) = 0;
    // ==== end of vision tower ops ===============================================

  protected:
    Reducer* reducer() const { return reducer_; }
    // A handle of this backend's own, for memory at `p` (a backend's handles are the
    // addresses of its memory, in whatever space it addresses).
    template <class T>
    DevPtr<T> owned(T* p) const {
        return DevPtr<T>::from_handle(
            reinterpret_cast<DeviceMemory*>(const_cast<std::remove_const_t<T>*>(p)), id());
    }
    // Refuses a handle that backend `owner` made.
    [[noreturn]] void foreign(uint32_t owner) const;

  private:
    Reducer* reducer_ = nullptr;
    uint32_t id_;
};

struct BackendOptions {
    int n_threads = 0;  // 0: all cores we may run on
    // Pin each worker thread to a CPU of its own (--cpu-strict): -1 where the threads
    // fill the physical cores, 0 never, 1 always.
    int pin_threads = -1;
    // mla_attention's and indexer_select's products in BF16 on AMX tiles
    // (--attn-bf16): several times faster deep in a context, but the scores
    // lose the last bits of F16/F32 products, so logits differ slightly from
    // the exact path's (and a near-tie at the indexer's k-th key may pick
    // another key).
    // Refused (make_cpu_backend throws) where the CPU has no AMX-BF16.
    bool attention_bf16 = false;
    // Fault injection for tests: called before each op with its name and
    // rows; an exception it throws fails the op as an allocation would.
    std::function<void(const char* op, int64_t rows)> fault_hook;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt);

}  // namespace glm5::backend

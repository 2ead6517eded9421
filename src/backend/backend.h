// The core of the contract the model forwards are written in: memory, the step and its
// plan, copies, products, norms and the elementwise ops every model uses, and sampling
// helpers. What only some models need comes in op families, one interface each
// (moe_ops.h, attention_ops.h, linear_ops.h, vision_ops.h): a backend implements the
// core and the families it runs, a model asks for the families it needs when it loads
// (require<>, which refuses a backend that lacks one, naming it) and nothing else, and
// no backend stubs an op. Ops are coarse (a whole matmul over a batch, a whole MLA
// attention, a whole MoE FFN) and generic over shapes: they know formats and sizes,
// never model names.
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

#include "core/error.h"
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
    // A device's traffic with its host: kernels launched, waits for the device to finish
    // (the host blocked), copies from host to device and from device to host (0 on the CPU).
    // What a step costs beyond its kernels' work, and what keeps it from being one graph.
    uint64_t launches = 0, host_syncs = 0, uploads = 0, downloads = 0;
    // Steps a device launched as one graph, and the graphs it captured for them (a step
    // replays the graph of an earlier step with the same work).
    uint64_t graphs = 0, captures = 0;
    // Two backends' reads together (a device and the CPU beside it).
    Counters& operator+=(const Counters& o) {
        launches += o.launches;
        graphs += o.graphs;
        captures += o.captures;
        host_syncs += o.host_syncs;
        uploads += o.uploads;
        downloads += o.downloads;
        weight_bytes += o.weight_bytes;
        matmul_calls += o.matmul_calls;
        cache_bytes += o.cache_bytes;
        parallel_ops += o.parallel_ops;
        rendezvous += o.rendezvous;
        scratch_peak = std::max(scratch_peak, o.scratch_peak);
        return *this;
    }
};

// Sees the float input of the products before it is rounded to a weight's activation format:
// what an importance matrix is made of (quantize/imatrix.h). Called on the thread that
// issued the op; the rows are host memory, valid for the call.
class ProductObserver {
  public:
    virtual ~ProductObserver() = default;
    // n_rows rows of input (row r at x + r * stride) multiplied by the matrix registered as
    // `name`; for a stack of per-head matrices (w.slices > 1), slice s reads the rows at
    // x + s * slice_stride.
    virtual void dense(const std::string& name, const Weight& w, const float* x, int64_t stride,
                       int64_t slice_stride, int64_t n_rows) = 0;
    // n_rows rows routed to expert `slice` of the stack registered as `name`.
    virtual void routed(const std::string& name, const Weight& w, int64_t slice, const float* x,
                        int64_t stride, int64_t n_rows) = 0;
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
    // A residual add and the next norm: x += d (n_rows rows of dim, packed), then y =
    // rms_norm(x) (packed rows). The bits of add and rms_norm; a device does both in one
    // launch.
    virtual void add_rms_norm(DevPtr<float> x, DevPtr<const float> d, const float* w,
                              int64_t n_rows, int64_t dim, float eps, DevPtr<float> y) {
        add(x, d, n_rows * dim);
        rms_norm(x, dim, w, n_rows, dim, eps, y, dim);
    }
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

    // ---- caches and sampling helpers ------------------------------------------
    // Store n_tok rows (each `width` floats, x_stride apart) at cache rows pos[t].
    virtual void cache_store(const CacheRows& cache, DevPtr<const float> x, int64_t x_stride,
                             int64_t n_tok, DevPtr<const int32_t> pos) = 0;

    // For each of n_rows rows of logits [n_rows][n_vocab]: the greedy pick (ties to the
    // lowest id) and its probability among the ten most likely tokens (the softmax over
    // them, in double): a drafter's pick and confidence, as llama.cpp's top-k 10 draft
    // sampler. Only these come back to the host, not the logits.
    virtual void draft_pick(DevPtr<const float> logits, int64_t n_rows, int64_t n_vocab,
                            DevPtr<int32_t> best, DevPtr<double> prob) = 0;

    // Reports every product's input to `o` from now on (null: stop). Only a backend whose
    // activations are host memory does; the others refuse, naming themselves.
    virtual void set_product_observer(ProductObserver* o) {
        if (o) throw Error("the " + name() + " backend does not report product inputs");
    }

    // ---- accounting --------------------------------------------------------
    virtual Counters counters() const = 0;
    virtual void reset_counters() = 0;
    // Called before each op with its name and rows (fault injection in the tests of what
    // the engine does when an op fails): an exception it throws fails the op as an
    // allocation would.
    void set_op_hook(std::function<void(const char* op, int64_t rows)> hook) {
        op_hook_ = std::move(hook);
    }

  protected:
    Reducer* reducer() const { return reducer_; }
    void op_hook(const char* op, int64_t rows) const {
        if (op_hook_) op_hook_(op, rows);
    }
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
    std::function<void(const char*, int64_t)> op_hook_;
};

// The op family F of backend `be` (moe_ops.h, attention_ops.h, linear_ops.h,
// vision_ops.h), or null where it does not implement F.
template <class F>
F* family(Backend& be) {
    return dynamic_cast<F*>(&be);
}
// The same for a model or tower that cannot run without it (`who` names it): refused at
// load, naming the family and the backend.
template <class F>
F& require(Backend& be, const std::string& who) {
    if (F* f = family<F>(be)) return *f;
    throw Error(who + " needs " + F::kWhat + ", which the " + be.name() + " backend does not run");
}

}  // namespace glm5::backend

// The CPU backend: every op parallelised on one persistent thread pool. Each
// output element is computed by exactly one thread with a fixed reduction
// order, so results never depend on the thread count or on how many tokens
// or sequences share a batch. The class lives in cpu_backend.h.
#include "backend/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace glm5::backend {

const char* cache_type_name(CacheType t) {
    return t == CacheType::F16 ? "f16" : t == CacheType::BF16 ? "bf16" : "f32";
}
size_t cache_elem_size(CacheType t) {
    return t == CacheType::F32 ? 4 : 2;
}

Backend::Backend() {
    static std::atomic<uint32_t> next{1};
    id_ = next++;
}

void Backend::copy_from(Backend& src, DevPtr<const uint8_t> from, DevPtr<uint8_t> to,
                        size_t bytes) {
    std::vector<uint8_t> staged(bytes);
    src.read_bytes(from, staged.data(), bytes);
    write_bytes(to, staged.data(), bytes);
}

void Backend::foreign(uint32_t owner) const {
    throw Error("a handle of backend #" + std::to_string(owner) + " was passed to backend #" +
                std::to_string(id()) + " (" + name() +
                "): memory crosses between backends only by an explicit copy (copy_from)");
}

namespace cpu {

CpuBackend::CpuBackend(const CpuOptions& opt)
    : pool_(PoolOptions{opt.n_threads > 0 ? opt.n_threads : ThreadPool::default_threads(),
                        opt.pin_threads}) {
    per_thread_.resize(size_t(pool_.size()));
    profile_.fault_hook = [this](const char* op, int64_t rows) { op_hook(op, rows); };
    if (opt.attention_bf16 && !amx_bf16::available())
        throw Error(
            "BF16 attention needs AMX-BF16 tiles or AVX-512 BF16 with VBMI, which this CPU "
            "(or the GLM5_CPU level) does not have: run without --attn-bf16");
    attention_bf16_ = opt.attention_bf16;
}

DevPtr<float> CpuBackend::scratch(size_t n) {
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
    return owned(p);
}

void CpuBackend::reset_scratch() {
    for (auto& b : blocks_) b.used = 0;
    cur_ = 0;
}

DevPtr<uint8_t> CpuBackend::alloc_cache(size_t bytes) {
    if (bytes >= kMappedCache) {
        void* m =
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            throw ResourceError("out of memory mapping " + std::to_string(bytes) +
                                " bytes of cache");
        // Decode deep in a context reads rows scattered over every layer's
        // cache: 2 MB pages spare it a page walk for most of them.
        ::madvise(m, bytes, MADV_HUGEPAGE);
        std::lock_guard<std::mutex> lk(mapped_mu_);
        mapped_[static_cast<uint8_t*>(m)] = bytes;
        return owned(static_cast<uint8_t*>(m));
    }
    auto* p = static_cast<uint8_t*>(aligned_malloc(std::max<size_t>(bytes, 1)));
    std::memset(p, 0, bytes);
    return owned(p);
}

void CpuBackend::free_cache(DevPtr<uint8_t> p_) {
    uint8_t* p = host(p_);
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

void CpuBackend::copy_cache(DevPtr<uint8_t> dst_, DevPtr<const uint8_t> src_, size_t bytes,
                            const char* why) {
    uint8_t* dst = host(dst_);
    const uint8_t* src = host(src_);
    OpTimer timer_(profile_, why, int64_t(bytes));
    // A sequence's caches (a shared prefix copied, a resize) are tens to hundreds of MB:
    // one thread's copy would be most of what a request that reuses them waits for.
    constexpr size_t kPiece = size_t(1) << 20;
    if (bytes < 4 * kPiece) {
        std::memcpy(dst, src, bytes);
        return;
    }
    const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
    pool_.parallel_for(pieces, 1, [&](int64_t b, int64_t e, int) {
        const size_t from = size_t(b) * kPiece, to = std::min(bytes, size_t(e) * kPiece);
        std::memcpy(dst + from, src + from, to - from);
    });
}

void CpuBackend::reduce_sum(DevPtr<float> x, int64_t n) {
    if (reducer()) reducer()->sum(host(x), n);
}

void CpuBackend::receive_rows(RowChannel& from, DevPtr<float> x, size_t n) {
    from.receive(host(x), n);
}

void CpuBackend::send_rows(RowChannel& to, DevPtr<const float> x, size_t n) {
    to.send(host(x), n);
}

void CpuBackend::embed(const Weight& table, DevPtr<const int32_t> ids_, int64_t n,
                       DevPtr<float> out_) {
    const int32_t* ids = host(ids_);
    float* out = host(out_);
    OpTimer timer_(profile_, "embed", n);
    if (table.repacked) throw Error("embed: a repacked table has no plain rows");
    const int64_t E = table.cols;
    pool_.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t)
            quant::dequantize_row(table.type, table.row(ids[t]), out + t * E, E);
    });
}

void CpuBackend::rms_norm(DevPtr<const float> x_, int64_t xs, const float* w, int64_t n_rows,
                          int64_t dim, float eps, DevPtr<float> y_, int64_t ys) {
    const float* x = host(x_);
    float* y = host(y_);
    OpTimer timer_(profile_, "rms_norm", n_rows);
    pool_.parallel_for(n_rows, 8, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) simd().rms_norm(x + r * xs, w, dim, eps, y + r * ys);
    });
}

void CpuBackend::layer_norm(DevPtr<const float> x_, const float* w, const float* bias,
                            int64_t n_rows, int64_t dim, float eps, DevPtr<float> y_) {
    const float* x = host(x_);
    float* y = host(y_);
    OpTimer timer_(profile_, "layer_norm", n_rows);
    pool_.parallel_for(n_rows, 8, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r)
            kernels::layer_norm_row(x + r * dim, w, bias, dim, eps, y + r * dim);
    });
}

void CpuBackend::rope(DevPtr<float> x_, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                      int64_t head_stride, int64_t n_rot, DevPtr<const int32_t> pos_,
                      float freq_base) {
    float* x = host(x_);
    const int32_t* pos = host(pos_);
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

void CpuBackend::hadamard(DevPtr<float> x_, int64_t n_vec, int64_t dim) {
    float* x = host(x_);
    OpTimer timer_(profile_, "hadamard", n_vec);
    pool_.parallel_for(n_vec, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t v = b; v < e; ++v) kernels::hadamard_row(x + v * dim, dim);
    });
}

void CpuBackend::copy_rows(DevPtr<const float> src_, int64_t ss, DevPtr<const int32_t> rows_,
                           int64_t n_rows, int64_t n_cols, DevPtr<float> dst_, int64_t ds) {
    const int32_t* rows = host(rows_);
    const float* src = host(src_);
    float* dst = host(dst_);
    for (int64_t i = 0; i < n_rows; ++i)
        std::memcpy(dst + i * ds, src + (rows ? rows[i] : i) * ss, size_t(n_cols) * sizeof(float));
}

void CpuBackend::draft_pick(DevPtr<const float> logits_, int64_t n_rows, int64_t V,
                            DevPtr<int32_t> best_, DevPtr<double> prob_) {
    const float* logits = host(logits_);
    int32_t* best_out = host(best_);
    double* prob = host(prob_);
    OpTimer timer_(profile_, "draft_pick", n_rows);
    for (int64_t i = 0; i < n_rows; ++i) {
        const float* l = logits + i * V;
        std::vector<std::pair<float, int32_t>> top;
        for (int32_t v = 0; v < V; ++v) {
            if (top.size() < 10) {
                top.push_back({l[v], v});
                std::push_heap(top.begin(), top.end(), std::greater<>());
            } else if (l[v] > top.front().first) {
                std::pop_heap(top.begin(), top.end(), std::greater<>());
                top.back() = {l[v], v};
                std::push_heap(top.begin(), top.end(), std::greater<>());
            }
        }
        int32_t best = top[0].second;
        float lmax = top[0].first;
        for (const auto& [val, id] : top)
            if (val > lmax || (val == lmax && id < best)) lmax = val, best = id;
        double z = 0;
        for (const auto& t : top) z += std::exp(double(t.first) - double(lmax));
        best_out[i] = best;
        prob[i] = 1.0 / z;
    }
}

void CpuBackend::scale(DevPtr<float> y_, float s, int64_t n) {
    float* y = host(y_);
    for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void CpuBackend::swiglu(DevPtr<const float> g_, DevPtr<const float> u_, int64_t n_rows, int64_t n,
                        int64_t in_stride, float clamp, DevPtr<float> out_) {
    const float* g = host(g_);
    const float* u = host(u_);
    float* out = host(out_);
    OpTimer timer_(profile_, "swiglu", n_rows);
    pool_.parallel_for(n_rows, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r)
            simd().swiglu(n, g + r * in_stride, u + r * in_stride, clamp, out + r * n);
    });
}

void CpuBackend::matmul(const Weight& w, DevPtr<const float> x_, int64_t xs, int64_t n_tok,
                        DevPtr<float> y_, int64_t ys) {
    const float* x = host(x_);
    float* y = host(y_);
    OpTimer timer_(profile_, "matmul", n_tok, quant::name(w.type));
    observe(w, x, xs, 0, n_tok);
    products(w, 1, x, xs, 0, n_tok, y, ys, 0);
}

void CpuBackend::matmuls(std::span<const MatmulOut> outs, DevPtr<const float> x_, int64_t xs,
                         int64_t n_tok) {
    const float* x = host(x_);
    OpTimer timer_(profile_, "matmuls", n_tok);
    if (n_tok <= 0 || outs.empty()) return;
    for (const MatmulOut& o : outs) observe(*o.w, x, xs, 0, n_tok);
    // One quantized copy of x per activation format (outs share few).
    struct Act {
        quant::Type type;
        const uint8_t* data;
        size_t arow;
        bool expanded;
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
            bool expanded = false;
            const uint8_t* d =
                quantize_acts(multi_act_[a], w.type, w.cols, 1, x, xs, 0, n_tok, arow, &expanded);
            acts.push_back({at, d, arow, expanded});
        }
        act_of[j] = a;
    }
    for_weight_rows(
        outs.size(), [&](size_t j) -> const Weight& { return *outs[j].w; },
        [&](size_t j, int64_t r0, int64_t r1) {
            const Act& a = acts[act_of[j]];
            product_rows(*outs[j].w, 0, r0, r1, a.data, a.arow, n_tok, host(outs[j].y),
                         outs[j].y_stride, a.expanded);
        });
    for (const MatmulOut& o : outs) weight_bytes_ += o.w->payload_bytes();
    matmul_calls_ += outs.size();
}

void CpuBackend::matmul_slices(const Weight& w, DevPtr<const float> x_, int64_t x_tok,
                               int64_t x_slice, int64_t n_tok, DevPtr<float> y_, int64_t y_tok,
                               int64_t y_slice) {
    const float* x = host(x_);
    float* y = host(y_);
    OpTimer timer_(profile_, "matmul_slices", n_tok, quant::name(w.type));
    observe(w, x, x_tok, x_slice, n_tok);
    products(w, w.slices, x, x_tok, x_slice, n_tok, y, y_tok, y_slice);
}

const uint8_t* CpuBackend::quantize_acts(ByteBuffer& buf, quant::Type type, int64_t cols, int64_t S,
                                         const float* x, int64_t x_tok, int64_t x_slice, int64_t n,
                                         size_t& arow, bool* expanded) {
    const quant::Type at = quant::traits(type).vec_dot_type;
    // BF16 activations read by every weight row are converted once, here.
    const bool expand = expanded && type == quant::Type::BF16 && quant::bf16_dot_multi_f32act_fn();
    if (expanded) *expanded = expand;
    arow = expand ? size_t(cols) * sizeof(float) : quant::row_size(at, cols);
    uint8_t* act = buf.get(arow * size_t(S * n));
    // At least 16K values per chunk: decode's few rows (16 heads of a
    // slice product, 8 experts' hidden rows) take about a microsecond,
    // less than handing them to the pool and waiting for it.
    const int64_t grain = std::max<int64_t>(4, (int64_t(1) << 14) / std::max<int64_t>(1, cols));
    pool_.parallel_for(S * n, grain, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
            const int64_t s = i / n, t = i % n;
            const float* xr = x + t * x_tok + s * x_slice;
            if (expand)
                quant::expand_bf16_activation(xr, reinterpret_cast<float*>(act + size_t(i) * arow),
                                              cols);
            else
                quant::quantize_activation_row(at, xr, act + size_t(i) * arow, cols);
        }
    });
    return act;
}

void CpuBackend::products(const Weight& w, int64_t S, const float* x, int64_t x_tok,
                          int64_t x_slice, int64_t n, float* y, int64_t y_tok, int64_t y_slice) {
    if (n <= 0) return;
    size_t arow = 0;
    bool expanded = false;
    const uint8_t* act =
        quantize_acts(act_buf_, w.type, w.cols, S, x, x_tok, x_slice, n, arow, &expanded);
    for_weight_rows(
        size_t(S), [&](size_t) -> const Weight& { return w; },
        [&](size_t s, int64_t r0, int64_t r1) {
            product_rows(w, int64_t(s), r0, r1, act + size_t(int64_t(s) * n) * arow, arow, n,
                         y + int64_t(s) * y_slice, y_tok, expanded);
        });
    weight_bytes_ += uint64_t(S) * w.payload_bytes();
    matmul_calls_ += 1;
}

void CpuBackend::product_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1,
                              const uint8_t* act, size_t arow, int64_t n, float* y, int64_t y_tok,
                              bool expanded) {
    if (w.repacked) {
        repacked_rows(w, s, r0, r1, act, arow, n, y, y_tok);
        return;
    }
    const quant::VecDotFn dot = quant::vec_dot_fn(w.type);
    // Expanded activations go through the kernel that reads floats, one token too.
    const quant::VecDotMultiFn multi =
        expanded ? quant::bf16_dot_multi_f32act_fn() : quant::vec_dot_multi_fn(w.type);
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
        const int64_t t1 = std::min(n, t0 + 8);
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* wr = w.row(r, s);
            const uint8_t* a0 = act + size_t(t0) * arow;
            if (multi && (expanded || t1 - t0 > 1)) {
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

void CpuBackend::repacked_rows(const Weight& w, int64_t s, int64_t r0, int64_t r1,
                               const uint8_t* act, size_t arow, int64_t n, float* y,
                               int64_t y_tok) {
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

OpProfile::~OpProfile() {
    if (!on_ || ops_.empty()) return;
    double total = 0;
    for (const auto& [k, v] : ops_) total += v.first;
    std::fprintf(stderr, "glm5 op profile (wall time inside each op, by rows per call):\n");
    for (const auto& [k, v] : ops_)
        std::fprintf(stderr, "  %-16s %6lld rows %9.3f s %5.1f%%  %10llu calls  %8.2f us/call\n",
                     k.first.c_str(), (long long)k.second, v.first, 100.0 * v.first / total,
                     (unsigned long long)v.second, 1e6 * v.first / double(v.second));
}

size_t CpuBackend::weight_copy_bytes(quant::Type t, int64_t cols, int64_t rows,
                                     int64_t slices) const {
    if (!quant::repack_supported(t, cols) || rows < quant::repack_rows(t)) return 0;
    return quant::repacked_bytes(t, cols, rows) * size_t(slices);
}

void CpuBackend::observe(const Weight& w, const float* x, int64_t stride, int64_t slice_stride,
                         int64_t n) const {
    if (!observer_ || n <= 0) return;
    const auto it = weight_names_.find(w.data);
    if (it != weight_names_.end()) observer_->dense(it->second, w, x, stride, slice_stride, n);
}

void CpuBackend::observe_routed(const Weight& w, int64_t slice, const float* x, int64_t stride,
                                int64_t n) const {
    if (!observer_ || n <= 0) return;
    const auto it = weight_names_.find(w.data);
    if (it != weight_names_.end()) observer_->routed(it->second, w, slice, x, stride, n);
}

Weight CpuBackend::register_weight(const Weight& w, bool copy, const std::string& name) {
    const size_t bytes = weight_copy_bytes(w.type, w.cols, w.rows, w.slices);
    if (!copy || bytes == 0 || w.repacked) {
        weight_names_[w.data] = name;
        return w;
    }
    // Every core repacks (one thread did about 0.4 GB/s); a plain stride between slices
    // (a stack whose slices are cut views is not one matrix) is read slice by slice.
    const size_t packed = bytes / size_t(w.slices);
    weight_copies_.emplace_back(bytes, "repacking " + name, [&](uint8_t* p) {
        if (w.slice_bytes == w.row_bytes * size_t(w.rows)) {
            quant::repack_slices(w.type, w.data, p, w.cols, w.rows, w.slices, pool_);
            return;
        }
        for (int64_t s = 0; s < w.slices; ++s)
            quant::repack_slices(w.type, w.data + size_t(s) * w.slice_bytes, p + size_t(s) * packed,
                                 w.cols, w.rows, 1, pool_);
    });
    Weight r = w;
    r.data = weight_copies_.back().data();
    r.slice_bytes = packed;
    r.repacked = true;
    weight_names_[r.data] = name;
    return r;
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opt) {
    return std::make_unique<cpu::CpuBackend>(opt);
}

}  // namespace glm5::backend

// The CUDA backend: memory, weights, and the elementwise ops, norms, RoPE and products.
// Each output is written by one thread, or by one block whose sums meet in a fixed tree,
// so a row's values do not depend on the rows beside it. Products and sums that the
// CPU's kernels round apart are rounded apart here too (__fmul_rn: never fused).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "core/format.h"

namespace glm5::backend::cuda {

namespace {

__global__ void embed_kernel(quant::Type type, const uint8_t* table, size_t row_bytes, int64_t cols,
                             const int32_t* ids, int64_t n, float* out, quant::groups::Tables tab) {
    const int64_t per_row = quant::groups::row_groups(cols);
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * per_row) return;
    const int64_t t = i / per_row, g = i % per_row;
    const int nv = quant::groups::group_values(cols, g);
    float v[quant::groups::kGroup];
    quant::groups::decode_group(type, table + size_t(ids[t]) * row_bytes, g, tab, v, nv);
    float* o = out + t * cols + g * quant::groups::kGroup;
    for (int j = 0; j < quant::groups::kGroup; ++j)
        if (j < nv) o[j] = v[j];
}

__global__ void rms_norm_kernel(const float* x, int64_t xs, const float* w, int64_t dim, float eps,
                                float* y, int64_t ys) {
    GLM5_SHARED(double, sh, kThreads);
    rms_norm_row(x + int64_t(blockIdx.x) * xs, w, dim, eps, y + int64_t(blockIdx.x) * ys, sh);
}

__global__ void add_rms_norm_kernel(float* x, const float* d, const float* w, int64_t dim,
                                    float eps, float* y) {
    GLM5_SHARED(double, sh, kThreads);
    float* xr = x + int64_t(blockIdx.x) * dim;
    const float* dr = d + int64_t(blockIdx.x) * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += dr[i];
    __syncthreads();
    rms_norm_row(xr, w, dim, eps, y + int64_t(blockIdx.x) * dim, sh);
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, int64_t dim,
                                  float eps, float* y) {
    GLM5_SHARED(double, sh, kThreads);
    layer_norm_row(x + int64_t(blockIdx.x) * dim, w, b, dim, eps, y + int64_t(blockIdx.x) * dim,
                   sh);
}

// One thread per (token, head, pair i).
__global__ void rope_kernel(float* x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                            int64_t head_stride, int64_t n_rot, const int32_t* pos,
                            float theta_scale) {
    const int64_t pairs = n_rot / 2;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tok * n_heads * pairs) return;
    const int64_t t = i / (n_heads * pairs), h = (i / pairs) % n_heads, k = i % pairs;
    rope_pair(x + t * tok_stride + h * head_stride, pos[t], k, theta_scale);
}

// One block per vector, in shared memory.
__global__ void hadamard_kernel(float* x, int64_t dim) {
    GLM5_DYNAMIC_SHARED(float, v);
    float* row = x + int64_t(blockIdx.x) * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = row[i];
    __syncthreads();
    hadamard_shared(v, dim, row);
}

__global__ void copy_rows_kernel(const float* src, int64_t ss, const int32_t* rows, int64_t n_rows,
                                 int64_t n_cols, float* dst, int64_t ds) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * n_cols) return;
    const int64_t r = i / n_cols, c = i % n_cols;
    dst[r * ds + c] = src[int64_t(rows ? rows[r] : r) * ss + c];
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void scale_kernel(float* y, float s, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmul_rn(y[i], s);
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t n_rows, int64_t n,
                              int64_t in_stride, float clamp, float* out) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_rows * n) return;
    const int64_t r = i / n, c = i % n;
    out[r * n + c] = swiglu_value(g[r * in_stride + c], u[r * in_stride + c], clamp);
}

__global__ void cache_store_kernel(uint8_t* cache, size_t row_bytes, int64_t width, bool f16,
                                   const float* x, int64_t xs, int64_t n_tok, const int32_t* pos) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tok * width) return;
    const int64_t t = i / width, c = i % width;
    store_value(cache + size_t(pos[t]) * row_bytes, c, x[t * xs + c], f16);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int ordinal) {
    return std::make_unique<CudaBackend>(ordinal);
}

CudaBackend::CudaBackend(int ordinal) : dev_(ordinal) {}

CudaBackend::~CudaBackend() {
    try {
        dev_.synchronize();
    } catch (const Error&) {
        // A failed device has said so already: free what can be freed.
    }
    dev_.bind();
    for (Block& b : blocks_) cudaFree(b.p);
    for (Matrix& m : weights_) cudaFree(const_cast<uint8_t*>(m.data));
    for (auto& [host, v] : views_) cudaFree(v.dev);
    for (auto& [host, d] : vecs_) cudaFree(d.first);
}

std::string CudaBackend::name() const {
    return "cuda:" + std::to_string(dev_.info().ordinal) + " (" + dev_.info().name + ")";
}

// ---- memory --------------------------------------------------------------

namespace {
constexpr size_t kAlign = 256;
constexpr size_t kFirstBlock = size_t(1) << 20;
}  // namespace

void* CudaBackend::scratch_bytes(size_t bytes) {
    const size_t asked = std::max<size_t>(bytes, 1);
    bytes = (asked + kAlign - 1) / kAlign * kAlign;
    while (cur_ < blocks_.size() && blocks_[cur_].used + bytes > blocks_[cur_].cap) ++cur_;
    if (cur_ == blocks_.size()) {
        // Each new block at least as large as those before it together: a step that
        // outgrows the arena asks for few blocks, and reset_scratch makes them one.
        size_t total = 0;
        for (const Block& b : blocks_) total += b.cap;
        Block b;
        b.cap = std::max({bytes, total, kFirstBlock});
        b.p = static_cast<uint8_t*>(dev_.alloc(b.cap, "scratch activations"));
        dev_.watch_scratch(b.p, b.cap, false);  // watched until carved
        blocks_.push_back(b);
    }
    Block& b = blocks_[cur_];
    void* p = b.p + b.used;
    b.used += bytes;
    size_t held = 0;
    for (const Block& x : blocks_) held += x.used;
    high_water_ = std::max(high_water_, held);
    most_held_ = std::max(most_held_, held);
    dev_.watch_scratch(p, asked, true);  // the rounding stays watched
    return p;
}

void CudaBackend::rewind(size_t block, size_t used) {
    for (size_t i = blocks_.size(); i-- > block;) {
        Block& b = blocks_[i];
        const size_t keep = i == block ? used : 0;
        if (b.used <= keep) continue;
        dev_.watch_scratch(b.p + keep, b.used - keep, false);
        b.used = keep;
    }
    cur_ = std::min(block, blocks_.size());
}

CudaBackend::Temporaries::Temporaries(CudaBackend& b)
    : b_(b), block_(b.cur_), used_(b.cur_ < b.blocks_.size() ? b.blocks_[b.cur_].used : 0) {}

CudaBackend::Temporaries::~Temporaries() {
    b_.rewind(block_, used_);
}

DevPtr<float> CudaBackend::scratch(size_t n_floats) {
    return owned(static_cast<float*>(scratch_bytes(n_floats * sizeof(float))));
}

void CudaBackend::reset_scratch() {
    rewind(0, 0);
    plan_pos_dev_ = nullptr;  // its memory is scratch
    if (blocks_.size() > 1) {
        // One block of what the steps so far have held at most: queued work may still read
        // the old ones (cudaFree waits for it).
        for (Block& b : blocks_) dev_.free(b.p);
        blocks_.clear();
        Block b;
        b.cap = (most_held_ + kAlign - 1) / kAlign * kAlign;
        b.p = static_cast<uint8_t*>(dev_.alloc(b.cap, "scratch activations"));
        dev_.watch_scratch(b.p, b.cap, false);
        blocks_.push_back(b);
    }
}

DevPtr<uint8_t> CudaBackend::alloc_cache(size_t bytes) {
    auto* p = static_cast<uint8_t*>(dev_.alloc(bytes, "a sequence's caches"));
    dev_.eager();  // the zeroing below is queued directly
    check(cudaMemsetAsync(p, 0, bytes, stream()), "zeroing a cache");
    return owned(p);
}

void CudaBackend::free_cache(DevPtr<uint8_t> p) {
    // Called from states' destructors: a device that has failed says so elsewhere, and
    // nothing is thrown from here.
    try {
        dev_.eager();  // recorded ops may read it
    } catch (const std::exception&) {
    }
    cudaStreamSynchronize(stream());  // queued ops may still read it (stream() binds)
    cudaFree(dev(p));
}

void CudaBackend::read_bytes(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) {
    dev_.download(host_dst, dev(src), bytes);
    dev_.synchronize();
}

void CudaBackend::write_bytes(DevPtr<uint8_t> dst, const void* host_src, size_t bytes) {
    // From pageable memory the copy has taken the host's bytes when the call returns.
    dev_.upload(dev(dst), host_src, bytes);
}

void CudaBackend::read_async(DevPtr<const uint8_t> src, void* host_dst, size_t bytes) {
    dev_.download(host_dst, dev(src), bytes);
}

void CudaBackend::sync() {
    dev_.synchronize();
}

void CudaBackend::begin_step() {
    if (steps_open_++ == 0) {
        exceptions_at_step_ = std::uncaught_exceptions();
        dev_.begin_graph();
    }
}

void CudaBackend::end_step() {
    if (steps_open_ <= 0 || --steps_open_ > 0) return;
    if (std::uncaught_exceptions() == exceptions_at_step_) return dev_.end_graph(true);
    // Left by an exception: what was recorded is queued as it would have been, and a second
    // failure is not thrown while the first unwinds.
    try {
        dev_.end_graph(false);
    } catch (const std::exception&) {
    }
}

void CudaBackend::copy_cache(DevPtr<uint8_t> dst, DevPtr<const uint8_t> src, size_t bytes,
                             const char* why) {
    op(why, int64_t(bytes));
    dev_.copy(dev(dst), dev(src), bytes);
}

void CudaBackend::planned(const PlanArrays& a, const PlanHandles& h) {
    plan_pos_.assign(a.pos.begin(), a.pos.end());
    plan_pos_dev_ = dev(h.pos);
}

const int32_t* CudaBackend::host_positions(DevPtr<const int32_t> pos, int64_t n) {
    // The plan's positions, or a part of them (a sequence's rows).
    const int32_t* d = dev(pos);
    if (plan_pos_dev_ && d >= plan_pos_dev_ && d + n <= plan_pos_dev_ + plan_pos_.size())
        return plan_pos_.data() + (d - plan_pos_dev_);
    pos_tmp_.resize(size_t(n));
    read(pos, pos_tmp_.data(), size_t(n));
    return pos_tmp_.data();
}

Weight CudaBackend::register_weight(const Weight& w, bool copy, const std::string& name) {
    (void)copy;  // a device always copies
    if (!w) return w;
    Matrix m = dev_.upload_matrix(w, name);
    weights_.push_back(m);
    registered_[uintptr_t(m.data)] = m.slice_bytes * size_t(m.slices);
    Weight d = w;
    d.data = m.data;
    d.row_bytes = m.row_bytes;
    d.slice_bytes = m.slice_bytes;
    d.repacked = false;
    return d;
}

void CudaBackend::register_view(const Weight& w, const std::string& name) {
    if (!w || w.repacked) return;
    // The view's bytes as they lie (its strides kept), so that a view cut from it later
    // is the same offset into the copy.
    const size_t bytes = size_t(w.slices - 1) * w.slice_bytes + size_t(w.rows - 1) * w.row_bytes +
                         quant::row_size(w.type, w.cols);
    const auto start = uintptr_t(w.data);
    auto it = views_.find(start);
    if (it != views_.end()) {
        dev_.free(it->second.dev);
        views_.erase(it);
    }
    auto* d = static_cast<uint8_t*>(dev_.alloc(bytes, name));
    dev_.eager();  // the copy below is queued directly
    check(cudaMemcpyAsync(d, w.data, bytes, cudaMemcpyHostToDevice, stream()), "upload");
    dev_.synchronize();
    views_[start] = ViewCopy{start + bytes, d};
}

void CudaBackend::register_vector(const float* v, int64_t n, const std::string& name) {
    if (!v || n <= 0) return;
    auto it = vecs_.find(v);
    if (it != vecs_.end()) {
        dev_.free(it->second.first);
        vecs_.erase(it);
    }
    auto* d = static_cast<float*>(dev_.alloc(size_t(n) * sizeof(float), name));
    dev_.upload(d, v, size_t(n) * sizeof(float));
    vecs_[v] = {d, n};
}

size_t CudaBackend::weight_copy_bytes(quant::Type t, int64_t cols, int64_t rows,
                                      int64_t slices) const {
    (void)t, (void)cols, (void)rows, (void)slices;
    return 0;  // device memory, not the host's
}

Matrix CudaBackend::matrix(const Weight& w, const char* op) {
    if (w.repacked || !quant::groups::has_groups(w.type))
        throw Error(std::string(op) + ": a " + quant::name(w.type) +
                    " matrix the GPU cannot multiply" + (w.repacked ? " (repacked)" : ""));
    Matrix m;
    m.type = w.type;
    m.cols = w.cols;
    m.rows = w.rows;
    m.slices = w.slices;
    m.row_bytes = w.row_bytes;
    m.slice_bytes = w.slice_bytes;
    m.data = w.data;
    const auto a = uintptr_t(w.data);
    // Inside a registered upload (a view cut from one too): device memory.
    auto it = registered_.upper_bound(a);
    if (it != registered_.begin()) {
        --it;
        if (a < it->first + it->second) return m;
    }
    // Inside a registered view of the host's, all of it: the same place in its copy.
    const uintptr_t extent = uintptr_t(w.slices - 1) * w.slice_bytes +
                             uintptr_t(w.rows - 1) * w.row_bytes + quant::row_size(w.type, w.cols);
    auto v = views_.upper_bound(a);
    if (v != views_.begin()) {
        --v;
        if (a + extent <= v->second.end) {
            m.data = v->second.dev + (a - v->first);
            return m;
        }
    }
    // A view nobody registered: copied for this step (packed rows).
    const size_t row = quant::row_size(w.type, w.cols);
    auto* d = static_cast<uint8_t*>(scratch_bytes(row * size_t(w.rows * w.slices)));
    dev_.eager();  // from pageable memory, queued directly
    for (int64_t s = 0; s < w.slices; ++s)
        check(cudaMemcpy2DAsync(d + size_t(s * w.rows) * row, row, w.row(0, s), w.row_bytes, row,
                                size_t(w.rows), cudaMemcpyHostToDevice, stream()),
              "upload");
    m.data = d;
    m.row_bytes = row;
    m.slice_bytes = row * size_t(w.rows);
    return m;
}

const float* CudaBackend::vec(const float* host, int64_t n) {
    if (!host) return nullptr;
    auto it = vecs_.find(host);
    if (it != vecs_.end() && it->second.second >= n) return it->second.first;
    auto* d = static_cast<float*>(scratch_bytes(size_t(n) * sizeof(float)));
    dev_.upload(d, host, size_t(n) * sizeof(float));
    return d;
}

// ---- exchanges between ranks: staged through the host ---------------------

void CudaBackend::reduce_sum(DevPtr<float> x, int64_t n) {
    if (!reducer()) return;
    std::vector<float> h(static_cast<size_t>(n));
    read(x, h.data(), h.size());
    reducer()->sum(h.data(), n);
    write(x, h.data(), h.size());
}

void CudaBackend::receive_rows(RowChannel& from, DevPtr<float> x, size_t n) {
    std::vector<float> h(n);
    from.receive(h.data(), n);
    write(x, h.data(), n);
    dev_.synchronize();
}

void CudaBackend::send_rows(RowChannel& to, DevPtr<const float> x, size_t n) {
    std::vector<float> h(n);
    read(x, h.data(), n);
    to.send(h.data(), n);
}

// ---- elementwise, norms, RoPE ------------------------------------------------

void CudaBackend::embed(const Weight& table, DevPtr<const int32_t> ids, int64_t n,
                        DevPtr<float> out) {
    Temporaries tmp(*this);
    op("embed", n);
    const Matrix m = matrix(table, "embed");
    const int64_t total = n * quant::groups::row_groups(m.cols);
    if (total == 0) return;
    GLM5_LAUNCH(embed_kernel, grid_for(total), kThreads, 0, stream(), m.type, m.data, m.row_bytes,
                m.cols, dev(ids), n, dev(out), dev_.tables());
}

void CudaBackend::rms_norm(DevPtr<const float> x, int64_t x_stride, const float* w, int64_t n_rows,
                           int64_t dim, float eps, DevPtr<float> y, int64_t y_stride) {
    Temporaries tmp(*this);
    op("rms_norm", n_rows);
    if (n_rows <= 0) return;
    GLM5_LAUNCH(rms_norm_kernel, unsigned(n_rows), kThreads, 0, stream(), dev(x), x_stride,
                vec(w, dim), dim, eps, dev(y), y_stride);
}

void CudaBackend::add_rms_norm(DevPtr<float> x, DevPtr<const float> d, const float* w,
                               int64_t n_rows, int64_t dim, float eps, DevPtr<float> y) {
    Temporaries tmp(*this);
    op("rms_norm", n_rows);
    if (n_rows <= 0) return;
    GLM5_LAUNCH(add_rms_norm_kernel, unsigned(n_rows), kThreads, 0, stream(), dev(x), dev(d),
                vec(w, dim), dim, eps, dev(y));
}

void CudaBackend::layer_norm(DevPtr<const float> x, const float* w, const float* b, int64_t n_rows,
                             int64_t dim, float eps, DevPtr<float> y) {
    Temporaries tmp(*this);
    op("layer_norm", n_rows);
    if (n_rows <= 0) return;
    GLM5_LAUNCH(layer_norm_kernel, unsigned(n_rows), kThreads, 0, stream(), dev(x), vec(w, dim),
                vec(b, dim), dim, eps, dev(y));
}

void CudaBackend::rope(DevPtr<float> x, int64_t n_tok, int64_t tok_stride, int64_t n_heads,
                       int64_t head_stride, int64_t n_rot, DevPtr<const int32_t> pos,
                       float freq_base) {
    op("rope", n_tok);
    const int64_t total = n_tok * n_heads * (n_rot / 2);
    if (total == 0) return;
    // The host's pow, as the CPU computes the angle step.
    const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
    GLM5_LAUNCH(rope_kernel, grid_for(total), kThreads, 0, stream(), dev(x), n_tok, tok_stride,
                n_heads, head_stride, n_rot, dev(pos), theta_scale);
}

void CudaBackend::hadamard(DevPtr<float> x, int64_t n_vec, int64_t dim) {
    op("hadamard", n_vec);
    if (n_vec <= 0) return;
    if (dim > 8192) throw Error("hadamard: vectors of " + std::to_string(dim) + " values");
    GLM5_LAUNCH(hadamard_kernel, unsigned(n_vec), kThreads, size_t(dim) * sizeof(float), stream(),
                dev(x), dim);
}

void CudaBackend::copy_rows(DevPtr<const float> src, int64_t src_stride, DevPtr<const int32_t> rows,
                            int64_t n_rows, int64_t n_cols, DevPtr<float> dst, int64_t dst_stride) {
    if (n_rows * n_cols <= 0) return;
    GLM5_LAUNCH(copy_rows_kernel, grid_for(n_rows * n_cols), kThreads, 0, stream(), dev(src),
                src_stride, dev(rows), n_rows, n_cols, dev(dst), dst_stride);
}

void CudaBackend::add(DevPtr<float> y, DevPtr<const float> x, int64_t n) {
    if (n <= 0) return;
    GLM5_LAUNCH(add_kernel, grid_for(n), kThreads, 0, stream(), dev(y), dev(x), n);
}

void CudaBackend::scale(DevPtr<float> y, float s, int64_t n) {
    if (n <= 0) return;
    GLM5_LAUNCH(scale_kernel, grid_for(n), kThreads, 0, stream(), dev(y), s, n);
}

void CudaBackend::swiglu(DevPtr<const float> g, DevPtr<const float> u, int64_t n_rows, int64_t n,
                         int64_t in_stride, float clamp, DevPtr<float> out) {
    op("swiglu", n_rows);
    if (n_rows * n <= 0) return;
    GLM5_LAUNCH(swiglu_kernel, grid_for(n_rows * n), kThreads, 0, stream(), dev(g), dev(u), n_rows,
                n, in_stride, clamp, dev(out));
}

void CudaBackend::cache_store(const CacheRows& c, DevPtr<const float> x, int64_t x_stride,
                              int64_t n_tok, DevPtr<const int32_t> pos) {
    op("cache_store", n_tok);
    if (c.type == CacheType::BF16)
        throw Error("cache_store: BF16 caches are the CPU's --attn-bf16");
    if (n_tok * c.width <= 0) return;
    GLM5_LAUNCH(cache_store_kernel, grid_for(n_tok * c.width), kThreads, 0, stream(), dev(c.data),
                c.row_bytes(), c.width, c.type == CacheType::F16, dev(x), x_stride, n_tok,
                dev(pos));
}

// ---- products ----------------------------------------------------------------

void CudaBackend::matmul(const Weight& w, DevPtr<const float> x, int64_t x_stride, int64_t n_tok,
                         DevPtr<float> y, int64_t y_stride) {
    Temporaries tmp(*this);
    op("matmul", n_tok);
    dev_.matmul(matrix(w, "matmul"), 0, dev(x), x_stride, n_tok, dev(y), y_stride);
    ++matmul_calls_;
}

void CudaBackend::matmuls(std::span<const MatmulOut> outs, DevPtr<const float> x, int64_t x_stride,
                          int64_t n_tok) {
    Temporaries tmp(*this);
    op("matmuls", n_tok);
    std::vector<Matrix> ms;
    ms.reserve(outs.size());
    for (const MatmulOut& o : outs) ms.push_back(matrix(*o.w, "matmuls"));
    std::vector<Device::MatmulTarget> ts;
    for (size_t j = 0; j < outs.size(); ++j)
        ts.push_back({&ms[j], dev(outs[j].y), outs[j].y_stride});
    dev_.matmuls(ts, dev(x), x_stride, n_tok);
    matmul_calls_ += outs.size();
}

void CudaBackend::matmul_slices(const Weight& w, DevPtr<const float> x, int64_t x_tok,
                                int64_t x_slice, int64_t n_tok, DevPtr<float> y, int64_t y_tok,
                                int64_t y_slice) {
    Temporaries tmp(*this);
    op("matmul_slices", n_tok);
    dev_.matmul_slices(matrix(w, "matmul_slices"), dev(x), x_tok, x_slice, n_tok, dev(y), y_tok,
                       y_slice);
    ++matmul_calls_;
}

Counters CudaBackend::counters() const {
    Counters c;
    c.weight_bytes = dev_.weight_bytes_read();
    c.matmul_calls = matmul_calls_;
    c.cache_bytes = cache_bytes_;
    c.scratch_peak = high_water_;
    const DeviceTraffic t = dev_.traffic();
    c.launches = t.launches;
    c.host_syncs = t.syncs;
    c.uploads = t.uploads;
    c.downloads = t.downloads;
    c.graphs = t.graphs;
    c.captures = t.captures;
    return c;
}

void CudaBackend::reset_counters() {
    dev_.reset_counters();
    matmul_calls_ = 0;
    cache_bytes_ = 0;
    high_water_ = 0;
    for (const Block& b : blocks_) high_water_ += b.used;
}

}  // namespace glm5::backend::cuda

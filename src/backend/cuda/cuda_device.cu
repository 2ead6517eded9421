// The device: discovery, memory, copies, uploads and the i-quant tables. Every CUDA call is
// checked; a failure becomes a glm5::Error naming the call and the runtime's reason (an
// out-of-memory a glm5::ResourceError with the numbers). Every entry point binds the device
// first: a model's steps run on the engine's thread, not the one that opened it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend/cuda/cuda_internal.cuh"
#include "core/format.h"
#include "quant/iq_tables.h"

namespace glm5::backend::cuda {

void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")");
}

namespace {

// Each device's state by its stream (a launch knows the stream, not the device).
std::mutex g_streams_mu;
std::unordered_map<cudaStream_t, Device::Impl*> g_streams;

Device::Impl* impl_of(cudaStream_t s) {
    const auto it = g_streams.find(s);
    return it == g_streams.end() ? nullptr : it->second;
}

}  // namespace

void count_launch(cudaStream_t s) {
    std::lock_guard lock(g_streams_mu);
    if (Device::Impl* d = impl_of(s)) ++d->traffic.launches;
}

StepRecorder* recorder_of(cudaStream_t s) {
    std::lock_guard lock(g_streams_mu);
    Device::Impl* d = impl_of(s);
    return d && d->recording ? &d->recorder : nullptr;
}

void launched(const char* kernel, cudaStream_t s, bool counted) {
    if (counted) count_launch(s);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw Error(std::string("cuda: launching ") + kernel + ": " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
    const char* sync = std::getenv("GLM5_CUDA_SYNC");
    if (sync && std::strcmp(sync, "1") == 0) {
        const cudaError_t r = cudaStreamSynchronize(s);
        if (r != cudaSuccess)
            throw Error(std::string("cuda: kernel ") + kernel + " failed: " + cudaGetErrorName(r) +
                        " (" + cudaGetErrorString(r) + ")");
    }
}

std::string built_architectures() {
    return GLM5_CUDA_ARCHS;
}

bool simulated() {
#if defined(GLM5_CUDA_SIM)
    return true;
#else
    return false;
#endif
}

std::vector<DeviceInfo> list_devices(std::string* why) {
    std::vector<DeviceInfo> out;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (why) {
            *why = std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
            if (e == cudaErrorInsufficientDriver)
                *why += ": no NVIDIA driver is loaded, or it is older than CUDA " +
                        std::to_string(CUDART_VERSION / 1000) + " needs";
        }
        return out;
    }
    for (int i = 0; i < n; ++i) {
        // Properties need no context: listing touches no device's memory.
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        DeviceInfo d;
        d.ordinal = i;
        d.name = p.name;
        d.cc_major = p.major;
        d.cc_minor = p.minor;
        d.total_bytes = p.totalGlobalMem;
        out.push_back(d);
    }
    if (out.empty() && why) *why = "no CUDA device is visible";
    return out;
}

uint64_t device_free_bytes(int ordinal) {
    // On a thread of its own: the caller's current device stays as it was, and no context
    // is opened but this device's.
    size_t free = 0, total = 0;
    cudaError_t e = cudaSuccess;
    std::thread([&] {
        e = cudaSetDevice(ordinal);
        if (e == cudaSuccess) e = cudaMemGetInfo(&free, &total);
    }).join();
    check(e, ("reading the free memory of GPU " + std::to_string(ordinal)).c_str());
    return free;
}

// ---- pinned staging -------------------------------------------------------------------------

StagingRing::StagingRing(cudaStream_t s, size_t bytes) : stream_(s), bytes_(bytes) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), "cudaMallocHost (staging)");
    base_ = static_cast<uint8_t*>(p);
}

StagingRing::~StagingRing() {
    // Teardown: what was queued is waited for, nothing is delivered.
    cudaStreamSynchronize(stream_);
    for (Piece& p : pieces_)
        if (p.done) cudaEventDestroy(p.done);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    cudaFreeHost(base_);
}

void StagingRing::retire_oldest(bool stream_done) {
    Piece p = pieces_.front();
    pieces_.erase(pieces_.begin());
    if (!stream_done) {
        if (p.done)
            check(cudaEventSynchronize(p.done), "a staged copy");
        else
            check(cudaStreamSynchronize(stream_), "a staged copy");
    }
    if (p.done) spare_.push_back(p.done);
    if (p.host) std::memcpy(p.host, base_ + p.at, p.host_bytes);
}

void StagingRing::complete() {
    while (!pieces_.empty()) retire_oldest(true);
    head_ = 0;
}

void* StagingRing::take(size_t bytes, bool may_wait) {
    bytes = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    if (bytes > bytes_ / 2) return nullptr;
    const size_t at = head_ + bytes > bytes_ ? 0 : head_;  // wrap: the ring's tail stays unused
    // Wait for the oldest copies until none still uses [at, at + bytes).
    auto overlaps = [&](const Piece& p) { return p.at < at + bytes && at < p.at + p.bytes; };
    if (!may_wait && std::any_of(pieces_.begin(), pieces_.end(), overlaps)) return nullptr;
    while (std::any_of(pieces_.begin(), pieces_.end(), overlaps)) retire_oldest(false);
    head_ = at + bytes;
    pending_ = Piece{at, bytes, nullptr, nullptr, 0};
    return base_ + at;
}

void StagingRing::queued(void* host_dst, size_t bytes, bool marked) {
    pending_.host = host_dst;
    pending_.host_bytes = bytes;
    if (!marked) {
        pieces_.push_back(pending_);
        return;
    }
    if (spare_.empty()) {
        cudaEvent_t e = nullptr;
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
        spare_.push_back(e);
    }
    pending_.done = spare_.back();
    spare_.pop_back();
    check(cudaEventRecord(pending_.done, stream_), "cudaEventRecord");
    pieces_.push_back(pending_);
}

namespace {

// The tables in one device allocation, laid out in the order of Tables' fields.
template <class T, size_t N>
size_t place(uint8_t* base, size_t at, const T (&host)[N], const T** dst,
             std::vector<uint8_t>& staging) {
    at = (at + 63) / 64 * 64;
    std::memcpy(staging.data() + at, host, sizeof(host));
    *dst = reinterpret_cast<const T*>(base + at);
    return at + sizeof(host);
}

constexpr size_t kStagingBytes = size_t(16) << 20;

}  // namespace

Device::Device(int ordinal) : impl_(std::make_unique<Impl>()) {
    std::string why;
    const std::vector<DeviceInfo> all = list_devices(&why);
    if (all.empty()) throw Error("no CUDA device: " + why);
    if (ordinal < 0 || ordinal >= int(all.size()))
        throw Error("CUDA device " + std::to_string(ordinal) +
                    " does not exist: " + std::to_string(all.size()) +
                    " visible (cuda:0 .. cuda:" + std::to_string(all.size() - 1) + ")");
    impl_->info = all[size_t(ordinal)];
    impl_->ordinal = ordinal;
    check(cudaSetDevice(ordinal), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    impl_->staging = std::make_unique<StagingRing>(impl_->stream, kStagingBytes);
    {
        std::lock_guard lock(g_streams_mu);
        g_streams[impl_->stream] = impl_.get();
    }
    set_graphs(true);

    using namespace quant::iq;
    const size_t bytes = 64 * 8 + sizeof(iq2xxs_grid) + sizeof(iq2xs_grid) + sizeof(iq2s_grid) +
                         sizeof(iq3xxs_grid) + sizeof(iq3s_grid) + sizeof(iq1s_grid) +
                         sizeof(ksigns_iq2xs) + sizeof(kvalues_iq4nl);
    auto* base = static_cast<uint8_t*>(alloc(bytes, "the i-quant tables"));
    impl_->table_memory = base;
    std::vector<uint8_t> staging(bytes);
    quant::groups::Tables& t = impl_->tables;
    size_t at = 0;
    at = place(base, at, iq2xxs_grid, &t.iq2xxs, staging);
    at = place(base, at, iq2xs_grid, &t.iq2xs, staging);
    at = place(base, at, iq2s_grid, &t.iq2s, staging);
    at = place(base, at, iq3xxs_grid, &t.iq3xxs, staging);
    at = place(base, at, iq3s_grid, &t.iq3s, staging);
    at = place(base, at, iq1s_grid, &t.iq1s, staging);
    at = place(base, at, ksigns_iq2xs, &t.ksigns, staging);
    at = place(base, at, kvalues_iq4nl, &t.kvalues, staging);
    upload(base, staging.data(), at);
    synchronize();
}

Device::~Device() {
    if (!impl_) return;
    // Teardown reports nothing: a device that failed has said so already.
    cudaSetDevice(impl_->ordinal);
    {
        std::lock_guard lock(g_streams_mu);
        g_streams.erase(impl_->stream);
    }
    cudaStreamSynchronize(impl_->stream);
    for (const Impl::Kept& k : impl_->kept) cudaGraphExecDestroy(k.exec);
    impl_->staging.reset();
    if (impl_->table_memory) cudaFree(impl_->table_memory);
    if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const DeviceInfo& Device::info() const {
    return impl_->info;
}

void Device::bind() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != impl_->ordinal)
        check(cudaSetDevice(impl_->ordinal), "cudaSetDevice");
}

uint64_t Device::free_bytes() const {
    bind();
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
}

void* Device::alloc(size_t bytes, const std::string& what) {
    bind();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // not sticky: clear it
        size_t free = 0, total = 0;
        cudaMemGetInfo(&free, &total);
        throw ResourceError("GPU " + std::to_string(impl_->info.ordinal) + " (" + impl_->info.name +
                            "): " + what + " needs " + human_bytes(double(bytes)) + ", " +
                            human_bytes(double(free)) + " of " + human_bytes(double(total)) +
                            " is free");
    }
    check(e, ("cudaMalloc for " + what).c_str());
    return p;
}

void Device::free(void* p) {
    bind();
    eager();  // recorded work may read it
    if (p) check(cudaFree(p), "cudaFree");
}

void Device::upload(void* dst, const void* host_src, size_t bytes) {
    bind();
    if (bytes == 0) return;
    ++impl_->traffic.uploads;
    cudaStream_t s = impl_->stream;
    if (impl_->recording) {
        if (void* pinned = impl_->staging->take(bytes, false)) {
            std::memcpy(pinned, host_src, bytes);
            record_copy(dst, pinned, bytes, cudaMemcpyHostToDevice);
            impl_->staging->queued(nullptr, 0, false);
            return;
        }
        eager();
    }
    if (void* pinned = impl_->staging->take(bytes)) {
        std::memcpy(pinned, host_src, bytes);
        check(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, s), "upload");
        impl_->staging->queued();
        return;
    }
    // Larger than the ring: the driver stages pageable memory itself.
    check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s), "upload");
}

void Device::download(void* host_dst, const void* src, size_t bytes) {
    bind();
    if (bytes == 0) return;
    ++impl_->traffic.downloads;
    if (impl_->recording) {
        if (void* pinned = impl_->staging->take(bytes, false)) {
            record_copy(pinned, src, bytes, cudaMemcpyDeviceToHost);
            impl_->staging->queued(host_dst, bytes, false);
            return;
        }
        eager();
    }
    if (void* pinned = impl_->staging->take(bytes)) {
        check(cudaMemcpyAsync(pinned, src, bytes, cudaMemcpyDeviceToHost, impl_->stream),
              "download");
        impl_->staging->queued(host_dst, bytes);
        return;
    }
    // Into pageable memory: the copy returns once it is done, so the staged downloads queued
    // before it are delivered first (one of them may name the same host bytes).
    synchronize();
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream), "download");
}

void Device::copy(void* dst, const void* src, size_t bytes) {
    bind();
    if (bytes == 0) return;
    if (impl_->recording) return record_copy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}

void Device::record_copy(void* dst, const void* src, size_t bytes, int kind) {
    StepRecorder& r = impl_->recorder;
    r.key(uintptr_t(0));  // no kernel: a copy
    r.key(reinterpret_cast<uintptr_t>(dst));
    r.key(reinterpret_cast<uintptr_t>(src));
    r.key(bytes);
    r.key(kind);
    cudaStream_t s = impl_->stream;
    r.add([=] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyKind(kind), s), "a copy"); });
}

void Device::watch_scratch(const void* p, size_t bytes, bool in_use) {
#if defined(GLM5_CUDA_SIM)
    cudaStream_t s = impl_->stream;
    auto op = [s, p, bytes, in_use] {
        if (in_use)
            cudasim::carve(s, p, bytes);
        else
            cudasim::release(s, p, bytes);
    };
    if (!impl_->recording) return op();
    StepRecorder& r = impl_->recorder;
    r.key(uintptr_t(1));  // no kernel: a watch
    r.key(reinterpret_cast<uintptr_t>(p));
    r.key(bytes);
    r.key(in_use);
    r.add(op);
#else
    (void)p, (void)bytes, (void)in_use;
#endif
}

void Device::synchronize() {
    bind();
    eager();
    ++impl_->traffic.syncs;
    check(cudaStreamSynchronize(impl_->stream), "a queued op");
    impl_->staging->complete();
}

// ---- steps as graphs ----------------------------------------------------------------------

namespace {

bool env_is(const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, value) == 0;
}

void run_all(const std::vector<std::function<void()>>& ops) {
    for (const auto& op : ops) op();
}

// Ends the step being recorded: its work, taken from the recorder.
StepRecorder::Work stop_recording(Device::Impl& d) {
    {
        std::lock_guard lock(g_streams_mu);
        d.recording = false;
    }
    return d.recorder.take();
}

}  // namespace

void Device::set_graphs(bool on) {
    eager();
    impl_->graphs_on = on && !env_is("GLM5_CUDA_GRAPHS", "0") && !env_is("GLM5_CUDA_SYNC", "1");
}

void Device::begin_graph() {
    if (!impl_->graphs_on || impl_->recording) return;
    if (impl_->eager_steps > 0) {  // steps that found no graph to replay lately
        --impl_->eager_steps;
        return;
    }
    std::lock_guard lock(g_streams_mu);
    impl_->recording = true;
}

void Device::eager() {
    if (!impl_->recording) return;
    run_all(stop_recording(*impl_).ops);
}

void Device::end_graph(bool complete) {
    if (!impl_->recording) return;
    bind();
    StepRecorder::Work w = stop_recording(*impl_);
    if (!complete || w.ops.empty()) return run_all(w.ops);
    std::vector<Impl::Kept>& kept = impl_->kept;
    std::vector<std::function<void()>>& ops = w.ops;
    cudaStream_t s = impl_->stream;
    auto it =
        std::find_if(kept.begin(), kept.end(), [&](const Impl::Kept& k) { return k.key == w.key; });
    if (it == kept.end()) {
        check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "beginning a capture");
        cudaGraph_t g = nullptr;
        try {
            run_all(ops);
        } catch (...) {
            cudaStreamEndCapture(s, &g);
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            throw;
        }
        check(cudaStreamEndCapture(s, &g), "capturing a step");
        cudaGraphExec_t exec = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        check(e, "instantiating a step's graph");
        if (kept.size() == kGraphs) {
            // A graph still running is freed when it ends.
            cudaGraphExecDestroy(kept.front().exec);
            kept.erase(kept.begin());
        }
        kept.push_back({std::move(w.key), exec});
        it = kept.end() - 1;
        ++impl_->traffic.captures;
        // Steps whose work keeps changing (a batch that changes every step) would pay for a
        // capture each: after kGraphs captures in a row, kEagerSteps steps are launched as
        // they come.
        if (++impl_->captures_in_a_row >= kGraphs) {
            impl_->captures_in_a_row = 0;
            impl_->eager_steps = kEagerSteps;
        }
    } else {
        std::rotate(it, it + 1, kept.end());  // the most recently used last
        it = kept.end() - 1;
        impl_->captures_in_a_row = 0;
    }
    check(cudaGraphLaunch(it->exec, s), "launching a step's graph");
    ++impl_->traffic.graphs;
}

Matrix Device::upload_matrix(const Weight& w, const std::string& name) {
    bind();
    if (w.repacked)
        throw Error(name + ": a repacked view cannot be uploaded (the GPU reads GGUF blocks)");
    const bool floats = quant::groups::group_block_values(w.type) == 1;
    if (!quant::groups::has_groups(w.type) || (!floats && w.cols % quant::groups::kGroup != 0))
        throw Error(name + ": " + quant::name(w.type) + " with " + std::to_string(w.cols) +
                    " columns has no GPU product");
    Matrix m;
    m.type = w.type;
    m.cols = w.cols;
    m.rows = w.rows;
    m.slices = w.slices;
    // Packed: the slices of a view may lie apart, and a view of some columns has rows
    // wider than its columns; only the view's bytes are uploaded, row by row.
    m.row_bytes = quant::row_size(w.type, w.cols);
    m.slice_bytes = m.row_bytes * size_t(w.rows);
    auto* d = static_cast<uint8_t*>(alloc(m.slice_bytes * size_t(w.slices), name));
    for (int64_t s = 0; s < w.slices; ++s)
        check(
            cudaMemcpy2DAsync(d + size_t(s) * m.slice_bytes, m.row_bytes, w.row(0, s), w.row_bytes,
                              m.row_bytes, size_t(w.rows), cudaMemcpyHostToDevice, impl_->stream),
            "upload");
    synchronize();  // the host view may be unmapped after this returns
    m.data = d;
    return m;
}

void Device::free_matrix(Matrix& m) {
    free(const_cast<uint8_t*>(m.data));
    m.data = nullptr;
}

void* Device::stream() const {
    bind();
    return impl_->stream;
}

const quant::groups::Tables& Device::tables() const {
    return impl_->tables;
}

uint64_t Device::weight_bytes_read() const {
    return impl_->weight_bytes;
}

DeviceTraffic Device::traffic() const {
    std::lock_guard lock(g_streams_mu);
    return impl_->traffic;
}

void Device::reset_counters() {
    impl_->weight_bytes = 0;
    std::lock_guard lock(g_streams_mu);
    impl_->traffic = DeviceTraffic{};
}

}  // namespace glm5::backend::cuda

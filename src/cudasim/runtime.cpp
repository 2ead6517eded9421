// The simulated runtime: devices and their memory, streams that run their work in order on
// threads of their own, events, host functions, graph capture and replay, and CUDA's rules
// for each (what is asynchronous, what waits, what a launch or a copy may name).
#include "cudasim/runtime.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cudasim/device.h"
#include "cudasim/executor.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CUDASIM_ASAN 1
#endif

namespace cudasim {

struct Op {
    std::function<void()> fn;
    bool always = false;  // runs on a faulted device too (event marks: waits must end)
};

struct Graph {
    int device = 0;
    std::vector<Op> ops;
};
struct GraphExec {
    int device = 0;
    std::vector<Op> ops;
};

struct Stream {
    int device = 0;
    bool legacy = false;
    std::mutex m;
    std::condition_variable cv, idle;
    std::deque<Op> q;
    bool busy = false, stop = false;
    std::thread th;
    Graph* capture = nullptr;  // what is queued goes here while capturing
    bool capture_invalid = false;
};

// An event's state, shared with the ops that record it or wait for it (an event may be
// destroyed while a stream still waits for it, as CUDA allows).
struct EventState {
    int device = 0;
    uint64_t pending = 0, done = 0;  // records queued, records reached
};
struct Event {
    std::shared_ptr<EventState> st = std::make_shared<EventState>();
};

namespace {

struct Region {
    size_t size = 0;
    int device = -1;  // -1: host memory pinned for the devices
};

struct DeviceState {
    uint64_t capacity = 0, used = 0, peak = 0;
    std::string fault;
    Counts counts;
    bool context = false;
    // Owned here, and by whoever waits on one: a stream destroyed meanwhile is freed after.
    std::vector<std::shared_ptr<Stream>> streams;
    Stream* legacy = nullptr;
};

uint64_t parse_bytes(const char* v, uint64_t fallback) {
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (x <= 0) return fallback;
    double m = 1;
    if (end && (*end == 'K' || *end == 'k')) m = 1024.0;
    if (end && (*end == 'M' || *end == 'm')) m = 1024.0 * 1024;
    if (end && (*end == 'G' || *end == 'g')) m = 1024.0 * 1024 * 1024;
    return uint64_t(x * m);
}

struct Runtime {
    std::mutex m;
    std::condition_variable event_cv;
    std::vector<DeviceState> dev;
    std::map<uintptr_t, Region> regions;
    std::vector<int> contexts;
    std::map<const void*, size_t> max_dynamic;
    std::string last_fault;
    Runtime() {
        const char* n = std::getenv("GLM5_SIM_DEVICES");
        const int count = n ? std::max(0, std::atoi(n)) : 2;
        const uint64_t bytes = parse_bytes(std::getenv("GLM5_SIM_DEVICE_MEM"), uint64_t(1) << 30);
        dev.resize(size_t(count));
        for (DeviceState& d : dev) d.capacity = bytes;
    }
};

Runtime& rt() {
    static Runtime* r = new Runtime;  // never destroyed: stream threads may outlive main
    return *r;
}

thread_local int tl_device = 0;
thread_local cudaError_t tl_last = cudaSuccess;
thread_local detail::Executor* tl_executor = nullptr;

cudaError_t fail(cudaError_t e) {
    tl_last = e;
    return e;
}

bool valid_device(int d) {
    return d >= 0 && d < int(rt().dev.size());
}

// (rt().m held)
void ensure_context_locked(int d) {
    DeviceState& s = rt().dev[size_t(d)];
    if (s.context) return;
    s.context = true;
    rt().contexts.push_back(d);
}

void ensure_context(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    ensure_context_locked(d);
}

bool faulted(int d) {
    if (!valid_device(d)) return false;
    std::lock_guard<std::mutex> lock(rt().m);
    return !rt().dev[size_t(d)].fault.empty();
}

void set_fault(int d, const std::string& what) {
    {
        std::lock_guard<std::mutex> lock(rt().m);
        DeviceState& s = rt().dev[size_t(d)];
        if (!s.fault.empty()) return;
        s.fault = what;
        rt().last_fault = what;
    }
    std::fprintf(stderr, "cudasim: device %d: %s\n", d, what.c_str());
    std::fflush(stderr);
}

// The region holding [p, p + n), or null. (rt().m held)
const Region* region_of_locked(const void* p, size_t n, uintptr_t* base = nullptr) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto& r = rt().regions;
    auto it = r.upper_bound(a);
    if (it == r.begin()) return nullptr;
    --it;
    if (a < it->first || a + n > it->first + it->second.size) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}

std::string check_pointer(const void* p, int device) {
    std::lock_guard<std::mutex> lock(rt().m);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto& r = rt().regions;
    auto it = r.upper_bound(a);
    if (it != r.begin()) {
        --it;
        // One past the end is a pointer a kernel may form (an empty range).
        if (a <= it->first + it->second.size) {
            const Region& g = it->second;
            if (g.device < 0 || g.device == device) return "";
            return "points into device " + std::to_string(g.device) +
                   "'s memory, and the kernel runs on device " + std::to_string(device);
        }
    }
    char b[32];
    std::snprintf(b, sizeof b, "%p", p);
    return std::string("(") + b +
           ") is not device memory: a host address, which a GPU "
           "cannot read";
}

void count(int d, uint64_t Counts::*field, uint64_t n = 1) {
    std::lock_guard<std::mutex> lock(rt().m);
    rt().dev[size_t(d)].counts.*field += n;
}

void worker(Stream* s) {
    detail::Executor ex([s](const void* p) { return check_pointer(p, s->device); });
    tl_executor = &ex;
    for (;;) {
        Op op;
        {
            std::unique_lock<std::mutex> lock(s->m);
            s->cv.wait(lock, [&] { return !s->q.empty() || s->stop; });
            if (s->q.empty()) break;
            op = std::move(s->q.front());
            s->q.pop_front();
            s->busy = true;
        }
        if (op.always || !faulted(s->device)) op.fn();
        {
            std::lock_guard<std::mutex> lock(s->m);
            s->busy = false;
        }
        s->idle.notify_all();
    }
    tl_executor = nullptr;
}

// (rt().m held)
Stream* new_stream_locked(int d, bool legacy) {
    auto s = std::make_shared<Stream>();
    s->device = d;
    s->legacy = legacy;
    s->th = std::thread(worker, s.get());
    ensure_context_locked(d);
    rt().dev[size_t(d)].streams.push_back(s);
    if (legacy) rt().dev[size_t(d)].legacy = s.get();
    return s.get();
}

// The stream a call names, or the current device's legacy stream; null when there is no
// device (the caller fails with cudaErrorNoDevice).
Stream* resolve(cudaStream_t s) {
    if (s) return s;
    const int d = tl_device;
    if (!valid_device(d)) return nullptr;
    std::lock_guard<std::mutex> lock(rt().m);
    if (Stream* l = rt().dev[size_t(d)].legacy) return l;
    return new_stream_locked(d, true);
}

// Queues op on s, or adds it to the graph s is capturing.
void enqueue(Stream* s, Op op) {
    {
        std::lock_guard<std::mutex> lock(s->m);
        if (s->capture) {
            s->capture->ops.push_back(std::move(op));
            return;
        }
        s->q.push_back(std::move(op));
    }
    s->cv.notify_one();
}

void wait_idle(Stream* s) {
    std::unique_lock<std::mutex> lock(s->m);
    s->idle.wait(lock, [&] { return s->q.empty() && !s->busy; });
}

std::vector<std::shared_ptr<Stream>> streams_of(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    if (d >= 0) return rt().dev[size_t(d)].streams;
    std::vector<std::shared_ptr<Stream>> all;
    for (DeviceState& s : rt().dev) all.insert(all.end(), s.streams.begin(), s.streams.end());
    return all;
}

cudaError_t sticky(int d) {
    return faulted(d) ? cudaErrorLaunchFailure : cudaSuccess;
}

// The device's sticky fault, if it has one, as this call's error too.
cudaError_t fail_if(int d) {
    const cudaError_t e = sticky(d);
    if (e != cudaSuccess) tl_last = e;
    return e;
}

// A synchronising call in a capture ends the capture, invalid, as on a GPU.
bool capturing(Stream* s) {
    std::lock_guard<std::mutex> lock(s->m);
    if (s->capture) s->capture_invalid = true;
    return s->capture != nullptr;
}

enum class Side { Host, Pinned, Device };

Side side_of(const void* p, size_t n, int* device) {
    std::lock_guard<std::mutex> lock(rt().m);
    const Region* r = region_of_locked(p, n);
    if (!r) return Side::Host;
    if (r->device < 0) return Side::Pinned;
    *device = r->device;
    return Side::Device;
}

// Device memory named by a copy must hold the whole range; host memory must not be a
// device's (a copy kind that says otherwise is refused, as CUDA refuses it).
cudaError_t check_copy(const void* dst, size_t dst_span, const void* src, size_t src_span,
                       cudaMemcpyKind& kind, Side* ds, Side* ss) {
    int dd = -1, sd = -1;
    *ds = side_of(dst, dst_span, &dd);
    *ss = side_of(src, src_span, &sd);
    auto device_any = [](const void* p) {
        std::lock_guard<std::mutex> lock(rt().m);
        const Region* r = region_of_locked(p, 1);
        return r && r->device >= 0;
    };
    if (kind == cudaMemcpyDefault) {
        const bool dev_dst = *ds == Side::Device || device_any(dst);
        const bool dev_src = *ss == Side::Device || device_any(src);
        kind = dev_dst ? (dev_src ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                       : (dev_src ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dst_dev != (*ds == Side::Device) || src_dev != (*ss == Side::Device))
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

cudaError_t copy(void* dst, const void* src, size_t bytes, size_t rows, size_t dpitch,
                 size_t spitch, cudaMemcpyKind kind, cudaStream_t stream, bool sync_call) {
    if (bytes == 0 || rows == 0) return cudaSuccess;
    const size_t dspan = (rows - 1) * dpitch + bytes, sspan = (rows - 1) * spitch + bytes;
    Side ds, ss;
    if (const cudaError_t e = check_copy(dst, dspan, src, sspan, kind, &ds, &ss)) return fail(e);
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    if (faulted(s->device)) return fail(cudaErrorLaunchFailure);
    const bool to_pageable = kind == cudaMemcpyDeviceToHost && ds == Side::Host;
    const bool from_pageable = kind == cudaMemcpyHostToDevice && ss == Side::Host;
    if ((to_pageable || from_pageable || sync_call) && capturing(s))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost)
        count(s->device, &Counts::copies);
    // From host memory to host memory a copy is synchronous, as CUDA makes it.
    if (kind == cudaMemcpyHostToHost) sync_call = true;
    auto* d = static_cast<unsigned char*>(dst);
    auto* from = static_cast<const unsigned char*>(src);
    std::shared_ptr<std::vector<unsigned char>> staged;
    if (from_pageable) {
        // Pageable memory is staged before the call returns: the caller may reuse it.
        staged = std::make_shared<std::vector<unsigned char>>(rows * bytes);
        for (size_t r = 0; r < rows; ++r)
            std::memcpy(staged->data() + r * bytes, from + r * spitch, bytes);
        from = staged->data();
        spitch = bytes;
    }
    // (The op alone owns the staged copy: the stream's thread, which reads it, frees it.)
    enqueue(s, {[d, from, bytes, rows, dpitch, spitch, staged = std::move(staged)] {
                for (size_t r = 0; r < rows; ++r)
                    std::memcpy(d + r * dpitch, from + r * spitch, bytes);
            }});
    if (to_pageable || sync_call) {
        // A copy to pageable memory returns once it is done.
        count(s->device, &Counts::host_waits);
        wait_idle(s);
        return fail_if(s->device);
    }
    return cudaSuccess;
}

}  // namespace
}  // namespace cudasim

using namespace cudasim;

// ---- errors ----------------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define NAME(x) \
    case x:     \
        return #x;
        NAME(cudaSuccess)
        NAME(cudaErrorInvalidValue)
        NAME(cudaErrorMemoryAllocation)
        NAME(cudaErrorInitializationError)
        NAME(cudaErrorInvalidConfiguration)
        NAME(cudaErrorInvalidMemcpyDirection)
        NAME(cudaErrorInsufficientDriver)
        NAME(cudaErrorNoDevice)
        NAME(cudaErrorInvalidDevice)
        NAME(cudaErrorInvalidResourceHandle)
        NAME(cudaErrorIllegalState)
        NAME(cudaErrorNotReady)
        NAME(cudaErrorIllegalAddress)
        NAME(cudaErrorLaunchOutOfResources)
        NAME(cudaErrorLaunchTimeout)
        NAME(cudaErrorLaunchFailure)
        NAME(cudaErrorNotSupported)
        NAME(cudaErrorStreamCaptureUnsupported)
        NAME(cudaErrorStreamCaptureInvalidated)
        NAME(cudaErrorStreamCaptureUnmatched)
        NAME(cudaErrorStreamCaptureImplicit)
#undef NAME
    }
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidConfiguration:
            return "invalid configuration argument";
        case cudaErrorNoDevice:
            return "no CUDA-capable device is detected (the simulator has none: GLM5_SIM_DEVICES)";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorNotReady:
            return "device not ready";
        case cudaErrorStreamCaptureUnsupported:
            return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated:
            return "operation failed due to a previous error during capture";
        case cudaErrorLaunchFailure: {
            // The simulator knows what failed: it says so.
            thread_local std::string s;
            std::lock_guard<std::mutex> lock(rt().m);
            s = "unspecified launch failure (simulated: " + rt().last_fault + ")";
            return s.c_str();
        }
        default:
            return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError() {
    const cudaError_t st = sticky(tl_device);
    if (st != cudaSuccess) return st;
    return std::exchange(tl_last, cudaSuccess);
}

cudaError_t cudaPeekAtLastError() {
    const cudaError_t st = sticky(tl_device);
    return st != cudaSuccess ? st : tl_last;
}

cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

// ---- devices ---------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* n) {
    *n = int(rt().dev.size());
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* d) {
    *d = tl_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
    if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
    tl_device = d;
    ensure_context(d);  // as CUDA 12 and later do
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "CUDA simulator (sm_90 on the CPU)");
    {
        std::lock_guard<std::mutex> lock(rt().m);
        p->totalGlobalMem = rt().dev[size_t(d)].capacity;
    }
    p->sharedMemPerBlock = kSharedDefault;
    p->sharedMemPerBlockOptin = kSharedOptin;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    const int d = tl_device;
    if (!valid_device(d)) return fail(cudaErrorNoDevice);
    std::lock_guard<std::mutex> lock(rt().m);
    ensure_context_locked(d);
    const DeviceState& s = rt().dev[size_t(d)];
    *total_bytes = s.capacity;
    *free_bytes = s.used < s.capacity ? s.capacity - s.used : 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    const int d = tl_device;
    if (!valid_device(d)) return fail(cudaErrorNoDevice);
    ensure_context(d);
    count(d, &Counts::host_waits);
    for (const auto& s : streams_of(d)) wait_idle(s.get());
    return fail_if(d);
}

// ---- memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = nullptr;
    const int d = tl_device;
    if (!valid_device(d)) return fail(cudaErrorNoDevice);
    if (faulted(d)) return fail(cudaErrorLaunchFailure);
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        ensure_context_locked(d);
        DeviceState& s = rt().dev[size_t(d)];
        if (s.used + bytes > s.capacity) return fail(cudaErrorMemoryAllocation);
        s.used += bytes;
        s.peak = std::max(s.peak, s.used);
    }
    void* m = nullptr;
    if (posix_memalign(&m, 256, bytes) != 0) {
        std::lock_guard<std::mutex> lock(rt().m);
        rt().dev[size_t(d)].used -= bytes;
        return fail(cudaErrorMemoryAllocation);
    }
    // Fresh device memory holds no values: NaN here (0xff bytes: NaN as F32, F16 and F64,
    // -1 as an integer), so a read before a write shows in the results.
    std::memset(m, 0xff, bytes);
    std::lock_guard<std::mutex> lock(rt().m);
    rt().regions[reinterpret_cast<uintptr_t>(m)] = Region{bytes, d};
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    int d = -1;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        auto it = rt().regions.find(reinterpret_cast<uintptr_t>(p));
        if (it == rt().regions.end() || it->second.device < 0) return fail(cudaErrorInvalidValue);
        d = it->second.device;
    }
    // cudaFree waits for the device: queued work may still read the memory.
    for (const auto& s : streams_of(d)) wait_idle(s.get());
    {
        std::lock_guard<std::mutex> lock(rt().m);
        auto it = rt().regions.find(reinterpret_cast<uintptr_t>(p));
        rt().dev[size_t(d)].used -= it->second.size;
        rt().regions.erase(it);
    }
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = nullptr;
    if (!valid_device(tl_device)) return fail(cudaErrorNoDevice);
    ensure_context(tl_device);
    if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0)
        return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lock(rt().m);
    rt().regions[reinterpret_cast<uintptr_t>(*p)] = Region{std::max<size_t>(bytes, 1), -1};
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        auto it = rt().regions.find(reinterpret_cast<uintptr_t>(p));
        if (it == rt().regions.end() || it->second.device >= 0) return fail(cudaErrorInvalidValue);
    }
    for (const auto& s : streams_of(-1)) wait_idle(s.get());
    {
        std::lock_guard<std::mutex> lock(rt().m);
        rt().regions.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    return copy(dst, src, bytes, 1, bytes, bytes, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
    return copy(dst, src, bytes, 1, bytes, bytes, kind, s, false);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue);
    return copy(dst, src, width, height, dpitch, spitch, kind, s, false);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return cudaSuccess;
    int d = -1;
    if (side_of(p, bytes, &d) != Side::Device) return fail(cudaErrorInvalidValue);
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    if (faulted(s->device)) return fail(cudaErrorLaunchFailure);
    enqueue(s, {[p, value, bytes] { std::memset(p, value, bytes); }});
    return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    Stream* s = resolve(nullptr);
    if (!s) return fail(cudaErrorNoDevice);
    if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
    if (const cudaError_t e = cudaMemsetAsync(p, value, bytes, s)) return e;
    wait_idle(s);
    return fail_if(s->device);
}

// ---- streams and events ---------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    (void)flags;
    *s = nullptr;
    if (!valid_device(tl_device)) return fail(cudaErrorNoDevice);
    std::lock_guard<std::mutex> lock(rt().m);
    *s = new_stream_locked(tl_device, false);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s->legacy) return fail(cudaErrorInvalidResourceHandle);
    std::shared_ptr<Stream> held;  // freed when the last waiter lets go
    {
        std::lock_guard<std::mutex> lock(rt().m);
        auto& v = rt().dev[size_t(s->device)].streams;
        auto it = std::find_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == s; });
        if (it == v.end()) return fail(cudaErrorInvalidResourceHandle);
        held = *it;
        v.erase(it);
    }
    wait_idle(s);
    {
        std::lock_guard<std::mutex> lock(s->m);
        s->stop = true;
    }
    s->cv.notify_one();
    s->th.join();
    delete s->capture;
    s->capture = nullptr;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
    count(s->device, &Counts::host_waits);
    wait_idle(s);
    return fail_if(s->device);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    std::lock_guard<std::mutex> lock(s->m);
    return s->q.empty() && !s->busy ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    (void)flags;
    *e = nullptr;
    if (!valid_device(tl_device)) return fail(cudaErrorNoDevice);
    *e = new Event;
    (*e)->st->device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    std::shared_ptr<EventState> st = e->st;
    bool in_capture = false;
    {
        std::lock_guard<std::mutex> lock(s->m);
        in_capture = s->capture != nullptr;
    }
    if (in_capture) {
        // Replayed: each replay records anew.
        enqueue(s, {[st] {
                        std::lock_guard<std::mutex> lock(rt().m);
                        ++st->pending;
                        ++st->done;
                        rt().event_cv.notify_all();
                    },
                    true});
        return cudaSuccess;
    }
    uint64_t g;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        g = ++st->pending;
    }
    enqueue(s, {[st, g] {
                    std::lock_guard<std::mutex> lock(rt().m);
                    st->done = std::max(st->done, g);
                    rt().event_cv.notify_all();
                },
                true});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    const std::shared_ptr<EventState> st = e->st;
    std::unique_lock<std::mutex> lock(rt().m);
    rt().dev[size_t(st->device)].counts.host_waits++;
    const uint64_t target = st->pending;
    rt().event_cv.wait(lock, [&] { return st->done >= target; });
    const bool bad = !rt().dev[size_t(st->device)].fault.empty();
    lock.unlock();
    return bad ? fail(cudaErrorLaunchFailure) : cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(rt().m);
    return e->st->done >= e->st->pending ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;  // the ops that record or wait for it keep its state
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags) {
    (void)flags;
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    std::shared_ptr<EventState> st = e->st;
    uint64_t target;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        target = st->pending;
    }
    enqueue(s, {[st, target] {
                    std::unique_lock<std::mutex> lock(rt().m);
                    rt().event_cv.wait(lock, [&] { return st->done >= target; });
                },
                true});
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    if (faulted(s->device)) return fail(cudaErrorLaunchFailure);
    enqueue(s, {[fn, data] { fn(data); }});
    return cudaSuccess;
}

// ---- graphs ----------------------------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    (void)mode;
    if (!stream || stream->legacy) return fail(cudaErrorStreamCaptureUnsupported);
    std::lock_guard<std::mutex> lock(stream->m);
    if (stream->capture) return fail(cudaErrorIllegalState);
    stream->capture = new Graph;
    stream->capture->device = stream->device;
    stream->capture_invalid = false;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* g) {
    *g = nullptr;
    if (!stream) return fail(cudaErrorIllegalState);
    std::lock_guard<std::mutex> lock(stream->m);
    if (!stream->capture) return fail(cudaErrorIllegalState);
    Graph* graph = std::exchange(stream->capture, nullptr);
    if (stream->capture_invalid) {
        delete graph;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = graph;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    std::lock_guard<std::mutex> lock(s->m);
    *status = !s->capture          ? cudaStreamCaptureStatusNone
              : s->capture_invalid ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    if (!g) return fail(cudaErrorInvalidValue);
    *exec = new GraphExec{g->device, g->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    if (!exec || exec->device != s->device) return fail(cudaErrorInvalidValue);
    if (faulted(s->device)) return fail(cudaErrorLaunchFailure);
    count(s->device, &Counts::graphs);
    for (const Op& op : exec->ops) enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        size_t(value) > kSharedOptin)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(rt().m);
    rt().max_dynamic[kernel] = size_t(value);
    return cudaSuccess;
}

// ---- kernels and the simulator's own calls ----------------------------------------------------

namespace cudasim {

namespace {
std::mutex g_hook_mu;
std::function<void(const char*)> g_kernel_start;
}  // namespace

void set_kernel_start_hook(std::function<void(const char* kernel)> hook) {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    g_kernel_start = std::move(hook);
}

cudaError_t launch_kernel(std::shared_ptr<const Kernel> k, cudaStream_t stream) {
    const int d = tl_device;
    Stream* s = resolve(stream);
    if (!s) return fail(cudaErrorNoDevice);
    // A kernel goes to a stream of the current device (a copy may go to any).
    if (s->device != d) return fail(cudaErrorInvalidResourceHandle);
    const dim3 g = k->grid, b = k->block;
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || g.x > 2147483647u ||
        g.y > 65535 || g.z > 65535 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        uint64_t(b.x) * b.y * b.z > 1024)
        return fail(cudaErrorInvalidConfiguration);
    size_t max_dynamic = 0;
    {
        std::lock_guard<std::mutex> lock(rt().m);
        auto it = rt().max_dynamic.find(k->fn);
        if (it != rt().max_dynamic.end()) max_dynamic = it->second;
    }
    if (k->shared > (max_dynamic ? max_dynamic : kSharedDefault))
        return fail(cudaErrorInvalidValue);
    if (faulted(d)) return fail(cudaErrorLaunchFailure);
    enqueue(s, {[k = std::move(k), d, max_dynamic] {
                std::function<void(const char*)> hook;
                {
                    std::lock_guard<std::mutex> lock(g_hook_mu);
                    hook = g_kernel_start;
                }
                if (hook) hook(k->name);
                count(d, &Counts::kernels);
                const std::string f = tl_executor->run(*k, max_dynamic);
                if (!f.empty()) set_fault(d, f);
            }});
    return cudaSuccess;
}

void carve(cudaStream_t stream, const void* p, size_t bytes) {
#if defined(CUDASIM_ASAN)
    if (bytes == 0) return;
    if (Stream* s = resolve(stream))
        enqueue(s, {[p, bytes] { __asan_unpoison_memory_region(p, bytes); }, true});
#else
    (void)stream, (void)p, (void)bytes;
#endif
}

void release(cudaStream_t stream, const void* p, size_t bytes) {
    Stream* s = resolve(stream);
    if (bytes == 0 || !s) return;
    enqueue(s, {[p, bytes] {
#if defined(CUDASIM_ASAN)
                    __asan_unpoison_memory_region(p, bytes);
#endif
                    std::memset(const_cast<void*>(p), 0xff, bytes);
#if defined(CUDASIM_ASAN)
                    __asan_poison_memory_region(p, bytes);
#endif
                },
                true});
}

int device_count() {
    return int(rt().dev.size());
}

void set_device_memory(int d, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(rt().m);
    rt().dev.at(size_t(d)).capacity = bytes;
}

uint64_t used_bytes(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    return rt().dev.at(size_t(d)).used;
}

uint64_t peak_bytes(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    return rt().dev.at(size_t(d)).peak;
}

void reset_peak(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    DeviceState& s = rt().dev.at(size_t(d));
    s.peak = s.used;
}

std::vector<int> contexts() {
    std::lock_guard<std::mutex> lock(rt().m);
    return rt().contexts;
}

std::string fault(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    return rt().dev.at(size_t(d)).fault;
}

void clear_fault(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    rt().dev.at(size_t(d)).fault.clear();
}

Counts counts(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    return rt().dev.at(size_t(d)).counts;
}

void reset_counts(int d) {
    std::lock_guard<std::mutex> lock(rt().m);
    rt().dev.at(size_t(d)).counts = Counts{};
}

}  // namespace cudasim

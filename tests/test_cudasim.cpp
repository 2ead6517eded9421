// The CUDA simulator itself (built with GLM5_CUDA_SIM): what a GPU would refuse or fault on,
// it refuses or reports, naming the kernel and the block; the warp's collectives follow PTX's
// rules; memory is NaN when fresh, bounded by the simulated device's size and checked at each
// copy; streams, events, host functions and captured graphs keep CUDA's order; two devices,
// each with its own context, memory and streams.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernel.cuh"
#include "core/error.h"
#include "util_model.h"

namespace glm5 {
namespace {

// ---- kernels --------------------------------------------------------------------------------

// Threads below `upto` meet at a barrier; the others leave first.
__global__ void divergent_barrier(int upto, float* out) {
    if (int(threadIdx.x) >= upto) return;
    __syncthreads();
    out[threadIdx.x] = 1.f;
}

// Lane `quits` of each warp returns before the butterfly the others enter.
__global__ void lane_quits(int quits, float* out) {
    if (int(threadIdx.x % 32) == quits) return;
    float v = float(threadIdx.x);
    for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[threadIdx.x] = v;
}

// Every lane's result of each shuffle kind at `width`, and the votes.
__global__ void shuffles(int width, int* xo, int* x16, int* up, int* down, int* idx,
                         unsigned* votes) {
    const int v = int(threadIdx.x) * 10;
    xo[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5, width);
    x16[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 16, width);
    up[threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 3, width);
    down[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3, width);
    idx[threadIdx.x] = __shfl_sync(0xffffffffu, v, 6, width);
    const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
    const int any = __any_sync(0xffffffffu, threadIdx.x == 7);
    const int all = __all_sync(0xffffffffu, threadIdx.x < 32);
    if (threadIdx.x == 0) votes[0] = b, votes[1] = unsigned(any), votes[2] = unsigned(all);
}

// Odd lanes leave; the even ones vote with the full mask (CUDA: the mask's lanes that have not
// exited), and a partial last warp meets at __syncwarp with the full mask.
__global__ void votes_after_exits(unsigned* out) {
    if (threadIdx.x % 2) return;
    const unsigned b = __ballot_sync(0xffffffffu, 1);
    const int all = __all_sync(0xffffffffu, 1);
    __syncwarp();
    const unsigned low = __ballot_sync(0xffffffffu, threadIdx.x < 36);
    if (threadIdx.x == 0) out[0] = b, out[1] = unsigned(all);
    if (threadIdx.x == 32) out[2] = low;
}

// A block sum in shared memory with atomics, then thread 0 reads it after the barrier.
__global__ void shared_sum(const int* in, int* out) {
    GLM5_SHARED_VAR(int, total);
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    atomicAdd(&total, in[blockIdx.x * blockDim.x + threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}

__global__ void big_static_shared(float* out) {
    GLM5_SHARED(float, a, 13000);  // 52 000 bytes: over 48 KiB
    a[threadIdx.x] = 1.f;
    out[0] = a[0];
}

__global__ void uses_dynamic_shared(float* out) {
    GLM5_DYNAMIC_SHARED(float, d);
    d[threadIdx.x] = float(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = d[blockDim.x - 1 - threadIdx.x];
}

__global__ void reads_shared_before_writing(float* out) {
    GLM5_SHARED(float, a, 64);
    out[threadIdx.x] = a[threadIdx.x];
}

__global__ void add_one(float* y, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) y[i] += 1.f;
}

// ---- helpers --------------------------------------------------------------------------------

template <class T>
struct Dev {
    explicit Dev(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
    ~Dev() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
    void put(const std::vector<T>& h) {
        EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    T* p = nullptr;
    size_t n;
};

// Runs `launch` on device 0's legacy stream and returns the fault it caused ("" if none),
// clearing it so the next test finds a working device.
template <class F>
std::string fault_of(F launch) {
    cudaSetDevice(0);
    // The stream's thread may have run the kernel before the launch is checked: the check
    // then reports the fault already, as a GPU's can.
    try {
        launch();
    } catch (const Error&) {
    }
    const cudaError_t e = cudaDeviceSynchronize();
    const std::string f = cudasim::fault(0);
    if (!f.empty()) {
        EXPECT_EQ(e, cudaErrorLaunchFailure) << f;
        // Sticky until cleared, as a GPU's context is.
        EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
        cudasim::clear_fault(0);
    }
    cudaGetLastError();
    return f;
}

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// ---- faults ---------------------------------------------------------------------------------

TEST(CudaSim, ABarrierSomeThreadsNeverReachIsAFaultNamingTheKernelAndBlock) {
    Dev<float> out(128);
    const std::string f = fault_of(
        [&] { GLM5_LAUNCH(divergent_barrier, dim3(2), dim3(128), 0, nullptr, 64, out.p); });
    EXPECT_TRUE(has(f, "kernel divergent_barrier")) << f;
    EXPECT_TRUE(has(f, "block (0,0,0)")) << f;
    EXPECT_TRUE(has(f, "__syncthreads")) << f;
    EXPECT_TRUE(has(f, "exited")) << f;
    // The same kernel with every thread at the barrier runs.
    EXPECT_EQ(fault_of([&] {
                  GLM5_LAUNCH(divergent_barrier, dim3(2), dim3(128), 0, nullptr, 128, out.p);
              }),
              "");
    for (float v : out.get()) EXPECT_EQ(v, 1.f);
}

TEST(CudaSim, ALaneThatNeverJoinsAShuffleIsAFault) {
    Dev<float> out(64);
    const std::string f =
        fault_of([&] { GLM5_LAUNCH(lane_quits, dim3(1), dim3(64), 0, nullptr, 5, out.p); });
    EXPECT_TRUE(has(f, "kernel lane_quits")) << f;
    EXPECT_TRUE(has(f, "__shfl_xor_sync")) << f;
    EXPECT_TRUE(has(f, "lane 5")) << f;
    EXPECT_EQ(fault_of([&] { GLM5_LAUNCH(lane_quits, dim3(1), dim3(64), 0, nullptr, 99, out.p); }),
              "");
    // Each warp's butterfly sums its 32 lanes' thread numbers.
    const std::vector<float> v = out.get();
    EXPECT_EQ(v[0], float(31 * 32 / 2));
    EXPECT_EQ(v[63], float((32 + 63) * 32 / 2));
}

TEST(CudaSim, LanesThatExitedNeedNotJoinACollective) {
    Dev<unsigned> out(3);
    // 40 threads: the second warp has 8 lanes, 4 of them even.
    ASSERT_EQ(
        fault_of([&] { GLM5_LAUNCH(votes_after_exits, dim3(1), dim3(40), 0, nullptr, out.p); }),
        "");
    const auto o = out.get();
    EXPECT_EQ(o[0], 0x55555555u);
    EXPECT_EQ(o[1], 1u);
    EXPECT_EQ(o[2], 0x5u);  // lanes 0 and 2 of the second warp (threads 32, 34)
}

TEST(CudaSim, ShufflesAndVotesFollowPtx) {
    for (int width : {32, 16, 8}) {
        Dev<int> xo(64), x16(64), up(64), down(64), idx(64);
        Dev<unsigned> votes(3);
        ASSERT_EQ(fault_of([&] {
                      GLM5_LAUNCH(shuffles, dim3(1), dim3(64), 0, nullptr, width, xo.p, x16.p, up.p,
                                  down.p, idx.p, votes.p);
                  }),
                  "");
        const auto x = xo.get(), y = x16.get(), u = up.get(), d = down.get(), i = idx.get();
        for (int t = 0; t < 64; ++t) {
            const int lane = t % 32, w0 = t - lane, seg = lane / width * width;
            // The source lane, or the caller's own value where it falls outside the segment
            // (xor may reach into an earlier segment, never a later one: 16 at width 8).
            const int xs = lane ^ 5, ys = lane ^ 16;
            EXPECT_EQ(x[size_t(t)], 10 * (w0 + (xs < seg + width ? xs : lane)))
                << width << " " << t;
            EXPECT_EQ(y[size_t(t)], 10 * (w0 + (ys < seg + width ? ys : lane)))
                << width << " " << t;
            EXPECT_EQ(u[size_t(t)], 10 * (w0 + (lane - 3 >= seg ? lane - 3 : lane))) << width;
            EXPECT_EQ(d[size_t(t)], 10 * (w0 + (lane + 3 < seg + width ? lane + 3 : lane)))
                << width;
            EXPECT_EQ(i[size_t(t)], 10 * (w0 + seg + 6 % width)) << width;
        }
        const auto v = votes.get();
        EXPECT_EQ(v[0], 0x49249249u);  // lanes 0, 3, 6, ..., 30
        EXPECT_EQ(v[1], 1u);
        EXPECT_EQ(v[2], 1u);
    }
}

TEST(CudaSim, SharedMemoryIsTheBlocksAndAtomicsAddUp) {
    std::vector<int> in(4 * 96);
    for (size_t i = 0; i < in.size(); ++i) in[i] = int(i);
    Dev<int> din(in.size()), out(4);
    din.put(in);
    ASSERT_EQ(
        fault_of([&] { GLM5_LAUNCH(shared_sum, dim3(4), dim3(96), 0, nullptr, din.p, out.p); }),
        "");
    const auto o = out.get();
    for (int b = 0; b < 4; ++b) {
        int want = 0;
        for (int i = 0; i < 96; ++i) want += in[size_t(b * 96 + i)];
        EXPECT_EQ(o[size_t(b)], want);
    }
}

TEST(CudaSim, SharedMemoryHoldsNoValuesBeforeTheyAreWritten) {
    Dev<float> out(64);
    ASSERT_EQ(fault_of([&] {
                  GLM5_LAUNCH(reads_shared_before_writing, dim3(1), dim3(64), 0, nullptr, out.p);
              }),
              "");
    for (float v : out.get()) EXPECT_TRUE(std::isnan(v));
}

// ---- the launch limits of sm_90 -------------------------------------------------------------

TEST(CudaSim, LaunchesAGpuWouldRefuseAreRefused) {
    cudaSetDevice(0);
    Dev<float> out(2048);
    cudaGetLastError();
    EXPECT_EQ(cudasim::launch("add_one", add_one, dim3(1), dim3(1025), 0, nullptr, out.p, 1),
              cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudasim::launch("add_one", add_one, dim3(1, 65536), dim3(32), 0, nullptr, out.p, 1),
              cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudasim::launch("add_one", add_one, dim3(1), dim3(2, 2, 65), 0, nullptr, out.p, 1),
              cudaErrorInvalidConfiguration);
    cudaGetLastError();
    // Dynamic shared memory: 48 KiB unless the kernel opts in (up to 227 KiB).
    EXPECT_EQ(cudasim::launch("uses_dynamic_shared", uses_dynamic_shared, dim3(1), dim3(64),
                              49 * 1024, nullptr, out.p),
              cudaErrorInvalidValue);
    cudaGetLastError();
    EXPECT_EQ(cudaFuncSetAttribute(uses_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   228 * 1024),
              cudaErrorInvalidValue);
    cudaGetLastError();
    ASSERT_EQ(cudaFuncSetAttribute(uses_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   100 * 1024),
              cudaSuccess);
    EXPECT_EQ(fault_of([&] {
                  GLM5_LAUNCH(uses_dynamic_shared, dim3(1), dim3(64), 100 * 1024, nullptr, out.p);
              }),
              "");
    const auto o = out.get();
    for (int t = 0; t < 64; ++t) EXPECT_EQ(o[size_t(t)], float(63 - t));
    // Static shared memory over 48 KiB: nvcc would refuse it; here the launch faults.
    const std::string f =
        fault_of([&] { GLM5_LAUNCH(big_static_shared, dim3(1), dim3(32), 0, nullptr, out.p); });
    EXPECT_TRUE(has(f, "static shared memory")) << f;
}

TEST(CudaSim, AKernelGivenAHostAddressFaults) {
    std::vector<float> host(16, 0.f);
    const std::string f =
        fault_of([&] { GLM5_LAUNCH(add_one, dim3(1), dim3(16), 0, nullptr, host.data(), 16); });
    EXPECT_TRUE(has(f, "kernel add_one: argument 0")) << f;
    EXPECT_TRUE(has(f, "not device memory")) << f;
    EXPECT_EQ(host[0], 0.f);  // never ran
}

// ---- memory ---------------------------------------------------------------------------------

TEST(CudaSim, FreshDeviceMemoryIsNaNAndCopiesStayInsideAllocations) {
    cudaSetDevice(0);
    Dev<float> d(100);
    for (float v : d.get()) EXPECT_TRUE(std::isnan(v));
    std::vector<float> h(101, 1.f);
    cudaGetLastError();
    EXPECT_EQ(cudaMemcpy(d.p, h.data(), 101 * sizeof(float), cudaMemcpyHostToDevice),
              cudaErrorInvalidValue);  // one float past the end
    EXPECT_EQ(cudaMemcpy(h.data(), d.p, 100 * sizeof(float), cudaMemcpyHostToDevice),
              cudaErrorInvalidValue);  // the direction says host to device, it is not
    EXPECT_EQ(cudaMemsetAsync(h.data(), 0, 4, nullptr), cudaErrorInvalidValue);
    cudaGetLastError();
}

TEST(CudaSim, TheDevicesMemoryIsBoundedAndItsPeakRecorded) {
    cudaSetDevice(1);
    cudasim::set_device_memory(1, uint64_t(64) << 20);
    const uint64_t base = cudasim::used_bytes(1);
    cudasim::reset_peak(1);
    void* big = nullptr;
    EXPECT_EQ(cudaMalloc(&big, size_t(65) << 20), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
    void* a = nullptr;
    ASSERT_EQ(cudaMalloc(&a, size_t(10) << 20), cudaSuccess);
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    EXPECT_EQ(total, size_t(64) << 20);
    EXPECT_EQ(free, total - base - (size_t(10) << 20));
    cudaFree(a);
    EXPECT_EQ(cudasim::peak_bytes(1), base + (size_t(10) << 20));
    EXPECT_EQ(cudasim::used_bytes(1), base);
    cudasim::set_device_memory(1, uint64_t(1) << 30);
    cudaSetDevice(0);
}

// ---- streams, events, graphs ----------------------------------------------------------------

TEST(CudaSim, StreamsKeepTheirOrderAndCopiesFromPageableMemoryAreStaged) {
    cudaSetDevice(0);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    Dev<float> d(64);
    std::vector<float> h(64, 5.f);
    ASSERT_EQ(cudaMemcpyAsync(d.p, h.data(), 64 * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
    h.assign(64, -1.f);  // staged at the call: the device gets the 5s
    for (int i = 0; i < 3; ++i) GLM5_LAUNCH(add_one, dim3(1), dim3(64), 0, s, d.p, 64);
    std::vector<int> seen;
    auto note = [](void* p) { static_cast<std::vector<int>*>(p)->push_back(1); };
    ASSERT_EQ(cudaLaunchHostFunc(s, note, &seen), cudaSuccess);
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
    EXPECT_EQ(seen.size(), 1u);
    // Into pinned memory a copy is queued; the values are there after synchronising.
    float* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned, d.p, 64 * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(pinned[i], 8.f);
    cudaFreeHost(pinned);
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
}

TEST(CudaSim, ACapturedGraphReplaysItsWork) {
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    Dev<float> d(32);
    d.put(std::vector<float>(32, 0.f));
    cudasim::reset_counts(0);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    GLM5_LAUNCH(add_one, dim3(1), dim3(32), 0, s, d.p, 32);
    GLM5_LAUNCH(add_one, dim3(1), dim3(32), 0, s, d.p, 32);
    cudaGraph_t g;
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    EXPECT_EQ(cudasim::counts(0).kernels, 0u);  // captured, not run
    cudaGraphExec_t x;
    ASSERT_EQ(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(x, s), cudaSuccess);
    cudaStreamSynchronize(s);
    for (float v : d.get()) EXPECT_EQ(v, 6.f);
    const cudasim::Counts c = cudasim::counts(0);
    EXPECT_EQ(c.kernels, 6u);
    EXPECT_EQ(c.graphs, 3u);
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    // A copy from pageable memory cannot be captured: the capture ends invalid.
    std::vector<float> h(32, 1.f);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(d.p, h.data(), 32 * 4, cudaMemcpyHostToDevice, s),
              cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    cudaStreamDestroy(s);
}

// ---- devices --------------------------------------------------------------------------------

TEST(CudaSim, TwoDevicesEachWithItsOwnStreamsAndMemory) {
    ASSERT_GE(cudasim::device_count(), 2);
    cudaSetDevice(1);
    cudaStream_t s1;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    float* on1 = nullptr;
    ASSERT_EQ(cudaMalloc(&on1, 32 * 4), cudaSuccess);
    // A kernel goes to a stream of the current device.
    cudaSetDevice(0);
    cudaGetLastError();
    EXPECT_EQ(cudasim::launch("add_one", add_one, dim3(1), dim3(32), 0, s1, on1, 32),
              cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    // Device 1's memory is not device 0's.
    const std::string f =
        fault_of([&] { GLM5_LAUNCH(add_one, dim3(1), dim3(32), 0, nullptr, on1, 32); });
    EXPECT_TRUE(has(f, "device 1's memory")) << f;
    cudaSetDevice(1);
    cudaFree(on1);
    cudaStreamDestroy(s1);
    cudaSetDevice(0);
}

TEST(CudaSim, ListingDevicesOpensNoContext) {
    const std::vector<int> before = cudasim::contexts();
    std::string why;
    const auto all = backend::cuda::list_devices(&why);
    ASSERT_EQ(all.size(), size_t(cudasim::device_count())) << why;
    EXPECT_EQ(cudasim::contexts(), before);
    EXPECT_TRUE(backend::cuda::simulated());
    EXPECT_NE(all[0].name.find("simulator"), std::string::npos) << all[0].name;
    // Reading one device's free memory opens that device's context alone.
    EXPECT_GT(backend::cuda::device_free_bytes(1), 0u);
    for (int d : cudasim::contexts()) {
        if (std::find(before.begin(), before.end(), d) == before.end()) {
            EXPECT_EQ(d, 1);
        }
    }
}

// GLM5_CUDA_SYNC=1: a kernel's fault is reported by the launch that caused it.
TEST(CudaSim, SynchronousLaunchesNameTheKernelThatFaulted) {
    backend::cuda::Device dev(0);
    backend::Weight w;
    std::vector<float> host(64 * 4, 1.f);
    w.type = quant::Type::F32;
    w.cols = 64;
    w.rows = 4;
    w.row_bytes = 64 * 4;
    w.slice_bytes = w.row_bytes * 4;
    w.data = reinterpret_cast<const uint8_t*>(host.data());
    backend::cuda::Matrix m = dev.upload_matrix(w, "w");
    auto* y = static_cast<float*>(dev.alloc(16, "y"));
    setenv("GLM5_CUDA_SYNC", "1", 1);
    try {
        dev.matmul(m, 0, host.data(), 64, 1, y, 4);  // the tokens are a host address
        ADD_FAILURE() << "a kernel reading host memory ran";
    } catch (const Error& e) {
        EXPECT_TRUE(has(e.what(), "vector_kernel")) << e.what();
        EXPECT_TRUE(has(e.what(), "not device memory")) << e.what();
    }
    unsetenv("GLM5_CUDA_SYNC");
    cudasim::clear_fault(0);
    cudaGetLastError();
    dev.free(y);
    dev.free_matrix(m);
}

// ---- the backend on the simulated devices ------------------------------------------------------

struct OnDevice {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<model::Model> model;
    OnDevice(int ordinal, const std::string& fixture) {
        file = gguf::File::open(test::data_path(fixture));
        be = backend::cuda::make_cuda_backend(ordinal);
        model::LoadOptions lo;
        lo.cache_type = backend::CacheType::F16;
        model = model::load_model(*file, *be, lo);
    }
};

// The last row's logits, or every row's.
std::vector<float> prefill(model::Model& m, const std::vector<int32_t>& tokens, bool all = false) {
    auto st = m.new_state(int64_t(tokens.size()) + 8);
    model::SeqInput in{st.get(), tokens, all};
    std::vector<float> lg;
    m.forward({&in, 1}, lg);
    return lg;
}

// cuda:1, driven from a thread whose current device is 0 (an engine's thread): every entry
// point binds its device, so the second device gives the first's bits.
TEST(CudaSimBackend, TheSecondDeviceFromAnotherThreadGivesTheFirstsBits) {
    for (const std::string fx : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        OnDevice a(0, fx), b(1, fx);
        const std::vector<int32_t> tokens = test::random_ids(12, 40, a.model->info().n_vocab);
        const std::vector<float> on0 = prefill(*a.model, tokens);
        std::vector<float> on1;
        std::thread([&] { on1 = prefill(*b.model, tokens); }).join();
        ASSERT_EQ(on0.size(), on1.size());
        EXPECT_EQ(std::memcmp(on0.data(), on1.data(), on0.size() * sizeof(float)), 0) << fx;
        EXPECT_TRUE(cudasim::fault(0).empty() && cudasim::fault(1).empty());
    }
}

// A step's scratch is one layer's worth: the device's peak during a prefill stays within the
// model's planned scratch (its temporaries are given back op by op, not kept to the end of
// the step), beyond the weights and caches already held.
TEST(CudaSimBackend, AStepsDeviceMemoryStaysWithinThePlannedScratch) {
    for (const std::string fx : {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"}) {
        OnDevice d(0, fx);
        model::Model& m = *d.model;
        const int64_t T = 200;
        const std::vector<int32_t> tokens = test::random_ids(13, T, m.info().n_vocab);
        auto st = m.new_state(T + 8);
        model::SeqInput in{st.get(), tokens, true};
        std::vector<float> lg;
        d.be->sync();
        const uint64_t held = cudasim::used_bytes(0);
        cudasim::reset_peak(0);
        d.be->reset_counters();
        m.forward({&in, 1}, lg);
        d.be->sync();
        const uint64_t step = cudasim::peak_bytes(0) - held;
        const uint64_t plan = m.scratch_bytes(T, T, T + 8);
        const uint64_t scratch = d.be->counters().scratch_peak;
        EXPECT_GT(scratch, 0u);
        EXPECT_LE(scratch, plan) << fx << ": the step held " << scratch
                                 << " bytes of scratch at once, the plan counts " << plan;
        // The arena grows in blocks at least as large as all before them together (the first
        // of 1 MiB), so the device holds at most about twice what a step needs.
        EXPECT_LE(step, 2 * plan + (uint64_t(1) << 20))
            << fx << ": the step took " << step << " bytes of device memory";
    }
}

}  // namespace
}  // namespace glm5

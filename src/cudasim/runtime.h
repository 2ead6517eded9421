// The CUDA runtime as the simulation build sees it: the subset of the CUDA runtime API the
// project calls, with CUDA's names, error codes and stream semantics, executed on the CPU.
// Devices are simulated (two by default, sm_90's limits, a memory size a test can set);
// memory is host memory watched by AddressSanitizer and filled with NaN when fresh; every
// stream runs its work in order on a thread of its own, so work a host reads before it
// has synchronised is a race ThreadSanitizer reports; kernels run block by block, each
// CUDA thread a fiber (device.h).
//
// Nothing here needs a CUDA toolkit: the simulation build compiles the project's .cu files
// with the host compiler against these declarations (include/cuda_runtime.h forwards here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#define CUDART_VERSION 13000

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureImplicit = 906,
};
using cudaError_t = cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

constexpr unsigned cudaStreamDefault = 0;
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0;
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaHostAllocDefault = 0;

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int major, minor;
};

namespace cudasim {
struct Stream;
struct Event;
struct Graph;
struct GraphExec;
}  // namespace cudasim
using cudaStream_t = cudasim::Stream*;
using cudaEvent_t = cudasim::Event*;
using cudaGraph_t = cudasim::Graph*;
using cudaGraphExec_t = cudasim::GraphExec*;
using cudaHostFn_t = void (*)(void*);

// ---- the runtime API (the calls the project makes, CUDA's semantics) ---------------------

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaRuntimeGetVersion(int* v);

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value);
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// ---- the simulator's own controls (tests, the device check's notes) --------------------------
namespace cudasim {

// What the simulated devices are: `GLM5_SIM_DEVICES` of them (2 unless set), each of
// `GLM5_SIM_DEVICE_MEM` bytes (1 GiB unless set; K, M and G suffixes taken), with sm_90's
// limits (1024 threads a block, grids of 2^31-1 x 65535 x 65535 blocks, 48 KiB of shared
// memory a block unless a kernel opts in to up to 227 KiB).
constexpr size_t kSharedDefault = 48 * 1024;
constexpr size_t kSharedOptin = 227 * 1024;
int device_count();
// The memory cudaMemGetInfo reports for device d from now on (what is allocated stays).
void set_device_memory(int d, uint64_t bytes);
// Bytes of device memory in use on d now, and the most in use since the last reset.
uint64_t used_bytes(int d);
uint64_t peak_bytes(int d);
void reset_peak(int d);
// The devices whose context this process has created (cudaSetDevice, an allocation, a
// stream... on it), in order.
std::vector<int> contexts();

// The fault that stopped a kernel on device d ("" if none): which kernel, which block and
// why. Like a GPU's, a fault is sticky: every later call on the device fails until
// clear_fault (the tests of the simulator itself call it; a program exits).
std::string fault(int d);
void clear_fault(int d);

// What ran, counted per device since the last reset_counts: kernel launches (a graph's
// kernels counted as they replay), graph launches, copies between host and device, and the
// times the host waited for a device (synchronisations, copies to pageable memory).
struct Counts {
    uint64_t kernels = 0, graphs = 0, copies = 0, host_waits = 0;
};
Counts counts(int d);
void reset_counts(int d);

}  // namespace cudasim

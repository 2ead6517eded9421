// Measures the machine's memory read bandwidth: every thread of a pool
// streams its share of a buffer far larger than the last-level cache. The
// decode roofline in `glm5 bench` divides bytes of weights per token by it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace glm5 {

class ThreadPool;

// A buffer held for repeated measurements, so that `glm5 bench` can measure
// right after each decode repetition: the bandwidth of a virtual machine
// drifts from minute to minute, and a roofline fraction is only meaningful
// against the bandwidth of the same moment. The buffer is backed by huge
// pages where the system has them, as the model's weights are.
class ReadBandwidth {
  public:
    ReadBandwidth(ThreadPool& pool, size_t bytes);
    ~ReadBandwidth();
    ReadBandwidth(const ReadBandwidth&) = delete;
    ReadBandwidth& operator=(const ReadBandwidth&) = delete;

    size_t bytes() const { return bytes_; }
    // Best of `reps` full reads, in 1e9 bytes per second: each thread reads
    // its share as the weight kernels read a matrix (four interleaved
    // streams, software prefetch 4 KiB ahead).
    double measure(int reps = 3);
    // The same, each thread reading its share front to back as one plain
    // stream of 64-bit loads (no software prefetch): the textbook read,
    // independent of the engine's own access pattern.
    double measure_plain(int reps = 3);

  private:
    double run(int reps, bool plain);

    ThreadPool& pool_;
    uint64_t* buf_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace glm5

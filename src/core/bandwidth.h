// Measures the machine's memory read bandwidth: every thread of a pool
// streams its share of a buffer far larger than the last-level cache. The
// decode roofline in `glm5 bench` divides bytes of weights per token by it.
#pragma once

#include <cstddef>

namespace glm5 {

class ThreadPool;

struct BandwidthResult {
    double gb_per_s = 0;  // best of the repetitions, 1e9 bytes per second
    size_t bytes = 0;     // buffer size
};

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t(1) << 30,
                                       int reps = 5);

}  // namespace glm5

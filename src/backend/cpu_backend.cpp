// The CPU backend: every op parallelised on one persistent thread pool. Each
// output element is computed by exactly one thread with a fixed reduction
// order, so results never depend on the thread count or on how many tokens
// or sequences share a batch. The class lives in cpu_backend.h.
#include "backend/cpu_backend.h"

#include <cstdio>

namespace glm5::backend {

const char* cache_type_name(CacheType t) {
    return t == CacheType::F16 ? "f16" : "f32";
}
size_t cache_elem_size(CacheType t) {
    return t == CacheType::F16 ? 2 : 4;
}

namespace cpu {

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

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt) {
    return std::make_unique<cpu::CpuBackend>(opt);
}

}  // namespace glm5::backend

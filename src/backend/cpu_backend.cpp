// The CPU backend: every op parallelised on one persistent thread pool. Each
// output element is computed by exactly one thread with a fixed reduction
// order, so results never depend on the thread count or on how many tokens
// or sequences share a batch. The class lives in cpu_backend.h.
#include "backend/cpu_backend.h"

namespace glm5::backend {

const char* cache_type_name(CacheType t) {
    return t == CacheType::F16 ? "f16" : "f32";
}
size_t cache_elem_size(CacheType t) {
    return t == CacheType::F16 ? 2 : 4;
}

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt) {
    return std::make_unique<cpu::CpuBackend>(opt);
}

}  // namespace glm5::backend

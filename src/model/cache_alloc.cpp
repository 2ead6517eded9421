#include "model/cache_alloc.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"

namespace glm5::model {

void check_capacity(int64_t rows, int64_t n_past, int64_t n_ctx) {
    if (rows < n_past || rows > n_ctx || rows < 1)
        throw Error("cache size " + std::to_string(rows) + " outside [" +
                    std::to_string(std::max<int64_t>(n_past, 1)) + ", " + std::to_string(n_ctx) +
                    "]");
}

void resize_caches(backend::Backend& be, std::span<const CacheResize> caches) {
    std::vector<backend::DevPtr<uint8_t>> fresh(caches.size());
    try {
        for (size_t i = 0; i < caches.size(); ++i)
            if (caches[i].cache->width)
                fresh[i] = be.alloc_cache(caches[i].cache->row_bytes() * size_t(caches[i].rows));
    } catch (...) {
        for (const backend::DevPtr<uint8_t>& p : fresh)
            if (p) be.free_cache(p);
        throw;
    }
    for (size_t i = 0; i < caches.size(); ++i) {
        backend::CacheRows& c = *caches[i].cache;
        if (!c.width) continue;
        if (c.data) {
            const int64_t keep = std::min(caches[i].keep, caches[i].rows);
            be.copy_cache(fresh[i], c.data, c.row_bytes() * size_t(keep), "resize");
            be.free_cache(c.data);
        }
        c.data = fresh[i];
    }
}

void check_reserved(int64_t needed, int64_t capacity) {
    if (needed > capacity)
        throw Error("the sequence's cache holds " + std::to_string(capacity) +
                    " positions; this pass needs " + std::to_string(needed));
}

}  // namespace glm5::model

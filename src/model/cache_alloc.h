// Sizing a sequence's caches, shared by every architecture's state: the
// checks on a capacity, and reallocating a set of caches all or nothing.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace glm5::model {

// One cache of a state: reallocated to `rows` rows, keeping its first `keep`.
struct CacheResize {
    backend::CacheRows* cache;
    int64_t rows, keep;
};

// Throws unless n_past <= rows <= n_ctx and rows >= 1.
void check_capacity(int64_t rows, int64_t n_past, int64_t n_ctx);

// Reallocates every cache (those of width 0 stay empty). Everything is
// allocated before anything is copied or freed, so a failed allocation
// throws with every cache as it was.
void resize_caches(backend::Backend& be, std::span<const CacheResize> caches);

// A forward or draft writes positions below `needed`; throws unless the
// caches hold them (caches never grow inside a forward).
void check_reserved(int64_t needed, int64_t capacity);

}  // namespace glm5::model

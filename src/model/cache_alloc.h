// Sizing a sequence's caches, shared by every architecture's state: the
// checks on a capacity, and reallocating a set of caches all or nothing; and a
// state's bytes in and out (SequenceState::save / load).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

// Copies the first n rows of `src` into `dst`, a cache of the same width and
// type (SequenceState::copy_prefix); nothing for a cache of width 0.
void copy_rows(backend::Backend& be, const backend::CacheRows& dst, const backend::CacheRows& src,
               int64_t n);

// A forward or draft writes positions below `needed`; throws unless the
// caches hold them (caches never grow inside a forward).
void check_reserved(int64_t needed, int64_t capacity);

// A state's bytes, section by section in a fixed order; each section carries its
// length, so a reader of another shape is refused instead of misread.
class StateWriter {
  public:
    explicit StateWriter(std::vector<uint8_t>& out) : out_(out) {}
    void scalar(int64_t v);
    void host(const void* data, size_t bytes);
    // The first n rows of a cache (nothing for a cache of width 0).
    void rows(backend::Backend& be, const backend::CacheRows& c, int64_t n);
    void device(backend::Backend& be, backend::DevPtr<const uint8_t> p, size_t bytes);

  private:
    std::vector<uint8_t>& out_;
};

class StateReader {
  public:
    explicit StateReader(std::span<const uint8_t> in) : in_(in) {}
    int64_t scalar();
    void host(void* data, size_t bytes);
    void rows(backend::Backend& be, const backend::CacheRows& c, int64_t n);
    void device(backend::Backend& be, backend::DevPtr<uint8_t> p, size_t bytes);
    bool at_end() const { return at_ == in_.size(); }

  private:
    std::span<const uint8_t> section(size_t bytes);
    std::span<const uint8_t> in_;
    size_t at_ = 0;
};

}  // namespace glm5::model

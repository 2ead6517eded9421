#include "model/cache_alloc.h"

#include <cstring>

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

void copy_rows(backend::Backend& be, const backend::CacheRows& dst, const backend::CacheRows& src,
               int64_t n) {
    if (!dst.width || n <= 0) return;
    if (dst.width != src.width || dst.type != src.type || !src.data)
        throw Error("copy_prefix: the caches differ in shape");
    be.copy_cache(dst.data, src.data, dst.row_bytes() * size_t(n), "copy_prefix");
}

void check_reserved(int64_t needed, int64_t capacity) {
    if (needed > capacity)
        throw Error("the sequence's cache holds " + std::to_string(capacity) +
                    " positions; this pass needs " + std::to_string(needed));
}

void StateWriter::scalar(int64_t v) {
    host(&v, sizeof(v));
}

void StateWriter::host(const void* data, size_t bytes) {
    const uint64_t n = bytes;
    const auto* b = reinterpret_cast<const uint8_t*>(&n);
    out_.insert(out_.end(), b, b + sizeof(n));
    const auto* d = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), d, d + bytes);
}

void StateWriter::rows(backend::Backend& be, const backend::CacheRows& c, int64_t n) {
    device(be, c.data, c.width ? size_t(n) * c.row_bytes() : 0);
}

void StateWriter::device(backend::Backend& be, backend::DevPtr<const uint8_t> p, size_t bytes) {
    const uint64_t len = bytes;
    const auto* b = reinterpret_cast<const uint8_t*>(&len);
    out_.insert(out_.end(), b, b + sizeof(len));
    const size_t at = out_.size();
    out_.resize(at + bytes);
    if (bytes) be.read_bytes(p, out_.data() + at, bytes);
}

std::span<const uint8_t> StateReader::section(size_t bytes) {
    uint64_t len = 0;
    if (in_.size() - at_ < sizeof(len)) throw Error("state: the saved bytes end early");
    std::memcpy(&len, in_.data() + at_, sizeof(len));
    at_ += sizeof(len);
    if (len != bytes)
        throw Error("state: a section holds " + std::to_string(len) +
                    " bytes where this model's "
                    "state has " +
                    std::to_string(bytes) + " (another model or cache type)");
    if (in_.size() - at_ < bytes) throw Error("state: the saved bytes end early");
    const std::span<const uint8_t> s = in_.subspan(at_, bytes);
    at_ += bytes;
    return s;
}

int64_t StateReader::scalar() {
    int64_t v = 0;
    host(&v, sizeof(v));
    return v;
}

void StateReader::host(void* data, size_t bytes) {
    const auto s = section(bytes);
    if (bytes) std::memcpy(data, s.data(), bytes);
}

void StateReader::rows(backend::Backend& be, const backend::CacheRows& c, int64_t n) {
    device(be, c.data, c.width ? size_t(n) * c.row_bytes() : 0);
}

void StateReader::device(backend::Backend& be, backend::DevPtr<uint8_t> p, size_t bytes) {
    const auto s = section(bytes);
    if (bytes) be.write_bytes(p, s.data(), bytes);
}

}  // namespace glm5::model

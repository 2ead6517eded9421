// A read-only memory-mapped file. Weights are served in place from the
// mapping, so a model's tensors stay file-backed unless asked otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace glm5 {

class MappedFile {
  public:
    MappedFile() = default;
    // Throws glm5::Error naming the path when the file cannot be opened or mapped.
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

    // Ask the kernel to read the whole mapping ahead (used before benchmarks).
    void prefetch() const;

  private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// Drops the pages wholly inside [p, p + n) of a read-only file mapping from this process's
// memory (they are read again from the file if touched): a tool that streams through a
// mapped file once keeps its resident size small. Pages partly outside are kept.
void release_mapped_pages(const void* p, size_t n);

// Anonymous memory in whole pages (transparent huge pages asked for), filled once by
// `fill` and read-only from then on, unmapped when destroyed: a copy of weights that
// the process owns (--no-mmap, a backend's repacked layout).
class SealedPages {
  public:
    // Throws ResourceError naming `what` when the memory cannot be had.
    SealedPages(size_t bytes, const std::string& what, const std::function<void(uint8_t*)>& fill);
    ~SealedPages();
    SealedPages(const SealedPages&) = delete;
    SealedPages& operator=(const SealedPages&) = delete;
    SealedPages(SealedPages&& o) noexcept;
    SealedPages& operator=(SealedPages&&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }  // whole pages
    // The bytes `bytes` of content take in whole pages.
    static size_t rounded(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

  private:
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace glm5

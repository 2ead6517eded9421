// A read-only memory-mapped file. Weights are served in place from the
// mapping, so a model's tensors stay file-backed unless asked otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace glm5

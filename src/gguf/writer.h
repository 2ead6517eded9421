// GGUF writer (version 3). Metadata is kept in insertion order; tensor data is
// produced on demand while writing, so multi-GB models never sit in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/types.h"

namespace glm5::gguf {

class Writer {
  public:
    explicit Writer(uint32_t alignment = 32);

    // Setting an existing key replaces its value in place.
    void set(const std::string& key, Value v);
    void set_u32(const std::string& key, uint32_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set_f32(const std::string& key, float v);
    void set_bool(const std::string& key, bool v);
    void set_string(const std::string& key, const std::string& v);
    void set_array_string(const std::string& key, const std::vector<std::string>& v);
    void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
    void set_array_u32(const std::string& key, const std::vector<uint32_t>& v);
    void set_array_f32(const std::string& key, const std::vector<float>& v);
    void set_array_bool(const std::string& key, const std::vector<bool>& v);

    // `fill` is called once during write() with a buffer of exactly
    // row_size(type, ne[0]) * rows bytes to fill with the tensor's data.
    using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;
    void add_tensor(const std::string& name, quant::Type type, std::vector<int64_t> ne, Fill fill);
    // Like add_tensor, for a tensor too large to hold whole: `fill` is called for
    // consecutive pieces of whole rows, at most max_piece_bytes each (one row at least),
    // with the piece's byte offset within the tensor; progress is reported after each.
    using FillPiece = std::function<void(uint8_t* dst, size_t offset, size_t nbytes)>;
    void add_tensor_pieces(const std::string& name, quant::Type type, std::vector<int64_t> ne,
                           size_t max_piece_bytes, FillPiece fill);
    // Convenience: copies the bytes given.
    void add_tensor_bytes(const std::string& name, quant::Type type, std::vector<int64_t> ne,
                          const void* data, size_t nbytes);

    size_t n_tensors() const { return tensors_.size(); }

    // Writes the file (to path + ".tmp", then renames, so a failed write never
    // leaves a half file under the real name). Throws glm5::Error.
    // `progress(done_bytes, total_bytes)` is called after each tensor.
    void write(const std::string& path,
               const std::function<void(uint64_t, uint64_t)>& progress = nullptr) const;

    // Writes a split model the way llama.cpp's gguf-split does:
    // PREFIX-00001-of-0000N.gguf ... with all metadata in the first shard and
    // split.no (u16, 0-based) / split.count (u16) / split.tensors.count (i32)
    // in every shard. A new shard starts before a tensor that would take the
    // current one past max_bytes of tensor data or max_tensors tensors (0 = no
    // limit; a shard always takes at least one tensor). `prefix` may also be
    // given as a path ending in ".gguf", which is dropped. Returns the paths.
    struct SplitLimits {
        uint64_t max_bytes = 0;
        size_t max_tensors = 0;
        // Or the shards given: shard i starts at tensor starts[i] (starts[0] == 0), the
        // limits above unused (llama-quantize --keep-split: the input's shards).
        std::vector<size_t> starts;
    };
    std::vector<std::string> write_split(
        const std::string& prefix, const SplitLimits& limits,
        const std::function<void(uint64_t, uint64_t)>& progress = nullptr) const;

  private:
    struct PendingTensor {
        std::string name;
        quant::Type type;
        std::vector<int64_t> ne;
        size_t nbytes;
        size_t piece_bytes;  // whole rows; nbytes for a tensor filled at once
        FillPiece fill;
    };
    uint32_t alignment_;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<PendingTensor> tensors_;

    using Progress = std::function<void(uint64_t, uint64_t)>;
    struct ProgressState {
        const Progress* fn;
        uint64_t done, total;
    };
    void write_file(const std::string& path, const std::vector<std::pair<std::string, Value>>& kv,
                    size_t first_tensor, size_t end_tensor, ProgressState& progress) const;
};

}  // namespace glm5::gguf

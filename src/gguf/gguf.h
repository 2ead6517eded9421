// GGUF reader: versions 2 and 3, every metadata type, split models, tensors
// served in place from a read-only mapping. Every field is validated before
// use; a bad file raises glm5::gguf::FormatError naming the file, the field
// and its byte offset. No input makes it read out of bounds.
//
// Policy where the format leaves room: general.alignment may be any integer
// type (ggml insists on U32) but must be a nonzero power of two; tensors may
// leave gaps and come in any order, but two tensors sharing bytes are refused
// (ggml demands a packed layout, which rules that out too); keys are at most
// 65535 bytes and tensor names 64 (the spec's limits); arrays nest at most 8
// deep and one file's metadata takes at most 512 MiB of memory (arrays stored
// compactly).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/mmap_file.h"
#include "quant/types.h"

namespace glm5::gguf {

class FormatError : public glm5::Error {
  public:
    using glm5::Error::Error;
};

enum class ValueType : uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Arrays may nest (an array of arrays). Arrays read from a
// file are stored compactly: scalars packed as in the file (2^24 one-byte
// values take 16 MiB, not 2^24 Value objects), strings in one buffer; arrays
// built in code (make_array) keep their items as given.
class Value {
  public:
    Value() = default;
    static Value make_uint(ValueType t, uint64_t v);
    static Value make_int(ValueType t, int64_t v);
    static Value make_float(ValueType t, double v);
    static Value make_bool(bool v);
    static Value make_string(std::string v);
    static Value make_array(ValueType elem_type, std::vector<Value> items);
    // Compact arrays: `raw` holds n scalars of elem_type as the file stores them
    // (booleans already checked to be 0 or 1); `data` holds n strings back to
    // back, string k ending at ends[k].
    static Value make_packed_array(ValueType elem_type, std::vector<uint8_t> raw, size_t n);
    static Value make_string_array(std::string data, std::vector<uint64_t> ends);

    ValueType type() const { return type_; }
    bool is_integer() const;  // U8..I64 (not BOOL)
    bool is_float() const { return type_ == ValueType::F32 || type_ == ValueType::F64; }

    // Checked access: nullopt when the type does not fit (a negative value
    // asked as unsigned, a string asked as a number...).
    std::optional<uint64_t> as_uint() const;
    std::optional<int64_t> as_int() const;
    std::optional<double> as_float() const;  // integers convert too
    std::optional<bool> as_bool() const;
    const std::string* as_string() const;

    // Arrays. Elements come back by value (they may not exist as Value objects);
    // string_at reads a string element in place (nullopt when it is no string).
    bool is_array() const { return type_ == ValueType::ARRAY; }
    ValueType array_type() const { return elem_type_; }
    size_t size() const;
    Value operator[](size_t i) const;
    std::optional<std::string_view> string_at(size_t i) const;
    std::vector<Value> items() const;  // every element (a copy)

    // Heap and inline bytes this value holds (metadata memory accounting).
    size_t memory_bytes() const;

    // A short human-readable rendering (arrays abbreviated) for `inspect`.
    std::string to_display(size_t max_items = 8) const;

  private:
    enum class Store : uint8_t { Items, Packed, Strings };
    ValueType type_ = ValueType::U32;
    ValueType elem_type_ = ValueType::U32;
    Store store_ = Store::Items;
    uint64_t u_ = 0;
    int64_t i_ = 0;
    double f_ = 0;
    size_t n_ = 0;                // Packed / Strings: element count
    std::string s_;               // a string, or Strings' buffer
    std::vector<uint8_t> raw_;    // Packed elements
    std::vector<uint64_t> ends_;  // Strings: end of each element in s_
    std::vector<Value> items_;    // Items
};

struct TensorInfo {
    std::string name;
    quant::Type type = quant::Type::F32;
    int n_dims = 0;
    std::array<int64_t, 4> ne{1, 1, 1, 1};  // ggml order: ne[0] is contiguous
    uint64_t offset = 0;                    // within its shard's data section
    size_t nbytes = 0;
    int shard = 0;                  // which split file holds it
    const uint8_t* data = nullptr;  // in the read-only mapping

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    size_t row_bytes() const { return quant::row_size(type, ne[0]); }
    std::string shape_string() const;  // "[64, 32, 4]"
};

// Split models follow llama.cpp's gguf-split naming: PREFIX-00001-of-00003.gguf
// (1-based shard number, 5 digits each). split_shard_path builds one name;
// parse_split_path recognises one (nullopt when the path is not a shard name).
struct SplitName {
    std::string prefix;  // "dir/model" for "dir/model-00002-of-00003.gguf"
    int index = 0;       // 1-based
    int count = 0;
};
std::string split_shard_path(const std::string& prefix, int index, int count);
std::optional<SplitName> parse_split_path(const std::string& path);

constexpr size_t kDefaultMaxMetadataBytes = size_t(512) << 20;

struct OpenOptions {
    // Open NAME-00001-of-0000N.gguf's siblings too (the default).
    bool load_splits = true;
    // Memory one file's metadata may take (Value::memory_bytes, strings and
    // packed arrays); a file needing more is refused.
    size_t max_metadata_bytes = kDefaultMaxMetadataBytes;
};

class File {
  public:
    // Maps and validates a GGUF file (and, for a split model given by its first
    // shard, every other shard). Throws FormatError / glm5::Error.
    static std::unique_ptr<File> open(const std::string& path, const OpenOptions& opt = {});

    // Parses a GGUF image already in memory (no copies are kept of tensor
    // data: `data` must outlive the File). Used by the fuzzer and tests.
    static std::unique_ptr<File> parse_memory(const uint8_t* data, size_t size,
                                              const std::string& name,
                                              size_t max_metadata_bytes = kDefaultMaxMetadataBytes);

    ~File();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    int n_shards() const { return int(shard_paths_.size()); }
    const std::vector<std::string>& shard_paths() const { return shard_paths_; }
    uint64_t total_file_bytes() const { return total_file_bytes_; }

    // Metadata in file order (first shard's keys; split.* keys included).
    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;

    // Typed getters: throw FormatError naming the key when the key is missing
    // (for the variants without a default) or has a type that does not fit.
    uint64_t get_uint(std::string_view key) const;
    uint64_t get_uint(std::string_view key, uint64_t dflt) const;
    double get_float(std::string_view key) const;
    double get_float(std::string_view key, double dflt) const;
    bool get_bool(std::string_view key, bool dflt) const;
    std::string get_string(std::string_view key) const;
    std::string get_string(std::string_view key, const std::string& dflt) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

    // Hint the OS to read every mapped shard ahead.
    void prefetch() const;

  private:
    File() = default;
    friend class Parser;
    [[noreturn]] void type_error(std::string_view key, const char* expected) const;

    std::string path_;
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    uint64_t total_file_bytes_ = 0;
    std::vector<std::string> shard_paths_;
    std::vector<MappedFile> maps_;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<uint64_t> kv_offsets_;  // byte offset of each value, for error messages
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace glm5::gguf

// A bounded little-endian reader over one GGUF image. Every read checks the
// remaining length first and throws FormatError naming the file, the field
// being read and its byte offset, so no input can make the parser read past
// the end. Field names are built lazily (a callable) because the happy path
// reads millions of array elements and must not format a string for each.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "gguf/gguf.h"

namespace glm5::gguf {

class Cursor {
  public:
    Cursor(const uint8_t* data, size_t size, const std::string& file)
        : data_(data), size_(size), file_(file) {}

    uint64_t pos() const { return pos_; }
    uint64_t size() const { return size_; }
    uint64_t remaining() const { return size_ - pos_; }
    const std::string& file() const { return file_; }

    // "FILE: FIELD at byte OFFSET: WHAT"
    [[noreturn]] void fail(const std::string& field, uint64_t at, const std::string& what) const {
        throw FormatError(file_ + ": " + field + " at byte " + std::to_string(at) + ": " + what);
    }

    template <class FieldFn>
    void need(uint64_t n, FieldFn&& field) const {
        if (n > remaining())
            fail(field(), pos_,
                 "truncated: needs " + std::to_string(n) + " bytes but only " +
                     std::to_string(remaining()) + " remain (file size " + std::to_string(size_) +
                     ")");
    }

    template <class T, class FieldFn>
    T read(FieldFn&& field) {
        static_assert(std::is_trivially_copyable_v<T>);
        need(sizeof(T), field);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));  // GGUF is little-endian, like the host
        pos_ += sizeof(T);
        return v;
    }

    // A GGUF string: u64 length, then that many bytes. `max_len` bounds what
    // the format allows; both limits are checked before anything is allocated.
    template <class FieldFn>
    std::string read_string(uint64_t max_len, FieldFn&& field) {
        const uint64_t at = pos_;
        const uint64_t n = read<uint64_t>(field);
        if (n > max_len)
            fail(field(), at,
                 "string length " + std::to_string(n) + " exceeds the limit of " +
                     std::to_string(max_len));
        if (n > remaining())
            fail(field(), at,
                 "string length " + std::to_string(n) + " runs past the end of the file (" +
                     std::to_string(remaining()) + " bytes remain)");
        std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
        pos_ += n;
        return s;
    }

    // The next n bytes, in place (the caller copies what it keeps).
    template <class FieldFn>
    const uint8_t* take(uint64_t n, FieldFn&& field) {
        need(n, field);
        const uint8_t* p = data_ + pos_;
        pos_ += n;
        return p;
    }

  private:
    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& file_;
};

}  // namespace glm5::gguf

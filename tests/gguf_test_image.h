// Hand-built GGUF images for the reader tests: every field's byte offset is
// recorded under the name the reader uses in its error messages, so a test
// can corrupt exactly one field and check that the error names it and its
// offset. Kept independent of gguf::Writer so the reader is checked against a
// second encoder.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace glm5::gguf::test {

struct Image {
    std::vector<uint8_t> bytes;
    std::map<std::string, size_t> at;  // field name -> byte offset

    void mark(const std::string& field) { at[field] = bytes.size(); }
    template <class T>
    void put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), p, p + sizeof(T));
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    void pad_to(size_t alignment) {
        while (bytes.size() % alignment) bytes.push_back(0);
    }
    size_t offset(const std::string& field) const { return at.at(field); }
    template <class T>
    void patch(const std::string& field, T v, size_t extra = 0) {
        std::memcpy(bytes.data() + offset(field) + extra, &v, sizeof(T));
    }
};

// Value type ids and tensor type ids as stored in the file.
enum : uint32_t {
    kU8 = 0,
    kI8,
    kU16,
    kI16,
    kU32,
    kI32,
    kF32,
    kBool,
    kString,
    kArray,
    kU64,
    kI64,
    kF64
};
enum : uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ8_0 = 8 };

// A small valid image:
//   kv[0] general.architecture = "test"
//   kv[1] general.alignment    = U32 alignment
//   kv[2] test.u8s             = [U8: 1, 2, 3]
//   kv[3] test.str             = [STRING: "a", "bc"]
//   kv[4] test.nst             = [ARRAY: [I32: 1, 2], [I32: 3]]
//   kv[5] test.flg             = BOOL true
//   tensor_infos[0] "a" F32  [4, 2]   offset 0    (32 bytes)
//   tensor_infos[1] "b" Q8_0 [32, 2]  offset A    (68 bytes)
//   tensor_infos[2] "c" F16  [8]      offset 2A.. (16 bytes), last in the file
// The keys of kv[2..5] all have 8 bytes so one can be renamed into another.
inline Image make_image(uint32_t version = 3, uint32_t alignment = 32) {
    Image im;
    im.mark("magic");
    im.bytes.insert(im.bytes.end(), {'G', 'G', 'U', 'F'});
    im.mark("version");
    im.put<uint32_t>(version);
    im.mark("n_tensors");
    im.put<uint64_t>(3);
    im.mark("n_kv");
    im.put<uint64_t>(6);

    auto key = [&](int i, const std::string& k, uint32_t type) {
        const std::string f = "kv[" + std::to_string(i) + "]";
        im.mark(f + ".key");
        im.str(k);
        im.mark(f + ".type");
        im.put<uint32_t>(type);
        im.mark(f + ".value");
    };
    auto array_head = [&](int i, uint32_t et, uint64_t n) {
        const std::string f = "kv[" + std::to_string(i) + "]";
        im.mark(f + ".array_type");
        im.put<uint32_t>(et);
        im.mark(f + ".array_length");
        im.put<uint64_t>(n);
        im.mark(f + ".items");
    };
    key(0, "general.architecture", kString);
    im.str("test");
    key(1, "general.alignment", kU32);
    im.put<uint32_t>(alignment);
    key(2, "test.u8s", kArray);
    array_head(2, kU8, 3);
    for (uint8_t v : {1, 2, 3}) im.put<uint8_t>(v);
    key(3, "test.str", kArray);
    array_head(3, kString, 2);
    im.str("a");
    im.str("bc");
    key(4, "test.nst", kArray);
    array_head(4, kArray, 2);
    im.mark("kv[4].items[0]");
    im.put<uint32_t>(kI32);
    im.put<uint64_t>(2);
    im.put<int32_t>(1);
    im.put<int32_t>(2);
    im.mark("kv[4].items[1]");
    im.put<uint32_t>(kI32);
    im.put<uint64_t>(1);
    im.put<int32_t>(3);
    key(5, "test.flg", kBool);
    im.put<uint8_t>(1);

    struct T {
        const char* name;
        uint32_t type;
        std::vector<uint64_t> ne;
        size_t nbytes;
    };
    const T ts[3] = {
        {"a", kTypeF32, {4, 2}, 32}, {"b", kTypeQ8_0, {32, 2}, 68}, {"c", kTypeF16, {8}, 16}};
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (int i = 0; i < 3; ++i) {
        const std::string f = "tensor_infos[" + std::to_string(i) + "]";
        im.mark(f + ".name");
        im.str(ts[i].name);
        im.mark(f + ".n_dims");
        im.put<uint32_t>(uint32_t(ts[i].ne.size()));
        for (size_t j = 0; j < ts[i].ne.size(); ++j) {
            im.mark(f + ".ne[" + std::to_string(j) + "]");
            im.put<uint64_t>(ts[i].ne[j]);
        }
        im.mark(f + ".type");
        im.put<uint32_t>(ts[i].type);
        im.mark(f + ".offset");
        im.put<uint64_t>(off);
        offsets.push_back(off);
        off += (ts[i].nbytes + alignment - 1) / alignment * alignment;
    }
    im.mark("tensor_infos.end");
    im.pad_to(alignment);
    im.mark("data");
    const size_t data = im.bytes.size();
    for (int i = 0; i < 3; ++i) {
        im.bytes.resize(data + offsets[size_t(i)], 0);
        for (size_t k = 0; k < ts[i].nbytes; ++k) im.bytes.push_back(uint8_t(17 * i + k));
    }
    return im;
}

}  // namespace glm5::gguf::test

// The reader refuses every class of malformed GGUF with a FormatError that
// names the file, the field and its byte offset; it never crashes, reads out
// of bounds or allocates without bound, on any input.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf_test_image.h"

namespace fs = std::filesystem;
using namespace glm5::gguf;
using glm5::gguf::test::Image;
using glm5::gguf::test::make_image;

namespace {

// Parses `im` and requires a FormatError whose message names the file and
// contains every one of `parts` (field names, offsets, explanations).
void expect_error(const Image& im, const std::vector<std::string>& parts) {
    try {
        File::parse_memory(im.bytes.data(), im.bytes.size(), "bad.gguf");
        ADD_FAILURE() << "parsed without error; expected " << ::testing::PrintToString(parts);
    } catch (const FormatError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
        for (const auto& p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    }
}

std::string at(const Image& im, const std::string& field) {
    return "at byte " + std::to_string(im.offset(field));
}

}  // namespace

TEST(GgufMalformed, BaselineImageParses) {
    for (uint32_t version : {2u, 3u})
        for (uint32_t align : {8u, 32u, 64u}) {
            const Image im = make_image(version, align);
            const auto f = File::parse_memory(im.bytes.data(), im.bytes.size(), "ok.gguf");
            EXPECT_EQ(f->version(), version);
            EXPECT_EQ(f->alignment(), align);
            ASSERT_EQ(f->tensors().size(), 3u);
            EXPECT_EQ(f->tensors()[1].nbytes, 68u);
            EXPECT_EQ(f->tensors()[2].data + 16, im.bytes.data() + im.bytes.size());
            ASSERT_NE(f->find("test.nst"), nullptr);
            EXPECT_EQ(*(*f->find("test.nst"))[1][0].as_int(), 3);
        }
}

TEST(GgufMalformed, TruncatedAnywhere) {
    // The image ends with the last tensor's bytes, so every proper prefix is invalid.
    const Image im = make_image();
    for (size_t n = 0; n < im.bytes.size(); ++n) {
        try {
            File::parse_memory(im.bytes.data(), n, "cut.gguf");
            ADD_FAILURE() << "prefix of " << n << " bytes parsed";
        } catch (const FormatError& e) {
            const std::string msg = e.what();
            EXPECT_TRUE(msg.find("truncated") != std::string::npos ||
                        msg.find("past the end") != std::string::npos ||
                        msg.find("cannot fit") != std::string::npos)
                << msg;
        }
    }
    // A cut inside a specific field names that field.
    Image cut = im;
    cut.bytes.resize(im.offset("kv[3].items") + 9 + 8 + 1);  // inside "bc"
    cut.patch<uint64_t>("n_tensors", 0);  // else the up-front count check refuses it first
    expect_error(cut, {"kv[3] 'test.str'.value[1]", "string length 2 runs past the end"});
    cut = im;
    cut.bytes.resize(im.offset("tensor_infos[1].offset") + 3);
    expect_error(cut,
                 {"tensor_infos[1] 'b'.offset", at(im, "tensor_infos[1].offset"), "truncated"});
}

TEST(GgufMalformed, BadMagic) {
    Image im = make_image();
    im.bytes[1] = 'X';
    expect_error(im, {"magic at byte 0", "not a GGUF file", "GXUF"});
}

TEST(GgufMalformed, BadVersion) {
    for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
        Image im = make_image();
        im.patch<uint32_t>("version", v);
        expect_error(im, {"version at byte 4", v == 0x03000000u ? "big-endian" : "version"});
    }
}

TEST(GgufMalformed, HugeCountsNeverAllocate) {
    // 2^60 of anything must be refused from the byte count alone, quickly.
    const auto t0 = std::chrono::steady_clock::now();
    Image im = make_image();
    im.patch<uint64_t>("n_tensors", uint64_t(1) << 60);
    expect_error(im, {"n_tensors at byte 8", "cannot fit"});
    im = make_image();
    im.patch<uint64_t>("n_kv", uint64_t(1) << 60);
    expect_error(im, {"n_kv at byte 16", "cannot fit"});
    im = make_image();
    im.patch<uint64_t>("n_kv", ~uint64_t(0));
    expect_error(im, {"n_kv at byte 16"});
    // Counts that fit alone but not together.
    im = make_image();
    const uint64_t rem = im.bytes.size() - 24;
    im.patch<uint64_t>("n_tensors", rem / 32);
    im.patch<uint64_t>("n_kv", rem / 13);
    expect_error(im, {"n_kv at byte 16", "cannot fit"});
    // Array lengths.
    im = make_image();
    im.patch<uint64_t>("kv[2].array_length", uint64_t(1) << 60);
    expect_error(
        im, {"kv[2] 'test.u8s'.value.array_length", at(im, "kv[2].array_length"), "cannot fit"});
    im = make_image();
    im.patch<uint64_t>("kv[3].array_length", im.bytes.size() / 8);  // strings need >= 8 bytes each
    expect_error(im, {"kv[3] 'test.str'.value.array_length", "cannot fit"});
    im = make_image();
    im.patch<uint64_t>("kv[4].items[0]", uint64_t(1) << 62, 4);  // inner array length
    expect_error(im, {"kv[4] 'test.nst'.value[0].array_length", "cannot fit"});
    // String lengths.
    im = make_image();
    im.patch<uint64_t>("kv[0].value", uint64_t(1) << 60);
    expect_error(im,
                 {"kv[0] 'general.architecture'.value", at(im, "kv[0].value"), "string length"});
    im = make_image();
    im.patch<uint64_t>("kv[3].items", ~uint64_t(0));
    expect_error(im, {"kv[3] 'test.str'.value[0]", "string length"});
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 1.0);
}

TEST(GgufMalformed, AbsurdKeyAndNameLengths) {
    Image im = make_image();
    im.patch<uint64_t>("kv[1].key", 70000);
    expect_error(im, {"kv[1].key", at(im, "kv[1].key"), "exceeds the limit of 65535"});
    im = make_image();
    im.patch<uint64_t>("kv[1].key", uint64_t(1) << 40);
    expect_error(im, {"kv[1].key", "exceeds the limit"});
    im = make_image();
    im.patch<uint64_t>("kv[2].key", 0);  // an empty key
    expect_error(im, {"kv[2].key", "empty key"});
    im = make_image();
    im.patch<uint64_t>("tensor_infos[0].name", 65);
    expect_error(
        im, {"tensor_infos[0].name", at(im, "tensor_infos[0].name"), "exceeds the limit of 64"});
}

TEST(GgufMalformed, UnknownValueTypes) {
    Image im = make_image();
    im.patch<uint32_t>("kv[5].type", 13);
    expect_error(im, {"kv[5] 'test.flg'.type", at(im, "kv[5].type"), "unknown value type 13"});
    im = make_image();
    im.patch<uint32_t>("kv[2].array_type", 0xFFFFFFFFu);
    expect_error(im, {"kv[2] 'test.u8s'.value.array_type", at(im, "kv[2].array_type"),
                      "unknown array element type"});
    im = make_image();
    im.patch<uint32_t>("kv[4].items[1]", 77);  // inner array's element type
    expect_error(im, {"kv[4] 'test.nst'.value[1].array_type", at(im, "kv[4].items[1]")});
    im = make_image();
    im.patch<uint8_t>("kv[5].value", 2);
    expect_error(im, {"kv[5] 'test.flg'.value", at(im, "kv[5].value"), "bool value 2"});
}

TEST(GgufMalformed, NestingTooDeep) {
    // kv: "deep" = ARRAY of ARRAY of ... (depth d), innermost U8[0].
    auto build = [](int depth) {
        Image im;
        im.bytes = {'G', 'G', 'U', 'F'};
        im.put<uint32_t>(3);
        im.put<uint64_t>(0);
        im.put<uint64_t>(1);
        im.str("deep");
        im.put<uint32_t>(test::kArray);
        for (int d = 0; d < depth - 1; ++d) {
            im.put<uint32_t>(test::kArray);
            im.put<uint64_t>(1);
        }
        im.put<uint32_t>(test::kU8);
        im.put<uint64_t>(0);
        return im;
    };
    const Image ok = build(8);
    const auto f = File::parse_memory(ok.bytes.data(), ok.bytes.size(), "ok.gguf");
    EXPECT_EQ(f->find("deep")->to_display(), "[[[[[[[[]]]]]]]]");
    expect_error(build(9),
                 {"kv[0] 'deep'.value[0][0][0][0][0][0][0].array_type", "nested more than 8"});
    expect_error(build(100000), {"nested more than 8"});
}

TEST(GgufMalformed, DuplicateKey) {
    Image im = make_image();
    std::memcpy(im.bytes.data() + im.offset("kv[4].key") + 8, "test.u8s", 8);
    expect_error(im, {"kv[4].key", at(im, "kv[4].key"), "duplicate key 'test.u8s'", "kv[2]"});
}

TEST(GgufMalformed, BadAlignment) {
    for (uint32_t a : {0u, 48u, 3u, 0x80000001u}) {
        Image im = make_image();
        im.patch<uint32_t>("kv[1].value", a);
        expect_error(im,
                     {"general.alignment", at(im, "kv[1].value"), "not a nonzero power of two"});
    }
    Image im = make_image();
    im.patch<uint32_t>("kv[1].type", test::kF32);
    expect_error(im, {"general.alignment", "must be an unsigned integer"});
}

TEST(GgufMalformed, UnknownTensorType) {
    for (uint32_t t : {4u, 5u, 31u, 39u, 1000u}) {  // 4, 5: removed Q4_2/Q4_3
        Image im = make_image();
        im.patch<uint32_t>("tensor_infos[1].type", t);
        expect_error(im, {"tensor_infos[1] 'b'.type", at(im, "tensor_infos[1].type"),
                          "unknown tensor type id " + std::to_string(t)});
    }
}

TEST(GgufMalformed, BadDimensions) {
    for (uint32_t n : {0u, 5u, 0xFFFFFFFFu}) {
        Image im = make_image();
        im.patch<uint32_t>("tensor_infos[1].n_dims", n);
        expect_error(
            im, {"tensor_infos[1] 'b'.n_dims", at(im, "tensor_infos[1].n_dims"), "not in [1, 4]"});
    }
    Image im = make_image();
    im.patch<int64_t>("tensor_infos[1].ne[1]", -2);
    expect_error(im, {"tensor_infos[1] 'b'.ne[1]", at(im, "tensor_infos[1].ne[1]"), "negative"});
    im = make_image();
    im.patch<int64_t>("tensor_infos[1].ne[1]", int64_t(1) << 60);  // 32 * 2^60 overflows int64
    expect_error(im, {"tensor_infos[1] 'b'.ne[1]",
                      "the dimensions of shape [32, 1152921504606846976] multiply past int64"});
    // A zero dimension makes the element count 0, but users still multiply
    // the others (nrows, or ne[0] * ne[1] first): those products must fit too.
    auto one_tensor = [](std::vector<int64_t> ne) {
        Image z;
        z.bytes = {'G', 'G', 'U', 'F'};
        z.put<uint32_t>(3);
        z.put<uint64_t>(1);
        z.put<uint64_t>(0);
        z.str("z");
        z.put<uint32_t>(uint32_t(ne.size()));
        for (size_t j = 0; j < ne.size(); ++j) {
            z.mark("ne[" + std::to_string(j) + "]");
            z.put<int64_t>(ne[j]);
        }
        z.put<uint32_t>(test::kTypeF32);
        z.put<uint64_t>(0);
        z.pad_to(32);
        return z;
    };
    const int64_t big = int64_t(1) << 40;
    Image z = one_tensor({0, big, big});
    expect_error(z,
                 {"tensor_infos[0] 'z'.ne[2]", at(z, "ne[2]"),
                  "the dimensions of shape [0, 1099511627776, 1099511627776] multiply past int64"});
    z = one_tensor({big, big, 1, 0});
    expect_error(z, {"tensor_infos[0] 'z'.ne[1]", at(z, "ne[1]"), "multiply past int64"});
    z = one_tensor({0, 1ll << 62, 0, 1ll << 62});  // any zero: still the product of the rest
    expect_error(z, {"tensor_infos[0] 'z'.ne[3]", "multiply past int64"});
    z = one_tensor({1ll << 62, 0});  // 2^62 F32 values in a row: 2^64 bytes
    expect_error(z, {"tensor_infos[0] 'z'.ne[0]", at(z, "ne[0]"),
                     "byte size of shape [4611686018427387904, 0] overflows"});
    z = one_tensor({0, 1ll << 31, 0, 1ll << 31});  // 2^62 fits: accepted, 0 bytes
    EXPECT_EQ(
        File::parse_memory(z.bytes.data(), z.bytes.size(), "ok.gguf")->tensors()[0].nelements(), 0);
    im = make_image();
    im.patch<int64_t>("tensor_infos[1].ne[0]", 16);  // Q8_0 blocks hold 32
    expect_error(im,
                 {"tensor_infos[1] 'b'.ne[0]", at(im, "tensor_infos[1].ne[0]"), "block size 32"});
}

TEST(GgufMalformed, TensorOffsets) {
    Image im = make_image();
    im.patch<uint64_t>("tensor_infos[1].offset", 33);
    expect_error(im, {"tensor_infos[1] 'b'.offset", at(im, "tensor_infos[1].offset"),
                      "not a multiple of the alignment 32"});

    im = make_image();
    const size_t data = im.offset("data");
    const size_t size = im.bytes.size();
    const uint64_t off = size - 16 - data;            // where "c" is
    im.patch<uint64_t>("tensor_infos[2].ne[0]", 64);  // now 128 bytes: starts inside, ends outside
    expect_error(
        im, {"tensor_infos[2] 'c'.offset", at(im, "tensor_infos[2].offset"),
             "data range [" + std::to_string(data + off) + ", " + std::to_string(data + off + 128) +
                 ") ends past the end of the file (size " + std::to_string(size) + ")"});
    im = make_image();
    im.patch<uint64_t>("tensor_infos[2].offset",
                       ~uint64_t(31));  // aligned, wraps if added in 64 bits
    expect_error(im, {"tensor_infos[2] 'c'.offset", "ends past the end of the file"});

    // The data section itself must start inside the file.
    im = make_image();
    const size_t end = im.offset("tensor_infos.end");
    ASSERT_NE(end % 32, 0u);  // else the cut below would leave the data section empty but in range
    im.bytes.resize(end + 1);
    expect_error(im, {"data section at byte " + std::to_string(end), "past the end of the file"});
}

TEST(GgufMalformed, OverlappingTensorsRefused) {
    Image im = make_image();
    im.patch<uint64_t>("tensor_infos[1].offset", 0);  // "b" now shares bytes with "a"
    expect_error(im, {"tensor_infos", "overlaps tensor"});
    // Sharing an offset is fine when one of them is empty.
    im = make_image();
    im.patch<uint64_t>("tensor_infos[2].ne[0]", 0);
    im.patch<uint64_t>("tensor_infos[2].offset", 0);
    const auto f = File::parse_memory(im.bytes.data(), im.bytes.size(), "ok.gguf");
    EXPECT_EQ(f->tensors()[2].nbytes, 0u);
}

TEST(GgufMalformed, DuplicateTensorName) {
    Image im = make_image();
    im.bytes[im.offset("tensor_infos[2].name") + 8] = 'a';
    expect_error(im, {"tensor_infos[2].name", at(im, "tensor_infos[2].name"),
                      "duplicate tensor name 'a'", "tensor_infos[0]"});
    im = make_image();
    im.patch<uint64_t>("tensor_infos[1].name", 0);
    expect_error(im, {"tensor_infos[1].name", "empty tensor name"});
}

// Every committed seed parses or is refused cleanly; seeds named valid-* must
// parse and invalid-* must be refused.
TEST(GgufMalformed, CorpusReplay) {
    const fs::path dir = fs::path(GLM5_SOURCE_DIR) / "fuzz/corpus/gguf";
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    size_t n = 0, valid = 0, invalid = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        std::ifstream in(e.path(), std::ios::binary);
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
        const std::string name = e.path().filename().string();
        bool ok = false;
        try {
            const auto f = File::parse_memory(bytes.data(), bytes.size(), name);
            ok = true;
            for (const auto& t : f->tensors()) {
                ASSERT_GE(t.data, bytes.data());
                ASSERT_LE(t.data + t.nbytes, bytes.data() + bytes.size());
            }
        } catch (const FormatError&) {
        }
        if (name.rfind("valid-", 0) == 0) {
            EXPECT_TRUE(ok) << name;
            ++valid;
        }
        if (name.rfind("invalid-", 0) == 0) {
            EXPECT_FALSE(ok) << name;
            ++invalid;
        }
        ++n;
    }
    EXPECT_GE(n, 12u);
    EXPECT_GE(valid, 5u);
    EXPECT_GE(invalid, 3u);
}

namespace {

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// What the fuzzer does with a parsed file: read every value and every byte.
uint64_t touch_all(const File& f) {
    uint64_t sum = 0;
    for (const auto& [key, v] : f.metadata()) sum += key.size() + v.to_display(4).size();
    for (const auto& t : f.tensors())
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    return sum;
}

}  // namespace

// A few thousand deterministic corruptions of a valid image: bit flips, byte
// stores, 64-bit stores of boundary values, truncations. Each must parse or
// raise FormatError; a parsed one must keep every tensor inside the buffer.
TEST(GgufMalformed, RandomMutationsNeverCrash) {
    const Image base = make_image(3, 32);
    uint64_t seed = 20261130;
    size_t parsed = 0, refused = 0;
    const uint64_t specials[] = {
        0,     1,    31, 32, 0x7FFFFFFFFFFFFFFFull, 0x8000000000000000ull, ~0ull, uint64_t(1) << 32,
        65535, 65536};
    for (int iter = 0; iter < 6000; ++iter) {
        std::vector<uint8_t> b = base.bytes;
        const int n_mut = 1 + int(splitmix(seed) % 3);
        for (int m = 0; m < n_mut; ++m) {
            const uint64_t r = splitmix(seed);
            const size_t pos = size_t(splitmix(seed) % b.size());
            switch (r % 4) {
                case 0:
                    b[pos] ^= uint8_t(1u << (r >> 8) % 8);
                    break;
                case 1:
                    b[pos] = uint8_t(r >> 16);
                    break;
                case 2: {
                    const uint64_t v = specials[(r >> 8) % std::size(specials)];
                    std::memcpy(b.data() + pos, &v, std::min<size_t>(8, b.size() - pos));
                    break;
                }
                case 3:
                    b.resize(pos);
                    break;
            }
            if (b.empty()) break;
        }
        // Exact-size heap copy so ASan builds catch any read past the end.
        std::unique_ptr<uint8_t[]> buf(new uint8_t[b.size() + 1]);
        std::memcpy(buf.get(), b.data(), b.size());
        try {
            const auto f = File::parse_memory(buf.get(), b.size(), "mut.gguf");
            for (const auto& t : f->tensors()) {
                ASSERT_GE(t.data, buf.get());
                ASSERT_LE(t.data + t.nbytes, buf.get() + b.size());
            }
            touch_all(*f);
            ++parsed;
        } catch (const FormatError&) {
            ++refused;
        }
    }
    // The mutations must exercise both outcomes to mean anything.
    EXPECT_GT(parsed, 100u);
    EXPECT_GT(refused, 1000u);
}

namespace {

// A header and one key holding an array of `n` elements of `type`, each
// `elem` bytes wide (the payload is written by `fill`).
template <class Fill>
Image one_array(uint32_t type, uint64_t n, Fill fill) {
    Image im;
    im.bytes.insert(im.bytes.end(), {'G', 'G', 'U', 'F'});
    im.put<uint32_t>(3);
    im.put<uint64_t>(0);  // tensors
    im.put<uint64_t>(1);  // kv
    im.str("big");
    im.put<uint32_t>(glm5::gguf::test::kArray);
    im.put<uint32_t>(type);
    im.put<uint64_t>(n);
    fill(im);
    return im;
}

}  // namespace

// 2^24 one-byte values used to become ~1.5 GB of Value objects; stored packed
// they take their own size, and read back element by element.
TEST(GgufMetadataMemory, ArraysAreStoredCompactly) {
    const uint64_t n = uint64_t(1) << 24;
    const Image im = one_array(glm5::gguf::test::kU8, n, [&](Image& i) {
        for (uint64_t k = 0; k < n; ++k) i.bytes.push_back(uint8_t(k * 7));
    });
    const auto f = File::parse_memory(im.bytes.data(), im.bytes.size(), "big.gguf");
    const Value* v = f->find("big");
    ASSERT_TRUE(v && v->is_array());
    ASSERT_EQ(v->size(), n);
    EXPECT_LT(v->memory_bytes(), n + 4096);
    EXPECT_EQ(*(*v)[12345].as_uint(), uint64_t(uint8_t(12345 * 7)));
    EXPECT_EQ((*v)[n - 1].type(), ValueType::U8);

    // Strings: one buffer and an end offset each.
    const Image s = one_array(glm5::gguf::test::kString, 100000, [](Image& i) {
        for (int k = 0; k < 100000; ++k) i.str("t" + std::to_string(k));
    });
    const auto fs_ = File::parse_memory(s.bytes.data(), s.bytes.size(), "str.gguf");
    const Value& sv = *fs_->find("big");
    EXPECT_EQ(*sv.string_at(99999), "t99999");
    EXPECT_EQ(*sv[5].as_string(), "t5");
    EXPECT_LT(sv.memory_bytes(), size_t(100000) * (8 + 7) + 4096);
}

// Metadata needing more memory than the limit is refused with the key named.
TEST(GgufMetadataMemory, TotalMetadataMemoryIsBounded) {
    const Image im = one_array(glm5::gguf::test::kString, 64, [](Image& i) {
        for (int k = 0; k < 64; ++k) i.str(std::string(32768, 'x'));
    });
    EXPECT_NO_THROW(File::parse_memory(im.bytes.data(), im.bytes.size(), "ok.gguf"));
    try {
        File::parse_memory(im.bytes.data(), im.bytes.size(), "bad.gguf", size_t(1) << 20);
        ADD_FAILURE() << "2 MiB of strings accepted under a 1 MiB limit";
    } catch (const FormatError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("kv[0] 'big'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("more than 1 MiB of memory"), std::string::npos) << msg;
    }
    // Arrays of arrays pay for each nested value.
    const Image nested = one_array(glm5::gguf::test::kArray, 40000, [](Image& i) {
        for (int k = 0; k < 40000; ++k) {
            i.put<uint32_t>(glm5::gguf::test::kU8);
            i.put<uint64_t>(0);
        }
    });
    EXPECT_THROW(
        File::parse_memory(nested.bytes.data(), nested.bytes.size(), "n.gguf", size_t(1) << 20),
        FormatError);
    EXPECT_NO_THROW(File::parse_memory(nested.bytes.data(), nested.bytes.size(), "n.gguf"));
}

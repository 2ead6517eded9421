// GGUF reader. One image is parsed by Parser::parse_image with a bounded
// Cursor; File::open adds the mapping and, for split models, parses every
// shard and checks that the split.* keys agree before merging the tensors.
//
// Limits beyond the format itself (each refused with FormatError):
//   keys <= 65535 bytes (the GGUF spec's limit), tensor names <= 64 bytes
//   (the spec's and ggml's), arrays nested at most 8 deep, and the metadata
//   of one file takes at most OpenOptions::max_metadata_bytes of memory
//   (512 MiB by default; arrays are stored compactly, so a real vocabulary
//   takes a few MiB).
// Overlapping tensor data is refused: ggml requires each tensor to start
// exactly where the previous one ends (padded), which rules overlaps out; we
// allow gaps and any order but not two tensors sharing bytes.
#include "gguf/gguf.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "gguf/cursor.h"

namespace glm5::gguf {

namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr uint64_t kMaxTensorNameBytes = 64;
constexpr int kMaxNesting = 8;
constexpr uint64_t kDefaultAlignment = 32;
// The smallest encodings, used to refuse counts that cannot fit in the bytes
// left before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name, n_dims, ne[0], type, offset

uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::BOOL:
            return 1;
        case ValueType::U16:
        case ValueType::I16:
            return 2;
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::F32:
            return 4;
        case ValueType::STRING:
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F64:
            return 8;
        case ValueType::ARRAY:
            return 4 + 8;
    }
    return 1;
}

bool valid_value_type(uint32_t raw) {
    return raw <= uint32_t(ValueType::F64);
}

std::string range_string(uint64_t a, uint64_t b) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

std::string u128_string(unsigned __int128 v) {
    std::string s;
    do {
        s.insert(s.begin(), char('0' + int(v % 10)));
        v /= 10;
    } while (v != 0);
    return s;
}

}  // namespace

std::string split_shard_path(const std::string& prefix, int index, int count) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "-%05d-of-%05d.gguf", index, count);
    return prefix + buf;
}

std::optional<SplitName> parse_split_path(const std::string& path) {
    // "-NNNNN-of-NNNNN.gguf" is 20 characters.
    static constexpr std::string_view kTail = "-00000-of-00000.gguf";
    if (path.size() < kTail.size()) return std::nullopt;
    const std::string_view tail = std::string_view(path).substr(path.size() - kTail.size());
    int index = 0, count = 0;
    for (size_t i = 0; i < kTail.size(); ++i) {
        const char want = kTail[i], got = tail[i];
        if (want == '0') {
            if (got < '0' || got > '9') return std::nullopt;
            int& field = i < 6 ? index : count;
            field = field * 10 + (got - '0');
        } else if (got != want) {
            return std::nullopt;
        }
    }
    if (index < 1 || count < 1 || index > count) return std::nullopt;
    return SplitName{path.substr(0, path.size() - kTail.size()), index, count};
}

// Where each tensor's fields sit in its file, to name them in later checks.
struct TensorPos {
    uint64_t name_at = 0, offset_at = 0;
};

// One parsed GGUF image (a whole file, or one shard of a split model).
struct Image {
    std::string name;
    uint32_t version = 0;
    uint64_t alignment = kDefaultAlignment;
    uint64_t data_start = 0;
    uint64_t size = 0;
    std::vector<std::pair<std::string, Value>> kv;
    std::vector<uint64_t> kv_offsets;
    std::unordered_map<std::string, size_t> kv_index;
    std::vector<TensorInfo> tensors;
    std::vector<TensorPos> tensor_pos;

    const Value* find(const std::string& key, uint64_t* at = nullptr) const {
        auto it = kv_index.find(key);
        if (it == kv_index.end()) return nullptr;
        if (at) *at = kv_offsets[it->second];
        return &kv[it->second].second;
    }
};

class Parser {
  public:
    Parser(const uint8_t* data, size_t size, const std::string& name, size_t max_metadata_bytes)
        : data_(data), c_(data, size, name), max_metadata_(max_metadata_bytes) {}

    Image parse();

    static std::unique_ptr<File> assemble(std::vector<Image> shards, std::vector<MappedFile> maps);
    static void check_split_keys(const std::vector<Image>& shards);

  private:
    std::pair<uint64_t, uint64_t> parse_header();
    void parse_metadata(uint64_t n_kv);
    Value read_value(ValueType t, const std::string& field, int depth);
    Value read_array(const std::string& field, int depth);
    void charge(uint64_t bytes, const std::string& field, uint64_t at);
    void apply_alignment();
    void parse_tensor_infos(uint64_t n_tensors);
    void place_tensors();

    const uint8_t* data_;
    Cursor c_;
    Image img_;
    uint64_t max_metadata_;
    uint64_t metadata_bytes_ = 0;
};

Image Parser::parse() {
    img_.name = c_.file();
    img_.size = c_.size();
    const auto [n_tensors, n_kv] = parse_header();
    parse_metadata(n_kv);
    apply_alignment();
    parse_tensor_infos(n_tensors);
    place_tensors();
    return std::move(img_);
}

// Magic, version and the two counts; returns {n_tensors, n_kv}.
std::pair<uint64_t, uint64_t> Parser::parse_header() {
    c_.need(4, [] { return std::string("magic"); });
    uint8_t magic[4];
    for (auto& b : magic) b = c_.read<uint8_t>([] { return std::string("magic"); });
    if (!std::equal(magic, magic + 4, kMagic)) {
        std::string shown;
        for (uint8_t b : magic) shown += (b >= 0x20 && b < 0x7f) ? char(b) : '?';
        c_.fail("magic", 0, "not a GGUF file (starts with '" + shown + "', expected 'GGUF')");
    }

    const uint32_t version = c_.read<uint32_t>([] { return std::string("version"); });
    if (version == 1) c_.fail("version", 4, "GGUF version 1 is not supported (only 2 and 3)");
    if ((version & 0xFFFF) == 0 && version != 0)
        c_.fail("version", 4,
                "version " + std::to_string(version) +
                    " looks byte-swapped: big-endian GGUF files are not supported");
    if (version != 2 && version != 3)
        c_.fail("version", 4,
                "unsupported GGUF version " + std::to_string(version) + " (only 2 and 3)");
    img_.version = version;

    const uint64_t n_tensors = c_.read<uint64_t>([] { return std::string("n_tensors"); });
    const uint64_t n_kv = c_.read<uint64_t>([] { return std::string("n_kv"); });
    // Everything after the header must hold at least the minimal encodings.
    const uint64_t rem = c_.remaining();
    if (n_tensors > rem / kMinTensorInfoBytes)
        c_.fail("n_tensors", 8,
                std::to_string(n_tensors) + " tensor infos cannot fit in the " +
                    std::to_string(rem) + " bytes after the header");
    if (n_kv > rem / kMinKvBytes || n_kv * kMinKvBytes > rem - n_tensors * kMinTensorInfoBytes)
        c_.fail("n_kv", 16,
                std::to_string(n_kv) + " metadata entries cannot fit in the " +
                    std::to_string(rem) + " bytes after the header");
    return {n_tensors, n_kv};
}

void Parser::parse_metadata(uint64_t n_kv) {
    img_.kv.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const std::string idx = "kv[" + std::to_string(i) + "]";
        const uint64_t key_at = c_.pos();
        std::string key = c_.read_string(kMaxKeyBytes, [&] { return idx + ".key"; });
        if (key.empty()) c_.fail(idx + ".key", key_at, "empty key");
        if (auto it = img_.kv_index.find(key); it != img_.kv_index.end())
            c_.fail(idx + ".key", key_at,
                    "duplicate key '" + key + "' (first defined by kv[" +
                        std::to_string(it->second) + "])");

        const std::string field = idx + " '" + key + "'";
        const uint64_t type_at = c_.pos();
        const uint32_t raw = c_.read<uint32_t>([&] { return field + ".type"; });
        if (!valid_value_type(raw))
            c_.fail(field + ".type", type_at, "unknown value type " + std::to_string(raw));
        const uint64_t value_at = c_.pos();
        Value v = read_value(ValueType(raw), field + ".value", 0);

        img_.kv_index.emplace(key, img_.kv.size());
        img_.kv.emplace_back(std::move(key), std::move(v));
        img_.kv_offsets.push_back(value_at);
    }
}

// Counts memory the metadata will hold; refuses a file whose metadata would
// take more than the limit.
void Parser::charge(uint64_t bytes, const std::string& field, uint64_t at) {
    if (bytes > max_metadata_ - metadata_bytes_)
        c_.fail(field, at,
                "the metadata would take more than " + std::to_string(max_metadata_ >> 20) +
                    " MiB of memory");
    metadata_bytes_ += bytes;
}

Value Parser::read_value(ValueType t, const std::string& field, int depth) {
    auto name = [&] { return field; };
    charge(sizeof(Value), field, c_.pos());
    switch (t) {
        case ValueType::U8:
            return Value::make_uint(t, c_.read<uint8_t>(name));
        case ValueType::I8:
            return Value::make_int(t, c_.read<int8_t>(name));
        case ValueType::U16:
            return Value::make_uint(t, c_.read<uint16_t>(name));
        case ValueType::I16:
            return Value::make_int(t, c_.read<int16_t>(name));
        case ValueType::U32:
            return Value::make_uint(t, c_.read<uint32_t>(name));
        case ValueType::I32:
            return Value::make_int(t, c_.read<int32_t>(name));
        case ValueType::U64:
            return Value::make_uint(t, c_.read<uint64_t>(name));
        case ValueType::I64:
            return Value::make_int(t, c_.read<int64_t>(name));
        case ValueType::F32:
            return Value::make_float(t, c_.read<float>(name));
        case ValueType::F64:
            return Value::make_float(t, c_.read<double>(name));
        case ValueType::BOOL: {
            const uint64_t at = c_.pos();
            const uint8_t b = c_.read<uint8_t>(name);
            if (b > 1) c_.fail(field, at, "bool value " + std::to_string(b) + " is not 0 or 1");
            return Value::make_bool(b != 0);
        }
        case ValueType::STRING: {
            const uint64_t at = c_.pos();
            std::string str = c_.read_string(c_.remaining(), name);
            charge(str.size(), field, at);
            return Value::make_string(std::move(str));
        }
        case ValueType::ARRAY:
            break;
    }
    return read_array(field, depth);
}

// Arrays are stored compactly: scalars as the file has them, strings in one
// buffer; only arrays of arrays hold a Value per element.
Value Parser::read_array(const std::string& field, int depth) {
    const uint64_t type_at = c_.pos();
    const uint32_t raw = c_.read<uint32_t>([&] { return field + ".array_type"; });
    if (!valid_value_type(raw))
        c_.fail(field + ".array_type", type_at,
                "unknown array element type " + std::to_string(raw));
    const ValueType et = ValueType(raw);
    if (et == ValueType::ARRAY && depth + 1 >= kMaxNesting)
        c_.fail(field + ".array_type", type_at,
                "arrays nested more than " + std::to_string(kMaxNesting) + " deep");
    const uint64_t len_at = c_.pos();
    const uint64_t n = c_.read<uint64_t>([&] { return field + ".array_length"; });
    if (n > c_.remaining() / min_encoded_size(et))
        c_.fail(field + ".array_length", len_at,
                std::to_string(n) + " elements of " + value_type_name(et) + " cannot fit in the " +
                    std::to_string(c_.remaining()) + " remaining bytes");

    if (et == ValueType::ARRAY) {
        std::vector<Value> items;
        items.reserve(size_t(n));
        for (uint64_t k = 0; k < n; ++k)
            items.push_back(read_value(et, field + "[" + std::to_string(k) + "]", depth + 1));
        return Value::make_array(et, std::move(items));
    }
    if (et == ValueType::STRING) {
        charge(n * sizeof(uint64_t), field + ".array_length", len_at);
        std::vector<uint64_t> ends;
        ends.reserve(size_t(n));
        std::string data;
        for (uint64_t k = 0; k < n; ++k) {
            // Inline so that a vocabulary does not format a field name per element.
            auto elem = [&] { return field + "[" + std::to_string(k) + "]"; };
            const uint64_t at = c_.pos();
            const uint64_t len = c_.read<uint64_t>(elem);
            if (len > c_.remaining())
                c_.fail(elem(), at,
                        "string length " + std::to_string(len) +
                            " runs past the end of the file (" + std::to_string(c_.remaining()) +
                            " bytes remain)");
            charge(len, elem(), at);
            data.append(reinterpret_cast<const char*>(c_.take(len, elem)), size_t(len));
            ends.push_back(data.size());
        }
        data.shrink_to_fit();
        return Value::make_string_array(std::move(data), std::move(ends));
    }
    const uint64_t es = min_encoded_size(et);  // a scalar's size
    const uint64_t at = c_.pos();
    charge(n * es, field, at);
    const uint8_t* p = c_.take(n * es, [&] { return field; });
    if (et == ValueType::BOOL)
        for (uint64_t k = 0; k < n; ++k)
            if (p[k] > 1)
                c_.fail(field + "[" + std::to_string(k) + "]", at + k,
                        "bool value " + std::to_string(p[k]) + " is not 0 or 1");
    return Value::make_packed_array(et, std::vector<uint8_t>(p, p + n * es), size_t(n));
}

void Parser::apply_alignment() {
    uint64_t at = 0;
    const Value* v = img_.find("general.alignment", &at);
    if (!v) return;
    const std::string field = "metadata 'general.alignment'";
    const auto a = v->as_uint();
    if (!a)
        c_.fail(field, at,
                std::string("must be an unsigned integer, not ") + value_type_name(v->type()));
    if (*a == 0 || (*a & (*a - 1)) != 0)
        c_.fail(field, at, "alignment " + std::to_string(*a) + " is not a nonzero power of two");
    img_.alignment = *a;
}

void Parser::parse_tensor_infos(uint64_t n_tensors) {
    std::unordered_map<std::string, size_t> seen;
    img_.tensors.reserve(size_t(n_tensors));
    img_.tensor_pos.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        const std::string idx = "tensor_infos[" + std::to_string(i) + "]";
        TensorInfo t;
        TensorPos p;
        p.name_at = c_.pos();
        t.name = c_.read_string(kMaxTensorNameBytes, [&] { return idx + ".name"; });
        if (t.name.empty()) c_.fail(idx + ".name", p.name_at, "empty tensor name");
        if (auto it = seen.find(t.name); it != seen.end())
            c_.fail(idx + ".name", p.name_at,
                    "duplicate tensor name '" + t.name + "' (first at tensor_infos[" +
                        std::to_string(it->second) + "])");
        const std::string field = idx + " '" + t.name + "'";

        const uint64_t dims_at = c_.pos();
        const uint32_t n_dims = c_.read<uint32_t>([&] { return field + ".n_dims"; });
        if (n_dims == 0 || n_dims > 4)
            c_.fail(field + ".n_dims", dims_at,
                    "n_dims " + std::to_string(n_dims) + " is not in [1, 4]");
        t.n_dims = int(n_dims);
        uint64_t ne_at[4] = {};
        for (uint32_t j = 0; j < n_dims; ++j) {
            ne_at[j] = c_.pos();
            const std::string ne_field = field + ".ne[" + std::to_string(j) + "]";
            const uint64_t d = c_.read<uint64_t>([&] { return ne_field; });
            if (d > uint64_t(std::numeric_limits<int64_t>::max()))
                c_.fail(ne_field, ne_at[j],
                        "dimension " + std::to_string(int64_t(d)) + " is negative");
            t.ne[j] = int64_t(d);
        }
        // Users multiply dimensions in any grouping (nelements, nrows), so the
        // product of the nonzero ones, which bounds every partial product,
        // must fit: a zero dimension must not hide an overflow elsewhere.
        int64_t bound = 1;
        for (uint32_t j = 0; j < n_dims; ++j)
            if (__builtin_mul_overflow(bound, std::max<int64_t>(t.ne[j], 1), &bound))
                c_.fail(field + ".ne[" + std::to_string(j) + "]", ne_at[j],
                        "the dimensions of shape " + t.shape_string() + " multiply past int64");
        const int64_t nel = t.nelements();

        const uint64_t type_at = c_.pos();
        const uint32_t raw_type = c_.read<uint32_t>([&] { return field + ".type"; });
        const quant::TypeTraits* tt = quant::find_traits(raw_type);
        if (!tt)
            c_.fail(field + ".type", type_at, "unknown tensor type id " + std::to_string(raw_type));
        t.type = quant::Type(raw_type);
        if (t.ne[0] % tt->block_size != 0)
            c_.fail(field + ".ne[0]", ne_at[0],
                    "row length " + std::to_string(t.ne[0]) + " is not a multiple of " + tt->name +
                        "'s block size " + std::to_string(tt->block_size));
        // Byte sizes, of the tensor and of one row (row_bytes(), which must fit
        // even when another dimension is 0).
        uint64_t nbytes = 0, row = 0;
        if (__builtin_mul_overflow(uint64_t(nel / tt->block_size), uint64_t(tt->type_size),
                                   &nbytes) ||
            __builtin_mul_overflow(uint64_t(t.ne[0] / tt->block_size), uint64_t(tt->type_size),
                                   &row))
            c_.fail(field + ".ne[0]", ne_at[0],
                    "byte size of shape " + t.shape_string() + " overflows");
        t.nbytes = size_t(nbytes);

        p.offset_at = c_.pos();
        t.offset = c_.read<uint64_t>([&] { return field + ".offset"; });
        seen.emplace(t.name, size_t(i));
        img_.tensors.push_back(std::move(t));
        img_.tensor_pos.push_back(p);
    }
}

void Parser::place_tensors() {
    using u128 = unsigned __int128;
    const uint64_t a = img_.alignment, pos = c_.pos(), size = c_.size();
    // The data section starts at the first aligned offset after the infos.
    const u128 start = (u128(pos) + a - 1) / a * a;
    if (img_.tensors.empty()) {
        img_.data_start = start > size ? size : uint64_t(start);
        return;
    }
    if (start > size)
        c_.fail("data section", pos,
                "starts at the next multiple of the alignment " + std::to_string(a) +
                    ", past the end of the file (size " + std::to_string(size) + ")");
    img_.data_start = uint64_t(start);

    for (size_t i = 0; i < img_.tensors.size(); ++i) {
        const TensorInfo& t = img_.tensors[i];
        const std::string field = "tensor_infos[" + std::to_string(i) + "] '" + t.name + "'.offset";
        const uint64_t at = img_.tensor_pos[i].offset_at;
        if (t.offset % a != 0)
            c_.fail(field, at,
                    "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                        std::to_string(a));
        const u128 begin = start + t.offset, end = begin + t.nbytes;
        if (end > size)
            c_.fail(field, at,
                    "data range [" + u128_string(begin) + ", " + u128_string(end) +
                        ") ends past the end of the file (size " + std::to_string(size) + ")");
    }

    // Refuse two tensors sharing bytes: sort by offset and compare neighbours.
    std::vector<size_t> order(img_.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return img_.tensors[x].offset < img_.tensors[y].offset; });
    const TensorInfo* prev = nullptr;
    for (size_t i : order) {
        const TensorInfo& t = img_.tensors[i];
        if (t.nbytes == 0) continue;
        if (prev && t.offset < prev->offset + prev->nbytes) {
            const uint64_t s = img_.data_start;
            c_.fail("tensor_infos[" + std::to_string(i) + "] '" + t.name + "'.offset",
                    img_.tensor_pos[i].offset_at,
                    "data range " + range_string(s + t.offset, s + t.offset + t.nbytes) +
                        " overlaps tensor '" + prev->name + "' at " +
                        range_string(s + prev->offset, s + prev->offset + prev->nbytes));
        }
        prev = &t;
    }
    for (TensorInfo& t : img_.tensors) t.data = data_ + img_.data_start + t.offset;
}

namespace {

[[noreturn]] void split_error(const Image& img, const std::string& key, uint64_t at,
                              const std::string& what) {
    throw FormatError(img.name + ": metadata '" + key + "' at byte " + std::to_string(at) + ": " +
                      what);
}

// The value of an integer split.* key, nullopt when absent.
std::optional<uint64_t> split_key(const Image& img, const std::string& key) {
    uint64_t at = 0;
    const Value* v = img.find(key, &at);
    if (!v) return std::nullopt;
    const auto u = v->as_uint();
    if (!u)
        split_error(img, key, at,
                    std::string("must be a non-negative integer, not ") +
                        (v->is_integer() ? "negative" : value_type_name(v->type())));
    return u;
}

uint64_t split_key_at(const Image& img, const std::string& key) {
    uint64_t at = 0;
    img.find(key, &at);
    return at;
}

}  // namespace

void Parser::check_split_keys(const std::vector<Image>& shards) {
    const Image& first = shards[0];
    const uint64_t n = shards.size();
    // llama.cpp treats split.count 0 or 1 as "not split".
    const uint64_t declared = std::max<uint64_t>(split_key(first, "split.count").value_or(1), 1);
    if (declared != n) {
        const std::string why =
            n == 1 ? "but only this file was opened (its name is not of the form " +
                         split_shard_path("NAME", 1, int(std::min<uint64_t>(declared, 99999))) +
                         ", so the other shards cannot be found)"
                   : "but the file name says " + std::to_string(n) + " shards";
        split_error(first, "split.count", split_key_at(first, "split.count"),
                    "declares " + std::to_string(declared) + " shards " + why);
    }
    if (n == 1) return;

    uint64_t total = 0;
    for (const Image& s : shards) total += s.tensors.size();
    const auto declared_total = split_key(first, "split.tensors.count");
    if (!declared_total)
        throw FormatError(first.name +
                          ": metadata 'split.tensors.count' is missing (needed for a "
                          "split model)");
    for (uint64_t k = 0; k < n; ++k) {
        const Image& s = shards[k];
        const auto no = split_key(s, "split.no");
        if (!no)
            throw FormatError(s.name + ": metadata 'split.no' is missing (expected " +
                              std::to_string(k) + ")");
        if (*no != k)
            split_error(s, "split.no", split_key_at(s, "split.no"),
                        "is " + std::to_string(*no) + " but this is shard " +
                            std::to_string(k + 1) + " of " + std::to_string(n) + " (expected " +
                            std::to_string(k) + ")");
        if (k == 0) continue;
        if (const auto c = split_key(s, "split.count"); c && *c != n)
            split_error(
                s, "split.count", split_key_at(s, "split.count"),
                "is " + std::to_string(*c) + " but the first shard says " + std::to_string(n));
    }
    if (*declared_total != total)
        split_error(first, "split.tensors.count", split_key_at(first, "split.tensors.count"),
                    "is " + std::to_string(*declared_total) + " but the " + std::to_string(n) +
                        " shards hold " + std::to_string(total) + " tensors");
    for (uint64_t k = 1; k < n; ++k) {
        const Image& s = shards[k];
        if (const auto c = split_key(s, "split.tensors.count"); c && *c != *declared_total)
            split_error(s, "split.tensors.count", split_key_at(s, "split.tensors.count"),
                        "is " + std::to_string(*c) + " but the first shard says " +
                            std::to_string(*declared_total));
    }
}

std::unique_ptr<File> Parser::assemble(std::vector<Image> shards, std::vector<MappedFile> maps) {
    std::unique_ptr<File> f(new File());
    Image& first = shards[0];
    f->path_ = first.name;
    f->version_ = first.version;
    f->alignment_ = size_t(first.alignment);
    f->kv_ = std::move(first.kv);
    f->kv_offsets_ = std::move(first.kv_offsets);
    f->kv_index_ = std::move(first.kv_index);
    for (size_t s = 0; s < shards.size(); ++s) {
        Image& img = shards[s];
        f->shard_paths_.push_back(img.name);
        f->total_file_bytes_ += img.size;
        for (size_t i = 0; i < img.tensors.size(); ++i) {
            TensorInfo& t = img.tensors[i];
            t.shard = int(s);
            auto [it, fresh] = f->tensor_index_.emplace(t.name, f->tensors_.size());
            if (!fresh)
                throw FormatError(img.name + ": tensor_infos[" + std::to_string(i) +
                                  "].name at byte " + std::to_string(img.tensor_pos[i].name_at) +
                                  ": tensor '" + t.name + "' is also in " +
                                  f->shard_paths_[size_t(f->tensors_[it->second].shard)]);
            f->tensors_.push_back(std::move(t));
        }
    }
    f->maps_ = std::move(maps);
    return f;
}

std::unique_ptr<File> File::open(const std::string& path, const OpenOptions& opt) {
    std::vector<std::string> paths{path};
    const auto split = parse_split_path(path);
    if (opt.load_splits && split && split->count > 1) {
        if (split->index != 1)
            throw FormatError(path + ": is shard " + std::to_string(split->index) + " of " +
                              std::to_string(split->count) +
                              " of a split model; open the first shard, " +
                              split_shard_path(split->prefix, 1, split->count));
        paths.clear();
        for (int k = 1; k <= split->count; ++k)
            paths.push_back(split_shard_path(split->prefix, k, split->count));
    }
    std::vector<MappedFile> maps;
    std::vector<Image> images;
    maps.reserve(paths.size());
    for (const std::string& p : paths) {
        maps.emplace_back(p);
        images.push_back(
            Parser(maps.back().data(), maps.back().size(), p, opt.max_metadata_bytes).parse());
    }
    if (opt.load_splits) Parser::check_split_keys(images);
    return Parser::assemble(std::move(images), std::move(maps));
}

std::unique_ptr<File> File::parse_memory(const uint8_t* data, size_t size, const std::string& name,
                                         size_t max_metadata_bytes) {
    std::vector<Image> images;
    images.push_back(Parser(data, size, name, max_metadata_bytes).parse());
    return Parser::assemble(std::move(images), {});
}

File::~File() = default;

const Value* File::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::type_error(std::string_view key, const char* expected) const {
    const size_t i = kv_index_.at(std::string(key));
    const Value& v = kv_[i].second;
    std::string got = value_type_name(v.type());
    if (v.is_integer() && v.as_int() && *v.as_int() < 0) got = "negative " + got;
    throw FormatError(path_ + ": metadata '" + std::string(key) + "' at byte " +
                      std::to_string(kv_offsets_[i]) + ": is " + got + ", expected " + expected);
}

namespace {
[[noreturn]] void missing_key(const std::string& path, std::string_view key) {
    throw FormatError(path + ": metadata key '" + std::string(key) + "' is missing");
}
}  // namespace

uint64_t File::get_uint(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing_key(path_, key);
    if (auto u = v->as_uint()) return *u;
    type_error(key, "a non-negative integer");
}

uint64_t File::get_uint(std::string_view key, uint64_t dflt) const {
    return find(key) ? get_uint(key) : dflt;
}

double File::get_float(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing_key(path_, key);
    if (auto f = v->as_float()) return *f;
    type_error(key, "a number");
}

double File::get_float(std::string_view key, double dflt) const {
    return find(key) ? get_float(key) : dflt;
}

bool File::get_bool(std::string_view key, bool dflt) const {
    const Value* v = find(key);
    if (!v) return dflt;
    if (auto b = v->as_bool()) return *b;
    type_error(key, "a bool");
}

std::string File::get_string(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing_key(path_, key);
    if (const std::string* s = v->as_string()) return *s;
    type_error(key, "a string");
}

std::string File::get_string(std::string_view key, const std::string& dflt) const {
    return find(key) ? get_string(key) : dflt;
}

void File::prefetch() const {
    for (const MappedFile& m : maps_) m.prefetch();
}

}  // namespace glm5::gguf

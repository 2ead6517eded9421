// GGUF v3 writer. The header (metadata + tensor infos) is built in memory;
// tensor data is produced one tensor at a time into a reused buffer and
// streamed to PATH.tmp, which is renamed over PATH only once complete.
#include "gguf/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "core/error.h"

namespace glm5::gguf {

namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kMaxKeyBytes = 65535;
constexpr size_t kMaxTensorNameBytes = 64;

uint64_t padded(uint64_t n, uint64_t a) {
    return (n + a - 1) / a * a;
}

bool fits(ValueType t, const Value& v) {
    const auto u = v.as_uint();
    const auto i = v.as_int();
    switch (t) {
        case ValueType::U8:
            return u && *u <= 0xFF;
        case ValueType::U16:
            return u && *u <= 0xFFFF;
        case ValueType::U32:
            return u && *u <= 0xFFFFFFFFu;
        case ValueType::U64:
            return u.has_value();
        case ValueType::I8:
            return i && *i >= -128 && *i <= 127;
        case ValueType::I16:
            return i && *i >= -32768 && *i <= 32767;
        case ValueType::I32:
            return i && *i >= INT32_MIN && *i <= INT32_MAX;
        case ValueType::I64:
            return i.has_value();
        default:
            return true;
    }
}

// Refuses values the file could not represent: an integer outside its type's
// range, an array whose items are not all of its element type.
void check_value(const Value& v, const std::string& key) {
    if (!fits(v.type(), v))
        throw Error("gguf writer: metadata '" + key + "': value does not fit in " +
                    value_type_name(v.type()));
    if (!v.is_array()) return;
    for (const Value& item : v.items()) {
        if (item.type() != v.array_type())
            throw Error("gguf writer: metadata '" + key + "': array of " +
                        value_type_name(v.array_type()) + " holds a " +
                        value_type_name(item.type()));
        check_value(item, key);
    }
}

template <class T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));  // little-endian host
}

void put_string(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
}

// A value's encoding after its type tag; an array element that is itself an
// array carries its own element type and length.
void put_payload(std::string& out, const Value& v) {
    switch (v.type()) {
        case ValueType::U8:
            put<uint8_t>(out, uint8_t(*v.as_uint()));
            break;
        case ValueType::U16:
            put<uint16_t>(out, uint16_t(*v.as_uint()));
            break;
        case ValueType::U32:
            put<uint32_t>(out, uint32_t(*v.as_uint()));
            break;
        case ValueType::U64:
            put<uint64_t>(out, *v.as_uint());
            break;
        case ValueType::I8:
            put<int8_t>(out, int8_t(*v.as_int()));
            break;
        case ValueType::I16:
            put<int16_t>(out, int16_t(*v.as_int()));
            break;
        case ValueType::I32:
            put<int32_t>(out, int32_t(*v.as_int()));
            break;
        case ValueType::I64:
            put<int64_t>(out, *v.as_int());
            break;
        case ValueType::F32:
            put<float>(out, float(*v.as_float()));
            break;
        case ValueType::F64:
            put<double>(out, *v.as_float());
            break;
        case ValueType::BOOL:
            put<uint8_t>(out, *v.as_bool() ? 1 : 0);
            break;
        case ValueType::STRING:
            put_string(out, *v.as_string());
            break;
        case ValueType::ARRAY:
            put<uint32_t>(out, uint32_t(v.array_type()));
            put<uint64_t>(out, v.size());
            for (const Value& item : v.items()) put_payload(out, item);
            break;
    }
}

// PATH.tmp, removed again unless commit() renamed it over PATH.
class TmpFile {
  public:
    explicit TmpFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
        fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) fail("cannot create");
    }
    ~TmpFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(tmp_.c_str());
    }
    TmpFile(const TmpFile&) = delete;
    TmpFile& operator=(const TmpFile&) = delete;

    void write(const void* p, size_t n) {
        const char* c = static_cast<const char*>(p);
        while (n > 0) {
            const ssize_t w = ::write(fd_, c, std::min<size_t>(n, size_t(1) << 30));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) fail("cannot write");
            c += w;
            n -= size_t(w);
        }
    }
    void zeros(size_t n) {
        static const char kZeros[256] = {};
        while (n > 0) {
            const size_t k = std::min(n, sizeof(kZeros));
            write(kZeros, k);
            n -= k;
        }
    }
    void commit() {
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) fail("cannot write");
        if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename to " + path_);
        committed_ = true;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error(tmp_ + ": " + what + ": " + std::strerror(errno));
    }
    std::string path_, tmp_;
    int fd_ = -1;
    bool committed_ = false;
};

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        throw Error("gguf writer: alignment " + std::to_string(alignment) +
                    " is not a nonzero power of two");
}

void Writer::set(const std::string& key, Value v) {
    if (key.empty() || key.size() > kMaxKeyBytes)
        throw Error("gguf writer: metadata key of " + std::to_string(key.size()) + " bytes");
    check_value(v, key);
    for (auto& kv : kv_)
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    kv_.emplace_back(key, std::move(v));
}

void Writer::set_u32(const std::string& key, uint32_t v) {
    set(key, Value::make_uint(ValueType::U32, v));
}
void Writer::set_i32(const std::string& key, int32_t v) {
    set(key, Value::make_int(ValueType::I32, v));
}
void Writer::set_u64(const std::string& key, uint64_t v) {
    set(key, Value::make_uint(ValueType::U64, v));
}
void Writer::set_f32(const std::string& key, float v) {
    set(key, Value::make_float(ValueType::F32, v));
}
void Writer::set_bool(const std::string& key, bool v) {
    set(key, Value::make_bool(v));
}
void Writer::set_string(const std::string& key, const std::string& v) {
    set(key, Value::make_string(v));
}

void Writer::set_array_string(const std::string& key, const std::vector<std::string>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (const auto& s : v) items.push_back(Value::make_string(s));
    set(key, Value::make_array(ValueType::STRING, std::move(items)));
}

void Writer::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (int32_t x : v) items.push_back(Value::make_int(ValueType::I32, x));
    set(key, Value::make_array(ValueType::I32, std::move(items)));
}

void Writer::set_array_u32(const std::string& key, const std::vector<uint32_t>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (uint32_t x : v) items.push_back(Value::make_uint(ValueType::U32, x));
    set(key, Value::make_array(ValueType::U32, std::move(items)));
}

void Writer::set_array_f32(const std::string& key, const std::vector<float>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (float x : v) items.push_back(Value::make_float(ValueType::F32, x));
    set(key, Value::make_array(ValueType::F32, std::move(items)));
}

void Writer::set_array_bool(const std::string& key, const std::vector<bool>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (bool x : v) items.push_back(Value::make_bool(x));
    set(key, Value::make_array(ValueType::BOOL, std::move(items)));
}

void Writer::add_tensor(const std::string& name, quant::Type type, std::vector<int64_t> ne,
                        Fill fill) {
    if (!fill) throw Error("gguf writer: tensor '" + name + "': no fill function");
    add_tensor_pieces(name, type, std::move(ne), SIZE_MAX,
                      [fill = std::move(fill)](uint8_t* dst, size_t, size_t n) { fill(dst, n); });
}

void Writer::add_tensor_pieces(const std::string& name, quant::Type type, std::vector<int64_t> ne,
                               size_t max_piece_bytes, FillPiece fill) {
    const std::string what = "gguf writer: tensor '" + name + "': ";
    if (name.empty() || name.size() > kMaxTensorNameBytes)
        throw Error(what + "name must be 1 to 64 bytes");
    for (const auto& t : tensors_)
        if (t.name == name) throw Error(what + "added twice");
    if (ne.empty() || ne.size() > 4) throw Error(what + "needs 1 to 4 dimensions");
    const quant::TypeTraits& tt = quant::traits(type);
    // As the reader: the product of the nonzero dimensions bounds every
    // partial product users compute, so it must fit in int64.
    int64_t bound = 1;
    for (int64_t d : ne)
        if (d < 0 || __builtin_mul_overflow(bound, std::max<int64_t>(d, 1), &bound))
            throw Error(what + "bad shape");
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    if (ne[0] % tt.block_size != 0)
        throw Error(what + "row length " + std::to_string(ne[0]) + " is not a multiple of " +
                    tt.name + "'s block size " + std::to_string(tt.block_size));
    if (!fill) throw Error(what + "no fill function");
    const size_t nbytes = size_t(n / tt.block_size) * tt.type_size;
    const size_t row = std::max<size_t>(quant::row_size(type, ne[0]), 1);
    const size_t piece = std::min(nbytes, std::max(row, max_piece_bytes / row * row));
    tensors_.push_back({name, type, std::move(ne), nbytes, piece, std::move(fill)});
}

void Writer::add_tensor_bytes(const std::string& name, quant::Type type, std::vector<int64_t> ne,
                              const void* data, size_t nbytes) {
    auto copy = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(data),
                                                       static_cast<const uint8_t*>(data) + nbytes);
    add_tensor(name, type, std::move(ne), [copy](uint8_t* dst, size_t n) {
        if (!copy->empty()) std::memcpy(dst, copy->data(), std::min(n, copy->size()));
    });
    if (tensors_.back().nbytes != nbytes) {
        const size_t want = tensors_.back().nbytes;
        tensors_.pop_back();
        throw Error("gguf writer: tensor '" + name + "': " + std::to_string(nbytes) +
                    " bytes given, its shape needs " + std::to_string(want));
    }
}

void Writer::write_file(const std::string& path,
                        const std::vector<std::pair<std::string, Value>>& kv, size_t first_tensor,
                        size_t end_tensor, ProgressState& progress) const {
    std::string header = "GGUF";
    put<uint32_t>(header, 3);
    put<uint64_t>(header, end_tensor - first_tensor);
    put<uint64_t>(header, kv.size());
    for (const auto& [key, v] : kv) {
        put_string(header, key);
        put<uint32_t>(header, uint32_t(v.type()));
        put_payload(header, v);
    }
    uint64_t offset = 0;
    for (size_t i = first_tensor; i < end_tensor; ++i) {
        const PendingTensor& t = tensors_[i];
        put_string(header, t.name);
        put<uint32_t>(header, uint32_t(t.ne.size()));
        for (int64_t d : t.ne) put<uint64_t>(header, uint64_t(d));
        put<uint32_t>(header, uint32_t(t.type));
        put<uint64_t>(header, offset);
        offset += padded(t.nbytes, alignment_);
    }

    TmpFile out(path);
    out.write(header.data(), header.size());
    out.zeros(padded(header.size(), alignment_) - header.size());
    std::vector<uint8_t> buf;
    for (size_t i = first_tensor; i < end_tensor; ++i) {
        const PendingTensor& t = tensors_[i];
        if (buf.size() < std::max<size_t>(t.piece_bytes, 1))
            buf.resize(std::max<size_t>(t.piece_bytes, 1));
        size_t at = 0;
        do {  // once for an empty tensor too, as its fill expects
            const size_t n = std::min(t.piece_bytes, t.nbytes - at);
            std::memset(buf.data(), 0, n);  // a fill that writes less leaves zeros, not junk
            t.fill(buf.data(), at, n);
            out.write(buf.data(), n);
            at += n;
            progress.done += n;
            if (*progress.fn) (*progress.fn)(progress.done, progress.total);
        } while (at < t.nbytes);
        out.zeros(padded(t.nbytes, alignment_) - t.nbytes);
    }
    out.commit();
}

void Writer::write(const std::string& path, const Progress& progress) const {
    std::vector<std::pair<std::string, Value>> kv = kv_;
    bool has_alignment = false;
    for (const auto& [key, v] : kv)
        if (key == "general.alignment") {
            if (v.as_uint() != uint64_t(alignment_))
                throw Error(
                    "gguf writer: general.alignment disagrees with the writer's alignment " +
                    std::to_string(alignment_));
            has_alignment = true;
        }
    if (!has_alignment && alignment_ != kDefaultAlignment)
        kv.emplace_back("general.alignment", Value::make_uint(ValueType::U32, alignment_));
    ProgressState st{&progress, 0, 0};
    for (const auto& t : tensors_) st.total += t.nbytes;
    write_file(path, kv, 0, tensors_.size(), st);
}

std::vector<std::string> Writer::write_split(const std::string& prefix_or_path,
                                             const SplitLimits& limits,
                                             const Progress& progress) const {
    std::string prefix = prefix_or_path;
    if (auto s = parse_split_path(prefix))
        prefix = s->prefix;
    else if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0)
        prefix.resize(prefix.size() - 5);

    // Shard boundaries: [begin, end) ranges of tensor indices.
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t begin = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const uint64_t b = padded(tensors_[i].nbytes, alignment_);
        const bool full =
            limits.starts.empty()
                ? (limits.max_bytes && bytes + b > limits.max_bytes) ||
                      (limits.max_tensors && i - begin >= limits.max_tensors)
                : std::find(limits.starts.begin(), limits.starts.end(), i) != limits.starts.end();
        if (i > begin && full) {
            ranges.emplace_back(begin, i);
            begin = i;
            bytes = 0;
        }
        bytes += b;
    }
    ranges.emplace_back(begin, tensors_.size());
    const size_t n = ranges.size();
    if (n > 65535) throw Error("gguf writer: a split model has at most 65535 shards");
    if (tensors_.size() > size_t(std::numeric_limits<int32_t>::max()))
        throw Error("gguf writer: too many tensors for split.tensors.count");

    std::vector<std::pair<std::string, Value>> first;
    bool has_alignment = false;
    for (const auto& kv : kv_) {
        if (kv.first.rfind("split.", 0) == 0) continue;  // ours to set
        if (kv.first == "general.alignment") {
            if (kv.second.as_uint() != uint64_t(alignment_))
                throw Error("gguf writer: general.alignment disagrees with the writer's alignment");
            has_alignment = true;
        }
        first.push_back(kv);
    }

    ProgressState st{&progress, 0, 0};
    for (const auto& t : tensors_) st.total += t.nbytes;
    std::vector<std::string> paths;
    for (size_t k = 0; k < n; ++k) {
        std::vector<std::pair<std::string, Value>> kv;
        if (k == 0) kv = first;
        if (alignment_ != kDefaultAlignment && (k > 0 || !has_alignment))
            kv.emplace_back("general.alignment", Value::make_uint(ValueType::U32, alignment_));
        kv.emplace_back("split.no", Value::make_uint(ValueType::U16, k));
        kv.emplace_back("split.count", Value::make_uint(ValueType::U16, n));
        kv.emplace_back("split.tensors.count", Value::make_int(ValueType::I32, tensors_.size()));
        paths.push_back(split_shard_path(prefix, int(k + 1), int(n)));
        write_file(paths.back(), kv, ranges[k].first, ranges[k].second, st);
    }
    return paths;
}

}  // namespace glm5::gguf

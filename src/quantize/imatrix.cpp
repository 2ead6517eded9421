#include "quantize/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace glm5::quantize {

namespace {

constexpr const char* kSums = ".in_sum2";
constexpr const char* kCounts = ".counts";

bool ends_with(const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_gguf(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("imatrix: cannot open " + path + ": " + std::strerror(errno));
    char magic[4] = {};
    in.read(magic, 4);
    return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

// A tensor's values as floats (the file's are F32; anything else is refused).
std::vector<float> floats_of(const gguf::TensorInfo& t, const std::string& path) {
    if (t.type != quant::Type::F32)
        throw Error("imatrix " + path + ": tensor " + t.name + " is " + quant::name(t.type) +
                    ", expected F32");
    std::vector<float> v(size_t(t.nelements()));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    return v;
}

Imatrix read_gguf(const std::string& path) {
    gguf::OpenOptions o;
    o.load_splits = false;
    const auto f = gguf::File::open(path, o);
    Imatrix m;
    if (const gguf::Value* d = f->find("imatrix.datasets"); d && d->is_array())
        for (size_t i = 0; i < d->size(); ++i)
            if (auto s = d->string_at(i)) m.datasets.emplace_back(*s);
    m.chunk_count = uint32_t(f->get_uint("imatrix.chunk_count", 0));
    m.chunk_size = uint32_t(f->get_uint("imatrix.chunk_size", 0));
    for (const gguf::TensorInfo& t : f->tensors()) {
        if (!ends_with(t.name, kSums)) continue;
        const std::string name = t.name.substr(0, t.name.size() - std::strlen(kSums));
        const gguf::TensorInfo* c = f->find_tensor(name + kCounts);
        if (!c) throw Error("imatrix " + path + ": " + t.name + " has no " + name + kCounts);
        const int64_t cols = t.ne[0], n_mat = t.ne[1] * t.ne[2] * t.ne[3];
        if (c->nelements() != n_mat && c->nelements() != 1)
            throw Error("imatrix " + path + ": " + name + kCounts + " has " +
                        std::to_string(c->nelements()) + " values for " + std::to_string(n_mat) +
                        " matrices");
        ImatrixEntry e;
        e.cols = cols;
        for (float v : floats_of(t, path)) e.sums.push_back(double(v));
        for (float v : floats_of(*c, path)) {
            if (!(v >= 0) || !std::isfinite(v))
                throw Error("imatrix " + path + ": " + name +
                            " has a negative or non-finite count");
            e.counts.push_back(int64_t(v));
        }
        m.entries[name] = std::move(e);
    }
    if (m.entries.empty()) throw Error("imatrix " + path + ": no NAME.in_sum2 tensors in the file");
    return m;
}

// A fixed-size field of a legacy file, or an error naming what was being read.
template <class T>
T get(std::ifstream& in, const std::string& path, const std::string& what) {
    T v{};
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    if (!in) throw Error("imatrix " + path + ": file ends while reading " + what);
    return v;
}

Imatrix read_legacy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    in.seekg(0, std::ios::end);
    const int64_t size = int64_t(in.tellg());
    in.seekg(0);
    const auto n_entries = get<int32_t>(in, path, "the entry count");
    // Every entry takes at least 16 bytes: a bound that refuses absurd counts early.
    if (n_entries < 1 || int64_t(n_entries) > size / 16)
        throw Error("imatrix " + path + ": not a GGUF file, and not a legacy imatrix (" +
                    std::to_string(n_entries) + " entries in " + std::to_string(size) + " bytes)");
    Imatrix m;
    m.legacy = true;
    for (int32_t i = 0; i < n_entries; ++i) {
        const std::string at = "entry " + std::to_string(i + 1);
        const auto len = get<int32_t>(in, path, at + "'s name length");
        if (len < 1 || len > 4096) throw Error("imatrix " + path + ": " + at + " has a bad name");
        std::string name(size_t(len), '\0');
        in.read(name.data(), len);
        const auto ncall = get<int32_t>(in, path, at + "'s call count");
        const auto nval = get<int32_t>(in, path, at + "'s value count");
        if (nval < 1 || int64_t(nval) * 4 > size)
            throw Error("imatrix " + path + ": " + name + " has a bad value count " +
                        std::to_string(nval));
        std::vector<float> v(static_cast<size_t>(nval));
        in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
        if (!in) throw Error("imatrix " + path + ": file ends inside " + name + "'s values");
        ImatrixEntry e;
        e.cols = nval;  // the legacy form does not say how a stack's values divide
        e.sums.assign(v.begin(), v.end());
        e.counts = {std::max<int64_t>(ncall, 0)};
        m.entries[name] = std::move(e);
    }
    // The chunk count and the dataset's name are optional trailers.
    int32_t chunks = 0;
    if (in.read(reinterpret_cast<char*>(&chunks), sizeof chunks)) {
        m.chunk_count = uint32_t(std::max(chunks, 0));
        int32_t len = 0;
        if (in.read(reinterpret_cast<char*>(&len), sizeof len) && len > 0 && len < 65536) {
            std::string d(size_t(len), '\0');
            if (in.read(d.data(), len)) m.datasets.push_back(d);
        }
    }
    return m;
}

}  // namespace

Imatrix Imatrix::read(const std::string& path) {
    return is_gguf(path) ? read_gguf(path) : read_legacy(path);
}

void Imatrix::write_gguf(const std::string& path) const {
    gguf::Writer w;
    w.set_string("general.type", "imatrix");
    w.set_array_string("imatrix.datasets", datasets);
    w.set_u32("imatrix.chunk_count", chunk_count);
    w.set_u32("imatrix.chunk_size", chunk_size);
    for (const auto& [name, e] : entries) {
        std::vector<float> sums(e.sums.begin(), e.sums.end());
        std::vector<float> counts(e.counts.begin(), e.counts.end());
        // llama.cpp's shape: one row per count (a stack of heads with one count is one row).
        const int64_t rows = int64_t(counts.size());
        w.add_tensor_bytes(name + kSums, quant::Type::F32, {int64_t(sums.size()) / rows, rows},
                           sums.data(), sums.size() * sizeof(float));
        w.add_tensor_bytes(name + kCounts, quant::Type::F32, {1, int64_t(counts.size())},
                           counts.data(), counts.size() * sizeof(float));
    }
    w.write(path);
}

void Imatrix::write_legacy(const std::string& path) const {
    if (legacy) throw Error("imatrix: a legacy file's statistics are written back only as GGUF");
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw Error("imatrix: cannot write " + tmp + ": " + std::strerror(errno));
        auto put = [&](auto v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); };
        put(int32_t(entries.size()));
        const int64_t chunk = std::max<int64_t>(chunk_size, 1);
        for (const auto& [name, e] : entries) {
            put(int32_t(name.size()));
            out.write(name.data(), std::streamsize(name.size()));
            const int64_t most = *std::max_element(e.counts.begin(), e.counts.end());
            const int32_t ncall = int32_t((most + chunk - 1) / chunk);
            put(ncall);
            put(int32_t(e.sums.size()));
            for (size_t i = 0; i < e.sums.size(); ++i) {
                const int64_t c = e.count(int64_t(i) / e.cols);
                put(c == 0 ? 1.0f : float(e.sums[i] / double(c) * double(ncall)));
            }
        }
        put(int32_t(chunk_count));
        const std::string d = datasets.empty() ? std::string() : datasets.back();
        put(int32_t(d.size()));
        out.write(d.data(), std::streamsize(d.size()));
        if (!out.flush()) throw Error("imatrix: cannot write " + tmp + ": " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw Error("imatrix: cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

std::optional<std::vector<float>> Imatrix::weights(const std::string& name) const {
    const ImatrixEntry* found = find(name);
    if (!found) return std::nullopt;
    const ImatrixEntry& e = *found;
    std::vector<float> w(e.sums.size());
    for (size_t i = 0; i < w.size(); ++i) {
        const int64_t c = e.count(int64_t(i) / e.cols);
        if (legacy)
            w[i] = c > 0 ? float(e.sums[i] / double(c)) : float(e.sums[i]);
        else
            w[i] = c > 0 ? float(e.sums[i] / double(c)) : 1.0f;
    }
    return w;
}

void Imatrix::merge(const Imatrix& o) {
    if (legacy || o.legacy) throw Error("imatrix: legacy files cannot be merged or resumed");
    if (chunk_size && o.chunk_size && chunk_size != o.chunk_size)
        throw Error("imatrix: chunk sizes differ (" + std::to_string(chunk_size) + " and " +
                    std::to_string(o.chunk_size) + " tokens)");
    for (const auto& [name, oe] : o.entries) {
        auto [it, fresh] = entries.emplace(name, oe);
        if (fresh) continue;
        ImatrixEntry& e = it->second;
        if (e.sums.size() != oe.sums.size())
            throw Error("imatrix: " + name + " has different sizes in the files merged");
        // A stack of heads with one count may be written as one long row: keep the blocks.
        e.cols = std::min(e.cols, oe.cols);
        for (size_t i = 0; i < e.sums.size(); ++i) e.sums[i] += oe.sums[i];
        if (e.counts.size() != oe.counts.size()) {
            // One count for all blocks beside one per block: spread the single one.
            const size_t n = size_t(e.n_mat());
            if (e.counts.size() == 1) e.counts.assign(n, e.counts[0]);
            std::vector<int64_t> oc =
                oe.counts.size() == 1 ? std::vector<int64_t>(n, oe.counts[0]) : oe.counts;
            for (size_t i = 0; i < n; ++i) e.counts[i] += oc[i];
        } else {
            for (size_t i = 0; i < e.counts.size(); ++i) e.counts[i] += oe.counts[i];
        }
    }
    datasets.insert(datasets.end(), o.datasets.begin(), o.datasets.end());
    chunk_count += o.chunk_count;
    if (!chunk_size) chunk_size = o.chunk_size;
}

bool ImatrixCollector::wanted(const std::string& name) const {
    return name.rfind("blk.", 0) == 0 || (include_output_ && name == "output.weight");
}

ImatrixEntry& ImatrixCollector::entry(const std::string& name, const backend::Weight& w,
                                      bool per_slice) {
    ImatrixEntry& e = data_.entries[name];
    if (e.sums.empty()) {
        e.cols = w.cols;
        e.sums.assign(size_t(w.cols * w.slices), 0.0);
        e.counts.assign(per_slice ? size_t(w.slices) : 1, 0);
    } else if (int64_t(e.sums.size()) != w.cols * w.slices) {
        throw Error("imatrix: " + name + " was seen with two shapes");
    } else if (per_slice && e.counts.size() == 1) {
        e.counts.assign(size_t(w.slices), e.counts[0]);
    }
    return e;
}

void ImatrixCollector::dense(const std::string& name, const backend::Weight& w, const float* x,
                             int64_t stride, int64_t slice_stride, int64_t n_rows) {
    if (!wanted(name)) return;
    std::lock_guard lock(mu_);
    ImatrixEntry& e = entry(name, w, false);
    for (int64_t s = 0; s < w.slices; ++s) {
        double* acc = e.sums.data() + s * w.cols;
        for (int64_t r = 0; r < n_rows; ++r) {
            const float* row = x + r * stride + s * slice_stride;
            for (int64_t j = 0; j < w.cols; ++j) acc[j] += double(row[j]) * double(row[j]);
        }
    }
    for (int64_t& c : e.counts) c += n_rows;
}

void ImatrixCollector::routed(const std::string& name, const backend::Weight& w, int64_t slice,
                              const float* x, int64_t stride, int64_t n_rows) {
    if (!wanted(name)) return;
    std::lock_guard lock(mu_);
    ImatrixEntry& e = entry(name, w, true);
    double* acc = e.sums.data() + slice * w.cols;
    for (int64_t r = 0; r < n_rows; ++r) {
        const float* row = x + r * stride;
        for (int64_t j = 0; j < w.cols; ++j) acc[j] += double(row[j]) * double(row[j]);
    }
    e.counts[size_t(slice)] += n_rows;
}

}  // namespace glm5::quantize

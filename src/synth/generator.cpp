// The generator core: per-tensor sampling, type selection, importance
// vectors and parallel streaming to the GGUF writer. Architecture-neutral:
// everything it knows about a model comes from a Layout (gen_layout.h).
#include "synth/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "gguf/writer.h"
#include "quant/quant.h"
#include "quantize/mix.h"
#include "synth/layout.h"
#include "synth/random.h"

namespace glm5::synth {

using quantize::assign_types;
using quantize::is_quantizable;
using quantize::MixTensor;
using quantize::parse_scheme;
using quantize::QuantScheme;
using quantize::type_requires_imatrix;

using quant::Type;

const char* const kImatrixDescription =
    "derived, not measured: the input of every matrix is an RMS-normalised vector times a "
    "norm weight w, so E[x_j^2] is proportional to w_j^2; the importance of input j is "
    "w_j^2 (1 for inputs with no norm in front: attn_k_b, attn_output, ffn_down*)";

namespace {

std::string upper(std::string s) {
    for (char& c : s) c = char(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    return s;
}

int64_t n_rows_of(const std::vector<int64_t>& ne) {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
}

int64_t n_elements_of(const std::vector<int64_t>& ne) {
    return ne[0] * n_rows_of(ne);
}

// How one tensor's float samples are made: value = float(z + offset) * unit,
// z the fixed-point Irwin–Hall sample. One float multiply of an exact integer,
// so the result is the same on every platform.
struct Sampler {
    uint64_t stream = 0;
    int32_t offset = 0;
    float unit = 0;

    Sampler(uint64_t seed, const TensorSpec& s) {
        stream = stream_seed(seed, s.name);
        unit = float(s.stddev * double(kNormalUnit));
        // mean = offset * unit; the offset is a whole number of units so that
        // z + offset stays an exact integer (|z + offset| < 2^24 keeps it exact
        // in float too).
        const double off = s.stddev > 0 ? std::round(s.mean / (s.stddev * double(kNormalUnit))) : 0;
        if (std::fabs(off) > double((1 << 24) - 400000))
            throw Error("generator: mean/std ratio of " + s.name + " is too large");
        offset = int32_t(off);
    }

    void fill(int64_t first, int64_t n, float* out) const {
        for (int64_t i = 0; i < n; ++i)
            out[i] = float(normal_fixed(stream, uint64_t(first + i)) + offset) * unit;
    }
};

// A quantized pool per (type, std): 2^20 samples from a stream of their own,
// quantized once, copied block by block into every matrix of that class.
constexpr int64_t kPoolValues = int64_t(1) << 20;

class PoolCache {
  public:
    // uniform_importance: quantize with importance 1 for every column (a pool
    // serves many matrices, so no one matrix's norm weights apply).
    PoolCache(uint64_t seed, ThreadPool& pool, bool uniform_importance)
        : seed_(seed), pool_(pool), uniform_(uniform_importance) {}

    // Not thread-safe: called from the writer's thread, between tensors.
    const std::vector<uint8_t>& get(Type t, double stddev) {
        uint64_t bits;
        std::memcpy(&bits, &stddev, 8);
        const auto key = std::make_pair(uint32_t(t), bits);
        auto it = pools_.find(key);
        if (it != pools_.end()) return it->second;
        char tag[64];
        std::snprintf(tag, sizeof tag, "pool:%s:%016llx", quant::name(t), (unsigned long long)bits);
        TensorSpec s;
        s.name = tag;
        s.stddev = stddev;
        const Sampler smp(seed_, s);
        // Rows of 4096 values (or one block when blocks are longer).
        const int64_t row = std::max<int64_t>(quant::traits(t).block_size, 4096);
        const int64_t rows = kPoolValues / row;
        const size_t row_bytes = quant::row_size(t, row);
        std::vector<uint8_t> bytes(row_bytes * size_t(rows));
        std::vector<std::vector<float>> bufs(size_t(pool_.size()));
        const std::vector<float> ones(uniform_ ? size_t(row) : 0, 1.0f);
        pool_.parallel_for(rows, 1, [&](int64_t r0, int64_t r1, int ith) {
            auto& buf = bufs[size_t(ith)];
            buf.resize(size_t(row));
            for (int64_t r = r0; r < r1; ++r) {
                smp.fill(r * row, row, buf.data());
                quant::quantize_rows(t, buf.data(), bytes.data() + size_t(r) * row_bytes, 1, row,
                                     uniform_ ? ones.data() : nullptr);
            }
        });
        return pools_.emplace(key, std::move(bytes)).first->second;
    }

  private:
    uint64_t seed_;
    ThreadPool& pool_;
    bool uniform_;
    std::map<std::pair<uint32_t, uint64_t>, std::vector<uint8_t>> pools_;
};

// Everything decided about a model before writing it.
struct Resolved {
    Layout layout;
    QuantScheme scheme;
    std::vector<Type> types;
    std::vector<bool> pooled;   // blocks copied from a quantized pool
    std::vector<bool> imatrix;  // quantized with an importance vector
    bool use_imatrix = false;
    std::string name;
    std::unordered_map<std::string, size_t> index;
};

Layout build_layout(const GenOptions& opt) {
    switch (opt.arch) {
        case Arch::GlmDsa:
            return build_glm_dsa_layout(opt.glm_dsa);
        case Arch::Glm5Next:
            return build_glm5next_layout(opt.glm5next);
    }
    throw Error("generator: unknown architecture");
}

Resolved resolve(const GenOptions& opt) {
    Resolved r;
    r.layout = build_layout(opt);
    auto scheme = parse_scheme(opt.type, opt.pure);
    if (!scheme) throw Error("unknown weight type or mix '" + opt.type + "'");
    r.scheme = *scheme;
    const auto& specs = r.layout.tensors;
    for (size_t i = 0; i < specs.size(); ++i) r.index.emplace(specs[i].name, i);

    std::vector<MixTensor> mt(specs.size());
    for (size_t i = 0; i < specs.size(); ++i)
        mt[i] = MixTensor{specs[i].name, specs[i].ne, specs[i].f32_in_float_files,
                          specs[i].keep_f32 ? std::optional<Type>(Type::F32) : std::nullopt};

    // First pass: does the mix, left alone, need importance data anywhere?
    MixModel mm = r.layout.mix;
    mm.has_imatrix = false;
    bool needs = false;
    {
        const auto t0 = assign_types(r.scheme, mm, mt);
        for (size_t i = 0; i < specs.size(); ++i)
            needs = needs || type_requires_imatrix(specs[i].name, t0[i], r.scheme.ftype);
    }
    if (opt.imatrix == ImatrixMode::Off && needs)
        throw Error("the " + r.scheme.name +
                    " mix needs an importance matrix (--imatrix auto or on)");
    r.use_imatrix = opt.imatrix == ImatrixMode::On || (opt.imatrix == ImatrixMode::Auto && needs);

    std::optional<Type> nextn;
    const std::string nt = upper(opt.nextn_type);
    if (nt == "AUTO") {
        if (needs) nextn = Type::Q4_K;
    } else if (nt != "MIX") {
        nextn = quant::type_from_name(nt);
        if (!nextn) throw Error("unknown NextN type '" + opt.nextn_type + "'");
    }
    for (size_t i = 0; i < specs.size(); ++i)
        if (specs[i].nextn && nextn && !specs[i].keep_f32 &&
            is_quantizable(specs[i].name, specs[i].ne))
            mt[i].override_type = nextn;

    mm.has_imatrix = r.use_imatrix;
    r.types = assign_types(r.scheme, mm, mt);
    r.pooled.resize(specs.size());
    r.imatrix.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
        const bool q = quant::traits(r.types[i]).quantized;
        r.pooled[i] = q && opt.blocks == BlockSource::Pool;
        r.imatrix[i] = q && r.use_imatrix && !specs[i].is_lookup && !r.pooled[i];
    }
    r.name = opt.name;
    if (r.name.empty())
        r.name = "glm5.cpp synthetic " + r.layout.arch + " (" + opt.preset + ", " + r.scheme.name +
                 ", seed " + std::to_string(opt.seed) + ")";
    return r;
}

// E[x_j^2] of a matrix's input: the squared norm weights in front of it.
std::vector<float> importance(const Resolved& r, uint64_t seed, const TensorSpec& s) {
    std::vector<float> imp;
    if (s.input_norms.empty()) {
        imp.assign(size_t(s.ne[0]), 1.0f);
        return imp;
    }
    for (const std::string& n : s.input_norms) {
        auto it = r.index.find(n);
        if (it == r.index.end()) throw Error("generator: " + s.name + " refers to unknown " + n);
        const TensorSpec& ns = r.layout.tensors[it->second];
        std::vector<float> w(size_t(n_elements_of(ns.ne)));
        Sampler(seed, ns).fill(0, int64_t(w.size()), w.data());
        for (float v : w) imp.push_back(v * v);
    }
    if (int64_t(imp.size()) != s.ne[0])
        throw Error("generator: the norms in front of " + s.name + " do not match its rows");
    return imp;
}

// Produces one tensor's bytes, rows in parallel.
void fill_tensor(const Resolved& r, size_t i, uint64_t seed, ThreadPool& pool, PoolCache& pools,
                 uint8_t* dst, size_t nbytes) {
    const TensorSpec& s = r.layout.tensors[i];
    const Type t = r.types[i];
    const int64_t ne0 = s.ne[0], rows = n_rows_of(s.ne);
    const size_t row_bytes = quant::row_size(t, ne0);
    if (row_bytes * size_t(rows) != nbytes) throw Error("generator: size mismatch for " + s.name);

    if (r.pooled[i]) {
        const std::vector<uint8_t>& blocks = pools.get(t, s.stddev);
        const size_t bsz = quant::traits(t).type_size;
        const uint64_t n_pool = blocks.size() / bsz;  // a power of two
        const int64_t bpr = ne0 / quant::traits(t).block_size;
        const uint64_t stream = stream_seed(seed, s.name + "#pool");
        pool.parallel_for(rows, std::max<int64_t>(1, 4096 / bpr), [&](int64_t r0, int64_t r1, int) {
            for (int64_t b = r0 * bpr; b < r1 * bpr; ++b) {
                const uint64_t pick = draw64(stream, uint64_t(b)) & (n_pool - 1);
                std::memcpy(dst + size_t(b) * bsz, blocks.data() + pick * bsz, bsz);
            }
        });
        return;
    }

    const Sampler smp(seed, s);
    std::vector<float> imp;
    if (r.imatrix[i]) imp = importance(r, seed, s);
    const float* imatrix = imp.empty() ? nullptr : imp.data();
    std::vector<std::vector<float>> bufs(size_t(pool.size()));
    // About 64K values per chunk: enough work per hand-out, little memory.
    const int64_t grain = std::max<int64_t>(1, 65536 / ne0);
    pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int ith) {
        const int64_t n = (r1 - r0) * ne0;
        std::vector<float>& buf = bufs[size_t(ith)];
        if (int64_t(buf.size()) < n) buf.resize(size_t(n));
        smp.fill(r0 * ne0, n, buf.data());
        uint8_t* out = dst + size_t(r0) * row_bytes;
        switch (t) {
            case Type::F32:
                std::memcpy(out, buf.data(), size_t(n) * 4);
                break;
            case Type::F16:
                for (int64_t k = 0; k < n; ++k) {
                    const uint16_t h = fp32_to_fp16(buf[size_t(k)]);
                    std::memcpy(out + 2 * k, &h, 2);
                }
                break;
            case Type::BF16:
                for (int64_t k = 0; k < n; ++k) {
                    const uint16_t h = fp32_to_bf16(buf[size_t(k)]);
                    std::memcpy(out + 2 * k, &h, 2);
                }
                break;
            default:
                quant::quantize_rows(t, buf.data(), out, r1 - r0, ne0, imatrix);
                break;
        }
    });
}

ModelPlan make_plan(const Resolved& r) {
    ModelPlan p;
    p.arch = r.layout.arch;
    p.base_type = r.scheme.base;
    p.file_type = uint32_t(r.scheme.ftype);
    p.imatrix = r.use_imatrix;
    const auto& specs = r.layout.tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
        TensorPlan tp;
        tp.name = specs[i].name;
        tp.ne = specs[i].ne;
        tp.type = r.types[i];
        tp.mean = specs[i].mean;
        tp.stddev = specs[i].stddev;
        tp.pooled = r.pooled[i];
        tp.uses_imatrix = r.imatrix[i];
        p.n_params += uint64_t(n_elements_of(tp.ne));
        p.tensor_bytes += quant::row_size(tp.type, tp.ne[0]) * uint64_t(n_rows_of(tp.ne));
        ++p.type_counts[quant::name(tp.type)];
        p.tensors.push_back(std::move(tp));
    }
    return p;
}

}  // namespace

ModelPlan plan(const GenOptions& opt) {
    return make_plan(resolve(opt));
}

DecodeBytes decode_bytes_per_token(const GenOptions& opt) {
    const Resolved r = resolve(opt);
    const bool next = opt.arch == Arch::Glm5Next;
    const int64_t n_used = next ? opt.glm5next.n_expert_used : opt.glm_dsa.n_expert_used;
    const int64_t n_expert = next ? opt.glm5next.n_expert : opt.glm_dsa.n_expert;
    DecodeBytes d;
    const auto& specs = r.layout.tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& s = specs[i];
        if (s.nextn) continue;
        const uint64_t row = quant::row_size(r.types[i], s.ne[0]);
        const uint64_t bytes = row * uint64_t(n_rows_of(s.ne));
        const auto has = [&](const char* x) { return s.name.find(x) != std::string::npos; };
        if (s.is_lookup)
            d.head += row;  // one token's row
        else if (s.name.rfind("blk.", 0) != 0)
            d.head += bytes;
        else if (has("_exps."))
            d.routed += bytes / uint64_t(n_expert) * uint64_t(n_used);
        else if (has("_shexp."))
            d.shared += bytes;
        else
            d.dense += bytes;
    }
    return d;
}

void sample_rows(const GenOptions& opt, const std::string& tensor, int64_t row0, int64_t n_rows,
                 float* out) {
    const Layout L = build_layout(opt);
    for (const TensorSpec& s : L.tensors) {
        if (s.name != tensor) continue;
        if (row0 < 0 || n_rows < 0 || row0 + n_rows > n_rows_of(s.ne))
            throw Error("sample_rows: rows out of range for " + tensor);
        Sampler(opt.seed, s).fill(row0 * s.ne[0], n_rows * s.ne[0], out);
        return;
    }
    throw Error("sample_rows: no tensor " + tensor);
}

std::vector<float> importance_vector(const GenOptions& opt, const std::string& tensor) {
    const Resolved r = resolve(opt);
    auto it = r.index.find(tensor);
    if (it == r.index.end()) throw Error("importance_vector: no tensor " + tensor);
    const TensorSpec& s = r.layout.tensors[it->second];
    if (s.is_lookup || s.ne.size() < 2)
        throw Error("importance_vector: " + tensor + " is no matmul weight");
    return importance(r, opt.seed, s);
}

GenResult generate(const GenOptions& opt, const std::string& path,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
    const auto t0 = std::chrono::steady_clock::now();
    const Resolved r = resolve(opt);
    using gguf::Value;
    using gguf::ValueType;

    gguf::Writer w;
    w.set_string("general.architecture", r.layout.arch);
    w.set_string("general.name", r.name);
    w.set_string("general.type", "model");
    w.set_u32("general.file_type", uint32_t(r.scheme.ftype));
    w.set_u32("general.quantization_version", 2);
    for (const auto& [k, v] : r.layout.metadata) w.set(k, v);
    if (r.use_imatrix) {
        uint32_t entries = 0;
        for (bool b : r.imatrix) entries += b;
        const bool pooled = opt.blocks == BlockSource::Pool;
        w.set_string("quantize.imatrix.file", "(none: derived by glm5 make-model)");
        w.set_string("quantize.imatrix.dataset",
                     pooled ? "pooled blocks, quantized with importance 1 for every column"
                            : kImatrixDescription);
        w.set_u32("quantize.imatrix.entries_count", entries);
    }

    const int n_threads = opt.n_threads > 0 ? opt.n_threads : ThreadPool::default_threads();
    ThreadPool pool(n_threads);
    PoolCache pools(opt.seed, pool, r.use_imatrix);
    const uint64_t seed = opt.seed;
    for (size_t i = 0; i < r.layout.tensors.size(); ++i) {
        const TensorSpec& s = r.layout.tensors[i];
        w.add_tensor(s.name, r.types[i], s.ne,
                     [&r, i, seed, &pool, &pools](uint8_t* dst, size_t n) {
                         fill_tensor(r, i, seed, pool, pools, dst, n);
                     });
    }
    w.write(path, progress);

    GenResult res;
    res.plan = make_plan(r);
    res.file_bytes = std::filesystem::file_size(path);
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace glm5::synth

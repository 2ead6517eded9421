#include "quantize/quantize_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/mmap_file.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace glm5::quantize {

namespace {

using quant::Type;

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower((unsigned char)c));
    return s;
}

std::vector<int64_t> dims(const gguf::TensorInfo& t) {
    return std::vector<int64_t>(t.ne.begin(), t.ne.begin() + std::max(t.n_dims, 1));
}

bool is_float(Type t) {
    return t == Type::F32 || t == Type::F16 || t == Type::BF16;
}

// The largest value of a per-layer array key, or the key's value.
int max_of(const gguf::File& f, const std::string& key, int dflt) {
    const gguf::Value* v = f.find(key);
    if (!v) return dflt;
    if (!v->is_array()) return int(v->as_uint().value_or(uint64_t(dflt)));
    int m = 0;
    for (size_t i = 0; i < v->size(); ++i) m = std::max(m, int((*v)[i].as_uint().value_or(0)));
    return m;
}

MixModel mix_model(const gguf::File& f, const std::string& arch, bool has_imatrix) {
    MixModel m;
    m.n_layer_all = int(f.get_uint(arch + ".block_count", 0));
    m.n_expert = int(f.get_uint(arch + ".expert_count", 0));
    m.n_head = std::max(1, max_of(f, arch + ".attention.head_count", 1));
    m.n_head_kv = std::max(1, max_of(f, arch + ".attention.head_count_kv", m.n_head));
    m.n_nextn = int(f.get_uint(arch + ".nextn_predict_layers", 0));
    m.has_imatrix = has_imatrix;
    return m;
}

// A vision tower's matrices: the transformer blocks and the projector, not the patch
// embedding (a convolution) or the position table.
bool clip_quantizable(const std::string& name, const std::vector<int64_t>& ne) {
    return ne.size() == 2 && is_quantizable(name, ne) &&
           (name.rfind("v.blk.", 0) == 0 || name.rfind("mm.", 0) == 0);
}

// The user's choice for a tensor, ahead of the mix: the embedding and output types, then
// the first --tensor-type pattern found in its name (patterns only where the mix quantizes,
// as llama-quantize has it).
std::optional<Type> user_type(const std::string& name, const QuantizeOptions& o,
                              bool mix_quantizes) {
    if (o.embedding_type && name == "token_embd.weight") return o.embedding_type;
    if (o.output_type && name == "output.weight") return o.output_type;
    if (mix_quantizes)
        for (const TypeOverride& p : o.tensor_types)
            if (std::regex_search(name, p.re)) return p.type;
    return std::nullopt;
}

// Attaches the importance data a tensor's type wants, or refuses, or (the NextN block,
// which no imatrix run reaches) falls back to Q4_K.
void check_imatrix(TensorPlan& tp, const QuantizeOptions& o, const QuantScheme& s,
                   const MixModel& mm) {
    const gguf::TensorInfo& t = *tp.in;
    if (!tp.convert || !quant::traits(tp.type).quantized) return;
    const bool required = type_requires_imatrix(t.name, tp.type, s.ftype);
    // The entry's size is checked here; its weights are made when the tensor is written.
    if (const ImatrixEntry* e = o.imatrix ? o.imatrix->find(t.name) : nullptr) {
        const int64_t want = t.ne[0] * t.ne[2], have = int64_t(e->sums.size());
        if (have == want) {
            tp.imatrix = true;
            return;
        }
        if (t.name != "token_embd.weight")
            throw Error("the importance matrix has " + std::to_string(have) + " values for " +
                        t.name + ", which needs " + std::to_string(want) +
                        " (a matrix from another model?)");
    }
    if (!required) return;
    if (in_nextn(t.name, mm)) {
        tp.type = block_fallback(Type::Q4_K, t.ne[0]);
        tp.note = std::string(quant::name(tp.type)) + ": no importance data for the NextN block";
        return;
    }
    if (!o.imatrix)
        throw Error(t.name + " would be " + quant::name(tp.type) +
                    ", which needs an importance matrix: give --imatrix FILE (glm5 imatrix "
                    "makes one), or choose a type of 3 bits or more");
    throw Error("the importance matrix has no entry for " + t.name + ", which would be " +
                quant::name(tp.type) +
                " and needs one: give it a higher type with --tensor-type '" + t.name +
                "=q4_K', or collect the matrix over the whole model");
}

}  // namespace

quant::Type parse_weight_type(const std::string& name, const std::string& what) {
    const auto t = quant::type_from_name(name);  // any case
    if (!t || !quant::traits(*t).weight_format) throw Error(what + ": unknown type '" + name + "'");
    return *t;
}

TypeOverride parse_type_override(const std::string& arg) {
    const size_t eq = arg.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
        throw Error("--tensor-type expects PATTERN=TYPE, got '" + arg + "'");
    const Type t = parse_weight_type(arg.substr(eq + 1), "--tensor-type '" + arg + "'");
    TypeOverride r;
    r.pattern = lower(arg.substr(0, eq));
    try {
        r.re = std::regex(r.pattern);
    } catch (const std::regex_error& e) {
        throw Error("--tensor-type '" + arg + "': bad pattern: " + e.what());
    }
    r.type = t;
    return r;
}

QuantizePlan plan_quantize(const gguf::File& in, const QuantizeOptions& o) {
    QuantizePlan p;
    p.arch = in.get_string("general.architecture");
    const auto scheme = parse_scheme(o.scheme, o.pure);
    if (!scheme) throw Error("unknown type or mix '" + o.scheme + "'");
    p.scheme = *scheme;
    const bool clip = p.arch == "clip";
    if (clip) p.scheme.pure = true;  // no per-layer rules for a vision tower
    const MixModel mm = mix_model(in, p.arch, o.imatrix != nullptr);
    const bool mix_quantizes = quant::traits(p.scheme.base).quantized;

    std::vector<MixTensor> mt;
    for (const gguf::TensorInfo& t : in.tensors()) {
        MixTensor m{t.name, dims(t), false, std::nullopt};
        m.override_type = user_type(t.name, o, mix_quantizes);
        if (p.arch == "glm5next" && glm5next_keeps_f32(t.name)) m.override_type = Type::F32;
        mt.push_back(std::move(m));
    }
    const std::vector<Type> types = assign_types(p.scheme, mm, mt);

    for (size_t i = 0; i < in.tensors().size(); ++i) {
        const gguf::TensorInfo& t = in.tensors()[i];
        TensorPlan tp;
        tp.in = &t;
        const bool q = clip ? clip_quantizable(t.name, mt[i].ne) : is_quantizable(t.name, mt[i].ne);
        // A tensor the rules do not quantize keeps its type, a matching pattern or not.
        tp.type = q ? types[i] : t.type;
        if (quant::traits(tp.type).quantized) tp.type = block_fallback(tp.type, t.ne[0]);
        tp.convert = tp.type != t.type;
        if (tp.convert && !is_float(t.type) && !o.allow_requantize)
            throw Error(t.name + " is stored as " + quant::name(t.type) +
                        "; quantizing it again loses more than quantizing the original: start "
                        "from the F16/BF16 file, or give --allow-requantize");
        if (tp.convert && !quant::traits(t.type).weight_format)
            throw Error(t.name + " is stored as " + quant::name(t.type) +
                        ", which this program cannot read");
        check_imatrix(tp, o, p.scheme, mm);
        tp.convert = tp.type != t.type;
        tp.out_bytes = quant::row_size(tp.type, t.ne[0]) * size_t(t.nrows());
        p.in_bytes += t.nbytes;
        p.out_bytes += tp.out_bytes;
        p.tensors.push_back(std::move(tp));
    }
    return p;
}

namespace {

// One tensor's conversion, a piece of whole output rows at a time: rows are converted to
// floats and quantized on every thread, each slice (expert) with its own importance weights.
struct Converter {
    const TensorPlan& tp;
    ThreadPool& pool;
    std::vector<std::vector<float>>& scratch;  // per thread
    std::vector<float> imatrix;                // n_mat * cols, or empty

    void piece(uint8_t* dst, size_t offset, size_t nbytes) {
        const gguf::TensorInfo& t = *tp.in;
        const int64_t cols = t.ne[0], rows_per_slice = t.ne[1];
        const size_t out_row = quant::row_size(tp.type, cols), in_row = t.row_bytes();
        const int64_t r0 = int64_t(offset / out_row), n = int64_t(nbytes / out_row);
        const int64_t grain =
            std::max<int64_t>(1, int64_t(kRowsBytes / (size_t(cols) * sizeof(float))));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int ith) {
            std::vector<float>& f = scratch[size_t(ith)];
            f.resize(size_t((e - b) * cols));
            for (int64_t r = b; r < e; ++r)
                quant::dequantize_row(t.type, t.data + size_t(r0 + r) * in_row,
                                      f.data() + (r - b) * cols, cols);
            // A run of rows within one slice at a time: each slice has its own weights.
            for (int64_t r = b; r < e;) {
                const int64_t slice = (r0 + r) / rows_per_slice;
                const int64_t end = std::min(e, (slice + 1) * rows_per_slice - r0);
                const float* w =
                    imatrix.empty() ? nullptr : imatrix.data() + (slice % t.ne[2]) * cols;
                quant::quantize_rows(tp.type, f.data() + (r - b) * cols, dst + size_t(r) * out_row,
                                     end - r, cols, w);
                r = end;
            }
        });
        release_mapped_pages(t.data + size_t(r0) * in_row, size_t(n) * in_row);
    }
};

// llama-quantize's order (loader_order), or with the input's shards kept, the input's.
std::vector<size_t> write_order(const QuantizePlan& plan, bool input_order) {
    if (!input_order)
        return loader_order(plan.tensors.size(), [&](size_t i) -> const std::string& {
            return plan.tensors[i].in->name;
        });
    std::vector<size_t> order(plan.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    return order;
}

}  // namespace

std::vector<std::string> write_quantized(const gguf::File& in, const QuantizePlan& plan,
                                         const QuantizeOptions& o, const std::string& out,
                                         const std::function<void(uint64_t, uint64_t)>& progress) {
    gguf::Writer w(uint32_t(in.alignment()));
    // llama-quantize's order: the input's keys, then the ones it sets, each moved to the end
    // (so that a file it would write comes out byte for byte).
    for (const auto& [key, v] : in.metadata()) {
        if (key.rfind("split.", 0) == 0 || key.rfind("quantize.imatrix.", 0) == 0 ||
            key == "general.quantization_version" || key == "general.file_type")
            continue;
        w.set(key, v);
    }
    w.set_u32("general.quantization_version", 2);
    w.set_u32("general.file_type", uint32_t(plan.scheme.ftype));
    if (o.imatrix) {
        w.set_string("quantize.imatrix.file", o.imatrix_path);
        if (!o.imatrix->datasets.empty())
            w.set_string("quantize.imatrix.dataset", o.imatrix->datasets.front());
        w.set_u32("quantize.imatrix.entries_count", uint32_t(o.imatrix->entries.size()));
        if (o.imatrix->chunk_count > 0)
            w.set_u32("quantize.imatrix.chunks_count", o.imatrix->chunk_count);
    }

    ThreadPool pool(o.n_threads > 0 ? o.n_threads : ThreadPool::default_threads());
    std::vector<std::vector<float>> scratch(size_t(pool.size()));
    for (const size_t i : write_order(plan, !o.split.starts.empty())) {
        const TensorPlan& tp = plan.tensors[i];
        const gguf::TensorInfo& t = *tp.in;
        if (!tp.convert) {
            w.add_tensor_pieces(t.name, t.type, dims(t), o.piece_bytes,
                                [&t](uint8_t* dst, size_t off, size_t n) {
                                    std::memcpy(dst, t.data + off, n);
                                    release_mapped_pages(t.data + off, n);
                                });
            continue;
        }
        // The importance weights are made when the tensor's first piece is written and
        // dropped after its last, so that one tensor's are in memory at a time.
        auto conv = std::make_shared<std::optional<Converter>>();
        w.add_tensor_pieces(t.name, tp.type, dims(t), o.piece_bytes,
                            [&, conv, tpp = &tp](uint8_t* dst, size_t off, size_t n) {
                                if (!*conv) {
                                    conv->emplace(Converter{*tpp, pool, scratch, {}});
                                    if (tpp->imatrix)
                                        (*conv)->imatrix = *o.imatrix->weights(tpp->in->name);
                                }
                                (*conv)->piece(dst, off, n);
                                if (off + n == tpp->out_bytes) conv->reset();
                            });
    }
    if (o.split.max_bytes || o.split.max_tensors || !o.split.starts.empty())
        return w.write_split(out, o.split, progress);
    w.write(out, progress);
    return {out};
}

}  // namespace glm5::quantize

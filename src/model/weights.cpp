#include "model/weights.h"

#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace glm5::model {

namespace {

std::string shape_str(std::initializer_list<int64_t> ne) {
    std::string s = "[";
    bool first = true;
    for (int64_t v : ne) {
        if (!first) s += ", ";
        s += std::to_string(v);
        first = false;
    }
    return s + "]";
}

}  // namespace

std::string TensorSource::where() const {
    return file_.path();
}

bool TensorSource::has(const std::string& name) const {
    return file_.find_tensor(name) != nullptr;
}

const gguf::TensorInfo& TensorSource::find(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(where() + ": missing tensor " + name);
    return *t;
}

backend::Weight TensorSource::matrix(const std::string& name, std::initializer_list<int64_t> ne) {
    const gguf::TensorInfo& t = find(name);
    const size_t nd = ne.size();
    bool ok = nd >= 2 && nd <= 3;
    auto it = ne.begin();
    for (size_t i = 0; ok && i < 4; ++i) {
        const int64_t want = i < nd ? it[i] : 1;
        if (t.ne[i] != want) ok = false;
    }
    if (!ok)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected " + shape_str(ne));
    const quant::TypeTraits& tt = quant::traits(t.type);
    if (!tt.weight_format)
        throw Error(where() + ": tensor " + name + " has type " + tt.name +
                    ", which is not a weight format");
    backend::Weight w;
    w.type = t.type;
    w.cols = t.ne[0];
    w.rows = t.ne[1];
    w.slices = t.ne[2];
    w.row_bytes = quant::row_size(t.type, t.ne[0]);
    w.slice_bytes = w.row_bytes * size_t(t.ne[1]);
    w.data = t.data;
    bytes_used_ += t.nbytes;
    return w;
}

const float* TensorSource::vector_any_shape(const std::string& name, int64_t n) {
    const gguf::TensorInfo& t = find(name);
    if (t.nelements() != n)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected " + std::to_string(n) + " values");
    bytes_used_ += t.nbytes;
    if (t.type == quant::Type::F32) return reinterpret_cast<const float*>(t.data);
    if (t.type != quant::Type::F16 && t.type != quant::Type::BF16)
        throw Error(where() + ": tensor " + name + " has type " + quant::name(t.type) +
                    ", expected F32, F16 or BF16");
    converted_.emplace_back(size_t(n));
    quant::dequantize_row(t.type, t.data, converted_.back().data(), n);
    return converted_.back().data();
}

const float* TensorSource::vector(const std::string& name, int64_t n) {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 1 || t.ne[0] != n)
        throw Error(where() + ": tensor " + name + " has shape " + t.shape_string() +
                    ", expected [" + std::to_string(n) + "]");
    return vector_any_shape(name, n);
}

}  // namespace glm5::model

// The op families of a backend the tests drive directly (backend/*_ops.h): a test that
// asks for a family the backend lacks fails with the refusal's message.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/attention_ops.h"
#include "backend/backend.h"
#include "backend/linear_ops.h"
#include "backend/moe_ops.h"
#include "backend/vision_ops.h"

namespace glm5::test {

inline backend::AttentionOps& attn_ops(backend::Backend& be) {
    return backend::require<backend::AttentionOps>(be, "the test");
}
inline backend::LinearOps& linear_ops(backend::Backend& be) {
    return backend::require<backend::LinearOps>(be, "the test");
}
inline backend::MoeOps& moe_ops(backend::Backend& be) {
    return backend::require<backend::MoeOps>(be, "the test");
}
inline backend::VisionOps& vision_ops(backend::Backend& be) {
    return backend::require<backend::VisionOps>(be, "the test");
}

// An F32 matrix [cols -> rows] over `v` (a router), not copied.
inline backend::Weight f32_matrix(const std::vector<float>& v, int64_t cols, int64_t rows) {
    backend::Weight w;
    w.type = quant::Type::F32;
    w.cols = cols;
    w.rows = rows;
    w.row_bytes = size_t(cols) * 4;
    w.slice_bytes = w.row_bytes * size_t(rows);
    w.data = reinterpret_cast<const uint8_t*>(v.data());
    return w;
}

}  // namespace glm5::test

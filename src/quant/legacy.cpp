// Legacy 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (weights) and
// Q8_0 / Q8_1 (activations).
//
//   Q4_0  x = d * (q - 8),   q in 0..15      Q4_1  x = d * q + m,  q in 0..15
//   Q5_0  x = d * (q - 16),  q in 0..31      Q5_1  x = d * q + m,  q in 0..31
//   Q8_0  x = d * q,         q in -127..127  Q8_1  as Q8_0, plus s = d * sum(q)
//
// 4-bit values: element j (< 16) in the low nibble of qs[j], element j + 16
// in the high nibble; the fifth bit of element j is bit j of qh.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/common.h"
#include "quant/kernels.h"
#include "quant/ops.h"
#include "quant/scale_search.h"

namespace glm5::quant {

namespace {

inline float f16(uint16_t h) {
    return fp16_to_fp32(h);
}
inline uint16_t to_f16(float f) {
    return fp32_to_fp16(f);
}

inline uint32_t load_qh(const uint8_t* qh) {
    uint32_t v;
    std::memcpy(&v, qh, 4);
    return v;
}

// ---------------------------------------------------------------- dequantize
// Element values are formed exactly as ggml's to_float: an int level times d
// (one rounding), plus m for the offset formats (a second rounding).

void dequant_q4_0(const void* src, float* y, int64_t n) {
    const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = float((b[i].qs[j] & 0xF) - 8) * d;
            y[j + QK / 2] = float((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void dequant_q4_1(const void* src, float* y, int64_t n) {
    const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d), m = f16(b[i].m);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = float(b[i].qs[j] & 0xF) * d + m;
            y[j + QK / 2] = float(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void dequant_q5_0(const void* src, float* y, int64_t n) {
    const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d);
        const uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = float(lo - 16) * d;
            y[j + QK / 2] = float(hi - 16) * d;
        }
    }
}

void dequant_q5_1(const void* src, float* y, int64_t n) {
    const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d), m = f16(b[i].m);
        const uint32_t qh = load_qh(b[i].qh);
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = float(lo) * d + m;
            y[j + QK / 2] = float(hi) * d + m;
        }
    }
}

void dequant_q8_0(const void* src, float* y, int64_t n) {
    const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d);
        for (int j = 0; j < QK; ++j) y[j] = float(b[i].qs[j]) * d;
    }
}

void dequant_q8_1(const void* src, float* y, int64_t n) {
    const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = f16(b[i].d);
        for (int j = 0; j < QK; ++j) y[j] = float(b[i].qs[j]) * d;
    }
}

// ---------------------------------------------------------------- quantize
// Without importance weights: ggml's reference ("ref") quantizers, which is
// what llama-quantize runs then. With them: the weighted searches of ggml's
// quantize_q*_*(..., quant_weights), element weights qw * sqrt(sigma2 + x^2)
// where sigma2 is the row's mean square.

void pack_nibbles(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < QK / 2; ++j) qs[j] = uint8_t(L[j] | (L[j + QK / 2] << 4));
}

// Low 4 bits into qs, fifth bits into the 32-bit qh mask.
void pack_5bit(const uint8_t* L, uint8_t* qs, uint8_t* qh_out) {
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; ++j) {
        const uint8_t lo = L[j], hi = L[j + QK / 2];
        qs[j] = uint8_t((lo & 0x0F) | ((hi & 0x0F) << 4));
        qh |= uint32_t((lo & 0x10u) >> 4) << j;
        qh |= uint32_t((hi & 0x10u) >> 4) << (j + QK / 2);
    }
    std::memcpy(qh_out, &qh, 4);
}

// Symmetric 4/5-bit: d = max / -(2^(bits-1)), where max is the signed element
// of largest magnitude, so that element maps exactly to level 0 and the rest
// round (with +0.5 truncation) into [0, 2^bits - 1].
template <int kLevels>
float symmetric_ref(const float* x, uint8_t* L) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    const float d = max / -(kLevels / 2);
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; ++j) {
        const int q = int8_t(x[j] * id + (kLevels / 2 + 0.5f));
        L[j] = uint8_t(q < kLevels - 1 ? q : kLevels - 1);
    }
    return d;
}

// Offset 4/5-bit: d = (max - min) / (2^bits - 1), m = min.
template <int kLevels>
void offset_ref(const float* x, uint8_t* L, float* d_out, float* m_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; ++j) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / (kLevels - 1);
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK; ++j) {
        const float v = (x[j] - min) * id + 0.5f;
        if constexpr (kLevels == 16) {
            const int q = int8_t(v);
            L[j] = uint8_t(q < 15 ? q : 15);
        } else {
            L[j] = uint8_t(v);  // ggml's Q5_1 does not clamp
        }
    }
    *d_out = d;
    *m_out = min;
}

float row_sigma2(const float* x, int64_t n) {
    float sum_x2 = 0;
    for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
    return sum_x2 / n;
}

void importance(const float* x, const float* qw, float sigma2, float* w) {
    for (int j = 0; j < QK; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

void quant_row_q4_0(const float* x, BlockQ4_0* y, int64_t n, const float* qw) {
    const int64_t nb = n / QK;
    std::vector<uint8_t> L(static_cast<size_t>(n));
    std::vector<float> d(static_cast<size_t>(nb));
    if (qw) {
        const float sigma2 = row_sigma2(x, n);
        std::vector<float> w(static_cast<size_t>(n));
        for (int64_t ib = 0; ib < nb; ++ib)
            importance(x + ib * QK, qw + ib * QK, sigma2, &w[ib * QK]);
        search_symmetric_groups(int(nb), QK, 8, x, reinterpret_cast<int8_t*>(L.data()), w.data(),
                                d.data());
    } else {
        for (int64_t ib = 0; ib < nb; ++ib) d[ib] = symmetric_ref<16>(x + ib * QK, &L[ib * QK]);
    }
    for (int64_t ib = 0; ib < nb; ++ib) {
        y[ib].d = to_f16(d[ib]);
        pack_nibbles(&L[ib * QK], y[ib].qs);
    }
}

void quant_row_q5_0(const float* x, BlockQ5_0* y, int64_t n, const float* qw) {
    const int64_t nb = n / QK;
    std::vector<uint8_t> L(static_cast<size_t>(n));
    std::vector<float> d(static_cast<size_t>(nb));
    if (qw) {
        const float sigma2 = row_sigma2(x, n);
        std::vector<float> w(static_cast<size_t>(n));
        for (int64_t ib = 0; ib < nb; ++ib)
            importance(x + ib * QK, qw + ib * QK, sigma2, &w[ib * QK]);
        search_symmetric_groups(int(nb), QK, 16, x, reinterpret_cast<int8_t*>(L.data()), w.data(),
                                d.data());
    } else {
        for (int64_t ib = 0; ib < nb; ++ib) d[ib] = symmetric_ref<32>(x + ib * QK, &L[ib * QK]);
    }
    for (int64_t ib = 0; ib < nb; ++ib) {
        y[ib].d = to_f16(d[ib]);
        pack_5bit(&L[ib * QK], y[ib].qs, y[ib].qh);
    }
}

template <int kLevels, typename Block>
void quant_row_offset(const float* x, Block* y, int64_t n, const float* qw) {
    const int64_t nb = n / QK;
    std::vector<uint8_t> L(static_cast<size_t>(n));
    std::vector<float> d(static_cast<size_t>(nb)), m(static_cast<size_t>(nb));
    if (qw) {
        // All blocks' weights first, then the searches 8 blocks at a time.
        const float sigma2 = row_sigma2(x, n);
        std::vector<float> w(static_cast<size_t>(n));
        for (int64_t ib = 0; ib < nb; ++ib)
            importance(x + ib * QK, qw + ib * QK, sigma2, &w[ib * QK]);
        search_scale_min_groups(int(nb), QK, kLevels - 1, x, w.data(), L.data(), d.data(), m.data(),
                                -0.9f, 0.05f, 36, false);
        for (auto& v : m) v = -v;
    } else {
        for (int64_t ib = 0; ib < nb; ++ib)
            offset_ref<kLevels>(x + ib * QK, &L[ib * QK], &d[ib], &m[ib]);
    }
    for (int64_t ib = 0; ib < nb; ++ib) {
        y[ib].d = to_f16(d[ib]);
        y[ib].m = to_f16(m[ib]);
        if constexpr (kLevels == 16)
            pack_nibbles(&L[ib * QK], y[ib].qs);
        else
            pack_5bit(&L[ib * QK], y[ib].qs, y[ib].qh);
    }
}

void quant_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = to_f16(d);
        // The stored-weight quantizer rounds half away from zero (roundf).
        for (int j = 0; j < QK; ++j) y[ib].qs[j] = int8_t(std::round(x[j] * id));
    }
}

template <typename Block, void (*Row)(const float*, Block*, int64_t, const float*)>
size_t quantize_rows_of(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* imatrix) {
    Block* y = static_cast<Block*>(dst);
    const int64_t nb = n_per_row / QK;
    for (int64_t r = 0; r < n_rows; ++r) Row(src + r * n_per_row, y + r * nb, n_per_row, imatrix);
    return size_t(n_rows * nb) * sizeof(Block);
}

void row_q4_1(const float* x, BlockQ4_1* y, int64_t n, const float* qw) {
    quant_row_offset<16>(x, y, n, qw);
}
void row_q5_1(const float* x, BlockQ5_1* y, int64_t n, const float* qw) {
    quant_row_offset<32>(x, y, n, qw);
}
void row_q8_0(const float* x, BlockQ8_0* y, int64_t n, const float*) {
    quant_row_q8_0(x, y, n);
}

// ---------------------------------------------------------------- dot products
// Per block: an exact integer sum, scaled by the block scales in float, added in
// block order (ggml's scalar vec_dot order of operations).

float dot_q4_0_ref(int64_t n, const void* w, const void* a) {
    const BlockQ4_0* x = static_cast<const BlockQ4_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        int isum = 0;
        for (int j = 0; j < QK / 2; ++j) {
            isum += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
            isum += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK / 2];
        }
        sum += float(isum) * f16(x[i].d) * f16(y[i].d);
    }
    return sum;
}

float dot_q4_1_ref(int64_t n, const void* w, const void* a) {
    const BlockQ4_1* x = static_cast<const BlockQ4_1*>(w);
    const BlockQ8_1* y = static_cast<const BlockQ8_1*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        int isum = 0;
        for (int j = 0; j < QK / 2; ++j) {
            isum += (x[i].qs[j] & 0xF) * y[i].qs[j];
            isum += (x[i].qs[j] >> 4) * y[i].qs[j + QK / 2];
        }
        // sum(d*q + m) * dy*qy = d*dy*sum(q*qy) + m * (dy*sum(qy)) = ... + m*s
        sum += (f16(x[i].d) * f16(y[i].d)) * float(isum) + f16(x[i].m) * f16(y[i].s);
    }
    return sum;
}

float dot_q5_0_ref(int64_t n, const void* w, const void* a) {
    const BlockQ5_0* x = static_cast<const BlockQ5_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        const uint32_t qh = load_qh(x[i].qh);
        int isum = 0;
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = ((x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            const int hi = ((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            isum += lo * y[i].qs[j] + hi * y[i].qs[j + QK / 2];
        }
        sum += (f16(x[i].d) * f16(y[i].d)) * float(isum);
    }
    return sum;
}

float dot_q5_1_ref(int64_t n, const void* w, const void* a) {
    const BlockQ5_1* x = static_cast<const BlockQ5_1*>(w);
    const BlockQ8_1* y = static_cast<const BlockQ8_1*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        const uint32_t qh = load_qh(x[i].qh);
        int isum = 0;
        for (int j = 0; j < QK / 2; ++j) {
            const int lo = (x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int hi = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            isum += lo * y[i].qs[j] + hi * y[i].qs[j + QK / 2];
        }
        sum += (f16(x[i].d) * f16(y[i].d)) * float(isum) + f16(x[i].m) * f16(y[i].s);
    }
    return sum;
}

float dot_q8_0_ref(int64_t n, const void* w, const void* a) {
    const BlockQ8_0* x = static_cast<const BlockQ8_0*>(w);
    const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
    float sum = 0;
    for (int64_t i = 0; i < n / QK; ++i) {
        int isum = 0;
        for (int j = 0; j < QK; ++j) isum += x[i].qs[j] * y[i].qs[j];
        sum += float(isum) * (f16(x[i].d) * f16(y[i].d));
    }
    return sum;
}

// ---------------------------------------------------------------- activations

void act_q8_0(const float* x, void* dst, int64_t n) {
    if (cpu_has_avx2())
        kernels::act_q8_0_avx2(x, dst, n);
    else
        kernels::act_q8_0_scalar(x, dst, n);
}

void act_q8_1(const float* x, void* dst, int64_t n) {
    if (cpu_has_avx2())
        kernels::act_q8_1_avx2(x, dst, n);
    else
        kernels::act_q8_1_scalar(x, dst, n);
}

size_t quant_q8_1(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
    kernels::act_q8_1_scalar(src, dst, n_rows * n_per_row);
    return size_t(n_rows * n_per_row / QK) * sizeof(BlockQ8_1);
}

using namespace kernels;

const FormatOps kQ4_0 = {dequant_q4_0,  quantize_rows_of<BlockQ4_0, quant_row_q4_0>,
                         nullptr,       dot_q4_0_ref,
                         dot_q4_0_avx2, dot_q4_0_avx512};
const FormatOps kQ4_1 = {dequant_q4_1,  quantize_rows_of<BlockQ4_1, row_q4_1>,
                         nullptr,       dot_q4_1_ref,
                         dot_q4_1_avx2, dot_q4_1_avx512};
const FormatOps kQ5_0 = {dequant_q5_0,  quantize_rows_of<BlockQ5_0, quant_row_q5_0>,
                         nullptr,       dot_q5_0_ref,
                         dot_q5_0_avx2, dot_q5_0_avx512};
const FormatOps kQ5_1 = {dequant_q5_1,  quantize_rows_of<BlockQ5_1, row_q5_1>,
                         nullptr,       dot_q5_1_ref,
                         dot_q5_1_avx2, dot_q5_1_avx512};
const FormatOps kQ8_0 = {dequant_q8_0,  quantize_rows_of<BlockQ8_0, row_q8_0>,
                         act_q8_0,      dot_q8_0_ref,
                         dot_q8_0_avx2, dot_q8_0_avx512};
const FormatOps kQ8_1 = {dequant_q8_1, quant_q8_1, act_q8_1, nullptr, nullptr, nullptr};

}  // namespace

// llama.cpp's x86 CPU backend (quantize_row_q8_0 under AVX/AVX2) quantizes an
// activation block as: amax = max |x|, d = amax / 127 stored as fp16, and
// q = round-half-even(x * (127 / amax)) with int8 saturation. This differs from
// ggml's portable reference (x * (1/d), roundf) in rare ties and last-bit
// cases; we follow the backend that actually runs, so our activations equal
// llama.cpp's on this hardware.
namespace {
inline int8_t round_sat_i8(float v) {
    // cvtps2dq semantics: round half to even; NaN or out-of-range gives INT_MIN.
    const float r = std::nearbyint(v);
    int32_t i = (r >= -2147483648.0f && r < 2147483648.0f) ? int32_t(r) : INT32_MIN;
    return int8_t(i < -128 ? -128 : (i > 127 ? 127 : i));
}
}  // namespace

void kernels::act_q8_0_scalar(const float* x, void* dst, int64_t n) {
    BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        y[ib].d = to_f16(amax / 127.f);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < QK; ++j) y[ib].qs[j] = round_sat_i8(x[j] * id);
    }
}

// Q8_1 as llama.cpp's x86 backend: Q8_0's rounding, plus s = fp16(d * sum(q))
// with d the unrounded float amax / 127.
void kernels::act_q8_1_scalar(const float* x, void* dst, int64_t n) {
    BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float d = amax / 127.f;
        y[ib].d = to_f16(d);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; ++j) {
            y[ib].qs[j] = round_sat_i8(x[j] * id);
            sum += y[ib].qs[j];
        }
        y[ib].s = to_f16(d * float(sum));
    }
}

const FormatOps* legacy_ops(Type t) {
    switch (t) {
        case Type::Q4_0:
            return &kQ4_0;
        case Type::Q4_1:
            return &kQ4_1;
        case Type::Q5_0:
            return &kQ5_0;
        case Type::Q5_1:
            return &kQ5_1;
        case Type::Q8_0:
            return &kQ8_0;
        case Type::Q8_1:
            return &kQ8_1;
        default:
            return nullptr;
    }
}

}  // namespace glm5::quant

// Row helpers of the CPU backend's attention and indexer, picked once at run
// time: AVX2+FMA+F16C when the CPU has them, plain C++ otherwise. Each is a
// fixed function of its inputs on a given machine (no dependence on threads
// or batching).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace glm5::backend::cpu {

// Rows of an F16 cache that one query reads: row j is cache row idx[j]
// (idx null: row j itself).
struct F16Rows {
    const uint8_t* base = nullptr;
    size_t row_bytes = 0;
    const int32_t* idx = nullptr;
    const uint16_t* row(int64_t j) const {
        return reinterpret_cast<const uint16_t*>(base + size_t(idx ? idx[j] : j) * row_bytes);
    }
};

struct SimdOps {
    // y[i] += a * x[i]
    void (*axpy_f32)(int64_t n, float a, const float* x, float* y);
    // y[i] += a * float(x[i]) for binary16 x
    void (*axpy_f16)(int64_t n, float a, const uint16_t* x, float* y);
    // dst[i] = float(src[i])
    void (*f16_to_f32)(int64_t n, const uint16_t* src, float* dst);
    // sum of a[i] * b[i] (float a, binary16 b)
    float (*dot_f32_f16)(int64_t n, const float* a, const uint16_t* b);
    // dst[i] = binary16(src[i]), rounded to nearest even
    void (*f32_to_f16)(int64_t n, const float* src, uint16_t* dst);
    // y[i] = float(binary16(x[i])): x rounded through F16
    void (*round_f16)(int64_t n, const float* x, float* y);

    // Attention over F16 rows, for nh heads of one query at once (the rows
    // are shared by every head: MQA). Each result is a fixed function of its
    // own query row and cache rows, whatever nh, n or the blocking.
    // s[h*ld + j] = q[h*w ..] . row j[0..w), for h < nh, j < n
    void (*scores_f16)(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n,
                       float* s, int64_t ld);
    // x[j] = exp(x[j] - max x) / sum, in place, over n values (n >= 1);
    // rounded through F16 when round_f16 (the probabilities of an F16 product)
    void (*softmax)(float* x, int64_t n, bool round_f16);
    // out[h*vw + i] = sum over j = 0, 1, .. n-1 of p[h*ld + j] * row j[i], as a
    // chain of fused multiply-adds from zero (the order of axpy_f16 per row)
    void (*weighted_sum_f16)(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                             int64_t vw, float* out);
    // out[i] = silu(g[i]) * u[i]; with clamp > 1e-6, g[i] is first capped at
    // clamp and u[i] clamped to [-clamp, clamp]. out may alias g or u.
    void (*swiglu)(int64_t n, const float* g, const float* u, float clamp, float* out);
    // y = x / sqrt(mean(x^2) + eps) [* w] (kernels::rms_norm_row, same bits)
    void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* y);
    // The lightning indexer's key scores: out[j] = the sum over a = 0, 1, ..
    // nq-1 in order, from +0, of max(q row a . k row j, 0) * w[a], each
    // product and sum rounded apart, for j < nk (rows dim floats; q rows dim
    // apart, k rows ks apart). Each dot is the F32 dot product of
    // quant::vec_dot_fn(F32) on this machine, bit for bit.
    void (*indexer_scores)(const float* q, int64_t nq, const float* w, const float* k, int64_t ks,
                           int64_t nk, int64_t dim, float* out);
    // The same scores of F16 keys (k rows ks values apart), converted as the
    // form reads them: the bits of indexer_scores over the keys as floats.
    void (*indexer_scores_f16)(const float* q, int64_t nq, const float* w, const uint16_t* k,
                               int64_t ks, int64_t nk, int64_t dim, float* out);
    // The gated delta rule's two passes over one head's d x d state S (row i:
    // key channel i), every product and sum rounded on its own (no FMA) and
    // each acc[j] summed over i in order from zero, as the plain loops:
    // S[i][j] = src[i][j] * decay[i]; acc[j] = sum_i S[i][j] * k[i]  (src may be S)
    void (*delta_decay)(int64_t d, const float* src, const float* decay, const float* k, float* S,
                        float* acc);
    // S[i][j] += k[i] * u[j]; acc[j] = sum_i S[i][j] * q[i]
    void (*delta_update)(int64_t d, const float* k, const float* u, const float* q, float* S,
                         float* acc);
    // The indexer's pick, kernels::top_k_rows: the same rows.
    void (*top_k_rows)(const float* v, int64_t n, int64_t k, std::vector<int32_t>& tmp,
                       int32_t* out);
};

const SimdOps& simd();

// Implementations (cpu_simd.cpp, cpu_simd_avx2.cpp, cpu_simd_avx512.cpp).
namespace scalar {
void axpy_f32(int64_t n, float a, const float* x, float* y);
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y);
void f16_to_f32(int64_t n, const uint16_t* src, float* dst);
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b);
void f32_to_f16(int64_t n, const float* src, uint16_t* dst);
void round_f16(int64_t n, const float* x, float* y);
void softmax(float* x, int64_t n, bool round_f16);
void swiglu(int64_t n, const float* g, const float* u, float clamp, float* out);
void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc);
void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc);
}  // namespace scalar
namespace avx2 {
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);
void axpy_f32(int64_t n, float a, const float* x, float* y);
void axpy_f16(int64_t n, float a, const uint16_t* x, float* y);
void f16_to_f32(int64_t n, const uint16_t* src, float* dst);
float dot_f32_f16(int64_t n, const float* a, const uint16_t* b);
void f32_to_f16(int64_t n, const float* src, uint16_t* dst);
void round_f16(int64_t n, const float* x, float* y);
// The attention tiles (same bits as the row helpers above, row after row),
// and the indexer's dots (out[j*ld + a] = q row a . k row j, the bits of
// quant's AVX2 F32 dot) for dims that are a multiple of 32.
void scores_f16(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n, float* s,
                int64_t ld);
void weighted_sum_f16(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                      int64_t vw, float* out);
void dots_f32(const float* q, int64_t nq, const float* k, int64_t ks, int64_t nk, int64_t dim,
              float* out, int64_t ld);
void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc);
void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc);
}  // namespace avx2
// The AVX-512 attention tiles and elementwise helpers (cpu_simd_avx512.cpp).
namespace avx512 {
void scores_f16(const float* q, int64_t nh, int64_t w, const F16Rows& rows, int64_t n, float* s,
                int64_t ld);
void weighted_sum_f16(const float* p, int64_t ld, int64_t nh, const F16Rows& rows, int64_t n,
                      int64_t vw, float* out);
void softmax(float* x, int64_t n, bool round_f16);
void swiglu(int64_t n, const float* g, const float* u, float clamp, float* out);
void delta_decay(int64_t d, const float* src, const float* decay, const float* k, float* S,
                 float* acc);
void delta_update(int64_t d, const float* k, const float* u, const float* q, float* S, float* acc);
void top_k_rows(const float* v, int64_t n, int64_t k, std::vector<int32_t>& tmp, int32_t* out);
// indexer_scores for dims that are a multiple of 16 up to 128 (false: not
// done, another form must run): 16 keys' dots reduced together.
bool indexer_scores(const float* q, int64_t nq, const float* w, const float* k, int64_t ks,
                    int64_t nk, int64_t dim, float* out);
// The same over F16 keys, each 16 keys converted once into L1 and the keys 32
// on asked for meanwhile (decode reads them from DRAM).
bool indexer_scores_f16(const float* q, int64_t nq, const float* w, const uint16_t* k, int64_t ks,
                        int64_t nk, int64_t dim, float* out);
}  // namespace avx512

}  // namespace glm5::backend::cpu

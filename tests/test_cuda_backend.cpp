// glm-dsa on the GPU (label `gpu`: run by scripts/device-check.sh; without a device these
// fail, they do not skip). The CUDA backend's ops against the CPU backend's on the same
// inputs, the error normalised by the RMS of the CPU's output; the tiny glm-dsa fixture
// end to end against the CPU; and what no tolerance may blur: a decode token's logits
// are the same bits alone or beside other sequences, and speculation gives plain
// decoding's ids.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "core/error.h"
#include "model/glm5next_vision.h"
#include "quant/quant.h"
#include "quant_test_util.h"
#include "runtime/engine.h"
#include "util_backend.h"
#include "util_model.h"

#if defined(GLM5_CUDA_SIM)
#include "cudasim/device.h"
#endif

namespace glm5 {
namespace {

using backend::AttentionOps;
using backend::Backend;
using backend::CacheRows;
using backend::CacheType;
using backend::DevPtr;
using backend::LinearOps;

std::unique_ptr<Backend> gpu() {
    std::string why;
    if (backend::cuda::list_devices(&why).empty())
        throw Error("a gpu test found no CUDA device (" + why + "): run it on a GPU machine");
    return backend::cuda::make_cuda_backend(0);
}

std::unique_ptr<Backend> cpu() {
    backend::CpuOptions bo;
    bo.n_threads = 2;
    return backend::make_cpu_backend(bo);
}

template <class T>
DevPtr<T> put(Backend& be, const std::vector<T>& h) {
    DevPtr<T> d = be.scratch(std::max<size_t>(1, (h.size() * sizeof(T) + 3) / 4)).template as<T>();
    be.write(d, h.data(), h.size());
    return d;
}

template <class T>
std::vector<T> get(Backend& be, DevPtr<T> d, size_t n) {
    std::vector<T> h(n);
    be.read(d, h.data(), n);
    return h;
}

// max |a - b| over the RMS of b.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double sq = 0, worst = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        sq += double(b[i]) * b[i];
        worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    }
    return worst / std::max(1e-30, std::sqrt(sq / double(b.size())));
}

// The same op on both backends: `run` takes a backend and returns its output.
template <class F>
double both(F run) {
    auto g = gpu();
    auto c = cpu();
    const std::vector<float> on_gpu = run(*g), on_cpu = run(*c);
    EXPECT_EQ(on_gpu.size(), on_cpu.size());
    return rel_err(on_gpu, on_cpu);
}

TEST(CudaOps, NormsRopeHadamardAndSwigluAgreeWithTheCpu) {
    const int64_t rows = 5, dim = 256;
    const std::vector<float> x = test::normal_floats(size_t(rows * dim), 1),
                             w = test::normal_floats(size_t(dim), 2);
    EXPECT_LT(both([&](Backend& be) {
                  auto dx = put(be, x), dy = be.scratch(x.size());
                  be.rms_norm(dx, dim, w.data(), rows, dim, 1e-6f, dy, dim);
                  return get(be, dy, x.size());
              }),
              1e-5);
    EXPECT_LT(both([&](Backend& be) {
                  auto dx = put(be, x), dy = be.scratch(x.size());
                  be.layer_norm(dx, w.data(), w.data(), rows, dim, 1e-5f, dy);
                  return get(be, dy, x.size());
              }),
              1e-5);
    const std::vector<int32_t> pos = {0, 7, 300, 4095, 65000};
    EXPECT_LT(both([&](Backend& be) {
                  auto dx = put(be, x);
                  be.rope(dx, rows, dim, 4, 64, 64, put(be, pos), 10000.f);
                  return get(be, dx, x.size());
              }),
              1e-5);
    EXPECT_LT(both([&](Backend& be) {
                  auto dx = put(be, x);
                  be.hadamard(dx, rows * 2, 128);
                  return get(be, dx, x.size());
              }),
              1e-6);
    // SwiGLU, silu(g) u = g u / (1 + e^-g), has no cancellation, so each value's relative
    // error is bounded: a GPU's expf is within 2 ulp and the CPU's vector exp within 3 (its
    // series' truncation and Horner steps), e^-g's error reaches 1 + e^-g scaled down, and the
    // add, the divide and the multiply are rounded once each on both sides (0.5 ulp apiece):
    // 8 ulp of 2^-23 in all, 1e-6 of each value.
    {
        auto silu_u = [&](Backend& be) {
            auto dx = put(be, x), dy = be.scratch(x.size() / 2);
            be.swiglu(dx, dx + dim / 2, rows, dim / 2, dim, 7.f, dy);
            return get(be, dy, x.size() / 2);
        };
        auto g = gpu();
        auto c = cpu();
        const std::vector<float> a = silu_u(*g), b = silu_u(*c);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < b.size(); ++i)
            EXPECT_LE(std::fabs(double(a[i]) - b[i]), 1e-6 * std::fabs(double(b[i])) + 1e-30)
                << i << ": " << a[i] << " vs " << b[i];
    }
}

// A weight vector is the device's copy of what was registered last at its address: a model
// loaded where another was reads its own weights, never the earlier one's.
TEST(CudaOps, AVectorRegisteredAgainIsReadAnew) {
    auto g = gpu();
    const int64_t dim = 64;
    const std::vector<float> x = test::normal_floats(size_t(dim), 50);
    std::vector<float> w(static_cast<size_t>(dim), 1.f);
    auto norm = [&] {
        auto dx = put(*g, x), dy = g->scratch(x.size());
        g->rms_norm(dx, dim, w.data(), 1, dim, 1e-6f, dy, dim);
        return get(*g, dy, x.size());
    };
    g->register_vector(w.data(), dim, "first");
    const std::vector<float> first = norm();
    for (float& v : w) v = 2.f;  // the same address, other weights
    g->register_vector(w.data(), dim, "second");
    const std::vector<float> second = norm();
    for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(second[size_t(i)], 2.f * first[size_t(i)]) << i;
}

// A cache of n rows of `width` (F16), queries over it: dense rows, and rows that see a
// selection of 64 of their cells.
TEST(CudaOps, MlaAttentionDenseAndSelectedAgreesWithTheCpu) {
    const int64_t width = 576, v_width = 512, heads = 16, n = 300;
    const std::vector<float> cells = test::normal_floats(size_t(n * width), 3);
    const std::vector<float> q = test::normal_floats(size_t(4 * heads * width), 4, 0.05f);
    const std::vector<int32_t> cell_pos = [&] {
        std::vector<int32_t> p(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(i);
        return p;
    }();
    const std::vector<int32_t> pos = {10, 63, 64, 299};  // the last three select
    std::vector<int32_t> sel(static_cast<size_t>(4 * 64));
    for (int64_t t = 0; t < 4; ++t)
        for (int64_t j = 0; j < 64; ++j)
            sel[size_t(t * 64 + j)] = int32_t((j * 7 + t) % (pos[size_t(t)] + 1));
    for (CacheType ct : {CacheType::F16, CacheType::F32}) {
        const double err = both([&](Backend& be) {
            CacheRows c{be.alloc_cache(size_t(n * width) * 4), width, ct};
            be.cache_store(c, put(be, cells), width, n, put(be, cell_pos));
            AttentionOps::Segment seg{c, 0, 4};
            AttentionOps::Selection s{put(be, sel), 64, 63, 1};
            auto out = be.scratch(size_t(4 * heads * v_width));
            test::attn_ops(be).mla_attention(put(be, q), put(be, pos), {&seg, 1}, s, heads, v_width,
                                             0.07f, out);
            auto h = get(be, out, size_t(4 * heads * v_width));
            be.free_cache(c.data);
            return h;
        });
        EXPECT_LT(err, ct == CacheType::F16 ? 2e-3 : 1e-4) << backend::cache_type_name(ct);
    }
}

TEST(CudaOps, IndexerSelectsTheCpusRows) {
    const int64_t dim = 128, heads = 8, n = 500, top_k = 64, R = 4;
    const std::vector<float> keys = test::normal_floats(size_t(n * dim), 5);
    // Every key 13 times over: scores tie in groups across the k-th, in runs of rows that
    // different threads count.
    std::vector<float> repeated(keys.size());
    for (int64_t i = 0; i < n; ++i)
        std::copy_n(keys.begin() + (i % 37) * dim, dim, repeated.begin() + i * dim);
    const std::vector<float> q = test::normal_floats(size_t(R * heads * dim), 6);
    std::vector<float> w = test::normal_floats(size_t(R * heads), 7);
    std::fill(w.begin() + 3 * heads, w.end(), 0.0f);  // row 3: every score 0, one tie
    std::vector<int32_t> cell_pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) cell_pos[size_t(i)] = int32_t(i);
    const std::vector<int32_t> pos = {100, 300, 499, 499};
    auto run = [&](Backend& be, const std::vector<float>& k) {
        CacheRows c{be.alloc_cache(size_t(n * dim) * 4), dim, CacheType::F32};
        be.cache_store(c, put(be, k), dim, n, put(be, cell_pos));
        AttentionOps::Segment seg{c, 0, R};
        // One row more than the output: it must come back as it was put.
        auto out = put(be, std::vector<int32_t>(size_t((R + 1) * top_k), -7));
        test::attn_ops(be).indexer_select(put(be, q), put(be, w), put(be, pos), {&seg, 1}, 1, heads,
                                          dim, top_k, out);
        auto h = get(be, out, size_t((R + 1) * top_k));
        be.free_cache(c.data);
        return h;
    };
    auto g = gpu();
    auto c = cpu();
    // The same rows, in the same order; among equal scores the lower rows.
    for (const std::vector<float>* k : {&keys, &std::as_const(repeated)}) {
        const std::vector<int32_t> ids = run(*g, *k);
        EXPECT_EQ(ids, run(*c, *k));
        for (int64_t j = 0; j < top_k; ++j) {
            EXPECT_EQ(ids[size_t(3 * top_k + j)], j);
            EXPECT_EQ(ids[size_t(R * top_k + j)], -7);
        }
    }
}

// A step of more sequences than a launch's segment table holds (20 one-row segments): the
// kernels work out every row's cells from the plan and their segment, in launches of at most
// 16 segments, as the CPU does.
TEST(CudaOps, AttentionOfManySequencesInOneStepIsTheCpus) {
    const int64_t width = 64, v_width = 32, heads = 2, n = 200, R = 20, dim = 64, top_k = 16;
    const std::vector<float> cells = test::normal_floats(size_t(n * width), 11);
    const std::vector<float> q = test::normal_floats(size_t(R * heads * width), 12, 0.1f);
    const std::vector<float> iq = test::normal_floats(size_t(R * heads * dim), 13);
    const std::vector<float> iw = test::normal_floats(size_t(R * heads), 14);
    std::vector<int32_t> cell_pos(static_cast<size_t>(n)), pos(static_cast<size_t>(R));
    for (int64_t i = 0; i < n; ++i) cell_pos[size_t(i)] = int32_t(i);
    for (int64_t t = 0; t < R; ++t) pos[size_t(t)] = int32_t(5 + t * 9);  // some select
    auto run = [&](Backend& be) {
        CacheRows c{be.alloc_cache(size_t(n * width) * 4), width, CacheType::F32};
        be.cache_store(c, put(be, cells), width, n, put(be, cell_pos));
        std::vector<AttentionOps::Segment> segs;
        for (int64_t t = R - 1; t >= 0; --t) segs.push_back({c, t, 1});  // in no order
        auto sel = be.scratch_ids(size_t(R * top_k));
        test::attn_ops(be).indexer_select(put(be, iq), put(be, iw), put(be, pos), segs, 1, heads,
                                          dim, top_k, sel);
        AttentionOps::Selection s{sel, top_k, top_k, 1};
        auto out = be.scratch(size_t(R * heads * v_width));
        test::attn_ops(be).mla_attention(put(be, q), put(be, pos), segs, s, heads, v_width, 0.1f,
                                         out);
        std::vector<float> h = get(be, out, size_t(R * heads * v_width));
        std::vector<int32_t> ids = get(be, sel, size_t(R * top_k));
        be.free_cache(c.data);
        return std::make_pair(h, ids);
    };
    auto g = gpu();
    auto c = cpu();
    const auto [hg, ig] = run(*g);
    const auto [hc, ic] = run(*c);
    for (int64_t t = 0; t < R; ++t)
        if (pos[size_t(t)] + 1 > top_k) {
            EXPECT_TRUE(std::equal(ig.begin() + t * top_k, ig.begin() + (t + 1) * top_k,
                                   ic.begin() + t * top_k))
                << "row " << t;
        }
    EXPECT_LT(rel_err(hg, hc), 1e-4);
}

// run(backend, fused) gives an op's outputs and cache bytes, fused or as the ops it stands
// for: on the device and on the CPU, the same bits.
template <class Run>
void expect_fused_bits(Run run) {
    for (auto make : {gpu, cpu}) {
        auto be = make();
        const auto [fv, fc] = run(*be, true);
        const auto [sv, sc] = run(*be, false);
        EXPECT_TRUE(test::bitwise_equal(fv, sv)) << be->name();
        EXPECT_EQ(fc, sc) << be->name();
    }
}

// The indexer's inputs made ready in one op are the bits of the ops it stands for (rope,
// layer_norm, hadamard, cache_store, scale), on the device and on the CPU: 20 one-row
// segments (more than one launch's table), an F16 key cache.
TEST(CudaOps, IndexerInputsAreTheBitsOfTheOpsTheyFuse) {
    const int64_t R = 20, heads = 4, dim = 64, n_rot = 16, n = 256;
    const std::vector<float> iq = test::normal_floats(size_t(R * heads * dim), 31);
    const std::vector<float> ik = test::normal_floats(size_t(R * dim), 32);
    const std::vector<float> iw = test::normal_floats(size_t(R * heads), 33);
    const std::vector<float> nw = test::normal_floats(size_t(dim), 34);
    const std::vector<float> nb = test::normal_floats(size_t(dim), 35, 0.1f);
    std::vector<int32_t> pos(static_cast<size_t>(R));
    for (int64_t t = 0; t < R; ++t) pos[size_t(t)] = int32_t(3 + t * 11);
    const float ws = 0.0625f;
    auto run = [&](Backend& be, bool fused) {
        CacheRows c{be.alloc_cache(size_t(n * dim) * 2), dim, CacheType::F16};
        std::vector<AttentionOps::Segment> segs;
        for (int64_t t = R - 1; t >= 0; --t) segs.push_back({c, t, 1});
        const DevPtr<float> q = put(be, iq), k = put(be, ik), w = put(be, iw);
        const DevPtr<const int32_t> p = put(be, pos);
        if (fused) {
            test::attn_ops(be).indexer_inputs(q, k, w, p, segs, heads, dim, n_rot, 10000.0f,
                                              nw.data(), nb.data(), ws);
        } else {
            be.rope(q, R, heads * dim, heads, dim, n_rot, p, 10000.0f);
            be.layer_norm(k, nw.data(), nb.data(), R, dim, 0.0f, k);
            be.rope(k, R, dim, 1, dim, n_rot, p, 10000.0f);
            be.hadamard(q, R * heads, dim);
            be.hadamard(k, R, dim);
            for (const auto& s : segs) be.cache_store(c, k + s.first * dim, dim, s.n, p + s.first);
            be.scale(w, ws, R * heads);
        }
        std::vector<float> out = get(be, q, size_t(R * heads * dim));
        for (const auto* v : {&k, &w}) {
            const std::vector<float> x = get(be, *v, size_t(v == &k ? R * dim : R * heads));
            out.insert(out.end(), x.begin(), x.end());
        }
        std::vector<uint8_t> cache(size_t(n * dim) * 2);
        be.read_bytes(c.data, cache.data(), cache.size());
        be.free_cache(c.data);
        return std::make_pair(out, cache);
    };
    expect_fused_bits(run);
}

// MLA's rows made ready in one op are the bits of the ops it stands for (rms_norm, rope,
// cache_store, and the query's rope part RoPE'd and copied), on the device and on the CPU:
// 20 one-row segments, an F16 latent cache.
TEST(CudaOps, MlaRowsAreTheBitsOfTheOpsTheyFuse) {
    const int64_t T = 20, H = 3, R = 32, n_rot = 8, W = R + n_rot, nope = 16, Dq = nope + n_rot;
    const int64_t n = 256;
    const std::vector<float> kv = test::normal_floats(size_t(T * W), 41);
    const std::vector<float> q = test::normal_floats(size_t(T * H * Dq), 42);
    const std::vector<float> nw = test::normal_floats(size_t(R), 43);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(2 + t * 7);
    auto run = [&](Backend& be, bool fused) {
        CacheRows c{be.alloc_cache(size_t(n * W) * 2), W, CacheType::F16};
        std::vector<AttentionOps::Segment> segs;
        for (int64_t t = T - 1; t >= 0; --t) segs.push_back({c, t, 1});
        const DevPtr<float> k = put(be, kv), qd = put(be, q);
        const DevPtr<float> qfull = put(be, std::vector<float>(size_t(T * H * W), 0.0f));
        const DevPtr<const int32_t> p = put(be, pos);
        if (fused) {
            AttentionOps::MlaRows m;
            m.kv = k, m.kv_stride = W, m.R = R, m.n_rot = n_rot, m.norm_w = nw.data();
            m.eps = 1e-6f, m.freq_base = 10000.0f;
            m.q = qd, m.n_heads = H, m.q_width = Dq, m.nope = nope, m.qfull = qfull;
            m.qfull_width = W;
            test::attn_ops(be).mla_rows(m, p, segs);
        } else {
            be.rms_norm(k, W, nw.data(), T, R, 1e-6f, k, W);
            be.rope(k + R, T, W, 1, n_rot, n_rot, p, 10000.0f);
            for (const auto& s : segs) be.cache_store(c, k + s.first * W, W, s.n, p + s.first);
            be.rope(qd + nope, T, H * Dq, H, Dq, n_rot, p, 10000.0f);
            be.copy_rows(qd + nope, Dq, nullptr, T * H, n_rot, qfull + R, W);
        }
        std::vector<float> out = get(be, k, size_t(T * W));
        const std::vector<float> qf = get(be, qfull, size_t(T * H * W));
        out.insert(out.end(), qf.begin(), qf.end());
        std::vector<uint8_t> cache(size_t(n * W) * 2);
        be.read_bytes(c.data, cache.data(), cache.size());
        be.free_cache(c.data);
        return std::make_pair(out, cache);
    };
    expect_fused_bits(run);
}

// A residual add with the next norm in one launch: the bits of add, then rms_norm.
TEST(CudaOps, AddRmsNormIsTheBitsOfAddThenRmsNorm) {
    const int64_t T = 5, E = 300;
    const std::vector<float> x = test::normal_floats(size_t(T * E), 51);
    const std::vector<float> d = test::normal_floats(size_t(T * E), 52);
    const std::vector<float> w = test::normal_floats(size_t(E), 53);
    auto g = gpu();
    auto run = [&](bool fused) {
        const DevPtr<float> xd = put(*g, x), y = g->scratch(size_t(T * E));
        if (fused) {
            g->add_rms_norm(xd, put(*g, d), w.data(), T, E, 1e-5f, y);
        } else {
            g->add(xd, put(*g, d), T * E);
            g->rms_norm(xd, E, w.data(), T, E, 1e-5f, y, E);
        }
        std::vector<float> out = get(*g, xd, size_t(T * E));
        const std::vector<float> yn = get(*g, y, size_t(T * E));
        out.insert(out.end(), yn.begin(), yn.end());
        return out;
    };
    EXPECT_TRUE(test::bitwise_equal(run(true), run(false)));
}

TEST(CudaOps, MixtureOfExpertsAgreesWithTheCpu) {
    const int64_t E = 256, F = 256, X = 16, T = 5;
    const int K = 4;
    auto quantized = [](quant::Type t, int64_t cols, int64_t rows, int64_t slices, uint32_t seed,
                        std::vector<uint8_t>& keep) {
        const std::vector<float> v = test::normal_floats(size_t(cols * rows * slices), seed, 0.1f);
        keep.resize(quant::row_size(t, cols) * size_t(rows * slices));
        quant::quantize_rows(t, v.data(), keep.data(), rows * slices, cols, nullptr);
        backend::Weight w;
        w.type = t;
        w.cols = cols;
        w.rows = rows;
        w.slices = slices;
        w.row_bytes = quant::row_size(t, cols);
        w.slice_bytes = w.row_bytes * size_t(rows);
        w.data = keep.data();
        return w;
    };
    std::vector<uint8_t> b1, b2, b3, b4, b5, b6, b7;
    const backend::Weight router = quantized(quant::Type::F32, E, X, 1, 10, b1);
    // F16 experts: the CPU rounds their activations to F16 only (quantized formats'
    // 8-bit rounding would swamp a routing or combine mistake; the products' own tests
    // cover every format).
    const backend::Weight gate = quantized(quant::Type::F16, E, F, X, 11, b2);
    const backend::Weight up = quantized(quant::Type::F16, E, F, X, 12, b3);
    const backend::Weight down = quantized(quant::Type::F16, F, E, X, 13, b4);
    const backend::Weight sg = quantized(quant::Type::F16, E, F, 1, 14, b5);
    const backend::Weight su = quantized(quant::Type::F16, E, F, 1, 15, b6);
    const backend::Weight sd = quantized(quant::Type::F16, F, E, 1, 16, b7);
    std::vector<float> bias = test::normal_floats(size_t(X), 17, 0.01f);
    const std::vector<float> x = test::normal_floats(size_t(T * E), 18);
    std::vector<int32_t> ids_cpu, ids_gpu;
    auto run = [&](Backend& be, std::vector<int32_t>& ids_out) {
        backend::MoeWeights m;
        m.route.router = be.register_weight(router, false, "router");
        m.route.bias = bias.data();
        m.route.n_used = K;
        m.route.weights_scale = 2.5f;
        m.experts = {be.register_weight(gate, false, "gate"), be.register_weight(up, false, "up"),
                     be.register_weight(down, false, "down"), 0.f};
        m.shared = {be.register_weight(sg, false, "sg"), be.register_weight(su, false, "su"),
                    be.register_weight(sd, false, "sd"), 0.f};
        auto ids = be.scratch_ids(size_t(T * K));
        auto wts = be.scratch(size_t(T * K));
        auto dx = put(be, x);
        test::moe_ops(be).moe_route(m.route, dx, T, ids, wts);
        ids_out = get(be, ids, size_t(T * K));
        auto out = be.scratch(size_t(T * E));
        test::moe_ops(be).moe_experts(m.experts, dx, T, ids, wts, K, &m.shared, nullptr, out);
        return get(be, out, size_t(T * E));
    };
    auto g = gpu();
    auto c = cpu();
    const std::vector<float> og = run(*g, ids_gpu), oc = run(*c, ids_cpu);
    EXPECT_EQ(ids_gpu, ids_cpu);
    EXPECT_LT(rel_err(og, oc), 5e-3);  // F16 activations on the CPU
    // NaN selection scores (a bias gone bad): both rank them below every number, so
    // both pick the same real experts.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t e = 0; e < X; e += 3) bias[size_t(e)] = nan;
    const std::vector<float> og2 = run(*g, ids_gpu), oc2 = run(*c, ids_cpu);
    EXPECT_EQ(ids_gpu, ids_cpu);
    for (int32_t id : ids_cpu) EXPECT_NE(id % 3, 0) << "an expert of NaN score was picked";
    EXPECT_LT(rel_err(og2, oc2), 5e-3);
}

TEST(CudaOps, DraftPickIsTheCpus) {
    const int64_t V = 5000, rows = 3;
    std::vector<float> l = test::normal_floats(size_t(V * rows), 19, 3.f);
    l[size_t(V + 17)] = l[size_t(V + 4000)] = 100.f;  // a tie: the lower id wins
    auto run = [&](Backend& be, std::vector<double>& p) {
        auto best = be.scratch_ids(size_t(rows));
        auto prob = be.scratch(size_t(rows * 2)).as<double>();
        be.draft_pick(put(be, l), rows, V, best, prob);
        p = get(be, prob, size_t(rows));
        return get(be, best, size_t(rows));
    };
    std::vector<double> pg, pc;
    auto g = gpu();
    auto c = cpu();
    EXPECT_EQ(run(*g, pg), run(*c, pc));
    for (int64_t i = 0; i < rows; ++i) EXPECT_NEAR(pg[size_t(i)], pc[size_t(i)], 1e-9);
}

// ---- GLM-5.3-Flash's ops -----------------------------------------------------------

TEST(CudaOps, LinearAttentionOpsAgreeWithTheCpu) {
    const int64_t H = 2, D = 32, C = H * D, K = 4;
    const std::vector<float> x = test::normal_floats(size_t(6 * C), 20),
                             taps = test::normal_floats(size_t(C * K), 21, 0.3f);
    const std::vector<float> tail = test::normal_floats(size_t((K - 1) * C), 22);
    // Two sequences, 5 tokens and 1, their tails updated in place.
    EXPECT_LT(both([&](Backend& be) {
                  auto dx = put(be, x), dy = be.scratch(x.size()), dy2 = be.scratch(x.size());
                  auto t1 = put(be, tail), t2 = put(be, test::normal_floats(tail.size(), 23));
                  // The first sequence again, its tail double-buffered (the model's form).
                  auto t1_in = put(be, tail), t1_out = be.scratch(tail.size());
                  const LinearOps::ConvSeq seqs[2] = {{dx, t1, dy, 5, nullptr},
                                                      {dx + 5 * C, t2, dy + 5 * C, 1, nullptr}};
                  test::linear_ops(be).causal_conv(seqs, C, taps.data(), K, C, C, true);
                  const LinearOps::ConvSeq again{dx, t1_out, dy2, 5, t1_in};
                  test::linear_ops(be).causal_conv({&again, 1}, C, taps.data(), K, C, C, true);
                  std::vector<float> out = get(be, dy, x.size()), out2 = get(be, dy2, 5 * C);
                  out.insert(out.end(), out2.begin(), out2.end());
                  for (auto t : {t1, t2, t1_out}) {
                      const std::vector<float> h = get(be, t, tail.size());
                      out.insert(out.end(), h.begin(), h.end());
                  }
                  return out;
              }),
              1e-5);
    const std::vector<float> z = test::normal_floats(size_t(3 * C), 24),
                             bias = test::normal_floats(size_t(C), 25),
                             rate = test::normal_floats(size_t(H), 26);
    EXPECT_LT(both([&](Backend& be) {
                  auto g = be.scratch(z.size());
                  test::linear_ops(be).bounded_decay(put(be, z), bias.data(), rate.data(), 3, H, D,
                                                     -5.f, g);
                  auto y = put(be, z);
                  test::linear_ops(be).l2_norm(y, 3 * H, D, 1e-6f, y);
                  auto s = put(be, z);
                  test::linear_ops(be).apply_sigmoid(s, int64_t(z.size()));
                  test::linear_ops(be).mul_sigmoid(s, put(be, bias), C);
                  std::vector<float> out = get(be, g, z.size()), b2 = get(be, y, z.size()),
                                     b3 = get(be, s, z.size());
                  out.insert(out.end(), b2.begin(), b2.end());
                  out.insert(out.end(), b3.begin(), b3.end());
                  return out;
              }),
              1e-5);
    // The gated delta rule over 6 tokens, the state double-buffered.
    const int64_t T = 6;
    std::vector<float> q = test::normal_floats(size_t(T * C), 27),
                       k = test::normal_floats(size_t(T * C), 28);
    for (auto* v : {&q, &k})
        for (int64_t r = 0; r < T * H; ++r) {
            double n = 0;
            for (int64_t i = 0; i < D; ++i)
                n += double((*v)[size_t(r * D + i)]) * (*v)[size_t(r * D + i)];
            for (int64_t i = 0; i < D; ++i) (*v)[size_t(r * D + i)] /= float(std::sqrt(n));
        }
    const std::vector<float> v = test::normal_floats(size_t(T * C), 29),
                             st = test::normal_floats(size_t(H * D * D), 30, 0.1f);
    std::vector<float> g(static_cast<size_t>(T * C)), beta(static_cast<size_t>(T * H));
    for (size_t i = 0; i < g.size(); ++i) g[i] = -0.05f * float(i % 7);
    for (size_t i = 0; i < beta.size(); ++i) beta[i] = 0.2f + 0.1f * float(i % 5);
    EXPECT_LT(both([&](Backend& be) {
                  auto state_in = put(be, st), state = be.scratch(st.size()),
                       out = be.scratch(v.size());
                  const LinearOps::DeltaRuleSeq seq{
                      put(be, q), put(be, k), put(be, v), put(be, g), put(be, beta),
                      state,      out,        T,          state_in};
                  test::linear_ops(be).gated_delta_rule({&seq, 1}, H, D, 0.125f);
                  std::vector<float> o = get(be, out, v.size()), s2 = get(be, state, st.size());
                  o.insert(o.end(), s2.begin(), s2.end());
                  return o;
              }),
              1e-4);
}

TEST(CudaOps, HyperConnectionsAgreeWithTheCpu) {
    const int64_t T = 3, S = 4, E = 64, M = (2 + S) * S;
    const std::vector<float> mix = test::normal_floats(size_t(T * M), 31),
                             base = test::normal_floats(size_t(M), 32), scale = {0.5f, 0.7f, 1.3f},
                             X = test::normal_floats(size_t(T * S * E), 33),
                             f = test::normal_floats(size_t(T * E), 34);
    EXPECT_LT(both([&](Backend& be) {
                  auto pre = be.scratch(size_t(T * S)), post = be.scratch(size_t(T * S)),
                       comb = be.scratch(size_t(T * S * S));
                  test::linear_ops(be).hc_coefficients(put(be, mix), T, S, base.data(),
                                                       scale.data(), 1e-6f, 20, pre, post, comb);
                  auto dX = put(be, X);
                  auto y = be.scratch(size_t(T * E)), ym = be.scratch(size_t(T * E)),
                       out = be.scratch(X.size());
                  test::linear_ops(be).hc_reduce(dX, pre, T, S, E, y);
                  test::linear_ops(be).hc_reduce(dX, nullptr, T, S, E, ym);
                  test::linear_ops(be).hc_expand(dX, put(be, f), post, comb, T, S, E, out);
                  std::vector<float> r;
                  for (auto [d, n] : {std::pair{pre, T * S},
                                      {post, T * S},
                                      {comb, T * S * S},
                                      {y, T * E},
                                      {ym, T * E},
                                      {out, T * S * E}}) {
                      const std::vector<float> h = get(be, d, size_t(n));
                      r.insert(r.end(), h.begin(), h.end());
                  }
                  return r;
              }),
              1e-5);
}

TEST(CudaOps, PooledKeysAndTheirCellsAgreeWithTheCpu) {
    const int64_t Dk = 32, B = 4, n = 23;
    for (int64_t Gw : {Dk, int64_t(1)}) {
        const int64_t W = Dk + Gw;
        const std::vector<float> cells = test::normal_floats(size_t(n * W), 35),
                                 ape = test::normal_floats(size_t(B * Gw), 36),
                                 norm = test::normal_floats(size_t(Dk), 37);
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(i);
        EXPECT_LT(both([&](Backend& be) {
                      CacheRows c{be.alloc_cache(size_t(n * W) * 4), W, CacheType::F16};
                      CacheRows p{be.alloc_cache(size_t(n / B * Dk) * 4), Dk, CacheType::F32};
                      auto dpos = put(be, pos);
                      be.cache_store(c, put(be, cells), W, n, dpos);
                      test::attn_ops(be).pool_compress(c, Dk, Gw, B, ape.data(), norm.data(), 1e-6f,
                                                       p, dpos, n);
                      std::vector<float> h = get(be, p.data.as<float>(), size_t(n / B * Dk));
                      be.free_cache(c.data);
                      be.free_cache(p.data);
                      return h;
                  }),
                  1e-5)
            << "gate width " << Gw;
    }
    // Rows at positions 13 and 22 with 2 pools picked each (3 and 5 complete pools).
    const std::vector<int32_t> picked = {0, 1, 1, 4}, rpos = {13, 22};
    auto cells_of = [&](Backend& be) {
        auto rows = be.scratch_ids(size_t(2 * 16));
        be.write(rows, std::vector<int32_t>(32, -1).data(), 32);
        test::attn_ops(be).pool_cells(put(be, picked), put(be, rpos), 2, 2, B, rows, 16);
        return get(be, rows, 32);
    };
    auto g = gpu();
    auto c = cpu();
    EXPECT_EQ(cells_of(*g), cells_of(*c));
}

// ---- the model ------------------------------------------------------------------

struct OnBackend {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<Backend> be;
    std::unique_ptr<model::Model> model;
    OnBackend(std::unique_ptr<Backend> b, bool nextn = false,
              const std::string& fixture = "glm-dsa/tiny.gguf")
        : be(std::move(b)) {
        file = gguf::File::open(test::data_path(fixture));
        model::LoadOptions lo;
        lo.cache_type = CacheType::F16;
        lo.load_nextn = nextn;
        model = model::load_model(*file, *be, lo);
    }
};

std::vector<float> prefill(model::Model& m, const std::vector<int32_t>& tokens) {
    auto st = m.new_state(int64_t(tokens.size()) + 8);
    model::SeqInput in{st.get(), tokens, true};
    std::vector<float> lg;
    m.forward({&in, 1}, lg);
    return lg;
}

TEST(CudaGlmDsa, LogitsAgreeWithTheCpu) {
    OnBackend g(gpu()), c(cpu());
    const int64_t V = c.model->info().n_vocab;
    // Long enough for the indexer to select (the fixture keeps a few dozen rows).
    const std::vector<int32_t> tokens = test::random_ids(3, 150, V);
    const std::vector<float> lg = prefill(*g.model, tokens), lc = prefill(*c.model, tokens);
    ASSERT_EQ(lg.size(), lc.size());
    EXPECT_LT(rel_err(lg, lc), 0.02);
    // Greedy ids equal wherever the CPU's top two are apart.
    int compared = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
        const float* a = lc.data() + t * size_t(V);
        const float* b = lg.data() + t * size_t(V);
        std::vector<int32_t> order(static_cast<size_t>(V));
        for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](int32_t x, int32_t y) { return a[x] > a[y]; });
        if (a[order[0]] - a[order[1]] < 0.05f) continue;
        ++compared;
        EXPECT_EQ(std::max_element(b, b + V) - b, order[0]) << "token " << t;
    }
    EXPECT_GT(compared, 10);
}

TEST(CudaGlm5Next, LogitsAgreeWithTheCpuAndDecodeRowsAreBatchInvariant) {
    const std::string fx = "glm5next/tiny.gguf";
    OnBackend g(gpu(), false, fx), c(cpu(), false, fx);
    const int64_t V = c.model->info().n_vocab;
    const std::vector<int32_t> tokens = test::random_ids(4, 120, V);
    EXPECT_LT(rel_err(prefill(*g.model, tokens), prefill(*c.model, tokens)), 0.02);
    // A decode row alone and beside another sequence's decode row: the same bits.
    model::Model& m = *g.model;
    auto decode = [&](bool together) {
        auto sa = m.new_state(160), sb = m.new_state(160);
        std::vector<float> lg;
        model::SeqInput pa{sa.get(), tokens, false}, pb{sb.get(), {tokens.data(), 30}, false};
        m.forward({&pa, 1}, lg);
        m.forward({&pb, 1}, lg);
        const int32_t ta = 3, tb = 4;
        model::SeqInput na{sa.get(), {&ta, 1}, false}, nb{sb.get(), {&tb, 1}, false};
        if (together) {
            model::SeqInput both_in[2] = {na, nb};
            m.forward(both_in, lg);
        } else {
            m.forward({&na, 1}, lg);
        }
        return std::vector<float>(lg.begin(), lg.begin() + V);
    };
    const std::vector<float> alone = decode(false), joint = decode(true);
    EXPECT_EQ(std::memcmp(alone.data(), joint.data(), size_t(V) * sizeof(float)), 0);
}

// The GPU runs the text forwards' op families and not the vision tower's: the tower is
// refused where it loads, naming the family and the backend (no op of it is stubbed).
// The vision tower on the device: every family a model needs, the public goldens'
// embeddings within the CPU's tolerance, and two images in one call each the bits it
// gets alone.
TEST(CudaVision, EmbeddingsFromTheGoldenPixelsAndBatchesChangeNoBit) {
    OnBackend g(gpu(), false, "glm5next/tiny.gguf");
    EXPECT_NE(backend::family<backend::MoeOps>(*g.be), nullptr);
    EXPECT_NE(backend::family<backend::AttentionOps>(*g.be), nullptr);
    EXPECT_NE(backend::family<backend::LinearOps>(*g.be), nullptr);
    EXPECT_NE(backend::family<backend::VisionOps>(*g.be), nullptr);
    const auto mmproj = gguf::File::open(test::data_path("glm5next/mmproj-tiny.gguf"));
    auto tower = model::load_vision_tower(*mmproj, *g.be, *g.model, {});
    const auto golden = test::load_json(test::data_path("glm5next/vision.golden.json"));
    std::vector<std::vector<float>> px;
    std::vector<model::VisionTower::Image> ims;
    for (const auto& im : golden["images"]) px.push_back(im["pixels"].get<std::vector<float>>());
    for (size_t i = 0; i < px.size(); ++i)
        ims.push_back({px[i].data(), golden["images"][i]["canvas"][0].get<int64_t>(),
                       golden["images"][i]["canvas"][1].get<int64_t>()});
    ASSERT_GE(ims.size(), 2u);
    std::vector<std::vector<float>> alone;
    for (size_t i = 0; i < ims.size(); ++i) {
        std::vector<float> rows;
        tower->encode({&ims[i], 1}, rows);
        const auto want = golden["images"][i]["embeddings"].get<std::vector<double>>();
        ASSERT_EQ(rows.size(), want.size());
        double d = 0, m = 0;
        for (size_t k = 0; k < want.size(); ++k) {
            d = std::max(d, std::fabs(double(rows[k]) - want[k]));
            m = std::max(m, std::fabs(want[k]));
        }
        std::printf("  image %zu: max |d| / max |golden| = %.3g\n", i, d / m);
        EXPECT_LE(d / m, 1e-4) << "image " << i;
        alone.push_back(std::move(rows));
    }
    std::vector<float> both, joined = alone[0];
    joined.insert(joined.end(), alone[1].begin(), alone[1].end());
    tower->encode({ims.data(), 2}, both);
    EXPECT_TRUE(test::bitwise_equal(both, joined));
}

// Experts in system RAM beside the device: the model on the (simulated) GPU, every block's
// routed experts on a CPU backend.
struct OnDeviceWithHostExperts {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<Backend> be, host;
    std::unique_ptr<model::Model> model;
    OnDeviceWithHostExperts(const std::string& fixture, bool nextn, bool overlap) {
        file = gguf::File::open(test::data_path(fixture));
        be = gpu();
        host = cpu();
        model::LoadOptions lo;
        lo.cache_type = CacheType::F16;
        lo.load_nextn = nextn;
        lo.experts_backend = host.get();
        lo.host_experts = std::vector<bool>(64, true);
        lo.moe_overlap = overlap;
        model = model::load_model(*file, *be, lo);
    }
};

// Greedy tokens of two requests decoded together, plain or speculative.
std::vector<std::vector<int32_t>> greedy_pair(model::Model& m, runtime::DraftType draft) {
    runtime::EngineOptions eo;
    eo.n_parallel = 2;
    eo.n_ctx = 256;
    eo.prefix_cache = false;
    runtime::Engine e(m, eo);
    std::vector<runtime::RequestParams> ps;
    for (int r = 0; r < 2; ++r) ps.push_back(test::looping_request(r, draft, 16));
    std::vector<std::vector<int32_t>> out;
    for (auto& h : e.submit_group(std::move(ps))) {
        const runtime::RequestResult r = h->wait();
        EXPECT_NE(r.finish_reason, "error") << r.error;
        out.push_back(r.tokens);
    }
    return out;
}

// The hybrid run gives the device's own tokens, plain and speculative, and its logits
// within the products' tolerance of the device's (the CPU rounds the experts' activations to
// the weights' 8-bit partner format, the device keeps them in F32); taking turns gives the
// overlapped run's bits.
TEST(CudaHybrid, HostExpertsGiveTheDevicesTokens) {
    struct Case {
        const char* fixture;
        bool nextn;
        runtime::DraftType draft;
    };
    for (const Case& c : {Case{"glm-dsa/tiny.gguf", true, runtime::DraftType::Mtp},
                          Case{"glm5next/tiny.gguf", false, runtime::DraftType::Ngram}}) {
        OnBackend alone(gpu(), c.nextn, c.fixture);
        OnDeviceWithHostExperts hybrid(c.fixture, c.nextn, true), turns(c.fixture, c.nextn, false);
        ASSERT_GT(hybrid.model->info().host_expert_blocks, 0) << c.fixture;
        const int64_t V = alone.model->info().n_vocab;
        const std::vector<int32_t> tokens = test::random_ids(5, 60, V);
        const std::vector<float> la = prefill(*alone.model, tokens);
        const std::vector<float> lh = prefill(*hybrid.model, tokens);
        const double e = rel_err(lh, la);
        std::printf("  %s: hybrid logits vs the device's: %.3g\n", c.fixture, e);
        EXPECT_LT(e, 0.02) << c.fixture;
        EXPECT_TRUE(test::bitwise_equal(prefill(*turns.model, tokens), lh)) << c.fixture;
        const auto plain = greedy_pair(*alone.model, runtime::DraftType::Off);
        EXPECT_EQ(greedy_pair(*hybrid.model, runtime::DraftType::Off), plain) << c.fixture;
        EXPECT_EQ(greedy_pair(*hybrid.model, c.draft), plain) << c.fixture;
    }
}

#if defined(GLM5_CUDA_SIM)
// The overlap is real in the schedule: each MoE layer's shared expert is held on the device
// (its first kernel waits) until the CPU has begun the routed experts; taking turns, the CPU
// would wait for the shared rows first, and the hold would end only by its timeout.
TEST(CudaHybrid, HostExpertsBeginWhileTheSharedExpertRuns) {
    struct Gate {
        std::mutex m;
        std::condition_variable cv;
        bool armed = false, closed = false;
        int held = 0, cpu_first = 0, timeouts = 0, layers = 0;
    } g;
    OnDeviceWithHostExperts h("glm-dsa/tiny.gguf", false, true);
    h.be->set_op_hook([&](const char* op, int64_t) {
        if (std::string_view(op) != "moe") return;  // the device's MoE: the shared expert
        std::lock_guard<std::mutex> lk(g.m);
        g.armed = true;
        ++g.layers;
    });
    h.host->set_op_hook([&](const char* op, int64_t) {
        if (std::string_view(op) != "moe") return;  // the CPU's routed experts begin
        std::lock_guard<std::mutex> lk(g.m);
        if (g.armed) {
            g.armed = false;  // before the shared expert's first kernel even started
            ++g.cpu_first;
        } else if (g.closed) {
            g.closed = false;
            g.cv.notify_all();
        }
    });
    cudasim::set_kernel_start_hook([&](const char*) {
        std::unique_lock<std::mutex> lk(g.m);
        if (!g.armed) return;
        g.armed = false;
        g.closed = true;
        ++g.held;
        if (!g.cv.wait_for(lk, std::chrono::seconds(30), [&] { return !g.closed; })) {
            ++g.timeouts;
            g.closed = false;
        }
    });
    const std::vector<int32_t> tokens = test::random_ids(9, 20, h.model->info().n_vocab);
    prefill(*h.model, tokens);
    cudasim::set_kernel_start_hook({});
    EXPECT_GT(g.layers, 0);
    EXPECT_EQ(g.held + g.cpu_first, g.layers);
    EXPECT_EQ(g.timeouts, 0) << "the CPU waited for the device's shared expert";
    std::printf(
        "  %d MoE layers: the shared expert held until the CPU began on %d, the CPU began "
        "before its first kernel on %d\n",
        g.layers, g.held, g.cpu_first);
}
#endif

// Two sequences decoded together, then each alone: the same bits for every decode row.
TEST(CudaGlmDsa, DecodeRowsDoNotDependOnTheBatch) {
    OnBackend g(gpu());
    model::Model& m = *g.model;
    const int64_t V = m.info().n_vocab;
    const std::vector<int32_t> a = test::random_ids(7, 90, V), b = test::random_ids(8, 40, V);
    auto decode = [&](bool together) {
        auto sa = m.new_state(128), sb = m.new_state(128);
        std::vector<float> lg, out;
        model::SeqInput pa{sa.get(), a, false}, pb{sb.get(), b, false};
        m.forward({&pa, 1}, lg);
        m.forward({&pb, 1}, lg);
        for (int32_t step = 0; step < 4; ++step) {
            const int32_t ta = 5 + step, tb = 60 + step;
            model::SeqInput na{sa.get(), {&ta, 1}, false}, nb{sb.get(), {&tb, 1}, false};
            if (together) {
                model::SeqInput both_in[2] = {na, nb};
                m.forward(both_in, lg);
                out.insert(out.end(), lg.begin(), lg.end());
            } else {
                m.forward({&na, 1}, lg);
                out.insert(out.end(), lg.begin(), lg.end());
                m.forward({&nb, 1}, lg);
                out.insert(out.end(), lg.begin(), lg.end());
            }
        }
        return out;
    };
    const std::vector<float> joint = decode(true), alone = decode(false);
    ASSERT_EQ(joint.size(), alone.size());
    EXPECT_EQ(std::memcmp(joint.data(), alone.data(), joint.size() * sizeof(float)), 0);
}

// A decode row in a step with another sequence's 40-token prompt chunk: the bits of the
// same row decoded alone (every product keeps the vector form's order at any row count).
TEST(CudaGlmDsa, ADecodeRowBesideAPromptChunkIsTheSameBits) {
    OnBackend g(gpu());
    model::Model& m = *g.model;
    const int64_t V = m.info().n_vocab;
    const std::vector<int32_t> a = test::random_ids(9, 70, V), b = test::random_ids(10, 40, V);
    const int32_t next = 11;
    auto row = [&](bool beside) {
        auto sa = m.new_state(128), sb = m.new_state(128);
        std::vector<float> lg;
        model::SeqInput pa{sa.get(), a, false};
        m.forward({&pa, 1}, lg);
        model::SeqInput na{sa.get(), {&next, 1}, false};
        if (beside) {
            model::SeqInput both_in[2] = {na, {sb.get(), b, false}};
            m.forward(both_in, lg);
        } else {
            m.forward({&na, 1}, lg);
        }
        return std::vector<float>(lg.begin(), lg.begin() + V);  // a's row comes first
    };
    const std::vector<float> alone = row(false), beside = row(true);
    EXPECT_EQ(std::memcmp(alone.data(), beside.data(), size_t(V) * sizeof(float)), 0);
}

// A decode step's traffic with the host, as the simulated device counts it: the kernels it
// launches (a launch costs a few microseconds on a GPU, so a step of small kernels is bound by
// their count), one wait for the device (the logits' read), the plan uploaded and nothing
// else, the logits downloaded. The launch bounds are the counts measured when they were last
// lowered: a change that adds launches or host traffic to a step fails here.
struct StepTraffic {
    backend::Counters c;
    int64_t layers;
};
StepTraffic decode_step_traffic(const std::string& fixture) {
    OnBackend g(gpu(), false, fixture);
    model::Model& m = *g.model;
    auto st = m.new_state(64);
    const std::vector<int32_t> prompt = test::random_ids(4, 20, m.info().n_vocab);
    std::vector<float> lg;
    model::SeqInput in{st.get(), prompt, false};
    m.forward({&in, 1}, lg);
    g.be->reset_counters();
    const int32_t next = 9;
    model::SeqInput step{st.get(), {&next, 1}, false};
    m.forward({&step, 1}, lg);
    const backend::Counters c = g.be->counters();
    std::printf(
        "  %s decode step: %llu launches (%.1f per layer), %llu waits, %llu uploads, "
        "%llu downloads\n",
        fixture.c_str(), (unsigned long long)c.launches,
        double(c.launches) / double(m.info().n_layer), (unsigned long long)c.host_syncs,
        (unsigned long long)c.uploads, (unsigned long long)c.downloads);
    return {c, m.info().n_layer};
}

TEST(CudaSteps, ADecodeStepsLaunchesAndHostTraffic) {
    // Before matmuls and SwiGLU were one launch each: 188 (glm-dsa); before the attention,
    // indexer, convolution and delta-rule descriptors came with their launches, 10 and 33
    // uploads. glm5next's pool compression is launched at every step since its pools are
    // found on the device (296 before); glm-dsa's indexer inputs are two launches, not seven
    // (161 before), MLA's cache row and query rope parts one, not five (146 before), and
    // each residual add with the next norm one (122 before). glm5next's KDA projections of a
    // layer's input are one launch, not six (299 before).
    for (const auto& [fixture, most] : {std::pair<std::string, uint64_t>{"glm-dsa/tiny.gguf", 111},
                                        {"glm5next/tiny.gguf", 269}}) {
        SCOPED_TRACE(fixture);
        const StepTraffic t = decode_step_traffic(fixture);
        EXPECT_LE(t.c.launches, most);
        EXPECT_EQ(t.c.host_syncs, 1u);
        EXPECT_EQ(t.c.uploads, 1u);
        EXPECT_EQ(t.c.downloads, 1u);
        EXPECT_EQ(t.c.graphs, 1u);  // the whole step, one graph
    }
}

// A decode run with CUDA graphs on or off (GLM5_CUDA_GRAPHS=0): two sequences decoded
// together for 20 steps, the logits of every step, and glm-dsa's MTP drafts after them.
struct GraphRun {
    std::vector<float> logits;
    std::vector<int32_t> drafts;
    backend::Counters decode;  // the decode steps' counts
};
GraphRun graph_run(const std::string& fixture, bool graphs) {
    if (!graphs) setenv("GLM5_CUDA_GRAPHS", "0", 1);
    const bool nextn = fixture.starts_with("glm-dsa");
    OnBackend g(gpu(), nextn, fixture);
    unsetenv("GLM5_CUDA_GRAPHS");
    model::Model& m = *g.model;
    const int64_t V = m.info().n_vocab;
    auto sa = m.new_state(128), sb = m.new_state(128);
    const std::vector<int32_t> a = test::random_ids(21, 30, V), b = test::random_ids(22, 9, V);
    GraphRun r;
    std::vector<float> lg;
    model::SeqInput pa{sa.get(), a, false}, pb{sb.get(), b, false};
    m.forward({&pa, 1}, lg);
    m.forward({&pb, 1}, lg);
    g.be->reset_counters();
    for (int32_t step = 0; step < 20; ++step) {
        const int32_t ta = 3 + step, tb = 40 + step;
        model::SeqInput both[2] = {{sa.get(), {&ta, 1}, false}, {sb.get(), {&tb, 1}, false}};
        m.forward(both, lg);
        r.logits.insert(r.logits.end(), lg.begin(), lg.end());
    }
    r.decode = g.be->counters();
    if (nextn) {
        model::DraftRequest d[2];
        d[0].state = sa.get(), d[0].token = 7, d[0].max_tokens = 4;
        d[1].state = sb.get(), d[1].token = 8, d[1].max_tokens = 3;
        m.draft(d);
        for (const auto& x : d) r.drafts.insert(r.drafts.end(), x.out.begin(), x.out.end());
    }
    return r;
}

// A step is recorded and launched as one CUDA graph, and a later step that queues the same
// work replays it: the plan (positions, the rows that want logits) is the one thing copied in,
// and the kernels size their work from bounds that hold for many steps. Replays give the
// eager launches' logits and drafts bit for bit, and 20 decode steps capture one graph
// (glm5next two: its recurrent state alternates between two buffers).
TEST(CudaGraphs, DecodeStepsReplayOneGraphWithTheEagerBits) {
    for (const auto& [fixture, captures] :
         {std::pair<std::string, uint64_t>{"glm-dsa/tiny.gguf", 1}, {"glm5next/tiny.gguf", 2}}) {
        SCOPED_TRACE(fixture);
        const GraphRun eager = graph_run(fixture, false), graphs = graph_run(fixture, true);
        std::printf("  %s: 20 decode steps, %llu graphs launched, %llu captured\n", fixture.c_str(),
                    (unsigned long long)graphs.decode.graphs,
                    (unsigned long long)graphs.decode.captures);
        EXPECT_EQ(eager.decode.graphs, 0u);
        EXPECT_EQ(graphs.decode.graphs, 20u);
        EXPECT_EQ(graphs.decode.captures, captures);
        EXPECT_EQ(graphs.decode.launches, eager.decode.launches);
        EXPECT_TRUE(test::bitwise_equal(graphs.logits, eager.logits));
        EXPECT_EQ(graphs.drafts, eager.drafts);
        if (fixture.starts_with("glm-dsa")) {
            EXPECT_FALSE(eager.drafts.empty());
        }
    }
}

// A step an op's failure leaves part-way queues what it recorded and throws the failure once;
// the backend then runs the next steps, as graphs, with the bits of a backend that never
// failed.
TEST(CudaGraphs, AFailedStepLeavesTheDeviceWorking) {
    OnBackend g(gpu()), fresh(gpu());
    const std::vector<int32_t> tokens = test::random_ids(8, 12, g.model->info().n_vocab);
    bool fail = true;
    g.be->set_op_hook([&](const char* op, int64_t) {
        if (fail && std::string_view(op) == "mla_attention") throw Error("injected");
    });
    EXPECT_THROW(prefill(*g.model, tokens), Error);
    fail = false;
    g.be->reset_counters();
    EXPECT_TRUE(test::bitwise_equal(prefill(*g.model, tokens), prefill(*fresh.model, tokens)));
    EXPECT_EQ(g.be->counters().graphs, 1u);
}

// Steps whose work never repeats (prompt chunks of a new length each time) would each pay for
// a capture that is never replayed: after 8 such captures the steps are launched as they come.
TEST(CudaGraphs, StepsThatNeverRepeatStopBeingCaptured) {
    OnBackend g(gpu());
    model::Model& m = *g.model;
    auto st = m.new_state(128);
    std::vector<float> lg;
    g.be->reset_counters();
    for (int n = 1; n <= 12; ++n) {
        const std::vector<int32_t> chunk = test::random_ids(uint32_t(n), n, m.info().n_vocab);
        model::SeqInput in{st.get(), chunk, false};
        m.forward({&in, 1}, lg);
    }
    const backend::Counters c = g.be->counters();
    EXPECT_EQ(c.captures, 8u);
    EXPECT_EQ(c.graphs, 8u);
}

}  // namespace
}  // namespace glm5

// Repacked weights through the CPU backend: matmul, matmul_slices and the MoE
// give exactly the bits of the same weights in the plain layout, including
// matrices whose row count leaves a plain tail after the last 16-row group,
// decode-sized (1 token) and prefill-sized batches, for Q4_K / Q6_K and for
// Q5_0 / Q8_0 (rows of 192 values as GLM-DSA's per-head attn_k_b, and of an
// odd block count); matmuls gives the bits of separate matmul calls; and a
// whole model loaded with --repack gives the plain model's logits.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cpu_memory.h"
#include "quant/quant.h"
#include "quant/repack.h"
#include "quant_test_util.h"
#include "util_backend.h"
#include "util_model.h"

using namespace glm5;
using backend::Weight;
using backend::cpu::dev;

namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A weight stack (slices x rows x cols of type t) held plain and repacked.
struct TwoLayouts {
    std::vector<uint8_t> plain, packed;
    Weight p, r;

    TwoLayouts(quant::Type t, int64_t cols, int64_t rows, int64_t slices, uint32_t seed) {
        plain = test::quantize(t, test::varied_floats(size_t(cols * rows * slices), seed),
                               rows * slices);
        p.type = r.type = t;
        p.cols = r.cols = cols;
        p.rows = r.rows = rows;
        p.slices = r.slices = slices;
        p.row_bytes = r.row_bytes = quant::row_size(t, cols);
        p.slice_bytes = p.row_bytes * size_t(rows);
        p.data = plain.data();
        r.slice_bytes = quant::repacked_bytes(t, cols, rows);
        packed.resize(r.slice_bytes * size_t(slices));
        for (int64_t s = 0; s < slices; ++s)
            quant::repack(t, plain.data() + size_t(s) * p.slice_bytes,
                          packed.data() + size_t(s) * r.slice_bytes, cols, rows);
        r.data = packed.data();
        r.repacked = true;
    }
};

bool repack_here() {
    return quant::repack_supported(quant::Type::Q4_K, 256);
}

bool is_legacy(quant::Type t) {
    return t == quant::Type::Q5_0 || t == quant::Type::Q8_0;
}

class BackendRepack : public ::testing::TestWithParam<quant::Type> {};

TEST_P(BackendRepack, MatmulEqualsPlainLayoutBitwise) {
    if (!repack_here()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI: no repacked GEMM";
    auto be = backend::make_cpu_backend({2});
    // Legacy rows: 6 blocks (attn_k_b's 192) and 7 (an odd count).
    const std::vector<int64_t> cols_list =
        is_legacy(GetParam()) ? std::vector<int64_t>{192, 224} : std::vector<int64_t>{512};
    for (int64_t cols : cols_list)
        // 40 rows: two groups and a plain tail of 8.
        for (int64_t rows : {16, 40, 256}) {
            TwoLayouts w(GetParam(), cols, rows, 1, uint32_t(rows));
            ASSERT_TRUE(quant::repack_supported(GetParam(), cols));
            for (int64_t n : {1, 3, 37}) {
                const auto x = test::normal_floats(size_t(n * cols), uint32_t(n));
                std::vector<float> yp(size_t(n * rows)), yr(size_t(n * rows), -1.0f);
                be->matmul(w.p, dev(x.data()), cols, n, dev(yp.data()), rows);
                be->matmul(w.r, dev(x.data()), cols, n, dev(yr.data()), rows);
                EXPECT_TRUE(bitwise_equal(yp, yr))
                    << "cols " << cols << " rows " << rows << " tokens " << n;
            }
        }
}

TEST_P(BackendRepack, SlicesEqualPlainLayoutBitwise) {
    if (!repack_here()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI: no repacked GEMM";
    auto be = backend::make_cpu_backend({2});
    struct Shape {
        int64_t cols, rows, S, n;
    };
    std::vector<Shape> shapes = {{is_legacy(GetParam()) ? 192 : 256, 48, 4, 5}};
    if (is_legacy(GetParam())) {
        // attn_k_b of GLM-DSA: 16 heads of 512 x 192, decode and a prefill batch.
        shapes.push_back({192, 512, 16, 1});
        shapes.push_back({192, 512, 16, 40});
    }
    for (const Shape& sh : shapes) {
        TwoLayouts w(GetParam(), sh.cols, sh.rows, sh.S, 7);
        const auto x = test::normal_floats(size_t(sh.n * sh.S * sh.cols), 3);
        std::vector<float> yp(size_t(sh.n * sh.S * sh.rows)),
            yr(size_t(sh.n * sh.S * sh.rows), -1.0f);
        be->matmul_slices(w.p, dev(x.data()), sh.S * sh.cols, sh.cols, sh.n, dev(yp.data()),
                          sh.S * sh.rows, sh.rows);
        be->matmul_slices(w.r, dev(x.data()), sh.S * sh.cols, sh.cols, sh.n, dev(yr.data()),
                          sh.S * sh.rows, sh.rows);
        EXPECT_TRUE(bitwise_equal(yp, yr)) << "cols " << sh.cols << " rows " << sh.rows
                                           << " slices " << sh.S << " tokens " << sh.n;
    }
}

TEST_P(BackendRepack, MoeEqualsPlainLayoutBitwise) {
    if (!repack_here()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI: no repacked GEMM";
    auto be = backend::make_cpu_backend({2});
    const int64_t E = 512, F = 256, X = 8;
    const auto router = test::normal_floats(size_t(E * X), 11);
    TwoLayouts gate(GetParam(), E, F, X, 1), up(GetParam(), E, F, X, 2),
        down(GetParam(), F, E, X, 3);
    auto moe = [&](bool packed) {
        backend::MoeWeights m;
        m.route.router = test::f32_matrix(router, E, X);
        m.experts.gate = packed ? gate.r : gate.p;
        m.experts.up = packed ? up.r : up.p;
        m.experts.down = packed ? down.r : down.p;
        m.route.n_used = 2;
        m.route.weights_scale = 2.5f;
        return m;
    };
    for (int64_t T : {1, 19}) {
        const auto x = test::normal_floats(size_t(T * E), uint32_t(T));
        std::vector<float> op(size_t(T * E)), orp(size_t(T * E), -1.0f);
        backend::moe_all(*be, test::moe_ops(*be), moe(false), dev(x.data()), T, dev(op.data()));
        backend::moe_all(*be, test::moe_ops(*be), moe(true), dev(x.data()), T, dev(orp.data()));
        EXPECT_TRUE(bitwise_equal(op, orp)) << "tokens " << T;
    }
}

// The mixture of experts as three ops: the shared expert computed by moe_shared and
// added by moe_experts gives the bits of the fused form (one backend, one pass), and
// moe_route's ids and weights drive the routed experts the same way.
TEST_P(BackendRepack, MoeSplitOpsEqualTheFusedForm) {
    auto be = backend::make_cpu_backend({2});
    const int64_t E = 512, F = 256, X = 8, S = 256;
    const auto router = test::normal_floats(size_t(E * X), 12);
    TwoLayouts gate(GetParam(), E, F, X, 4), up(GetParam(), E, F, X, 5),
        down(GetParam(), F, E, X, 6);
    TwoLayouts sg(GetParam(), E, S, 1, 7), su(GetParam(), E, S, 1, 8), sd(GetParam(), S, E, 1, 9);
    backend::MoeWeights m;
    m.route.router = test::f32_matrix(router, E, X);
    m.route.n_used = 3;
    m.route.weights_scale = 2.5f;
    m.experts = {gate.p, up.p, down.p, 0.0f};
    m.shared = {sg.p, su.p, sd.p, 0.0f};
    for (int64_t T : {1, 5, 19}) {
        const auto x = test::normal_floats(size_t(T * E), uint32_t(100 + T));
        std::vector<float> fused(size_t(T * E)), split(size_t(T * E), -1.0f),
            shared(size_t(T * E), -1.0f), routed_only(size_t(T * E), -1.0f);
        std::vector<int32_t> ids(size_t(T * 3));
        std::vector<float> w(size_t(T * 3));
        backend::moe_all(*be, test::moe_ops(*be), m, dev(x.data()), T, dev(fused.data()));
        test::moe_ops(*be).moe_route(m.route, dev(x.data()), T, dev(ids.data()), dev(w.data()));
        test::moe_ops(*be).moe_shared(m.shared, dev(x.data()), T, dev(shared.data()));
        test::moe_ops(*be).moe_experts(m.experts, dev(x.data()), T, dev(ids.data()), dev(w.data()),
                                       3, nullptr, dev(shared.data()), dev(split.data()));
        EXPECT_TRUE(bitwise_equal(fused, split)) << "tokens " << T;
        test::moe_ops(*be).moe_experts(m.experts, dev(x.data()), T, dev(ids.data()), dev(w.data()),
                                       3, nullptr, nullptr, dev(routed_only.data()));
        EXPECT_FALSE(bitwise_equal(fused, routed_only)) << "the shared expert adds something";
        for (int64_t i = 0; i < T * 3; ++i) {
            EXPECT_GE(ids[size_t(i)], 0);
            EXPECT_LT(ids[size_t(i)], X);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, BackendRepack,
                         ::testing::Values(quant::Type::Q4_K, quant::Type::Q6_K, quant::Type::Q5_0,
                                           quant::Type::Q8_0),
                         [](const auto& info) { return std::string(quant::name(info.param)); });

// matmuls (several weights against one input, one op) gives the bits of
// separate matmul calls: formats with different activation types (Q8_K,
// Q8_0), plain and (where the CPU has the GEMM) repacked layouts, a weight
// of a few rows beside large ones, one token and a batch.
TEST(BackendMatmuls, EqualSeparateMatmulsBitwise) {
    auto be = backend::make_cpu_backend({2});
    const int64_t cols = 512;
    std::vector<std::unique_ptr<TwoLayouts>> ws;
    ws.push_back(std::make_unique<TwoLayouts>(quant::Type::Q4_K, cols, 256, 1, 1));
    ws.push_back(std::make_unique<TwoLayouts>(quant::Type::Q6_K, cols, 40, 1, 2));
    ws.push_back(std::make_unique<TwoLayouts>(quant::Type::Q8_0, cols, 8, 1, 3));
    ws.push_back(std::make_unique<TwoLayouts>(quant::Type::Q5_0, cols, 72, 1, 4));
    for (bool packed : {false, true}) {
        if (packed && !repack_here()) continue;  // the plain layouts ran above
        for (int64_t n : {1, 5}) {
            const auto x = test::normal_floats(size_t(n * cols), uint32_t(7 + n));
            std::vector<std::vector<float>> sep, joint;
            std::vector<backend::Backend::MatmulOut> outs;
            for (const auto& w : ws) {
                const Weight& wt = packed ? w->r : w->p;
                sep.emplace_back(size_t(n * wt.rows));
                joint.emplace_back(size_t(n * wt.rows), -1.0f);
                be->matmul(wt, dev(x.data()), cols, n, dev(sep.back().data()), wt.rows);
            }
            for (size_t j = 0; j < ws.size(); ++j) {
                const Weight& wt = packed ? ws[j]->r : ws[j]->p;
                outs.push_back({&wt, dev(joint[j].data()), wt.rows});
            }
            be->matmuls(outs, dev(x.data()), cols, n);
            for (size_t j = 0; j < ws.size(); ++j)
                EXPECT_TRUE(bitwise_equal(sep[j], joint[j]))
                    << "weight " << j << " packed " << packed << " tokens " << n;
        }
    }
}

// --repack on a Q4_K_M model: same logits bits for a prefill batch and for
// decode steps after it, and the load says how much it repacked.
TEST(ModelRepack, RepackedModelGivesThePlainLogits) {
    if (!repack_here()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI: no repacked GEMM";
    const std::string path = test::data_path("glm-dsa/small-q4_k_m.gguf");
    const auto g = test::load_json(test::data_path("glm-dsa/small-q4_k_m.golden.json"));
    std::vector<int32_t> tokens;
    for (const auto& v : g["prompts"][3]["tokens"]) tokens.push_back(v.get<int32_t>());
    test::TestModel plain(path, backend::CacheType::F16);

    auto file = gguf::File::open(path);
    auto be = backend::make_cpu_backend({2});
    model::LoadOptions lo;
    lo.repack = true;
    auto packed = model::load_model(*file, *be, lo);
    EXPECT_GT(packed->info().repacked_bytes, 0u);
    EXPECT_LE(packed->info().repacked_bytes, packed->info().weight_bytes);

    auto st = packed->new_state(int64_t(tokens.size()) + 8);
    std::vector<float> lg;
    const std::vector<int32_t> head(tokens.begin(), tokens.end() - 2);
    model::SeqInput in{st.get(), head, true};
    packed->forward({&in, 1}, lg);
    std::vector<float> all = lg;
    for (size_t i = tokens.size() - 2; i < tokens.size(); ++i) {
        model::SeqInput step{st.get(), {&tokens[i], 1}, true};
        packed->forward({&step, 1}, lg);
        all.insert(all.end(), lg.begin(), lg.end());
    }
    EXPECT_TRUE(bitwise_equal(all, plain.batch_logits(tokens, true)));
}

}  // namespace

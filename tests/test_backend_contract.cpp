// The backend contract's rules that hold whatever the backend: a handle says which
// backend owns it, another backend refuses it instead of misreading it, and values
// cross between backends only by an explicit copy.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cpu_memory.h"
#include "backend/moe_ops.h"
#include "core/error.h"
#include "util_backend.h"

using namespace glm5;
using backend::DevPtr;

TEST(BackendContract, HandlesCarryTheirBackendAndAreRefusedElsewhere) {
    auto a = backend::make_cpu_backend({1});
    auto b = backend::make_cpu_backend({1});
    ASSERT_NE(a->id(), b->id());
    const DevPtr<float> xa = a->scratch(8), ya = a->scratch(8);
    const DevPtr<float> xb = b->scratch(8);
    EXPECT_EQ(xa.owner(), a->id());
    EXPECT_EQ((xa + 3).owner(), a->id());
    EXPECT_EQ(xa.as<uint8_t>().owner(), a->id());
    EXPECT_EQ(DevPtr<const float>(xa).owner(), a->id());
    EXPECT_EQ(a->alloc_cache(64).owner(), a->id());
    const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
    a->write(xa, v.data(), v.size());
    a->write(ya, v.data(), v.size());
    a->add(ya, xa, 8);  // its own: fine
    try {
        b->add(xb, xa, 8);
        FAIL() << "backend b read backend a's handle";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("copy_from"), std::string::npos) << e.what();
    }
    EXPECT_THROW(b->write(xa, v.data(), v.size()), Error);
    std::vector<float> back(8);
    EXPECT_THROW(b->read(xa, back.data(), back.size()), Error);
    // The explicit copy.
    b->copy_from(*a, ya.as<const uint8_t>(), xb.as<uint8_t>(), 8 * sizeof(float));
    b->read(xb, back.data(), back.size());
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(back[i], 2 * v[i]);
    // Host arrays (handles of no backend) are any CPU backend's memory.
    std::vector<float> h(8, 1.0f);
    b->add(backend::cpu::dev(h.data()), xb, 8);
    EXPECT_EQ(h[7], 1.0f + 16.0f);
}

// The routing rule both backends run (backend/moe_ops.h): the highest selection scores,
// ties to the lower expert, a NaN score below every number, so that every pick is a
// real expert while there are enough of them.
TEST(MoeRouting, ANaNScoreRanksBelowEveryNumber) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> sel = {0.5f, nan, 0.9f, 0.1f, nan, 0.7f, 0.7f};
    auto score = [&](int64_t e) { return sel[size_t(e)]; };
    auto one = [](int64_t) { return 1.0f; };
    std::vector<int32_t> ids(7);
    std::vector<float> w(7);
    backend::route_pick(score, one, 7, 5, true, 2.0f, ids.data(), w.data());
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 5),
              (std::vector<int32_t>{2, 5, 6, 0, 3}));
    EXPECT_FLOAT_EQ(w[0], 2.0f / 5.0f);
    backend::route_pick(score, one, 7, 7, false, 1.0f, ids.data(), w.data());
    EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, 6, 0, 3, 1, 4}));  // then the NaNs, in order

    // Through the CPU backend's router: the experts whose bias is NaN are never picked.
    auto be = backend::make_cpu_backend({1});
    const int64_t E = 4, X = 6, T = 3;
    std::vector<float> router(size_t(E * X)), x(size_t(T * E)), bias(size_t(X), 0.0f);
    for (size_t i = 0; i < router.size(); ++i) router[i] = float(int(i * 7 % 11) - 5) * 0.1f;
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 5 % 9) - 4) * 0.2f;
    bias[0] = bias[3] = nan;
    backend::MoeRouter r;
    r.router = test::f32_matrix(router, E, X);
    r.bias = bias.data();
    r.n_used = 4;
    std::vector<int32_t> picked(size_t(T * 4));
    std::vector<float> weights(size_t(T * 4));
    test::moe_ops(*be).moe_route(r, backend::cpu::dev(x.data()), T,
                                 backend::cpu::dev(picked.data()),
                                 backend::cpu::dev(weights.data()));
    for (int32_t id : picked) EXPECT_TRUE(id != 0 && id != 3) << id;
    for (float v : weights) EXPECT_TRUE(std::isfinite(v)) << v;
}

// The backend contract's rules that hold whatever the backend: a handle says which
// backend owns it, another backend refuses it instead of misreading it, and values
// cross between backends only by an explicit copy.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cpu_memory.h"
#include "core/error.h"

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

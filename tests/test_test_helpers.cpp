// The test helpers themselves: a float comparison must fail on NaN.
#include <cmath>
#include <limits>

#include "util_model.h"

namespace {

TEST(TestHelpers, MaxAbsDiffTreatsNaNAsInfinitelyFar) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> want = {1.0f, 2.0f, 3.0f};
    const float same[] = {1.0f, 2.0f, 3.0f};
    const float off[] = {1.0f, 2.5f, 3.0f};
    const float nan_mid[] = {1.0f, nan, 3.0f};
    const float nan_last[] = {1.5f, 2.0f, nan};
    EXPECT_EQ(glm5::test::max_abs_diff(same, want), 0.0);
    EXPECT_EQ(glm5::test::max_abs_diff(off, want), 0.5);
    EXPECT_TRUE(std::isinf(glm5::test::max_abs_diff(nan_mid, want)));
    EXPECT_TRUE(std::isinf(glm5::test::max_abs_diff(nan_last, want)));
    // A NaN in the reference counts the same.
    const std::vector<float> nan_want = {nan, 2.0f, 3.0f};
    EXPECT_FALSE(glm5::test::max_abs_diff(same, nan_want) <= 1e30);
}

}  // namespace

// quant/groups.h, the per-group decoding a GPU's products are written in, checked on
// the host against each format's reference dequantizer: every weight format of a GLM
// GGUF, on quantized rows and on random bytes (every bit pattern a file may hold), bit
// for bit. And the row product's host form (the device kernel's order) against a
// double-precision dot of the dequantized row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/groups.h"
#include "quant_test_util.h"

namespace glm5 {
namespace {

using quant::Type;
namespace groups = quant::groups;

class Groups : public ::testing::TestWithParam<Type> {};

// Same bits, or both NaN (random bytes make NaN scales, whose payloads need not agree).
void expect_same_values(const std::vector<float>& want, const std::vector<float>& got,
                        const char* what) {
    ASSERT_EQ(want.size(), got.size());
    int bad = 0;
    for (size_t i = 0; i < want.size() && bad < 5; ++i) {
        if (std::isnan(want[i]) && std::isnan(got[i])) continue;
        if (std::memcmp(&want[i], &got[i], 4) != 0) {
            ADD_FAILURE() << what << ": value " << i << " is " << got[i] << ", the reference "
                          << want[i];
            ++bad;
        }
    }
}

std::vector<float> decode_row(Type t, const std::vector<uint8_t>& row, int64_t n) {
    const groups::Tables tab = groups::host_tables();
    std::vector<float> out(size_t(n), -1.f);
    for (int64_t g = 0; g < n / 32; ++g)
        EXPECT_TRUE(groups::decode_group(t, row.data(), g, tab, out.data() + 32 * g));
    return out;
}

TEST_P(Groups, DecodeQuantizedRowsAsTheReference) {
    const Type t = GetParam();
    ASSERT_TRUE(groups::has_groups(t));
    const int64_t n = 1024;
    const std::vector<float> x = test::varied_floats(size_t(n), 7);
    const std::vector<float> imatrix(size_t(n), 1.f);
    const std::vector<uint8_t> q = test::quantize(t, x, 1, imatrix.data());
    expect_same_values(test::dequantize(t, q, n), decode_row(t, q, n), "quantized row");
}

TEST_P(Groups, DecodeRandomBytesAsTheReference) {
    const Type t = GetParam();
    const int64_t n = 2048;
    std::vector<uint8_t> q(quant::row_size(t, n));
    std::mt19937 rng(11u + uint32_t(t));
    for (auto& b : q) b = uint8_t(rng());
    expect_same_values(test::dequantize(t, q, n), decode_row(t, q, n), "random bytes");
}

TEST_P(Groups, RowDotIsTheDotOfTheDequantizedRow) {
    const Type t = GetParam();
    // 40 groups: lanes 0..7 sum two groups each, the rest one.
    const int64_t n = 32 * 40;
    const std::vector<float> w = test::varied_floats(size_t(n), 3);
    const std::vector<float> imatrix(size_t(n), 1.f);
    const std::vector<uint8_t> q = test::quantize(t, w, 1, imatrix.data());
    const std::vector<float> deq = test::dequantize(t, q, n);
    const std::vector<float> x = test::normal_floats(size_t(n), 5);
    double want = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
        want += double(deq[size_t(i)]) * x[size_t(i)];
        scale += std::fabs(double(deq[size_t(i)]) * x[size_t(i)]);
    }
    float got = 0;
    ASSERT_TRUE(groups::row_dot(t, q.data(), n, x.data(), groups::host_tables(), &got));
    // Float sums of n products: a few units of float rounding of the magnitudes.
    EXPECT_LE(std::fabs(double(got) - want), 1e-6 * scale + 1e-30) << got << " vs " << want;
}

INSTANTIATE_TEST_SUITE_P(AllWeightFormats, Groups, ::testing::ValuesIn(test::kGroupTypes),
                         [](const auto& info) { return std::string(quant::name(info.param)); });

TEST(Groups, TypesWithoutGroupsAreRefused) {
    float y[32];
    const uint8_t row[512] = {};
    for (Type t : {Type::Q8_K, Type::Q8_1, Type::I32, Type::F64}) {
        EXPECT_FALSE(groups::has_groups(t)) << quant::name(t);
        EXPECT_FALSE(groups::decode_group(t, row, 0, groups::host_tables(), y)) << quant::name(t);
    }
}

// The butterfly of row_dot is the device's warp sum: every lane ends with the same
// value, so the order is one fixed tree. Checked here on sums whose order shows (a
// large value and small ones): the result is the tree's, not a left-to-right sum's.
TEST(Groups, RowDotSumsLanesInTheButterflyOrder) {
    const int64_t n = 32 * 32;  // one group per lane
    std::vector<float> w(size_t(n), 0.f), x(size_t(n), 1.f);
    // Lane l's sum is w's first value of its group (the rest are zero).
    const float lane_value[4] = {1e8f, 3.f, -1e8f, 5.f};
    for (int l = 0; l < 32; ++l) w[size_t(32 * l)] = lane_value[l % 4];
    float got = 0;
    ASSERT_TRUE(groups::row_dot(Type::F32, reinterpret_cast<const uint8_t*>(w.data()), n, x.data(),
                                groups::host_tables(), &got));
    // Butterfly: offsets 16, 8, 4 pair lanes of equal value (l and l ^ 4k share l % 4),
    // doubling each exactly: 8 * v; then offset 2 adds 8e8 + -8e8 = 0 and 24 + 40 = 64,
    // offset 1 gives 64. A left-to-right sum loses the small values: 1e8 + 3 = 1e8.
    EXPECT_EQ(got, 64.f);
}

}  // namespace
}  // namespace glm5

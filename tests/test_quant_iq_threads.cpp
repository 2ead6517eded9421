// Quantizing i-quant rows from several threads: the lattice tables are built
// on first use (once per grid, under std::call_once) and the quantizers keep
// all other state on the stack, so concurrent calls - including the very first
// ones of the process, which race to build the tables - give the same bytes as
// one thread. This is its own test binary so that the first use really is
// concurrent.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "iq_test_util.h"
#include "quant/quant.h"

namespace {

using namespace glm5::quant;

constexpr int64_t kN = 512;
constexpr int kThreads = 6;
constexpr int64_t kRowsPerThread = 2;

TEST(IQuantThreads, ConcurrentFirstUseMatchesSingleThread) {
    const std::vector<Type>& types = iqtest::iquant_types();
    const int64_t rows = kThreads * kRowsPerThread;
    std::vector<float> x(rows * kN), im(kN);
    std::mt19937 rng(99);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    for (auto& v : im) v = std::exp(nd(rng));

    // Every thread quantizes its own rows in every format, starting together.
    std::vector<std::vector<std::vector<uint8_t>>> out(types.size(),
                                                       std::vector<std::vector<uint8_t>>(rows));
    std::vector<std::thread> pool;
    for (int th = 0; th < kThreads; ++th) {
        pool.emplace_back([&, th] {
            for (size_t ti = 0; ti < types.size(); ++ti) {
                const Type t =
                    types[(ti + th) % types.size()];  // different first formats per thread
                const size_t k = (ti + th) % types.size();
                for (int64_t r = th * kRowsPerThread; r < (th + 1) * kRowsPerThread; ++r) {
                    out[k][r].resize(row_size(t, kN));
                    quantize_rows(t, x.data() + r * kN, out[k][r].data(), 1, kN, im.data());
                }
            }
        });
    }
    for (auto& th : pool) th.join();

    for (size_t k = 0; k < types.size(); ++k) {
        std::vector<uint8_t> all(row_size(types[k], kN) * rows);
        quantize_rows(types[k], x.data(), all.data(), rows, kN, im.data());
        for (int64_t r = 0; r < rows; ++r) {
            const std::vector<uint8_t> one(all.begin() + r * row_size(types[k], kN),
                                           all.begin() + (r + 1) * row_size(types[k], kN));
            EXPECT_EQ(out[k][r], one) << name(types[k]) << " row " << r;
        }
    }
}

}  // namespace

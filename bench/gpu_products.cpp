// The GPU's matrix products against the hardware limit (run by scripts/device-check.sh
// on a GPU machine): the vector form's weight bytes per second over a device-to-device
// copy's bytes per second (read plus written), at 1, 8, 32 and 512 tokens. Weights are
// random bytes (every bit pattern decodes; speed does not depend on the values) in four
// matrices used in turn, together several times the L2, so the products read device
// memory, not the cache.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "core/error.h"
#include "quant/types.h"

namespace {

using glm5::quant::Type;
namespace cuda = glm5::backend::cuda;

double seconds_per(cuda::Device& dev, int reps, const auto& op) {
    op(0);  // warm-up
    dev.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) op(i);
    dev.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        cuda::Device dev(argc > 1 ? std::stoi(argv[1]) : 0);
        const cuda::DeviceInfo& info = dev.info();
        // The copy's ceiling: 1 GiB each way, counted read plus written.
        const size_t copy_bytes = size_t(1) << 30;
        void* a = dev.alloc(copy_bytes, "the copy's source");
        void* b = dev.alloc(copy_bytes, "the copy's destination");
        const double t_copy = seconds_per(dev, 20, [&](int) { dev.copy(b, a, copy_bytes); });
        const double copy_bw = 2.0 * double(copy_bytes) / t_copy;
        dev.free(a);
        dev.free(b);
        std::printf("GPU products on %s (sm_%d%d): device copy %.2f TB/s (read + written)\n",
                    info.name.c_str(), info.cc_major, info.cc_minor, copy_bw / 1e12);
        std::printf("%-8s %-14s %6s %-7s %10s %12s %9s\n", "type", "rows x cols", "tokens", "form",
                    "time", "rate", "of copy");

        const int64_t rows = 16384, cols = 6144;
        std::mt19937_64 rng(1);
        for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::IQ2_XXS, Type::IQ4_XS, Type::Q2_K,
                       Type::BF16}) {
            const size_t row_bytes = glm5::quant::row_size(t, cols);
            std::vector<uint8_t> host(row_bytes * size_t(rows));
            for (size_t i = 0; i + 8 <= host.size(); i += 8) {
                const uint64_t v = rng();
                std::memcpy(&host[i], &v, 8);
            }
            glm5::backend::Weight w;
            w.type = t;
            w.cols = cols;
            w.rows = rows;
            w.row_bytes = row_bytes;
            w.slice_bytes = host.size();
            w.data = host.data();
            std::vector<cuda::Matrix> mats;
            for (int i = 0; i < 4; ++i) mats.push_back(dev.upload_matrix(w, "bench weight"));
            const int64_t max_tok = 512;
            auto* x = static_cast<float*>(dev.alloc(size_t(max_tok * cols) * 4, "tokens"));
            auto* y = static_cast<float*>(dev.alloc(size_t(max_tok * rows) * 4, "outputs"));
            std::vector<float> hx(size_t(max_tok * cols));
            std::normal_distribution<float> nd;
            for (auto& v : hx) v = nd(rng);
            dev.upload(x, hx.data(), hx.size() * 4);
            const std::string shape = std::to_string(rows) + " x " + std::to_string(cols);
            for (int64_t n_tok : {int64_t(1), int64_t(8), int64_t(32), max_tok}) {
                const double s = seconds_per(dev, 50, [&](int i) {
                    dev.matmul(mats[size_t(i % 4)], 0, x, cols, n_tok, y, rows);
                });
                const double bw = double(host.size()) / s;
                std::printf("%-8s %-14s %6lld %-7s %8.1f us %7.0f GB/s %9.2f\n",
                            glm5::quant::name(t), shape.c_str(), (long long)n_tok, "vector",
                            s * 1e6, bw / 1e9, bw / copy_bw);
            }
            for (auto& m : mats) dev.free_matrix(m);
            dev.free(x);
            dev.free(y);
        }
        return 0;
    } catch (const glm5::Error& e) {
        std::fprintf(stderr, "gpu_products: %s\n", e.what());
        return 1;
    }
}

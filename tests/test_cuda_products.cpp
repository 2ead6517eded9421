// The GPU's matrix products (label `gpu`: scripts/device-check.sh runs these on a GPU
// machine; a machine without a device fails them, it does not skip them). Every weight
// format of a GLM GGUF:
// - the vector form gives quant::groups::row_dot's bits for every token, whatever the
//   token count (1, 5, 32 and 40 tokens, the last rows of a block, slice 1 of 2);
// - the products against the CPU backend's, the error normalised by the output's RMS
//   (the CPU rounds activations to the format's Q8 partner);
// - float matrices of any width (a last group of fewer than 32 columns);
// - a matrix that does not fit is refused with the numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "backend/cuda/cuda_device.h"
#include "core/error.h"
#include "quant/groups.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace glm5 {
namespace {

using quant::Type;
namespace cuda = backend::cuda;
namespace groups = quant::groups;

cuda::Device& device() {
    // Never destroyed: tearing cuBLAS down after the CUDA runtime's own exit handlers
    // can crash a binary whose tests all passed.
    static cuda::Device* dev = nullptr;
    if (!dev) {
        std::string why;
        if (cuda::list_devices(&why).empty())
            throw Error("a gpu test found no CUDA device (" + why + "): run it on a GPU machine");
        dev = new cuda::Device(0);
    }
    return *dev;
}

// Device memory freed with the test.
struct DeviceFloats {
    explicit DeviceFloats(size_t n) : n(n) {
        p = static_cast<float*>(device().alloc(n * sizeof(float), "test rows"));
    }
    ~DeviceFloats() { device().free(p); }
    std::vector<float> read() {
        std::vector<float> h(n);
        device().download(h.data(), p, n * sizeof(float));
        device().synchronize();
        return h;
    }
    float* p;
    size_t n;
};

struct Problem {
    int64_t cols = 32 * 40, rows = 67, slices = 2;
    std::vector<uint8_t> bytes;  // slices * rows rows
    backend::Weight view;
};

Problem make_problem(Type t) {
    Problem pr;
    const int64_t n_rows = pr.rows * pr.slices;
    const std::vector<float> w = test::varied_floats(size_t(n_rows * pr.cols), 21);
    const std::vector<float> imatrix(size_t(pr.cols), 1.f);
    pr.bytes = test::quantize(t, w, n_rows, imatrix.data());
    pr.view.type = t;
    pr.view.cols = pr.cols;
    pr.view.rows = pr.rows;
    pr.view.slices = pr.slices;
    pr.view.row_bytes = quant::row_size(t, pr.cols);
    pr.view.slice_bytes = pr.view.row_bytes * size_t(pr.rows);
    pr.view.data = pr.bytes.data();
    return pr;
}

class CudaProducts : public ::testing::TestWithParam<Type> {};

TEST_P(CudaProducts, VectorFormIsRowDotBitForBitAtEveryTokenCount) {
    const Type t = GetParam();
    Problem pr = make_problem(t);
    cuda::Device& dev = device();
    cuda::Matrix m = dev.upload_matrix(pr.view, "test weight");
    const int64_t x_stride = pr.cols + 32, y_stride = pr.rows + 3;
    const groups::Tables tab = groups::host_tables();
    for (int64_t n_tok : {1, 5, 32, 40}) {
        const std::vector<float> x = test::normal_floats(size_t(n_tok * x_stride), 9);
        DeviceFloats dx(x.size()), dy(size_t(n_tok * y_stride));
        dev.upload(dx.p, x.data(), x.size() * sizeof(float));
        dev.matmul(m, 1, dx.p, x_stride, n_tok, dy.p, y_stride);
        const std::vector<float> y = dy.read();
        int bad = 0;
        for (int64_t tok = 0; tok < n_tok && bad < 5; ++tok)
            for (int64_t r = 0; r < pr.rows && bad < 5; ++r) {
                float want = 0;
                ASSERT_TRUE(groups::row_dot(t, pr.view.row(r, 1), pr.cols,
                                            x.data() + tok * x_stride, tab, &want));
                const float got = y[size_t(tok * y_stride + r)];
                if (std::memcmp(&want, &got, 4) != 0) {
                    ADD_FAILURE() << n_tok << " tokens, token " << tok << ", row " << r << ": "
                                  << got << ", row_dot " << want;
                    ++bad;
                }
            }
    }
    dev.free_matrix(m);
}

// The CPU backend's product of the same rows, and the largest difference over the RMS
// of its outputs.
double normalised_error(Type t, const Problem& pr, const std::vector<float>& x, int64_t n_tok,
                        const std::vector<float>& got) {
    auto cpu = backend::make_cpu_backend({});
    backend::Weight w0 = pr.view;
    w0.slices = 1;
    const auto dx = cpu->scratch(x.size());
    const auto dy = cpu->scratch(size_t(n_tok * pr.rows));
    cpu->write(dx, x.data(), x.size());
    cpu->matmul(w0, dx, pr.cols, n_tok, dy, pr.rows);
    std::vector<float> want(size_t(n_tok * pr.rows));
    cpu->read(dy, want.data(), want.size());
    double sq = 0, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        sq += double(want[i]) * want[i];
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    }
    return worst / std::sqrt(sq / double(want.size()));
}

// max |got - row_dot| over the RMS of row_dot's outputs (the host form, F32 tokens).
double error_to_row_dot(Type t, const Problem& pr, const std::vector<float>& x, int64_t n_tok,
                        const std::vector<float>& got) {
    const groups::Tables tab = groups::host_tables();
    double sq = 0, worst = 0;
    for (int64_t tok = 0; tok < n_tok; ++tok)
        for (int64_t r = 0; r < pr.rows; ++r) {
            float want = 0;
            groups::row_dot(t, pr.view.row(r, 0), pr.cols, x.data() + tok * pr.cols, tab, &want);
            sq += double(want) * want;
            worst = std::max(worst, std::fabs(double(got[size_t(tok * pr.rows + r)]) - want));
        }
    return worst / std::sqrt(sq / double(n_tok * pr.rows));
}

TEST_P(CudaProducts, AgreeWithTheCpuBackend) {
    const Type t = GetParam();
    Problem pr = make_problem(t);
    cuda::Device& dev = device();
    cuda::Matrix m = dev.upload_matrix(pr.view, "test weight");
    for (int64_t n_tok : {3, 32, 100}) {
        const std::vector<float> x = test::normal_floats(size_t(n_tok * pr.cols), 4);
        DeviceFloats dx(x.size()), dv(size_t(n_tok * pr.rows));
        dev.upload(dx.p, x.data(), x.size() * sizeof(float));
        dev.matmul(m, 0, dx.p, pr.cols, n_tok, dv.p, pr.rows);
        const std::vector<float> v = dv.read();
        EXPECT_EQ(error_to_row_dot(t, pr, x, n_tok, v), 0.0) << n_tok << " tokens";
        // The CPU backend rounds the tokens to 8 bits per value for the quantized formats
        // (worst of thousands of outputs: a few percent of the RMS); a decoding mistake is
        // of the RMS's order.
        EXPECT_LT(normalised_error(t, pr, x, n_tok, v), 0.08) << n_tok << " tokens";
    }
    dev.free_matrix(m);
}

INSTANTIATE_TEST_SUITE_P(AllWeightFormats, CudaProducts, ::testing::ValuesIn(test::kGroupTypes),
                         [](const auto& info) { return std::string(quant::name(info.param)); });

// Float rows of any length (GLM-5.3-Flash has 16-column tensors): the last group holds
// what is left, and nothing past a row is read (the simulator's AddressSanitizer pass
// watches the end of the upload).
TEST(CudaDevice, FloatMatricesOfAnyWidthMultiply) {
    cuda::Device& dev = device();
    const groups::Tables tab = groups::host_tables();
    for (Type t : {Type::F32, Type::F16, Type::BF16})
        for (int64_t cols : {16, 53, 96}) {
            const int64_t rows = 5, n_tok = 3;
            const std::vector<float> w = test::normal_floats(size_t(rows * cols), 41);
            const std::vector<uint8_t> bytes = test::quantize(t, w, rows, nullptr);
            backend::Weight v;
            v.type = t;
            v.cols = cols;
            v.rows = rows;
            v.row_bytes = quant::row_size(t, cols);
            v.slice_bytes = v.row_bytes * size_t(rows);
            v.data = bytes.data();
            cuda::Matrix m = dev.upload_matrix(v, "narrow");
            const std::vector<float> x = test::normal_floats(size_t(n_tok * cols), 42);
            DeviceFloats dx(x.size()), dy(size_t(n_tok * rows));
            dev.upload(dx.p, x.data(), x.size() * sizeof(float));
            dev.matmul(m, 0, dx.p, cols, n_tok, dy.p, rows);
            const std::vector<float> y = dy.read();
            for (int64_t tok = 0; tok < n_tok; ++tok)
                for (int64_t r = 0; r < rows; ++r) {
                    float want = 0;
                    ASSERT_TRUE(
                        groups::row_dot(t, v.row(r), cols, x.data() + tok * cols, tab, &want));
                    std::vector<float> wr(static_cast<size_t>(cols));
                    quant::dequantize_row(t, v.row(r), wr.data(), cols);
                    double exact = 0;
                    for (int64_t c = 0; c < cols; ++c)
                        exact += double(wr[size_t(c)]) * x[size_t(tok * cols + c)];
                    EXPECT_EQ(y[size_t(tok * rows + r)], want) << quant::name(t) << " " << cols;
                    EXPECT_NEAR(want, exact, 1e-4 * (1 + std::fabs(exact)))
                        << quant::name(t) << " " << cols;
                }
            dev.free_matrix(m);
        }
}

// Copies pass through a ring of pinned memory: many of them, around the ring several times,
// interleaved, each download delivered by synchronize() and none overwritten by a later
// upload before then; copies larger than half the ring go from pageable memory.
TEST(CudaDevice, StagedCopiesKeepTheirBytes) {
    cuda::Device& dev = device();
    const size_t n = size_t(3) << 18;  // 3 MiB of floats a copy: the 16 MiB ring wraps often
    std::vector<std::vector<float>> back(12, std::vector<float>(n));
    DeviceFloats d(n * 12);
    for (size_t i = 0; i < 12; ++i) {
        const std::vector<float> h = test::normal_floats(n, uint32_t(60 + i));
        dev.upload(d.p + i * n, h.data(), n * sizeof(float));
        if (i >= 2) dev.download(back[i - 2].data(), d.p + (i - 2) * n, n * sizeof(float));
    }
    dev.download(back[10].data(), d.p + 10 * n, n * sizeof(float));
    dev.download(back[11].data(), d.p + 11 * n, n * sizeof(float));
    dev.synchronize();
    for (size_t i = 0; i < 12; ++i)
        EXPECT_EQ(back[i], test::normal_floats(n, uint32_t(60 + i))) << "copy " << i;
    // Over half the ring: the pageable path.
    const std::vector<float> big = test::normal_floats(size_t(3) << 20, 72);
    DeviceFloats db(big.size());
    dev.upload(db.p, big.data(), big.size() * sizeof(float));
    EXPECT_EQ(db.read(), big);
}

TEST(CudaDevice, MemoryThatDoesNotFitIsRefusedWithTheNumbers) {
    cuda::Device& dev = device();
    const uint64_t too_much = dev.info().total_bytes * 2;
    try {
        dev.alloc(size_t(too_much), "an impossible cache");
        FAIL() << "allocated twice the device's memory";
    } catch (const ResourceError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("an impossible cache"), std::string::npos) << msg;
        EXPECT_NE(msg.find("free"), std::string::npos) << msg;
    }
    // The device still works after the refusal.
    DeviceFloats ok(16);
    EXPECT_EQ(ok.read().size(), 16u);
}

TEST(CudaDevice, RepackedOrUnknownWeightsAreRefused) {
    cuda::Device& dev = device();  // outside the EXPECT_THROWs: no device is a failure
    backend::Weight w;
    w.type = Type::Q8_K;
    w.cols = 256;
    w.rows = 1;
    std::vector<uint8_t> bytes(quant::row_size(Type::Q8_K, 256));
    w.data = bytes.data();
    w.row_bytes = w.slice_bytes = bytes.size();
    EXPECT_THROW(dev.upload_matrix(w, "q8k"), Error);
    w.type = Type::Q4_K;
    w.repacked = true;
    EXPECT_THROW(dev.upload_matrix(w, "repacked"), Error);
}

}  // namespace
}  // namespace glm5

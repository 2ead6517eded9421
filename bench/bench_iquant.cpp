// i-quant micro-benchmarks: dot-product throughput per ISA in GB/s of weight
// bytes (one core), and quantization throughput.
//
//   vec_dot/<TYPE>/<isa>/l2   : rows cycling through a 1 MiB matrix (cache-resident:
//                               the kernel's compute limit)
//   vec_dot/<TYPE>/<isa>/dram : rows streamed from a 512 MiB matrix (what decode sees)
//   quantize/<TYPE>[/fast][/imatrix] : float rows in, output bytes per second
//                               (fast: quantize_rows_fast)
//
// Prints throughput only; there is no pass/fail.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/ops.h"
#include "quant/quant.h"
#include "quant/quantize_fast.h"

namespace {

using namespace glm5::quant;

constexpr int64_t kRow = 4096;  // values per row

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto& b : v) b = uint8_t(rng());
    return v;
}

// A weight matrix of `bytes` (rounded to whole rows): random blocks with
// finite fp16 scales (made by quantizing a few random rows and repeating them).
std::vector<uint8_t> weight_matrix(Type t, size_t bytes) {
    const size_t rb = row_size(t, kRow);
    const size_t rows = std::max<size_t>(1, bytes / rb);
    const int64_t distinct = 64;
    std::vector<float> x(distinct * kRow);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& v : x) v = nd(rng);
    std::vector<uint8_t> base(distinct * rb);
    quantize_rows(t, x.data(), base.data(), distinct, kRow, nullptr);
    std::vector<uint8_t> m(rows * rb);
    for (size_t r = 0; r < rows; ++r)
        std::memcpy(m.data() + r * rb, base.data() + (r % distinct) * rb, rb);
    return m;
}

// An activation row: random 8-bit values in [-127, 127] with sane scales and
// consistent block sums, in the type's vec_dot layout.
std::vector<uint8_t> activation_row(Type t) {
    const Type at = traits(t).vec_dot_type;
    std::vector<uint8_t> a = random_bytes(row_size(at, kRow), 2);
    if (at == Type::Q8_0) {
        auto* b = reinterpret_cast<BlockQ8_0*>(a.data());
        for (int64_t i = 0; i < kRow / 32; ++i) {
            b[i].d = 0x2000;  // ~0.0078
            for (auto& q : b[i].qs) q = q == -128 ? -127 : q;
        }
    } else {
        auto* b = reinterpret_cast<BlockQ8_K*>(a.data());
        for (int64_t i = 0; i < kRow / 256; ++i) {
            b[i].d = 0.01f;
            for (auto& q : b[i].qs) q = q == -128 ? -127 : q;
            for (int j = 0; j < 16; ++j) {
                int s = 0;
                for (int k = 0; k < 16; ++k) s += b[i].qs[16 * j + k];
                b[i].bsums[j] = int16_t(s);
            }
        }
    }
    return a;
}

void bm_vec_dot(benchmark::State& st, Type t, VecDotFn fn, size_t matrix_bytes) {
    const std::vector<uint8_t> w = weight_matrix(t, matrix_bytes);
    const std::vector<uint8_t> a = activation_row(t);
    const size_t rb = row_size(t, kRow);
    const size_t rows = w.size() / rb;
    size_t r = 0;
    float sink = 0;
    for (auto _ : st) {
        sink += fn(kRow, w.data() + r * rb, a.data());
        if (++r == rows) r = 0;
    }
    benchmark::DoNotOptimize(sink);
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(rb));
}

void bm_quantize(benchmark::State& st, Type t, bool imatrix, bool fast) {
    const int64_t rows = 8;
    std::vector<float> x(rows * kRow), im(kRow, 1.0f);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& v : x) v = nd(rng);
    for (auto& v : im) v = std::exp(nd(rng) * 50.f);
    std::vector<uint8_t> y(rows * row_size(t, kRow));
    const auto fn = fast ? quantize_rows_fast : quantize_rows;
    fn(t, x.data(), y.data(), 1, kRow, imatrix ? im.data() : nullptr);  // lattice setup
    for (auto _ : st) {
        fn(t, x.data(), y.data(), rows, kRow, imatrix ? im.data() : nullptr);
        benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(y.size()));
    st.counters["Mweights/s"] = benchmark::Counter(
        double(rows * kRow) * double(st.iterations()) / 1e6, benchmark::Counter::kIsRate);
}

int register_all() {
    const Type dot_types[] = {Type::IQ2_XXS, Type::IQ4_XS, Type::IQ4_NL, Type::IQ2_XS, Type::IQ2_S,
                              Type::IQ3_XXS, Type::IQ3_S,  Type::IQ1_S,  Type::IQ1_M};
    for (Type t : dot_types) {
        const FormatOps* ops = iquant_ops(t);
        struct Isa {
            const char* name;
            VecDotFn fn;
            bool ok;
        } isas[] = {{"ref", ops->vec_dot_ref, true},
                    {"avx2", ops->vec_dot_avx2, cpu_has_avx2()},
                    {"avx512", ops->vec_dot_avx512, cpu_has_avx512()}};
        for (const Isa& isa : isas) {
            if (!isa.fn || !isa.ok) continue;
            for (auto [where, bytes] :
                 {std::pair{"l2", size_t(1) << 20}, std::pair{"dram", size_t(512) << 20}}) {
                const std::string nm =
                    std::string("vec_dot/") + name(t) + "/" + isa.name + "/" + where;
                benchmark::RegisterBenchmark(nm.c_str(), bm_vec_dot, t, isa.fn, bytes);
            }
        }
    }
    for (Type t : {Type::IQ2_XXS, Type::IQ4_XS, Type::IQ4_NL}) {
        const std::string base = std::string("quantize/") + name(t);
        benchmark::RegisterBenchmark(base.c_str(), bm_quantize, t, false, false);
        benchmark::RegisterBenchmark((base + "/imatrix").c_str(), bm_quantize, t, true, false);
        if (has_fast_quantize(t)) {
            benchmark::RegisterBenchmark((base + "/fast").c_str(), bm_quantize, t, false, true);
            benchmark::RegisterBenchmark((base + "/fast/imatrix").c_str(), bm_quantize, t, true,
                                         true);
        }
    }
    return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();

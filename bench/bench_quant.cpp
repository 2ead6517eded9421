// Micro-benchmarks of the quantization formats:
//  - dot products (one weight row against one activation row, all rows of a
//    matrix in turn) per format and ISA, as GB/s of weight bytes: "cached" uses
//    a 2 MiB matrix (compute bound), "stream" a 256 MiB one (memory bound);
//  - quantize_rows throughput (Q4_K with and without an importance matrix, and
//    the other weight formats), as weights per second.
// Single-threaded: numbers are per core.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/ops.h"
#include "quant/quant.h"

using namespace glm5::quant;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

const FormatOps& ops_of(Type t) {
    const FormatOps* o = float_ops(t);
    if (!o) o = legacy_ops(t);
    if (!o) o = kquant_ops(t);
    return *o;
}

// isa: 0 = scalar reference, 1 = AVX2, 2 = AVX-512.
void BM_VecDot(benchmark::State& state, Type t, int isa, size_t matrix_bytes) {
    const FormatOps& o = ops_of(t);
    VecDotFn fn = isa == 0 ? o.vec_dot_ref : isa == 1 ? o.vec_dot_avx2 : o.vec_dot_avx512;
    if (!fn || (isa == 1 && !cpu_has_avx2()) || (isa == 2 && !cpu_has_avx512())) {
        state.SkipWithError("not available on this CPU");
        return;
    }
    const int64_t n = 4096;
    const size_t rb = row_size(t, n);
    const int64_t rows = int64_t(matrix_bytes / rb);
    // Quantize one row of real data and repeat it (quantizing 256 MiB would
    // dominate the benchmark's setup time); the dot does not care.
    std::vector<uint8_t> w(rb * size_t(rows));
    quantize_rows(t, random_floats(size_t(n), 1).data(), w.data(), 1, n, nullptr);
    for (int64_t r = 1; r < rows; ++r) std::memcpy(w.data() + rb * size_t(r), w.data(), rb);
    const Type act = traits(t).vec_dot_type;
    std::vector<uint8_t> a(row_size(act, n));
    quantize_activation_row(act, random_floats(size_t(n), 2).data(), a.data(), n);
    float sink = 0;
    for (auto _ : state) {
        for (int64_t r = 0; r < rows; ++r) sink += fn(n, w.data() + rb * size_t(r), a.data());
        benchmark::DoNotOptimize(sink);
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(rb) * rows);
}

void BM_Quantize(benchmark::State& state, Type t, bool imatrix) {
    const int64_t n = 4096, rows = traits(t).block_size == 256 ? 16 : 64;
    const std::vector<float> x = random_floats(size_t(n * rows), 3);
    std::vector<float> im = random_floats(size_t(n), 4);
    for (auto& v : im) v = v * v + 0.1f;
    std::vector<uint8_t> out(row_size(t, n) * size_t(rows));
    for (auto _ : state) {
        quantize_rows(t, x.data(), out.data(), rows, n, imatrix ? im.data() : nullptr);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * n * rows);
}

void BM_Activation(benchmark::State& state, Type act) {
    const int64_t n = 6144;
    const std::vector<float> x = random_floats(size_t(n), 5);
    std::vector<uint8_t> out(row_size(act, n));
    for (auto _ : state) {
        quantize_activation_row(act, x.data(), out.data(), n);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(int64_t(state.iterations()) * n);
}

const Type kWeightTypes[] = {Type::F32,  Type::F16,  Type::BF16, Type::Q4_0, Type::Q4_1,
                             Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::Q2_K, Type::Q3_K,
                             Type::Q4_K, Type::Q5_K, Type::Q6_K};

int register_all() {
    const char* isa_names[] = {"ref", "avx2", "avx512"};
    for (Type t : kWeightTypes)
        for (int isa = 0; isa < 3; ++isa) {
            const std::string base = std::string("dot/") + name(t) + "/" + isa_names[isa];
            benchmark::RegisterBenchmark((base + "/cached").c_str(), BM_VecDot, t, isa,
                                         size_t(2) << 20);
            if (isa > 0)
                benchmark::RegisterBenchmark((base + "/stream").c_str(), BM_VecDot, t, isa,
                                             size_t(256) << 20);
        }
    benchmark::RegisterBenchmark("quantize/Q4_K", BM_Quantize, Type::Q4_K, false);
    benchmark::RegisterBenchmark("quantize/Q4_K/imatrix", BM_Quantize, Type::Q4_K, true);
    for (Type t : kWeightTypes)
        if (t != Type::Q4_K)
            benchmark::RegisterBenchmark((std::string("quantize/") + name(t)).c_str(), BM_Quantize,
                                         t, false);
    for (Type t : {Type::Q8_0, Type::Q8_1, Type::Q8_K, Type::F16})
        benchmark::RegisterBenchmark((std::string("activation/") + name(t)).c_str(), BM_Activation,
                                     t);
    return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();

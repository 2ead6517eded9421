// Matrix-product kernels, one thread, as GMAC/s (weight values x tokens per
// second): the ceiling each prefill/decode kernel can reach on this core.
//
//   gemm/<TYPE>/repack16/t<N>  : the repacked 16-row GEMM (repack.h), N tokens,
//                                a cache-resident matrix (N = 1 is decode's GEMV);
//                                at the amx level Q4_K / Q6_K from 16 / 32 tokens
//                                on the tile unit (GLM5_CPU=vnni: the VNNI kernels)
//   gemm/<TYPE>/multi/t<N>     : vec_dot_multi_fn (one row decoded once for up to
//                                8 tokens at a time, as the matmul calls it)
//   gemm/<TYPE>/single/t<N>    : vec_dot_fn per (row, token): the baseline
//   gemm/<TYPE>/<kernel>/stream/t1 : the GEMV over a 256 MiB matrix (memory bound)
//   gemm/Q4_K/repack16/pieces<R>/t1 : the same 256 MiB as R-row matrices called one
//                                after another (decode's experts: 768 rows), the cost
//                                of starting each matrix's stream
//   gemm/<TYPE>/repack16/stream/t<N> : N = 2, 4, 6, 8 tokens over the same matrix
//                                (batched decode: still one pass over DRAM); Q4_K
//                                and Q6_K also 64 and 256 tokens over a 64 MiB one
//                                (prefill's products)
//
// Shapes: rows of 2048 values (Q5_0 and IQ4_NL: 192, the attn_k_b rows), a
// 256-row matrix (Q5_0 t512: 512 rows, one attn_k_b head in prefill).
// Prints throughput only; there is no pass/fail.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "quant/ops.h"
#include "quant/quant.h"
#include "quant/repack.h"

namespace {

using namespace glm5::quant;

std::vector<float> random_floats(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

int64_t cols_of(Type t) {
    return (t == Type::Q5_0 || t == Type::IQ4_NL) ? 192 : 2048;
}

// rows x cols weights: a few quantized rows repeated (quantizing large
// matrices would dominate setup; the kernels do not care).
std::vector<uint8_t> weights(Type t, int64_t cols, int64_t rows) {
    const int64_t distinct = std::min<int64_t>(rows, 64);
    const size_t rb = row_size(t, cols);
    std::vector<uint8_t> w(rb * size_t(rows));
    quantize_rows(t, random_floats(size_t(cols * distinct), 1, 0.05f).data(), w.data(), distinct,
                  cols, nullptr);
    for (int64_t r = distinct; r < rows; ++r)
        std::memcpy(w.data() + rb * size_t(r), w.data() + rb * size_t(r % distinct), rb);
    return w;
}

std::vector<uint8_t> acts(Type t, int64_t cols, int64_t n_tok) {
    const Type at = traits(t).vec_dot_type;
    const size_t arow = row_size(at, cols);
    std::vector<uint8_t> a(arow * size_t(n_tok));
    for (int64_t i = 0; i < n_tok; ++i)
        quantize_activation_row(at, random_floats(size_t(cols), 7 + uint32_t(i)).data(),
                                a.data() + arow * size_t(i), cols);
    return a;
}

// Repacked weights live where the loader puts them (TensorSource::own): page
// aligned anonymous memory, huge pages where the kernel grants them. (A
// std::vector's 16-byte alignment would split every 64-byte load over two
// cache lines.)
class PageBuffer {
  public:
    explicit PageBuffer(size_t bytes) : n_((bytes + 4095) / 4096 * 4096) {
        void* p = ::mmap(nullptr, n_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        ::madvise(p, n_, MADV_HUGEPAGE);
        p_ = static_cast<uint8_t*>(p);
    }
    ~PageBuffer() { ::munmap(p_, n_); }
    PageBuffer(const PageBuffer&) = delete;
    PageBuffer& operator=(const PageBuffer&) = delete;
    uint8_t* data() const { return p_; }

  private:
    size_t n_;
    uint8_t* p_;
};

void set_rate(benchmark::State& state, int64_t macs_per_iter) {
    state.counters["GMAC/s"] = benchmark::Counter(double(macs_per_iter) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

enum class Kernel { Repack, Multi, Single };

void BM_Gemm(benchmark::State& state, Type t, Kernel k, int64_t n_tok, int64_t rows) {
    const int64_t cols = cols_of(t);
    if (k == Kernel::Repack && !repack_supported(t, cols)) {
        state.SkipWithError("no repacked kernel on this CPU");
        return;
    }
    const VecDotMultiFn multi = vec_dot_multi_fn(t);
    if (k == Kernel::Multi && !multi) {
        state.SkipWithError("no multi-activation kernel on this CPU");
        return;
    }
    const VecDotFn dot = vec_dot_fn(t);
    const auto w = weights(t, cols, rows);
    const auto a = acts(t, cols, n_tok);
    const size_t rb = row_size(t, cols), arow = row_size(traits(t).vec_dot_type, cols);
    PageBuffer packed(k == Kernel::Repack ? repacked_bytes(t, cols, rows) : 1);
    if (k == Kernel::Repack) repack(t, w.data(), packed.data(), cols, rows);
    std::vector<float> y(size_t(rows * n_tok));
    for (auto _ : state) {
        switch (k) {
            case Kernel::Repack:
                gemm_repacked(t, cols, packed.data(), rows / 16, a.data(), arow, n_tok, y.data(),
                              size_t(rows));
                break;
            case Kernel::Multi:
                for (int64_t t0 = 0; t0 < n_tok; t0 += 8) {
                    const int64_t nt = std::min<int64_t>(8, n_tok - t0);
                    float o[8];
                    for (int64_t r = 0; r < rows; ++r) {
                        multi(cols, w.data() + rb * size_t(r), a.data() + arow * size_t(t0), arow,
                              nt, o);
                        for (int64_t i = 0; i < nt; ++i) y[size_t((t0 + i) * rows + r)] = o[i];
                    }
                }
                break;
            case Kernel::Single:
                for (int64_t i = 0; i < n_tok; ++i)
                    for (int64_t r = 0; r < rows; ++r)
                        y[size_t(i * rows + r)] =
                            dot(cols, w.data() + rb * size_t(r), a.data() + arow * size_t(i));
                break;
        }
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    set_rate(state, rows * cols * n_tok);
}

// Decode's real shape: many small matrices one after another (an expert's
// 768 x 2048 projection), over the same 256 MiB as the stream tests: the
// cost of starting each matrix's stream cold.
void BM_Pieces(benchmark::State& state, Type t, int64_t piece_rows) {
    const int64_t cols = cols_of(t);
    if (!repack_supported(t, cols)) {
        state.SkipWithError("no repacked kernel on this CPU");
        return;
    }
    const int64_t big = (int64_t(256) << 20) / int64_t(row_size(t, cols)) / 16 * 16;
    const int64_t n_pieces = big / piece_rows;
    const auto w = weights(t, cols, piece_rows);
    const auto a = acts(t, cols, 1);
    const size_t arow = row_size(traits(t).vec_dot_type, cols);
    const size_t pb = repacked_bytes(t, cols, piece_rows);
    PageBuffer packed(pb * size_t(n_pieces));
    repack(t, w.data(), packed.data(), cols, piece_rows);
    for (int64_t i = 1; i < n_pieces; ++i)
        std::memcpy(packed.data() + pb * size_t(i), packed.data(), pb);
    std::vector<float> y(static_cast<size_t>(piece_rows));
    for (auto _ : state) {
        for (int64_t i = 0; i < n_pieces; ++i)
            gemm_repacked(t, cols, packed.data() + pb * size_t(i), piece_rows / 16, a.data(), arow,
                          1, y.data(), size_t(piece_rows));
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    set_rate(state, n_pieces * piece_rows * cols);
}

int register_all() {
    const char* kname[] = {"repack16", "multi", "single"};
    auto add = [&](Type t, Kernel k, int64_t n, int64_t rows, const char* suffix = "") {
        const std::string nm = std::string("gemm/") + name(t) + "/" + kname[int(k)] + suffix +
                               "/t" + std::to_string(n);
        benchmark::RegisterBenchmark(nm.c_str(), BM_Gemm, t, k, n, rows);
    };
    for (Type t : {Type::Q4_K, Type::Q6_K}) {
        for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 256})
            for (Kernel k : {Kernel::Repack, Kernel::Multi, Kernel::Single}) {
                if (k == Kernel::Multi && n == 1) continue;
                add(t, k, n, 256);
            }
    }
    for (Type t : {Type::Q5_0, Type::Q8_0, Type::IQ4_NL, Type::IQ2_XXS}) {
        const bool rp = t == Type::Q5_0 || t == Type::Q8_0;
        for (int64_t n : {1, 2, 4, 8, 16, 64})
            for (Kernel k : {Kernel::Repack, Kernel::Multi, Kernel::Single}) {
                if ((k == Kernel::Multi && n == 1) || (k == Kernel::Repack && !rp)) continue;
                if (n == 16 && !rp) continue;
                add(t, k, n, 256);
            }
        // attn_k_b's prefill: one head's 512 x 192 slice against 512 tokens.
        if (t == Type::Q5_0)
            for (Kernel k : {Kernel::Repack, Kernel::Single}) add(t, k, 512, 512);
    }
    // Decode against a matrix far larger than the caches: the GEMV, and the
    // small tiles of batched decode (2-8 sequences, or an expert's 1-4
    // tokens), which read the weights once per call too.
    for (Type t : {Type::Q4_K, Type::Q6_K, Type::Q8_0, Type::Q5_0}) {
        const int64_t big = (int64_t(256) << 20) / int64_t(row_size(t, cols_of(t))) / 16 * 16;
        for (Kernel k : {Kernel::Repack, Kernel::Single}) add(t, k, 1, big, "/stream");
        for (int64_t n : {2, 4, 6, 8}) add(t, Kernel::Repack, n, big, "/stream");
    }
    for (int64_t pr : {768, 2048})
        benchmark::RegisterBenchmark(
            ("gemm/Q4_K/repack16/pieces" + std::to_string(pr) + "/t1").c_str(), BM_Pieces,
            Type::Q4_K, pr);
    // Prefill's products over weights read from DRAM (an expert's ~64 tokens,
    // a dense matrix's 256 at a time): a 64 MiB matrix.
    for (Type t : {Type::Q4_K, Type::Q6_K}) {
        const int64_t big = (int64_t(64) << 20) / int64_t(row_size(t, cols_of(t))) / 16 * 16;
        for (int64_t n : {64, 256}) add(t, Kernel::Repack, n, big, "/stream");
    }
    return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();

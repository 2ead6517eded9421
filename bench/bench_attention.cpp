// The attention and indexer helpers of the CPU backend, one thread, at the
// shapes of one decode step deep in a context (GLM-5's per-head dims): MLA
// scores and output sums for 8 heads over 2048 selected latent rows, their
// softmax, and the lightning indexer's dot products for 8 heads over 256 keys.
// Each tiled helper is timed beside the row-at-a-time form it must match bit
// for bit (the row helpers it replaced), so the two figures come from one run.
// And the --attn-bf16 form of a whole query on AMX-BF16 tiles.
// Prints GFLOP/s (2 per multiply-add); there is no pass/fail.
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <span>
#include <vector>

#include "backend/cpu_attention_amx.h"
#include "backend/cpu_kernels.h"
#include "backend/cpu_simd.h"
#include "core/fp16.h"
#include "quant/quant.h"

namespace {

using namespace glm5;
using namespace glm5::backend::cpu;

constexpr int64_t kHeads = 8, kWidth = 576, kValue = 512, kRows = 2048;
constexpr int64_t kIdxHeads = 32, kIdxDim = 128, kKeys = 256;

std::vector<float> floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = round_fp16(d(rng));
    return v;
}

std::vector<uint16_t> halves(size_t n, uint32_t seed) {
    std::vector<uint16_t> h(n);
    const auto f = floats(n, seed);
    for (size_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(f[i]);
    return h;
}

void set_flops(benchmark::State& st, double macs) {
    st.counters["GFLOP/s"] = benchmark::Counter(
        2 * macs, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_scores(benchmark::State& st) {
    const auto q = floats(size_t(kHeads * kWidth), 1);
    const auto c = halves(size_t(kRows * kWidth), 2);
    const F16Rows rows{reinterpret_cast<const uint8_t*>(c.data()), size_t(kWidth) * 2, nullptr};
    std::vector<float> s(size_t(kHeads * kRows));
    const SimdOps& sv = simd();
    const bool tiled = st.range(0) != 0;
    for (auto _ : st) {
        if (tiled) {
            sv.scores_f16(q.data(), kHeads, kWidth, rows, kRows, s.data(), kRows);
        } else {
            for (int64_t j = 0; j < kRows; ++j)
                for (int64_t h = 0; h < kHeads; ++h)
                    s[size_t(h * kRows + j)] =
                        sv.dot_f32_f16(kWidth, q.data() + h * kWidth, rows.row(j));
        }
        benchmark::DoNotOptimize(s.data());
    }
    set_flops(st, double(kHeads * kWidth * kRows));
}
BENCHMARK(BM_scores)->ArgName("tiled")->Arg(0)->Arg(1);

void BM_weighted_sum(benchmark::State& st) {
    const auto p = floats(size_t(kHeads * kRows), 3);
    const auto c = halves(size_t(kRows * kWidth), 4);
    const F16Rows rows{reinterpret_cast<const uint8_t*>(c.data()), size_t(kWidth) * 2, nullptr};
    std::vector<float> out(size_t(kHeads * kValue));
    const SimdOps& sv = simd();
    const bool tiled = st.range(0) != 0;
    for (auto _ : st) {
        if (tiled) {
            sv.weighted_sum_f16(p.data(), kRows, kHeads, rows, kRows, kValue, out.data());
        } else {
            std::fill(out.begin(), out.end(), 0.0f);
            for (int64_t j = 0; j < kRows; ++j)
                for (int64_t h = 0; h < kHeads; ++h)
                    sv.axpy_f16(kValue, p[size_t(h * kRows + j)], rows.row(j),
                                out.data() + h * kValue);
        }
        benchmark::DoNotOptimize(out.data());
    }
    set_flops(st, double(kHeads * kValue * kRows));
}
BENCHMARK(BM_weighted_sum)->ArgName("tiled")->Arg(0)->Arg(1);

void BM_softmax(benchmark::State& st) {
    const auto x0 = floats(size_t(kHeads * kRows), 5);
    std::vector<float> x(x0.size());
    const SimdOps& sv = simd();
    for (auto _ : st) {
        x = x0;
        for (int64_t h = 0; h < kHeads; ++h) sv.softmax(x.data() + h * kRows, kRows, true);
        benchmark::DoNotOptimize(x.data());
    }
    st.counters["values/s"] =
        benchmark::Counter(double(kHeads * kRows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_softmax);

// The indexer's key scores: the tiled form against quant's F32 dot per
// (key, head) pair and the relu-weighted sum (what the AVX-512 path ran
// before it had tiles).
void BM_indexer_scores(benchmark::State& st) {
    const auto q = floats(size_t(kIdxHeads * kIdxDim), 6);
    const auto k = floats(size_t(kKeys * kIdxDim), 7);
    const auto w = floats(size_t(kIdxHeads), 8);
    std::vector<float> out(static_cast<size_t>(kKeys)), d(static_cast<size_t>(kIdxHeads));
    const SimdOps& sv = simd();
    const quant::VecDotFn dot = quant::vec_dot_fn(quant::Type::F32);
    const bool tiled = st.range(0) != 0;
    for (auto _ : st) {
        if (tiled) {
            sv.indexer_scores(q.data(), kIdxHeads, w.data(), k.data(), kIdxDim, kKeys, kIdxDim,
                              out.data());
        } else {
            for (int64_t j = 0; j < kKeys; ++j) {
                for (int64_t a = 0; a < kIdxHeads; ++a)
                    d[size_t(a)] = dot(kIdxDim, q.data() + a * kIdxDim, k.data() + j * kIdxDim);
                float s = 0.0f;
                for (int64_t a = 0; a < kIdxHeads; ++a)
                    s += std::max(d[size_t(a)], 0.0f) * w[size_t(a)];
                out[size_t(j)] = s;
            }
        }
        benchmark::DoNotOptimize(out.data());
    }
    set_flops(st, double(kIdxHeads * kIdxDim * kKeys));
}
BENCHMARK(BM_indexer_scores)->ArgName("tiled")->Arg(0)->Arg(1);

// Seconds f() takes, for benchmarks that time phases of an iteration apart.
template <typename F>
double seconds_of(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes a line of every 64 bytes of `other`, pushing earlier data out of the
// core's caches (the cold benchmarks: decode meets the cache in memory).
void evict(std::vector<char>& other) {
    for (size_t i = 0; i < other.size(); i += 64) other[i]++;
}

}  // namespace

// --attn-bf16: one query of 16 heads over 2048 rows on AMX-BF16 tiles, all
// its blocks on one thread (the rows in the last-level cache).
void BM_query_bf16(benchmark::State& st) {
    if (!amx_bf16::available()) {
        st.SkipWithError("no AMX-BF16 on this CPU");
        return;
    }
    constexpr int64_t H = 16;
    const auto q = floats(size_t(H * kWidth), 1);
    const auto c = halves(size_t(kRows * kWidth), 2);
    const amx_bf16::Rows rows{reinterpret_cast<const uint8_t*>(c.data()), size_t(kWidth) * 2,
                              nullptr, amx_bf16::Elem::F16};
    std::vector<float> out(size_t(H * kValue));
    for (auto _ : st) {
        amx_bf16::Query a(q.data(), H, kWidth, kValue, kRows, 0.04f);
        for (int64_t b = 0; b < a.blocks(); ++b) a.block(rows, b);
        a.finish(out.data(), kValue);
    }
    set_flops(st, double(H * kRows) * double(kWidth + kValue));
}
BENCHMARK(BM_query_bf16);

// Prefill's run of four neighbouring queries, each picking 2048 of 4608 rows
// (a shared preference plus its own noise, as the indexer's picks of
// neighbouring queries overlap): every query's blocks on its own (run:0) or
// block k of the four together (run:1), on one thread or on two (each its own
// run). Time per run of four.
void BM_run_bf16(benchmark::State& st) {
    if (!amx_bf16::available()) {
        st.SkipWithError("no AMX-BF16 on this CPU");
        return;
    }
    constexpr int64_t H = 16, N = 4608, R = amx_bf16::Query::kRunQueries;
    // cold: each run reads another of 48 windows of N rows (250 MB), after
    // 64 MB of other reads, as prefill at depth reads its cache from memory.
    const bool cold = st.range(1) != 0;
    const int64_t windows = cold ? 48 : 1;
    const auto c = halves(size_t(windows * N * kWidth), 2);
    std::vector<char> other(cold ? size_t(64) << 20 : 0);
    const auto base = floats(size_t(N), 3);
    std::vector<std::vector<float>> q;
    std::vector<std::vector<int32_t>> idx;
    std::vector<amx_bf16::Rows> rows;
    for (int64_t i = 0; i < R; ++i) {
        q.push_back(floats(size_t(H * kWidth), uint32_t(10 + i)));
        const auto noise = floats(size_t(N), uint32_t(20 + i));
        std::vector<float> score(static_cast<size_t>(N));
        for (size_t r = 0; r < score.size(); ++r) score[r] = base[r] + 0.3f * noise[r];
        std::vector<int32_t> tmp, pick(static_cast<size_t>(kRows));
        backend::kernels::top_k_rows(score.data(), N, kRows, tmp, pick.data());
        idx.push_back(std::move(pick));
    }
    for (int64_t i = 0; i < R; ++i)
        rows.push_back({reinterpret_cast<const uint8_t*>(c.data()), size_t(kWidth) * 2,
                        idx[size_t(i)].data(), amx_bf16::Elem::F16});
    // The share of a run's block rows that are distinct (the real model's
    // neighbouring queries at depth 4096: about 0.35).
    int64_t distinct = 0;
    for (int64_t b = 0; b < kRows; b += amx_bf16::Query::kBlockKeys) {
        std::vector<int32_t> u;
        for (const auto& x : idx)
            u.insert(u.end(), x.begin() + b, x.begin() + b + amx_bf16::Query::kBlockKeys);
        std::sort(u.begin(), u.end());
        distinct += std::unique(u.begin(), u.end()) - u.begin();
    }
    st.counters["distinct"] = double(distinct) / double(R * kRows);
    std::vector<float> out(size_t(H * kValue));
    const bool together = st.range(0) != 0;
    int64_t window = 0;
    for (auto _ : st) {
        if (cold) {
            st.PauseTiming();
            window = (window + 1) % windows;
            for (auto& r : rows)
                r.base = reinterpret_cast<const uint8_t*>(c.data() + window * N * kWidth);
            evict(other);
            st.ResumeTiming();
        }
        std::vector<amx_bf16::Query> run;
        for (int64_t i = 0; i < R; ++i)
            run.emplace_back(q[size_t(i)].data(), H, kWidth, kValue, kRows, 0.04f);
        amx_bf16::Query* ptr[R];
        for (int64_t i = 0; i < R; ++i) ptr[i] = &run[size_t(i)];
        for (int64_t b = 0; b < run[0].blocks(); ++b) {
            if (together)
                amx_bf16::Query::block_of_run(ptr, rows, b);
            else
                for (int64_t i = 0; i < R; ++i) run[size_t(i)].block(rows[size_t(i)], b);
        }
        for (auto& a : run) a.finish(out.data(), kValue);
    }
    set_flops(st, double(R * H * kRows) * double(kWidth + kValue));
}
BENCHMARK(BM_run_bf16)
    ->ArgNames({"run", "cold"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Threads(1)
    ->Threads(2);

// One decode query over 2048 rows of a 150 MB cache, after 64 MB of other
// reads: decode's gather from memory rather than from the last-level cache.
// The rows are picked at random from the whole cache (dense:0), or are half
// of a 4096-row window (dense:1, the top-2048 of a decode step at depth 4096).
// Reports the time per query (us_query) and, as its bound, the time a plain
// read of the same rows takes (us_read).
// n halves set to v in an anonymous mapping advised to 2 MB pages, as the
// backend's caches are.
struct HugeHalves {
    std::span<uint16_t> s;
    HugeHalves(size_t n, uint16_t v) {
        void* m =
            ::mmap(nullptr, n * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) std::abort();
        ::madvise(m, n * 2, MADV_HUGEPAGE);
        s = {static_cast<uint16_t*>(m), n};
        std::fill(s.begin(), s.end(), v);
    }
    ~HugeHalves() { ::munmap(s.data(), s.size() * 2); }
    HugeHalves(const HugeHalves&) = delete;
    HugeHalves& operator=(const HugeHalves&) = delete;
    const uint16_t* data() const { return s.data(); }
    uint16_t operator[](size_t i) const { return s[i]; }
};

struct ColdQuery {
    static constexpr int64_t H = 16, kBig = 131072;
    const std::vector<float> q = floats(size_t(H * kWidth), 1);
    const HugeHalves c{size_t(kBig * kWidth), 0x3c00};
    std::mt19937 rng{3};
    std::vector<int32_t> idx = std::vector<int32_t>(kRows),
                         window = std::vector<int32_t>(2 * kRows);
    std::vector<float> out = std::vector<float>(size_t(H * kValue));
    std::vector<char> other = std::vector<char>(size_t(64) << 20);

    void pick(bool dense) {
        if (!dense) {
            for (auto& i : idx) i = int32_t(rng() % kBig);
        } else {
            const int32_t base = int32_t(rng() % (kBig - 2 * kRows));
            for (size_t i = 0; i < window.size(); ++i) window[i] = base + int32_t(i);
            std::shuffle(window.begin(), window.end(), rng);
            std::copy_n(window.begin(), kRows, idx.begin());
        }
        std::sort(idx.begin(), idx.end());
        evict(other);
    }
    // query() against a plain read of the rows, each on freshly picked rows.
    template <typename F>
    void run(benchmark::State& st, F&& query) {
        const bool dense = st.range(0) != 0;
        double tq = 0, tr = 0;
        int64_t n = 0;
        for (auto _ : st) {
            pick(dense);
            tq += seconds_of(query);
            pick(dense);
            tr += seconds_of([&] {
                uint16_t acc = 0;
                for (const int32_t i : idx)
                    for (int64_t k = 0; k < kWidth; k += 32) acc ^= c[size_t(i * kWidth + k)];
                benchmark::DoNotOptimize(acc);
            });
            ++n;
        }
        st.counters["us_query"] = tq / double(n) * 1e6;
        st.counters["us_read"] = tr / double(n) * 1e6;
    }
};

void BM_query_bf16_cold(benchmark::State& st) {
    if (!amx_bf16::available()) {
        st.SkipWithError("no AMX-BF16 on this CPU");
        return;
    }
    ColdQuery cq;
    cq.run(st, [&] {
        const amx_bf16::Rows rows{reinterpret_cast<const uint8_t*>(cq.c.data()), size_t(kWidth) * 2,
                                  cq.idx.data(), amx_bf16::Elem::F16};
        amx_bf16::Query a(cq.q.data(), ColdQuery::H, kWidth, kValue, kRows, 0.04f);
        for (int64_t b = 0; b < a.blocks(); ++b) a.block(rows, b, b + 1 < a.blocks() ? b + 1 : -1);
        a.finish(cq.out.data(), kValue);
    });
}
BENCHMARK(BM_query_bf16_cold)->ArgName("dense")->Arg(0)->Arg(1)->Iterations(50);

// The exact path's query on one thread, as attend() runs it: the scores,
// a softmax per head, the weighted sums.
void BM_query_f16_cold(benchmark::State& st) {
    ColdQuery cq;
    const SimdOps& sv = simd();
    std::vector<float> s(size_t(ColdQuery::H * kRows));
    cq.run(st, [&] {
        const F16Rows rows{reinterpret_cast<const uint8_t*>(cq.c.data()), size_t(kWidth) * 2,
                           cq.idx.data()};
        sv.scores_f16(cq.q.data(), ColdQuery::H, kWidth, rows, kRows, s.data(), kRows);
        for (int64_t h = 0; h < ColdQuery::H; ++h) sv.softmax(s.data() + h * kRows, kRows, true);
        sv.weighted_sum_f16(s.data(), kRows, ColdQuery::H, rows, kRows, kValue, cq.out.data());
    });
}
BENCHMARK(BM_query_f16_cold)->ArgName("dense")->Arg(0)->Arg(1)->Iterations(50);

// --attn-bf16's indexer: one decode query of GLM-5's 32 heads x 128 dims over
// 4096 keys, one thread: F16 keys (converted to BF16 tiles, then scored) or
// BF16 keys (the cache --attn-bf16 keeps for glm-dsa, read in place); and the
// top-2048 selection that follows it (the same in both modes).
void BM_indexer_bf16(benchmark::State& st) {
    if (!amx_bf16::available()) {
        st.SkipWithError("no AMX-BF16 on this CPU");
        return;
    }
    constexpr int64_t H = 32, D = 128, N = 4096;
    const auto q = floats(size_t(H * D), 1), w = floats(size_t(H), 2);
    const bool bf16 = st.range(0) != 0;
    const auto k = halves(size_t(N * D), 3);
    std::vector<uint16_t> kb(k.size());
    for (size_t i = 0; i < k.size(); ++i) kb[i] = fp32_to_bf16(fp16_to_fp32(k[i]));
    const amx_bf16::Rows rows{reinterpret_cast<const uint8_t*>(bf16 ? kb.data() : k.data()),
                              size_t(D) * 2, nullptr,
                              bf16 ? amx_bf16::Elem::BF16 : amx_bf16::Elem::F16};
    amx_bf16::IndexerKeys keys;
    std::vector<float> out(static_cast<size_t>(N));
    for (auto _ : st) {
        keys.reset(rows, N, D);
        amx_bf16::LineVector<uint16_t> qb(size_t(keys.query_size(H)));
        for (int64_t t = 0; t < keys.tiles(); ++t) keys.convert(t);
        keys.convert_query(q.data(), H, qb.data());
        keys.scores(qb.data(), H, w.data(), 0, N, out.data());
    }
    set_flops(st, double(H * N * D));
}
BENCHMARK(BM_indexer_bf16)->ArgName("bf16_keys")->Arg(0)->Arg(1);

// The indexer's scoring of one decode query at depth 16384 with its BF16 keys
// cold (in memory, as decode meets them: every layer's weights have streamed
// through the caches since), one thread, 8 heads (the bench model) or 32
// (GLM-5). us_score: the scores; us_read: a plain read of the same keys.
void BM_indexer_bf16_cold(benchmark::State& st) {
    if (!amx_bf16::available()) {
        st.SkipWithError("no AMX-BF16 on this CPU");
        return;
    }
    constexpr int64_t D = 128, N = 16384;
    const int64_t H = st.range(0);
    const auto q = floats(size_t(H * D), 1), w = floats(size_t(H), 2);
    const auto k = halves(size_t(N * D), 3);
    std::vector<uint16_t> kb(k.size());
    for (size_t i = 0; i < k.size(); ++i) kb[i] = fp32_to_bf16(fp16_to_fp32(k[i]));
    const amx_bf16::Rows rows{reinterpret_cast<const uint8_t*>(kb.data()), size_t(D) * 2, nullptr,
                              amx_bf16::Elem::BF16};
    amx_bf16::IndexerKeys keys;
    keys.reset(rows, N, D);
    amx_bf16::LineVector<uint16_t> qb(size_t(keys.query_size(H)));
    keys.convert_query(q.data(), H, qb.data());
    std::vector<float> out(static_cast<size_t>(N));
    std::vector<char> other(size_t(64) << 20);
    double score = 0, read = 0;
    int64_t n = 0;
    for (auto _ : st) {
        evict(other);
        score += seconds_of([&] { keys.scores(qb.data(), H, w.data(), 0, N, out.data()); });
        evict(other);
        read += seconds_of([&] {
            uint16_t acc = 0;
            for (size_t i = 0; i < kb.size(); i += 32) acc ^= kb[i];
            benchmark::DoNotOptimize(acc);
        });
        ++n;
    }
    st.counters["us_score"] = score / double(n) * 1e6;
    st.counters["us_read"] = read / double(n) * 1e6;
}
BENCHMARK(BM_indexer_bf16_cold)->ArgName("heads")->Arg(8)->Arg(32)->Iterations(50);

// The top-2048 of a decode query's scores at depth 4096 and 16384: the
// portable form (simd:0) and this host's (simd:1, AVX-512's vector passes).
void BM_top_k(benchmark::State& st) {
    const int64_t N = st.range(0), K = 2048;
    const auto v = floats(size_t(N), 4);
    std::vector<int32_t> tmp, out(static_cast<size_t>(K));
    const auto fn = st.range(1) ? backend::cpu::simd().top_k_rows : backend::kernels::top_k_rows;
    for (auto _ : st) fn(v.data(), N, K, tmp, out.data());
}
BENCHMARK(BM_top_k)->ArgNames({"keys", "simd"})->ArgsProduct({{4096, 16384}, {0, 1}});

BENCHMARK_MAIN();

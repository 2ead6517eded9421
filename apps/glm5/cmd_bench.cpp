// glm5 bench: prompt processing (pp) and generation (tg) throughput in a
// llama-bench style table, plus the decode roofline: the bytes of weights the
// kernels read per generated token against the machine's measured read
// bandwidth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/bandwidth.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "model_setup.h"

namespace glm5::app {

namespace {

struct Stat {
    double mean = 0, sd = 0, median = 0;
};

Stat stats(std::vector<double> v) {
    Stat s;
    if (v.empty()) return s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = v.size() > 1 ? std::sqrt(s.sd / double(v.size() - 1)) : 0.0;
    std::sort(v.begin(), v.end());
    s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    return s;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, uint64_t seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (auto& v : t) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v = int32_t(x % uint64_t(std::min<int64_t>(n_vocab, 700)));
    }
    return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int cmd_bench(int argc, char** argv) {
    Args a("bench",
           "Measure prompt processing (pp) and generation (tg) speed, and the decode roofline.");
    add_model_flags(a, true);
    a.option("n-prompt", "N", "512", "prompt tokens of the pp test (0: skip)", "-p");
    a.option("n-gen", "N", "64", "generated tokens of the tg test (0: skip)", "-n");
    a.option("repetitions", "N", "3", "repetitions of each test", "-r");
    a.option("ubatch", "N", "512", "prompt micro-batch size");
    a.option("depth", "N", "0",
             "tokens already in each sequence's cache before the pp and tg tests (prefilled "
             "untimed, as llama-bench -d): speed deep into a conversation",
             "-d");
    a.option("parallel", "N", "1",
             "sequences decoded together in the tg test (one forward per step); above 1, each "
             "repetition also decodes one sequence alone and the paired speed-up is reported");
    a.flag("roofline", "measure the read bandwidth and report the decode roofline", true);
    a.option("bandwidth-bytes", "BYTES", "1073741824", "buffer size of the bandwidth measurement");
    if (!a.parse(argc, argv, 2)) return 0;
    const int64_t n_prompt = a.get_int("n-prompt", 0, 1 << 20);
    const int64_t n_gen = a.get_int("n-gen", 0, 1 << 20);
    const int64_t reps = a.get_int("repetitions", 1, 1000);
    const int64_t ubatch = a.get_int("ubatch", 1, 1 << 16);
    const int64_t bw_bytes = a.get_int("bandwidth-bytes", 1 << 20, int64_t(1) << 40);
    const int64_t n_par = a.get_int("parallel", 1, 1024);
    const int64_t depth = a.get_int("depth", 0, 1 << 20);
    LoadedModel m = open_model(a);
    model::Model& model = *m.model;
    backend::Backend& be = model.backend();
    const int64_t V = model.info().n_vocab;
    const int64_t n_ctx = depth + std::max<int64_t>(n_prompt, n_gen) + 8;

    // A fresh sequence holding `depth` tokens (prefilled in micro-batches, untimed).
    auto new_seq = [&](uint64_t seed) {
        auto st = model.new_state(n_ctx);
        const auto toks = random_tokens(depth, V, seed ^ 0x5eedull);
        std::vector<float> lg;
        for (int64_t i = 0; i < depth; i += ubatch) {
            const int64_t n = std::min(ubatch, depth - i);
            model::SeqInput in{st.get(), std::span<const int32_t>(toks.data() + i, size_t(n)),
                               false, false};
            model.forward({&in, 1}, lg);
        }
        return st;
    };

    auto run_pp = [&](uint64_t seed) {
        const auto toks = random_tokens(n_prompt, V, seed);
        auto st = new_seq(seed);
        std::vector<float> lg;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < n_prompt; i += ubatch) {
            const int64_t n = std::min(ubatch, n_prompt - i);
            model::SeqInput in{st.get(), std::span<const int32_t>(toks.data() + i, size_t(n)),
                               false, i + n == n_prompt};
            model.forward({&in, 1}, lg);
        }
        return double(n_prompt) / seconds_since(t0);
    };
    // n_seq sequences, one token each per forward; returns aggregate tokens/s.
    auto run_tg = [&](int64_t n_seq, uint64_t seed, double* bytes_per_token) {
        std::vector<std::vector<int32_t>> toks;
        std::vector<std::unique_ptr<model::SequenceState>> st;
        for (int64_t s = 0; s < n_seq; ++s) {
            toks.push_back(random_tokens(n_gen, V, seed * 131 + uint64_t(s)));
            st.push_back(new_seq(seed * 131 + uint64_t(s)));
        }
        std::vector<float> lg;
        std::vector<model::SeqInput> in(static_cast<size_t>(n_seq));
        be.reset_counters();
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < n_gen; ++i) {
            for (int64_t s = 0; s < n_seq; ++s)
                in[size_t(s)] = {st[size_t(s)].get(),
                                 std::span<const int32_t>(&toks[size_t(s)][size_t(i)], 1), false,
                                 true};
            model.forward(in, lg);
        }
        const double tps = double(n_gen * n_seq) / seconds_since(t0);
        if (bytes_per_token)
            *bytes_per_token = double(be.counters().weight_bytes) / double(n_gen * n_seq);
        return tps;
    };
    // Warm-up: touch every code path and page once.
    if (n_prompt > 0) run_pp(99);
    if (n_gen > 0) run_tg(n_par, 99, nullptr);

    // The read bandwidth is measured right after each decode repetition and
    // each repetition's roofline fraction is taken against its own
    // measurement: on a shared or virtual machine the bandwidth drifts by
    // tens of percent from minute to minute.
    std::unique_ptr<ThreadPool> bw_pool;
    std::unique_ptr<ReadBandwidth> bw;
    if (n_gen > 0 && a.get_flag("roofline")) {
        bw_pool = std::make_unique<ThreadPool>(be.n_threads());
        bw = std::make_unique<ReadBandwidth>(*bw_pool, size_t(bw_bytes));
    }
    // With --parallel N > 1 each repetition also decodes one sequence alone,
    // just before, and the scaling is the median of these paired ratios (for
    // the same reason as above).
    std::vector<double> pp, tg, bpt, bpt_one, gbs, frac, scaling;
    for (int64_t r = 0; r < reps; ++r) {
        if (n_prompt > 0) pp.push_back(run_pp(uint64_t(r + 1)));
        if (n_gen > 0) {
            double b = 0, b_one = 0;
            const double one = n_par > 1 ? run_tg(1, uint64_t(r + 1), &b_one) : 0.0;
            if (n_par > 1) bpt_one.push_back(b_one);
            tg.push_back(run_tg(n_par, uint64_t(r + 1), &b));
            if (n_par > 1) scaling.push_back(tg.back() / one);
            bpt.push_back(b);
            if (bw) {
                // Let the engine's workers go idle first.
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                gbs.push_back(bw->measure());
                frac.push_back(b * tg.back() / 1e9 / gbs.back());
            }
        }
    }

    const model::ModelInfo& info = model.info();
    char buf[512];
    std::string out =
        "| model | size | backend | threads | ubatch | test | t/s (median) | ± sd |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n";
    auto row = [&](const std::string& test, const Stat& s) {
        std::snprintf(buf, sizeof(buf), "| %s | %s | %s | %d | %lld | %s | %.2f | %.2f |\n",
                      info.name.c_str(), human_bytes(double(m.file->total_file_bytes())).c_str(),
                      be.name().c_str(), be.n_threads(), (long long)ubatch, test.c_str(), s.median,
                      s.sd);
        out += buf;
    };
    const std::string at = depth > 0 ? " @ d" + std::to_string(depth) : "";
    if (!pp.empty()) row("pp" + std::to_string(n_prompt) + at, stats(pp));
    if (!tg.empty())
        row("tg" + std::to_string(n_gen) + at +
                (n_par > 1 ? " x" + std::to_string(n_par) + " seqs" : ""),
            stats(tg));

    if (!tg.empty() && bw) {
        const double bytes = stats(bpt).median;
        const double tps = stats(tg).median;
        const auto [lo, hi] = std::minmax_element(gbs.begin(), gbs.end());
        std::snprintf(
            buf, sizeof(buf),
            "\ndecode roofline: %.1f MB of weights read per token (counted by the kernels); "
            "read bandwidth %.1f GB/s (median; %.1f-%.1f over %zu measurements, one after each "
            "repetition; %s buffer, %d threads)\n"
            "roofline %.2f t/s; reached %.2f t/s = %.1f GB/s; %.1f%% of the roofline (median of "
            "the repetitions, each against its own bandwidth)\n",
            bytes / 1e6, stats(gbs).median, *lo, *hi, gbs.size(),
            human_bytes(double(bw->bytes())).c_str(), be.n_threads(),
            stats(gbs).median * 1e9 / bytes, tps, bytes * tps / 1e9, 100.0 * stats(frac).median);
        out += buf;
    }
    if (!scaling.empty()) {
        std::string each;
        for (double x : scaling) {
            char v[32];
            std::snprintf(v, sizeof(v), "%s%.2f", each.empty() ? "" : ", ", x);
            each += v;
        }
        std::snprintf(
            buf, sizeof(buf),
            "\nparallel %lld: %.2fx the aggregate tokens/s of one sequence (median of %zu "
            "paired repetitions: %s)\n",
            (long long)n_par, stats(scaling).median, scaling.size(), each.c_str());
        out += buf;
        // Where decode is bound by reading the weights, N sequences cannot
        // scale past the bytes a token reads alone over the bytes per token
        // of the batch (which reads every expert any of them picked).
        const double alone = stats(bpt_one).median, shared = stats(bpt).median;
        if (alone > 0 && shared > 0) {
            const double ceiling = alone / shared;
            std::snprintf(buf, sizeof(buf),
                          "weights read per token: %.1f MB alone, %.1f MB with %lld sequences: "
                          "a bandwidth ceiling of %.2fx; the scaling reached %.0f%% of it\n",
                          alone / 1e6, shared / 1e6, (long long)n_par, ceiling,
                          100.0 * stats(scaling).median / ceiling);
            out += buf;
        }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace glm5::app

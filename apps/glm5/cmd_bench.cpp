// glm5 bench: prompt processing (pp) and generation (tg) throughput in a
// llama-bench style table, plus the decode roofline: the bytes of weights the
// kernels read per generated token against the machine's measured read
// bandwidth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "bench_vision.h"
#include "commands.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "core/format.h"
#include "core/thread_pool.h"
#include "model_setup.h"
#include "runtime/engine.h"
#include "split_setup.h"

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

// What verifying a window costs: forwards of 1, 2, 3, 5 and 9 rows (every
// row with logits) on a sequence holding the prompt, each undone by a
// snapshot restore, against a one-row decode.
std::string verify_cost_table(model::Model& model, std::vector<int32_t> prompt,
                              const std::vector<int32_t>& more, int reps) {
    prompt.insert(prompt.end(), more.begin(), more.end());
    auto st = model.new_state(int64_t(prompt.size()) + 16);
    std::vector<float> lg;
    model::SeqInput in{st.get(), prompt, false, false};
    model.forward({&in, 1}, lg);
    const auto snap = st->snapshot();
    const int sizes[] = {1, 2, 3, 5, 9};
    std::vector<double> ms;
    for (int r : sizes) {
        std::vector<int32_t> win(static_cast<size_t>(r));
        for (int i = 0; i < r; ++i) win[size_t(i)] = more[size_t(i) % more.size()];
        std::vector<double> t;
        for (int k = 0; k < std::max(3, 3 * reps); ++k) {
            model::SeqInput w{st.get(), win, true, true};
            const auto t0 = std::chrono::steady_clock::now();
            model.forward({&w, 1}, lg);
            t.push_back(seconds_since(t0) * 1e3);
            st->restore(*snap);
        }
        ms.push_back(stats(t).median);
    }
    std::string out =
        "\n| verify rows | ms per forward | cost vs 1 row | cost per token |\n"
        "| ---: | ---: | ---: | ---: |\n";
    char buf[160];
    for (size_t i = 0; i < ms.size(); ++i) {
        std::snprintf(buf, sizeof(buf), "| %d | %.2f | %.2fx | %.2fx |\n", sizes[i], ms[i],
                      ms[i] / ms[0], ms[i] / ms[0] / sizes[i]);
        out += buf;
    }
    return out;
}

struct BenchConfig {
    int64_t n_prompt = 0, n_gen = 0, reps = 1, ubatch = 512, n_par = 1, depth = 0;
};

// Bytes per decoded token: weights, and cache rows and recurrent state.
struct TokenBytes {
    double weights = 0, cache = 0;
    double total() const { return weights + cache; }
};

// The tests, each run through the engine as serving runs requests. Each repetition first
// prefills `depth` random tokens per sequence (untimed, retained); the timed request then
// adopts that prefix, as after llama-bench -d.
class Bench {
  public:
    Bench(LoadedModel& m, const BenchConfig& c)
        : m_(m), model_(*m.model), c_(c), V_(model_.info().n_vocab), engine_(model_, options(c)) {
        fixed_prompt = random_tokens(32, V_, 7);
    }

    // Prompt processing: the logits of the last prompt token, as a reply's first token
    // needs. Returns tokens/s.
    double pp(uint64_t seed) {
        engine_.drop_retained();
        warm({seed});
        runtime::RequestParams p;
        p.prompt = depth_tokens(seed);
        const auto toks = random_tokens(c_.n_prompt, V_, seed);
        p.prompt.insert(p.prompt.end(), toks.begin(), toks.end());
        p.max_tokens = 1;
        p.forced = {0};
        const backend::Counters c0 = counters();
        const runtime::RequestResult r = engine_.submit(std::move(p))->wait();
        if (r.finish_reason == "error") throw Error(r.error);
        const backend::Counters c1 = counters();
        pp_ops = double(c1.parallel_ops - c0.parallel_ops);
        pp_rendezvous = double(c1.rendezvous - c0.rendezvous);
        return double(c_.n_prompt) / r.prompt_seconds;
    }

    // n_seq sequences decoding a forced random continuation together, one token each per
    // forward. Returns aggregate tokens/s.
    double tg(int64_t n_seq, uint64_t seed, TokenBytes* bytes_per_token) {
        engine_.drop_retained();
        std::vector<uint64_t> seeds;
        for (int64_t s = 0; s < n_seq; ++s) seeds.push_back(seed * 131 + uint64_t(s));
        warm(seeds);
        std::vector<runtime::RequestParams> ps;
        for (uint64_t sd : seeds) {
            const auto toks = random_tokens(c_.n_gen + 1, V_, sd);
            runtime::RequestParams p;
            p.prompt = depth_tokens(sd);
            p.prompt.push_back(toks[0]);
            p.forced.assign(toks.begin() + 1, toks.end());
            p.max_tokens = c_.n_gen;
            ps.push_back(std::move(p));
        }
        split_reset_counters(model_);
        reset_counters();
        const auto t0 = std::chrono::steady_clock::now();
        wait_all(engine_.submit_group(std::move(ps)));
        const double n = double(c_.n_gen * n_seq);
        const double tps = n / seconds_since(t0);
        if (bytes_per_token) {
            const backend::Counters c = counters();
            bytes_per_token->weights = double(c.weight_bytes) / n;
            bytes_per_token->cache = double(c.cache_bytes) / n;
            tg_ops = double(c.parallel_ops) / double(c_.n_gen);
            tg_rendezvous = double(c.rendezvous) / double(c_.n_gen);
            tg_device = c;
        }
        last_tg_tokens = n;
        return tps;
    }

    // Greedy decoding from one fixed prompt, plainly or with speculation (forced random
    // tokens would make acceptance meaningless). Returns tokens/s.
    double greedy(bool with_spec, std::vector<int32_t>* out) {
        engine_.drop_retained();
        warm({7});
        runtime::RequestParams p;
        p.prompt = depth_tokens(7);
        p.prompt.insert(p.prompt.end(), fixed_prompt.begin(), fixed_prompt.end());
        p.sampling.temperature = 0;
        p.max_tokens = c_.n_gen;
        runtime::SpecParams off;
        p.spec = with_spec ? m_.spec : off;
        const runtime::RequestResult r = engine_.submit(std::move(p))->wait();
        if (r.finish_reason == "error") throw Error(r.error);
        if (with_spec) spec_last = r;
        if (out) *out = r.tokens;
        return r.gen_seconds > 0 ? double(r.tokens.size() - 1) / r.gen_seconds : 0.0;
    }

    std::vector<int32_t> depth_tokens(uint64_t seed) const {
        return random_tokens(c_.depth, V_, seed ^ 0x5eedull);
    }

    // The executor's handings of work to its threads, of the last prompt and the last
    // decode measured; the tokens of the last decode (the layer split's table); the last
    // speculative reply; the fixed prompt of the greedy tests.
    double pp_ops = 0, pp_rendezvous = 0, tg_ops = 0, tg_rendezvous = 0;
    backend::Counters tg_device;  // the last decode measured, all its steps
    double last_tg_tokens = 0;
    runtime::RequestResult spec_last;
    std::vector<int32_t> fixed_prompt;

  private:
    static runtime::EngineOptions options(const BenchConfig& c) {
        runtime::EngineOptions eo;
        eo.n_parallel = int(c.n_par);
        eo.n_ctx = c.depth + std::max<int64_t>(c.n_prompt, c.n_gen) + 8;
        eo.ubatch = c.ubatch;
        eo.max_rewind = eo.n_ctx;
        eo.cache_budget_bytes = SIZE_MAX;
        // Whole-context states: the timed request adopts the prefilled depth without a copy.
        eo.request_sized_states = false;
        // A timed prompt is one run of micro-batches, as llama-bench's.
        eo.checkpoint_interval = 0;
        eo.checkpoint_tail = false;
        return eo;
    }
    // Both sides' reads when routed experts run beside a device (--device).
    backend::Counters counters() const {
        backend::Counters c = model_.backend().counters();
        if (m_.experts_backend) c += m_.experts_backend->counters();
        return c;
    }
    void reset_counters() {
        model_.backend().reset_counters();
        if (m_.experts_backend) m_.experts_backend->reset_counters();
    }
    static void wait_all(std::vector<std::shared_ptr<runtime::Request>> rs) {
        for (auto& r : rs) {
            const runtime::RequestResult res = r->wait();
            if (res.finish_reason == "error") throw Error(res.error);
        }
    }
    void warm(const std::vector<uint64_t>& seeds) {
        if (c_.depth == 0) return;
        std::vector<runtime::RequestParams> ps;
        for (uint64_t seed : seeds) {
            runtime::RequestParams p;
            p.prompt = depth_tokens(seed);
            p.prefill_only = true;
            ps.push_back(std::move(p));
        }
        wait_all(engine_.submit_group(std::move(ps)));
    }

    LoadedModel& m_;
    model::Model& model_;
    BenchConfig c_;
    int64_t V_;
    runtime::Engine engine_;
};

// Every repetition's figures.
struct Measured {
    std::vector<double> pp, tg, bpt, bpt_w, bpt_c, bpt_one, gbs, gbs_plain, frac, frac_plain,
        scaling, greedy, greedy_spec;
    bool spec_identical = true;
};

// The repetitions. The read bandwidth is measured right after each decode repetition and
// each repetition's roofline fraction is taken against its own measurement: on a shared or
// virtual machine the bandwidth drifts by tens of percent from minute to minute. With
// --parallel N > 1 each repetition also decodes one sequence alone, just before, and the
// scaling is the median of these paired ratios (for the same reason).
void measure(Bench& b, const BenchConfig& c, ReadBandwidth* bw, Measured& out) {
    for (int64_t r = 0; r < c.reps; ++r) {
        if (c.n_prompt > 0) out.pp.push_back(b.pp(uint64_t(r + 1)));
        if (c.n_gen == 0) continue;
        TokenBytes tb, tb_one;
        const double one = c.n_par > 1 ? b.tg(1, uint64_t(r + 1), &tb_one) : 0.0;
        if (c.n_par > 1) out.bpt_one.push_back(tb_one.total());
        out.tg.push_back(b.tg(c.n_par, uint64_t(r + 1), &tb));
        if (c.n_par > 1) out.scaling.push_back(out.tg.back() / one);
        const double bytes = tb.total();
        out.bpt.push_back(bytes);
        out.bpt_w.push_back(tb.weights);
        out.bpt_c.push_back(tb.cache);
        if (bw) {
            // Let the engine's workers go idle first.
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            out.gbs.push_back(bw->measure());
            out.frac.push_back(bytes * out.tg.back() / 1e9 / out.gbs.back());
            out.gbs_plain.push_back(bw->measure_plain());
            out.frac_plain.push_back(bytes * out.tg.back() / 1e9 / out.gbs_plain.back());
        }
    }
}

// With --spec: greedy decoding plainly and with speculation, repetition by repetition.
void measure_spec(Bench& b, const BenchConfig& c, Measured& out) {
    for (int64_t r = 0; r < c.reps; ++r) {
        std::vector<int32_t> plain, with_spec;
        out.greedy.push_back(b.greedy(false, &plain));
        out.greedy_spec.push_back(b.greedy(true, &with_spec));
        out.spec_identical = out.spec_identical && plain == with_spec;
    }
}

[[gnu::format(printf, 1, 2)]] std::string format(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

// llama-bench's table.
std::string speed_table(const LoadedModel& m, const BenchConfig& c, const Measured& r) {
    const model::ModelInfo& info = m.model->info();
    std::string out =
        "| model | size | backend | threads | ubatch | test | t/s (median) | ± sd |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n";
    auto row = [&](const std::string& test, const Stat& s) {
        out += format("| %s | %s | %s | %d | %lld | %s | %.2f | %.2f |\n", info.name.c_str(),
                      human_bytes(double(m.file->total_file_bytes())).c_str(),
                      m.model->backend().name().c_str(), m.threads, (long long)c.ubatch,
                      test.c_str(), s.median, s.sd);
    };
    const std::string at = c.depth > 0 ? " @ d" + std::to_string(c.depth) : "";
    const std::string tg = "tg" + std::to_string(c.n_gen) + at;
    if (!r.pp.empty()) row("pp" + std::to_string(c.n_prompt) + at, stats(r.pp));
    if (!r.tg.empty())
        row(tg + (c.n_par > 1 ? " x" + std::to_string(c.n_par) + " seqs" : ""), stats(r.tg));
    if (!r.greedy.empty()) {
        row(tg + " greedy", stats(r.greedy));
        row(tg + " spec", stats(r.greedy_spec));
    }
    return out;
}

// The decode roofline: bytes read per token against the measured read bandwidth.
std::string roofline(const Measured& r, const ReadBandwidth& bw, int threads) {
    const double bytes = stats(r.bpt).median;
    const double tps = stats(r.tg).median;
    const auto [lo, hi] = std::minmax_element(r.gbs.begin(), r.gbs.end());
    std::string out = format(
        "\ndecode roofline: %.2f MB read per token (counted by the kernels: %.2f MB of "
        "weights, %.2f MB of attention cache and recurrent state); "
        "read bandwidth %.1f GB/s (median; %.1f-%.1f over %zu measurements, one after each "
        "repetition; %s buffer, %d threads)\n",
        bytes / 1e6, stats(r.bpt_w).median / 1e6, stats(r.bpt_c).median / 1e6, stats(r.gbs).median,
        *lo, *hi, r.gbs.size(), human_bytes(double(bw.bytes())).c_str(), threads);
    out += format(
        "roofline %.2f t/s; reached %.2f t/s = %.1f GB/s; %.1f%% of the roofline (median of "
        "the repetitions, each against its own bandwidth)\n",
        stats(r.gbs).median * 1e9 / bytes, tps, bytes * tps / 1e9, 100.0 * stats(r.frac).median);
    out += format(
        "against a plain sequential read (one stream per thread, no software "
        "prefetch): %.1f GB/s, roofline %.2f t/s, %.1f%% of it\n",
        stats(r.gbs_plain).median, stats(r.gbs_plain).median * 1e9 / bytes,
        100.0 * stats(r.frac_plain).median);
    return out;
}

// Every handing is a point where a slow thread could hold up the rest; a rendezvous waits
// for every thread, an op only for its own work.
std::string executor_line(const Bench& b, const BenchConfig& c, const Measured& r, int threads) {
    std::string parts;
    if (!r.tg.empty())
        parts +=
            format("%.0f per decode step (%.0f of them rendezvous)", b.tg_ops, b.tg_rendezvous);
    if (!r.pp.empty()) {
        const double chunks = double((c.n_prompt + c.ubatch - 1) / c.ubatch);
        parts +=
            format("%s%.0f per %lld-token prefill chunk (%.0f rendezvous)",
                   parts.empty() ? "" : ", ", b.pp_ops / chunks,
                   (long long)std::min<int64_t>(c.n_prompt, c.ubatch), b.pp_rendezvous / chunks);
    }
    return "\nexecutor: work handed to the " + std::to_string(threads) + " threads " + parts + "\n";
}

// A device's cost per decode step beyond its kernels' work: what keeps a step from being one
// graph replayed (host waits, copies) and what a launch-bound step spends (launches).
std::string device_line(const Bench& b, const BenchConfig& c, int64_t n_layer) {
    const backend::Counters& d = b.tg_device;
    const double steps = double(c.n_gen);
    return format(
        "\ndevice: per decode step %.0f kernel launches (%.1f per layer), %.1f host waits, %.1f "
        "host-to-device and %.1f device-to-host copies; %.0f%% of the steps one CUDA graph "
        "(%llu captured for %.0f steps)\n",
        double(d.launches) / steps,
        double(d.launches) / steps / double(std::max<int64_t>(1, n_layer)),
        double(d.host_syncs) / steps, double(d.uploads) / steps, double(d.downloads) / steps,
        100.0 * double(d.graphs) / steps, (unsigned long long)d.captures, steps);
}

// --parallel N: the paired scaling, and the ceiling the weights' bandwidth puts on it.
std::string parallel_lines(const BenchConfig& c, const Measured& r) {
    std::string each;
    for (double x : r.scaling) each += format("%s%.2f", each.empty() ? "" : ", ", x);
    std::string out = format(
        "\nparallel %lld: %.2fx the aggregate tokens/s of one sequence (median of %zu "
        "paired repetitions: %s)\n",
        (long long)c.n_par, stats(r.scaling).median, r.scaling.size(), each.c_str());
    // Where decode is bound by reading the weights, N sequences cannot scale past the
    // bytes a token reads alone over the bytes per token of the batch (which reads every
    // expert any of them picked).
    const double alone = stats(r.bpt_one).median, shared = stats(r.bpt).median;
    if (alone > 0 && shared > 0) {
        const double ceiling = alone / shared;
        out += format(
            "weights read per token: %.1f MB alone, %.1f MB with %lld sequences: "
            "a bandwidth ceiling of %.2fx; the scaling reached %.0f%% of it\n",
            alone / 1e6, shared / 1e6, (long long)c.n_par, ceiling,
            100.0 * stats(r.scaling).median / ceiling);
    }
    return out;
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
    add_vision_bench_flags(a);
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.is_set("mmproj")) return bench_vision(a);
    BenchConfig c;
    c.n_prompt = a.get_int("n-prompt", 0, 1 << 20);
    c.n_gen = a.get_int("n-gen", 0, 1 << 20);
    c.reps = a.get_int("repetitions", 1, 1000);
    c.ubatch = a.get_int("ubatch", 1, 1 << 16);
    const int64_t bw_bytes = a.get_int("bandwidth-bytes", 1 << 20, int64_t(1) << 40);
    c.n_par = a.get_int("parallel", 1, 1024);
    c.depth = a.get_int("depth", 0, 1 << 20);
    LoadedModel m = open_model(a);
    model::Model& model = *m.model;
    Bench b(m, c);
    const bool spec = m.spec.type != runtime::DraftType::Off;

    // Warm-up: touch every code path and page once.
    if (c.n_prompt > 0) b.pp(99);
    if (c.n_gen > 0) b.tg(c.n_par, 99, nullptr);
    Measured r;
    if (spec && c.n_gen > 1) measure_spec(b, c, r);
    // (A split model's roofline is per rank: the rank table below gives each rank's bytes.)
    std::unique_ptr<ThreadPool> bw_pool;
    std::unique_ptr<ReadBandwidth> bw;
    if (c.n_gen > 0 && a.get_flag("roofline") && !is_split(model)) {
        bw_pool = std::make_unique<ThreadPool>(m.threads);
        bw = std::make_unique<ReadBandwidth>(*bw_pool, size_t(bw_bytes));
    }
    measure(b, c, bw.get(), r);

    std::string out = speed_table(m, c, r);
    if (!r.tg.empty() && bw) out += roofline(r, *bw, m.threads);
    if (b.pp_ops + b.tg_ops > 0 && !is_split(model)) out += executor_line(b, c, r, m.threads);
    if (b.tg_device.launches > 0 && !is_split(model))
        out += device_line(b, c, model.info().n_layer);
    if (!r.scaling.empty()) out += parallel_lines(c, r);
    if (!r.tg.empty()) out += split_rank_table(model, b.last_tg_tokens, r.tg.back());
    if (!r.greedy.empty()) {
        out += format(
            "\nspeculative: %.2fx the greedy tokens/s (medians); %s; the output is %s "
            "plain greedy decoding's\n",
            stats(r.greedy_spec).median / stats(r.greedy).median,
            spec_summary(b.spec_last, m.spec.type).c_str(),
            r.spec_identical ? "identical to" : "DIFFERENT FROM");
        out += verify_cost_table(model, b.depth_tokens(7), b.fixed_prompt, int(c.reps));
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace glm5::app

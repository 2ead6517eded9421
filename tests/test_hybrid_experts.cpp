// Routed experts in system RAM beside a device, with a second CPU backend standing in
// for the device: logits and output are bitwise the plain run's, for glm-dsa and
// glm5next, single and batched, with speculation, whichever blocks' experts move; the
// flags mean what llama.cpp's mean; placements that do not fit are refused with the
// smallest --n-cpu-moe that does.
#include <cstring>
#include <regex>

#include "backend/cpu.h"
#include "model/moe.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "util_cli.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

const std::string kDsa = data_path("glm-dsa/tiny.gguf");    // 6 layers, 2 dense, NextN
const std::string kNext = data_path("glm5next/tiny.gguf");  // 8 layers, the first dense

// The model on `device`, its experts (those `host` flags) on a CPU backend beside it.
struct Hybrid {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> device, cpu;
    std::unique_ptr<model::Model> model;
    Hybrid(const std::string& path, const std::vector<bool>& host, bool nextn) {
        file = gguf::File::open(path);
        backend::CpuOptions bo;
        bo.n_threads = 2;
        device = backend::make_cpu_backend(bo);
        cpu = backend::make_cpu_backend(bo);
        model::LoadOptions lo;
        lo.cache_type = backend::CacheType::F16;
        lo.load_nextn = nextn;
        lo.host_experts = host;
        lo.experts_backend = cpu.get();
        model = model::load_model(*file, *device, lo);
    }
};

std::unique_ptr<model::Model> plain(const std::string& path, bool nextn,
                                    std::unique_ptr<gguf::File>& file,
                                    std::unique_ptr<backend::Backend>& be) {
    file = gguf::File::open(path);
    backend::CpuOptions bo;
    bo.n_threads = 2;
    be = backend::make_cpu_backend(bo);
    model::LoadOptions lo;
    lo.cache_type = backend::CacheType::F16;
    lo.load_nextn = nextn;
    return model::load_model(*file, *be, lo);
}

// Two sequences of different lengths in one forward, every row's logits, then three
// decode steps of both together.
std::vector<float> batched(model::Model& m) {
    const std::vector<int32_t> a = random_ids(7, 23, m.info().n_vocab);
    const std::vector<int32_t> b = random_ids(8, 11, m.info().n_vocab);
    auto sa = m.new_state(64), sb = m.new_state(64);
    std::vector<float> all, lg;
    model::SeqInput in[2] = {{sa.get(), a, true}, {sb.get(), b, true}};
    m.forward(in, lg);
    all = lg;
    for (int32_t step = 0; step < 3; ++step) {
        const int32_t ta = 3 + step, tb = 40 + step;
        model::SeqInput next[2] = {{sa.get(), {&ta, 1}, false}, {sb.get(), {&tb, 1}, false}};
        m.forward(next, lg);
        all.insert(all.end(), lg.begin(), lg.end());
    }
    return all;
}

// Greedy replies of two requests decoded together, with speculation, and the logits
// each emitted token was sampled from.
std::vector<std::vector<float>> engine_run(model::Model& m, runtime::DraftType type) {
    runtime::EngineOptions eo;
    eo.n_parallel = 2;
    eo.n_ctx = 256;
    eo.prefix_cache = false;
    runtime::Engine e(m, eo);
    std::vector<std::vector<float>> rows[2];
    std::vector<runtime::RequestParams> ps;
    for (int r = 0; r < 2; ++r) {
        runtime::RequestParams p = looping_request(r, type, 24);
        p.on_logits = [&rows, r](int32_t, std::span<const float> lg) {
            rows[r].emplace_back(lg.begin(), lg.end());
        };
        ps.push_back(std::move(p));
    }
    // One group: admitted in the same step, decoded together.
    const auto hs = e.submit_group(std::move(ps));
    std::vector<std::vector<float>> out;
    for (int r = 0; r < 2; ++r) {
        const runtime::RequestResult res = hs[size_t(r)]->wait();
        EXPECT_NE(res.finish_reason, "error") << res.error;
        if (type != runtime::DraftType::Off) {
            EXPECT_GT(res.draft_n, 0) << "no draft was made";
        }
        out.insert(out.end(), rows[r].begin(), rows[r].end());
    }
    return out;
}

std::string join(const std::vector<int32_t>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
    return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
    std::string path;
    bool nextn;
    runtime::DraftType draft;
};

void expect_bitwise(const Case& c, const std::vector<std::vector<bool>>& placements) {
    std::unique_ptr<gguf::File> f;
    std::unique_ptr<backend::Backend> be;
    auto ref = plain(c.path, c.nextn, f, be);
    const std::vector<float> ref_batch = batched(*ref);
    const auto ref_run = engine_run(*ref, c.draft);
    for (const std::vector<bool>& host : placements) {
        Hybrid h(c.path, host, c.nextn);
        ASSERT_GT(h.model->info().host_expert_blocks, 0) << "nothing moved";
        EXPECT_TRUE(same_bits(batched(*h.model), ref_batch)) << "batched logits differ";
        const auto run = engine_run(*h.model, c.draft);
        ASSERT_EQ(run.size(), ref_run.size());
        for (size_t i = 0; i < run.size(); ++i)
            ASSERT_TRUE(same_bits(run[i], ref_run[i])) << "emitted token " << i;
    }
}

std::vector<bool> blocks(std::initializer_list<int> on, size_t n) {
    std::vector<bool> v(n, false);
    for (int b : on) v[size_t(b)] = true;
    return v;
}

}  // namespace

TEST(HybridExperts, GlmDsaIsBitwiseThePlainRun) {
    // Block 2 (the first MoE block, --n-cpu-moe 3), a middle placement, and all of
    // them with the NextN block's (blocks 0..6; the NextN block drafts).
    expect_bitwise({kDsa, true, runtime::DraftType::Mtp},
                   {blocks({2}, 7), blocks({2, 3, 4}, 7), blocks({0, 1, 2, 3, 4, 5, 6}, 7)});
}

TEST(HybridExperts, Glm5NextIsBitwiseThePlainRun) {
    expect_bitwise({kNext, false, runtime::DraftType::Ngram},
                   {blocks({0, 1, 2}, 8), blocks({0, 1, 2, 3, 4, 5, 6, 7}, 8)});
}

TEST(HybridExperts, ExpertsMovedAfterLoadGiveTheSameBits) {
    std::unique_ptr<gguf::File> f;
    std::unique_ptr<backend::Backend> be;
    auto ref = plain(kDsa, false, f, be);
    Hybrid h(kDsa, {}, false);
    EXPECT_EQ(h.model->info().host_expert_blocks, 0);
    h.model->place_experts(blocks({3, 5}, 7));
    EXPECT_EQ(h.model->info().host_expert_blocks, 2);
    EXPECT_EQ(h.model->info().moe_blocks, 4);
    const std::vector<uint64_t> e = model::expert_bytes_by_block(*h.file);
    EXPECT_EQ(h.model->info().host_expert_bytes, e[3] + e[5]);
    EXPECT_TRUE(same_bits(batched(*h.model), batched(*ref)));
    // A model without an experts backend cannot move them.
    EXPECT_THROW(ref->place_experts(blocks({3}, 7)), Error);
}

TEST(HybridExperts, FlagsSelectWhatLlamaCppsSelect) {
    auto f = gguf::File::open(kDsa);
    // --n-cpu-moe counts dense blocks: 3 moves block 2 alone.
    EXPECT_EQ(model::first_expert_blocks(*f, 3), blocks({2}, 7));
    EXPECT_EQ(model::first_expert_blocks(*f, 0), blocks({}, 7));
    EXPECT_EQ(model::expert_blocks_from_overrides(*f, "exps=CPU"), blocks({2, 3, 4, 5, 6}, 7));
    EXPECT_EQ(model::expert_blocks_from_overrides(*f, "blk\\.(3|4)\\.ffn_.*_exps=CPU"),
              blocks({3, 4}, 7));
    EXPECT_EQ(
        model::expert_blocks_from_overrides(*f, "blk\\.2\\.ffn_.*_exps=CPU,blk\\.5\\..*exps=CPU"),
        blocks({2, 5}, 7));
    const std::vector<uint64_t> bytes = model::expert_bytes_by_block(*f);
    ASSERT_EQ(bytes.size(), 7u);
    EXPECT_EQ(bytes[0], 0u);
    EXPECT_GT(bytes[2], 0u);
    for (const char* bad :
         {"ffn_gate_exps=CPU", "attn=CPU", "exps=CUDA0", "nothing_here=CPU", "exps", "([=CPU"})
        EXPECT_THROW(model::expert_blocks_from_overrides(*f, bad), Error) << bad;
}

TEST(HybridExperts, TheCommandLineGivesThePlainBits) {
    const std::string args = "logits --model " + kDsa + " --tokens " +
                             join(random_ids(3, 19, 768), ",") + " --all --threads 2";
    const CliResult ref = run_glm5(args);
    ASSERT_EQ(ref.code, 0) << ref.err;
    for (const std::string place :
         {"--n-cpu-moe 3", "--n-cpu-moe 5", "--cpu-moe", "-ot exps=CPU"}) {
        const CliResult r = run_glm5(args + " --device cpu " + place);
        ASSERT_EQ(r.code, 0) << place << "\n" << r.err;
        EXPECT_EQ(r.out, ref.out) << place;
        EXPECT_NE(r.err.find("MoE blocks in system RAM"), std::string::npos) << r.err;
    }
    const CliResult three = run_glm5(args + " --device cpu --n-cpu-moe 3");
    EXPECT_NE(three.err.find("the routed experts of 1 of 4 MoE blocks"), std::string::npos)
        << three.err;
    // Greedy output with NextN drafts, every block's experts (the NextN block's too) in RAM.
    const std::string run = "run --model " + kDsa +
                            " --tokens 5,6,7,8,9,41,42,5,6,7,8,9 -n 24 "
                            "--temp 0 --print-ids --ignore-eos --threads 2 --spec";
    const CliResult a = run_glm5(run), b = run_glm5(run + " --device cpu --cpu-moe");
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(b.err.find("of 5 of 5 MoE blocks"), std::string::npos) << b.err;
}

// The device plan: the context is reserved first; a placement that does not fit is
// refused naming the smallest --n-cpu-moe that fits, which no flag chooses itself.
TEST(HybridExperts, DeviceMemoryDecidesTheSmallestPlacement) {
    // What the app plans for `logits` (one slot, llama.cpp's default context, ubatch 512).
    std::unique_ptr<gguf::File> f;
    std::unique_ptr<backend::Backend> be;
    auto m = plain(kDsa, false, f, be);
    runtime::PlanRequest pr;
    pr.n_ctx = std::min<int64_t>(m->info().n_ctx_train, 4096);
    const runtime::MemoryPlan p = runtime::make_plan(*m, pr, MemoryAvailable{}, 0, 0);
    const std::vector<uint64_t> e = model::expert_bytes_by_block(*f);
    uint64_t weights = 0;
    for (const gguf::TensorInfo& t : f->tensors())
        if (model::tensor_layer(t.name) < m->info().n_layer) weights += t.nbytes;
    const uint64_t context = p.caches + p.snapshots + p.scratch;
    // Between what --n-cpu-moe 4 and --n-cpu-moe 3 need: 4 is the smallest that fits.
    const uint64_t cap = weights - e[2] - e[3] + context + e[3] / 2;
    const std::string args = "logits --model " + kDsa +
                             " --tokens 1,2,3 --threads 2 --device cpu "
                             "--device-mem " +
                             std::to_string(cap);
    const CliResult automatic = run_glm5(args);
    ASSERT_EQ(automatic.code, 0) << automatic.err;
    EXPECT_NE(automatic.err.find("--n-cpu-moe 4, the smallest that fits"), std::string::npos)
        << automatic.err;
    const CliResult too_few = run_glm5(args + " --n-cpu-moe 3");
    EXPECT_EQ(too_few.code, 2) << too_few.err;
    EXPECT_NE(too_few.err.find("use --n-cpu-moe 4"), std::string::npos) << too_few.err;
    EXPECT_TRUE(too_few.out.empty());
    EXPECT_EQ(run_glm5(args + " --n-cpu-moe 5").code, 0);
    const CliResult none =
        run_glm5("logits --model " + kDsa + " --tokens 1 --device cpu --cpu-moe --device-mem 1M");
    EXPECT_EQ(none.code, 2);
    EXPECT_NE(none.err.find("even with every routed expert in system RAM"), std::string::npos)
        << none.err;
    // Flags that mean nothing or cannot work are refused with the reason.
    EXPECT_EQ(run_glm5("logits --model " + kDsa + " --tokens 1 --device-mem 1G").code, 2);
    EXPECT_EQ(
        run_glm5("logits --model " + kDsa + " --tokens 1 --device cuda", "", "GLM5_SIM_DEVICES=0")
            .code,
        2);
    const CliResult bad = run_glm5(args + " -ot attn_norm=CPU");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("not a routed expert"), std::string::npos) << bad.err;
    EXPECT_EQ(run_glm5(args + " --cpu-moe --n-cpu-moe 2").code, 2);
}

// The memory plan: state sizes match what states allocate, the automatic
// context is the largest that fits, a refusal's remedy fits, the engine keeps
// cache memory inside the pool, and after filling the whole planned context
// the process's peak anonymous memory matches the plan.
#include <malloc.h>

#include <fstream>
#include <regex>

#include "core/memory.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

// "VmHWM" minus the file-backed and shared pages resident now: the peak of
// anonymous memory, as long as the file pages (the mapped weights, the
// binary) have not shrunk since the peak.
uint64_t peak_anon() {
    std::ifstream f("/proc/self/status");
    std::string line;
    uint64_t hwm = 0, file = 0, shmem = 0;
    auto kb = [](const std::string& l) { return std::stoull(l.substr(l.find(':') + 1)) * 1024; };
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) hwm = kb(line);
        if (line.rfind("RssFile:", 0) == 0) file = kb(line);
        if (line.rfind("RssShmem:", 0) == 0) shmem = kb(line);
    }
    return hwm - file - shmem;
}

const char* kModels[] = {"glm-dsa/tiny.gguf", "glm5next/tiny.gguf"};

}  // namespace

TEST(MemoryPlan, StateCostIsWhatAStateAllocates) {
    for (const char* path : kModels)
        for (bool spec : {false, true})
            for (auto ct : {backend::CacheType::F16, backend::CacheType::F32}) {
                TestModel m(data_path(path), ct, 1, spec);
                const model::StateCost c = m.model->state_cost();
                EXPECT_GT(c.per_token, 0u) << path;
                for (int64_t cap : {1, 63, 256, 1000}) {
                    auto st = m.model->new_state(4096, cap);
                    EXPECT_EQ(st->capacity(), cap);
                    EXPECT_EQ(st->memory_bytes(), c.bytes(cap)) << path << " capacity " << cap;
                }
            }
}

TEST(MemoryPlan, ResizeKeepsTheStateAndForwardsNeverGrowIt) {
    for (const char* path : kModels) {
        TestModel m(data_path(path), backend::CacheType::F32, 2);
        const auto prompt = random_ids(3, 40, int32_t(m.n_vocab()));
        // Reference: one state that holds everything from the start.
        auto ref = m.model->new_state(128);
        std::vector<float> want, got;
        const std::span<const int32_t> a(prompt.data(), 30), b(prompt.data() + 30, 10);
        model::SeqInput in{ref.get(), a, false, false};
        m.model->forward({&in, 1}, want);
        in = {ref.get(), b, true, true};
        m.model->forward({&in, 1}, want);
        // Sized to the first part, resized up, then down to what it holds.
        auto st = m.model->new_state(128, 30);
        in = {st.get(), prompt, false, true};
        EXPECT_THROW(m.model->forward({&in, 1}, got), Error) << "past the capacity";
        EXPECT_EQ(st->n_past(), 0);
        in = {st.get(), a, false, false};
        m.model->forward({&in, 1}, got);
        EXPECT_THROW(st->resize(29), Error) << "below what it holds";
        st->resize(100);
        st->resize(40);
        in = {st.get(), b, true, true};
        m.model->forward({&in, 1}, got);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << path << " " << i;
    }
}

TEST(MemoryPlan, AutomaticContextIsTheLargestThatFits) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 2);
    runtime::PlanRequest r;
    r.n_slots = 3;
    r.ubatch = 256;
    for (uint64_t mib : {64, 200, 900}) {
        const MemoryAvailable a = simulated_memory(mib << 20);
        const uint64_t reserve = runtime::default_reserve(a, -1);
        const int64_t n = runtime::largest_context(*m.model, r, a, reserve, 1 << 20, 1 << 20);
        ASSERT_GT(n, 0) << mib;
        EXPECT_EQ(n % runtime::kContextStep, 0);
        r.n_ctx = n;
        EXPECT_TRUE(runtime::make_plan(*m.model, r, a, reserve, 1 << 20).fits()) << mib;
        r.n_ctx = n + runtime::kContextStep;
        EXPECT_FALSE(runtime::make_plan(*m.model, r, a, reserve, 1 << 20).fits())
            << mib << " MiB: one more step would fit too";
    }
    // The file's context caps it.
    const MemoryAvailable big = simulated_memory(uint64_t(64) << 30);
    EXPECT_EQ(runtime::largest_context(*m.model, r, big, 0, 0, 5000), 5000);
}

TEST(MemoryPlan, RefusalNamesRemediesThatFit) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F16, 2);
    const MemoryAvailable a = simulated_memory(uint64_t(300) << 20);
    runtime::PlanRequest r;
    r.n_slots = 4;
    r.n_ctx = 400000;
    r.ubatch = 512;
    const uint64_t reserve = runtime::default_reserve(a, -1);
    const runtime::MemoryPlan p = runtime::make_plan(*m.model, r, a, reserve, 0);
    ASSERT_FALSE(p.fits());
    const std::string msg = runtime::refusal(*m.model, p, true);
    EXPECT_NE(msg.find("300.00 MiB is available"), std::string::npos) << msg;
    std::smatch mm;
    ASSERT_TRUE(std::regex_search(msg, mm, std::regex("--ctx-size (\\d+)"))) << msg;
    runtime::PlanRequest fix = r;
    fix.n_ctx = std::stoll(mm[1]);
    EXPECT_TRUE(runtime::make_plan(*m.model, fix, a, reserve, 0).fits()) << msg;
    if (std::regex_search(msg, mm, std::regex("--parallel (\\d+)"))) {
        fix = r;
        fix.n_slots = std::stoi(mm[1]);
        EXPECT_TRUE(runtime::make_plan(*m.model, fix, a, reserve, 0).fits()) << msg;
    }
    if (std::regex_search(msg, mm, std::regex("--ubatch (\\d+)"))) {
        fix = r;
        fix.ubatch = std::stoll(mm[1]);
        EXPECT_TRUE(runtime::make_plan(*m.model, fix, a, reserve, 0).fits()) << msg;
    }
}

// Requests beyond what the pool holds wait; retained entries are evicted to
// make room and are kept at what they hold; every reply is the one alone.
TEST(MemoryPlan, EngineKeepsCacheMemoryInsideThePool) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 2);
    const model::StateCost c = m.model->state_cost();
    runtime::EngineOptions o;
    o.n_parallel = 4;
    o.n_ctx = 64;
    o.ubatch = 64;
    auto req = [&](int i) {
        runtime::RequestParams p;
        p.prompt = random_ids(uint32_t(i), 10 + 3 * i, int32_t(m.n_vocab()));
        p.max_tokens = 60;  // reaches the whole context
        p.sampling.temperature = 0;
        return p;
    };
    std::vector<std::vector<int32_t>> alone;
    {
        runtime::Engine e(*m.model, o);
        for (int i = 0; i < 4; ++i) alone.push_back(e.submit(req(i))->wait().tokens);
    }
    // Room for two full requests.
    o.cache_pool_bytes = 2 * c.bytes(64);
    runtime::Engine e(*m.model, o);
    size_t peak = 0;
    int max_busy = 0;
    std::vector<std::shared_ptr<runtime::Request>> rs;
    for (int i = 0; i < 4; ++i)
        rs.push_back(e.submit(req(i), [&](int32_t) {
            const runtime::EngineStats s = e.stats();
            peak = std::max(peak, s.cache_used_bytes);
            max_busy = std::max(max_busy, s.busy_slots);
            return true;
        }));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(rs[size_t(i)]->wait().tokens, alone[size_t(i)]) << i;
    EXPECT_LE(peak, o.cache_pool_bytes);
    EXPECT_EQ(max_busy, 2) << "the pool holds two requests at full context";
    EXPECT_EQ(e.stats().cache_pool_bytes, o.cache_pool_bytes);

    // Retained entries hold what their sequences hold, not what their
    // requests could have reached: one that stops early is shrunk.
    o.n_ctx = 512;
    o.cache_pool_bytes = 4 * c.bytes(512);
    runtime::Engine e2(*m.model, o);
    runtime::RequestParams early;
    early.prompt = random_ids(99, 10, int32_t(m.n_vocab()));
    early.max_tokens = 400;
    int n = 0;
    e2.submit(std::move(early), [&](int32_t) { return ++n < 3; })->wait();
    const runtime::EngineStats s = e2.stats();
    EXPECT_EQ(s.retained_entries, 1);
    EXPECT_EQ(s.retained_bytes, c.bytes(64));
    EXPECT_EQ(s.cache_used_bytes, c.bytes(64));
}

// After every slot has filled the whole planned context (its last micro-batch
// at full depth), the process's peak anonymous memory is the plan's within 5%.
TEST(MemoryPlan, FilledContextMatchesThePlan) {
    for (const char* path : kModels) {
        // F32 caches: the caches, not the activations, are most of the memory.
        TestModel m(data_path(path), backend::CacheType::F32, 2);
        runtime::PlanRequest r;
        r.n_slots = 2;
        // (glm5next's caches per token are smaller: more of them, so that the
        // caches and not the activations are most of what is measured.)
        r.n_ctx = std::string(path).rfind("glm5next", 0) == 0 ? 8192 : 4096;
        r.ubatch = 64;
        const MemoryAvailable a = available_memory();
        // Return freed heap to the system (a reused free page would not show
        // as growth), then restart the peak (VmHWM) from what is resident now.
        malloc_trim(0);
        std::ofstream("/proc/self/clear_refs") << "5";
        const runtime::MemoryPlan p = runtime::make_plan(*m.model, r, a, 0, rss_anon_bytes());
        runtime::EngineOptions o;
        o.n_parallel = r.n_slots;
        o.n_ctx = r.n_ctx;
        o.ubatch = r.ubatch;
        o.cache_pool_bytes = p.cache_pool();
        {
            runtime::Engine e(*m.model, o);
            std::vector<runtime::RequestParams> ps;
            for (int i = 0; i < r.n_slots; ++i) {
                runtime::RequestParams q;
                q.prompt = random_ids(uint32_t(50 + i), r.n_ctx - 1, int32_t(m.n_vocab()));
                q.max_tokens = 1;
                ps.push_back(std::move(q));
            }
            for (auto& q : e.submit_group(std::move(ps))) {
                const runtime::RequestResult res = q->wait();
                EXPECT_EQ(res.finish_reason, "length");
            }
            const uint64_t planned = p.needed() - p.weights_mapped;
            const uint64_t used = peak_anon();
            const double ratio = double(used) / double(planned);
            std::printf(
                "%s: peak anonymous %.1f MiB, planned %.1f MiB (caches %.1f, scratch %.1f, "
                "process %.1f): %.3f\n",
                path, double(used) / 1048576, double(planned) / 1048576, double(p.caches) / 1048576,
                double(p.scratch) / 1048576, double(p.process) / 1048576, ratio);
            EXPECT_GT(ratio, 0.95) << path;
            EXPECT_LT(ratio, 1.05) << path;
        }
    }
}

// A request whose max_tokens passes the context is sized to the context and
// ends there with "length" (the server refuses an explicit one beforehand).
TEST(MemoryPlan, GenerationStopsAtTheContext) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 2);
    runtime::EngineOptions o;
    o.n_parallel = 2;
    o.n_ctx = 64;
    o.cache_pool_bytes = 2 * m.model->state_cost().bytes(64);
    runtime::Engine e(*m.model, o);
    runtime::RequestParams p;
    p.prompt = random_ids(5, 50, int32_t(m.n_vocab()));
    p.max_tokens = 1000;
    const runtime::RequestResult r = e.submit(std::move(p))->wait();
    EXPECT_EQ(r.finish_reason, "length");
    // The 64 positions hold the prompt and 14 replies; the 15th reply token
    // is sampled from the last one and never needs a position.
    EXPECT_EQ(r.tokens.size(), 15u);
}

// The load policy as a library (runtime/placement.h): the experts a device leaves in
// system RAM and the context a machine holds, from numbers a test chooses; the command
// line's flags only fill them in.
#include <regex>

#include "core/error.h"
#include "model/moe.h"
#include "runtime/placement.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

runtime::DeviceRequest device(uint64_t cap) {
    runtime::DeviceRequest r;
    r.cap = cap;
    r.cap_text = "--device-mem " + std::to_string(cap);
    r.cap_named = true;
    r.context.n_ctx = 512;
    return r;
}

}  // namespace

// Without a placement of the operator's the fewest leading blocks move to RAM: a device
// of exactly what n blocks' experts in RAM leave gets n (or fewer, where the blocks
// before hold no experts), a byte less gets more, and less than the rest alone is refused.
TEST(Placement, TheSmallestNCpuMoeThatFitsTheDevice) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 1);
    const gguf::File& f = *m.file;
    const runtime::DevicePlacement all = runtime::place_experts(f, *m.model, device(0));
    EXPECT_EQ(all.host, model::first_expert_blocks(f, 0)) << "an unlimited device keeps all";
    EXPECT_EQ(all.how, "--n-cpu-moe 0, the smallest that fits");
    // The blocks the model loads (its trunk: the NextN block is not loaded here).
    std::vector<uint64_t> experts = model::expert_bytes_by_block(f);
    ASSERT_FALSE(m.model->info().nextn_loaded);
    experts.resize(size_t(m.model->info().n_layer));
    uint64_t need = all.device_weights + all.context_bytes;  // blocks 0 .. n-1 in RAM
    bool moved = false;
    for (size_t n = 0; n <= experts.size(); ++n) {
        if (n > 0) need -= experts[n - 1];
        if (n > 0 && experts[n - 1] == 0) continue;  // block n-1 has nothing to move
        const runtime::DevicePlacement p = runtime::place_experts(f, *m.model, device(need));
        EXPECT_EQ(p.host, model::first_expert_blocks(f, int64_t(n))) << "cap " << need;
        EXPECT_EQ(p.how, "--n-cpu-moe " + std::to_string(n) + ", the smallest that fits");
        EXPECT_EQ(p.device_weights + p.context_bytes, need);
        moved = moved || n > 0;
        if (n < experts.size()) {
            size_t next = n;  // the next block with experts decides what a byte less needs
            while (next < experts.size() && experts[next] == 0) ++next;
            if (next == experts.size()) continue;
            const runtime::DevicePlacement q =
                runtime::place_experts(f, *m.model, device(need - 1));
            EXPECT_EQ(q.host, model::first_expert_blocks(f, int64_t(next + 1))) << need - 1;
        }
    }
    EXPECT_TRUE(moved) << "the fixture has no routed experts";
    try {
        runtime::place_experts(f, *m.model, device(need - 1));
        FAIL() << "a device smaller than the model without its experts was given a placement";
    } catch (const ResourceError& e) {
        EXPECT_NE(std::string(e.what()).find("even with every routed expert"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("--device-mem"), std::string::npos) << e.what();
    }
}

// A placement of the operator's that does not fit is refused with the count that does.
TEST(Placement, AnOperatorsPlacementThatDoesNotFitNamesOneThatDoes) {
    TestModel m(data_path("glm-dsa/tiny.gguf"), backend::CacheType::F16, 1);
    const gguf::File& f = *m.file;
    const runtime::DevicePlacement all = runtime::place_experts(f, *m.model, device(0));
    // The blocks the model loads (its trunk: the NextN block is not loaded here).
    std::vector<uint64_t> experts = model::expert_bytes_by_block(f);
    ASSERT_FALSE(m.model->info().nextn_loaded);
    experts.resize(size_t(m.model->info().n_layer));
    // A device that needs every block's experts in RAM, asked to keep them all.
    uint64_t cap = all.device_weights + all.context_bytes;
    for (uint64_t e : experts) cap -= e;
    runtime::DeviceRequest none = device(cap);
    none.host.assign(experts.size(), false);
    none.how = "--n-cpu-moe 0";
    try {
        runtime::place_experts(f, *m.model, none);
        FAIL() << "a placement that does not fit was taken";
    } catch (const ResourceError& e) {
        const std::string want = "use --n-cpu-moe " + std::to_string(experts.size());
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("with --n-cpu-moe 0 the device needs"),
                  std::string::npos)
            << e.what();
    }
    // The operator's placement that fits is kept as given.
    runtime::DeviceRequest every = device(cap);
    every.host.assign(experts.size(), true);
    every.how = "--cpu-moe";
    const runtime::DevicePlacement p = runtime::place_experts(f, *m.model, every);
    EXPECT_EQ(p.how, "--cpu-moe");
    EXPECT_EQ(p.device_weights + p.context_bytes, cap);
}

// The context: what is asked when it fits (refused with a working remedy when not), the
// largest that fits when nothing is asked, at most 4096 where memory is unknown.
TEST(Placement, TheContextAMachineHolds) {
    TestModel m(data_path("glm5next/tiny.gguf"), backend::CacheType::F16, 1);
    runtime::MachineMemory mem;
    mem.avail = simulated_memory(uint64_t(300) << 20);
    mem.reserve = runtime::default_reserve(mem.avail, -1);
    runtime::ContextRequest r;
    r.n_slots = 2;
    r.asked = 1024;
    r.asked_by = "--ctx-size";
    runtime::ContextChoice c = runtime::choose_context(*m.model, r, mem);
    ASSERT_TRUE(c.refusal.empty()) << c.refusal;
    EXPECT_EQ(c.n_ctx, 1024);
    EXPECT_NE(c.summary.find("(--ctx-size;"), std::string::npos) << c.summary;
    EXPECT_EQ(c.cache_pool, c.plan.cache_pool());

    r.asked = 400000;
    c = runtime::choose_context(*m.model, r, mem);
    ASSERT_FALSE(c.refusal.empty());
    std::smatch mm;
    ASSERT_TRUE(std::regex_search(c.refusal, mm, std::regex("--ctx-size (\\d+)"))) << c.refusal;
    r.asked = std::stoll(mm[1]);
    EXPECT_TRUE(runtime::choose_context(*m.model, r, mem).refusal.empty()) << c.refusal;

    r.asked = 0;
    c = runtime::choose_context(*m.model, r, mem);
    ASSERT_TRUE(c.refusal.empty()) << c.refusal;
    EXPECT_GT(c.n_ctx, 0);
    EXPECT_TRUE(c.plan.fits());

    mem.avail = MemoryAvailable{};  // unknown
    c = runtime::choose_context(*m.model, r, mem);
    EXPECT_EQ(c.n_ctx, std::min<int64_t>(m.model->info().n_ctx_train, 4096));
    EXPECT_NE(c.summary.find("free memory is unknown"), std::string::npos) << c.summary;

    mem.avail = simulated_memory(uint64_t(1) << 20);  // too little for any context
    c = runtime::choose_context(*m.model, r, mem);
    EXPECT_FALSE(c.refusal.empty());
}

// One failing forward never takes other requests down, and never leaves a
// state behind that could be reused: faults injected into the backend (an
// allocation failing after the first KDA layer has run, a restore failing)
// end only the sequence that really fails; the others finish with the output
// they have when served alone.
#include <atomic>

#include "backend/cpu.h"
#include "runtime/engine.h"
#include "util_model.h"

using namespace glm5;
using namespace glm5::test;

namespace {

struct Injected : std::runtime_error {
    Injected() : std::runtime_error("injected fault") {}
};

// A model whose backend calls `hook` before every op.
struct FaultModel {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<model::Model> model;
    std::function<void(const char*, int64_t)> hook;
    explicit FaultModel(const std::string& path) {
        file = gguf::File::open(path);
        backend::CpuOptions bo;
        bo.n_threads = 2;
        be = backend::make_cpu_backend(bo);
        be->set_op_hook([this](const char* op, int64_t rows) {
            if (hook) hook(op, rows);
        });
        model::LoadOptions lo;
        lo.cache_type = backend::CacheType::F32;
        model = model::load_model(*file, *be, lo);
    }
};

std::vector<int32_t> prompt_of(int seed, int n) {
    std::vector<int32_t> p;
    uint32_t x = uint32_t(seed) * 2654435761u + 7u;
    for (int i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        p.push_back(int32_t(x % 300));
    }
    return p;
}

runtime::RequestParams request(const std::vector<int32_t>& prompt, int n) {
    runtime::RequestParams p;
    p.prompt = prompt;
    p.max_tokens = n;
    p.sampling.temperature = 0.8f;
    p.sampling.seed = uint64_t(prompt.size()) * 31 + uint64_t(prompt[0]);
    return p;
}

runtime::EngineOptions options() {
    runtime::EngineOptions eo;
    eo.n_parallel = 3;
    eo.n_ctx = 256;
    eo.ubatch = 64;
    return eo;
}

std::vector<int32_t> alone(model::Model& m, const std::vector<int32_t>& prompt, int n) {
    runtime::EngineOptions eo = options();
    eo.prefix_cache = false;
    runtime::Engine e(m, eo);
    return e.submit(request(prompt, n))->wait().tokens;
}

TEST(EngineFaults, AllocationFailingMidForwardFailsOnlyItsSequence) {
    FaultModel m(data_path("glm5next/tiny.gguf"));
    const auto a = prompt_of(1, 5), b = prompt_of(2, 6), d = prompt_of(3, 13);
    const auto a_alone = alone(*m.model, a, 12), b_alone = alone(*m.model, b, 12);

    // Any forward holding 13 rows or more (d's prompt) fails at its second
    // KDA layer, after the first one has written its new state.
    std::atomic<int> kda_calls{0}, injected{0};
    m.hook = [&](const char* op, int64_t rows) {
        if (std::string(op) == "embed") kda_calls = 0;
        if (std::string(op) == "gated_delta_rule" && ++kda_calls == 2 && rows >= 13) {
            ++injected;
            throw Injected();
        }
    };
    runtime::Engine e(*m.model, options());
    auto ra = e.submit(request(a, 12)), rb = e.submit(request(b, 12));
    auto rd = e.submit(request(d, 12));
    const auto res_d = rd->wait();
    EXPECT_EQ(res_d.finish_reason, "error");
    EXPECT_NE(res_d.error.find("injected"), std::string::npos) << res_d.error;
    EXPECT_EQ(ra->wait().tokens, a_alone);
    EXPECT_EQ(rb->wait().tokens, b_alone);
    EXPECT_GE(injected.load(), 2);  // the batch, then d alone
    m.hook = nullptr;
    // Nothing the failure touched is reused, and the engine goes on serving.
    EXPECT_EQ(e.submit(request(a, 12))->wait().tokens, a_alone);
    EXPECT_EQ(e.stats().requests_failed, 1u);
}

TEST(EngineFaults, FailedForwardOfADecodeBatchIsRetriedAndChangesNothing) {
    FaultModel m(data_path("glm5next/tiny.gguf"));
    const auto a = prompt_of(4, 7), b = prompt_of(5, 9);
    const auto a_alone = alone(*m.model, a, 16), b_alone = alone(*m.model, b, 16);
    // The first three two-row decode forwards fail after their first KDA layer.
    std::atomic<int> kda_calls{0}, left{3};
    m.hook = [&](const char* op, int64_t rows) {
        if (std::string(op) == "embed") kda_calls = 0;
        if (std::string(op) == "gated_delta_rule" && ++kda_calls == 2 && rows == 2 && left-- > 0)
            throw Injected();
    };
    runtime::Engine e(*m.model, options());
    auto ra = e.submit(request(a, 16)), rb = e.submit(request(b, 16));
    EXPECT_EQ(ra->wait().tokens, a_alone);
    EXPECT_EQ(rb->wait().tokens, b_alone);
    EXPECT_LE(left.load(), 0);
    EXPECT_EQ(e.stats().requests_failed, 0u);
}

TEST(EngineFaults, FailingRestoreEndsOnlyItsSequence) {
    FaultModel m(data_path("glm5next/tiny.gguf"));
    runtime::SpecParams spec;
    spec.type = runtime::DraftType::Ngram;
    spec.draft_max = 4;
    spec.adaptive = false;
    auto looping = [&](const std::vector<int32_t>& p) {
        runtime::RequestParams r = request(p, 30);
        r.sampling.temperature = 0;
        r.sampling.repeat_penalty = 0.2f;  // loops, so n-gram drafts get verified
        r.spec = spec;
        return r;
    };
    std::vector<int32_t> a;
    for (int i = 0; i < 3; ++i)
        for (int32_t t : {11, 12, 13, 14}) a.push_back(t);
    const auto b = prompt_of(6, 8);
    std::vector<int32_t> b_alone;
    {
        runtime::EngineOptions eo = options();
        eo.prefix_cache = false;
        runtime::Engine e(*m.model, eo);
        b_alone = e.submit(looping(b))->wait().tokens;
    }
    std::atomic<int> restores{0};
    m.hook = [&](const char* op, int64_t) {
        if (std::string(op) == "restore" && restores++ == 0) throw Injected();
    };
    runtime::Engine e(*m.model, options());
    auto ra = e.submit(looping(a)), rb = e.submit(looping(b));
    const auto res_a = ra->wait(), res_b = rb->wait();
    ASSERT_GE(restores.load(), 1);
    // Exactly one request met the failing restore; the other is untouched.
    const bool a_failed = res_a.finish_reason == "error";
    const bool b_failed = res_b.finish_reason == "error";
    EXPECT_NE(a_failed, b_failed);
    if (!b_failed) {
        EXPECT_EQ(res_b.tokens, b_alone);
    }
    EXPECT_NE((a_failed ? res_a : res_b).error.find("rollback failed"), std::string::npos);
    EXPECT_EQ(e.stats().requests_failed, 1u);
}

}  // namespace

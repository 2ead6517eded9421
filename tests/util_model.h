// Test helpers: open fixture models, run forwards, compare logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu.h"
#include "core/memory.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace glm5::test {

// A fixture: under GLM5_TEST_DATA in the environment when set (a test binary that runs
// away from this checkout: scripts/device-check.sh carries the fixtures its GPU tests
// read), else under the checkout's tests/data.
inline std::string data_path(const std::string& rel) {
    const char* dir = std::getenv("GLM5_TEST_DATA");
    return std::string(dir && *dir ? dir : GLM5_TEST_DATA) + "/" + rel;
}

inline nlohmann::json load_json(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path);
    return nlohmann::json::parse(f);
}

// n pseudo-random token ids below `vocab`, the same for the same seed.
inline std::vector<int32_t> random_ids(uint32_t seed, int64_t n, int64_t vocab) {
    std::vector<int32_t> p;
    uint32_t x = seed * 2654435761u + 7u;
    for (int64_t i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        p.push_back(int32_t((x >> 8) % uint32_t(vocab)));
    }
    return p;
}

struct TestModel {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<model::Model> model;

    TestModel(const std::string& path, backend::CacheType ct = backend::CacheType::F32,
              int threads = 2, bool spec = false, model::LayerRange layers = {},
              bool in_memory = false) {
        file = gguf::File::open(path);
        backend::CpuOptions bo;
        bo.n_threads = threads;
        be = backend::make_cpu_backend(bo);
        model::LoadOptions lo;
        lo.cache_type = ct;
        lo.load_nextn = spec;
        lo.layers = layers;
        lo.in_memory = in_memory;
        model = model::load_model(*file, *be, lo);
    }
    int64_t n_vocab() const { return model->info().n_vocab; }

    // Evaluates `tokens` in a fresh sequence as one batch; returns all rows.
    std::vector<float> batch_logits(const std::vector<int32_t>& tokens, bool all = true) {
        auto st = model->new_state(int64_t(tokens.size()) + 64);
        model::SeqInput in{st.get(), tokens, all};
        std::vector<float> lg;
        model->forward({&in, 1}, lg);
        return lg;
    }

    // Feeds `tokens` in chunks of `chunk` (1 = token by token); returns every row.
    std::vector<float> chunked_logits(const std::vector<int32_t>& tokens, size_t chunk) {
        auto st = model->new_state(int64_t(tokens.size()) + 64);
        std::vector<float> all, lg;
        for (size_t i = 0; i < tokens.size(); i += chunk) {
            const size_t n = std::min(chunk, tokens.size() - i);
            model::SeqInput in{st.get(), std::span<const int32_t>(tokens.data() + i, n), true};
            model->forward({&in, 1}, lg);
            all.insert(all.end(), lg.begin(), lg.end());
        }
        return all;
    }

    // Greedy continuation of n tokens after the prompt (no stop tokens).
    std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n) {
        auto st = model->new_state(int64_t(prompt.size()) + n + 8);
        std::vector<float> lg;
        model::SeqInput in{st.get(), prompt, false};
        model->forward({&in, 1}, lg);
        std::vector<int32_t> out;
        for (int i = 0; i < n; ++i) {
            out.push_back(runtime::argmax(lg));
            if (i + 1 == n) break;
            model::SeqInput next{st.get(), {&out.back(), 1}, false};
            model->forward({&next, 1}, lg);
        }
        return out;
    }
};

// The largest |a - b|; a NaN on either side counts as an infinite difference
// (std::max(d, NaN) would keep d and let a NaN pass any tolerance).
inline double max_abs_diff(const float* a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        const double e = std::fabs(double(a[i]) - double(b[i]));
        if (!(e <= d)) d = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
    }
    return d;
}

inline std::vector<float> to_floats(const nlohmann::json& j) {
    return j.get<std::vector<float>>();
}
inline std::vector<int32_t> to_ids(const nlohmann::json& j) {
    return j.get<std::vector<int32_t>>();
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
               uint32_t ux, uy;
               std::memcpy(&ux, &x, 4);
               std::memcpy(&uy, &y, 4);
               return ux == uy;
           });
}

// Sequences sharing one forward get every row's logits they get alone; then one decode
// step of all of them together (token next[i] each) equals each sequence's own forward.
// `what` names the case in failures.
inline void expect_batch_invariant(TestModel& m, const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<int32_t>& next, const std::string& what) {
    std::vector<std::vector<float>> alone;
    for (const auto& t : prompts) alone.push_back(m.batch_logits(t, true));
    std::vector<std::unique_ptr<model::SequenceState>> states;
    std::vector<model::SeqInput> ins;
    for (const auto& t : prompts) {
        states.push_back(m.model->new_state(128));
        ins.push_back({states.back().get(), t, true});
    }
    std::vector<float> lg;
    m.model->forward(ins, lg);
    size_t off = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<float> part(lg.begin() + long(off), lg.begin() + long(off + alone[i].size()));
        off += alone[i].size();
        EXPECT_TRUE(bitwise_equal(part, alone[i])) << what << " sequence " << i;
    }
    std::vector<model::SeqInput> step;
    for (size_t i = 0; i < prompts.size(); ++i)
        step.push_back({states[i].get(), {&next[i], 1}, false});
    m.model->forward(step, lg);
    const size_t V = size_t(m.n_vocab());
    for (size_t i = 0; i < prompts.size(); ++i) {
        auto t = prompts[i];
        t.push_back(next[i]);
        const auto solo = m.batch_logits(t, false);
        std::vector<float> part(lg.begin() + long(i * V), lg.begin() + long((i + 1) * V));
        EXPECT_TRUE(bitwise_equal(part, solo)) << what << " decode " << i;
    }
}

// A machine offering `bytes` to the memory plan.
inline MemoryAvailable simulated_memory(uint64_t bytes) {
    MemoryAvailable a;
    a.bytes = bytes;
    a.source = "test";
    return a;
}

// Request r of a pair decoded together in the speculation tests: a prompt that repeats a
// short loop (offset by r), greedy, with a repeat penalty so the reply loops too and drafts
// (`draft`, a fixed window of 4) can predict it.
inline runtime::RequestParams looping_request(int r, runtime::DraftType draft, int max_tokens) {
    runtime::RequestParams p;
    for (int rep = 0; rep < 3; ++rep)
        for (int32_t t : {5, 6, 7, 8, 9, 41, 42}) p.prompt.push_back(t + r);
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.sampling.repeat_penalty = 0.2f;
    runtime::SpecParams sp;
    sp.type = draft;
    sp.draft_max = 4;
    sp.adaptive = false;
    p.spec = sp;
    return p;
}

}  // namespace glm5::test

// Prefix reuse for agent clients: replays the shape of a Claude Code session's requests
// (Anthropic Messages bodies, converted and rendered as the server does) through one
// engine, and prints for each request the prefix it shares with what the engine has
// seen, the tokens the prefix cache served, and its time to first token against an
// engine that holds exactly that shared prefix already (prefilling only the new
// tokens: what a perfect cache achieves). Goals (issue 63): at least 90% of each
// shared prefix served, time to first token within 1.2x of the perfect cache's.
// Prints numbers; exits 0 whatever they are.
//
// usage: agent_replay MODEL [SYSTEM_WORDS] [THREADS] [ROUNDS]
//   MODEL          a GLM GGUF (glm-dsa or glm5next; bench/make_bench_models.sh)
//   SYSTEM_WORDS   words of system prompt (default 200: with the 24 tools about 5.7k tokens
//                  on the bench models' vocabulary)
//   THREADS        default: all cores
//   ROUNDS         replays, each request's median time printed (default 3)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "server/anthropic.h"
#include "server/openai_request.h"
#include "server/tool_constraint.h"
#include "text/chat.h"
#include "text/tokenizer.h"

using namespace glm5;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

// Deterministic prose: the same words on every run.
std::string words(uint32_t seed, int n) {
    static const char* kWords[] = {"the",     "file",    "tool", "agent",  "reads", "edits",
                                   "returns", "when",    "a",    "user",   "asks",  "for",
                                   "changes", "to",      "code", "always", "never", "output",
                                   "shell",   "command", "path"};
    std::string s;
    uint32_t x = seed * 2654435761u + 1u;
    for (int i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        s += kWords[(x >> 8) % (sizeof(kWords) / sizeof(kWords[0]))];
        s += (i % 17 == 16) ? ".\n" : " ";
    }
    return s;
}

ojson tools(int n) {
    ojson t = ojson::array();
    for (int i = 0; i < n; ++i)
        t.push_back({{"name", "Tool" + std::to_string(i)},
                     {"description", words(uint32_t(100 + i), 10)},
                     {"input_schema",
                      {{"type", "object"},
                       {"properties",
                        {{"path", {{"type", "string"}, {"description", words(uint32_t(i), 8)}}},
                         {"count", {{"type", "integer"}}}}},
                       {"required", {"path"}}}}});
    return t;
}

// The system blocks: the per-request billing header (which changes every request),
// then the long fixed prompt.
ojson system_blocks(const std::string& prompt, int request) {
    return ojson::array(
        {{{"type", "text"},
          {"text", "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=" +
                       std::to_string(1000 + request * 7919) + ";"}},
         {{"type", "text"}, {"text", prompt}}});
}

ojson user(const std::string& text, const std::string& reminder) {
    return {{"role", "user"},
            {"content",
             ojson::array({{{"type", "text"}, {"text", text}},
                           {{"type", "text"},
                            {"text", "<system-reminder>" + reminder + "</system-reminder>"}}})}};
}

struct Step {
    std::string what;
    ojson body;
};

// First turn, a tool round, a title request, a sub-agent, a retry of the tool round.
std::vector<Step> session(int system_words) {
    const std::string sys = words(7, system_words);
    const ojson all_tools = tools(24);
    auto body = [&](int request, ojson messages) {
        return ojson{{"model", "glm"},
                     {"max_tokens", 32000},
                     {"system", system_blocks(sys, request)},
                     {"tools", all_tools},
                     {"messages", std::move(messages)}};
    };
    std::vector<Step> s;
    const ojson u1 = user("Fix the failing test in src/parse.cpp. " + words(11, 60),
                          "today is Monday; todo list empty");
    s.push_back({"first turn", body(0, ojson::array({u1}))});
    const ojson a1 = {{"role", "assistant"},
                      {"content", ojson::array({{{"type", "text"}, {"text", "Reading the file."}},
                                                {{"type", "tool_use"},
                                                 {"id", "toolu_01"},
                                                 {"name", "Tool3"},
                                                 {"input", {{"path", "src/parse.cpp"}}}}})}};
    // The reminder moves to the newest user message.
    const ojson u1_plain = {{"role", "user"}, {"content", ojson::array({u1["content"][0]})}};
    const ojson r1 = {
        {"role", "user"},
        {"content",
         ojson::array(
             {{{"type", "tool_result"}, {"tool_use_id", "toolu_01"}, {"content", words(21, 100)}},
              {{"type", "text"},
               {"text", "<system-reminder>todo list: 1 item</system-reminder>"}}})}};
    s.push_back({"tool round", body(1, ojson::array({u1_plain, a1, r1}))});
    s.push_back({"title", ojson{{"model", "glm"},
                                {"max_tokens", 512},
                                {"system", "Write a 5-word title for this conversation."},
                                {"messages", ojson::array({user(u1["content"][0]["text"], "")})}}});
    s.push_back({"sub-agent",
                 body(3, ojson::array(
                             {user("Search the repository for callers of parse(). " + words(31, 40),
                                   "sub-agent")}))});
    s.push_back({"retry", body(4, ojson::array({u1_plain, a1, r1}))});
    return s;
}

size_t lcp(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

struct Timed {
    runtime::RequestResult result;
    double ttft = 0;
};

Timed run(runtime::Engine& e, runtime::RequestParams p) {
    Timed t;
    const auto t0 = Clock::now();
    bool first = true;
    auto r = e.submit(std::move(p), [&](int32_t) {
        if (first) t.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
        first = false;
        return true;
    });
    t.result = r->wait();
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL [SYSTEM_WORDS] [THREADS] [ROUNDS]\n", argv[0]);
        return 2;
    }
    const int system_words = argc > 2 ? std::atoi(argv[2]) : 200;
    const int rounds = argc > 4 ? std::max(1, std::atoi(argv[4])) : 3;
    backend::CpuOptions bo;
    bo.n_threads = argc > 3 ? std::atoi(argv[3]) : 0;
    auto file = gguf::File::open(argv[1]);
    auto be = backend::make_cpu_backend(bo);
    model::LoadOptions lo;
    lo.repack = lo.repack_if_fits = true;
    auto m = model::load_model(*file, *be, lo);
    auto tok = text::Tokenizer::from_gguf(*file);
    const text::ChatFormat format = text::ChatFormat::from_gguf(*file);

    server::ModelContext mc;
    mc.tok = tok.get();
    mc.format = &format;
    mc.id = "glm";
    mc.names = {"glm"};
    mc.n_ctx = 16384;
    mc.json_vocab = std::make_shared<const runtime::JsonVocab>(*tok);
    mc.tool_vocab = std::make_shared<const server::ToolVocab>(*tok);
    runtime::EngineOptions eo;
    eo.n_parallel = 1;
    eo.n_ctx = mc.n_ctx;
    eo.checkpoint_tokens = text::message_start_ids(*tok);

    std::vector<Step> steps = session(system_words);
    // The prompts as the server renders them; greedy replies of a fixed length.
    std::vector<std::vector<int32_t>> prompts;
    for (const Step& s : steps)
        prompts.push_back(
            server::parse_chat_request(server::anthropic::to_chat_body(s.body, false), mc)
                .prompts[0]
                .tokens);
    auto params = [](const std::vector<int32_t>& prompt) {
        runtime::RequestParams p;
        p.prompt = prompt;
        p.max_tokens = 8;
        p.sampling.temperature = 0;
        return p;
    };

    std::printf("%s: %s, %d system words, %d threads, %d rounds (medians)\n", argv[0], argv[1],
                system_words, bo.n_threads, rounds);
    // Each round replays the session in a fresh engine and times each request against a
    // fresh engine holding exactly its shared prefix (the perfect cache); rounds close in
    // time compare, and the median of each request's times is printed.
    const size_t n = prompts.size();
    std::vector<size_t> shared(n, 0);
    std::vector<int64_t> cached(n, 0);
    std::vector<std::vector<double>> ours(n), ideal(n);
    for (int round = 0; round < rounds; ++round) {
        runtime::Engine e(*m, eo);
        std::vector<std::vector<int32_t>> seen;  // what the engine evaluated of each request
        for (size_t i = 0; i < n; ++i) {
            const std::vector<int32_t>& prompt = prompts[i];
            size_t s = 0;
            for (const auto& h : seen) s = std::max(s, lcp(h, prompt));
            shared[i] = std::min(s, prompt.size() - 1);
            const Timed t = run(e, params(prompt));
            cached[i] = t.result.cached_tokens;
            ours[i].push_back(t.ttft);
            std::vector<int32_t> held = prompt;
            held.insert(held.end(), t.result.tokens.begin(), t.result.tokens.end() - 1);
            seen.push_back(std::move(held));
            runtime::Engine fresh(*m, eo);
            if (shared[i] > 0) {
                runtime::RequestParams pre = params(prompt);
                pre.prompt.resize(shared[i]);
                pre.prefill_only = true;
                fresh.submit(std::move(pre))->wait();
            }
            ideal[i].push_back(run(fresh, params(prompt)).ttft);
        }
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    std::printf("%-11s %7s %7s %7s %7s %9s %9s %6s\n", "request", "prompt", "shared", "cached",
                "served", "ttft_s", "ideal_s", "ratio");
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
        const double served = shared[i] ? double(cached[i]) / double(shared[i]) : 1.0;
        const double a = median(ours[i]), b = median(ideal[i]);
        ok = ok && served >= 0.9 && a <= 1.2 * b;
        std::printf("%-11s %7zu %7zu %7lld %6.1f%% %9.3f %9.3f %6.2f\n", steps[i].what.c_str(),
                    prompts[i].size(), shared[i], (long long)cached[i], 100 * served, a, b, a / b);
    }
    std::printf(
        "goals (>= 90%% of each shared prefix served, ttft <= 1.2x the perfect cache's): "
        "%s\n",
        ok ? "met" : "not met");
    return 0;
}

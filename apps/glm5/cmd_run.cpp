// glm5 run: generate from raw token ids (the chat front end comes with the text layer).
#include <chrono>
#include <cstdio>
#include <set>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/log.h"
#include "model_setup.h"
#include "runtime/sampler.h"

namespace glm5::app {

int cmd_run(int argc, char** argv) {
    Args a("run", "Generate tokens from raw ids.");
    add_model_flags(a, true);
    a.option("tokens", "IDS", "", "comma-separated prompt token ids");
    a.option("n-predict", "N", "16", "tokens to generate", "-n");
    a.option("temp", "T", "0.8", "temperature (0: greedy)");
    a.option("top-k", "K", "40", "top-k sampling (0: off)");
    a.option("top-p", "P", "0.95", "top-p sampling (1: off)");
    a.option("min-p", "P", "0.05", "min-p sampling (0: off)");
    a.option("repeat-penalty", "R", "1.0", "repetition penalty over the last 64 tokens (1: off)");
    a.option("seed", "N", "0", "sampling seed");
    a.option("ctx-size", "N", "4096", "context size in tokens", "-c");
    a.flag("print-ids", "print the generated ids on stdout, space separated");
    a.flag("ignore-eos", "never stop at end-of-generation tokens");
    if (!a.parse(argc, argv, 2)) return 0;
    if (!a.is_set("tokens")) throw UsageError("--tokens is required");
    const std::vector<int32_t> prompt = parse_token_list(a.get("tokens"), "tokens");
    const int64_t n_predict = a.get_int("n-predict", 0, 1 << 24);
    runtime::SamplerParams sp;
    sp.temperature = float(a.get_double("temp", 0.0, 100.0));
    sp.top_k = int32_t(a.get_int("top-k", 0, 1 << 30));
    sp.top_p = float(a.get_double("top-p", 0.0, 1.0));
    sp.min_p = float(a.get_double("min-p", 0.0, 1.0));
    sp.repeat_penalty = float(a.get_double("repeat-penalty", 0.0, 100.0));
    sp.seed = uint64_t(a.get_int("seed", 0, INT64_MAX));
    const int64_t n_ctx = a.get_int("ctx-size", 1, 1 << 24);

    LoadedModel m = open_model(a);
    std::set<int32_t> stop;
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"})
        if (const gguf::Value* v = m.file->find(k))
            if (auto u = v->as_uint()) stop.insert(int32_t(*u));
    if (int64_t(prompt.size()) + n_predict > n_ctx)
        throw UsageError("prompt (" + std::to_string(prompt.size()) +
                         ") + n-predict exceed --ctx-size " + std::to_string(n_ctx));

    auto st = m.model->new_state(n_ctx);
    runtime::Sampler sampler(sp);
    std::vector<int32_t> history = prompt, generated;
    std::vector<float> logits;
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    model::SeqInput in{st.get(), prompt, false};
    m.model->forward({&in, 1}, logits);
    auto t1 = clock::now();
    for (int64_t i = 0; i < n_predict; ++i) {
        const int32_t tok = sampler.sample(logits, history);
        generated.push_back(tok);
        history.push_back(tok);
        if (!a.get_flag("ignore-eos") && stop.count(tok)) break;
        if (i + 1 == n_predict) break;
        model::SeqInput next{st.get(), {&generated.back(), 1}, false};
        m.model->forward({&next, 1}, logits);
    }
    auto t2 = clock::now();
    if (a.get_flag("print-ids")) {
        std::string out;
        for (size_t i = 0; i < generated.size(); ++i)
            out += (i ? " " : "") + std::to_string(generated[i]);
        std::printf("%s\n", out.c_str());
    }
    const double pp = std::chrono::duration<double>(t1 - t0).count();
    const double tg = std::chrono::duration<double>(t2 - t1).count();
    log_info(
        "glm5: prompt %zu tokens in %.3f s (%.1f tok/s), generated %zu tokens in %.3f s (%.1f "
        "tok/s)\n",
        prompt.size(), pp, double(prompt.size()) / pp, generated.size(), tg,
        generated.size() > 1 ? double(generated.size() - 1) / tg : 0.0);
    return 0;
}

}  // namespace glm5::app

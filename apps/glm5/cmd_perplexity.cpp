// glm5 perplexity: a model's perplexity on a text, computed as llama.cpp's
// llama-perplexity computes it (text_chunks.h), with its figures in its format.
#include <chrono>
#include <climits>
#include <cstdio>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/log.h"
#include "model_setup.h"
#include "text_chunks.h"

namespace glm5::app {

namespace {

void declare_flags(Args& a) {
    add_model_flags(a, true);
    a.option("file", "FILE", "", "the text to evaluate ('-' for stdin)", "-f");
    a.option("ctx-size", "N", "512",
             "tokens per chunk; each chunk is evaluated from an empty context and its second "
             "half scored (llama.cpp's -c, whose default for perplexity is 512)",
             "-c");
    a.option("chunks", "N", "-1", "evaluate at most the first N chunks (-1: all)");
    a.option("batch-size", "N", "2048",
             "llama.cpp's -b: max(1, N / ctx-size) chunks are evaluated together (only speed "
             "depends on it)",
             "-b");
    a.option("ubatch", "N", "512", "the most tokens one forward takes, all chunks together", "-ub");
    a.alias("ubatch", "--ubatch-size");
    for (const char* t : {"--ppl-stride", "--kl-divergence", "--kl-divergence-base", "--hellaswag",
                          "--winogrande", "--multiple-choice"})
        a.refused(t, "only llama-perplexity's chunked perplexity is implemented here");
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
    Args a(
        "perplexity",
        "Perplexity of a model on a text, computed as llama.cpp's llama-perplexity does: the\n"
        "text is cut into chunks of --ctx-size tokens, each evaluated from an empty context,\n"
        "and the second half of each chunk is scored. Prints llama.cpp's figures on stdout:\n"
        "the running estimate after each chunk ([1]12.3456,[2]...) and the line\n"
        "\"Final estimate: PPL = X +/- Y\". A text shorter than two chunks is refused (exit 2).");
    declare_flags(a);
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.get("model").empty()) throw UsageError("--model is required");
    if (!a.is_set("file")) throw UsageError("--file is required: the text to evaluate");
    const int n_ctx = int(a.get_int("ctx-size", 3, INT_MAX / 2));
    const int n_chunks = int(a.get_int("chunks", -1, INT_MAX));
    if (n_chunks == 0) throw UsageError("--chunks must be at least 1 (or -1: all)");
    const int n_batch = int(a.get_int("batch-size", 1, INT_MAX));
    const int n_ubatch = int(a.get_int("ubatch", 1, INT_MAX));

    const ChunkPlan plan =
        plan_chunks(read_tokens(a.get("model"), a.get("file")), n_ctx, n_chunks, n_batch, n_ubatch);
    LoadedModel m = open_model(a);
    if (n_ctx > m.model->info().n_ctx_train)
        log_info("glm5 perplexity: the model was trained on only %lld context tokens (%d asked)\n",
                 (long long)m.model->info().n_ctx_train, n_ctx);
    log_info(
        "glm5 perplexity: calculating perplexity over %d chunks, n_ctx=%d, batch_size=%d, "
        "n_seq=%d (%zu tokens%s; forwards of at most %d)\n",
        plan.n_chunk, plan.n_ctx, plan.n_batch, plan.n_seq, plan.text.tokens.size(),
        plan.text.add_bos ? ", BOS first in each chunk" : "", plan.n_ubatch);

    const auto t0 = std::chrono::steady_clock::now();
    NllSums sums;
    score_chunks(*m.model, plan, m.threads, sums, [&](int chunk, const NllSums& s) {
        if (chunk == 0) {
            const double t =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            log_info("glm5 perplexity: %.2f seconds per pass - ETA %.2f minutes\n", t,
                     t * plan.n_chunk / plan.n_seq / 60.0);
        }
        std::fputs(ppl_progress(chunk, s).c_str(), stdout);
        std::fflush(stdout);
    });
    std::printf("\n%s\n", ppl_final(sums).c_str());
    return 0;
}

}  // namespace glm5::app

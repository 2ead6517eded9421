// glm5 imatrix: an importance matrix from a calibration text, as llama.cpp's llama-imatrix
// makes one (the same chunks as perplexity, every product's inputs squared and summed;
// quantize/imatrix.h), written in llama.cpp's GGUF or legacy form, resumable.
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/log.h"
#include "model_setup.h"
#include "quantize/imatrix.h"
#include "text_chunks.h"

namespace glm5::app {

namespace {

void declare_flags(Args& a) {
    add_model_flags(a, true);
    a.option("file", "FILE", "", "the calibration text", "-f");
    a.option("output", "FILE", "imatrix.gguf", "the importance matrix to write", "-o");
    a.option("output-format", "F", "auto",
             "gguf | dat (llama.cpp's legacy form) | auto (dat for a name ending in .dat)");
    a.option("ctx-size", "N", "512", "tokens per chunk (llama-imatrix's -c)", "-c");
    a.option("chunks", "N", "-1", "process at most N chunks (-1: all)");
    a.option("chunk", "N", "0", "skip the first N chunks of the text");
    a.option("batch-size", "N", "2048", "llama.cpp's -b: chunks evaluated together", "-b");
    a.option("ubatch", "N", "512", "the most tokens one forward takes", "-ub");
    a.option("output-frequency", "N", "10", "write the output every N chunks (and at the end)");
    a.option("save-frequency", "N", "0",
             "also keep a copy every N chunks, as OUTPUT.at_N (0: none)");
    a.option("in-file", "FILE", "",
             "add the statistics of an earlier importance matrix (repeatable; GGUF form)");
    a.flag("resume",
           "continue OUTPUT where a run over the same text stopped: its chunks are skipped and "
           "its statistics kept");
    a.flag("process-output", "collect output.weight's inputs too (llama-imatrix's flag)");
    a.flag("no-ppl", "do not print the perplexity of the chunks");
}

struct Run {
    const Args& a;
    quantize::ImatrixCollector collector;
    quantize::Imatrix base;  // --in-file and a resumed output
    std::string out;
    bool legacy = false;
    int n_done_before = 0;  // chunks of this text a resumed output had seen

    explicit Run(const Args& args) : a(args), collector(args.get_flag("process-output")) {}

    void take_earlier() {
        for (const std::string& f : a.get_all("in-file")) base.merge(quantize::Imatrix::read(f));
        if (!a.get_flag("resume") || !std::filesystem::exists(out)) return;
        quantize::Imatrix prev = quantize::Imatrix::read(out);
        if (prev.datasets.empty() || prev.datasets.back() != a.get("file"))
            throw UsageError(
                "--resume: " + out + " was not made from " + a.get("file") +
                " (its datasets: " + (prev.datasets.empty() ? "none" : prev.datasets.back()) + ")");
        if (prev.chunk_size != uint32_t(a.get_int("ctx-size", 3, INT_MAX / 2)))
            throw UsageError("--resume: " + out + " has chunks of " +
                             std::to_string(prev.chunk_size) + " tokens; give -c " +
                             std::to_string(prev.chunk_size));
        n_done_before = int(prev.chunk_count);
        prev.datasets.pop_back();  // this text's name is added again when it is saved
        base.merge(prev);
        log_info("glm5 imatrix: resuming %s after %d chunks\n", out.c_str(), n_done_before);
    }

    // The statistics so far (earlier files, then this run's), as they are written.
    // This run's sums are merged straight from the collector (not copied first: they are the
    // size of the matrices' columns, gigabytes for GLM-5.2), then its text and chunks.
    quantize::Imatrix snapshot(int chunks_done, uint32_t n_ctx) const {
        quantize::Imatrix m = base;
        m.merge(collector.data());
        quantize::Imatrix run;
        run.datasets = {a.get("file")};
        run.chunk_count = uint32_t(chunks_done);  // the resumed ones are in base
        run.chunk_size = n_ctx;
        m.merge(run);
        return m;
    }

    void save(const std::string& path, int chunks_done, uint32_t n_ctx) const {
        const quantize::Imatrix m = snapshot(chunks_done, n_ctx);
        if (legacy)
            m.write_legacy(path);
        else
            m.write_gguf(path);
    }
};

// The chunks after those skipped (--chunk, and a resumed run's).
ChunkPlan plan_for(const Args& a, int skip) {
    TextTokens t = read_tokens(a.get("model"), a.get("file"));
    const int n_ctx = int(a.get_int("ctx-size", 3, INT_MAX / 2));
    if (skip > 0) {
        if (size_t(skip + 2) * size_t(n_ctx) > t.tokens.size())
            throw UsageError("there will be not enough tokens left after removing " +
                             std::to_string(skip) + " chunks");
        t.tokens.erase(t.tokens.begin(), t.tokens.begin() + int64_t(skip) * n_ctx);
    }
    ChunkPlan p =
        plan_chunks(std::move(t), n_ctx, int(a.get_int("chunks", -1, INT_MAX)),
                    int(a.get_int("batch-size", 1, INT_MAX)), int(a.get_int("ubatch", 1, INT_MAX)));
    // The output matrix then sees every row, as llama-imatrix has it (it asks for every
    // row's logits), not only the scored half.
    p.logits_all = a.get_flag("process-output");
    return p;
}

}  // namespace

int cmd_imatrix(int argc, char** argv) {
    Args a("imatrix",
           "Compute an importance matrix over a calibration text, as llama.cpp's llama-imatrix\n"
           "does: the text in chunks of --ctx-size tokens, and for every matrix of the trunk the\n"
           "sum of each input column's squares over the rows it saw (per expert for the routed\n"
           "experts). The file is llama.cpp's: glm5 quantize and llama-quantize read it.\n"
           "Progress and the chunks' perplexity go to stderr. Runs on the CPU.");
    declare_flags(a);
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.get("model").empty()) throw UsageError("--model is required");
    if (!a.is_set("file")) throw UsageError("--file is required: the calibration text");
    Run run(a);
    run.out = a.get("output");
    const std::string fmt = a.get("output-format");
    if (fmt != "auto" && fmt != "gguf" && fmt != "dat")
        throw UsageError("--output-format must be gguf, dat or auto, got '" + fmt + "'");
    run.legacy = fmt == "dat" || (fmt == "auto" && run.out.size() > 4 &&
                                  run.out.compare(run.out.size() - 4, 4, ".dat") == 0);
    if (run.legacy && a.get_flag("resume"))
        throw UsageError("--resume needs the GGUF form (the legacy form keeps no chunk size)");
    run.take_earlier();
    const ChunkPlan plan = plan_for(a, int(a.get_int("chunk", 0, INT_MAX)) + run.n_done_before);
    const int out_freq = int(a.get_int("output-frequency", 1, INT_MAX));
    const int save_freq = int(a.get_int("save-frequency", 0, INT_MAX));

    LoadedModel m = open_model(a);
    m.backend->set_product_observer(&run.collector);
    log_info("glm5 imatrix: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=%d\n",
             plan.n_chunk, plan.n_ctx, plan.n_batch, plan.n_seq);
    const auto t0 = std::chrono::steady_clock::now();
    NllSums sums;
    const bool ppl = !a.get_flag("no-ppl");
    score_chunks(*m.model, plan, m.threads, sums, [&](int chunk, const NllSums& s) {
        const int done = chunk + 1, total = run.n_done_before + done;
        if (ppl) std::fputs(ppl_progress(chunk, s).c_str(), stderr);
        if (done == 1) {
            const double t =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            log_info("\nglm5 imatrix: %.2f seconds per pass - ETA %.2f minutes\n", t,
                     t * plan.n_chunk / plan.n_seq / 60.0);
        }
        if (total % out_freq == 0) run.save(run.out, done, uint32_t(plan.n_ctx));
        if (save_freq > 0 && total % save_freq == 0)
            run.save(run.out + ".at_" + std::to_string(total), done, uint32_t(plan.n_ctx));
    });
    m.backend->set_product_observer(nullptr);
    run.save(run.out, plan.n_chunk, uint32_t(plan.n_ctx));
    if (ppl) std::fprintf(stderr, "\n%s\n", ppl_final(sums).c_str());
    log_info("glm5 imatrix: %zu matrices, %d chunks, written to %s\n",
             run.collector.data().entries.size(), run.n_done_before + plan.n_chunk,
             run.out.c_str());
    std::printf("%s\n", run.out.c_str());
    return 0;
}

}  // namespace glm5::app

#include "model_setup.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/format.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace glm5::app {

namespace {

// Reads every tensor's pages into memory once, with a progress bar on a
// terminal: the weights stay file-backed, but the first token does not pay
// for the disk, and a big model's load is visible.
void load_pages(const gguf::File& f) {
    uint64_t total = 0;
    for (const auto& t : f.tensors()) total += t.nbytes;
    const bool bar = isatty(2) && total > (uint64_t(64) << 20);
    const long page = sysconf(_SC_PAGESIZE);
    uint64_t done = 0;
    int shown = -1;
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
        const uintptr_t b = uintptr_t(t.data) & ~uintptr_t(page - 1);
        ::madvise(reinterpret_cast<void*>(b), size_t(uintptr_t(t.data) + t.nbytes - b),
                  MADV_WILLNEED);
        for (size_t off = 0; off < t.nbytes; off += size_t(page)) sink = sink + t.data[off];
        done += t.nbytes;
        const int pct = total ? int(done * 100 / total) : 100;
        if (bar && pct != shown) {
            shown = pct;
            std::fprintf(stderr, "\rglm5: loading [%-40s] %3d%%",
                         std::string(size_t(pct * 40 / 100), '=').c_str(), pct);
        }
    }
    if (bar) std::fprintf(stderr, "\n");
}

}  // namespace

void add_model_flags(Args& a, bool model_required) {
    a.option("model", "FILE", model_required ? "" : "(embedded tiny model)",
             "GGUF model file (first shard of a split model)", "-m");
    a.option("threads", "N", std::to_string(ThreadPool::default_threads()), "CPU threads", "-t");
    a.option("cache-type", "TYPE", "f16",
             "attention cache type: f16 or f32 (MLA latent and indexer keys)");
    a.flag("spec",
           "speculative decoding: draft tokens and verify them in one forward (output identical "
           "to plain decoding; only faster when drafts are accepted)");
    a.option("spec-type", "T", "auto",
             "with --spec: mtp (the file's NextN/MTP block, glm-dsa), ngram (continue the "
             "longest recent match of the last tokens; no weights), or auto (mtp where the "
             "block exists, else ngram)");
    a.option("spec-draft", "N", "8", "with --spec: the largest draft window in tokens");
    a.option("spec-pmin", "P", "0.0",
             "with --spec: stop a NextN draft chain when the draft's probability falls below P");
    a.flag("spec-fixed",
           "with --spec: always draft the full window (no cost governor; for measurements)");
    a.flag("no-mmap",
           "copy the weights into memory instead of serving them from the file mapping "
           "(faster where file-backed pages are slow; needs RAM for the whole model)");
    a.flag("repack",
           "repack Q4_K/Q6_K/Q5_0/Q8_0 matrices at load into an interleaved layout for the "
           "AVX-512 VNNI GEMM (same results, faster; needs RAM for those weights, and is skipped "
           "when they would not fit)",
           true);
}

LoadedModel open_model(const Args& a, const std::string& path_override) {
    const std::string path = path_override.empty() ? a.get("model") : path_override;
    if (path.empty()) throw UsageError("--model is required");
    model::LoadOptions lo;
    const std::string& ct = a.get("cache-type");
    if (ct == "f16")
        lo.cache_type = backend::CacheType::F16;
    else if (ct == "f32")
        lo.cache_type = backend::CacheType::F32;
    else
        throw UsageError("--cache-type must be f16 or f32, got '" + ct + "'");
    runtime::SpecParams sp;
    if (a.get_flag("spec")) {
        try {
            sp.type = runtime::parse_draft_type(a.get("spec-type"));
        } catch (const Error& e) {
            throw UsageError(std::string("--spec-type: ") + e.what());
        }
        sp.draft_max = int(a.get_int("spec-draft", 1, runtime::VerifyCost::kMaxRows - 1));
        sp.p_min = float(a.get_double("spec-pmin", 0.0, 1.0));
        sp.adaptive = !a.get_flag("spec-fixed");
    }
    lo.load_nextn = sp.type == runtime::DraftType::Mtp || sp.type == runtime::DraftType::Auto;
    lo.in_memory = a.get_flag("no-mmap");
    lo.repack = a.get_flag("repack");
    lo.repack_if_fits = true;
    backend::BackendOptions bo;
    bo.n_threads = int(a.get_int("threads", 1, 1024));

    LoadedModel m;
    m.file = gguf::File::open(path);
    load_pages(*m.file);
    m.backend = backend::make_cpu_backend(bo);
    m.model = model::load_model(*m.file, *m.backend, lo);
    const model::ModelInfo& info = m.model->info();
    if (sp.type == runtime::DraftType::Mtp && !m.model->can_draft())
        throw Error("--spec-type mtp: " +
                    std::string(info.arch != "glm-dsa"
                                    ? info.arch + " drafts with --spec-type ngram only"
                                    : "this file has no loadable NextN/MTP block "
                                      "(use --spec-type ngram)"));
    if (sp.type == runtime::DraftType::Auto)
        sp.type = m.model->can_draft() ? runtime::DraftType::Mtp : runtime::DraftType::Ngram;
    m.spec = sp;
    std::string blocks = std::to_string(info.n_layer) + " trunk layers";
    if (info.has_nextn)
        blocks += m.model->can_draft() ? " +1 NextN/MTP draft block"
                                       : " (NextN block present but not loaded; --spec loads it)";
    log_info("glm5: %s: %s, %s, %s of weights, vocab %lld, %s cache, %d threads\n",
             info.name.c_str(), info.arch.c_str(), blocks.c_str(),
             human_bytes(double(info.weight_bytes)).c_str(), (long long)info.n_vocab, ct.c_str(),
             m.backend->n_threads());
    if (sp.type != runtime::DraftType::Off)
        log_info("glm5: speculative decoding: %s drafts, window up to %d%s\n",
                 runtime::draft_type_name(sp.type), sp.draft_max,
                 sp.adaptive ? " (chosen by the cost governor)" : " (fixed)");
    if (info.repacked_bytes)
        log_info("glm5: %s of weights repacked for the interleaved GEMM (--no-repack: as stored)\n",
                 human_bytes(double(info.repacked_bytes)).c_str());
    if (!info.repack_skipped.empty())
        log_info(
            "glm5: weights not repacked (%s): served from the file as stored, at lower "
            "speed\n",
            info.repack_skipped.c_str());
    return m;
}

std::string spec_summary(const runtime::RequestResult& r, runtime::DraftType type) {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "speculative: %s drafts, accepted %lld/%lld (%.1f%%), %lld verifies, %.2f tokens "
                  "per verify",
                  runtime::draft_type_name(type), (long long)r.draft_accepted, (long long)r.draft_n,
                  r.draft_n ? 100.0 * double(r.draft_accepted) / double(r.draft_n) : 0.0,
                  (long long)r.verifies,
                  r.verifies ? double(r.draft_accepted + r.verifies) / double(r.verifies) : 0.0);
    return buf;
}

std::vector<int32_t> parse_token_list(const std::string& s, const std::string& flag) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        std::string tok = s.substr(i, j - i);
        while (!tok.empty() && tok.front() == ' ') tok.erase(0, 1);
        while (!tok.empty() && tok.back() == ' ') tok.pop_back();
        char* end = nullptr;
        errno = 0;
        long v = std::strtol(tok.c_str(), &end, 10);
        if (tok.empty() || *end != '\0' || errno == ERANGE || v < 0 || v > INT32_MAX)
            throw UsageError("--" + flag + " expects comma-separated token ids, got '" + s + "'");
        ids.push_back(int32_t(v));
        i = j + 1;
    }
    if (ids.empty()) throw UsageError("--" + flag + " is empty");
    return ids;
}

}  // namespace glm5::app

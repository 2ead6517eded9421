#include "model_setup.h"

#include "gpu_setup.h"
#include "split_setup.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu.h"
#include "core/format.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/sha256.h"
#include "core/thread_pool.h"
#include "model/moe.h"
#include "quant/ops.h"
#include "runtime/placement.h"

namespace glm5::app {

// Reads every tensor's pages into memory once, with a progress bar on a
// terminal: the weights stay file-backed, but the first token does not pay
// for the disk, and a big model's load is visible.
void load_weight_pages(const gguf::File& f, const model::HeldLayers& held) {
    uint64_t total = 0;
    for (const auto& t : f.tensors())
        if (held.n_layer == 0 || held.holds(t.name)) total += t.nbytes;
    const bool bar = isatty(2) && total > (uint64_t(64) << 20);
    const long page = sysconf(_SC_PAGESIZE);
    uint64_t done = 0;
    int shown = -1;
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
        // A layer split: other processes' layers are never touched here.
        if (held.n_layer != 0 && !held.holds(t.name)) continue;
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

void add_model_flags(Args& a, bool model_required) {
    a.option("model", "FILE", model_required ? "" : "(embedded tiny model)",
             "GGUF model file (first shard of a split model)", "-m");
    a.option("threads", "N", std::to_string(ThreadPool::default_threads()), "CPU threads", "-t");
    a.option("cpu-strict", "0|1", "auto",
             "pin each worker thread to a CPU of its own (1), or let the system move them "
             "(0); auto pins when the threads fill the physical cores, in one process");
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
    a.flag("attn-bf16",
           "MLA attention and lightning-indexer products in BF16, on AMX tiles (CPUs with "
           "AMX-BF16) or AVX-512 BF16 dot products (CPUs without the tiles, e.g. AMD Zen 4/5): "
           "much faster deep in a context, but logits differ slightly from the exact path's "
           "(and between those two kinds of CPU); not with --spec, whose verification must be "
           "exact");
    a.flag("no-mmap",
           "copy the weights into memory instead of serving them from the file mapping "
           "(faster where file-backed pages are slow; needs RAM for the whole model)");
    a.flag("repack",
           "repack Q4_K/Q6_K/Q5_0/Q8_0 matrices at load into an interleaved layout for the "
           "AVX-512 VNNI GEMM (same results, faster; needs RAM for those weights, and is skipped "
           "when they would not fit)",
           true);
    a.option("layer-split", "N", "1",
             "run the model as N processes of whole layers each (start them with mpirun -np N; "
             "rank 0 does all input and output)");
    a.option("tp", "N", "1",
             "tensor parallelism: N processes (mpirun -np N) share every layer's attention "
             "heads and every routed expert's hidden units; the rest is replicated");
    a.option("layer-split-batches", "M", "0",
             "with --layer-split: cut each step's sequences into up to M micro-batches that "
             "follow each other through the ranks, so that the ranks work at the same time "
             "(0: as many as ranks; 1: one batch, the ranks take turns)");
    a.option("rank-timeout", "S", "120",
             "with --layer-split: seconds a rank may take for its part of one step before the "
             "job is ended, naming it");
    a.flag("mlock",
           "lock the weights (and everything else loaded) in RAM, so the system never pages "
           "them out (needs a memlock limit as large: ulimit -l)");
    // llama.cpp's command lines, as people already type them.
    a.ignored("-fa", true,
              "attention is always fused here (the exact path streams the cache "
              "in tiles); --attn-bf16 picks the BF16 form");
    a.ignored("--flash-attn", true,
              "attention is always fused here; --attn-bf16 picks the BF16 "
              "form");
    a.ignored("--jinja", false,
              "the GLM-5 chat format is built in (the GGUF's Jinja template is "
              "checked against it at load)");
    a.option("device", "NAME", "none",
             "what runs the model: none (the CPU), cuda or cuda:N (an NVIDIA GPU; "
             "refused with the reason where none is usable; its CUDA forward has not yet "
             "been checked on a GPU, so it runs only with GLM5_CUDA_FORWARD=1 in the "
             "environment), or cpu (a second CPU backend with its own memory stands in for a "
             "GPU, so that a placement of routed experts runs, and is checked bit for bit, on "
             "any machine)",
             "-dev");
    a.option("device-mem", "SIZE", "unlimited",
             "with --device: the device memory the plan places into (the weights not in system "
             "RAM, caches, scratch), e.g. 24G");
    a.flag("cpu-moe",
           "with --device: keep every block's routed experts in system RAM, computed by the "
           "CPU (llama.cpp's --cpu-moe)");
    a.option("n-cpu-moe", "N", "auto",
             "with --device: keep the routed experts of blocks 0..N-1 in system RAM (dense blocks "
             "count, as in llama.cpp); auto: the smallest N whose plan fits --device-mem",
             "-ncmoe");
    a.option("override-tensor", "PATTERN=CPU,...", "none",
             "with --device, llama.cpp's form: the tensors whose names PATTERN (a regular "
             "expression) matches stay in system RAM; whole sets of routed experts only "
             "(e.g. -ot exps=CPU)",
             "-ot");
    a.flag("no-moe-overlap",
           "with experts in system RAM: the device and the CPU take turns on each MoE layer "
           "(the CPU's routed experts after the device's shared expert) instead of working at "
           "once; the same bits, for measuring the overlap");
    a.option("n-gpu-layers", "N", "0",
             "llama.cpp's offload, as its users type it: 0 runs on the CPU; -1, all, or the "
             "layer count or more ask for the whole model on the GPU (without a GPU that runs "
             "the forward: a warning, and the CPU runs it); a count in between is refused: "
             "the partial offload here is --n-cpu-moe",
             "-ngl");
    for (const char* t : {"-hf", "--hf-repo", "-hfr", "-mu", "--model-url"})
        a.refused(t,
                  "glm5 downloads nothing: fetch the GGUF yourself (for example with "
                  "huggingface-cli download REPO FILE) and pass --model PATH");
}

void lock_in_memory(const Args& a) {
    if (!a.get_flag("mlock")) return;
    if (mlockall(MCL_CURRENT) != 0)
        throw Error(std::string("--mlock: cannot lock the loaded model in memory: ") +
                    std::strerror(errno) +
                    " (raise the memlock limit: ulimit -l unlimited, or LimitMEMLOCK=infinity "
                    "under systemd; or run without --mlock)");
    log_info("glm5: the loaded model is locked in memory (--mlock)\n");
}

backend::CacheType cache_type_from(const Args& a) {
    const std::string& ct = a.get("cache-type");
    if (ct == "f16") return backend::CacheType::F16;
    if (ct == "f32") return backend::CacheType::F32;
    throw UsageError("--cache-type must be f16 or f32, got '" + ct + "'");
}

namespace {

runtime::DeviceRequest device_request(const Args& a, const gguf::File& f, const model::Model& model,
                                      const runtime::SpecParams& sp, uint64_t cap,
                                      const std::string& cap_text);

// --spec and its settings (type Off without --spec).
runtime::SpecParams spec_from_flags(const Args& a) {
    runtime::SpecParams sp;
    if (!a.get_flag("spec")) return sp;
    try {
        sp.type = runtime::parse_draft_type(a.get("spec-type"));
    } catch (const Error& e) {
        throw UsageError(std::string("--spec-type: ") + e.what());
    }
    sp.draft_max = int(a.get_int("spec-draft", 1, runtime::VerifyCost::kMaxRows - 1));
    sp.p_min = float(a.get_double("spec-pmin", 0.0, 1.0));
    sp.adaptive = !a.get_flag("spec-fixed");
    return sp;
}

backend::CpuOptions cpu_options(const Args& a, const runtime::SpecParams& sp) {
    backend::CpuOptions bo;
    bo.n_threads = int(a.get_int("threads", 1, 1024));
    const std::string& strict = a.get("cpu-strict");
    if (strict == "0" || strict == "1")
        bo.pin_threads = strict == "1";
    else if (strict != "auto")
        throw UsageError("--cpu-strict must be 0, 1 or auto, got '" + strict + "'");
    bo.attention_bf16 = a.get_flag("attn-bf16");
    if (bo.attention_bf16 && sp.type != runtime::DraftType::Off)
        throw UsageError(
            "--attn-bf16 cannot be combined with --spec: drafts are verified on the exact path");
    return bo;
}

// Where the model runs, as the flags say it (each combination refused that does not work).
struct Placement {
    std::optional<int> gpu;  // --device cuda[:N], or llama.cpp's whole-model -ngl
    bool on_device = false;  // --device cpu: a CPU stand-in beside which experts stay in RAM
    int parts = 1, tp = 1;   // --layer-split, --tp
    bool split = false;      // several processes
    std::unique_ptr<gguf::File> file;  // opened for -ngl's layer count
};

Placement placement_from_flags(const Args& a, const std::string& path) {
    Placement w;
    w.parts = int(a.get_int("layer-split", 1, 4096));
    w.tp = int(a.get_int("tp", 1, 4096));
    if (w.parts > 1 && w.tp > 1)
        throw UsageError("--layer-split and --tp together are not supported yet: use one");
    const std::string& device = a.get("device");
    w.gpu = cuda_ordinal(device);
    if (device != "none" && device != "cpu" && !w.gpu)
        throw UsageError("--device " + device +
                         ": the devices are none (the CPU alone), cuda or cuda:N (a GPU) and cpu "
                         "(a CPU stand-in for a device)");
    if (w.gpu && (w.parts > 1 || w.tp > 1))
        throw UsageError("--device cuda does not combine with --layer-split or --tp yet");
    if (w.gpu) require_gpu(*w.gpu);
    if (a.get("n-gpu-layers") != "0") {
        w.file = gguf::File::open(path);
        const std::string arch = w.file->get_string("general.architecture");
        if (apply_gpu_layers(a.get("n-gpu-layers"),
                             int64_t(w.file->get_uint(arch + ".block_count"))) &&
            !w.gpu && w.parts == 1 && w.tp == 1)
            w.gpu = 0;
    }
    w.on_device = device == "cpu";
    w.split = w.parts > 1 || w.tp > 1 || (dist_launch() && launched_ranks() > 1);
    const int placements = int(a.get_flag("cpu-moe")) +
                           int(a.is_set("n-cpu-moe") && a.get("n-cpu-moe") != "auto") +
                           int(a.is_set("override-tensor"));
    if (placements > 1)
        throw UsageError(
            "--cpu-moe, --n-cpu-moe and --override-tensor each place the experts: "
            "give one");
    if (w.on_device && w.split)
        throw UsageError("--device does not combine with --layer-split or --tp yet: use one");
    if (!w.on_device && !w.gpu && a.is_set("device-mem"))
        throw UsageError("--device-mem sizes a device: give --device too");
    if (!w.on_device && !w.gpu && placements > 0)
        log_info(
            "glm5: --cpu-moe, --n-cpu-moe and --override-tensor place experts beside a device "
            "(--device); without one everything runs on the CPU already\n");
    return w;
}

// The device's memory: --device-mem, else a GPU's free memory less a margin for what the
// CUDA runtime takes beside the plan; the stand-in's is unlimited. Its text for messages.
std::pair<uint64_t, std::string> device_memory(const Args& a, const Placement& w) {
    const std::string& mem = a.get("device-mem");
    uint64_t cap = mem == "unlimited" ? 0 : parse_size(mem, "device-mem");
    std::string cap_text = cap ? "--device-mem " + mem : "unlimited memory";
    if (w.gpu && !cap) {
        constexpr uint64_t kMargin = uint64_t(512) << 20;
        const uint64_t free = gpu_free_bytes(*w.gpu);
        cap = free > kMargin ? free - kMargin : 1;
        cap_text = "the GPU's " + human_bytes(double(free)) + " free, less " +
                   human_bytes(double(kMargin));
    }
    return {cap, cap_text};
}

// One process: the model on the CPU, a GPU, or a stand-in device with experts in RAM.
void open_local(const Args& a, const std::string& path, model::LoadOptions lo,
                const backend::CpuOptions& bo, const runtime::SpecParams& sp, Placement& w,
                LoadedModel& m) {
    m.file = w.file ? std::move(w.file) : gguf::File::open(path);
    if (w.gpu) check_gpu_architecture(m.file->get_string("general.architecture"));
    load_weight_pages(*m.file, {});
    std::optional<runtime::DevicePlacement> placed;
    if (w.gpu || w.on_device) {
        const auto [cap, cap_text] = device_memory(a, w);
        // Planned on the file's views on a CPU backend (nothing copied, nothing
        // uploaded), so that experts kept in system RAM never reach the device.
        model::LoadOptions po = lo;
        po.in_memory = po.repack = false;
        const auto planner = backend::make_cpu_backend(bo);
        const auto planned = model::load_model(*m.file, *planner, po);
        placed = runtime::place_experts(*m.file, *planned,
                                        device_request(a, *m.file, *planned, sp, cap, cap_text));
    }
    const bool hybrid =
        placed && std::find(placed->host.begin(), placed->host.end(), true) != placed->host.end();
    if (w.gpu) {
        if (bo.attention_bf16)
            throw UsageError(
                "--attn-bf16 is the CPU's AMX attention: the GPU runs its exact attention");
        m.backend = open_gpu(*w.gpu);
        lo.repack = false;  // the GPU reads the GGUF blocks
    } else if (w.on_device) {
        // The stand-in device never pins (the CPU backend beside it may).
        backend::CpuOptions dev = bo;
        dev.pin_threads = 0;
        m.backend = backend::make_cpu_backend(dev);
    } else {
        m.backend = backend::make_cpu_backend(bo);
    }
    if (w.on_device || hybrid) {
        m.experts_backend = backend::make_cpu_backend(bo);
        lo.experts_backend = m.experts_backend.get();
        lo.host_experts = placed->host;
        lo.moe_overlap = !a.get_flag("no-moe-overlap");
    }
    m.model = model::load_model(*m.file, *m.backend, lo);
    if (!placed) return;
    const model::ModelInfo& li = m.model->info();
    log_info(
        "glm5: device %s%s: the routed experts of %lld of %lld MoE blocks in system RAM "
        "(%s, from the file mapping; %s); the device holds %s of weights and %s (of %s)\n",
        w.gpu ? m.backend->name().c_str() : a.get("device").c_str(),
        w.gpu ? "" : " (a CPU stand-in)", (long long)li.host_expert_blocks,
        (long long)li.moe_blocks, human_bytes(double(li.host_expert_bytes)).c_str(),
        placed->how.c_str(), human_bytes(double(placed->device_weights)).c_str(),
        placed->what.c_str(), placed->cap_text.c_str());
}

// The load banner: what was loaded, where it runs, what is on.
void log_loaded(const Args& a, const LoadedModel& m, const Placement& w,
                const backend::CpuOptions& bo) {
    const model::ModelInfo& info = m.model->info();
    const runtime::SpecParams& sp = m.spec;
    std::string blocks = std::to_string(info.n_layer) + " trunk layers";
    if (info.has_nextn)
        blocks += m.model->can_draft() ? " +1 NextN/MTP draft block"
                                       : " (NextN block present but not loaded; --spec loads it)";
    const std::string runs_on = w.gpu ? "on " + m.backend->name()
                                      : std::to_string(m.threads) + " threads, " +
                                            quant::cpu_level_name(quant::cpu_level()) + " kernels";
    log_info("glm5: %s: %s, %s, %s of weights, vocab %lld, %s cache, %s\n", info.name.c_str(),
             info.arch.c_str(), blocks.c_str(), human_bytes(double(info.weight_bytes)).c_str(),
             (long long)info.n_vocab, a.get("cache-type").c_str(), runs_on.c_str());
    if (bo.attention_bf16)
        log_info(
            "glm5: attention and indexer products in BF16 on %s (--attn-bf16: logits differ "
            "slightly from the exact path's)\n",
            quant::cpu_has_amx_bf16() ? "AMX tiles" : "AVX-512 BF16 dot products");
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
}

}  // namespace

LoadedModel open_model(const Args& a, const std::string& path_override) {
    const std::string path = path_override.empty() ? a.get("model") : path_override;
    if (path.empty()) throw UsageError("--model is required");
    model::LoadOptions lo;
    lo.cache_type = cache_type_from(a);
    runtime::SpecParams sp = spec_from_flags(a);
    lo.load_nextn = sp.type == runtime::DraftType::Mtp || sp.type == runtime::DraftType::Auto;
    lo.in_memory = a.get_flag("no-mmap");
    lo.repack = a.get_flag("repack");
    lo.repack_if_fits = true;
    const backend::CpuOptions bo = cpu_options(a, sp);

    LoadedModel m;
    Placement w = placement_from_flags(a, path);
    if (w.split)
        m = open_split_model(a, path, lo, bo, w.parts, w.tp);
    else
        open_local(a, path, lo, bo, sp, w, m);
    m.threads = bo.n_threads;
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
    lock_in_memory(a);
    log_loaded(a, m, w, bo);
    return m;
}

// "512", "64K", "512M", "2G" (powers of 1024) -> bytes.
size_t parse_size(const std::string& s, const std::string& flag) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    double mult = 1;
    std::string suffix = end ? std::string(end) : "";
    if (suffix == "K" || suffix == "k" || suffix == "KiB")
        mult = 1024.0;
    else if (suffix == "M" || suffix == "m" || suffix == "MiB")
        mult = 1024.0 * 1024;
    else if (suffix == "G" || suffix == "g" || suffix == "GiB")
        mult = 1024.0 * 1024 * 1024;
    else if (!suffix.empty())
        mult = -1;
    if (end == s.c_str() || errno || mult < 0 || !(v >= 0) || v * mult > 1e18)
        throw UsageError("--" + flag + " expects a size like 65536, 512K, 64M or 2G, got '" + s +
                         "'");
    return size_t(v * mult);
}

void add_context_flags(Args& a, const std::string& what) {
    a.option("ctx-size", "N", "0",
             "context " + (what.empty() ? "" : what + " ") +
                 "in tokens (prompt and reply); 0: the largest that fits in memory, up to the "
                 "GGUF's context_length ($MAX_CONTEXT when the flag is absent). Unlike "
                 "llama.cpp's -c, it is per slot, not the total across slots",
             "-c");
    a.option("ubatch", "N", "512", "most prompt tokens per forward, all slots together", "-ub");
    a.alias("ubatch", "--ubatch-size");
    a.option("mem-reserve", "SIZE", "auto",
             "memory the plan leaves to the rest of the machine (auto: 5% of what is available, "
             "256M to 4G)");
}

namespace {

int64_t requested_context(const Args& a);

}  // namespace

void requested_context_check(const Args& a) {
    (void)requested_context(a);
}

ContextRequest cli_context_request(int64_t ubatch, const runtime::SpecParams& spec) {
    ContextRequest r;
    r.ubatch = ubatch;
    r.draft_max = spec.type != runtime::DraftType::Off ? spec.draft_max : 0;
    return r;
}

namespace {

int64_t requested_context(const Args& a) {
    if (a.is_set("ctx-size")) return a.get_int("ctx-size", 0, int64_t(1) << 24);
    const char* e = std::getenv("MAX_CONTEXT");
    if (!e || !*e) return 0;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(e, &end, 10);
    if (*end != '\0' || errno || v < 0 || v > (1ll << 24))
        throw UsageError(
            std::string("MAX_CONTEXT must be a token count from 0 to 16777216, got '") + e + "'");
    return v;
}

// The device's side of a load as the flags say it: the experts the operator placed (if
// any), its memory, and the context it reserves.
runtime::DeviceRequest device_request(const Args& a, const gguf::File& f, const model::Model& model,
                                      const runtime::SpecParams& sp, uint64_t cap,
                                      const std::string& cap_text) {
    const model::ModelInfo& info = model.info();
    const int64_t blocks = info.n_layer + (info.nextn_loaded ? 1 : 0);
    runtime::DeviceRequest r;
    if (a.get_flag("cpu-moe")) {
        r.host = model::first_expert_blocks(f, blocks);
        r.how = "--cpu-moe";
    } else if (a.is_set("n-cpu-moe") && a.get("n-cpu-moe") != "auto") {
        const int64_t n = a.get_int("n-cpu-moe", 0, int64_t(1) << 20);
        r.host = model::first_expert_blocks(f, n);
        r.how = "--n-cpu-moe " + std::to_string(n);
    } else if (a.is_set("override-tensor")) {
        try {
            r.host = model::expert_blocks_from_overrides(f, a.get("override-tensor"));
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
        r.how = "--override-tensor " + a.get("override-tensor");
    }
    r.cap = cap;
    r.cap_text = cap_text;
    r.cap_named = a.is_set("device-mem");
    const int64_t asked = requested_context(a);
    r.context.n_ctx = asked > 0 ? asked : runtime::device_context(info.n_ctx_train);
    r.context.n_slots = a.declared("parallel") ? int(a.get_int("parallel", 1, 1024)) : 1;
    r.context.ubatch = a.declared("ubatch") ? a.get_int("ubatch", 1, int64_t(1) << 20) : 512;
    r.context.draft_max = sp.type != runtime::DraftType::Off ? sp.draft_max : 0;
    return r;
}

}  // namespace

ContextChoice plan_context(const Args& a, const model::Model& m, ContextRequest r) {
    runtime::MachineMemory mem;
    mem.avail = available_memory();
    mem.process = rss_anon_bytes();
    split_memory(m, mem.avail, mem.process);  // a layer split: the tightest rank's
    const std::string rf = a.get("mem-reserve");
    mem.reserve = runtime::default_reserve(
        mem.avail, rf == "auto" ? -1 : int64_t(parse_size(rf, "mem-reserve")));
    r.asked = requested_context(a);
    r.asked_by = a.is_set("ctx-size") ? "--ctx-size" : "MAX_CONTEXT";
    if (r.asked == 0 && a.declared("device") && a.get("device") != "none") {
        r.asked = runtime::device_context(m.info().n_ctx_train);
        r.asked_by = "what the device reserved";
    }
    const ContextChoice c = runtime::choose_context(m, r, mem);
    if (r.print_table) std::printf("%s", c.plan.table().c_str());
    if (!c.refusal.empty()) throw ResourceError(c.refusal);
    log_info("glm5: %s\n", c.summary.c_str());
    return c;
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

std::string model_fingerprint(const gguf::File& f, const std::string& cache_type) {
    std::string text;
    for (const auto& t : f.tensors()) {
        text += t.name + ' ' + std::to_string(int(t.type)) + ' ' + t.shape_string() + ' ' +
                std::to_string(t.shard) + ':' + std::to_string(t.offset) + '\n';
        // The first and last 256 bytes of each tensor tell two fine-tunes apart.
        const size_t n = std::min<size_t>(t.nbytes, 256);
        if (t.data && n) {
            text.append(reinterpret_cast<const char*>(t.data), n);
            text.append(reinterpret_cast<const char*>(t.data + t.nbytes - n), n);
        }
    }
    const Sha256 h = sha256({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    return "glm5 model " + to_hex(h) + ", cache " + cache_type;
}

}  // namespace glm5::app

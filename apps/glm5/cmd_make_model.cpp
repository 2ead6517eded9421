// glm5 make-model: write a synthetic model (random weights, real layout and
// storage types) with the library generator in src/synth/generator.h.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "progress.h"
#include "quantize/mix.h"
#include "synth/generator.h"
#include "synth/mmproj.h"

namespace glm5::app {

namespace {

using synth::GenOptions;
using synth::GlmDsaHParams;

struct DimFlag {
    const char* flag;
    const char* help;
    int64_t GlmDsaHParams::*field;
    int64_t min;
};

const DimFlag kDims[] = {
    {"n-vocab", "vocabulary size; ids past 767 are filler tokens BPE never emits",
     &GlmDsaHParams::n_vocab, 768},
    {"n-embd", "hidden size", &GlmDsaHParams::n_embd, 1},
    {"n-layer", "trunk layers (the NextN block comes on top)", &GlmDsaHParams::n_layer, 1},
    {"n-dense", "leading dense (SwiGLU) layers", &GlmDsaHParams::n_dense, 0},
    {"n-ff", "dense feed-forward width", &GlmDsaHParams::n_ff, 1},
    {"n-expert", "routed experts", &GlmDsaHParams::n_expert, 1},
    {"n-expert-used", "experts per token", &GlmDsaHParams::n_expert_used, 1},
    {"n-expert-shared", "shared experts", &GlmDsaHParams::n_expert_shared, 1},
    {"n-ff-exp", "expert feed-forward width", &GlmDsaHParams::n_ff_exp, 1},
    {"n-head", "attention heads", &GlmDsaHParams::n_head, 1},
    {"q-lora", "query LoRA rank", &GlmDsaHParams::q_lora, 1},
    {"kv-lora", "key/value latent rank (the MLA cache width)", &GlmDsaHParams::kv_lora, 1},
    {"qk-nope", "per-head query/key dims without rope", &GlmDsaHParams::qk_nope, 1},
    {"qk-rope", "per-head rope dims (<= indexer-dim)", &GlmDsaHParams::qk_rope, 2},
    {"v-head", "per-head value dims", &GlmDsaHParams::v_head, 1},
    {"indexer-heads", "lightning indexer heads", &GlmDsaHParams::idx_n_head, 1},
    {"indexer-dim", "indexer key length (a power of two >= 64)", &GlmDsaHParams::idx_head, 64},
    {"indexer-top-k", "keys each query attends to", &GlmDsaHParams::idx_top_k, 1},
    {"ctx", "training context length (glm-dsa.context_length)", &GlmDsaHParams::n_ctx_train, 1},
};

// "64 (tiny), 256 (small), 2048 (bench)"
std::string per_preset(int64_t GlmDsaHParams::*field) {
    std::string s;
    for (const auto& p : GlmDsaHParams::preset_names()) {
        if (!s.empty()) s += ", ";
        s += std::to_string(GlmDsaHParams::preset(p).*field) + " " + p;
    }
    return s;
}

std::vector<bool> parse_pattern(const std::string& s, int64_t n_layer) {
    if (s == "glm52") return synth::glm52_indexer_pattern(n_layer);
    std::vector<bool> v;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == ',') continue;
        if (s[i] != '0' && s[i] != '1')
            throw UsageError("--indexer-types expects 'glm52' or a list like 1,1,0,1, got '" + s +
                             "'");
        v.push_back(s[i] == '1');
    }
    return v;
}

// --arch mmproj: a random glm5next vision tower (model/gen_mmproj.h).
int make_mmproj(const Args& a) {
    auto hp = synth::MmprojHParams::preset(a.get("preset"));
    if (a.is_set("type")) {
        const std::string t = a.get("type");
        if (t == "F32")
            hp.type = quant::Type::F32;
        else if (t == "F16")
            hp.type = quant::Type::F16;
        else if (t == "BF16")
            hp.type = quant::Type::BF16;
        else
            throw UsageError("--arch mmproj: --type must be F32, F16 or BF16, got '" + t + "'");
    }
    const std::string out = a.get("output");
    if (out.empty()) throw UsageError("-o FILE is required");
    const int threads = a.is_set("threads") ? int(a.get_int("threads", 1, 1024)) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t bytes =
        synth::write_mmproj(hp, uint64_t(a.get_int("seed", 0, INT64_MAX)), out, threads, nullptr);
    if (!a.get_flag("quiet"))
        std::fprintf(stderr, "make-model: wrote %s: mmproj %s (%s matrices), %s in %.1f s\n",
                     out.c_str(), a.get("preset").c_str(), quant::name(hp.type), gib(bytes).c_str(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::printf("%s\n", out.c_str());
    return 0;
}

void declare_flags(Args& a, const std::string& types) {
    a.option("output", "FILE", "", "the GGUF file to write", "-o");
    a.option("preset", "NAME", "tiny",
             "glm-dsa: tiny | small (the test fixtures' shapes) | bench (GLM-5.2's proportions, "
             "~3 GB at Q4_K_M); glm5next: tiny (the fixture's shape) | bench (GLM-5.3-Flash's "
             "proportions, reading about as many weight bytes per decoded token as glm-dsa "
             "bench); mmproj: tiny | flash");
    a.option("arch", "NAME", "glm-dsa",
             "glm-dsa | glm5next (GLM-5.3-Flash: presets tiny and bench; of the dimension "
             "flags --n-head (KDA and MLA heads) and --n-ff-exp apply to it, the others and "
             "--indexer-types to glm-dsa only) | mmproj (a glm5next vision tower: preset "
             "tiny, the fixture's shape in F32, or flash, GLM-5.3-Flash's in BF16; --type F32, "
             "F16 or BF16 sets the matrices)");
    a.option("type", "T", "preset's: F32 tiny, F16 small, Q4_K_M bench",
             "a llama-quantize mix or a single type: " + types +
                 ". Mix names follow llama-quantize's per-tensor rules (Q2_K is the Q2_K mix);"
                 " Q3_K, Q4_K, Q5_K are single types");
    a.flag("pure",
           "give every matrix the named type (llama-quantize --pure); rows that cannot hold its "
           "blocks still fall back");
    a.option("seed", "N", "20260822",
             "random seed; every tensor's stream is derived from it and the tensor name");
    a.option("name", "TEXT", "", "general.name (none: a name from preset, type and seed)");
    a.option("imatrix", "MODE", "auto",
             "auto | on | off: quantize with importance vectors (auto: when the mix needs them, as"
             " the IQ1/IQ2/IQ3_XXS mixes do). They are derived, not measured: a matrix's input is"
             " an RMS-normed vector times a norm weight w, so E[x_j^2] ~ w_j^2 (1 where no norm"
             " precedes the matrix)");
    a.option("nextn-type", "T", "auto",
             "type of the NextN block's matrices: auto (Q4_K when the mix needs an imatrix, as"
             " llama.cpp users must since llama-imatrix skips that block), mix, or a type");
    a.option("blocks", "MODE", "auto",
             "exact | pool | auto: quantize every matrix's own samples (exact), or quantize one"
             " pool of 2^20 N(0, std) samples per (type, std) and fill matrices with randomly"
             " picked pool blocks: real quantizer output at copy speed, for large models"
             " (auto: pool for bench, exact otherwise)");
    a.option("threads", "N", "all cores", "threads for sampling and quantizing");
    for (const auto& d : kDims) a.option(d.flag, "N", per_preset(d.field), d.help);
    a.option("indexer-types", "LIST", "preset's; glm52 when --n-layer changes it",
             "full(1)/shared(0) indexer per trunk layer, e.g. 1,1,0,1, or glm52 (layers 0, 1, then "
             "every 4th from 2)");
    a.flag("nextn", "append the NextN/MTP block", true);
    a.flag("dry-run",
           "print the tensors (name, type, shape) and the weight bytes a decoded token reads to "
           "stdout and write nothing");
    a.flag("quiet", "no banner or progress on stderr");
}

// The architecture, its preset and the dimension flags that apply to it.
GenOptions arch_options(const Args& a) {
    GenOptions o;
    o.preset = a.get("preset");
    const std::string arch = a.get("arch");
    if (arch != "glm-dsa" && arch != "glm5next")
        throw UsageError("--arch must be glm-dsa, glm5next or mmproj, got '" + arch + "'");
    const bool next = arch == "glm5next";
    {
        const auto names =
            next ? synth::Glm5NextHParams::preset_names() : GlmDsaHParams::preset_names();
        if (std::find(names.begin(), names.end(), o.preset) == names.end()) {
            std::string list;
            for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
            throw UsageError("--preset for --arch " + arch + " must be one of " + list + ", got '" +
                             o.preset + "'");
        }
    }
    const bool with_nextn = a.get_flag("nextn");
    if (next) {
        // glm5next takes the head count (KDA and MLA alike) and the expert
        // width: the shapes tensor parallelism splits.
        for (const auto& d : kDims)
            if (a.is_set(d.flag) && d.field != &GlmDsaHParams::n_head &&
                d.field != &GlmDsaHParams::n_ff_exp)
                throw UsageError("--" + std::string(d.flag) +
                                 " applies to --arch glm-dsa only (glm5next takes --n-head and "
                                 "--n-ff-exp)");
        if (a.is_set("indexer-types"))
            throw UsageError("--indexer-types applies to --arch glm-dsa only");
        o.arch = synth::Arch::Glm5Next;
        o.glm5next = synth::Glm5NextHParams::preset(o.preset);
        if (a.is_set("n-head"))
            o.glm5next.kda_heads = o.glm5next.mla_heads = a.get_int("n-head", 1, int64_t(1) << 16);
        if (a.is_set("n-ff-exp")) o.glm5next.n_ff_exp = a.get_int("n-ff-exp", 1, int64_t(1) << 24);
        o.glm5next.n_nextn = with_nextn ? 1 : 0;
    } else {
        o.glm_dsa = GlmDsaHParams::preset(o.preset);
        const int64_t preset_layers = o.glm_dsa.n_layer;
        for (const auto& d : kDims)
            if (a.is_set(d.flag)) o.glm_dsa.*d.field = a.get_int(d.flag, d.min, int64_t(1) << 24);
        if (a.is_set("indexer-types"))
            o.glm_dsa.indexer_full = parse_pattern(a.get("indexer-types"), o.glm_dsa.n_layer);
        else if (o.glm_dsa.n_layer != preset_layers)
            o.glm_dsa.indexer_full = synth::glm52_indexer_pattern(o.glm_dsa.n_layer);
        o.glm_dsa.n_nextn = with_nextn ? 1 : 0;
    }
    return o;
}

// The storage: the type or mix, importance vectors, the NextN block's type, the blocks'
// source, the threads.
void storage_options(const Args& a, const std::string& types, GenOptions& o) {
    const bool next = o.arch == synth::Arch::Glm5Next;
    o.type = a.is_set("type") ? a.get("type")
             : next           ? synth::Glm5NextHParams::preset_default_type(o.preset)
                              : GlmDsaHParams::preset_default_type(o.preset);
    o.pure = a.get_flag("pure");
    if (!quantize::parse_scheme(o.type, o.pure))
        throw UsageError("--type: unknown type or mix '" + o.type + "' (one of: " + types + ")");
    o.seed = uint64_t(a.get_int("seed", 0, INT64_MAX));
    o.name = a.get("name");
    const std::string im = a.get("imatrix");
    if (im == "auto")
        o.imatrix = synth::ImatrixMode::Auto;
    else if (im == "on")
        o.imatrix = synth::ImatrixMode::On;
    else if (im == "off")
        o.imatrix = synth::ImatrixMode::Off;
    else
        throw UsageError("--imatrix must be auto, on or off, got '" + im + "'");
    o.nextn_type = a.get("nextn-type");
    const std::string bl = a.get("blocks");
    if (bl == "pool" || (bl == "auto" && o.preset == "bench"))
        o.blocks = synth::BlockSource::Pool;
    else if (bl == "exact" || bl == "auto")
        o.blocks = synth::BlockSource::Exact;
    else
        throw UsageError("--blocks must be exact, pool or auto, got '" + bl + "'");
    o.n_threads = a.is_set("threads") ? int(a.get_int("threads", 1, 1024)) : 0;
}

// --dry-run: the tensors, and one summary line (tools count the tensor lines above it).
void print_plan(const synth::ModelPlan& p, const GenOptions& o) {
    for (const auto& t : p.tensors) {
        std::string shape;
        for (int64_t n : t.ne) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
        std::printf("%-40s %-8s [%s]%s\n", t.name.c_str(), quant::name(t.type), shape.c_str(),
                    t.pooled ? " pooled" : "");
    }
    // One summary line: tools count the tensor lines above it.
    const synth::DecodeBytes d = synth::decode_bytes_per_token(o);
    std::printf(
        "# %zu tensors, %.3f G params, %s of tensor data; decode reads %.2f MB of weights "
        "per token (%.2f dense, %.2f routed experts, %.2f shared experts, %.2f head; the "
        "NextN block not counted)\n",
        p.tensors.size(), double(p.n_params) * 1e-9, gib(p.tensor_bytes).c_str(),
        double(d.total()) * 1e-6, double(d.dense) * 1e-6, double(d.routed) * 1e-6,
        double(d.shared) * 1e-6, double(d.head) * 1e-6);
}

// The file, with a banner and progress on stderr (a line a decile where it is no terminal).
void write_model(const GenOptions& o, const synth::ModelPlan& p, const std::string& out,
                 bool quiet) {
    const bool next = o.arch == synth::Arch::Glm5Next;
    const int threads = o.n_threads > 0 ? o.n_threads : ThreadPool::default_threads();
    if (!quiet) {
        std::string counts;
        for (const auto& [t, n] : p.type_counts) counts += " " + std::to_string(n) + " " + t;
        std::fprintf(
            stderr,
            "make-model: %s %s, type %s, seed %llu: %lld+%lld blocks, %.3f G params, "
            "%s;%s%s; %d threads\n",
            p.arch.c_str(), o.preset.c_str(), quantize::parse_scheme(o.type, o.pure)->name.c_str(),
            (unsigned long long)o.seed, (long long)(next ? o.glm5next.n_layer : o.glm_dsa.n_layer),
            (long long)(next ? o.glm5next.n_nextn : o.glm_dsa.n_nextn), double(p.n_params) * 1e-9,
            gib(p.tensor_bytes).c_str(), counts.c_str(),
            !p.imatrix                             ? ""
            : o.blocks == synth::BlockSource::Pool ? "; uniform imatrix (pool)"
                                                   : "; derived imatrix",
            threads);
    }

    const auto progress = byte_progress(quiet);
    const synth::GenResult r = synth::generate(o, out, progress);
    if (!quiet)
        std::fprintf(stderr, "make-model: wrote %s: %llu bytes (%s) in %.1f s\n", out.c_str(),
                     (unsigned long long)r.file_bytes, gib(r.file_bytes).c_str(), r.seconds);
}

}  // namespace

int cmd_make_model(int argc, char** argv) {
    std::string types;
    for (const auto& n : quantize::scheme_names()) types += (types.empty() ? "" : " ") + n;
    Args a("make-model",
           "Write a synthetic GLM model: deterministic random weights in the real glm-dsa or\n"
           "glm5next GGUF layout (metadata, tokenizer, tensor names and shapes) and real\n"
           "storage types.\n"
           "Weights are Irwin-Hall(12) normal samples times gain/sqrt(fan_in); the same flags\n"
           "give the same bytes on every machine. Progress goes to stderr; stdout gets the path.");
    declare_flags(a, types);
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.get("arch") == "mmproj") return make_mmproj(a);
    GenOptions o = arch_options(a);
    storage_options(a, types, o);
    const synth::ModelPlan p = synth::plan(o);  // validates everything
    if (a.get_flag("dry-run")) {
        print_plan(p, o);
        return 0;
    }
    const std::string out = a.get("output");
    if (out.empty()) throw UsageError("-o FILE is required");
    write_model(o, p, out, a.get_flag("quiet"));
    std::printf("%s\n", out.c_str());
    return 0;
}

}  // namespace glm5::app

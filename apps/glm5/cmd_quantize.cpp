// glm5 quantize: a GGUF in, a smaller GGUF out (llama-quantize's command line and rules,
// for glm-dsa, glm5next and their vision towers), streaming through src/quantize/.
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "progress.h"
#include "quantize/quantize_file.h"

namespace glm5::app {

namespace {

// "4G", "500M", "123456" -> bytes.
uint64_t parse_size(const std::string& s) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    double mul = 1;
    if (end && *end) {
        const std::string u = end;
        if (u == "K" || u == "k")
            mul = 1e3;
        else if (u == "M" || u == "m")
            mul = 1e6;
        else if (u == "G" || u == "g")
            mul = 1e9;
        else
            throw UsageError("--split-max-size: expected a size like 4G or 500M, got '" + s + "'");
    }
    if (!(v > 0)) throw UsageError("--split-max-size must be positive, got '" + s + "'");
    return uint64_t(v * mul);
}

void declare_flags(Args& a, const std::string& types) {
    a.positional("input", "the GGUF to read (the first shard of a split model)");
    a.positional("output", "the GGUF to write (a prefix for the shards with --split-max-*)");
    a.positional("type",
                 "a llama-quantize mix, a single type, or DYN-<type> (experts at <type>, the rest "
                 "kept high; docs/usage.md): " +
                     types);
    a.positional("nthreads", "threads (llama-quantize's place for it; --threads also works)",
                 false);
    a.option("imatrix", "FILE", "",
             "importance matrix (glm5 imatrix or llama-imatrix; GGUF or legacy .dat): the IQ1/IQ2 "
             "types and IQ3_XXS need one");
    a.option("tensor-type", "PATTERN=TYPE", "",
             "give tensors whose name matches the regex PATTERN this type (repeatable; the first "
             "match wins), e.g. 'ffn_down_exps=q4_k' or 'blk\\.3\\.=q4_K'");
    a.option("output-tensor-type", "T", "", "type of output.weight");
    a.option("token-embedding-type", "T", "", "type of token_embd.weight");
    a.flag("leave-output-tensor", "keep output.weight as it is stored");
    a.flag("allow-requantize",
           "accept an input that is already quantized (it loses more than "
           "quantizing the F16/BF16 original)");
    a.flag("pure",
           "every matrix gets TYPE (no per-layer rules; rows that cannot hold its blocks "
           "still fall back)");
    a.flag("dry-run", "print each tensor's type and size, and the totals; write nothing");
    a.option("split-max-size", "N", "", "write shards of at most N bytes of tensors (4G, 500M)");
    a.option("split-max-tensors", "N", "", "write shards of at most N tensors");
    a.flag("keep-split",
           "write the shards the input has: each output shard the tensors of the input's");
    a.option("threads", "N", "all cores", "threads converting rows");
    a.flag("quiet", "no banner or progress on stderr");
}

quantize::QuantizeOptions options(const Args& a, const gguf::File& in, quantize::Imatrix& im) {
    quantize::QuantizeOptions o;
    o.scheme = a.positional_value("type");
    o.pure = a.get_flag("pure");
    if (!quantize::parse_scheme(o.scheme, o.pure))
        throw UsageError("unknown type or mix '" + o.scheme +
                         "' (glm5 quantize --help lists them)");
    if (a.is_set("imatrix")) {
        im = quantize::Imatrix::read(a.get("imatrix"));
        o.imatrix = &im;
        o.imatrix_path = a.get("imatrix");
    }
    for (const std::string& s : a.get_all("tensor-type"))
        o.tensor_types.push_back(quantize::parse_type_override(s));
    if (a.is_set("output-tensor-type"))
        o.output_type =
            quantize::parse_weight_type(a.get("output-tensor-type"), "--output-tensor-type");
    if (a.get_flag("leave-output-tensor"))
        if (const gguf::TensorInfo* t = in.find_tensor("output.weight")) o.output_type = t->type;
    if (a.is_set("token-embedding-type"))
        o.embedding_type =
            quantize::parse_weight_type(a.get("token-embedding-type"), "--token-embedding-type");
    o.allow_requantize = a.get_flag("allow-requantize");
    if (a.has_positional("nthreads")) o.n_threads = int(std::stol(a.positional_value("nthreads")));
    if (a.is_set("threads")) o.n_threads = int(a.get_int("threads", 1, 1024));
    if (a.is_set("split-max-size")) o.split.max_bytes = parse_size(a.get("split-max-size"));
    if (a.is_set("split-max-tensors"))
        o.split.max_tensors = size_t(a.get_int("split-max-tensors", 1, INT32_MAX));
    if (a.get_flag("keep-split")) {
        if (o.split.max_bytes || o.split.max_tensors)
            throw UsageError("--keep-split and --split-max-* each set the shards: give one");
        // Each output shard holds the tensors of the input's shard of that number.
        for (size_t i = 0; i < in.tensors().size(); ++i)
            if (i == 0 || in.tensors()[i].shard != in.tensors()[i - 1].shard)
                o.split.starts.push_back(i);
        if (o.split.starts.size() < 2) o.split.starts.clear();
    }
    return o;
}

void print_plan(const quantize::QuantizePlan& p) {
    for (const quantize::TensorPlan& t : p.tensors)
        std::printf("%-44s %-16s %-7s -> %-7s %10.3f MiB -> %10.3f MiB%s%s%s\n", t.in->name.c_str(),
                    t.in->shape_string().c_str(), quant::name(t.in->type), quant::name(t.type),
                    double(t.in->nbytes) / (1 << 20), double(t.out_bytes) / (1 << 20),
                    t.imatrix ? " imatrix" : "", t.note.empty() ? "" : "  # ", t.note.c_str());
    std::printf(
        "# %zu tensors, %s -> %s (%.2f bits per weight), mix %s\n", p.tensors.size(),
        gib(p.in_bytes).c_str(), gib(p.out_bytes).c_str(),
        [&] {
            double n = 0;
            for (const auto& t : p.tensors) n += double(t.in->nelements());
            return n > 0 ? 8.0 * double(p.out_bytes) / n : 0.0;
        }(),
        p.scheme.name.c_str());
}

// The output must fit on its disk: refused with the numbers before anything is written.
void check_disk(const std::string& out, uint64_t bytes) {
    std::filesystem::path dir = std::filesystem::absolute(out).parent_path();
    struct statvfs s {};
    if (statvfs(dir.c_str(), &s) != 0) return;
    const uint64_t free_bytes = uint64_t(s.f_bavail) * uint64_t(s.f_frsize);
    if (free_bytes < bytes + (uint64_t(64) << 20))
        throw ResourceError("the output needs " + gib(bytes) + " and " + dir.string() + " has " +
                            gib(free_bytes) +
                            " free: write it to a larger disk, or choose a smaller type");
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
    std::string types;
    for (const auto& n : quantize::scheme_names()) types += (types.empty() ? "" : " ") + n;
    Args a("quantize",
           "Quantize a glm-dsa or glm5next GGUF (or a glm5next vision tower) to a smaller one,\n"
           "with llama-quantize's per-tensor rules and command line. It streams: memory stays\n"
           "near 32 MiB + 4 MiB per thread + the importance matrix, whatever the model's size.");
    declare_flags(a, types);
    if (!a.parse(argc, argv, 2)) return 0;
    const std::string in_path = a.positional_value("input");
    const auto in = gguf::File::open(in_path);
    quantize::Imatrix im;
    const quantize::QuantizeOptions o = options(a, *in, im);
    const quantize::QuantizePlan plan = quantize::plan_quantize(*in, o);
    const bool quiet = a.get_flag("quiet");
    if (a.get_flag("dry-run")) {
        print_plan(plan);
        return 0;
    }
    const std::string out = a.positional_value("output");
    if (std::filesystem::exists(out) && std::filesystem::equivalent(out, in_path))
        throw UsageError("the output would overwrite the input " + in_path);
    check_disk(out, plan.out_bytes);
    if (!quiet) {
        std::fprintf(stderr, "quantize: %s (%s, %s) -> %s as %s%s, %d threads\n", in_path.c_str(),
                     plan.arch.c_str(), gib(plan.in_bytes).c_str(), out.c_str(),
                     plan.scheme.name.c_str(),
                     o.imatrix ? (", imatrix " + o.imatrix_path).c_str() : "",
                     o.n_threads > 0 ? o.n_threads : ThreadPool::default_threads());
        for (const auto& t : plan.tensors)
            if (!t.note.empty())
                std::fprintf(stderr, "quantize: %s: %s\n", t.in->name.c_str(), t.note.c_str());
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto paths = quantize::write_quantized(*in, plan, o, out, byte_progress(quiet));
    if (!quiet) {
        struct rusage ru {};
        getrusage(RUSAGE_SELF, &ru);
        std::fprintf(stderr, "quantize: wrote %s (%zu file%s) in %.1f s, peak memory %s\n",
                     gib(plan.out_bytes).c_str(), paths.size(), paths.size() == 1 ? "" : "s",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                     gib(uint64_t(ru.ru_maxrss) * 1024).c_str());
    }
    for (const auto& p : paths) std::printf("%s\n", p.c_str());
    return 0;
}

}  // namespace glm5::app

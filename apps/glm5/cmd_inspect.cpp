// glm5 inspect FILE: a readable report of a GGUF file (architecture,
// hyperparameters, tokenizer, tensors). With --tensor NAME it prints only a
// JSON array of that tensor's first values, dequantized, in storage order.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "args.h"
#include "backend/cpu.h"
#include "commands.h"
#include "core/error.h"
#include "core/format.h"
#include "core/memory.h"
#include "gguf/gguf.h"
#include "model/layer_split.h"
#include "model_setup.h"
#include "quant/quant.h"
#include "split_setup.h"

namespace glm5::app {

namespace {

using gguf::File;
using gguf::Value;

void line(const std::string& label, const std::string& value, int indent = 0) {
    std::printf("%*s%-*s %s\n", indent, "", 22 - indent, label.c_str(), value.c_str());
}

std::string with_human(uint64_t bytes) {
    return std::to_string(bytes) + " (" + human_bytes(double(bytes)) + ")";
}

std::string human_count(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ull)
        std::snprintf(buf, sizeof(buf), "%.2f B", double(n) / 1e9);
    else if (n >= 1000000)
        std::snprintf(buf, sizeof(buf), "%.2f M", double(n) / 1e6);
    else if (n >= 1000)
        std::snprintf(buf, sizeof(buf), "%.2f K", double(n) / 1e3);
    else
        std::snprintf(buf, sizeof(buf), "%llu", (unsigned long long)n);
    return buf;
}

// "744 \"[gMASK]\"" for a special-token id key.
std::string token_ref(const File& f, const Value& id) {
    std::string s = id.to_display();
    const Value* tokens = f.find("tokenizer.ggml.tokens");
    const auto i = id.as_uint();
    if (tokens && tokens->is_array() && i && *i < tokens->size())
        s += " " + (*tokens)[size_t(*i)].to_display();
    return s;
}

void print_tokenizer(const File& f, std::set<std::string>& shown) {
    std::printf("\ntokenizer\n");
    auto show = [&](const std::string& key, const std::string& label, auto render) {
        const Value* v = f.find(key);
        if (!v) return;
        shown.insert(key);
        line(label, render(*v), 2);
    };
    auto plain = [](const Value& v) { return v.to_display(); };
    auto count = [](const Value& v) {
        return v.is_array() ? std::to_string(v.size()) : v.to_display();
    };
    bool any = false;
    for (const auto& kv : f.metadata()) any = any || kv.first.rfind("tokenizer.", 0) == 0;
    if (!any) {
        std::printf("  (none)\n");
        return;
    }
    show("tokenizer.ggml.model", "model", plain);
    show("tokenizer.ggml.pre", "pre", plain);
    show("tokenizer.ggml.tokens", "vocab size", count);
    show("tokenizer.ggml.merges", "merges", count);
    show("tokenizer.ggml.token_type", "token types", count);
    show("tokenizer.ggml.scores", "scores", count);
    for (const char* id :
         {"bos", "eos", "eot", "eom", "unknown", "padding", "seperator", "cls", "mask"})
        show(std::string("tokenizer.ggml.") + id + "_token_id", std::string(id) + " id",
             [&](const Value& v) { return token_ref(f, v); });
    const Value* tmpl = f.find("tokenizer.chat_template");
    shown.insert("tokenizer.chat_template");
    if (tmpl && tmpl->as_string())
        line("chat template", "present, " + std::to_string(tmpl->as_string()->size()) + " bytes",
             2);
    else
        line("chat template", tmpl ? "present (not a string)" : "absent", 2);
    // Whatever else the tokenizer carries (add_bos_token, extra templates...).
    for (const auto& [key, v] : f.metadata()) {
        if (key.rfind("tokenizer.", 0) != 0 || shown.count(key)) continue;
        shown.insert(key);
        line(key.substr(key.rfind("tokenizer.ggml.", 0) == 0 ? 15 : 10), v.to_display(), 2);
    }
}

void print_tensors(const File& f) {
    size_t wname = 4, wshape = 5;
    for (const auto& t : f.tensors()) {
        wname = std::max(wname, t.name.size());
        wshape = std::max(wshape, t.shape_string().size());
    }
    const bool shards = f.n_shards() > 1;
    std::printf("\ntensors\n  %-*s  %-*s  %-8s %14s%s\n", int(wname), "name", int(wshape), "shape",
                "type", "bytes", shards ? "  shard" : "");
    uint64_t params = 0, bytes = 0;
    std::map<std::string, int> per_type;
    for (const auto& t : f.tensors()) {
        std::printf("  %-*s  %-*s  %-8s %14zu", int(wname), t.name.c_str(), int(wshape),
                    t.shape_string().c_str(), quant::name(t.type), t.nbytes);
        if (shards) std::printf("  %5d", t.shard + 1);
        std::printf("\n");
        params += uint64_t(t.nelements());
        bytes += t.nbytes;
        ++per_type[quant::name(t.type)];
    }
    std::printf("\ntotals\n");
    line("tensors", std::to_string(f.tensors().size()), 2);
    line("parameters", std::to_string(params) + " (" + human_count(params) + ")", 2);
    line("tensor bytes", with_human(bytes), 2);
    std::string types;
    for (const auto& [name, n] : per_type)
        types += (types.empty() ? "" : ", ") + name + ": " + std::to_string(n);
    line("types", types, 2);
}

void print_report(const File& f) {
    if (f.n_shards() == 1) {
        line("file", f.path() + ", " + with_human(f.total_file_bytes()));
    } else {
        line("files",
             std::to_string(f.n_shards()) + " shards, " + with_human(f.total_file_bytes()));
        for (const auto& p : f.shard_paths()) line("", p);
    }
    line("gguf version", std::to_string(f.version()));
    line("alignment", std::to_string(f.alignment()));
    const std::string arch = f.get_string("general.architecture", "");
    line("architecture", arch.empty() ? "(none)" : arch);
    line("name", f.get_string("general.name", "(none)"));
    line("metadata keys", std::to_string(f.metadata().size()));

    std::set<std::string> shown = {"general.architecture", "general.name"};
    const std::string prefix = arch + ".";
    std::printf("\nhyperparameters (%s*)\n", prefix.c_str());
    size_t w = 0;
    for (const auto& kv : f.metadata())
        if (!arch.empty() && kv.first.rfind(prefix, 0) == 0)
            w = std::max(w, kv.first.size() - prefix.size());
    for (const auto& [key, v] : f.metadata()) {
        if (arch.empty() || key.rfind(prefix, 0) != 0) continue;
        shown.insert(key);
        std::printf("  %-*s  %s\n", int(w), key.c_str() + prefix.size(), v.to_display().c_str());
    }
    if (w == 0) std::printf("  (none)\n");

    print_tokenizer(f, shown);

    size_t wo = 0;
    for (const auto& kv : f.metadata())
        if (!shown.count(kv.first)) wo = std::max(wo, kv.first.size());
    if (wo > 0) std::printf("\nother metadata\n");
    for (const auto& [key, v] : f.metadata())
        if (!shown.count(key))
            std::printf("  %-*s  %s\n", int(wo), key.c_str(), v.to_display().c_str());
    print_tensors(f);
}

// The first n values of a tensor in storage order, dequantized row by row.
void print_values(const File& f, const std::string& name, uint64_t n) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) throw Error(f.path() + ": no tensor named '" + name + "'");
    n = std::min<uint64_t>(n, uint64_t(t->nelements()));
    std::vector<float> values;
    values.reserve(size_t(n));
    std::vector<float> row(size_t(t->ne[0]));
    const size_t row_bytes = t->row_bytes();
    for (int64_t r = 0; values.size() < n; ++r) {
        quant::dequantize_row(t->type, t->data + size_t(r) * row_bytes, row.data(), t->ne[0]);
        const size_t take = std::min<size_t>(row.size(), size_t(n) - values.size());
        values.insert(values.end(), row.begin(), row.begin() + ptrdiff_t(take));
    }
    std::string out = float_array_json(values.data(), values.size());
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
}

// With --layer-split N: the cut, and what each rank's host must have free
// for its part (its weights, its caches for the slots and context, scratch).
int print_split_plan(const Args& a, const gguf::File& f, backend::Backend& be,
                     const model::LoadOptions& lo, int parts, const runtime::PlanRequest& pr) {
    const model::SplitPlan sp =
        model::split_layers(f, be, lo, parts, pr.n_ctx * int64_t(pr.n_slots));
    const MemoryAvailable avail = available_memory();
    const std::string rf = a.get("mem-reserve");
    const uint64_t reserve =
        runtime::default_reserve(avail, rf == "auto" ? -1 : int64_t(parse_size(rf, "mem-reserve")));
    std::printf("layer split in %d ranks, balanced for %d slot%s x %lld tokens:\n", parts,
                pr.n_slots, pr.n_slots == 1 ? "" : "s", (long long)pr.n_ctx);
    std::printf(
        "| rank | holds | weights | caches | scratch | needs free (with the reserve) |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (int r = 0; r < parts; ++r) {
        model::LoadOptions part = lo;
        part.layers = sp.parts[size_t(r)].range;
        const auto pm = model::load_model(f, be, part);
        const runtime::MemoryPlan p = runtime::make_plan(*pm, pr, avail, reserve, 0);
        const model::ModelInfo& i = pm->info();
        const std::string holds = "layers " + std::to_string(i.layer_first) + "-" +
                                  std::to_string(i.layer_end - 1) +
                                  (i.holds_head ? " and the head" : "");
        std::printf("| %d | %s | %s | %s | %s | %s |\n", r, holds.c_str(),
                    human_bytes(double(p.weights_mapped + p.weights_copied)).c_str(),
                    human_bytes(double(p.caches)).c_str(), human_bytes(double(p.scratch)).c_str(),
                    human_bytes(double(p.needed() + p.reserve)).c_str());
    }
    if (avail.bytes)
        std::printf("(this machine has %s available: %s)\n",
                    human_bytes(double(avail.bytes)).c_str(), avail.source.c_str());
    return std::fflush(stdout) == 0 ? 0 : 1;
}

// The memory plan of a model file for a slot count and context, as serve or
// run would make it (the weights are mapped, not read).
int print_plan(const Args& a) {
    const int n_slots = int(a.get_int("parallel", 1, 1024));
    const int64_t ubatch = a.get_int("ubatch", 1, 1 << 16);
    const int draft = int(a.get_int("spec-draft", 0, runtime::VerifyCost::kMaxRows - 1));
    const uint64_t budget = parse_size(a.get("cache-budget"), "cache-budget");
    requested_context_check(a);
    model::LoadOptions lo;
    lo.cache_type = cache_type_from(a);
    lo.load_nextn = draft > 0;
    const auto f = gguf::File::open(a.positional_value("FILE"));
    auto be = backend::make_cpu_backend(backend::CpuOptions{});
    const int parts = int(a.get_int("layer-split", 1, 4096));
    if (parts > 1) {
        runtime::PlanRequest pr;
        pr.n_slots = n_slots;
        pr.ubatch = ubatch;
        pr.draft_max = draft;
        pr.retained = budget;
        pr.n_ctx = split_context(a);
        return print_split_plan(a, *f, *be, lo, parts, pr);
    }
    auto m = model::load_model(*f, *be, lo);
    ContextRequest r;
    r.n_slots = n_slots;
    r.ubatch = ubatch;
    r.draft_max = draft;
    r.retained = budget;
    r.can_change_slots = true;
    r.print_table = true;
    plan_context(a, *m, r);
    return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
    Args a("inspect",
           "Print a GGUF file's architecture, hyperparameters, tokenizer and tensors.\n"
           "With --tensor, print only a JSON array of that tensor's first values.");
    a.positional("FILE", "the GGUF file (first shard of a split model)");
    a.option("tensor", "NAME", "", "print the values of this tensor instead of the report");
    a.option("values", "N", "16",
             "with --tensor: how many values, in storage order, dequantized ('all' for every one)");
    a.flag("plan",
           "print the memory plan instead of the report: what the weights, caches, scratch and "
           "prefix cache of --parallel slots x --ctx-size tokens need, against available memory "
           "(exit 2 when it does not fit)");
    a.option("parallel", "N", "1", "with --plan: slots", "-np");
    add_context_flags(a, "per slot, with --plan");
    a.option("cache-type", "TYPE", "f16", "with --plan: attention cache type, f16 or f32");
    a.option("cache-budget", "SIZE", "0",
             "with --plan: prefix-cache budget (serve's --cache-budget)");
    a.option("spec-draft", "N", "0",
             "with --plan: the speculative window (0: no speculation; glm-dsa loads its NextN "
             "block)");
    a.option("layer-split", "N", "1",
             "with --plan: the cut of a layer split in N ranks and what each rank needs (the "
             "context is --ctx-size, or 4096)");
    if (!a.parse(argc, argv, 2)) return 0;
    if (a.get_flag("plan")) return print_plan(a);

    uint64_t n_values = 0;
    if (a.is_set("values") && !a.is_set("tensor")) throw UsageError("--values needs --tensor");
    if (a.get("values") == "all")
        n_values = std::numeric_limits<uint64_t>::max();
    else
        n_values = uint64_t(a.get_int("values", 0, std::numeric_limits<int64_t>::max()));
    if (a.is_set("tensor") && a.get("tensor").empty()) throw UsageError("--tensor needs a name");

    const auto f = gguf::File::open(a.positional_value("FILE"));
    if (a.is_set("tensor"))
        print_values(*f, a.get("tensor"), n_values);
    else
        print_report(*f);
    return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace glm5::app

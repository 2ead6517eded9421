#include "split_setup.h"

#include <cstdio>
#include <cstdlib>

#include "backend/cpu.h"
#include "core/format.h"
#include "core/log.h"
#include "core/sha256.h"
#include "model/layer_split.h"
#include "model_setup.h"
#ifdef GLM5_HAVE_MPI
#include "dist/comm.h"
#include "dist/split_model.h"
#endif

namespace glm5::app {

bool dist_launch() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

int launched_ranks() {
    const char* v = std::getenv("OMPI_COMM_WORLD_SIZE");
    return v ? std::atoi(v) : 0;
}

int64_t split_context(const Args& a) {
    const int64_t ctx = a.is_set("ctx-size") ? a.get_int("ctx-size", 0, int64_t(1) << 24) : 0;
    return ctx > 0 ? ctx : 4096;
}

int launched_rank() {
    const char* v = std::getenv("OMPI_COMM_WORLD_RANK");
    return v ? std::atoi(v) : 0;
}

#ifdef GLM5_HAVE_MPI

namespace {

// What must be the same on every rank: the file's size and its header (every
// metadata value and tensor record), hashed.
std::string file_identity(const gguf::File& f) {
    std::string h = std::to_string(f.total_file_bytes()) + "/" + std::to_string(f.n_shards());
    for (const auto& [k, v] : f.metadata()) h += "\n" + k + "=" + v.to_display(size_t(-1));
    for (const auto& t : f.tensors())
        h += "\n" + t.name + ":" + std::to_string(int(t.type)) + ":" + t.shape_string() + "@" +
             std::to_string(t.offset);
    return std::to_string(f.total_file_bytes()) + " bytes, header " +
           to_hex(sha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(h.data()),
                                                  h.size())))
               .substr(0, 16);
}

}  // namespace

LoadedModel open_split_model(const Args& a, const std::string& path, model::LoadOptions lo,
                             const backend::CpuOptions& bo, int parts, int tp) {
    const int world = launched_ranks();
    const bool tensor = tp > 1;
    const int degree = tensor ? tp : parts;
    const std::string flag = tensor ? "--tp" : "--layer-split";
    if (!dist_launch())
        throw UsageError(flag + " " + std::to_string(degree) +
                         " runs one process per rank: start it with mpirun -np " +
                         std::to_string(degree) + " glm5 ...");
    if (world != degree)
        throw UsageError("mpirun started " + std::to_string(world) + " processes but " + flag +
                         " is " + std::to_string(degree) +
                         ": they must be equal (mpirun -np N glm5 ... " + flag + " N)");
    dist::Comm& comm = dist::Comm::init(a.get_double("rank-timeout", 1, 86400));
    const int rank = comm.rank();

    LoadedModel m;
    std::string err;
    try {
        m.file = gguf::File::open(path);
    } catch (const Error& e) {
        err = e.what();
    }
    dist::agree(comm, err, "opening the model");
    dist::agree_identity(comm, file_identity(*m.file), "model file (size and header)");

    // Ranks may share a host: only a pin asked for pins, else every rank would pin its
    // workers to the same CPUs.
    backend::CpuOptions rank_bo = bo;
    if (rank_bo.pin_threads < 0) rank_bo.pin_threads = 0;
    m.backend = backend::make_cpu_backend(rank_bo);
    model::SplitPlan plan;
    if (tensor) {
        // Every rank holds every layer and its share of the heads and expert
        // strips; the partial sums meet in the reducer.
        static dist::TensorReducer reducer(comm);
        m.backend->set_reducer(&reducer);
        lo.tp_rank = rank;
        lo.tp_size = tp;
    } else {
        try {
            plan = model::split_layers(*m.file, *m.backend, lo, parts, split_context(a));
        } catch (const Error& e) {
            err = e.what();
        }
        dist::agree(comm, err, "splitting the layers");
        lo.layers = plan.parts[size_t(rank)].range;
    }
    try {
        // A layer split pages in its own layers; under TP pages fault in as
        // read, so a rank's resident weights are what it reads.
        if (!tensor) load_weight_pages(*m.file, model::resolve_layers(lo, plan.n_layer, path));
        m.model = model::load_model(*m.file, *m.backend, lo);
    } catch (const Error& e) {
        err = e.what();
    }
    dist::agree(comm, err, "loading");

    // The banner: what this rank holds, its caches and memory.
    const model::ModelInfo& info = m.model->info();
    std::string holds;
    if (tensor) {
        const bool split_ff = info.ff_end - info.ff_first < info.n_ff_exp;
        const std::string experts =
            info.n_ff_exp == 0 ? ""
            : split_ff         ? ", hidden units " + std::to_string(info.ff_first) + "-" +
                             std::to_string(info.ff_end - 1) + " of every routed expert"
                       : ", every expert whole (its " + std::to_string(info.n_ff_exp) +
                             " hidden units cannot be cut in " + std::to_string(tp) +
                             " strips of whole quant blocks: exact, slower)";
        holds = "attention heads " + std::to_string(info.head_first) + "-" +
                std::to_string(info.head_end - 1) + " of every layer" + experts +
                " (tensor parallel; indexer, router, shared expert, dense layers, norms, "
                "embedding and head replicated), " +
                human_bytes(double(info.weight_bytes)) + " of weights in the file";
    } else {
        holds = plan.describe(size_t(rank)) + "; " + human_bytes(double(info.skipped_bytes)) +
                " of weights read by other ranks";
    }
    const MemoryAvailable avail = available_memory();
    log_info("glm5: rank %d/%d: %s; caches %s per token; %s available here\n", rank, degree,
             holds.c_str(), human_bytes(double(m.model->state_cost().per_token)).c_str(),
             avail.bytes ? human_bytes(double(avail.bytes)).c_str() : "unknown");
    const auto ranks = dist::exchange_rank_info(
        comm, dist::describe_rank(*m.model, avail.bytes, rss_anon_bytes()));
    if (rank != 0) std::exit(dist::serve_rank(comm, *m.model, tensor));
    const int batches = int(a.get_int("layer-split-batches", 0, 1024));
    m.model = std::make_unique<dist::SplitModel>(comm, std::move(m.model), ranks,
                                                 batches > 0 ? batches : parts, tensor);
    return m;
}

void split_memory(const model::Model& m, MemoryAvailable& avail, uint64_t& process) {
    if (auto* s = dynamic_cast<const dist::SplitModel*>(&m)) {
        avail = {};
        process = 0;
        s->worst_memory(avail, process);
    }
}

bool is_split(const model::Model& m) {
    return dynamic_cast<const dist::SplitModel*>(&m) != nullptr;
}

void split_reset_counters(model::Model& m) {
    if (auto* s = dynamic_cast<dist::SplitModel*>(&m)) s->counters(true);
}

std::string split_rank_table(model::Model& m, double tokens, double tps) {
    auto* s = dynamic_cast<dist::SplitModel*>(&m);
    if (!s || tokens <= 0) return "";
    const auto all = s->counters(false);
    std::string out =
        "\nlayer split, per rank and decoded token (exchanges: messages sent and received; rank 0 "
        "waits for the others' work too):\n"
        "| rank | layers | weights read | exchanged | messages | waiting on exchanges |\n"
        "| ---: | --- | ---: | ---: | ---: | ---: |\n";
    for (size_t r = 0; r < all.size(); ++r) {
        const dist::RankInfo& ri = s->ranks()[r];
        const dist::CommStats& c = all[r].comm;
        char buf[512];
        std::snprintf(
            buf, sizeof(buf), "| %zu | %lld-%lld%s | %s | %s | %.1f | %.3f ms |\n", r,
            (long long)ri.layer_first, (long long)ri.layer_end - 1, ri.head ? " + head" : "",
            human_bytes(double(all[r].weight_bytes) / tokens).c_str(),
            human_bytes(double(c.bytes_sent + c.bytes_received) / tokens).c_str(),
            double(c.messages_sent + c.messages_received) / tokens, 1e3 * c.seconds / tokens);
        out += buf;
    }
    // Over a real network every exchange of the measured run costs a
    // message latency plus its bytes at the link's rate, all on the critical
    // path (an upper bound on the time: micro-batches overlap some of it).
    double msgs = 0, bytes = 0;
    for (const auto& c : all) {
        msgs += double(c.comm.messages_sent) / tokens;
        bytes += double(c.comm.bytes_sent) / tokens;
    }
    struct Link {
        const char* name;
        double bits_per_s, latency_s;
    };
    const Link links[] = {
        {"1 Gb/s", 1e9, 50e-6}, {"10 Gb/s", 10e9, 20e-6}, {"100 Gb/s", 100e9, 5e-6}};
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "\nmodelled over links (not measured): t = 1/%.2f s measured here + %.1f "
                  "messages x latency + %s x 8 / rate, per token:",
                  tps, msgs, human_bytes(bytes).c_str());
    out += buf;
    for (const Link& l : links) {
        const double t = 1.0 / tps + msgs * l.latency_s + bytes * 8 / l.bits_per_s;
        std::snprintf(buf, sizeof(buf), " %s (%.0f us latency): %.2f t/s;", l.name,
                      l.latency_s * 1e6, 1.0 / t);
        out += buf;
    }
    out.back() = '\n';
    return out;
}

#else

void split_reset_counters(model::Model&) {}
bool is_split(const model::Model&) {
    return false;
}
std::string split_rank_table(model::Model&, double, double) {
    return "";
}

LoadedModel open_split_model(const Args&, const std::string&, model::LoadOptions,
                             const backend::CpuOptions&, int parts, int tp) {
    throw UsageError(std::string(tp > 1 ? "--tp" : "--layer-split") +
                     ": this glm5 was built without MPI (install libopenmpi-dev and rebuild)");
}

void split_memory(const model::Model&, MemoryAvailable&, uint64_t&) {}

#endif

}  // namespace glm5::app

#include "runtime/placement.h"

#include <algorithm>

#include "core/error.h"
#include "core/format.h"
#include "model/moe.h"
#include "model/weights.h"

namespace glm5::runtime {

int64_t device_context(int64_t trained) {
    return std::min<int64_t>(trained > 0 ? trained : 4096, 4096);
}

DevicePlacement place_experts(const gguf::File& f, model::Model& planned, const DeviceRequest& r) {
    const model::ModelInfo& info = planned.info();
    // The blocks this model loads (the trunk, then the NextN block when it drafts),
    // each with its routed experts' bytes.
    std::vector<uint64_t> experts = model::expert_bytes_by_block(f);
    experts.resize(size_t(info.n_layer) + (info.nextn_loaded ? 1 : 0), 0);
    auto in_ram = [&](const std::vector<bool>& host) {
        uint64_t s = 0;
        for (size_t b = 0; b < experts.size() && b < host.size(); ++b)
            if (host[b]) s += experts[b];
        return s;
    };
    DevicePlacement out;
    out.cap_text = r.cap_text;
    out.host = r.host;
    out.how = r.how;

    // The device holds every weight but those experts, and the caches and scratch of
    // the context, reserved before any expert is placed.
    const MemoryPlan p = make_plan(planned, r.context, MemoryAvailable{}, 0, 0);
    const uint64_t context = p.caches + p.snapshots + p.scratch;
    // What a device uploads: the file's bytes of every tensor the model uses (the
    // trunk's blocks, the NextN block when loaded, the rest).
    uint64_t weights = 0;
    for (const gguf::TensorInfo& t : f.tensors())
        if (model::tensor_layer(t.name) < int64_t(experts.size())) weights += t.nbytes;
    auto device_bytes = [&](uint64_t in_ram_bytes) { return weights - in_ram_bytes + context; };
    auto fits = [&](uint64_t in_ram_bytes) {
        return r.cap == 0 || device_bytes(in_ram_bytes) <= r.cap;
    };
    // The smallest --n-cpu-moe that fits (-1: none, not even every expert in RAM).
    int64_t smallest = -1;
    uint64_t first_n = 0;  // the experts of blocks 0 .. n-1, which --n-cpu-moe n keeps in RAM
    for (size_t n = 0; smallest < 0 && n <= experts.size(); ++n) {
        if (fits(first_n))
            smallest = int64_t(n);
        else if (n < experts.size())
            first_n += experts[n];
    }
    out.what = human_bytes(double(context)) + " of caches and scratch for " +
               std::to_string(r.context.n_slots) + " x " + std::to_string(r.context.n_ctx) +
               " tokens";
    if (smallest < 0)
        throw ResourceError("the device (" + r.cap_text +
                            ") cannot hold this model's weights outside the routed experts (" +
                            human_bytes(double(device_bytes(first_n) - context)) + ") and " +
                            out.what + ", even with every routed expert in system RAM: " +
                            (r.cap_named
                                 ? std::string("give it more memory (--device-mem) or a smaller "
                                               "--ctx-size")
                                 : std::string("a smaller --ctx-size or --parallel, a smaller "
                                               "quantization, or --device none (the CPU)")));
    if (out.how.empty()) {
        out.host = model::first_expert_blocks(f, smallest);
        out.how = "--n-cpu-moe " + std::to_string(smallest) + ", the smallest that fits";
    } else if (!fits(in_ram(out.host))) {
        throw ResourceError("with " + out.how + " the device needs " +
                            human_bytes(double(device_bytes(in_ram(out.host)))) + " (" + out.what +
                            "), but it has " + r.cap_text + ": use --n-cpu-moe " +
                            std::to_string(smallest) + ", the smallest that fits");
    }
    out.device_weights = weights - in_ram(out.host);
    out.context_bytes = context;
    return out;
}

namespace {

// "context N tokens (why): what is free after the weights, what the slots, scratch and
// prefix cache take, and what the next step of context would need".
std::string context_summary(const model::Model& m, const ContextRequest& r,
                            const MachineMemory& mem, const PlanRequest& pr, const MemoryPlan& p,
                            const std::string& why, int64_t limit) {
    const MemoryAvailable& avail = mem.avail;
    const int64_t n = pr.n_ctx;
    std::string line = "context " + std::to_string(n) + " tokens " + why;
    if (!avail.bytes) return line;
    const uint64_t after_weights =
        avail.bytes - std::min(avail.bytes, p.weights_mapped + p.process + p.reserve);
    line += ": " + human_bytes(double(after_weights)) +
            " free after the weights, the process and " + human_bytes(double(p.reserve)) +
            " reserve (" + avail.source + "); " + std::to_string(r.n_slots) + " slot" +
            (r.n_slots == 1 ? "" : "s") + " x " + human_bytes(double(m.state_cost().bytes(n))) +
            " of caches, " + human_bytes(double(p.scratch)) + " of scratch";
    if (p.retained) line += ", " + human_bytes(double(p.retained)) + " prefix cache";
    if (r.asked == 0 && n < limit) {
        PlanRequest more = pr;
        more.n_ctx = n + kContextStep;
        more.retained = 0;
        line += "; " + std::to_string(more.n_ctx) + " would need " +
                human_bytes(double(make_plan(m, more, avail, mem.reserve, mem.process).needed() +
                                   mem.reserve)) +
                " of " + human_bytes(double(avail.bytes));
    }
    return line;
}

}  // namespace

ContextChoice choose_context(const model::Model& m, const ContextRequest& r,
                             const MachineMemory& mem) {
    const MemoryAvailable& avail = mem.avail;
    const int64_t trained = m.info().n_ctx_train;
    const int64_t limit = std::min<int64_t>(trained > 0 ? trained : 4096, int64_t(1) << 24);
    PlanRequest pr;
    pr.n_slots = r.n_slots;
    pr.ubatch = r.ubatch;
    pr.draft_max = r.draft_max;
    pr.extra = r.extra;
    pr.extra_label = r.extra_label;
    ContextChoice c;
    int64_t n = 0;
    std::string why;
    if (r.asked > 0) {
        pr.n_ctx = r.asked;
        c.plan = make_plan(m, pr, avail, mem.reserve, mem.process);
        if (!c.plan.fits()) {
            c.refusal = refusal(m, c.plan, r.can_change_slots);
            return c;
        }
        n = r.asked;
        why = "(" + r.asked_by + "; the GGUF advertises " + std::to_string(trained) + ")";
    } else if (avail.bytes == 0) {
        n = std::min<int64_t>(limit, 4096);
        why = "(free memory is unknown here: not planned; the GGUF advertises " +
              std::to_string(trained) + ")";
    } else {
        n = largest_context(m, pr, avail, mem.reserve, mem.process, limit);
        if (n == 0) {
            pr.n_ctx = kContextStep;
            c.plan = make_plan(m, pr, avail, mem.reserve, mem.process);
            c.refusal = refusal(m, c.plan, r.can_change_slots);
            return c;
        }
        why = n == limit ? "(all the GGUF advertises)"
                         : "(the GGUF advertises " + std::to_string(trained) + ")";
    }
    pr.n_ctx = n;
    c.plan = make_plan(m, pr, avail, mem.reserve, mem.process);
    // The prefix cache takes what the slots leave, up to its budget.
    if (r.retained > 0) {
        const uint64_t left =
            avail.bytes == 0
                ? r.retained
                : avail.bytes - std::min(avail.bytes, c.plan.needed() + c.plan.reserve);
        pr.retained = std::min<uint64_t>(r.retained, left);
        c.plan = make_plan(m, pr, avail, mem.reserve, mem.process);
    }
    c.n_ctx = n;
    c.cache_pool = c.plan.cache_pool();
    c.summary = context_summary(m, r, mem, pr, c.plan, why, limit);
    return c;
}

}  // namespace glm5::runtime

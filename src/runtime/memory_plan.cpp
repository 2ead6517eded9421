#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/format.h"

namespace glm5::runtime {

uint64_t MemoryPlan::needed() const {
    return weights_mapped + process + caches + snapshots + scratch + kept_rows + retained +
           req.extra;
}

uint64_t default_reserve(const MemoryAvailable& a, int64_t reserve_flag) {
    if (reserve_flag >= 0) return uint64_t(reserve_flag);
    if (a.bytes == 0) return 0;
    uint64_t r = std::clamp<uint64_t>(a.bytes / 20, uint64_t(256) << 20, uint64_t(4) << 30);
    return std::min(r, a.bytes / 4);
}

MemoryPlan make_plan(const model::Model& m, const PlanRequest& r, const MemoryAvailable& avail,
                     uint64_t reserve, uint64_t process_bytes) {
    MemoryPlan p;
    p.req = r;
    p.available = avail;
    p.reserve = reserve;
    const model::ModelInfo& info = m.info();
    p.weights_mapped = info.mapped_bytes;
    p.weights_copied = info.copied_bytes;
    p.process = process_bytes;
    const model::StateCost c = m.state_cost();
    const uint64_t slots = uint64_t(std::max(1, r.n_slots));
    p.caches = slots * c.bytes(r.n_ctx);
    if (r.draft_max > 0) p.snapshots = slots * c.snapshot;
    // The largest forward: a full micro-batch, or every slot's verify window.
    const int64_t window = int64_t(r.draft_max + 1);
    const int64_t rows = std::max<int64_t>(std::min(r.ubatch, r.n_ctx), int64_t(slots) * window);
    const int64_t logit_rows = std::min<int64_t>(rows, int64_t(slots) * window);
    p.scratch = m.scratch_bytes(rows, logit_rows, r.n_ctx);
    p.kept_rows = slots * c.per_kept_row * uint64_t(std::min(r.ubatch, r.n_ctx));
    p.retained = r.retained;
    return p;
}

int64_t largest_context(const model::Model& m, PlanRequest r, const MemoryAvailable& avail,
                        uint64_t reserve, uint64_t process_bytes, int64_t limit) {
    auto fits = [&](int64_t n) {
        r.n_ctx = n;
        return make_plan(m, r, avail, reserve, process_bytes).fits();
    };
    if (limit <= 0) return 0;
    if (fits(limit)) return limit;
    // Every cost grows with the context: the largest multiple of the step.
    int64_t lo = 0, hi = limit / kContextStep;  // fits(lo * step) holds (lo = 0 by convention)
    if (hi * kContextStep == limit) --hi;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (fits(mid * kContextStep))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo * kContextStep;
}

namespace {

std::string hb(uint64_t b) {
    return human_bytes(double(b));
}

}  // namespace

std::string MemoryPlan::table() const {
    std::string s;
    char buf[256];
    auto row = [&](const std::string& what, uint64_t bytes, const std::string& note = "") {
        std::snprintf(buf, sizeof(buf), "  %-44s %12s%s%s\n", what.c_str(), hb(bytes).c_str(),
                      note.empty() ? "" : "  ", note.c_str());
        s += buf;
    };
    std::snprintf(
        buf, sizeof(buf), "memory plan: %d slot%s x %lld tokens, ubatch %lld%s\n", req.n_slots,
        req.n_slots == 1 ? "" : "s", (long long)req.n_ctx, (long long)req.ubatch,
        req.draft_max > 0 ? (", speculative window " + std::to_string(req.draft_max)).c_str() : "");
    s += buf;
    row("weights mapped from the file (kept resident)", weights_mapped);
    row("this process now (incl. weight copies)", process,
        weights_copied ? "(" + hb(weights_copied) + " of weight copies)" : "");
    char per[96];
    std::snprintf(per, sizeof(per), "caches: %d x %lld tokens", req.n_slots, (long long)req.n_ctx);
    row(per, caches);
    if (snapshots) row("speculative rollback points", snapshots);
    std::snprintf(per, sizeof(per), "compute scratch at depth %lld", (long long)req.n_ctx);
    row(per, scratch);
    if (kept_rows) row("NextN draft seeds (hidden rows)", kept_rows);
    if (retained) row("prefix cache (retained sequences)", retained);
    if (req.extra) row(req.extra_label.empty() ? "other" : req.extra_label, req.extra);
    row("reserve for the rest of the machine", reserve);
    row("total", needed() + reserve);
    if (available.bytes)
        row("available (" + available.source + ")", available.bytes,
            fits() ? "fits" : "does not fit");
    else
        row("available", 0, "unknown: not checked");
    return s;
}

std::string refusal(const model::Model& m, const MemoryPlan& p, bool can_change_slots) {
    const PlanRequest& r = p.req;
    std::string s = "a context of " + std::to_string(r.n_ctx) + " tokens x " +
                    std::to_string(r.n_slots) + " slot" + (r.n_slots == 1 ? "" : "s") + " needs " +
                    hb(p.needed() + p.reserve) + " (" + hb(p.caches) + " of caches, " +
                    hb(p.scratch) + " of scratch, " + hb(p.weights_mapped + p.process) +
                    " for the weights and the process, " + hb(p.reserve) + " reserve), but " +
                    hb(p.available.bytes) + " is available (" + p.available.source + ")";
    std::vector<std::string> fixes;
    const int64_t n = largest_context(m, r, p.available, p.reserve, p.process, r.n_ctx);
    if (n > 0) fixes.push_back("--ctx-size " + std::to_string(n));
    if (can_change_slots && r.n_slots > 1) {
        for (int k = r.n_slots - 1; k >= 1; --k) {
            PlanRequest q = r;
            q.n_slots = k;
            if (make_plan(m, q, p.available, p.reserve, p.process).fits()) {
                fixes.push_back("--parallel " + std::to_string(k));
                break;
            }
        }
    }
    for (int64_t u = r.ubatch / 2; u >= 16; u /= 2) {
        PlanRequest q = r;
        q.ubatch = u;
        if (make_plan(m, q, p.available, p.reserve, p.process).fits()) {
            fixes.push_back("--ubatch " + std::to_string(u));
            break;
        }
    }
    if (r.retained > 0) {
        PlanRequest q = r;
        q.retained = 0;
        if (make_plan(m, q, p.available, p.reserve, p.process).fits())
            fixes.push_back("--cache-budget 0");
    }
    if (fixes.empty()) {
        s += "; nothing smaller fits either: the weights and the process alone need " +
             hb(p.weights_mapped + p.process + p.reserve) + " with the reserve";
        return s;
    }
    s += "; use ";
    for (size_t i = 0; i < fixes.size(); ++i) {
        if (i) s += i + 1 == fixes.size() ? " or " : ", ";
        s += fixes[i];
    }
    return s;
}

}  // namespace glm5::runtime

// The load-time memory plan: what a model, its slots and a context need,
// against what the machine has. Everything large the engine allocates is
// counted here first (caches are sized once per request, never grown), so a
// context that does not fit is refused before it is allocated, and an
// automatic context is the largest that fits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/model.h"

namespace glm5::runtime {

struct PlanRequest {
    int n_slots = 1;
    int64_t n_ctx = 4096;  // per slot
    int64_t ubatch = 512;
    int draft_max = 0;        // speculative window (0: no speculation)
    uint64_t retained = 0;    // prefix-cache budget on top of the slots
    uint64_t extra = 0;       // other planned memory (a vision tower's scratch)
    std::string extra_label;  // what `extra` is
};

struct MemoryPlan {
    PlanRequest req;
    uint64_t weights_mapped = 0;  // file-backed pages the forward reads (must stay resident)
    uint64_t weights_copied = 0;  // anonymous copies (--no-mmap, repacks): already in `process`
    uint64_t process = 0;         // this process's anonymous memory now
    uint64_t caches = 0;          // slots x one state at n_ctx
    uint64_t snapshots = 0;       // speculative rollback points (recurrent state)
    uint64_t scratch = 0;         // the largest forward at the deepest context
    uint64_t kept_rows = 0;       // per-slot host rows kept between forwards
    uint64_t retained = 0;        // prefix cache
    uint64_t reserve = 0;
    MemoryAvailable available;

    uint64_t needed() const;  // everything but the reserve
    bool fits() const { return available.bytes == 0 || needed() + reserve <= available.bytes; }
    // Memory for caches the engine may fill: the slots' states and retained entries.
    uint64_t cache_pool() const { return caches + retained; }
    // The table `glm5 inspect --plan` and a refusal print.
    std::string table() const;
};

// The granularity of an automatic context (tokens).
constexpr int64_t kContextStep = 256;

// The reserve left to the rest of the machine: `reserve_flag` bytes when
// given (>= 0), else 5% of what is available, at least 256 MiB and at most 4 GiB
// (never more than a quarter of what is available).
uint64_t default_reserve(const MemoryAvailable& a, int64_t reserve_flag);

MemoryPlan make_plan(const model::Model& m, const PlanRequest& r, const MemoryAvailable& avail,
                     uint64_t reserve, uint64_t process_bytes);

// The largest context (a multiple of kContextStep, or `limit` itself) up to
// `limit` whose plan fits; 0 when not even kContextStep fits.
int64_t largest_context(const model::Model& m, PlanRequest r, const MemoryAvailable& avail,
                        uint64_t reserve, uint64_t process_bytes, int64_t limit);

// A refusal that names what `p` needs and what is available, and the changes
// that would make it fit (each checked against a plan): the largest context
// as "--ctx-size N", fewer slots as "--parallel K", a smaller "--ubatch U".
std::string refusal(const model::Model& m, const MemoryPlan& p, bool can_change_slots);

}  // namespace glm5::runtime

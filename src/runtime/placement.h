// Load policy, decided before anything large is allocated or uploaded: which routed
// experts stay in system RAM beside a device, and the context a machine's memory holds
// (memory_plan.h counts what each costs). The command line and the server share it; its
// inputs are plain numbers, so tests drive it with any machine they describe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "runtime/memory_plan.h"

namespace glm5::runtime {

// The device's side of a load: its memory, the operator's placement of the experts (if
// any), and the context it must hold beside the weights.
struct DeviceRequest {
    // Blocks whose routed experts the operator keeps in system RAM, and the flag that said
    // so; an empty `how`: the fewest leading blocks that let the rest fit (--n-cpu-moe N).
    std::vector<bool> host;
    std::string how;
    uint64_t cap = 0;        // the device's bytes (0: unlimited)
    std::string cap_text;    // the cap as the operator knows it
    bool cap_named = false;  // --device-mem set it (a remedy then names it)
    PlanRequest context;     // the slots and context the device reserves
};

struct DevicePlacement {
    std::vector<bool> host;       // per block of the model: its routed experts in system RAM
    std::string how;              // the flag, or the --n-cpu-moe chosen
    std::string what;             // the context reserved on the device
    std::string cap_text;         // the memory it was placed into
    uint64_t device_weights = 0;  // the weights it holds
    uint64_t context_bytes = 0;   // the caches and scratch it reserves
};

// Places `planned` (loaded on views, nothing uploaded) on the device: every weight but the
// experts in RAM, and the context's caches and scratch. Throws ResourceError, with the
// numbers and a remedy that works, when it cannot fit.
DevicePlacement place_experts(const gguf::File& f, model::Model& planned, const DeviceRequest& r);

// The context a device reserves when none is named: llama.cpp's default, or less when the
// GGUF advertises less.
int64_t device_context(int64_t trained);

struct ContextRequest {
    int n_slots = 1;
    int64_t ubatch = 512;
    int draft_max = 0;              // the speculative window, when speculation is on
    uint64_t retained = 0;          // prefix-cache budget wanted on top of the slots
    bool can_change_slots = false;  // the command has --parallel (a remedy may name it)
    bool print_table = false;       // print the plan's table on stdout (inspect --plan)
    uint64_t extra = 0;             // more planned memory (the vision tower) ...
    std::string extra_label;        // ... and what it is
    // The context asked for (0: the largest that fits) and who asked ("--ctx-size").
    int64_t asked = 0;
    std::string asked_by;
};

// The machine as a plan sees it.
struct MachineMemory {
    MemoryAvailable avail;
    uint64_t process = 0;  // anonymous memory the process holds already
    uint64_t reserve = 0;  // left to the rest of the machine
};

struct ContextChoice {
    int64_t n_ctx = 0;
    size_t cache_pool = 0;  // EngineOptions::cache_pool_bytes
    MemoryPlan plan;        // the plan chosen, or the one refused
    std::string summary;    // "context N tokens (why): what is free, what it takes"
    std::string refusal;    // non-empty: nothing fits (the numbers and working remedies)
};

// The context per slot: the one asked for when it fits, else the largest that fits up to
// the GGUF's context_length; with the prefix cache's share of what the slots leave.
ContextChoice choose_context(const model::Model& m, const ContextRequest& r,
                             const MachineMemory& mem);

}  // namespace glm5::runtime

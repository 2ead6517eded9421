// The CPU backend, as its users make one: the core contract and every op family
// (moe_ops.h, attention_ops.h, linear_ops.h, vision_ops.h) on a persistent thread pool.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace glm5::backend {

struct CpuOptions {
    int n_threads = 0;  // 0: all cores we may run on
    // Pin each worker thread to a CPU of its own (--cpu-strict): -1 where the threads
    // fill the physical cores, 0 never, 1 always.
    int pin_threads = -1;
    // mla_attention's and indexer_select's products in BF16 on AMX tiles
    // (--attn-bf16): several times faster deep in a context, but the scores
    // lose the last bits of F16/F32 products, so logits differ slightly from
    // the exact path's (and a near-tie at the indexer's k-th key may pick
    // another key).
    // Refused (make_cpu_backend throws) where the CPU has no AMX-BF16.
    bool attention_bf16 = false;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opt);

}  // namespace glm5::backend

// Routed experts in system RAM beside a device (llama.cpp's --cpu-moe, --n-cpu-moe,
// -ot exps=CPU): which blocks' experts stay behind, what they weigh, and the MoE FFN
// computed across the two backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/moe_ops.h"
#include "model/model.h"

namespace glm5::gguf {
class File;
}

namespace glm5::model {

// Blocks of the file by their GGUF index (trunk, then the NextN block), each with the
// bytes of its routed experts (blk.N.ffn_{gate,up,down}_exps.weight; 0: a dense block).
std::vector<uint64_t> expert_bytes_by_block(const gguf::File& f);

// --n-cpu-moe N: the routed experts of blocks 0 .. N-1 (dense blocks count, as in
// llama.cpp, so a copied command line moves the same tensors).
std::vector<bool> first_expert_blocks(const gguf::File& f, int64_t n);

// llama.cpp's --override-tensor list, "PATTERN=TYPE[,PATTERN=TYPE...]": each PATTERN an
// ECMAScript regular expression searched in the tensor names, as llama.cpp does. Only
// TYPE CPU is known, and a pattern must select whole sets of a block's three routed-expert
// tensors and nothing else; anything else is refused (glm5::Error, with the reason).
std::vector<bool> expert_blocks_from_overrides(const gguf::File& f, const std::string& list);

// Refuses (glm5::Error naming the file) an experts backend beside a layer split or
// tensor parallelism, which do not combine with it yet.
void check_expert_placement(const LoadOptions& opt, const std::string& path);
// Refuses (glm5::Error naming `what`) experts moved without a backend to compute them,
// or to a backend without the MoE family.
void check_experts_backend(const std::vector<bool>& host, backend::Backend* experts_backend,
                           const std::string& what);
// Adds a loaded MoE block to info's moe_blocks / host_expert_* counts.
void count_experts(ModelInfo& info, const backend::MoeWeights& m, bool host);

// Model::place_experts for an architecture's layers (and its NextN block, when loaded,
// at block index layers.size()): sets each MoE layer's host_experts and recounts info.
// The load places LoadOptions::host_experts the same way.
template <class Layer>
void place_layers(std::vector<Layer>& layers, Layer* nextn, const std::vector<bool>& host,
                  backend::Backend* experts_backend, ModelInfo& info) {
    check_experts_backend(host, experts_backend, info.name);
    auto on_host = [&](size_t b) { return b < host.size() && host[b]; };
    info.moe_blocks = info.host_expert_blocks = 0;
    info.host_expert_bytes = 0;
    for (size_t il = 0; il < layers.size(); ++il) {
        layers[il].host_experts = on_host(il);
        count_experts(info, layers[il].moe, layers[il].host_experts);
    }
    if (nextn) {
        nextn->host_experts = on_host(layers.size());
        count_experts(info, nextn->moe, nextn->host_experts);
    }
}

// out [T][E] (overwritten) = the MoE FFN of the normed rows x [T][E]: routing and the
// shared expert on `be` (its MoE family `moe`), the routed experts on `host` (its inputs
// and output copied between the two; null: on `be` too). Bit for bit the one-backend
// result: the split ops are the fused one's parts. With `overlap`, the shared expert is
// queued on `be` after the routed experts' inputs are copied out, so that a device computes
// it while the host computes them, and `be` adds the two (the order the fused op sums in).
void moe_ffn(backend::Backend& be, backend::MoeOps& moe, backend::Backend* host,
             const backend::MoeWeights& m, backend::DevPtr<const float> x, int64_t T, int64_t E,
             backend::DevPtr<float> out, bool overlap = true);

}  // namespace glm5::model

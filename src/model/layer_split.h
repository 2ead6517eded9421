// How a model is cut into contiguous layer ranges for a layer split across
// processes: each part holds whole trunk layers (starting only where the
// architecture allows a span to start), the last one the head too, and the
// largest part's weights plus caches is as small as the cuts allow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace glm5::gguf {
class File;
}

namespace glm5::model {

struct LayerPart {
    LayerRange range;           // the layers; range.end = -1 for the last part (with the head)
    uint64_t weight_bytes = 0;  // of the tensors it holds
};

struct SplitPlan {
    std::vector<LayerPart> parts;
    int64_t n_layer = 0;
    std::string describe(size_t part) const;  // "layers 0-5 (6 of 24), 1.2 GiB of weights ..."
};

// Balances `n_parts` parts of the model in `file` for `tokens` cached tokens
// (slots x context). Weights: every "blk.N." tensor to its layer; the LM head
// (output.weight, or the tied token embedding), the output norm and, with
// opt.load_nextn, the NextN block to the head; the token embedding's rows are
// read a few per token, so the first part is not charged for it. Throws
// glm5::Error, with the reason, when the model cannot be cut into n_parts.
SplitPlan split_layers(const gguf::File& file, backend::Backend& be, const LoadOptions& opt,
                       int n_parts, int64_t tokens);

}  // namespace glm5::model

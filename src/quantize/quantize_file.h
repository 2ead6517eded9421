// The file quantizer behind `glm5 quantize`: a GGUF in, a GGUF out with each tensor in
// the type a mix (quantize/mix.h) or the user chose, the importance matrix steering the
// formats that use one. It streams: a tensor is read from the mapping and written in
// pieces, so memory stays near a fixed figure (kPieceBytes, kRowsBytes per thread, the
// importance matrix) whatever the model's size.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quantize/imatrix.h"
#include "quantize/mix.h"

namespace glm5::quantize {

// Output bytes written at once, and float rows each thread converts at once.
constexpr size_t kPieceBytes = size_t(32) << 20;
constexpr size_t kRowsBytes = size_t(4) << 20;

// --tensor-type PATTERN=TYPE: the first pattern found in a tensor's name (a regex search,
// as llama-quantize does) sets its type.
struct TypeOverride {
    std::string pattern;
    std::regex re;
    quant::Type type;
};
// A weight format by ggml's name, any case ("q4_K"); glm5::Error naming `what` otherwise.
quant::Type parse_weight_type(const std::string& name, const std::string& what);

// Parses "PATTERN=TYPE" (type names as ggml spells them, any case). Throws glm5::Error.
TypeOverride parse_type_override(const std::string& arg);

struct QuantizeOptions {
    std::string scheme = "Q4_K_M";  // a mix, a type or DYN-<type> (parse_scheme)
    bool pure = false;
    const Imatrix* imatrix = nullptr;
    std::string imatrix_path;  // recorded in the output's metadata
    std::vector<TypeOverride> tensor_types;
    std::optional<quant::Type> output_type, embedding_type;
    bool allow_requantize = false;
    int n_threads = 0;  // 0: every core
    gguf::Writer::SplitLimits split;
    size_t piece_bytes = kPieceBytes;  // output bytes written at once
};

struct TensorPlan {
    const gguf::TensorInfo* in = nullptr;
    quant::Type type = quant::Type::F32;  // what the output stores
    bool convert = false;                 // the type changes (else the bytes are copied)
    bool imatrix = false;                 // quantized with importance weights
    size_t out_bytes = 0;
    std::string note;  // why the type is not the rule's (a fallback, a missing imatrix entry)
};

struct QuantizePlan {
    std::string arch;
    QuantScheme scheme;
    std::vector<TensorPlan> tensors;  // in the input's order
    uint64_t in_bytes = 0, out_bytes = 0;
};

// Every tensor's type, checked before anything is written: an input that cannot be read
// as a model, a tensor that needs an importance matrix without one, requantizing without
// allow_requantize, an importance matrix of the wrong size: each throws glm5::Error
// saying which tensor and what to do.
QuantizePlan plan_quantize(const gguf::File& in, const QuantizeOptions& o);

// Writes the plan to `out` (one file, or shards PREFIX-0000i-of-0000n.gguf with
// o.split); progress(done, total) counts output bytes. Returns the paths written.
std::vector<std::string> write_quantized(const gguf::File& in, const QuantizePlan& plan,
                                         const QuantizeOptions& o, const std::string& out,
                                         const std::function<void(uint64_t, uint64_t)>& progress);

}  // namespace glm5::quantize

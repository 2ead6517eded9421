// Which storage type each tensor of a generated model gets: llama-quantize's
// per-tensor rules (its "mixes" such as Q4_K_M), restated for the tensors of
// the architectures this engine writes, plus the converter's convention for
// float files. Architecture-neutral: it sees only names, shapes and a few
// model-wide numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace glm5::quantize {

// general.file_type values (llama.cpp's llama_ftype).
enum class FileType : uint32_t {
    ALL_F32 = 0,
    MOSTLY_F16 = 1,
    MOSTLY_Q4_0 = 2,
    MOSTLY_Q4_1 = 3,
    MOSTLY_Q8_0 = 7,
    MOSTLY_Q5_0 = 8,
    MOSTLY_Q5_1 = 9,
    MOSTLY_Q2_K = 10,
    MOSTLY_Q3_K_S = 11,
    MOSTLY_Q3_K_M = 12,
    MOSTLY_Q3_K_L = 13,
    MOSTLY_Q4_K_S = 14,
    MOSTLY_Q4_K_M = 15,
    MOSTLY_Q5_K_S = 16,
    MOSTLY_Q5_K_M = 17,
    MOSTLY_Q6_K = 18,
    MOSTLY_IQ2_XXS = 19,
    MOSTLY_IQ2_XS = 20,
    MOSTLY_Q2_K_S = 21,
    MOSTLY_IQ3_XS = 22,
    MOSTLY_IQ3_XXS = 23,
    MOSTLY_IQ1_S = 24,
    MOSTLY_IQ4_NL = 25,
    MOSTLY_IQ3_S = 26,
    MOSTLY_IQ3_M = 27,
    MOSTLY_IQ2_S = 28,
    MOSTLY_IQ2_M = 29,
    MOSTLY_IQ4_XS = 30,
    MOSTLY_IQ1_M = 31,
    MOSTLY_BF16 = 32,
};

// What --type names: a mix (per-tensor rules) or one type for every matrix.
struct QuantScheme {
    std::string name;  // as the user wrote it, upper-cased
    FileType ftype;
    quant::Type base;  // the mix's default matrix type
    bool pure;         // every quantizable matrix gets `base` (block-size fallbacks still apply)
    // DYN-<type>: the routed experts at `base`, everything else kept high (dynamic_type).
    bool dynamic = false;
};

// Resolves a name. A llama-quantize mix name wins ("Q2_K" is the Q2_K mix);
// a type that is no mix name (Q4_K, Q5_K, Q3_K) is pure. force_pure makes any
// quantized name pure. "DYN-<type>" (any quantized type) is the dynamic preset around
// that type. nullopt for an unknown name.
std::optional<QuantScheme> parse_scheme(std::string_view name, bool force_pure = false);

// Names accepted by parse_scheme, for --help.
std::vector<std::string> scheme_names();

// The model-wide facts the rules consult.
struct MixModel {
    int n_layer_all = 0;  // block_count, NextN blocks included
    int n_expert = 0;
    int n_head = 1;
    int n_head_kv = 1;
    bool has_imatrix = false;
    int n_nextn = 0;  // the last n_nextn blocks are NextN/MTP blocks
};

struct MixTensor {
    std::string name;
    std::vector<int64_t> ne;
    // Kept F32 even in F16/BF16 files, as the HF converter keeps it (norms,
    // biases, router weights, ...).
    bool f32_in_float_files = false;
    // A --tensor-type style override (applied instead of the mix rules).
    std::optional<quant::Type> override_type;
};

// One type per tensor, in the order given. Decisions that depend on the order
// of tensors (llama-quantize's running counters) are taken in llama.cpp's
// loader order (by block number, then by name), whatever order `tensors` has.
std::vector<quant::Type> assign_types(const QuantScheme& scheme, const MixModel& model,
                                      const std::vector<MixTensor>& tensors);

// Whether llama-quantize would quantize the tensor at all (2-D or more, a
// ".weight", not a norm, not the router, not a short convolution).
bool is_quantizable(const std::string& name, const std::vector<int64_t>& ne);

// Matrices glm5next's format stores in F32 whatever the file type (the hyper-connection
// mixing logits, the pooled indexer's positional table, KDA's short convolutions).
bool glm5next_keeps_f32(const std::string& name);

// The dynamic preset's rule, for a quantizable matrix of a model with these facts (before
// the block-size fallback): routed experts at the preset's type (their down projection one
// step up the ladder), the NextN block's experts at Q4_K at least, the shared experts and
// dense FFNs at Q6_K, attention, the indexers, KDA, the hyper-connections and the rest of
// the NextN block at Q8_0, the embeddings and the output at Q6_K.
quant::Type dynamic_type(const QuantScheme& scheme, const MixModel& model, const std::string& name);

// Block number of "blk.N....", -1 for the global tensors.
int block_of(const std::string& name);

// Whether the tensor belongs to one of the model's NextN/MTP blocks (the last n_nextn).
bool in_nextn(const std::string& name, const MixModel& model);

// llama.cpp's loader order of n tensors (name(i) names tensor i): by block, the global
// tensors first, then by name. The order llama-quantize walks and writes them in.
std::vector<size_t> loader_order(size_t n, const std::function<const std::string&(size_t)>& name);

// The type a row of ne0 values stores in place of t when it cannot hold t's blocks
// (llama-quantize's substitutes: IQ* -> IQ4_NL, Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, ...).
quant::Type block_fallback(quant::Type t, int64_t ne0);

// The next type up the ladder a mix climbs for the more sensitive matrices (IQ2_XXS ->
// IQ2_XS, Q2_K -> Q3_K, ...; Q8_0 and the float types stay).
quant::Type step_up(quant::Type t);

// Whether a tensor stored as `t` needs importance data under this scheme
// (llama-quantize refuses to write it without).
bool type_requires_imatrix(const std::string& name, quant::Type t, FileType ftype);

}  // namespace glm5::quantize

// The deterministic synthetic model generator: random weights in a real
// architecture's GGUF layout (tensor names, shapes, metadata, tokenizer) and
// real storage types, since real GLM weights cannot be downloaded here.
//
//   GenOptions o;                       // tiny glm-dsa, F32
//   o.glm_dsa = GlmDsaHParams::preset("bench");
//   o.type = "Q4_K_M";
//   generate(o, "bench-q4_k_m.gguf");
//
// The same options give the same bytes on every machine and with any number
// of threads: every tensor is a pure function of (seed, tensor name, shape,
// type). Weights are N(0,1)-like samples (Irwin–Hall, see gen_random.h)
// times gain/sqrt(fan_in), fan_in = ne0, with the fixtures' gains (residual
// output projections 0.7, routed expert down 0.5, router 1.5, LM head 2.5);
// token_embd is N(0,1); norm weights are 1 + 0.05·N(0,1); biases 0.1·N(0,1).
//
// Structure: an architecture describes its layout (metadata + TensorSpecs,
// gen_layout.h); the core here samples values, picks per-tensor types
// (quantize/mix.h), derives importance vectors and streams tensors to the
// GGUF writer in parallel. Adding an architecture means adding a layout
// builder, not touching the core.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"
#include "synth/glm5next.h"

namespace glm5::synth {

// glm-dsa (GLM-5.x) hyperparameters, named as in the fixtures' hparams.json.
struct GlmDsaHParams {
    int64_t n_vocab = 768;
    int64_t n_embd = 64;
    int64_t n_layer = 6;  // trunk layers (block_count = n_layer + n_nextn)
    int64_t n_nextn = 1;  // appended NextN/MTP blocks: 0 or 1
    int64_t n_dense = 2;  // leading dense (SwiGLU) blocks
    int64_t n_ff = 96;    // dense feed-forward width
    int64_t n_expert = 16;
    int64_t n_expert_used = 4;
    int64_t n_expert_shared = 1;
    int64_t n_ff_exp = 32;  // routed (and shared) expert width
    int64_t n_head = 4;
    int64_t q_lora = 32;
    int64_t kv_lora = 32;
    int64_t qk_nope = 32;
    int64_t qk_rope = 16;
    int64_t v_head = 32;
    int64_t idx_n_head = 16;  // lightning indexer heads
    int64_t idx_head = 64;    // indexer key length (a power of two >= 64)
    int64_t idx_top_k = 8;
    // Per trunk layer, true = full indexer layer. Empty: GLM-5.2's pattern
    // (layers 0, 1, then every fourth from 2).
    std::vector<bool> indexer_full{true, true, false, true, false, false};
    int64_t n_ctx_train = 1048576;
    float rope_freq_base = 8e6f;
    float rms_eps = 1e-5f;
    float expert_weights_scale = 2.5f;
    bool expert_weights_norm = true;

    // "tiny" and "small" are the fixtures' shapes (tests/data/glm-dsa/
    // hparams.json); "bench" is a realistically shaped ~3 GB (Q4_K_M) model
    // in GLM-5.2's proportions. Throws glm5::Error for another name.
    static GlmDsaHParams preset(std::string_view name);
    static std::vector<std::string> preset_names();
    // The --type a preset uses unless told otherwise (tiny F32, small F16, bench Q4_K_M).
    static std::string preset_default_type(std::string_view name);

    // The indexer pattern actually written (indexer_full, or the default).
    std::vector<bool> indexer_pattern() const;
    // Throws glm5::Error naming the first value llama.cpp would refuse.
    void validate() const;
};

std::vector<bool> glm52_indexer_pattern(int64_t n_layer);

enum class Arch { GlmDsa, Glm5Next };

// Whether the quantizer gets an importance vector per matrix.
//   Auto: only when the mix has a type that cannot do without one (IQ1/IQ2/
//         IQ3_XXS mixes), as llama-quantize demands an imatrix there.
enum class ImatrixMode { Auto, On, Off };

// Where the blocks of quantized matrices come from.
//   Exact: every matrix is its own float samples, quantized (with the
//          importance vector where one is used). The reference; what tests use.
//   Pool:  for each (type, std) a pool of 2^20 samples is quantized once, and
//          every block of every matrix of that type and std is a copy of a
//          pool block picked by the tensor's random stream. The blocks are
//          real quantizer output of N(0, std) samples, so values, scales and
//          statistics look like those of Exact, at memcpy speed; a matrix
//          repeats blocks of its pool, which matters to no benchmark. Pools
//          serve many matrices, so when an imatrix is used they are quantized
//          with importance 1 for every column. Exact pays the quantizers'
//          full cost (for IQ2_XXS about thirty times Q4_K_M's per value:
//          hours for the bench model), Pool writes at close to disk speed;
//          the bench preset uses Pool.
enum class BlockSource { Exact, Pool };

struct GenOptions {
    Arch arch = Arch::GlmDsa;
    std::string preset = "tiny";  // for general.name and the defaults below
    GlmDsaHParams glm_dsa;        // defaults to the tiny preset
    Glm5NextHParams glm5next;     // for Arch::Glm5Next (gen_glm5next.h)
    std::string type = "F32";     // a single type or a llama-quantize mix (Q4_K_M, ...)
    bool pure = false;            // every matrix in `type` (like llama-quantize --pure)
    uint64_t seed = 20260822;
    std::string name;  // general.name; empty: a name from preset and type
    ImatrixMode imatrix = ImatrixMode::Auto;
    // Type of every quantized tensor of the NextN block: "auto" is Q4_K when
    // the mix needs an imatrix (llama-imatrix never runs the MTP block, so
    // llama.cpp users keep it at Q4_K, as the fixture small-iq2_xxs did) and
    // the mix's choice otherwise; "mix" always lets the mix decide; or a type.
    std::string nextn_type = "auto";
    BlockSource blocks = BlockSource::Exact;
    int n_threads = 0;  // 0: ThreadPool::default_threads()
};

// One tensor as it will be written.
struct TensorPlan {
    std::string name;
    std::vector<int64_t> ne;
    quant::Type type;
    double mean = 0;      // of the float samples (1 for norm weights)
    double stddev = 0;    // of the float samples
    bool pooled = false;  // blocks copied from a quantized pool (BlockSource::Pool)
    bool uses_imatrix = false;
};

struct ModelPlan {
    std::string arch;
    quant::Type base_type;
    uint32_t file_type = 0;
    bool imatrix = false;
    std::vector<TensorPlan> tensors;
    uint64_t n_params = 0;
    uint64_t tensor_bytes = 0;  // data bytes without alignment padding
    std::map<std::string, int> type_counts;
};

// What would be written, without writing it. Throws glm5::Error on bad options.
ModelPlan plan(const GenOptions& opt);

// The weight bytes one decoded token reads with the plan's storage types:
// what a bandwidth-bound decode of one sequence costs. Counted: every trunk
// tensor, n_used/n_expert of each routed-expert tensor (equal slices), the
// shared experts, the LM head and one row of the token embedding; the NextN
// block is not read by plain decode. The kernels' own count (`glm5 bench`'s
// roofline) leaves out the vectors and the embedding row, a few tenths of
// a percent here.
struct DecodeBytes {
    uint64_t dense = 0;   // trunk tensors outside the experts: attention, norms, dense FFN, routers
    uint64_t routed = 0;  // n_used routed experts in every MoE layer
    uint64_t shared = 0;  // the shared experts
    uint64_t head = 0;    // output norm and LM head, one embedding row
    uint64_t total() const { return dense + routed + shared + head; }
};
DecodeBytes decode_bytes_per_token(const GenOptions& opt);

struct GenResult {
    ModelPlan plan;
    uint64_t file_bytes = 0;
    double seconds = 0;
};

// Writes the model to `path` (atomically: a temporary file renamed at the
// end). progress(done_bytes, total_bytes) is called after each tensor.
GenResult generate(const GenOptions& opt, const std::string& path,
                   const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

// The float values of one tensor of the plan (rows [row0, row0+n_rows) of
// ne0 values each) before any quantization: for tests and for the imatrix.
void sample_rows(const GenOptions& opt, const std::string& tensor, int64_t row0, int64_t n_rows,
                 float* out);

// The importance vector (one value per input column, ne0) the quantizer gets
// for a matrix when an imatrix is used; see kImatrixDescription.
std::vector<float> importance_vector(const GenOptions& opt, const std::string& tensor);

// How the importance vectors are derived, for --help and the file metadata.
extern const char* const kImatrixDescription;

}  // namespace glm5::synth

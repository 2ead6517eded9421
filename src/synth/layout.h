// How an architecture describes itself to the generator core: its metadata
// (in file order) and one TensorSpec per tensor. The core does the rest.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "quantize/mix.h"
#include "synth/generator.h"

namespace glm5::synth {

using quantize::MixModel;

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;  // ggml order
    // Samples are mean + stddev * z, z ~ Irwin–Hall(12) (see gen_random.h).
    double mean = 0;
    double stddev = 0;
    // The input of this matrix in the forward pass is an RMS-normed vector
    // times these norm weights (concatenated, in order, ne0 values in all):
    // its importance is E[x_j^2] ∝ w_j^2. Empty: an input with no per-channel
    // scale (importance 1 everywhere).
    std::vector<std::string> input_norms;
    bool is_lookup = false;  // an embedding table: no matmul input, no importance data
    bool f32_in_float_files = false;
    // F32 in every file, quantized mixes included: small tensors the format
    // keeps in F32 that llama-quantize's name rules would otherwise catch.
    bool keep_f32 = false;
    bool nextn = false;  // belongs to a NextN/MTP block
};

struct Layout {
    std::string arch;
    // Keys after general.architecture/name/type/file_type/quantization_version.
    std::vector<std::pair<std::string, gguf::Value>> metadata;
    std::vector<TensorSpec> tensors;
    MixModel mix;
};

// Appends TensorSpecs with the conventions both architectures share, and the
// parts they share: embedding and LM head, the dense or MoE FFN, the NextN block.
class TensorList {
  public:
    // small_f32: whether tensors other than matrices (norms, biases, other
    // values) stay F32 in F16/BF16 files.
    TensorList(std::vector<TensorSpec>& t, bool small_f32) : t_(t), small_f32_(small_f32) {}

    static double inv_sqrt(int64_t n) { return 1.0 / std::sqrt(double(n)); }

    // A matrix whose input is `norms`-scaled; std = gain / sqrt(ne0).
    TensorSpec& mat(std::string name, std::vector<int64_t> ne, double gain,
                    std::vector<std::string> norms) {
        TensorSpec s;
        s.name = std::move(name);
        s.stddev = gain * inv_sqrt(ne[0]);
        s.ne = std::move(ne);
        s.input_norms = std::move(norms);
        return push(std::move(s));
    }
    // Any other tensor: mean + std * N(0, 1)-like samples.
    TensorSpec& values(std::string name, std::vector<int64_t> ne, double mean, double stddev) {
        TensorSpec s;
        s.name = std::move(name);
        s.ne = std::move(ne);
        s.mean = mean;
        s.stddev = stddev;
        s.f32_in_float_files = small_f32_;
        return push(std::move(s));
    }
    void norm(std::string name, int64_t n) { values(std::move(name), {n}, 1.0, 0.05); }
    void bias(std::string name, int64_t n) { values(std::move(name), {n}, 0.0, 0.1); }

    // token_embd, output_norm and the LM head (logits std ~2.5).
    void embedding_and_head(int64_t n_embd, int64_t n_vocab) {
        TensorSpec e;
        e.name = "token_embd.weight";
        e.ne = {n_embd, n_vocab};
        e.stddev = 1.0;
        e.is_lookup = true;
        push(std::move(e));
        norm("output_norm.weight", n_embd);
        mat("output.weight", {n_embd, n_vocab}, 2.5, {"output_norm.weight"});
    }

    // Block b's FFN after ffn_norm: a dense SwiGLU of width n_ff, or n_expert
    // routed experts of width n_ff_exp (router, selection bias) plus a shared
    // expert of width n_ff_shared (none when 0).
    void ffn(const std::string& b, const std::string& ffn_norm, int64_t n_embd, bool dense,
             int64_t n_ff, int64_t n_expert, int64_t n_ff_exp, int64_t n_ff_shared) {
        const int64_t E = n_embd;
        if (dense) {
            mat(b + "ffn_gate.weight", {E, n_ff}, 1.0, {ffn_norm});
            mat(b + "ffn_up.weight", {E, n_ff}, 1.0, {ffn_norm});
            mat(b + "ffn_down.weight", {n_ff, E}, 0.7, {});
            return;
        }
        const int64_t X = n_expert, Fx = n_ff_exp, Fs = n_ff_shared;
        mat(b + "ffn_gate_inp.weight", {E, X}, 1.5, {ffn_norm});
        bias(b + "exp_probs_b.bias", X);
        mat(b + "ffn_gate_exps.weight", {E, Fx, X}, 1.0, {ffn_norm});
        mat(b + "ffn_up_exps.weight", {E, Fx, X}, 1.0, {ffn_norm});
        mat(b + "ffn_down_exps.weight", {Fx, E, X}, 0.5, {});
        if (Fs > 0) {
            mat(b + "ffn_gate_shexp.weight", {E, Fs}, 1.0, {ffn_norm});
            mat(b + "ffn_up_shexp.weight", {E, Fs}, 1.0, {ffn_norm});
            mat(b + "ffn_down_shexp.weight", {Fs, E}, 0.7, {});
        }
    }

    // Block b's NextN/MTP tensors; eh_proj's input is
    // [rms(embedding) * enorm, rms(hidden) * hnorm].
    void nextn(const std::string& b, int64_t n_embd) {
        const int64_t E = n_embd;
        mat(b + "nextn.eh_proj.weight", {2 * E, E}, 1.0,
            {b + "nextn.enorm.weight", b + "nextn.hnorm.weight"});
        norm(b + "nextn.enorm.weight", E);
        norm(b + "nextn.hnorm.weight", E);
        norm(b + "nextn.shared_head_norm.weight", E);
    }

  private:
    TensorSpec& push(TensorSpec s) {
        t_.push_back(std::move(s));
        return t_.back();
    }
    std::vector<TensorSpec>& t_;
    bool small_f32_;
};

// glm-dsa: metadata keys and tensors exactly as the fixtures carry them.
Layout build_glm_dsa_layout(const GlmDsaHParams& hp);

// tokenizer.* keys for the GLM vocabulary padded to n_vocab, in the fixtures' order.
void append_glm_tokenizer(std::vector<std::pair<std::string, gguf::Value>>& md, int64_t n_vocab);

}  // namespace glm5::synth

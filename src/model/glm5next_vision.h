// The glm5next vision tower (GLM-5.3-Flash's mmproj: the GLM-OCR ViT with a
// clamped SwiGLU in every block and in the projector), per
// docs/glm5next-format.md section 12: patch embedding, RMSNorms, fused QKV,
// per-head q/k norms, 2-D RoPE, full attention within each image, clamped
// SwiGLU, the final norm, the 2x2 merger and the projector to the text width.
// Every op runs on the backend; images of one call are batched through the
// products and attend only to themselves.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/vision_ops.h"
#include "model/model.h"
#include "model/weights.h"

namespace glm5::model {

struct VisionHParams {
    int64_t width = 0;  // Dv
    int64_t n_ff = 0;   // Fv
    int64_t n_block = 0;
    int64_t n_head = 0;    // Hv
    int64_t head_dim = 0;  // dv = Dv / Hv
    float eps = 1e-5f;
    int64_t patch = 14;
    int64_t merge = 2;
    int64_t out = 0;      // projection_dim = the text model's E
    int64_t proj_ff = 0;  // Fp, from mm.gate's shape
    float limit = 0.0f;   // swiglu_limit
    float mean[3] = {0, 0, 0}, std[3] = {1, 1, 1};
    float rope_theta = 10000.0f;

    // Reads and validates the clip.* keys; throws naming the key and the rule.
    static VisionHParams from_gguf(const gguf::File& f);
};

class VisionTower {
  public:
    // `text` is the model the rows feed: it must be a glm5next model whose
    // width is the projector's (glm-dsa is text only).
    VisionTower(const gguf::File& mmproj, backend::Backend& be, const ModelInfo& text,
                const LoadOptions& opt);

    const VisionHParams& hparams() const { return hp_; }
    const std::string& name() const { return name_; }
    uint64_t weight_bytes() const { return weight_bytes_; }

    // One image's input: the normalised canvas [3][height][width] (width and
    // height multiples of 28), host memory.
    struct Image {
        const float* pixels = nullptr;
        int64_t width = 0, height = 0;
    };
    // Text rows per image: (height/28) * (width/28).
    int64_t rows_for(const Image& im) const;
    // The tower's rows of every image, image after image, each image's rows
    // in raster order of its merged grid: [sum rows][out].
    void encode(std::span<const Image> images, std::vector<float>& rows);
    // Backend scratch the encoder takes for images of n_patches patches in
    // all (the memory plan counts it beside the caches).
    size_t scratch_bytes(int64_t n_patches) const;

  private:
    struct Block {
        const float *ln1 = nullptr, *ln2 = nullptr;
        backend::Weight q, k, v;  // row views of attn_qkv
        const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
        const float *q_norm = nullptr, *k_norm = nullptr;
        backend::Weight wo;
        const float* wo_bias = nullptr;
        backend::Weight gate, up, down;
        const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
    };

    struct Patches;
    struct Work;
    // The encoder's stages: the images unfolded into patches; one block over the rows;
    // the merger and the projector into `out`.
    Patches unfold(std::span<const Image> images) const;
    void block(const Block& B, const Work& w, const Patches& pt);
    void project(backend::DevPtr<const float> X, int64_t N, std::vector<float>& out);

    static VisionHParams checked_hparams(const gguf::File& f, const ModelInfo& text);
    // F32 copy of a float tensor with the exact numpy shape `np` (outermost
    // first), for the convolutions that are summed or reordered at load.
    std::vector<float> conv_floats(const std::string& name, std::initializer_list<int64_t> np);
    const float* own_floats(std::vector<float> v);
    backend::Weight own_matrix(const float* data, int64_t cols, int64_t rows);
    backend::Weight product_matrix(const std::string& name, int64_t cols, int64_t rows);

    const gguf::File& file_;
    backend::Backend& be_;
    backend::VisionOps& ops_;
    VisionHParams hp_;
    std::string name_;
    TensorSource tensors_;
    uint64_t weight_bytes_ = 0;
    backend::Weight patch_embd_;  // {3*14*14, Dv}: both temporal slices summed
    const float* patch_bias_ = nullptr;
    std::vector<Block> blocks_;
    const float* post_ln_ = nullptr;
    backend::Weight merger_;  // {4*Dv, E}: columns in (ky, kx, channel) order
    const float* merger_bias_ = nullptr;
    backend::Weight fc_;
    const float *post_norm_w_ = nullptr, *post_norm_b_ = nullptr;
    backend::Weight mm_gate_, mm_up_, mm_down_;
    std::deque<std::vector<float>> owned_;
};

// Opens an mmproj GGUF for a text model (refusing it with the reason).
std::unique_ptr<VisionTower> load_vision_tower(const gguf::File& mmproj, backend::Backend& be,
                                               const Model& text, const LoadOptions& opt);

}  // namespace glm5::model

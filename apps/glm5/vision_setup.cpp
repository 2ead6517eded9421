#include "vision_setup.h"

#include "backend/vision_ops.h"
#include "core/error.h"
#include "core/log.h"
#include "image/image.h"
#include "text/tokenizer.h"

namespace glm5::app {

void add_vision_flags(Args& a, bool images) {
    a.option("mmproj", "FILE", "",
             "the vision tower of a glm5next model (GLM-5.3-Flash's mmproj GGUF)");
    if (images)
        a.option("image", "FILE", "",
                 "a PNG or JPEG image for the prompt (repeat for several, in order; needs "
                 "--mmproj)");
}

LoadedVision open_vision(const Args& a, LoadedModel& m) {
    LoadedVision v;
    if (!a.is_set("mmproj")) {
        if (a.is_set("image")) throw UsageError("--image needs --mmproj (the vision tower)");
        return v;
    }
    if (!backend::family<backend::VisionOps>(*m.backend))
        throw Error("--mmproj: the vision tower's ops do not run on " + m.backend->name() +
                    " yet: run it without --device cuda (or -ngl)");
    v.file = gguf::File::open(a.get("mmproj"));
    v.tower = model::load_vision_tower(*v.file, *m.backend, *m.model, {});
    v.image_token = text::Tokenizer::from_gguf(*m.file)->find("<|image|>");
    if (v.image_token < 0) throw Error(m.file->path() + ": the vocabulary has no <|image|> token");
    const auto& h = v.tower->hparams();
    // The scratch an image at the 8000-token budget (32000 patches) takes on
    // the backend, beside the model's own.
    log_info(
        "glm5: vision tower %s: width %lld, %lld blocks, %lld heads, %.2f GB of weights, "
        "up to %.2f GB of scratch per image\n",
        v.tower->name().c_str(), (long long)h.width, (long long)h.n_block, (long long)h.n_head,
        double(v.tower->weight_bytes()) * 1e-9,
        double(v.tower->scratch_bytes(4 * image::kMaxTokens)) * 1e-9);
    return v;
}

void plan_vision(const LoadedVision& v, ContextRequest& r) {
    if (!v.tower) return;
    const int64_t tokens = image::kMaxTokens;
    r.extra = v.tower->weight_bytes() + v.tower->scratch_bytes(4 * tokens) +
              uint64_t(tokens * v.tower->hparams().out) * sizeof(float);
    r.extra_label = "vision tower: weights, an image at the budget";
}

std::vector<runtime::PreparedImage> load_images(const Args& a, const LoadedVision& v) {
    std::vector<runtime::PreparedImage> out;
    for (const std::string& path : a.get_all("image"))
        out.push_back(runtime::prepare_image(image::read_file(path), path, v.tower->hparams()));
    return out;
}

}  // namespace glm5::app

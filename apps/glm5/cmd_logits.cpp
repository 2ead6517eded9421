// glm5 logits: evaluate token ids as one batch and print the logits as JSON.
#include <cstdio>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/format.h"
#include "model_setup.h"
#include "vision_setup.h"

namespace glm5::app {

int cmd_logits(int argc, char** argv) {
    Args a(
        "logits",
        "Evaluate token ids as one batch and print {\"n_vocab\", \"logits\"} as JSON on stdout.");
    add_model_flags(a, true);
    a.option("tokens", "IDS", "", "comma-separated token ids, e.g. 1,2,3");
    a.flag("all", "print every position's logits (default: the last position only)");
    add_vision_flags(a, true);
    if (!a.parse(argc, argv, 2)) return 0;
    if (!a.is_set("tokens")) throw UsageError("--tokens is required");
    std::vector<int32_t> ids = parse_token_list(a.get("tokens"), "tokens");
    LoadedModel m = open_model(a);
    const int64_t V = m.model->info().n_vocab;
    // With --mmproj: one <|image|> id per --image, expanded to the image's
    // rows; the logits are those of the expanded sequence's positions.
    LoadedVision vision = open_vision(a, m);
    std::vector<runtime::ImageEmbedding> images;
    runtime::ExpandedPrompt expanded;
    if (vision.tower) {
        images = runtime::encode_prepared(*vision.tower, load_images(a, vision));
        expanded = runtime::expand_images(ids, vision.image_token, images);
        ids = expanded.tokens;
    }
    auto st = m.model->new_state(int64_t(ids.size()));
    model::SeqInput in{st.get(), ids, a.get_flag("all")};
    in.embeds = expanded.embeds;
    std::vector<float> logits;
    m.model->forward({&in, 1}, logits);

    std::string out = "{\"n_vocab\":" + std::to_string(V) + ",\"logits\":[";
    const size_t rows = logits.size() / size_t(V);
    for (size_t r = 0; r < rows; ++r) {
        if (r) out += ',';
        out += float_array_json(logits.data() + r * size_t(V), size_t(V));
    }
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace glm5::app

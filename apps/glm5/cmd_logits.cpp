// glm5 logits: evaluate token ids as one batch and print the logits as JSON.
#include <cstdio>
#include <string>

#include "args.h"
#include "commands.h"
#include "core/format.h"
#include "model_setup.h"

namespace glm5::app {

int cmd_logits(int argc, char** argv) {
    Args a(
        "logits",
        "Evaluate token ids as one batch and print {\"n_vocab\", \"logits\"} as JSON on stdout.");
    add_model_flags(a, true);
    a.option("tokens", "IDS", "", "comma-separated token ids, e.g. 1,2,3");
    a.flag("all", "print every position's logits (default: the last position only)");
    if (!a.parse(argc, argv, 2)) return 0;
    if (!a.is_set("tokens")) throw UsageError("--tokens is required");
    const std::vector<int32_t> ids = parse_token_list(a.get("tokens"), "tokens");
    LoadedModel m = open_model(a);
    const int64_t V = m.model->info().n_vocab;
    auto st = m.model->new_state(int64_t(ids.size()));
    model::SeqInput in{st.get(), ids, a.get_flag("all")};
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

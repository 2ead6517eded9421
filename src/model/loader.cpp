#include "core/error.h"
#include "gguf/gguf.h"
#include "model/glm5next.h"
#include "model/glm_dsa.h"
#include "model/model.h"
#include "model/weights.h"

namespace glm5::model {

std::unique_ptr<Model> load_model(const gguf::File& file, backend::Backend& be,
                                  const LoadOptions& opt) {
    const gguf::Value* a = file.find("general.architecture");
    if (!a || !a->as_string())
        throw Error(file.path() + ": no general.architecture key: not a model file");
    const std::string& arch = *a->as_string();
    if (arch == "glm-dsa" || arch == "glm5next") check_vocab_rows(file);
    if (arch == "glm-dsa") return std::make_unique<GlmDsaModel>(file, be, opt);
    if (arch == "glm5next") return std::make_unique<Glm5NextModel>(file, be, opt);
    throw Error(file.path() + ": architecture '" + arch +
                "' is not supported (glm5 runs glm-dsa and glm5next models)");
}

}  // namespace glm5::model

namespace glm5::model {

void Model::place_experts(const std::vector<bool>&) {
    throw Error(info_.arch + ": routed experts cannot be placed in system RAM in this model");
}

void Model::draft(std::span<DraftRequest>) {
    throw Error(info_.arch + ": no NextN/MTP draft block is loaded");
}

}  // namespace glm5::model

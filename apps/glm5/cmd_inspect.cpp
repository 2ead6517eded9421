// Placeholder until the GGUF reader lands: refuses with a clear message.
#include "args.h"
#include "commands.h"
#include "core/error.h"

namespace glm5::app {
int cmd_inspect(int argc, char** argv) {
    Args a("inspect", "Print a GGUF file's architecture, hyperparameters, tokenizer and tensors.");
    a.positional("FILE", "the GGUF file (first shard of a split model)");
    if (!a.parse(argc, argv, 2)) return 0;
    throw Error("inspect is not built yet");
}
}  // namespace glm5::app

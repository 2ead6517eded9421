// The embedded default model: a small glm-dsa trained on the King James Bible
// (models/kjv-mini.gguf, made by train/train.sh), compiled into the binary and
// written to a cache folder on first use, so `glm5 run`, `chat` and `serve`
// work with no model file at all.
#pragma once

#include <string>

namespace glm5::app {

// $GLM5_CACHE, else $XDG_CACHE_HOME/glm5, else ~/.cache/glm5.
std::string cache_dir();

// Path of the default model in the cache, writing it there (and saying so on
// stderr) when it is absent or differs from the embedded bytes.
std::string ensure_default_model();

}  // namespace glm5::app

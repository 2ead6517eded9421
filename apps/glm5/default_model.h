// The embedded default model: the tiny preset, generated into a cache folder
// on first use so `glm5 run` and `glm5 chat` work with no model file at all.
#pragma once

#include <string>

namespace glm5::app {

// $GLM5_CACHE, else $XDG_CACHE_HOME/glm5, else ~/.cache/glm5.
std::string cache_dir();

// Path of the default model, generating it (and saying so on stderr) when absent.
std::string ensure_default_model();

}  // namespace glm5::app

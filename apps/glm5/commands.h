// Entry points of the glm5 subcommands; each parses argv from index 2.
#pragma once

namespace glm5::app {
#define GLM5_COMMAND(name, fn, summary) int fn(int argc, char** argv);
#include "command_list.inc"
#undef GLM5_COMMAND
}  // namespace glm5::app

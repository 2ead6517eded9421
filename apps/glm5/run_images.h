// glm5 run with --image: the prompt (token ids, or a chat turn whose user
// message starts with the images) goes through a one-slot runtime::Engine,
// which expands the <|image|> placeholders and runs the vision tower.
#pragma once

#include "args.h"
#include "model_setup.h"
#include "vision_setup.h"

namespace glm5::app {

int run_with_images(const Args& a, LoadedModel& m, LoadedVision& v);

}  // namespace glm5::app

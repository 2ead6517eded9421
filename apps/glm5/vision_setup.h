// Images on the command line: --mmproj (the glm5next vision tower) and
// --image (repeatable), shared by run, chat, logits and serve.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "gguf/gguf.h"
#include "model/glm5next_vision.h"
#include "model_setup.h"
#include "runtime/images.h"

namespace glm5::app {

// --mmproj FILE, and with `images` also --image FILE (repeatable, in order).
void add_vision_flags(Args& a, bool images);

struct LoadedVision {
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<model::VisionTower> tower;  // null without --mmproj
    int32_t image_token = -1;                   // the vocabulary's <|image|>
};

// Opens --mmproj for the loaded model (refusals are glm5::Error: exit 2);
// --image without --mmproj is a usage error.
LoadedVision open_vision(const Args& a, LoadedModel& m);

// Reads and prepares every --image (an undecodable file is a glm5::Error
// naming it).
std::vector<runtime::PreparedImage> load_images(const Args& a, const LoadedVision& v);

}  // namespace glm5::app

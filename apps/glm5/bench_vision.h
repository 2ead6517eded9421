// glm5 bench --mmproj: the vision tower's encode time per image size and the
// share of the machine's FMA peak it reaches.
#pragma once

#include "args.h"

namespace glm5::app {

// Declares --mmproj and --image-sizes on the bench's Args.
void add_vision_bench_flags(Args& a);
int bench_vision(const Args& a);

}  // namespace glm5::app

// The simulation build's stand-in for the CUDA toolkit's header (bfloat16: cudasim/fp16.h).
#pragma once
#include "cudasim/fp16.h"

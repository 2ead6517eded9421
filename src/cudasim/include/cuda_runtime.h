// The simulation build's stand-in for the CUDA toolkit's header (cudasim/runtime.h).
#pragma once
#include "cudasim/device.h"
#include "cudasim/runtime.h"

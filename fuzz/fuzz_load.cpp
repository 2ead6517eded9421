// libFuzzer target for the model load path up to, not including, weight reads
// (load_one.h). Seeds: fuzz/corpus/load (fixture models cut after their tensor
// infos).
#include "load_one.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    glm5::fuzz::load_one(data, size);
    return 0;
}

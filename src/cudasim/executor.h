// The simulator's kernel executor (internal to src/cudasim/): runs a kernel's blocks one at
// a time on the calling thread, each CUDA thread of a block a fiber with a stack of its own.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "cudasim/device.h"

namespace cudasim::detail {

class Executor {
  public:
    // `check_pointer(p)` says why a kernel may not read p on this device ("" when it may).
    explicit Executor(std::function<std::string(const void*)> check_pointer);
    ~Executor();
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    // Runs every block of k; "" or the fault that stopped it (the kernel, the block, why).
    // `max_dynamic` is the dynamic shared memory the kernel opted in to (0: the default).
    std::string run(const Kernel& k, size_t max_dynamic);

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

// The watchdog's limit on one block's run, in seconds (GLM5_SIM_WATCHDOG; 300 unless set):
// a block that runs longer (a thread that never finishes) stops the process with its name.
double watchdog_seconds();

}  // namespace cudasim::detail

#!/usr/bin/env bash
# Fresh Debian 12 to a passing test suite: install what is missing, build
# (Release), run every test with ctest, then the sanitizer builds over a reduced
# set (scripts/sanitize.sh; GLM5_NO_SANITIZE=1 leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
# The options are named, not taken from the cache: scripts/run.sh configures build/
# without the tests, and a build folder that kept that would have nothing to test.
# The CUDA backend runs in the CPU simulator (GLM5_CUDA_SIM: src/cudasim/), so its `gpu`
# tests run here too; scripts/device-check.sh runs them on a GPU.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=ON -DGLM5_BUILD_BENCH=ON \
  -DGLM5_CUDA_SIM=ON
cmake --build build -j"$jobs"
# --no-tests=error: a suite that finds no test fails instead of passing.
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 900 --no-tests=error
# Where nvcc is, the same CUDA sources compiled for a GPU (sm_90): they must compile, and no
# kernel may spill registers.
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  bash scripts/cuda-ptxas.sh
fi
if [[ ${GLM5_NO_SANITIZE:-} != 1 ]]; then
  bash scripts/sanitize.sh all
fi

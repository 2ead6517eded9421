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
# The CUDA backend is compiled (and its host-side tests run) wherever nvcc is found
# (GLM5_CUDA=AUTO); its `gpu` tests need a GPU and run in scripts/device-check.sh.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=ON -DGLM5_BUILD_BENCH=ON \
  -DGLM5_CUDA=AUTO
cmake --build build -j"$jobs"
# --no-tests=error: a suite that finds no test fails instead of passing.
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 900 --no-tests=error -LE gpu
if [[ ${GLM5_NO_SANITIZE:-} != 1 ]]; then
  bash scripts/sanitize.sh all
fi

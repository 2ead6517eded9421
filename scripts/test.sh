#!/usr/bin/env bash
# Fresh Debian 12 to a passing test suite: install what is missing, build
# (Release), run every test with ctest, then the sanitizer builds over a reduced
# set (scripts/sanitize.sh; GLM5_NO_SANITIZE=1 leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 900
if [[ ${GLM5_NO_SANITIZE:-} != 1 ]]; then
  bash scripts/sanitize.sh all
fi

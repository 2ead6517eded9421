#!/usr/bin/env bash
# Fresh Debian 12 to the main job: install what is missing, build (Release),
# then one chat turn on the embedded default model: a small glm-dsa trained on
# the King James Bible (models/kjv-mini.gguf, compiled into the binary and
# written to ~/.cache/glm5 on first use; train/README.md says how it was made).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# The CUDA backend only where a GPU is visible (and nvcc is there to build it).
cuda=OFF
if [[ -e /dev/nvidiactl ]] && command -v nvcc >/dev/null; then cuda=ON; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=OFF -DGLM5_BUILD_BENCH=OFF \
  -DGLM5_CUDA=$cuda -DGLM5_CUDA_SIM=OFF >/dev/null
cmake --build build -j"$(nproc)" --target glm5
# The main job: template, tokenizer, prefill, sparse attention, MoE, sampling.
# (tests/cli/english_reply.sh checks that this reply is English.)
./build/glm5 run --prompt "Tell me a verse about light." -n 48 --seed 1

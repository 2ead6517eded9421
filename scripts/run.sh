#!/usr/bin/env bash
# Fresh Debian 12 to the main job: install what is missing, build (Release),
# then run glm5 on the embedded default model (generated on first use): its
# description, then one chat turn.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=OFF -DGLM5_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target glm5
model="${GLM5_CACHE:-$HOME/.cache/glm5}/tiny.gguf"
mkdir -p "$(dirname "$model")"
[ -f "$model" ] || ./build/glm5 make-model --preset tiny -o "$model"
./build/glm5 inspect "$model"
# The main job: one chat turn on it (random weights: the reply is noise, the
# path is the real one: template, tokenizer, prefill, decode, sampling).
./build/glm5 run --model "$model" --prompt "Hello! What can you do?" -n 48 --seed 1

#!/usr/bin/env bash
# The whole training run, reproducibly: set-up, tokenizer, training (progress line every 10
# steps), export to GGUF, evaluation, loss plot, goldens. Output in train/out/ (override with
# OUT=...); extra flags go to train.py. About 3 M token-steps; see train/README.md for the
# measured time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash train/setup.sh
out="${OUT:-train/out}"
mkdir -p "$out"
# Passive OpenMP waiting: on a shared machine spinning threads waste the other core.
export OMP_WAIT_POLICY=PASSIVE
/usr/bin/python3 train/train.py --out "$out" "$@"
/usr/bin/python3 train/goldens.py "$out/kjv-mini.gguf" "$out/kjv-mini.golden.json"

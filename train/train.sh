#!/usr/bin/env bash
# The whole training run, reproducibly, in one command: set-up (Debian packages, OpenBLAS),
# tokenizer, training (a progress line every 10 steps, an evaluation every 50), export to
# GGUF, evaluation, loss plot, goldens. Work files go to train/out/ (OUT=... overrides);
# the results are then copied where the project uses them:
#   models/kjv-mini.gguf, models/loss.png, models/summary.json   (the embedded default model)
#   tests/data/trainer/kjv-mini.golden.json                     (the engine's reference test)
# Extra flags go to train.py. See train/README.md for the measured time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash train/setup.sh
out="${OUT:-train/out}"
mkdir -p "$out"
# Passive OpenMP waiting: on a shared machine spinning threads waste the other core.
export OMP_WAIT_POLICY=PASSIVE
/usr/bin/python3 train/train.py --out "$out" "$@"
/usr/bin/python3 train/goldens.py "$out/kjv-mini.gguf" "$out/kjv-mini.golden.json"
mkdir -p models tests/data/trainer
cp "$out/kjv-mini.gguf" "$out/loss.png" "$out/summary.json" models/
cp "$out/kjv-mini.golden.json" tests/data/trainer/
echo "train.sh: wrote models/kjv-mini.gguf (rebuild glm5 to embed it) and tests/data/trainer/kjv-mini.golden.json"

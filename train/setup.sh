#!/usr/bin/env bash
# Developer set-up for the trainer (not needed by CI, which only reads the committed goldens):
# installs Debian's PyTorch (1.13), numpy, matplotlib, the King James Bible (the corpus) and
# OpenBLAS. PyTorch calls whatever BLAS the alternatives system points at; Debian's default is
# the slow reference BLAS, and libopenblas0-pthread (priority 100) takes over once installed.
set -euo pipefail
pkgs=(python3-torch python3-numpy python3-matplotlib libopenblas0-pthread bible-kjv wamerican)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
alt=libblas.so.3-x86_64-linux-gnu
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ "$(readlink -f /etc/alternatives/$alt)" != "$openblas" ]; then
  echo "setup: pointing $alt at OpenBLAS ($openblas)" >&2
  $SUDO update-alternatives --set "$alt" "$openblas"
fi
echo "setup: BLAS is $(readlink -f /etc/alternatives/$alt)" >&2
# One 4096x384 by 384x384 product, to show which BLAS speed PyTorch gets.
/usr/bin/python3 - <<'PY'
import time, torch
torch.set_num_threads(2)
a, b = torch.randn(4096, 384), torch.randn(384, 384)
t = time.time()
for _ in range(20):
    a @ b
print(f"setup: PyTorch {torch.__version__} matmul: {20 * 2 * 4096 * 384 * 384 / (time.time() - t) / 1e9:.1f} GFLOP/s")
PY

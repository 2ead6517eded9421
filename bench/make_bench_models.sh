#!/usr/bin/env bash
# Generate the benchmark models (glm5 make-model --preset bench) into a folder:
#   bench-q4_k_m.gguf   ~2.9 GB, the Q4_K_M mix
#   bench-iq2_xxs.gguf  ~1.4 GB, the IQ2_XXS mix (derived importance, NextN at Q4_K)
# Files that already exist are kept, so the script is cheap to rerun.
#
# usage: bench/make_bench_models.sh DIR [GLM5_BINARY]
#   GLM5_BINARY defaults to $GLM5, then build/glm5 next to this script's repo.
# Extra make-model flags can be passed in MAKE_MODEL_FLAGS (e.g. "--threads 8");
# TYPES="q4_k_m" makes only that file.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 DIR [GLM5_BINARY]" >&2
    exit 2
fi
dir=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
glm5=${2:-${GLM5:-$repo/build/glm5}}
if [[ ! -x $glm5 ]]; then
    echo "$0: no glm5 binary at $glm5 (build it, or pass its path)" >&2
    exit 2
fi
mkdir -p "$dir"

# TYPES (lower case, as the file names) picks some of them.
for name in ${TYPES:-q4_k_m iq2_xxs}; do
    type=$(echo "$name" | tr '[:lower:]' '[:upper:]')
    out=$dir/bench-$name.gguf
    if [[ -e $out ]]; then
        echo "$out exists, kept" >&2
        continue
    fi
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # MAKE_MODEL_FLAGS is a list of flags
    "$glm5" make-model --preset bench --type "$type" -o "$out" ${MAKE_MODEL_FLAGS:-} >/dev/null
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    echo "$out: $(stat -c %s "$out") bytes in $secs s" >&2
done

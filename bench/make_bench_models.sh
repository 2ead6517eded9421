#!/usr/bin/env bash
# Generate the benchmark models (glm5 make-model --preset bench) into a folder:
#   bench-q4_k_m.gguf           ~2.9 GB, the Q4_K_M mix
#   bench-iq2_xxs.gguf          ~1.4 GB, the IQ2_XXS mix (derived importance, NextN at Q4_K)
#   glm5next-bench-q4_k_m.gguf  ~2.8 GB, only with WITH_GLM5NEXT=1: glm5next's bench preset
#                               (GLM-5.3-Flash's proportions; llama.cpp cannot read it, so
#                               bench/compare.sh, which calls this script, does not need it)
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

# make_model ARCH TYPE FILE
make_model() {
    local arch=$1 type=$2 out=$3
    if [[ -e $out ]]; then
        echo "$out exists, kept" >&2
        return
    fi
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # MAKE_MODEL_FLAGS is a list of flags
    "$glm5" make-model --arch "$arch" --preset bench --type "$type" -o "$out" \
        ${MAKE_MODEL_FLAGS:-} >/dev/null
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    echo "$out: $(stat -c %s "$out") bytes in $secs s" >&2
}

# TYPES (lower case, as the file names) picks some of them.
for name in ${TYPES:-q4_k_m iq2_xxs}; do
    make_model glm-dsa "$(echo "$name" | tr '[:lower:]' '[:upper:]')" "$dir/bench-$name.gguf"
done
if [[ ${WITH_GLM5NEXT:-0} == 1 ]]; then
    make_model glm5next Q4_K_M "$dir/glm5next-bench-q4_k_m.gguf"
fi

#!/usr/bin/env bash
# Decode speed on every core undisturbed, and with a busy process pinned to one of
# them, for glm5 and (with LLAMA_BENCH) llama.cpp's CPU build, in one run: how much of
# its undisturbed speed each keeps when a core is taken (losing 1 of N cores should
# cost about 1/N). Prints numbers, never fails on them.
#
# usage: bench/interference.sh MODEL [GLM5_BINARY]
#   ROUNDS (3), GEN (32): rounds of both conditions, tokens per decode test
#   LLAMA_BENCH=/path/to/llama-bench: llama.cpp beside glm5, on the same file
set -uo pipefail
model=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
glm5=${2:-$repo/build/glm5}
rounds=${ROUNDS:-3}
gen=${GEN:-32}
threads=$(nproc)
busy_core=$((threads - 1))

busy() { taskset -c "$busy_core" sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!; }
glm5_tg() {
    "$glm5" bench --model "$model" -t "$threads" -p 0 -n "$gen" -r 1 --no-roofline 2>/dev/null |
        awk -F'|' '/ tg[0-9]/ { gsub(/ /, "", $(NF-2)); print $(NF-2) }'
}
llama_tg() {
    "$LLAMA_BENCH" -m "$model" -t "$threads" -p 0 -n "$gen" -r 1 -o csv 2>/dev/null |
        awk -F',' 'NR > 1 { gsub(/"/, "", $0); print $(NF-1) }' | tail -1
}

printf '%-8s %5s %12s %12s %8s\n' engine round undisturbed "1 core busy" kept
for r in $(seq 1 "$rounds"); do
    for engine in glm5 llama; do
        [[ $engine == llama && -z ${LLAMA_BENCH:-} ]] && continue
        fn=${engine}_tg
        a=$($fn)
        pid=$(busy)
        b=$($fn)
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        kept=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
        printf '%-8s %5d %12s %12s %8s\n' "$engine" "$r" "$a" "$b" "$kept"
    done
done

#!/usr/bin/env bash
# glm5 against llama.cpp on the same GGUF files, threads and machine.
#
# Generates the `bench` preset as Q4_K_M and IQ2_XXS (bench/make_bench_models.sh),
# then for each file runs `glm5 bench` (pp512 and tg64) and, when LLAMA_BENCH
# points at a llama-bench binary, llama-bench with its default settings on the
# same file, alternating the two engines ROUNDS times so that a drift of the
# machine hits both alike. Prints every measurement, then a table with each
# engine's median over the rounds and the ratio glm5 / llama.cpp.
#
# usage: bench/compare.sh [DIR]          (DIR: where the models live; default bench-models)
# environment:
#   GLM5         glm5 binary (default: build/glm5 of this checkout)
#   LLAMA_BENCH  llama-bench binary; unset: glm5's figures only, no ratio
#   LLAMA_FLAGS  extra llama-bench flags (e.g. "-ngl 99" for its CUDA build)
#   THREADS      threads for both engines (default: all cores)
#   ROUNDS       alternations (default 3); REPS repetitions per run (default 3)
#   GLM5_FLAGS   extra glm5 flags (default "--no-mmap --repack": weights in
#                memory, Q4_K/Q6_K interleaved, as llama.cpp's CPU repack does)
#   DEPTHS       cache depths to test, passed as -d to both engines (default "0";
#                e.g. "0 4096": speed deep into a conversation, prefilled untimed)
#   TYPES        which bench files (default "q4_k_m iq2_xxs")
#   PROMPT, GEN  tokens of the pp and tg tests (default 512 and 64)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$repo/bench-models}
glm5=${GLM5:-$repo/build/glm5}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
reps=${REPS:-3}
glm5_flags=${GLM5_FLAGS:---no-mmap --repack}
llama=${LLAMA_BENCH:-}
llama_flags=${LLAMA_FLAGS:-}  # e.g. "-ngl 99" for a CUDA build of llama.cpp
depths=${DEPTHS:-0}
types=${TYPES:-q4_k_m iq2_xxs}
n_prompt=${PROMPT:-512}
n_gen=${GEN:-64}

if [[ ! -x $glm5 ]]; then
    echo "$0: no glm5 binary at $glm5 (build it, or set GLM5)" >&2
    exit 2
fi
if [[ -n $llama && ! -x $llama ]]; then
    echo "$0: LLAMA_BENCH=$llama is not an executable" >&2
    exit 2
fi

"$repo/bench/make_bench_models.sh" "$dir" "$glm5"

results=$(mktemp)
trap 'rm -f "$results"' EXIT

# One glm5 run: appends "engine model test t/s" lines (a test at depth D is
# named like pp512@d4096); echoes the roofline.
run_glm5() {
    local model=$1 name=$2 depth=$3 out
    # shellcheck disable=SC2086  # glm5_flags is a list of flags
    out=$("$glm5" bench --model "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" \
        -r "$reps" $glm5_flags 2>&1)
    echo "$out" | awk -v m="$name" -F'|' '$7 ~ /(pp|tg)[0-9]+/ {
        gsub(/ /, "", $7); gsub(/ /, "", $8); print "glm5", m, $7, $8 }' >>"$results"
    echo "$out" | grep -E '^(decode roofline|roofline)' | sed 's/^/    /' >&2 || true
}

# One llama-bench run with its defaults (pp512, tg64 as asked): its CSV's
# avg_ts per test.
run_llama() {
    local model=$1 name=$2 depth=$3
    # shellcheck disable=SC2086  # llama_flags is a list of flags
    "$llama" -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" -r "$reps" \
        $llama_flags -o csv 2>/dev/null |
        awk -v m="$name" -F, '
            { gsub(/"/, "") }
            NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
            { p = $col["n_prompt"]; g = $col["n_gen"]; t = (p > 0) ? "pp" p : "tg" g;
              d = ("n_depth" in col) ? $col["n_depth"] : 0; if (d > 0) t = t "@d" d;
              print "llama", m, t, $col["avg_ts"] }' >>"$results"
}

for type in $types; do
    model=$dir/bench-$type.gguf
    for depth in $depths; do
        for ((r = 1; r <= rounds; ++r)); do
            echo "== $type depth $depth round $r/$rounds: glm5 $glm5_flags" >&2
            run_glm5 "$model" "$type" "$depth"
            if [[ -n $llama ]]; then
                echo "== $type depth $depth round $r/$rounds: llama-bench" >&2
                run_llama "$model" "$type" "$depth"
            fi
        done
    done
done

echo
echo "every run (t/s):"
sort -k2,2 -k3,3 -k1,1 "$results" | awk '{ printf "  %-6s %-8s %-6s %s\n", $1, $2, $3, $4 }'
echo
echo "threads $threads, depths $depths, $rounds rounds of $reps repetitions; medians over the rounds"
echo
if [[ -n $llama ]]; then
    echo "| model | test | glm5 t/s | llama.cpp t/s | glm5 / llama.cpp |"
    echo "| --- | --- | ---: | ---: | ---: |"
else
    echo "| model | test | glm5 t/s |"
    echo "| --- | --- | ---: |"
fi
awk -v with_llama="${llama:+1}" '
    { v[$1 SUBSEP $2 SUBSEP $3] = v[$1 SUBSEP $2 SUBSEP $3] " " $4; key[$2 SUBSEP $3] = 1 }
    function median(s,   a, n, i, j, t) {
        n = split(s, a, " ");
        for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n == 0 ? -1 : (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2)
    }
    END {
        for (k in key) {
            split(k, mt, SUBSEP);
            g = median(v["glm5" SUBSEP k]);
            if (with_llama) {
                l = median(v["llama" SUBSEP k]);
                if (l > 0) printf "| %s | %s | %.2f | %.2f | %.2fx |\n", mt[1], mt[2], g, l, g / l;
                else printf "| %s | %s | %.2f | (no result) | - |\n", mt[1], mt[2], g;
            } else printf "| %s | %s | %.2f |\n", mt[1], mt[2], g;
        }
    }' "$results" | sort
if [[ -z $llama ]]; then
    echo
    echo "No ratio was measured: LLAMA_BENCH is not set. Set it to a llama-bench binary"
    echo "built from a llama.cpp with glm-dsa support to compare on these files."
fi

#!/usr/bin/env bash
# Checks the "may use" column of docs/architecture.md's folder table against the code: every
# `#include "X/..."` in src/F/ names F itself or a layer F may use. A new upward include, or a
# table that no longer says what the code does, fails the test. Above src/backend/, nothing may
# look inside backend memory (a DevPtr's handle, a backend's own headers).
#
# usage: check_layers.sh REPO_ROOT
set -uo pipefail
root=$1
doc=$root/docs/architecture.md
layers=" $(ls -d "$root"/src/*/ | xargs -n1 basename | tr '\n' ' ') "
fail=0
rows=0
declare -A direct
while IFS='|' read -r _ folder _ uses _; do
    folder=$(sed -E 's/[` ]//g' <<<"$folder")
    [[ $folder =~ ^src/([a-z_]+)/$ ]] || continue
    # "core, quant (type table)" -> core quant; "std only" -> nothing.
    direct[${BASH_REMATCH[1]}]=$(sed -E 's/\([^)]*\)//g; s/std only//; s/,/ /g' <<<"$uses")
done <"$doc"
# A layer may use what its table row names and, through them, what those may use.
closure() {
    local todo=($1) seen=" "
    while ((${#todo[@]})); do
        local l=${todo[0]}
        todo=("${todo[@]:1}")
        [[ $seen == *" $l "* ]] && continue
        seen+="$l "
        todo+=(${direct[$l]:-})
    done
    echo "$seen"
}
for name in "${!direct[@]}"; do
    rows=$((rows + 1))
    allowed=$(closure "$name")
    for f in $(find "$root/src/$name" -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' | sort); do
        while read -r inc; do
            dep=${inc%%/*}
            [[ $layers == *" $dep "* ]] || continue  # a system or third-party header
            if [[ $allowed != *" $dep "* ]]; then
                echo "FAIL: ${f#$root/} includes \"$inc\": src/$name/ may use only:$allowed"
                fail=1
            fi
        done < <(sed -nE 's/^#include "([^"]+)".*/\1/p' "$f")
    done
done
for l in $layers; do
    grep -q "| \`src/$l/\` |" "$doc" || { echo "FAIL: src/$l/ has no row in docs/architecture.md"; fail=1; }
done
# Backend memory is opaque above src/backend/: only a backend turns a DevPtr
# into an address (its handle) or includes a backend's own headers.
while read -r hit; do
    echo "FAIL: $hit: only src/backend/ may look inside backend memory"
    fail=1
done < <(grep -rnE '\.handle\(\)|from_handle|#include "backend/cpu_' "$root/src" "$root/apps" \
    --include='*.h' --include='*.cpp' | grep -v "^$root/src/backend/" | sed "s|^$root/||")
# Repacking is the CPU backend's business (Backend::register_weight): the model
# layer hands every matrix to its backend and knows no layout of its own.
while read -r hit; do
    echo "FAIL: $hit: weight layouts belong to the backend (register_weight)"
    fail=1
done < <(grep -rnE '#include "quant/repack|quant::repack' "$root/src/model" \
    --include='*.h' --include='*.cpp' | sed "s|^$root/||")
[[ $rows -gt 0 ]] || { echo "FAIL: no folder rows found in $doc"; exit 1; }
[[ $fail == 0 ]] && echo "ok: $rows layers include only what docs/architecture.md allows"
exit $fail

#!/usr/bin/env bash
# The CUDA sources as nvcc compiles them for a GPU: every src/backend/cuda/*.cu for sm_90 (the
# simulation build compiles the same files with the host compiler, so this is what shows they
# still compile for a GPU), with ptxas's report of each kernel's registers. Fails when a file
# does not compile or a kernel spills registers to local memory (a spill turns a product that
# reads at bandwidth into one that waits on its own stack). scripts/test.sh runs it where nvcc
# is found. Prints one line per kernel: registers, stack, spills.
#
# usage: scripts/cuda-ptxas.sh [ARCH]   (default 90)
set -uo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || { echo "cuda-ptxas: no nvcc" >&2; exit 2; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
compile() {
    local f=$1 log=$logs/$(basename "$1").log
    "$nvcc" -std=c++20 -O3 -arch="sm_$arch" -Xptxas -v -Isrc -DGLM5_CUDA_ARCHS="\"$arch\"" \
        -c "$f" -o /dev/null >"$log" 2>&1 || { echo "FAIL: $f does not compile"; cat "$log"; }
}
export -f compile
export nvcc arch logs
ls src/backend/cuda/*.cu | xargs -P "$(nproc)" -I{} bash -c 'compile {}' >"$logs/failures" 2>&1
status=0
if [[ -s $logs/failures ]]; then
    cat "$logs/failures"
    status=1
fi
# ptxas: "Function properties for NAME", then "N bytes stack frame, S bytes spill stores, L bytes
# spill loads", then "Used R registers".
for log in "$logs"/*.cu.log; do
    awk -v file="$(basename "$log" .log)" '
        /Function properties for/ { fn = $NF }
        /bytes spill stores/ { stack = $1; stores = $5; loads = $9 }
        /Used [0-9]+ registers/ && fn != "" {
            for (i = 1; i <= NF; ++i) if ($i == "Used") regs = $(i + 1)
            printf "%s %s %s %s %s %s\n", file, fn, regs, stack, stores, loads
            fn = ""
        }' "$log"
done | sort -u >"$logs/kernels"
while read -r file fn regs stack stores loads; do
    name=$(echo "$fn" | c++filt 2>/dev/null | sed -E 's/\(anonymous namespace\):://g; s/\(.*//; s/^glm5::backend::cuda:://')
    printf '%-22s %-60s %3s registers, %4s B stack, %s B spilled\n' "$file" "${name:0:60}" \
        "$regs" "$stack" "$((stores + loads))"
    if ((stores + loads > 0)); then
        echo "FAIL: $name ($file) spills $stores bytes to local memory and loads $loads back"
        status=1
    fi
done <"$logs/kernels"
n=$(wc -l <"$logs/kernels")
((n > 0)) || { echo "FAIL: ptxas reported no kernel"; status=1; }
echo "cuda-ptxas: $n kernels for sm_$arch, $( ((status == 0)) && echo "no spills" || echo FAILED)"
exit $status

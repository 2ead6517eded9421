#!/usr/bin/env bash
# The GPU check: one command on the lent GPU machine (CUDA toolkit, CMake and ninja; no
# Debian packages, no network), prepared here, where the build has its packages.
#
#   bash scripts/device-check.sh prepare   # here: build, bundle, hide the large fixtures
#   (device tool) run  command: bash scripts/device-check.sh   carry: [".device"]
#   (device tool) run  command: bash scripts/device-check.sh compare   (while warm: below)
#   bash scripts/device-check.sh restore   # here, always after the call: the index back
#
# prepare builds build/ with the CUDA backend (GLM5_CUDA=ON: sm_80, sm_89, sm_90), copies
# the glm5 binary, the GPU tests, the two tiny fixtures they read and the shared libraries
# they need that the GPU machine lacks (libpng, libjpeg, Open MPI; not glibc, libstdc++ or
# CUDA's) into .device/, and keeps the tree that travels under its 64 MiB (about 50 MiB;
# 56 with llama.cpp's sources): tests/data (76 MB) and models/kjv-mini.gguf (10 MB, inside
# glm5 already) are untracked and ignored until `restore` puts the index back.
#
# On the GPU machine (no argument) it runs, each step timed and its output under $OUT
# when set: nvidia-smi; the `gpu` tests (what `ctest -L gpu` runs: every test_cuda_*
# binary); compute-sanitizer's memcheck over a short filter of them; the products'
# bandwidth against a device-to-device copy (bench/gpu_products); the default model's greedy
# ids on the GPU beside the CPU's (GLM5_CUDA_FORWARD=1). It exits non-zero when a step fails.
#
# `compare` (a second call on the warm machine: about 5 minutes on a bare one) builds
# llama.cpp's CUDA llama-bench (sm_90) from the source `prepare` packed when LLAMA_SRC
# named the ngxson fork's checkout (commit 3f545becc), makes the bench model, and runs
# bench/compare.sh: glm5 bench beside llama-bench -ngl 99 on the same file. Outputs
# kept in /tmp (the build, the model) are not made again.
set -uo pipefail
cd "$(dirname "$0")/.."

bundle=.device
exclude=.git/info/exclude

prepare() {
    set -e
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=ON -DGLM5_CUDA=ON >/dev/null
    local gpu_tests
    gpu_tests=$(cd tests && ls test_cuda_*.cpp | sed 's/\.cpp$//')
    cmake --build build -j"$(nproc)" --target glm5 gpu_products $gpu_tests
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/lib"
    cp build/glm5 build/bench/gpu_products "$bundle/bin/"
    for t in $gpu_tests; do cp "build/tests/$t" "$bundle/bin/"; done
    strip --strip-unneeded "$bundle"/bin/*
    # The fixtures the GPU tests read (tests/data itself stays behind).
    mkdir -p "$bundle/data/glm-dsa" "$bundle/data/glm5next"
    cp tests/data/glm-dsa/tiny.gguf "$bundle/data/glm-dsa/"
    cp tests/data/glm5next/tiny.gguf "$bundle/data/glm5next/"
    # Every library the binaries load, less the C and C++ runtimes (newer on the GPU
    # machine's image) and CUDA's own (its toolkit is there).
    for b in "$bundle"/bin/*; do ldd "$b" || exit 1; done | awk '/=> \// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnv' |
        while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
    mkdir -p "$(dirname "$exclude")"
    touch "$exclude"
    if [[ -n ${LLAMA_SRC:-} ]]; then
        # The sources a CUDA llama-bench needs, without the other backends (6 MB).
        local skip=()
        for d in build models docs media examples tests gguf-py .devops benches conversion \
            skills pocs scripts ggml/src/ggml-{vulkan,sycl,cann,metal,opencl,hexagon,musa} \
            ggml/src/ggml-{openvino,webgpu,zdnn,zendnn,virtgpu,et,hip}; do
            skip+=(--exclude="./$d")
        done
        tar -C "$LLAMA_SRC" -cJf "$bundle/llama-src.tar.xz" "${skip[@]}" .
    fi
    # What the check does not read stays behind: the fixtures (but those copied above) and
    # the default model's file (glm5 carries it inside).
    for p in /tests/data/ /models/kjv-mini.gguf; do
        grep -qxF "$p" "$exclude" || echo "$p" >>"$exclude"  # ($bundle: .gitignore)
    done
    git rm -r -q --cached tests/data models/kjv-mini.gguf
    echo "prepared: $(du -sh "$bundle" | cut -f1) in $bundle; tests/data and" \
        "models/kjv-mini.gguf untracked for the call."
    echo "now: device run, command 'bash scripts/device-check.sh', carry [\"$bundle\"];"
    echo "then, whatever happened: bash scripts/device-check.sh restore"
}

restore() {
    git reset -q -- tests/data models/kjv-mini.gguf
    [[ -f $exclude ]] && sed -i '\|^/tests/data/$|d; \|^/models/kjv-mini.gguf$|d' "$exclude"
    git status --short tests/data models | head -3
    echo "restored: tests/data and models/kjv-mini.gguf are tracked again"
}

stage=${1:-check}
case $stage in
prepare) prepare; exit ;;
restore) restore; exit ;;
check | compare) ;;
*) echo "usage: $0 [prepare|restore|compare]" >&2; exit 2 ;;
esac

# ---- on the GPU machine ---------------------------------------------------------------
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
cuda_lib=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
export LD_LIBRARY_PATH="$PWD/$bundle/lib:$cuda_lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export GLM5_TEST_DATA="$PWD/$bundle/data"
failed=()
step() {  # step NAME COMMAND...: runs it, its output to $out/NAME.log and the tail here
    local name=$1 t0=$SECONDS rc
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.log" 2>&1
    rc=$?
    tail -n "${TAIL:-15}" "$out/$name.log"
    echo "== $name: exit $rc, $((SECONDS - t0)) s"
    ((rc == 0)) || failed+=("$name")
}

[[ -x $bundle/bin/glm5 ]] || { echo "no $bundle/bin/glm5: run 'prepare' here first and carry $bundle"; exit 2; }

if [[ $stage == compare ]]; then
    llama=/tmp/llama-cuda/bin/llama-bench
    if [[ ! -x $llama ]]; then
        [[ -f $bundle/llama-src.tar.xz ]] ||
            { echo "no $bundle/llama-src.tar.xz: prepare with LLAMA_SRC=<llama.cpp checkout>"; exit 2; }
        build_llama() (
            set -e
            rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src
            tar -C /tmp/llama-src -xJf "$bundle/llama-src.tar.xz"
            # No AMX (its path aborts on glm-dsa); the layers run on the GPU anyway.
            cmake -S /tmp/llama-src -B /tmp/llama-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
                -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_AVX2=ON \
                -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
                -DLLAMA_BUILD_APP=OFF
            cmake --build /tmp/llama-cuda -j"$(nproc)" --target llama-bench
        )
        TAIL=5 step llama-build build_llama
    fi
    TAIL=3 step models env TYPES=q4_k_m bash bench/make_bench_models.sh /tmp/bench-models \
        "$bundle/bin/glm5"
    TAIL=12 step compare env GLM5="$PWD/$bundle/bin/glm5" LLAMA_BENCH=$llama \
        LLAMA_FLAGS="-ngl 99" TYPES=q4_k_m ROUNDS=2 THREADS="$(nproc)" \
        bash bench/compare.sh /tmp/bench-models
    ((${#failed[@]} == 0)) || { echo "compare: FAILED: ${failed[*]} (logs in $out)"; exit 1; }
    exit 0
fi
step gpu nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv
for t in "$bundle"/bin/test_cuda_*; do
    step "$(basename "$t")" "$t" --gtest_brief=1
done
if command -v compute-sanitizer >/dev/null; then
    TAIL=8 step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bundle/bin/test_cuda_products" --gtest_brief=1 \
        --gtest_filter='*Q4_K:*IQ2_XXS:*Q6_K:*BF16:CudaDevice.*'
    TAIL=8 step memcheck-backend compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bundle/bin/test_cuda_backend" --gtest_brief=1 \
        --gtest_filter='CudaOps.*:CudaGlmDsa.LogitsAgreeWithTheCpu'
else
    echo "== memcheck: compute-sanitizer is not on the PATH"
fi
TAIL=40 step bench "$bundle/bin/gpu_products"
# The embedded default model (glm-dsa) greedy on the GPU and on the CPU: their replies.
TAIL=6 step cli-device bash -c 'for d in cuda none; do
        GLM5_CUDA_FORWARD=1 "$0" run --device $d --tokens 1,2,3,4,5 -n 32 --temp 0 \
            --print-ids --ignore-eos 2>/dev/null | tail -1 | sed "s/^/$d: /"
    done' "$bundle/bin/glm5"
echo
if ((${#failed[@]})); then
    echo "device check: FAILED: ${failed[*]} (logs in $out)"
    exit 1
fi
echo "device check: all steps passed (logs in $out)"

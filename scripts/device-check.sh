#!/usr/bin/env bash
# The GPU check: one command on the lent GPU machine (CUDA toolkit, CMake and ninja; no
# Debian packages, no network), prepared here, where the build has its packages.
#
#   bash scripts/device-check.sh prepare   # here: build, bundle, set the large files aside
#   (device tool) run  command: bash scripts/device-check.sh   carry: [".device"]
#   (device tool) run  command: bash scripts/device-check.sh compare   (while warm: below)
#   bash scripts/device-check.sh restore   # here, always after the call: the files back
#
# prepare builds build-cuda/ with the CUDA backend (GLM5_CUDA=ON: sm_80, sm_89, sm_90; the
# suite's build/ is the simulation build), copies the glm5 binary, the GPU tests, the
# fixtures they read and the shared libraries they need that the GPU machine lacks (libpng,
# libjpeg, Open MPI; not glibc, libstdc++ or CUDA's: the CUDA runtime is linked in statically,
# and nothing else of CUDA's is used) into .device/, and keeps the tree that travels under
# its 64 MiB: tests/data (76 MB) and models/kjv-mini.gguf (inside glm5 already) are moved
# into .git/device-aside until `restore` puts them back. The index is not touched, and a
# commit is refused while they are aside (a hook that `restore` removes), so no commit can
# record them deleted.
#
# On the GPU machine (no argument) it runs, each step timed and its output under $OUT
# when set: nvidia-smi; the libraries glm5 loads; the `gpu` tests (every test_cuda_*
# binary: the products, the ops and both tiny models against the CPU, and the glm5 binary
# end to end: run, logits, speculation, serve); compute-sanitizer's memcheck over a short
# filter of them; the products' bandwidth against a device-to-device copy (bench/gpu_products);
# the default model's greedy ids on the GPU and on the CPU, which must be the same
# (GLM5_CUDA_FORWARD=1). It exits non-zero when a step fails.
#
# `compare` (a second call on the warm machine: about 5 minutes on a bare one) builds
# llama.cpp's CUDA llama-bench (sm_90) from the source `prepare` packed when LLAMA_SRC
# named the ngxson fork's checkout (commit 3f545becc), makes the bench model, and runs
# bench/compare.sh: glm5 bench on the GPU (--device cuda) beside llama-bench -ngl 99 on the
# same file. Outputs kept in /tmp (the build, the model) are not made again.
set -uo pipefail
cd "$(dirname "$0")/.."

bundle=.device
aside=$(git rev-parse --git-dir)/device-aside
hook=$(git rev-parse --git-dir)/hooks/pre-commit
large=(tests/data models/kjv-mini.gguf)

prepare() {
    set -e
    [[ ! -e $aside ]] || { echo "already prepared: run '$0 restore' first" >&2; exit 2; }
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DGLM5_BUILD_TESTS=ON -DGLM5_CUDA=ON \
        -DGLM5_CUDA_SIM=OFF >/dev/null
    local gpu_tests
    gpu_tests=$(cd tests && ls test_cuda_*.cpp | sed 's/\.cpp$//')
    cmake --build build-cuda -j"$(nproc)" --target glm5 gpu_products $gpu_tests
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/lib"
    cp build-cuda/glm5 build-cuda/bench/gpu_products "$bundle/bin/"
    for t in $gpu_tests; do cp "build-cuda/tests/$t" "$bundle/bin/"; done
    strip --strip-unneeded "$bundle"/bin/*
    # The fixtures the GPU tests read (tests/data itself stays behind; the default model's
    # file is written out of glm5 there).
    mkdir -p "$bundle/data/glm-dsa" "$bundle/data/glm5next"
    cp tests/data/glm-dsa/tiny.gguf "$bundle/data/glm-dsa/"
    cp tests/data/glm5next/tiny.gguf "$bundle/data/glm5next/"
    # Every library the binaries load, less the C and C++ runtimes (newer on the GPU
    # machine's image) and CUDA's own (its toolkit is there).
    for b in "$bundle"/bin/*; do ldd "$b" || exit 1; done | awk '/=> \// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnv' |
        while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
    echo "bundled libraries: $(cd "$bundle/lib" && ls | tr '\n' ' ')"
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
    # What the check does not read stays behind, out of the working tree (the index keeps
    # them: `git status` shows them deleted until restore).
    mkdir -p "$aside"
    for p in "${large[@]}"; do
        mkdir -p "$aside/$(dirname "$p")"
        mv "$p" "$aside/$p"
    done
    mkdir -p "$(dirname "$hook")"
    [[ ! -e $hook ]] || mv "$hook" "$hook.before-device-check"
    printf '#!/bin/sh\necho "device-check.sh is prepared: tests/data and models/kjv-mini.gguf are set aside; run scripts/device-check.sh restore before committing" >&2\nexit 1\n' >"$hook"
    chmod +x "$hook"
    echo "prepared: $(du -sh "$bundle" | cut -f1) in $bundle; ${large[*]} set aside in $aside."
    echo "now: device run, command 'bash scripts/device-check.sh', carry [\"$bundle\"];"
    echo "then, whatever happened: bash scripts/device-check.sh restore"
}

restore() {
    if [[ -d $aside ]]; then
        for p in "${large[@]}"; do
            [[ -e $aside/$p ]] || continue
            rm -rf "$p"
            mkdir -p "$(dirname "$p")"
            mv "$aside/$p" "$p"
        done
        rm -rf "$aside"
    fi
    rm -f "$hook"
    [[ ! -e $hook.before-device-check ]] || mv "$hook.before-device-check" "$hook"
    git status --short -- "${large[@]}" | head -3
    echo "restored: ${large[*]} are back"
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
export GLM5_BINARY="$PWD/$bundle/bin/glm5"
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
        GLM5_CUDA_FORWARD=1 GLM5_FLAGS="--device cuda" LLAMA_FLAGS="-ngl 99" TYPES=q4_k_m \
        ROUNDS=2 THREADS="$(nproc)" bash bench/compare.sh /tmp/bench-models
    ((${#failed[@]} == 0)) || { echo "compare: FAILED: ${failed[*]} (logs in $out)"; exit 1; }
    exit 0
fi
step gpu nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv
# What glm5 needs from the machine: the CUDA runtime is linked in; the driver's libcuda is
# loaded at run time.
TAIL=20 step libraries ldd "$bundle/bin/glm5"
# The default model's file, for `glm5 logits` in the tests: glm5 writes the one it carries.
GLM5_CACHE="$PWD/$bundle/cache" "$GLM5_BINARY" run --tokens 1 -n 1 >/dev/null 2>&1
cp "$bundle"/cache/kjv-mini-*.gguf "$GLM5_TEST_DATA/kjv-mini.gguf" ||
    echo "== the default model could not be written out of glm5"
for t in "$bundle"/bin/test_cuda_*; do
    step "$(basename "$t")" "$t" --gtest_brief=1
done
if command -v compute-sanitizer >/dev/null; then
    # (Not the test that asks for twice the card's memory: the sanitizer reports that
    # refused allocation as an error.)
    TAIL=8 step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bundle/bin/test_cuda_products" --gtest_brief=1 \
        --gtest_filter='*Q4_K:*IQ2_XXS:*Q6_K:*BF16:CudaDevice.*:-CudaDevice.MemoryThatDoesNotFit*'
    TAIL=8 step memcheck-backend compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bundle/bin/test_cuda_backend" --gtest_brief=1 \
        --gtest_filter='CudaOps.*:CudaGlmDsa.LogitsAgreeWithTheCpu'
else
    echo "== memcheck: compute-sanitizer is not on the PATH"
fi
TAIL=40 step bench "$bundle/bin/gpu_products"
# The embedded default model (glm-dsa) greedy on the GPU and on the CPU: the same ids, or the
# step fails (each run's stderr is in the log).
same_ids() {
    local gpu cpu
    gpu=$(GLM5_CUDA_FORWARD=1 "$GLM5_BINARY" run --device cuda --tokens 1,2,3,4,5 -n 32 --temp 0 \
        --print-ids --ignore-eos) || { echo "the GPU run failed"; return 1; }
    cpu=$("$GLM5_BINARY" run --device none --tokens 1,2,3,4,5 -n 32 --temp 0 --print-ids \
        --ignore-eos) || { echo "the CPU run failed"; return 1; }
    echo "cuda: $gpu"
    echo "none: $cpu"
    [[ -n $gpu && $gpu == "$cpu" ]] || { echo "the GPU's ids differ from the CPU's"; return 1; }
}
TAIL=8 step cli-device same_ids
echo
if ((${#failed[@]})); then
    echo "device check: FAILED: ${failed[*]} (logs in $out)"
    exit 1
fi
echo "device check: all steps passed (logs in $out)"

#!/usr/bin/env bash
# Sanitizer builds over a reduced test set that covers every component (CI runs
# it from scripts/test.sh):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer: the unit tests of each
#         layer (thread pool, GGUF reader on its malformed corpus, quant and its
#         multi-row kernels, the attention kernels, tokenizer, reply parser,
#         image decoding), the glm-dsa and glm5next parity tests, the engine
#         (faults and the submit/cancel stress included), the server's in-process
#         tests and the load-path fuzz corpus; and the CUDA backend in the simulator
#         (every product, every op, both models' forwards on the simulated devices:
#         device memory and the arena's carvings are watched, so a kernel reading past
#         an allocation or a released temporary is reported with its line). No test
#         here starts the glm5 binary, so it is not built (GLM5_TESTS_WITHOUT_APP).
#   tsan  ThreadSanitizer: the engine and server tests, the thread pool, and the CUDA
#         backend in the simulator, where each CUDA thread is a thread to it (a missing
#         __syncthreads is a race it reports; the products, the ops, a forward of each
#         model on the second device from another thread). cpp-httplib is compiled in
#         from its header (Debian's source package, which scripts/deps.sh fetches),
#         since Debian's compiled library is not instrumented; the server tests start
#         the instrumented glm5 binary.
# Usage: scripts/sanitize.sh [asan|tsan|all]   (build folders build-asan, build-tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=$(nproc)

# An entry is BINARY or BINARY:ARGS. (Glm5NextCli runs the glm5 binary.)
asan_tests=(test_thread_pool test_gguf_malformed test_quant_basic test_quant_multi
            test_quant_repack test_backend_attention test_text_tokenizer test_text_reply test_image
            test_glm_dsa_parity "test_glm5next:--gtest_filter=-Glm5NextCli.*"
            test_engine test_engine_faults test_engine_stress test_server_unit
            test_fuzz_load_corpus test_cudasim test_cuda_products
            "test_cuda_backend:--gtest_filter=CudaOps.*:CudaVision.*:CudaHybrid.HostExpertsBegin*:CudaGraphs.*")
# (The SIGTERM test waits for a 2500-token stream to finish within the 30 s drain
# timeout, which an instrumented server on a busy machine may not make; the other
# shutdown tests cover the same code. The graph test of 20 decode steps takes nearly 4 minutes
# under ThreadSanitizer; the one of steps captured, replayed and then launched eagerly runs
# the same recorder in under one.)
tsan_tests=(test_thread_pool test_engine test_engine_stress
            "test_server_http:--gtest_filter=-ServerShutdown.SigtermFinishesInFlightStreamsAndExitsZero"
            test_server_backpressure
            "test_server_limits:--gtest_filter=ServerLimits.*:ServerKeepAlive.*"
            "test_cudasim:--gtest_filter=CudaSim.*:CudaSimBackend.TheSecondDevice*"
            test_cuda_products
            "test_cuda_backend:--gtest_filter=CudaOps.*:CudaVision.*:CudaHybrid.HostExpertsBegin*:CudaGraphs.StepsThatNeverRepeat*")

# Debian's cpp-httplib source (the single header its library is built from),
# which scripts/deps.sh fetches into .cache/cpp-httplib.
httplib_header_dir() {
  local h
  h=$(ls .cache/cpp-httplib/*/httplib.h 2>/dev/null | head -1)
  if [[ -z $h ]]; then
    echo "sanitize: no cpp-httplib header in .cache/cpp-httplib: run scripts/deps.sh" >&2
    exit 1
  fi
  dirname "$h"
}

# -O1 with line tables: instrumented SIMD kernels at -O2 -g take minutes each to
# compile (repack_avx512.cpp: 29 s of CPU at -O1 -g1, over 8 minutes at -O2 -g).
build_type=(-DCMAKE_BUILD_TYPE=Sanitize "-DCMAKE_CXX_FLAGS_SANITIZE=-O1 -g1"
            "-DCMAKE_C_FLAGS_SANITIZE=-O1 -g1")

passed=0
failed=0
# Runs test binaries nproc at a time, each with its own log; prints the logs of
# failures and counts them.
run_set() {
  local build=$1; shift
  local logs=$build/sanitize-logs
  rm -rf "$logs" && mkdir -p "$logs"
  # An entry is BINARY or BINARY:ARGS.
  printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c \
    'e="{}"; b=${e%%:*}; a=""; [[ $e == *:* ]] && a=${e#*:}
     t0=$(date +%s)
     if '"$build"'/tests/$b $a > '"$logs"'/$b.log 2>&1; then r=ok; else r=fail; fi
     echo $r > '"$logs"'/$b.rc; echo "$(( $(date +%s) - t0 )) s  $b  $r" >> '"$logs"'/times'
  # Wall time of each binary (they run side by side), slowest first.
  sort -rn "$logs/times" | sed "s/^/  $(basename "$build"): /"
  local bad=0
  for e in "$@"; do
    local t=${e%%:*}
    if [[ $(cat "$logs/$t.rc") == ok ]]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      bad=1
      echo "=== $t failed under $(basename "$build"):" >&2
      tail -n 80 "$logs/$t.log" >&2
    fi
  done
  ((bad == 0))
}

status=0
if [[ $what == asan || $what == all ]]; then
  start=$SECONDS
  cmake -S . -B build-asan "${build_type[@]}" -DGLM5_SANITIZE=ON -DGLM5_BUILD_BENCH=OFF -DGLM5_CUDA_SIM=ON \
    -DGLM5_TESTS_WITHOUT_APP=ON > /dev/null
  cmake --build build-asan -j"$jobs" --target "${asan_tests[@]%%:*}"
  built=$SECONDS
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_set build-asan "${asan_tests[@]}" || status=1
  echo "sanitize asan: build $((built - start)) s, tests $((SECONDS - built)) s"
fi
if [[ $what == tsan || $what == all ]]; then
  start=$SECONDS
  hdir=$(httplib_header_dir)
  cmake -S . -B build-tsan "${build_type[@]}" -DGLM5_TSAN=ON -DGLM5_BUILD_BENCH=OFF -DGLM5_CUDA_SIM=ON \
    -DGLM5_HTTPLIB_DIR="$PWD/$hdir" > /dev/null
  cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]%%:*}"
  built=$SECONDS
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    run_set build-tsan "${tsan_tests[@]}" || status=1
  echo "sanitize tsan: build $((built - start)) s, tests $((SECONDS - built)) s"
fi
echo "sanitizers: $passed passed, $failed failed"
exit $status

#!/usr/bin/env bash
# glm5 serve under concurrency: N streams at once (default 4) against 1, on the bench
# model. Prints the aggregate generated tokens/s of each and their ratio (the engine
# decodes all slots in one forward, reading the weights once, so N streams should get
# well over 1x; the target for 4 is >= 2x). Prints numbers, never passes or fails.
# Each round runs 1 stream and then N, and the ratio reported is the median of the
# rounds' ratios: the machine's speed drifts, and only runs close in time compare.
# The same ratio inside the engine (tokens per second of forward time, from /metrics)
# follows, telling the model's batch scaling apart from HTTP and client overhead, and
# the bandwidth ceiling of the ratio (weight bytes per generated token of one stream
# over those of the batch, from /metrics).
#
# usage: bench/serve_concurrency.sh [MODEL] [GLM5_BINARY]
#   MODEL        default bench/out/bench-q4_k_m.gguf (bench/make_bench_models.sh bench/out)
#   GLM5_BINARY  default $GLM5, then build/glm5
# env: STREAMS (4), TOKENS per request (64), THREADS (all cores), ROUNDS (3),
#      GLM5_FLAGS (extra serve flags, default "--no-mmap --repack" as bench/compare.sh)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=${1:-$repo/bench/out/bench-q4_k_m.gguf}
glm5=${2:-${GLM5:-$repo/build/glm5}}
streams=${STREAMS:-4}
tokens=${TOKENS:-64}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
glm5_flags=${GLM5_FLAGS:---no-mmap --repack}
for f in "$model" "$glm5"; do
    if [[ ! -e $f ]]; then
        echo "$0: $f does not exist (bench/make_bench_models.sh makes the model; build glm5)" >&2
        exit 2
    fi
done
command -v curl >/dev/null || { echo "$0: curl is required" >&2; exit 2; }

work=$(mktemp -d)
server_pid=
cleanup() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# shellcheck disable=SC2086  # glm5_flags is a list of flags
"$glm5" serve -m "$model" --port 0 --threads "$threads" --parallel "$streams" --ctx-size 1024 \
    --no-log-requests $glm5_flags 2>"$work/server.log" &
server_pid=$!
port=
for _ in $(seq 1 600); do
    port=$(grep -o 'listening on http://[^ ]*' "$work/server.log" | sed 's/.*://' || true)
    [[ -n $port ]] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.2
done
[[ -n $port ]] || { echo "$0: the server did not start" >&2; cat "$work/server.log" >&2; exit 1; }
url=http://127.0.0.1:$port/v1/completions

# One request: a distinct short prompt, greedy, exactly $tokens tokens.
request() {
    curl -sf "$url" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"Story number $1 begins:\",\"max_tokens\":$tokens,\"temperature\":0,\"ignore_eos\":true}" \
        >"$work/reply.$1"
}

# $1 requests at once; prints "tokens seconds".
run() {
    local n=$1 t0 t1 total=0 pids=()
    t0=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
        request "$i" &
        pids+=($!)
    done
    wait "${pids[@]}" || true
    t1=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
        local c
        c=$(grep -o '"completion_tokens":[0-9]*' "$work/reply.$i" | cut -d: -f2 || true)
        total=$((total + ${c:-0}))
    done
    awk -v a="$t0" -v b="$t1" -v t="$total" 'BEGIN { printf "%d %.3f\n", t, b - a }'
}

rate() {  # tokens/s of one run of $1 streams; logs the run
    local line
    line=$(run "$1")
    echo "  $1 stream(s): $(echo "$line" | awk '{ printf "%d tokens in %.2f s = %.1f tokens/s", $1, $2, ($2 > 0 ? $1 / $2 : 0) }')" >&2
    echo "$line" | awk '{ print ($2 > 0 ? $1 / $2 : 0) }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# The engine's own account of a phase (from /metrics): forwards, time per forward,
# tokens per forward. Tells the model's batch scaling apart from HTTP overhead.
metric() { curl -sf "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }
snapshot() {
    echo "$(metric glm5_forwards_total) $(metric glm5_forward_seconds_total)" \
        "$(metric glm5_generated_tokens_total) $(metric glm5_weight_bytes_read_total)"
}
engine_report() {  # $1 $2: snapshots before and after
    echo "$1 $2" | awk '{ f = $5 - $1; s = $6 - $2; t = $7 - $3;
        if (f > 0) printf "  engine: %d forwards, %.1f ms per forward, %.2f tokens per forward\n", f, 1000 * s / f, t / f }' >&2
}
engine_bytes() {  # $1 $2: snapshots; weight bytes read per generated token
    echo "$1 $2" | awk '{ t = $7 - $3; print (t > 0 ? ($8 - $4) / t : 0) }'
}
engine_rate() {  # $1 $2: snapshots; generated tokens per second of forward time
    echo "$1 $2" | awk '{ s = $6 - $2; print (s > 0 ? ($7 - $3) / s : 0) }'
}

echo "model $(basename "$model"), $threads threads, $tokens tokens per request, $rounds rounds, flags: $glm5_flags" >&2
request 0  # warm-up: pages in the weights
ones=() manys=() ratios=() engine_ratios=() ceilings=()
for r in $(seq 1 "$rounds"); do
    echo "round $r/$rounds" >&2
    s0=$(snapshot)
    a=$(rate 1)
    s1=$(snapshot)
    engine_report "$s0" "$s1"
    b=$(rate "$streams")
    s2=$(snapshot)
    engine_report "$s1" "$s2"
    ones+=("$a") manys+=("$b")
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')")
    # The same ratio inside the engine: tokens per second of forward time,
    # without HTTP, client start-up and scheduling gaps.
    ea=$(engine_rate "$s0" "$s1") eb=$(engine_rate "$s1" "$s2")
    engine_ratios+=("$(awk -v a="$ea" -v b="$eb" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')")
    # Where decode is bound by reading the weights, the ratio cannot pass the
    # weight bytes per token of one stream over those of the batch.
    ba=$(engine_bytes "$s0" "$s1") bb=$(engine_bytes "$s1" "$s2")
    ceilings+=("$(awk -v a="$ba" -v b="$bb" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')")
done
one=$(printf '%s\n' "${ones[@]}" | median)
many=$(printf '%s\n' "${manys[@]}" | median)
ratio=$(printf '%s\n' "${ratios[@]}" | median)
eratio=$(printf '%s\n' "${engine_ratios[@]}" | median)
ceiling=$(printf '%s\n' "${ceilings[@]}" | median)
awk -v a="$one" -v b="$many" -v n="$streams" -v q="$ratio" -v each="${ratios[*]}" \
    -v e="$eratio" -v eeach="${engine_ratios[*]}" -v c="$ceiling" 'BEGIN {
    printf "1 stream:   %8.1f tokens/s (median)\n", a
    printf "%d streams: %8.1f tokens/s aggregate (median)\n", n, b
    printf "ratio:      %8.2fx (median of the rounds: %s; target >= 2x for 4 streams)\n", q, each
    printf "in-engine:  %8.2fx (tokens per second of forward time; rounds: %s)\n", e, eeach
    if (c > 0)
        printf "ceiling:    %8.2fx (weight bytes per token, one stream over %d; the ratio is %.0f%% of it)\n", c, n, 100 * q / c
}'

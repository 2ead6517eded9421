#!/usr/bin/env bash
# glm5 --layer-split and --tp under mpirun, end to end (ctest runs one case per test):
#   layer_split.sh CASE GLM5 SOURCE_DIR
# logits   logits of 2 and 3 ranks are bitwise those of one process (both architectures)
# run      greedy output (plain, n-gram and NextN speculation) equals one process's
# serve    a split server answers concurrent requests exactly as a one-process server,
#          and a bad request gets its 4xx without harming the others
# faults   a stopped rank ends the job, named by rank 0, within the deadline; a killed
#          rank ends it too (mpirun names it)
# bench    each rank reports the weight bytes it reads per token; together they are the
#          bytes one process reads (the cut shares the layers, nobody reads another's)
# hosts    two ranks as two hosts: network namespaces joined by a veth pair (198.18.0.1
#          and .2, the benchmarking range), `ip netns exec` as mpirun's launch agent, MPI's
#          TCP transport on those addresses only; logits and greedy output equal one
#          process's (needs root: CI runs as root)
# tp       tensor parallelism (heads and expert strips, both architectures): logits of 2 and 3 ranks within 1e-4 of one
#          process's with F32 caches, greedy output (plain and NextN) identical, each rank
#          reading fewer weight bytes per token than one process
# refusals ranks that do not match --layer-split, no mpirun, an impossible split and
#          files that differ between ranks: exit 2 with the reason on every rank
set -uo pipefail
case_=$1
glm5=$2
src=$3
mpi="$src/scripts/mpirun-local.sh"
data="$src/tests/data"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -9 -f "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

same() {  # same FILE_A FILE_B WHAT
  cmp -s "$1" "$2" || fail "$3: outputs differ"
  [[ -s $1 ]] || fail "$3: empty output"
}

case $case_ in
logits)
  for m in glm-dsa/tiny.gguf glm5next/tiny.gguf; do
    "$glm5" logits --model "$data/$m" -t 1 --tokens 5,9,17,33,65,129,257,3,7,11 --all \
      >"$work/one.json" 2>/dev/null || fail "$m: one process"
    for np in 2 3; do
      "$mpi" "$np" "$glm5" logits --model "$data/$m" --layer-split "$np" -t 1 \
        --tokens 5,9,17,33,65,129,257,3,7,11 --all >"$work/split.json" 2>"$work/err" ||
        { cat "$work/err"; fail "$m: $np ranks"; }
      same "$work/one.json" "$work/split.json" "$m logits, $np ranks"
      [[ $(grep -c "^glm5: rank [0-9]/$np: layers" "$work/err") == "$np" ]] ||
        fail "$m: every rank's banner"
      # The cut `glm5 inspect --plan --layer-split` shows is the one the ranks run.
      ran=$(sed -n "s|^glm5: rank \([0-9]\)/$np: layers \([0-9]*-[0-9]*\) .*|\1 \2|p" "$work/err" |
        sort | tr '\n' ' ')
      planned=$("$glm5" inspect "$data/$m" --plan --layer-split "$np" |
        sed -n 's/^| \([0-9]\) | layers \([0-9]*-[0-9]*\).*/\1 \2/p' | sort | tr '\n' ' ')
      [[ -n $ran && $ran == "$planned" ]] || fail "$m: ranks ran '$ran', inspect planned '$planned'"
      echo "$m: logits of $np ranks are bitwise one process's"
    done
  done
  # An image's rows enter rank 0's first layer (GLM-5.3-Flash's vision tower).
  # (The golden's first image is img-a.png.)
  ids=$(grep -o '"prompt_ids": *\[[0-9, ]*\]' "$data/glm5next/vision.golden.json" | head -1 |
    sed 's/.*\[//; s/\]//; s/ //g')
  [[ -n $ids ]] || fail "no prompt ids in the vision golden"
  v=(--model "$data/glm5next/tiny.gguf" --mmproj "$data/glm5next/mmproj-tiny.gguf"
    --image "$data/glm5next/img-a.png" --cache-type f32 -t 1 --tokens "$ids" --all)
  "$glm5" logits "${v[@]}" >"$work/one.json" 2>/dev/null || fail "image: one process"
  "$mpi" 3 "$glm5" logits "${v[@]}" --layer-split 3 >"$work/split.json" 2>"$work/err" ||
    { cat "$work/err"; fail "image: 3 ranks"; }
  same "$work/one.json" "$work/split.json" "logits with an image, 3 ranks"
  echo "glm5next with an image: logits of 3 ranks are bitwise one process's"
  ;;
run)
  # (The trained default's 4 layers can be cut in 2 parts only: its layers 1
  # and 3 reuse the indexer selection of the layer before them.)
  for spec in "" "--spec --spec-type ngram" "--spec --spec-type mtp"; do
    for m in "$src/models/kjv-mini.gguf" "$data/glm5next/tiny.gguf" "$data/glm-dsa/tiny.gguf"; do
      [[ $m == *glm5next* && $spec == *mtp* ]] && continue
      args=(run --model "$m" -t 1 --tokens 1,2,3,4,5,6 --print-ids -n 48 --temp 0 --ignore-eos $spec)
      "$glm5" "${args[@]}" >"$work/one.txt" 2>/dev/null || fail "$m $spec: one process"
      nps="2 3"
      [[ $m == *kjv* ]] && nps=2
      for np in $nps; do
        "$mpi" "$np" "$glm5" "${args[@]}" --layer-split "$np" >"$work/split.txt" 2>"$work/err" ||
          { cat "$work/err"; fail "$m $spec: $np ranks"; }
        same "$work/one.txt" "$work/split.txt" "$(basename "$m") ${spec:-plain}, $np ranks"
        [[ $m == *kjv* && $spec == *mtp* ]] && cp "$work/err" "$work/kjv-mtp.err"
      done
      echo "$m ${spec:-plain}: greedy output of $nps ranks equals one process's"
    done
  done
  grep -q "accepted [1-9]" "$work/kjv-mtp.err" ||
    fail "the NextN drafts were never accepted under the split"
  ;;
serve)
  start() {  # start NAME CMD... : waits for the listening line, sets $port
    "${@:2}" --port 0 >"$work/$1.out" 2>"$work/$1.err" &
    pids+=($!)
    for _ in $(seq 1 300); do
      port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$1.err" | head -1)
      [[ -n $port ]] && return 0
      sleep 0.1
    done
    cat "$work/$1.err"
    fail "$1 did not start"
  }
  MODE=${MODE:---layer-split 2}  # or --tp 2
  m="$src/models/kjv-mini.gguf"
  start one "$glm5" serve --model "$m" -t 1 --parallel 3 --ctx-size 512
  p1=$port
  start split "$mpi" 2 "$glm5" serve --model "$m" -t 1 --parallel 3 --ctx-size 512 $MODE
  p2=$port
  ask() {  # ask PORT PROMPT OUT
    curl -s -m 60 "http://127.0.0.1:$1/v1/completions" -H 'content-type: application/json' \
      -d "{\"prompt\": \"$2\", \"max_tokens\": 32, \"temperature\": 0}" |
      sed -n 's/.*"text":"\([^"]*\)".*/\1/p' >"$3"
  }
  prompts=("In the beginning" "And the LORD said" "Blessed are the" "And it came to pass")
  for port in $p1 $p2; do
    i=0
    for p in "${prompts[@]}"; do
      ask "$port" "$p" "$work/reply.$port.$i" &
      i=$((i + 1))
    done
    # A malformed request in the middle of them.
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
      -H 'content-type: application/json' -d '{"prompt": 5, "max_tokens": "x"}')
    [[ $code == 400 ]] || fail "a malformed request got $code on port $port"
    wait $(jobs -p | grep -v -e "${pids[0]}" -e "${pids[1]}") 2>/dev/null
  done
  for i in 0 1 2 3; do
    same "$work/reply.$p1.$i" "$work/reply.$p2.$i" "reply to '${prompts[$i]}'"
  done
  echo "4 concurrent completions from a 2-rank server equal the one-process server's"
  reused() {  # reused NAME PROMPT WHAT: both servers answer alike; the split one reused a prefix
    for port in $p1 $p2; do
      curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
        -d "{\"prompt\": \"$2\", \"max_tokens\": 24, \"temperature\": 0}" >"$work/$1.$port"
    done
    grep -q '"cached_tokens":[1-9]' "$work/$1.$p2" || { cat "$work/$1.$p2"; fail "no prefix $3"; }
    t1=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$work/$1.$p1")
    t2=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$work/$1.$p2")
    [[ -n $t1 && $t1 == "$t2" ]] || fail "a reply after a prefix $3 differs: '$t1' / '$t2'"
  }
  # Prefix reuse: an earlier prompt and its reply, continued, adopt the
  # retained sequence (rewound on every rank) and still answer the same.
  reused long "${prompts[1]}$(cat "$work/reply.$p1.1")" reused
  echo "a prompt extending an earlier one reuses its prefix on every rank and answers the same"
  # A prompt sharing only the start of that sequence (more than 16 tokens before its end)
  # copies the shared prefix into a sequence of its own, on every rank.
  reused early "${prompts[1]} and then" copied
  echo "a prompt sharing an earlier one's start copies its prefix on every rank and answers the same"
  ;;
faults)
  victim_pid() {  # victim_pid RANK: the pid of that rank of our job
    for p in $(pgrep -f -- "--model $work/"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done
  }
  cp "$data/glm-dsa/tiny.gguf" "$work/m.gguf"
  "$glm5" make-model --quiet --n-head 6 -o "$work/h6.gguf" >/dev/null || fail "make-model"
  for sig in STOP KILL TP-STOP; do
    victim=$([[ $sig == KILL ]] && echo 2 || echo 1)
    mode=(--model "$work/m.gguf" --layer-split 3)
    [[ $sig == TP-STOP ]] && mode=(--model "$work/h6.gguf" --tp 3) && sig=STOP
    "$mpi" 3 "$glm5" run "${mode[@]}" -t 1 --tokens 1,2,3 \
      --print-ids -n 200000 --ctx-size 262144 --ignore-eos --rank-timeout 5 \
      >"$work/f.out" 2>"$work/f.err" &
    job=$!
    pid=""
    # (Three ranks start slowly on a loaded machine: wait up to a minute.)
    for _ in $(seq 1 600); do
      pid=$(victim_pid "$victim")
      [[ -n $pid ]] && grep -q "^glm5: context" "$work/f.err" && break
      sleep 0.1
    done
    [[ -n $pid ]] || fail "rank $victim of the job not found"
    sleep 1  # decoding by now
    kill -"$sig" "$pid"
    t0=$(date +%s%N)
    for _ in $(seq 1 200); do
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$job" 2>/dev/null && { kill -9 "$pid"; fail "SIG$sig: the job still runs 20 s later"; }
    wait "$job"
    rc=$?
    took=$((($(date +%s%N) - t0) / 1000000))
    [[ $rc != 0 ]] || fail "SIG$sig: the job exited 0"
    if [[ $sig == STOP ]]; then
      grep -q "rank $victim: .*within 5 s (--rank-timeout)" "$work/f.err" ||
        { cat "$work/f.err"; fail "rank 0 did not name the stopped rank"; }
      kill -9 "$pid" 2>/dev/null
    else
      grep -q "rank $victim .*exited on signal 9" "$work/f.err" ||
        { cat "$work/f.err"; fail "the killed rank was not named"; }
    fi
    echo "SIG$sig to rank $victim (${mode[*]:2}): the job ended with exit code $rc $took ms later, naming the rank"
  done
  ;;
bench)
  m="$data/glm-dsa/tiny.gguf"
  "$glm5" bench --model "$m" -t 1 -p 0 -n 16 -r 1 >"$work/one.txt" 2>/dev/null || fail "bench"
  one=$(sed -n 's/^decode roofline: .*kernels: \([0-9.]*\) MB of weights.*/\1/p' "$work/one.txt")
  [[ -n $one ]] || { cat "$work/one.txt"; fail "no bytes per token from one process"; }
  "$mpi" 3 "$glm5" bench --model "$m" --layer-split 3 -t 1 -p 0 -n 16 -r 1 >"$work/split.txt" \
    2>"$work/err" || { cat "$work/err"; fail "bench on 3 ranks"; }
  # "| 1 | 1-2 | 560.00 KiB | ..." -> bytes read per token, per rank.
  sum=$(awk -F'|' '/^\| [0-9] \| [0-9]/ {
      split($4, v, " "); m = v[2] == "MiB" ? 1048576 : v[2] == "KiB" ? 1024 : 1;
      if (v[1] * m <= 0) bad = 1; s += v[1] * m; n++ }
      END { if (n != 3 || bad) print "bad"; else printf "%.4f", s / 1e6 }' "$work/split.txt")
  [[ $sum != bad && -n $sum ]] || { cat "$work/split.txt"; fail "the rank table"; }
  awk -v a="$one" -v b="$sum" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * a) }' ||
    fail "the ranks read $sum MB per token together, one process $one MB"
  echo "3 ranks read $sum MB of weights per token together; one process reads $one MB"
  # Four sequences in micro-batches of two: rank 1 gets each step's rows in
  # two messages, not one (and the output is the same: the serve case).
  for b in 1 2; do
    "$mpi" 2 "$glm5" bench --model "$m" --layer-split 2 --layer-split-batches $b -t 1 -p 0 \
      -n 8 -r 1 --parallel 4 >"$work/par$b.txt" 2>/dev/null || fail "bench --parallel 4"
  done
  msgs() { awk -F'|' '/^\| 1 \| [0-9]/ { print $6 + 0 }' "$1"; }
  m1=$(msgs "$work/par1.txt") m2=$(msgs "$work/par2.txt")
  awk -v a="$m1" -v b="$m2" 'BEGIN { exit !(a > 0 && b > a) }' ||
    fail "micro-batches: rank 1 exchanged $m2 messages a token with 2, $m1 with 1"
  echo "micro-batches of sequences: rank 1 exchanges $m2 messages a token with 2, $m1 with 1"
  ;;
hosts)
  [[ $(id -u) == 0 ]] || fail "the two-host test makes network namespaces: run it as root"
  ns_a="glm5a$$" ns_b="glm5b$$"
  teardown() { ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; cleanup; }
  trap teardown EXIT
  ip netns add "$ns_a" && ip netns add "$ns_b" &&
    ip link add "va$$" type veth peer name "vb$$" &&
    ip link set "va$$" netns "$ns_a" && ip link set "vb$$" netns "$ns_b" &&
    ip -n "$ns_a" addr add 198.18.0.1/30 dev "va$$" &&
    ip -n "$ns_b" addr add 198.18.0.2/30 dev "vb$$" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" link set "va$$" up && ip -n "$ns_b" link set "vb$$" up ||
    fail "cannot make the network namespaces"
  # mpirun runs in host A and starts host B's daemon through this agent.
  cat >"$work/agent.sh" <<AGENT
#!/bin/bash
echo "\$*" >>"$work/agent.log"
[[ \$1 == 198.18.0.2 ]] || { echo "unknown host \$1" >&2; exit 1; }
shift
exec ip netns exec "$ns_b" sh -c "\$*"
AGENT
  chmod +x "$work/agent.sh"
  two_hosts() {
    ip netns exec "$ns_a" mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      --host 198.18.0.1,198.18.0.2 --mca plm_rsh_agent "$work/agent.sh" \
      --mca btl self,tcp --mca btl_tcp_if_include 198.18.0.0/15 \
      --mca oob_tcp_if_include 198.18.0.0/15 --mca mpi_yield_when_idle 1 "$glm5" "$@"
  }
  m="$src/models/kjv-mini.gguf"
  "$glm5" logits --model "$m" -t 1 --tokens 5,9,17,33,65 --all >"$work/one.json" 2>/dev/null
  two_hosts logits --model "$m" --layer-split 2 -t 1 --tokens 5,9,17,33,65 --all \
    >"$work/split.json" 2>"$work/err" || { cat "$work/err"; fail "logits on two hosts"; }
  same "$work/one.json" "$work/split.json" "logits on two hosts"
  args=(run --model "$m" -t 1 --tokens 1,2,3 --print-ids -n 32 --temp 0 --ignore-eos --spec)
  "$glm5" "${args[@]}" >"$work/one.txt" 2>/dev/null
  two_hosts "${args[@]}" --layer-split 2 >"$work/split.txt" 2>"$work/err" ||
    { cat "$work/err"; fail "run on two hosts"; }
  same "$work/one.txt" "$work/split.txt" "greedy NextN decoding on two hosts"
  grep -q "^glm5: rank 1/2: layers" "$work/err" || fail "rank 1 did not run"
  grep -q "orted" "$work/agent.log" || fail "host B's daemon was not started by the agent"
  # The daemons' contact addresses: the namespaces' only.
  uris=$(grep -o 'tcp://[0-9.]*' "$work/agent.log" | sort -u | tr '\n' ' ')
  [[ -n $uris && $uris =~ ^(tcp://198\.18\.0\.[12] )+$ ]] || fail "contact addresses: $uris"
  echo "two ranks on two namespace hosts ($uris) give one process's logits and output"
  ;;
tp)
  # Logits as JSON, compared value by value (node is a test dependency).
  close() {  # close A B TOLERANCE
    node -e '
      const fs = require("fs");
      const [a, b] = [1, 2].map(i => JSON.parse(fs.readFileSync(process.argv[i])).logits.flat());
      if (a.length !== b.length || !a.length) process.exit(2);
      let d = 0;
      for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
      console.log(d);
      process.exit(d <= Number(process.argv[3]) ? 0 : 1);
    ' "$1" "$2" "$3"
  }
  argmax_agree() {  # argmax_agree A B DIFF: same top token wherever A's top-2 margin > 2 DIFF
    node -e '
      const fs = require("fs");
      const [a, b] = [1, 2].map(i => JSON.parse(fs.readFileSync(process.argv[i])).logits);
      const top = r => r.reduce((m, v, i) => (v > r[m] ? i : m), 0);
      for (let p = 0; p < a.length; p++) {
        const s = [...a[p]].sort((x, y) => y - x);
        if (s[0] - s[1] > 2 * Number(process.argv[3]) && top(a[p]) !== top(b[p])) process.exit(1);
      }
    ' "$1" "$2" "$3"
  }
  # Models whose 6 heads 2 and 3 ranks can share (the tiny shape, F32): with
  # experts of 48 hidden units (split in 2 and 3 strips) and of 32 (3 ranks
  # keep them whole).
  "$glm5" make-model --quiet --n-head 6 --n-ff-exp 48 -o "$work/h6.gguf" >/dev/null ||
    fail "make-model"
  "$glm5" make-model --quiet --n-head 6 -o "$work/h6w.gguf" >/dev/null || fail "make-model"
  # glm5next with 6 KDA and MLA heads and experts of 48 hidden units: 3 ranks too.
  "$glm5" make-model --quiet --arch glm5next --n-head 6 --n-ff-exp 48 -o "$work/g6.gguf" \
    >/dev/null || fail "make-model glm5next"
  for m in "$work/h6.gguf" "$src/models/kjv-mini.gguf" "$work/h6w.gguf" "$data/glm5next/tiny.gguf" \
    "$work/g6.gguf"; do
    toks=5,9,17,33,65,129,257,3,7,11
    "$glm5" logits --model "$m" -t 1 --cache-type f32 --tokens $toks --all >"$work/one.json" \
      2>/dev/null || fail "$m: one process"
    nps="2 3"
    [[ $m == *kjv* || $m == *glm5next/tiny* ]] && nps=2  # 4 heads
    [[ $m == *h6w* ]] && nps=3
    for np in $nps; do
      "$mpi" "$np" "$glm5" logits --model "$m" --tp "$np" -t 1 --cache-type f32 --tokens $toks \
        --all >"$work/tp.json" 2>"$work/err" || { cat "$work/err"; fail "$m: --tp $np"; }
      d=$(close "$work/one.json" "$work/tp.json" 1e-4) || fail "$m --tp $np: logits differ by $d"
      [[ $(grep -c "^glm5: rank [0-9]/$np: attention heads" "$work/err") == "$np" ]] ||
        fail "$m: every rank's banner"
      want="of every routed expert"
      [[ $m == *h6w* ]] && want="every expert whole"
      [[ $(grep -c "$want" "$work/err") == "$np" ]] || { cat "$work/err"; fail "$m: '$want'"; }
      for spec in "" "--spec"; do  # (glm5next: n-gram drafts)
        args=(run --model "$m" -t 1 --cache-type f32 --tokens 1,2,3,4,5,6 --print-ids -n 40
          --temp 0 --ignore-eos $spec)
        "$glm5" "${args[@]}" >"$work/one.txt" 2>/dev/null || fail "$m: run"
        "$mpi" "$np" "$glm5" "${args[@]}" --tp "$np" >"$work/tp.txt" 2>"$work/err" ||
          { cat "$work/err"; fail "$m: run --tp $np"; }
        same "$work/one.txt" "$work/tp.txt" "$(basename "$m") ${spec:-plain} greedy, --tp $np"
      done
      echo "$(basename "$m") --tp $np: logits within $d of one process's; greedy output identical"
    done
  done
  # Quantized strips: a Q4_K_M mix (Q6_K expert downs, Q5_0 attention outputs) whose experts'
  # 1536 hidden units are whole 256-value blocks at 2 and 3 ranks.
  "$glm5" make-model --quiet --type Q4_K_M --n-embd 256 --n-head 6 --n-ff-exp 1536 --n-expert 4 \
    --n-expert-used 2 --n-layer 4 -o "$work/kq.gguf" >/dev/null || fail "make-model Q4_K_M"
  "$glm5" logits --model "$work/kq.gguf" -t 1 --cache-type f32 --tokens 5,9,17,33,65 --all \
    >"$work/one.json" 2>/dev/null || fail "kq: one process"
  for np in 2 3; do
    "$mpi" "$np" "$glm5" logits --model "$work/kq.gguf" --tp "$np" -t 1 --cache-type f32 \
      --tokens 5,9,17,33,65 --all >"$work/tp.json" 2>"$work/err" || { cat "$work/err"; fail "kq --tp $np"; }
    [[ $(grep -c "of every routed expert" "$work/err") == "$np" ]] || fail "kq: experts not split"
    # Quantized activations round every value to an integer level, and a rank-order sum
    # differs from one process's in the last bits, so a value can cross a rounding
    # boundary: a step of order 1e-2 in the logits (0.0127 seen with the VNNI kernels),
    # not a drift. A misplaced strip moves them by whole units; greedy must hold wherever
    # the top-2 margin exceeds twice the difference.
    d=$(close "$work/one.json" "$work/tp.json" 0.05) || fail "kq --tp $np: logits differ by $d"
    argmax_agree "$work/one.json" "$work/tp.json" "$d" || fail "kq --tp $np: greedy differs"
    echo "Q4_K_M --tp $np (experts in 256-value strips): logits within $d of one process's"
  done
  # Each rank reads its share of the heads and the replicated rest.
  m="$work/h6.gguf"
  "$glm5" bench --model "$m" -t 1 -p 0 -n 16 -r 1 >"$work/one.txt" 2>/dev/null || fail "bench"
  one=$(sed -n 's/^decode roofline: .*kernels: \([0-9.]*\) MB of weights.*/\1/p' "$work/one.txt")
  "$mpi" 3 "$glm5" bench --model "$m" --tp 3 -t 1 -p 0 -n 16 -r 1 >"$work/tp.txt" 2>"$work/err" ||
    { cat "$work/err"; fail "bench --tp 3"; }
  rows=$(awk -F'|' -v one="$one" '/^\| [0-9] \| [0-9]/ {
      split($4, v, " "); m = v[2] == "MiB" ? 1048576 : v[2] == "KiB" ? 1024 : 1;
      b = v[1] * m / 1e6; n++; if (b <= 0 || b >= one) bad = 1 }
      END { print (n == 3 && !bad) ? "ok" : "bad" }' "$work/tp.txt")
  [[ $rows == ok ]] || { cat "$work/tp.txt"; fail "per-rank bytes under --tp 3 (one process: $one MB)"; }
  echo "--tp 3: every rank reads less than the $one MB a token one process reads"
  ;;
refusals)
  m="$data/glm-dsa/tiny.gguf"
  "$mpi" 2 "$glm5" logits --model "$m" --layer-split 3 --tokens 1 >/dev/null 2>"$work/err"
  [[ $? != 0 ]] || fail "2 ranks with --layer-split 3 ran"
  [[ $(grep -c "mpirun started 2 processes but --layer-split is 3" "$work/err") == 2 ]] ||
    { cat "$work/err"; fail "the rank count mismatch was not reported by both ranks"; }
  "$mpi" 2 "$glm5" logits --model "$m" --tokens 1 >/dev/null 2>"$work/err"
  [[ $? != 0 ]] || fail "2 ranks without --layer-split ran"
  "$glm5" logits --model "$m" --layer-split 2 --tokens 1 >/dev/null 2>"$work/err"
  [[ $? == 2 ]] && grep -q "mpirun -np 2" "$work/err" || fail "--layer-split 2 without mpirun"
  "$mpi" 3 "$glm5" logits --model "$data/glm-dsa/small.gguf" --layer-split 3 --tokens 1 \
    >/dev/null 2>"$work/err"
  [[ $? != 0 ]] || fail "an impossible split ran"
  [[ $(grep -c "can be cut in at most 2 parts" "$work/err") == 3 ]] ||
    { cat "$work/err"; fail "the impossible split was not reported by every rank"; }
  # The same file but for one metadata byte (the model's name) on rank 1.
  cp "$m" "$work/a.gguf"
  sed 's/random test fixture (tiny)/random test fixture (tinY)/' "$m" >"$work/b.gguf"
  cmp -s "$work/a.gguf" "$work/b.gguf" && fail "the second file is not different"
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    -np 1 "$glm5" logits --model "$work/a.gguf" --layer-split 2 --tokens 1 : \
    -np 1 "$glm5" logits --model "$work/b.gguf" --layer-split 2 --tokens 1 >/dev/null 2>"$work/err"
  [[ $? != 0 ]] || fail "different files ran"
  [[ $(grep -c "rank 1's model file (size and header) differs from rank 0's" "$work/err") == 2 ]] ||
    { cat "$work/err"; fail "different files were not reported by both ranks"; }
  # Tensor parallelism: heads the ranks cannot share, glm5next, both modes at once.
  "$mpi" 3 "$glm5" logits --model "$m" --tp 3 --tokens 1 >/dev/null 2>"$work/err"
  [[ $? != 0 ]] || fail "4 heads on 3 ranks ran"
  [[ $(grep -c "4 attention heads cannot be shared by 3 ranks" "$work/err") == 3 ]] ||
    { cat "$work/err"; fail "the head count was not reported by every rank"; }
  "$mpi" 3 "$glm5" logits --model "$data/glm5next/tiny.gguf" --tp 3 --tokens 1 >/dev/null \
    2>"$work/err"
  [[ $? != 0 && $(grep -c "attention heads cannot be shared by 3 ranks" "$work/err") == 3 ]] ||
    { cat "$work/err"; fail "glm5next --tp 3"; }
  "$glm5" logits --model "$m" --tp 2 --layer-split 2 --tokens 1 >/dev/null 2>"$work/err"
  [[ $? == 2 ]] && grep -q "together are not supported" "$work/err" || fail "--tp with --layer-split"
  echo "every refusal reported on every rank"
  ;;
*)
  fail "unknown case $case_"
  ;;
esac
echo PASS

#!/usr/bin/env bash
# The main job of scripts/run.sh, on the embedded default model in a fresh
# cache, must print English: at least 90% of the reply's words are in Debian's
# wamerican list (scripts/deps.sh installs it). The run.sh reply (seed 1) is
# checked alone, and with the replies of seeds 2 and 3 so that a short reply
# cannot pass by luck: 20 words at least, 90% English, 40% distinct (a model
# stuck on "and the, and the" is not writing). Usage: english_reply.sh GLM5
set -euo pipefail
glm5=$1
dict=/usr/share/dict/american-english
[ -r "$dict" ] || { echo "FAIL: $dict is missing (scripts/deps.sh installs wamerican)"; exit 1; }
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
lower_dict=$cache/dict
tr 'A-Z' 'a-z' <"$dict" >"$lower_dict"
words() { printf '%s\n' "$1" | tr -s '[:space:][:punct:]' '\n' | grep -v '^$' | tr 'A-Z' 'a-z' || true; }
count() { printf '%s\n' "$1" | grep -c . || true; }
known() { printf '%s\n' "$1" | grep -c -x -F -f "$lower_dict" || true; }
all=""
for seed in 1 2 3; do
  # The same prompt and settings as scripts/run.sh.
  reply=$(GLM5_CACHE=$cache "$glm5" run --prompt "Tell me a verse about light." -n 48 --seed $seed 2>/dev/null)
  echo "seed $seed: $reply"
  w=$(words "$reply")
  if [ "$seed" = 1 ]; then
    t=$(count "$w")
    k=$(known "$w")
    echo "run.sh reply: $k of $t words in wamerican"
    if [ "$t" -lt 5 ] || [ $((k * 10)) -lt $((t * 9)) ]; then echo "FAIL: run.sh reply"; exit 1; fi
  fi
  all="$all"$'\n'"$w"
done
all=$(printf '%s\n' "$all" | grep . || true)
t=$(count "$all")
k=$(known "$all")
d=$(printf '%s\n' "$all" | sort -u | grep -c . || true)
echo "three replies: $k of $t words in wamerican, $d distinct"
if [ "$t" -ge 20 ] && [ $((k * 10)) -ge $((t * 9)) ] && [ $((d * 10)) -ge $((t * 4)) ]; then
  echo PASS
else
  echo "FAIL: under 20 words, under 90% of them English, or under 40% distinct"
  exit 1
fi

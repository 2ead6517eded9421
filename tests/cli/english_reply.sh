#!/usr/bin/env bash
# The main job of scripts/run.sh, on the embedded default model in a fresh
# cache, must print English: at least 90% of the reply's words are in Debian's
# wamerican list (scripts/deps.sh installs it). Usage: english_reply.sh GLM5
set -euo pipefail
glm5=$1
dict=/usr/share/dict/american-english
[ -r "$dict" ] || { echo "FAIL: $dict is missing (scripts/deps.sh installs wamerican)"; exit 1; }
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
# The same prompt and settings as scripts/run.sh.
reply=$(GLM5_CACHE=$cache "$glm5" run --prompt "Tell me a verse about light." -n 48 --seed 1 2>/dev/null)
echo "reply: $reply"
words=$(printf '%s\n' "$reply" | tr -s '[:space:][:punct:]' '\n' | grep -v '^$' | tr 'A-Z' 'a-z' || true)
total=$(printf '%s\n' "$words" | grep -c . || true)
known=$(printf '%s\n' "$words" | grep -c -x -F -f <(tr 'A-Z' 'a-z' <"$dict") || true)
distinct=$(printf '%s\n' "$words" | grep . | sort -u | wc -l)
echo "words: $known of $total in wamerican, $distinct distinct"
# Distinct words at 40% or more: a model stuck repeating "and the, and the" is not writing.
if [ "$total" -ge 10 ] && [ $((known * 10)) -ge $((total * 9)) ] && [ $((distinct * 10)) -ge $((total * 4)) ]; then
  echo PASS
else
  echo "FAIL: fewer than 10 words, under 90% of them English, or under 40% distinct"
  exit 1
fi

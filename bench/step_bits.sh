#!/usr/bin/env bash
# The bits a change of the backend contract must keep: md5s of the logits of a
# 2600-token batch and of 32 greedy tokens after it (plain, and with n-gram
# speculation), for the bench glm-dsa and glm5next models, at the VNNI and AVX2
# kernel levels. Run it before and after a change: every line must be equal.
#
# usage: bench/step_bits.sh DIR [GLM5_BINARY]   (DIR holds or receives the bench models)
set -euo pipefail
dir=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
glm5=${2:-$repo/build/glm5}
mkdir -p "$dir"
for arch in glm-dsa glm5next; do
    f=$dir/bits-$arch-q4_k_m.gguf
    [[ -e $f ]] || "$glm5" make-model --arch "$arch" --preset bench --type q4_k_m -o "$f" >/dev/null
done
ids=$(python3 -c 'print(",".join(str((i * 7919 + 13) % 997 + 3) for i in range(2600)))')
short=$(python3 -c 'print(",".join(str((i * 7919 + 13) % 997 + 3) for i in range(200)))')
for arch in glm-dsa glm5next; do
    f=$dir/bits-$arch-q4_k_m.gguf
    for level in vnni avx2; do
        l=$(GLM5_CPU=$level "$glm5" logits --model "$f" --tokens "$ids" 2>/dev/null | md5sum | cut -c1-32)
        r=$(GLM5_CPU=$level "$glm5" run --model "$f" --tokens "$short" -n 32 --temp 0 --print-ids \
            --ignore-eos 2>/dev/null | md5sum | cut -c1-32)
        s=$(GLM5_CPU=$level "$glm5" run --model "$f" --tokens "$short" -n 32 --temp 0 --print-ids \
            --ignore-eos --spec --spec-type ngram 2>/dev/null | md5sum | cut -c1-32)
        echo "$arch $level logits $l run $r spec-ngram $s"
    done
done

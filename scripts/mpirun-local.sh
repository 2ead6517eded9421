#!/usr/bin/env bash
# Runs glm5 as NP ranks on this machine, over loopback only:
#   scripts/mpirun-local.sh NP glm5 run --model F --layer-split NP ...
# Open MPI would otherwise use every network interface it finds. Ranks may
# outnumber cores (--oversubscribe), are not pinned (each uses its --threads
# anywhere), and yield the CPU while they wait. Root is allowed (containers, CI).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 NP COMMAND [ARGS...]" >&2
  exit 2
fi
np=$1
shift
exec mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
  --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  --mca mpi_yield_when_idle 1 "$@"

#!/usr/bin/env bash
# bench_allreduce_smoke.sh BENCH: benches/bench_allreduce on 2 CPU processes (TCP) finishes and
# prints its line, so the program issue 16's multi-GPU run depends on is known to work before a
# machine with several GPUs is lent.
set -euo pipefail
B=$1
PORT=$(( 20000 + RANDOM % 20000 ))
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$B" --device cpu --mib 1 --iters 3 &
WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$B" --device cpu --mib 1 --iters 3 >"$OUT"
wait
cat "$OUT"
grep -q "bench-allreduce: taper (tcp) 1.0 MiB f32 over 2 ranks" "$OUT"

#!/usr/bin/env bash
# main.sh: taper's main job: fine-tunes a real pretrained model (all-MiniLM-L6-v2) on real text
# (Jane Austen's six novels: which novel is a passage from?) on the CPU, in C++
# (examples/finetune; results and flags in docs/finetune.md).
# Installs what is missing (scripts/setup.sh), fetches the model and the data into .models/ and
# .data/ (scripts/fetch_model.sh, scripts/fetch_data.sh; idempotent), builds Release in
# build/release (the `finetune` target only) and runs the default fine-tuning: the baseline
# (frozen encoder + linear head), the fine-tuning of the whole model with a progress line, both
# test accuracies. The checkpoint goes to build/release/finetune/checkpoint.safetensors, the log
# to build/release/finetune/run.log. The default run takes about 2.5 minutes on 2 idle cores
# (4-9 minutes measured here while the machine was shared; docs/finetune.md).
#
# Usage: bash scripts/main.sh [finetune flags]     e.g. --seed 2, --steps 400, --dtype bf16,
#                                                   --resume build/release/finetune/checkpoint.safetensors
#        bash scripts/main.sh --bench               the benchmark report instead: fused vs
#                                                   composed, primitives, LibTorch side by side
#                                                   (scripts/bench_report.sh; report in
#                                                   build/release/bench-results/report.md)
# Environment: TAPER_NUM_THREADS (threads; default all cores); for --bench also
#   TAPER_BENCH_REPS, TAPER_BENCH_FILTER (see scripts/bench_report.sh).
# What it is not: the test run (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--bench" ]; then bash scripts/setup.sh --bench; else bash scripts/setup.sh; fi
JOBS=$(nproc)
T0=$SECONDS

echo "== configure build/release (Release)" >&2
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null

if [ "${1:-}" = "--bench" ]; then
  shift
  (($#)) && { echo "main.sh: --bench takes no further arguments" >&2; exit 2; }
  # LibTorch's side-by-side bench is opt-in (benches/CMakeLists.txt); the report wants it.
  cmake -S . -B build/release -DTAPER_BENCH_TORCH=ON >/dev/null
  # Only the bench programs (and the library they link): the tests are scripts/test.sh's job.
  targets=(bench_primitives bench_fused)
  # grep reads all of the list (no -q): an early exit would SIGPIPE cmake and, under pipefail,
  # read as "no bench_torch".
  if cmake --build build/release --target help 2>/dev/null | grep bench_torch >/dev/null; then
    targets+=(bench_torch)
  fi
  echo "== build ${targets[*]} (-j$JOBS)" >&2
  cmake --build build/release -j"$JOBS" --target "${targets[@]}"
  echo "== built in $((SECONDS - T0)) s; running the benches" >&2
  source scripts/blas_env.sh build/release/benches/bench_primitives
  mkdir -p build/release/bench-results
  bash scripts/bench_report.sh --build build/release | tee build/release/bench-results/report.md
  echo "== benchmark report done in $((SECONDS - T0)) s (build/release/bench-results/report.md)" >&2
  exit 0
fi

echo "== fetch the model and the data" >&2
bash scripts/fetch_model.sh >&2
bash scripts/fetch_data.sh >&2

echo "== build finetune (-j$JOBS)" >&2
cmake --build build/release -j"$JOBS" --target finetune
echo "== built in $((SECONDS - T0)) s; fine-tuning" >&2
source scripts/blas_env.sh build/release/examples/finetune

mkdir -p build/release/finetune
T1=$SECONDS
build/release/examples/finetune --out build/release/finetune/checkpoint.safetensors "$@" \
  | tee build/release/finetune/run.log
echo "== main job done: run $((SECONDS - T1)) s, total $((SECONDS - T0)) s (log: build/release/finetune/run.log)" >&2

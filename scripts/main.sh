#!/usr/bin/env bash
# main.sh: taper's main job. Installs what is missing (scripts/setup.sh), builds Release in
# build/release and prints the benchmark report (scripts/bench_report.sh: fused vs composed,
# primitives, LibTorch side by side when libtorch-dev is installed).
# The report goes to stdout and to build/release/bench-results/report.md; progress to stderr.
# Environment: TAPER_NUM_THREADS, TAPER_BENCH_REPS, TAPER_BENCH_FILTER (see bench_report.sh).
# What it is not: the test run (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
JOBS=$(nproc)
T0=$SECONDS

echo "== configure build/release (Release)" >&2
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DTAPER_BENCH_TORCH=ON >/dev/null
# Only the bench programs (and the library they link): the tests are scripts/test.sh's job.
targets=(bench_primitives bench_fused)
if cmake --build build/release --target help 2>/dev/null | grep -q bench_torch; then
  targets+=(bench_torch)
fi
echo "== build ${targets[*]} (-j$JOBS)" >&2
cmake --build build/release -j"$JOBS" --target "${targets[@]}"
echo "== built in $((SECONDS - T0)) s; running the benches" >&2

mkdir -p build/release/bench-results
bash scripts/bench_report.sh --build build/release | tee build/release/bench-results/report.md
echo "== main job done in $((SECONDS - T0)) s (report: build/release/bench-results/report.md)" >&2

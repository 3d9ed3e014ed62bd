#!/usr/bin/env bash
# gpu_run.sh: runs on a lent GPU machine (through the workplace's device tool, which sets $OUT):
# unpacks the Debian packages of .devdeps/ (scripts/fetch_device_deps.sh) into a prefix, builds
# taper with CUDA for sm_90 with that machine's nvcc, then runs the steps asked for and writes
# their logs to $OUT:
#   test       the CUDA suites and the device-aware CPU ones (TEST_FILTER overrides)
#   all-tests  the whole suite
#   sanitize   compute-sanitizer memcheck and racecheck on the CUDA suites (SANITIZE_FILTER)
#   bench      bench_cuda (JSON + console)
#   finetune   the main job for 20 steps on the GPU, then on the CPU (MODEL_DIR)
# Usage: bash scripts/gpu_run.sh test sanitize bench
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
D=/opt/taperdeps
T0=$SECONDS
log() { echo "== [$((SECONDS - T0)) s] $*" | tee -a "$OUT/summary.txt"; }
# "N passed, N failed, N skipped" from a gtest log (the FAILED lines themselves are listed apart)
counts() {
  echo "$(grep -oE '^\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$') passed," \
    "$(grep -cE '^\[  FAILED  \]' "$1") failed, $(grep -oE '^\[  SKIPPED \] [0-9]+' "$1" | grep -oE '[0-9]+$') skipped"
}

if [ ! -d "$D" ]; then
  mkdir -p "$D"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$D"; done
  find "$D" -name '*.pc' -exec sed -i "s#=/usr/#=$D/usr/#" {} +
fi
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread:${LD_LIBRARY_PATH:-}
export PKG_CONFIG_PATH=$LIB/openblas-pthread/pkgconfig:$LIB/pkgconfig
log "commit ${TAPER_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
nvcc --version | tail -1 | tee -a "$OUT/summary.txt"

log "configure + build"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAPER_ASSERTS=ON -DTAPER_CUDA=ON \
  -DTAPER_HWY_STATIC_ONLY=ON -DCMAKE_PREFIX_PATH="$D/usr" -DPKG_CONFIG_EXECUTABLE="$D/usr/bin/pkgconf" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -80; exit 1; }
log "built"

for step in "$@"; do
  case "$step" in
    test)
      log "CUDA suites (and the device-aware CPU ones)"
      ./build/gpu/tests/taper_tests --gtest_filter="${TEST_FILTER:-Cuda*:Devices*:Registry*:NnOptim*:Errors*}" \
        --gtest_brief=1 >"$OUT/test_cuda.log" 2>&1
      log "rc=$? : $(counts "$OUT/test_cuda.log")"
      grep -E '^\[  FAILED  \]' "$OUT/test_cuda.log" | cut -c1-150 | head -40
      ;;
    all-tests)
      log "whole suite"
      ./build/gpu/tests/taper_tests --gtest_brief=1 >"$OUT/test_all.log" 2>&1
      log "whole suite rc=$? : $(counts "$OUT/test_all.log")"
      grep -E '^\[  FAILED  \]' "$OUT/test_all.log" | cut -c1-150 | head -40
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        log "compute-sanitizer $tool (at most ${SANITIZE_SECONDS:-150} s)"
        timeout "${SANITIZE_SECONDS:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
          ./build/gpu/tests/taper_tests --gtest_filter="${SANITIZE_FILTER:-Cuda*}" --gtest_brief=1 \
          >"$OUT/sanitize_$tool.log" 2>&1
        log "compute-sanitizer $tool rc=$? : $(grep -E 'ERROR SUMMARY' "$OUT/sanitize_$tool.log" | tail -1); $(counts "$OUT/sanitize_$tool.log")"
      done
      ;;
    bench)
      log "bench_cuda"
      ./build/gpu/benches/bench_cuda --benchmark_min_time=0.2 --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true --benchmark_out="$OUT/bench_cuda.json" \
        --benchmark_out_format=json >"$OUT/bench_cuda.txt" 2>&1
      log "bench_cuda rc=$?"
      grep -E "median" "$OUT/bench_cuda.txt" | head -60
      ;;
    finetune)
      # The same 20 steps on the GPU and on the CPU; MODEL_DIR may point at a copy of the model
      # whose weights are stored as f16 (the f32 file does not fit the tool's 64 MiB transfer).
      M=${MODEL_DIR:-.models/all-MiniLM-L6-v2}
      for dev in cuda cpu; do
        log "finetune --device $dev --steps 20 (model $M)"
        ./build/gpu/examples/finetune --device "$dev" --model-dir "$M" --steps 20 --test-limit 64 \
          --out "/tmp/finetune_$dev" >"$OUT/finetune_$dev.log" 2>&1
        log "finetune $dev rc=$?"
        grep -E "^(model|step|fine-tuned|summary)" "$OUT/finetune_$dev.log"
      done
      ;;
    *) echo "gpu_run: unknown step $step"; exit 2 ;;
  esac
done
log "done"

#!/usr/bin/env bash
# test.sh: builds taper and passes the test suite: a Release build with assertions on, an
# outside CMake project built against the installed package (find_package(taper CONFIG
# REQUIRED)), the suite under AddressSanitizer + UndefinedBehaviorSanitizer (clang), and the
# libFuzzer targets of fuzz/ for a fixed number of runs (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The pretrained model's files and the Jane Austen texts: parity and reader tests use them.
bash scripts/fetch_model.sh >/dev/null
bash scripts/fetch_data.sh >/dev/null
JOBS=$(nproc)
T0=$SECONDS
phase() { echo "== [$((SECONDS - T0)) s] $*"; }

# The GoogleTest suite of build folder $1 as $JOBS shards in parallel, one process each (a
# process per test, as ctest runs them, costs more than the tests on a 2-core machine), then
# the build's ctest entries labelled `script` (tests/CMakeLists.txt: programs, not GoogleTest
# cases). A failing shard's log is printed. `ctest --test-dir DIR` still runs everything.
run_suite() {
  local dir=$1 pids=() rc=0
  for ((i = 0; i < JOBS; i++)); do
    GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$i timeout 1800 "$dir/tests/taper_tests" \
      --gtest_brief=1 >"$dir/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < JOBS; i++)); do
    if ! wait "${pids[$i]}"; then rc=1; echo "-- shard $i of $dir failed:"; cat "$dir/shard$i.log"; fi
  done
  grep -hE '^\[  (PASSED|SKIPPED) *\]' "$dir"/shard*.log | sort | uniq -c
  ((rc == 0)) || return 1
  ctest --test-dir "$dir" --output-on-failure -j"$JOBS" --timeout 900 -L script --no-tests=ignore
}

phase "release build (assertions on)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DTAPER_ASSERTS=ON -DTAPER_CUDA=AUTO -DTAPER_BENCH_TORCH=OFF >/dev/null
cmake --build build/release -j"$JOBS"
source scripts/blas_env.sh build/release/examples/finetune
phase "release tests"
run_suite build/release

phase "install + outside consumer project"
rm -rf build/prefix build/consumer
cmake --install build/release --prefix build/prefix >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/prefix" >/dev/null
cmake --build build/consumer -j"$JOBS"
./build/consumer/consumer

# One clang build serves the suite under the sanitizers and the libFuzzer targets (fuzz/), so
# the library is compiled once for both.
phase "sanitizer build (clang, ASan + UBSan + libFuzzer coverage, AVX2 Highway target only)"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DCMAKE_CXX_COMPILER=clang++ \
  -DTAPER_SANITIZE=ON -DTAPER_FUZZ=ON -DTAPER_HWY_STATIC_ONLY=ON -DTAPER_BUILD_BENCHES=OFF \
  -DTAPER_CUDA=OFF >/dev/null
cmake --build build/asan -j"$JOBS"
phase "sanitizer tests"
(export ASAN_OPTIONS=detect_leaks=1 TAPER_NO_ALLOC_CACHE=1; run_suite build/asan)
phase "fuzzers (a fixed number of runs each, from a fixed seed)"
FUZZ_BUILD=build/asan bash scripts/fuzz.sh

phase "all tests passed"

#!/usr/bin/env bash
# test.sh: builds taper and passes the test suite: a Release build with assertions on, the
# suite under AddressSanitizer + UndefinedBehaviorSanitizer, and an outside CMake project built
# against the installed package (find_package(taper CONFIG REQUIRED)).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The pretrained model's files and the Jane Austen texts: parity and reader tests use them.
bash scripts/fetch_model.sh >/dev/null
bash scripts/fetch_data.sh >/dev/null
JOBS=$(nproc)
T0=$SECONDS

echo "== release build (assertions on)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DTAPER_ASSERTS=ON -DTAPER_CUDA=AUTO -DTAPER_BENCH_TORCH=OFF >/dev/null
cmake --build build/release -j"$JOBS"
ctest --test-dir build/release --output-on-failure -j"$JOBS" --timeout 600

echo "== install + outside consumer project"
rm -rf build/prefix build/consumer
cmake --install build/release --prefix build/prefix >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/prefix" >/dev/null
cmake --build build/consumer -j"$JOBS"
./build/consumer/consumer

echo "== sanitizer build (ASan + UBSan, AVX2 Highway target only)"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DTAPER_SANITIZE=ON \
  -DTAPER_HWY_STATIC_ONLY=ON -DTAPER_BUILD_BENCHES=OFF -DTAPER_CUDA=OFF >/dev/null
cmake --build build/asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1 TAPER_NO_ALLOC_CACHE=1 \
  ctest --test-dir build/asan --output-on-failure -j"$JOBS" --timeout 900

echo "== all tests passed in $((SECONDS - T0)) s"

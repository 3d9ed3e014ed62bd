#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets of fuzz/ (clang 14, ASan + UBSan, AVX2 Highway target
# only) in build/fuzz and runs each over a copy of its seed corpus (fuzz/corpus/<target>/, left
# as it is) and of the reproducers of past findings (fuzz/crashes/<target>-*): a fixed number of
# executions per target from a fixed seed (about a minute for all five on two cores), or, with
# `--long SECONDS`, SECONDS of fuzzing per target from a random seed. The targets run side by
# side, one a core. Targets may be named to run only those (`scripts/fuzz.sh ops rdata`,
# `scripts/fuzz.sh --long 600 ops`).
#
# Exits non-zero when any target finds something (a crash, a sanitizer report, a leak, a hang, a
# broken invariant): the input that did it is saved as build/fuzz/findings/<target>/crash-*
# (or leak-*, timeout-*, oom-*), the target's log as build/fuzz/logs/<target>.log. Replay one with
# `build/fuzz/fuzz/fuzz_<target> <file>`; fuzz_ops takes TAPER_FUZZ_TRACE=1 to print its steps.
# FUZZ_BUILD=DIR uses a build folder configured already with TAPER_FUZZ=ON (scripts/test.sh's
# sanitizer build, which also holds the tests) instead of configuring build/fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."

LONG=0
TARGETS=()
while (($#)); do
  case "$1" in
    --long)
      if ! [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]]; then
        echo "fuzz.sh: --long needs a number of seconds" >&2
        exit 2
      fi
      LONG=$2
      shift 2
      ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    safetensors|json|tokenizer|rdata|ops) TARGETS+=("$1"); shift ;;
    *)
      echo "fuzz.sh: unknown argument '$1' (targets: safetensors json tokenizer rdata ops)" >&2
      exit 2
      ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=(ops tokenizer rdata json safetensors)

# Executions per target in the fixed run, from their speed under the sanitizers on two cores
# (fuzz_ops runs whole programs of ops, so it gets the fewest).
declare -A RUNS=([safetensors]=150000 [json]=150000 [tokenizer]=25000 [rdata]=80000 [ops]=4000)

bash scripts/setup.sh
JOBS=$(nproc)
BUILD=${FUZZ_BUILD:-build/fuzz}
if [ -z "${FUZZ_BUILD:-}" ]; then
  echo "== fuzz build (clang, ASan + UBSan, libFuzzer)"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 \
    -DCMAKE_CXX_COMPILER=clang++ -DTAPER_FUZZ=ON -DTAPER_SANITIZE=ON -DTAPER_HWY_STATIC_ONLY=ON \
    -DTAPER_CUDA=OFF -DTAPER_BUILD_BENCHES=OFF -DTAPER_BUILD_TESTS=OFF \
    -DTAPER_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$BUILD" -j"$JOBS" --target fuzz

mkdir -p "$BUILD/logs" "$BUILD/findings"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taper-fuzz.XXXXXX")
# Files the readers of paths get (rdata, tokenizer, json): in memory where /dev/shm is there.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  SCRATCH=$(mktemp -d /dev/shm/taper-fuzz.XXXXXX)
else
  SCRATCH="$WORK/scratch"
  mkdir -p "$SCRATCH"
fi
export TAPER_FUZZ_SCRATCH="$SCRATCH"
trap 'rm -rf "$WORK" "$SCRATCH"' EXIT
# One thread per target (a finding replays exactly); no allocator cache, so ASan sees each free.
export TAPER_NUM_THREADS=1 TAPER_NO_ALLOC_CACHE=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
SYMBOLIZER=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
[ -n "$SYMBOLIZER" ] && export ASAN_SYMBOLIZER_PATH="$SYMBOLIZER" UBSAN_SYMBOLIZER_PATH="$SYMBOLIZER"

# One target's run: its result line goes to $WORK/<target>.out, non-empty on a finding.
fuzz_one() {
  local t=$1 corpus="$WORK/$1" log="$BUILD/logs/$1.log" out="$WORK/$1.out" t1=$SECONDS rc=0
  local budget execs speed
  rm -rf "$BUILD/findings/$t"
  mkdir -p "$corpus" "$BUILD/findings/$t"
  # The seeds, and the reproducers of past findings: a fixed one stays fixed.
  cp fuzz/corpus/"$t"/* "$corpus"/
  for f in fuzz/crashes/"$t"-*; do
    if [ -f "$f" ]; then cp "$f" "$corpus"/; fi
  done
  # The fixed run starts from a fixed seed (FUZZ_SEED, 0 for a random one), so CI repeats itself.
  if ((LONG)); then
    budget=(-max_total_time="$LONG")
  else
    budget=(-runs="${RUNS[$t]}" -seed="${FUZZ_SEED:-1}")
  fi
  "$BUILD/fuzz/fuzz_$t" "${budget[@]}" -timeout=30 -print_final_stats=1 -print_funcs=0 \
    -artifact_prefix="$BUILD/findings/$t/" "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-12s %8s executions in %4d s (%s/s), corpus %d -> %d inputs: ' "$t" "${execs:-?}" \
    $((SECONDS - t1)) "${speed:-?}" "$(ls fuzz/corpus/"$t" | wc -l)" "$(ls "$corpus" | wc -l)" \
    >"$out"
  if ((rc)); then
    {
      echo "FOUND SOMETHING (exit $rc), log $log"
      grep -E -m1 -A14 'ERROR: |runtime error|==FUZZ FINDING==|deadly signal' "$log" |
        sed 's/^/    /' || tail -20 "$log"
      ls "$BUILD/findings/$t" | sed 's/^/    saved: /'
    } >>"$out"
    echo "$t" >"$WORK/$t.found"
  else
    echo "nothing found" >>"$out"
  fi
}

# The targets run side by side, $JOBS at a time (each is one process on one thread), the
# slowest first; their lines are printed in that order once all have ended.
failed=()
T0=$SECONDS
running=0
for t in "${TARGETS[@]}"; do
  if ((running >= JOBS)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
for t in "${TARGETS[@]}"; do
  cat "$WORK/$t.out"
  if [ -f "$WORK/$t.found" ]; then failed+=("$t"); fi
done

echo "== fuzzing took $((SECONDS - T0)) s"
if ((${#failed[@]})); then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi

#!/usr/bin/env bash
# gpu_run.sh: runs on a lent GPU machine (through the workplace's device tool, which sets $OUT):
# unpacks the Debian packages of .devdeps/ (scripts/fetch_device_deps.sh) into a prefix, builds
# taper with CUDA for sm_90 with that machine's nvcc, then runs the steps asked for and writes
# their logs to $OUT:
#   test       the CUDA suites and the device-aware CPU ones, issue 14's precision seed cases
#              among them (TEST_FILTER overrides; it must match the parameterised suites'
#              `Cuda/` prefix, as the default's Cuda* does: run 65's CudaFused* missed them;
#              TEST_SECONDS: a time limit of the suites alone)
#   all-tests  the whole suite
#   sanitize   compute-sanitizer memcheck (SANITIZE_FILTER) and racecheck (RACECHECK_FILTER);
#              SANITIZE_TOOLS picks them (default "memcheck racecheck")
#   bench      bench_cuda (primitives JSON, unless BENCH_PRIMITIVES=0; the fused table CSV),
#              PyTorch / torch.compile / Liger (scripts/bench_fused_torch.py; BENCH_TORCH=0: none)
#              and the rendered benchmarks-h200.md
#   finetune   the main job for 20 steps on the GPU, then on the CPU (MODEL_DIR)
#   main       the whole main job on the GPU (seeds 1, 2; MAIN_FLAGS added, e.g. --cuda-graph on)
#              and a GPU -> CPU resume (MAIN_RESUME=0: without it)
#   ddp1       finetune --nproc 1 on the GPU (NCCL at world size 1), 40 steps
#   multi      issue 16 on a machine with several GPUs: CudaDist.*, the 100 MiB all-reduce
#              beside torch.distributed's, the bf16 step on 1/2/4 GPUs, 2 GPUs against 1
#   ab         A/B of the fused table: the tree built above against the same tree with the files
#              under AB_BASE (a folder laid out as the repo, e.g. out/ab/base/cuda/norm.cu from
#              `git show REV:cuda/norm.cu`; carry it) swapped in; bench_cuda --fused-table
#              --filter "$AB_FILTER" (default "fused,") for each, twice, interleaved, to
#              $OUT/ab_{new,base}_{1,2}.csv (scripts/ab_report.py renders them). Put it last: it
#              rebuilds libtaper, and restores the tested one and the sources when done.
#   profile    ncu's counters of the fused kernels of each PROFILE_CASES row (bench_cuda
#              --fused-table --filter); keep the bench's L2 flush (reduce_rows_kernel) out of
#              PROFILE_KERNELS (run 37 of docs/cuda.md profiled only it); NCU_EXTRA: more ncu
#              arguments (e.g. "--section SourceCounters --print-details all": the section's
#              totals); NCU_SOURCE=1: also
#              ncu's source page of each case (per SASS instruction: samples, stalls, shared
#              wavefronts), ncu_src_<case>.csv.gz; PROFILE_SASS=1: also the SASS of softmax.cu
#              and norm.cu (cuobjdump; tens of MB, more than a device call brings back in one
#              archive with the rest: run 95 lost its files so; scripts/sass.sh reads the SASS
#              without a GPU)
#   kernels    every kernel each KERNEL_CASES row launches, in order, with its GPU time (ncu's
#              gpu__time_duration alone: one pass, no replayed sections; the caches kept as
#              they are between a row's kernels, where ncu's default flushes them before each
#              kernel: until run 79 the dw/db fold read from memory the partials it finds in
#              L2 in the bench), the flush's two
#              kernels (reduce_rows_kernel, combine_partials_kernel; run 40) left out:
#              set beside the row's time from events, the rest is launch gaps and host work
#   train      issue 17's table: taper's --bench-train (CUDA graph on and off; TRAIN_GRAPHS) /
#              --bench-forward cells on the GPU, then
#              PyTorch's (scripts/bench_train_torch.py, which does not import taper) beside them
#              (TRAIN_TORCH=0: taper's cells only)
# Usage: bash scripts/gpu_run.sh test sanitize bench
# Each call configures and builds first (95-140 s on a fresh machine, seconds on a warm one):
# a time limit put around a call covers that build too (run 64 of docs/cuda.md lost its tests so).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
D=/opt/taperdeps
T0=$SECONDS
log() { echo "== [$((SECONDS - T0)) s] $*" | tee -a "$OUT/summary.txt"; }
# A bench case ("op,dtype,shape,path,pass") as a file-name tag (the profile and kernels steps):
# commas, slashes and the shape's x (between digits) as '_' (runs before session 22's end wrote
# softmax as softma_).
case_tag() {
  local c=${1//[,\/]/_}
  while [[ $c =~ ([0-9])x([0-9]) ]]; do
    c=${c/${BASH_REMATCH[0]}/${BASH_REMATCH[1]}_${BASH_REMATCH[2]}}
  done
  echo "$c"
}
# "N passed, N failed, N skipped" from a gtest log (the FAILED lines themselves are listed apart);
# a run cut off by its time limit has no summary: what it finished, and the test it was in
# (the test and sanitize steps log every test, not --gtest_brief, for that: runs 73 and 75 of
# docs/cuda.md were cut off and told nothing of how far they got)
counts() {
  local failed
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$1" | sed -E 's/(,| \().*//' | sort -u | wc -l)
  if grep -qE '^\[==========\] .* ran' "$1"; then
    echo "$(grep -oE '^\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$') passed, $failed failed," \
      "$(grep -oE '^\[  SKIPPED \] [0-9]+' "$1" | grep -oE '[0-9]+$') skipped"
  else
    echo "CUT OFF: $(grep -cE '^\[       OK \]' "$1") passed, $failed failed so far;" \
      "last started: $(grep -E '^\[ RUN      \]' "$1" | tail -1 | cut -c14-)"
  fi
}

if [ ! -d "$D" ]; then
  mkdir -p "$D"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$D"; done
  find "$D" -name '*.pc' -exec sed -i "s#=/usr/#=$D/usr/#" {} +
fi
LIB=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread:${LD_LIBRARY_PATH:-}
export PKG_CONFIG_PATH=$LIB/openblas-pthread/pkgconfig:$LIB/pkgconfig
# The model: MODEL_DIR, else the copy the device tool carries (.devmodel), else the fetched one.
if [ -z "${MODEL_DIR:-}" ]; then
  MODEL_DIR=.models/all-MiniLM-L6-v2
  [ -f .devmodel/all-MiniLM-L6-v2/model.safetensors ] && MODEL_DIR=.devmodel/all-MiniLM-L6-v2
fi
log "commit ${TAPER_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
nvcc --version | tail -1 | tee -a "$OUT/summary.txt"

log "configure + build"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAPER_ASSERTS=ON -DTAPER_CUDA=ON \
  -DTAPER_HWY_STATIC_ONLY=ON -DCMAKE_PREFIX_PATH="$D/usr" -DPKG_CONFIG_EXECUTABLE="$D/usr/bin/pkgconf" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
# BUILD_TARGETS: only these (e.g. finetune for the train step); default everything.
cmake --build build/gpu -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -80; exit 1; }
log "built"

for step in "$@"; do
  case "$step" in
    test)
      log "CUDA suites (and the device-aware CPU ones)"
      # stdbuf: what a run cut off by a time limit printed is kept (run 64 of docs/cuda.md);
      # TEST_SECONDS: the suites' own limit (a limit put around the call also cuts this report)
      timeout "${TEST_SECONDS:-0}" stdbuf -oL ./build/gpu/tests/taper_tests \
        --gtest_filter="${TEST_FILTER:-Cuda*:Devices*:Registry*:NnOptim*:Errors*:*HalfGrad*:FusedGrad*:*Bf16Offset*:FusedSpecial*}" \
        >"$OUT/test_cuda.log" 2>&1
      log "rc=$? : $(counts "$OUT/test_cuda.log")"
      grep -E '^\[  FAILED  \]' "$OUT/test_cuda.log" | cut -c1-150 | head -40
      ;;
    all-tests)
      log "whole suite"
      stdbuf -oL ./build/gpu/tests/taper_tests --gtest_brief=1 >"$OUT/test_all.log" 2>&1
      log "whole suite rc=$? : $(counts "$OUT/test_all.log")"
      grep -E '^\[  FAILED  \]' "$OUT/test_all.log" | cut -c1-150 | head -40
      ;;
    sanitize)
      # racecheck is far slower than memcheck: by default it runs the suites whose kernels share
      # memory between threads (reductions, the fused ops' direct cases and f32 forwards, optim).
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
        filter=${SANITIZE_FILTER:-Cuda*}
        [ "$tool" = racecheck ] &&
          filter=${RACECHECK_FILTER:-CudaFused.*:CudaReduce.*:CudaOptim.*:Cuda/CudaFusedForward.*_f32_contiguous}
        log "compute-sanitizer $tool on $filter (at most ${SANITIZE_SECONDS:-150} s)"
        # stdbuf: what a capped run printed before it was stopped is kept
        timeout "${SANITIZE_SECONDS:-150}" stdbuf -oL compute-sanitizer --tool "$tool" --error-exitcode 9 \
          ./build/gpu/tests/taper_tests --gtest_filter="$filter" >"$OUT/sanitize_$tool.log" 2>&1
        log "compute-sanitizer $tool rc=$? : $(grep -E 'ERROR SUMMARY' "$OUT/sanitize_$tool.log" | tail -1); $(counts "$OUT/sanitize_$tool.log")"
      done
      ;;
    bench)
      if [ "${BENCH_PRIMITIVES:-1}" = 1 ]; then
        log "bench_cuda (primitives)"
        ./build/gpu/benches/bench_cuda --benchmark_min_time=0.2 --benchmark_repetitions=3 \
          --benchmark_report_aggregates_only=true --benchmark_out="$OUT/bench_cuda.json" \
          --benchmark_out_format=json >"$OUT/bench_cuda.txt" 2>&1
        log "bench_cuda rc=$?"
        grep -E "median" "$OUT/bench_cuda.txt" | head -20
      fi
      log "bench_cuda --fused-table"
      ./build/gpu/benches/bench_cuda --fused-table "$OUT/fused_taper.csv" 2>"$OUT/fused_taper.log"
      log "fused table rc=$?"
      if [ "${BENCH_TORCH:-1}" = 1 ]; then
        # PyTorch, torch.compile and Liger-Kernel (its source in .liger/src when carried there)
        log "bench_fused_torch.py"
        PYTHONPATH=$PWD/.liger/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
          timeout "${TORCH_BENCH_SECONDS:-400}" python3 scripts/bench_fused_torch.py \
          --budget-s "${TORCH_COMPILE_SECONDS:-200}" >"$OUT/fused_torch.csv" 2>"$OUT/fused_torch.log"
        log "bench_fused_torch rc=$?"
      fi
      T=(); [ -s "$OUT/fused_torch.csv" ] && T=(--torch "$OUT/fused_torch.csv")
      [ -s "$OUT/bench_cuda.json" ] && T+=(--json "$OUT/bench_cuda.json")
      python3 scripts/h200_report.py --taper "$OUT/fused_taper.csv" "${T[@]}" \
        --commit "${TAPER_COMMIT:-unknown}" \
        --gpu "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)" \
        >"$OUT/benchmarks-h200.md" 2>&1
      log "report rc=$?"
      ;;
    ab)
      # the objects of source $1, one a compile (cuda/norm.cu: build/gpu/cuda/CMakeFiles/
      # taper_cuda.dir/norm.cu.o and taper_cuda_norm_{bf16,f16,double}.dir/norm.cu.o), saved
      # under /tmp/ab/obj/$1/<target folder>
      obj_of() { find build/gpu -path "*/$(dirname "$1")/CMakeFiles/*.dir/$(basename "$1").o"; }
      base=${AB_BASE:-out/ab/base}
      [ -d "$base" ] || { log "ab: no folder $base"; continue; }
      so=$(ls build/gpu/libtaper.so* | head -1)
      mkdir -p /tmp/ab/new /tmp/ab/base /tmp/ab/src /tmp/ab/obj
      cp -pL "$so" /tmp/ab/new/lib.so
      files=$(cd "$base" && find . -type f | sed 's#^\./##')
      for f in $files; do
        mkdir -p "/tmp/ab/src/$(dirname "$f")" "/tmp/ab/obj/$(dirname "$f")"
        cp -p "$f" "/tmp/ab/src/$f"; cp "$base/$f" "$f"
        for o in $(obj_of "$f"); do
          d="/tmp/ab/obj/$f/$(basename "$(dirname "$o")")"; mkdir -p "$d"; cp -p "$o" "$d/"
        done
      done
      log "ab: base files $files; rebuilding libtaper"
      cmake --build build/gpu -j"$(nproc)" --target taper >"$OUT/ab_build.log" 2>&1 ||
        { tail -20 "$OUT/ab_build.log"; }
      cp -L "$so" /tmp/ab/base/lib.so
      for i in 1 2; do
        for v in new base; do
          cp /tmp/ab/$v/lib.so "$so"
          ./build/gpu/benches/bench_cuda --fused-table "$OUT/ab_${v}_$i.csv" \
            --filter "${AB_FILTER:-fused,}" 2>>"$OUT/ab_stderr.log"
          log "ab: $v $i rc=$?"
        done
      done
      # The tested sources, their objects and library back, each with its own times (cp -p): a
      # later build (this call's or a warm machine's next) must neither relink the base objects
      # into the library, as it did in run 42 of docs/cuda.md, nor rebuild the objects, as in
      # run 81, after they were touched: ninja keeps the time an object had when its deps were
      # recorded and takes one whose time has changed for stale.
      for f in $files; do
        cp -p "/tmp/ab/src/$f" "$f"
        for o in $(obj_of "$f"); do
          cp -p "/tmp/ab/obj/$f/$(basename "$(dirname "$o")")/$(basename "$o")" "$o"
        done
      done
      cp -p /tmp/ab/new/lib.so "$(readlink -f "$so")"
      python3 scripts/ab_report.py "$OUT" >"$OUT/ab.md" 2>&1
      ;;
    profile)
      if [ "${PROFILE_SASS:-0}" = 1 ]; then
        for f in softmax norm; do  # norm.cu: each of its compiles (cuda/CMakeLists.txt)
          for o in build/gpu/cuda/CMakeFiles/taper_cuda*.dir/$f.cu.o; do
            cuobjdump --dump-sass "$o"
          done | gzip >"$OUT/sass_$f.txt.gz"
        done
        log "sass dumped"
      fi
      IFS=';' read -ra cases <<<"${PROFILE_CASES:-softmax,bf16,16384x1024,fused,fwd}"
      kern="regex:${PROFILE_KERNELS:-warp_rows|block_rows|stream_rows|fwd_rows|bwd_rows|chunk|gn_bwd|col_reduce|fwd_merge|sums_merge}"
      for c in "${cases[@]}"; do
        log "ncu $c"
        tag=$(case_tag "$c")
        timeout "${NCU_SECONDS:-120}" ncu --clock-control none -k "$kern" \
          -c "${NCU_COUNT:-3}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section LaunchStats --section WarpStateStats \
          --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
          ${NCU_EXTRA:-} \
          ./build/gpu/benches/bench_cuda --fused-table /tmp/prof.csv --filter "$c" \
          >"$OUT/ncu_$tag.txt" 2>&1
        log "ncu rc=$?"
        if [ -n "${NCU_SOURCE:-}" ]; then
          # ncu's source page: every SASS instruction of the kernels with its samples and counters
          # (the shared-memory wavefronts and stalls of each), from a saved report.
          rep=/tmp/prof_$tag
          timeout "${NCU_SECONDS:-120}" ncu --clock-control none -k "$kern" \
            -c "${NCU_COUNT:-3}" --section SourceCounters --section WarpStateStats \
            --import-source yes -f -o "$rep" \
            ./build/gpu/benches/bench_cuda --fused-table /tmp/prof.csv --filter "$c" \
            >"$OUT/ncu_src_$tag.log" 2>&1
          ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 |
            gzip >"$OUT/ncu_src_$tag.csv.gz"
          log "ncu source page rc=${PIPESTATUS[0]}"
        fi
      done
      ;;
    kernels)
      IFS=';' read -ra cases <<<"${KERNEL_CASES:-group_norm,bf16,1x16x256x256_g4,fused,fwd_bwd}"
      for c in "${cases[@]}"; do
        log "ncu kernel times $c"
        timeout "${NCU_SECONDS:-120}" ncu --clock-control none --cache-control none \
          --metrics gpu__time_duration.sum \
          -k 'regex:^(?!reduce_rows_kernel|combine_partials_kernel)' -c "${KERNEL_COUNT:-40}" --csv \
          ./build/gpu/benches/bench_cuda --fused-table /tmp/prof.csv --filter "$c" \
          >"$OUT/kernels_$(case_tag "$c").csv" 2>&1
        log "ncu rc=$?"
      done
      ;;
    finetune)
      # The same 20 steps on the GPU and on the CPU; MODEL_DIR may point at a copy of the model
      # whose weights are stored as f16 (the f32 file does not fit the tool's 64 MiB transfer).
      M=$MODEL_DIR
      for dev in cuda cpu; do
        log "finetune --device $dev --steps 20 (model $M)"
        ./build/gpu/examples/finetune --device "$dev" --model-dir "$M" --steps 20 --test-limit 64 \
          --out "/tmp/finetune_$dev" >"$OUT/finetune_$dev.log" 2>&1
        log "finetune $dev rc=$?"
        grep -E "^(model|step|fine-tuned|summary)" "$OUT/finetune_$dev.log"
      done
      ;;
    main)
      # The whole main job on the GPU (default flags, seeds 1 and 2), then a checkpoint written
      # on the GPU half-way and resumed on the CPU, which must reach the same accuracy.
      M=$MODEL_DIR
      for seed in 1 2; do
        log "main job on cuda, seed $seed"
        ./build/gpu/examples/finetune --device cuda --model-dir "$M" --seed "$seed" ${MAIN_FLAGS:-} \
          --out "/tmp/main_cuda_$seed.safetensors" >"$OUT/main_cuda_$seed.log" 2>&1
        log "main cuda seed $seed rc=$?"
        grep -E "^(baseline|fine-tuned|summary)" "$OUT/main_cuda_$seed.log"
      done
      [ "${MAIN_RESUME:-1}" = 1 ] || continue  # MAIN_RESUME=0: no cross-device resume
      log "cross-device resume: 100 steps on cuda, the other 100 on cpu"
      ./build/gpu/examples/finetune --device cuda --model-dir "$M" --stop-after 100 \
        --out /tmp/half.safetensors >"$OUT/resume_cuda.log" 2>&1 &&
        ./build/gpu/examples/finetune --device cpu --model-dir "$M" --resume /tmp/half.safetensors \
          --out /tmp/resumed.safetensors >"$OUT/resume_cpu.log" 2>&1
      log "resume rc=$?"
      grep -E "^(resume|fine-tuned|summary)" "$OUT/resume_cpu.log"
      ;;
    ddp1)
      # Data parallelism's launcher end to end on one GPU: NCCL at world size 1.
      M=$MODEL_DIR
      log "finetune --device cuda --nproc 1 (40 steps)"
      ./build/gpu/examples/finetune --device cuda --nproc 1 --model-dir "$M" --steps 40 \
        --out /tmp/ddp1.safetensors >"$OUT/ddp1.log" 2>&1
      log "ddp1 rc=$?"
      grep -E "^(dist|baseline|fine-tune|step|fine-tuned|summary)" "$OUT/ddp1.log" | tail -8
      ;;
    multi)
      # Issue 16 on a machine with W >= 2 GPUs: NCCL across the GPUs against the host sum, the
      # 100 MiB all-reduce beside torch.distributed's, the bf16 128 x 128 step on 1, 2 and 4
      # GPUs (weak scaling: tokens/s), and 10 fine-tuning steps on 2 GPUs against 1.
      M=$MODEL_DIR
      W=$(nvidia-smi -L | wc -l)
      log "multi: $W GPUs"
      ./build/gpu/tests/taper_tests --gtest_filter='CudaDist*' --gtest_brief=1 >"$OUT/multi_test.log" 2>&1
      log "CudaDist rc=$? : $(counts "$OUT/multi_test.log")"
      for w in 2 4 8; do
        [ "$w" -le "$W" ] || continue
        torchrun --standalone --nproc_per_node "$w" --no-python ./build/gpu/benches/bench_allreduce \
          --mib 100 2>&1 | grep -E "^bench|rror" | tee -a "$OUT/multi_allreduce.log"
        torchrun --standalone --nproc_per_node "$w" scripts/bench_allreduce_torch.py --mib 100 \
          2>&1 | grep -E "^bench|rror" | tee -a "$OUT/multi_allreduce.log"
      done
      for w in 1 2 4; do
        [ "$w" -le "$W" ] || continue
        ./build/gpu/examples/finetune --device cuda --model-dir "$M" --bench-train --batch 128 \
          --seq-len 128 --dtype bf16 $([ "$w" -gt 1 ] && echo "--nproc $w") 2>&1 |
          grep -E "^bench-train: (MiniLM|[0-9]+ proc)|rror" | tee -a "$OUT/multi_train.log"
      done
      DDP_EXTRA="--device cuda --model-dir $M" bash tests/finetune_ddp.sh \
        ./build/gpu/examples/finetune ./build/gpu/tests/taper_ckpt_compare >"$OUT/multi_ddp.log" 2>&1
      log "2-GPU fine-tune against 1 GPU rc=$?"
      tail -12 "$OUT/multi_ddp.log"
      ;;
    train)
      M=$MODEL_DIR
      FT=./build/gpu/examples/finetune
      for cell in "train 16 64 f32" "train 128 128 f32" "train 16 64 bf16" "train 128 128 bf16" \
                  "forward 32 128 f32" "forward 512 128 f32" "forward 32 128 bf16" \
                  "forward 512 128 bf16"; do
        read -r kind b t dt <<<"$cell"
        # Training steps twice: replayed as a CUDA graph, and eager.
        graphs="on"
        [ "$kind" = train ] && graphs="${TRAIN_GRAPHS:-on off}"
        [ "$kind" = forward ] && graphs="off"
        for g in $graphs; do
          log "taper $kind $b x $t $dt (cuda graph $g)"
          $FT --device cuda --model-dir "$M" --bench-$kind --batch "$b" --seq-len "$t" --dtype "$dt" \
            $([ "$kind" = train ] && echo "--cuda-graph $g") \
            2>&1 | tee -a "$OUT/train_taper.log" | grep -E "^bench|^cuda-graph|rror"
        done
      done
      [ "${TRAIN_TORCH:-1}" = 1 ] || continue  # TRAIN_TORCH=0: taper's cells only
      log "PyTorch (scripts/bench_train_torch.py)"
      PYTHONUNBUFFERED=1 timeout "${TORCH_TRAIN_SECONDS:-300}" python3 scripts/bench_train_torch.py \
        --model-dir "$M" --json "$OUT/train_torch.json" --time-budget "${TORCH_TRAIN_BUDGET:-240}" \
        >"$OUT/train_torch.log" 2>&1
      log "bench_train_torch rc=$?"
      tail -12 "$OUT/train_torch.log"
      ;;
    *) echo "gpu_run: unknown step $step"; exit 2 ;;
  esac
done
log "done"

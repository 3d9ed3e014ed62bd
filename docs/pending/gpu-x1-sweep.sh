#!/usr/bin/env bash
# The forward rows' sweep of session 22 (runs 62, 63 of docs/cuda.md), for a tree with
# gpu-x1-row-knobs.diff applied and built by scripts/gpu_run.sh (bench_cuda): each knob setting
# times one fused forward row (median of 50, L2 flushed) three times, interleaved, into
# $OUT/sweep.txt as "label | forward us". Knobs: TAPER_X_NV (vectors a thread, norm rows),
# TAPER_X_THREADS (block threads, norm rows), TAPER_X_PIPE (1: the pipelined norm rows for the
# half types), TAPER_X_SPIPE (0: softmax unpipelined), TAPER_X_SG (softmax team size at least),
# TAPER_X_SWB (softmax warp-team block threads).
B=./build/gpu/benches/bench_cuda
one() {  # label, env..., case ("op,dtype,shape")
  local label=$1; shift; local c=${@: -1}; local envs=("${@:1:$#-1}")
  env "${envs[@]}" $B --fused-table /tmp/sw.csv --filter "$c,fused,fwd" 2>/dev/null
  echo "$label | $(awk -F, '$5 == "fwd" && $4 == "fused" {print $6}' /tmp/sw.csv)" >>"$OUT/sweep.txt"
}
for pass in 1 2 3; do
  for shape in 16384x1024 4096x16384; do
    for op in rms_norm layer_norm; do
      for cfg in "4 32 0" "4 256 0" "4 256 1" "2 64 0" "2 256 0"; do
        set -- $cfg
        one "$op $shape nv=$1 th=$2 pipe=$3" TAPER_X_NV=$1 TAPER_X_THREADS=$2 TAPER_X_PIPE=$3 \
          "$op,bf16,$shape"
      done
    done
    for sp in 1 0; do
      for wb in 32 256; do
        one "softmax $shape spipe=$sp wb=$wb" TAPER_X_SPIPE=$sp TAPER_X_SWB=$wb "softmax,bf16,$shape"
      done
    done
  done
done

#!/usr/bin/env bash
# bench_report.sh: runs taper's benchmark programs and prints one markdown report: the fused vs
# composed table of issues 3 and 13 (time, composed/fused speed-up, the norms' fused forward with
# the composed backward of before issue 13 and its ratio to fused, GB/s of the minimal bytes and
# its share of the STREAM-like copy measured in the same program; LibTorch side by side when
# bench_torch was built) and the primitives of issue 2 (add vs memcpy, op overhead, matmul vs
# direct OpenBLAS).
#
# Usage: scripts/bench_report.sh [--build DIR] [--no-run]
#   --build DIR  where the bench programs are (default build/release); results go to
#                DIR/bench-results/*.csv
#   --no-run     re-render the report from the CSV files of the last run
# Environment: TAPER_NUM_THREADS (taper's and BLAS's threads; LibTorch gets the same),
#   TAPER_BENCH_REPS (repetitions, default 5; the report uses their median),
#   TAPER_BENCH_FILTER (a --benchmark_filter regex for bench_fused/bench_torch, default all),
#   TAPER_BENCH_MIN_TIME (seconds per repetition, Google Benchmark's default 0.5 when unset).
# Repetitions run in random interleaved order (Google Benchmark's --benchmark_enable_random_
# interleaving), so on a shared machine a fused benchmark and its composed twin see the same
# spread of background load rather than whatever load their slot happened to get.
# Progress goes to stderr, the report to stdout:  scripts/bench_report.sh > report.md
# What it is not: a build script (scripts/main.sh builds, then calls this).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build/release
RUN=1
while (($#)); do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --no-run) RUN=0; shift ;;
    *) echo "bench_report: unknown argument $1" >&2; exit 2 ;;
  esac
done
BIN="$BUILD/benches"
OUT="$BUILD/bench-results"
REPS="${TAPER_BENCH_REPS:-5}"
FILTER="${TAPER_BENCH_FILTER:-.}"
MIN_TIME_ARGS=()
[ -n "${TAPER_BENCH_MIN_TIME:-}" ] && MIN_TIME_ARGS=(--benchmark_min_time="$TAPER_BENCH_MIN_TIME")
mkdir -p "$OUT"

run_bench() {  # name, filter
  local name="$1" filter="$2"
  if [ ! -x "$BIN/$name" ]; then
    echo "bench_report: $BIN/$name not built, skipped" >&2
    rm -f "$OUT/$name.csv"
    return
  fi
  echo "== running $name ($REPS repetitions, median reported; filter '$filter')" >&2
  local t0=$SECONDS
  if ! "$BIN/$name" --benchmark_filter="$filter" --benchmark_repetitions="$REPS" \
    --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
    "${MIN_TIME_ARGS[@]}" \
    --benchmark_out="$OUT/$name.csv" --benchmark_out_format=csv >&2; then
    echo "bench_report: $name failed; its rows are missing from the report" >&2
  fi
  echo "== $name done in $((SECONDS - t0)) s" >&2
}

load() { cut -d" " -f1-3 /proc/loadavg; }
if ((RUN)); then
  # When and under what load the numbers were taken: the report prints this with the table.
  echo "run started $(date -u '+%Y-%m-%d %H:%M UTC') (load average $(load))" > "$OUT/run-info.txt"
  run_bench bench_primitives .
  run_bench bench_fused "$FILTER"
  run_bench bench_torch "$FILTER"
  echo "finished $(date -u '+%H:%M UTC') (load average $(load))" >> "$OUT/run-info.txt"
fi
[ -f "$OUT/bench_fused.csv" ] || { echo "bench_report: no $OUT/bench_fused.csv" >&2; exit 1; }

THREADS="${TAPER_NUM_THREADS:-$(nproc)}"
CPU="$(lscpu 2>/dev/null | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2; exit}')"
echo "# taper benchmark report"
echo
echo "${CPU:-unknown CPU}, $(nproc) cores; taper threads: $THREADS;" \
     "median of $REPS repetitions (Google Benchmark, wall time);" \
     "$(tr '\n' ' ' < "$OUT/run-info.txt" 2>/dev/null || echo "run time unknown")"
echo

# One awk pass over every CSV. Google Benchmark's CSV: context lines, then a header starting with
# "name,"; names are quoted; times in the row's time_unit; rates in bytes/s and items/s; user
# counters (threads) as extra columns named in the header.
files=("$OUT/bench_fused.csv")
[ -f "$OUT/bench_primitives.csv" ] && files+=("$OUT/bench_primitives.csv")
[ -f "$OUT/bench_torch.csv" ] && files+=("$OUT/bench_torch.csv")
awk -F, '
function to_ms(t, u) {
  if (u == "ns") return t / 1e6
  if (u == "us") return t / 1e3
  if (u == "s") return t * 1e3
  return t
}
function fmt_ms(t) {
  if (t == "") return "-"
  if (t >= 100) return sprintf("%.0f", t)
  if (t >= 10) return sprintf("%.1f", t)
  return sprintf("%.2f", t)
}
function sort_key(op, dt, shape, pass,   o, d) {
  o = op == "softmax" ? 1 : op == "log_softmax" ? 2 : op == "rms_norm" ? 3 : op == "layer_norm" ? 4 : op == "group_norm" ? 5 : 9
  d = dt == "f32" ? 1 : dt == "bf16" ? 2 : dt == "f16" ? 3 : dt == "f64" ? 4 : 9
  return o "." d "." shape "." (pass == "fwd" ? 1 : 2)
}
function ratio(a, b) { return (a == "" || b == "" || b <= 0) ? "-" : sprintf("%.2f×", a / b) }
# Bytes of x for a shape word like 4096x4096 or 8x32x64x64_g8 and a dtype word.
function x_bytes(shape, dt,   s, d, n, i, k) {
  s = shape; sub(/_g[0-9]+$/, "", s)
  k = split(s, d, "x"); n = 1
  for (i = 1; i <= k; i++) n *= d[i]
  return n * (dt == "f64" ? 8 : dt == "f32" ? 4 : 2)
}
FNR == 1 { hdr = 0 }
/^name,/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); col[FILENAME, h] = i }; hdr = 1; next }
!hdr { next }
{
  name = $1; gsub(/"/, "", name)
  err = $(col[FILENAME, "error_occurred"]) == "true"
  if (name ~ /_(mean|stddev|cv)$/) next
  sub(/_median$/, "", name); sub(/\/real_time$/, "", name); gsub(/\/min_time:[^/]*/, "", name)
  t = to_ms($(col[FILENAME, "real_time"]), $(col[FILENAME, "time_unit"]))
  bps = $(col[FILENAME, "bytes_per_second"])
  ips = $(col[FILENAME, "items_per_second"])
  if (err) { errs[name] = 1; t = ""; bps = "" }
  time_ms[name] = t; gbs[name] = (bps == "" ? "" : bps / 1e9)
  if (ips != "" && name ~ /matmul/) gflops[name] = ips / 1e9
  ti = col[FILENAME, "threads"]; if (ti && $ti != "") threads[name] = $ti
  if (FILENAME ~ /bench_torch/) have_torch = 1
  if (name ~ /^BM_stream_copy\//) {
    mib = name; sub(/^BM_stream_copy\//, "", mib); sub(/MiB$/, "", mib)
    if (mib + 0 > best_mib && gbs[name] != "") { best_mib = mib + 0; stream = gbs[name] }
    next
  }
  # BM_<op>_<fwd|fwd_bwd>_<fused|composed|fused_bwd_composed|torch>/<dtype>/<shape>
  if (FILENAME ~ /bench_(fused|torch)/ && split(name, p, "/") == 3) {
    head = p[1]; sub(/^BM_/, "", head)
    if (!match(head, /_(fused_bwd_composed|fused|composed|torch)$/)) next
    path = substr(head, RSTART + 1); head = substr(head, 1, RSTART - 1)
    if (head ~ /_fwd_bwd$/) { pass = "fwd_bwd"; sub(/_fwd_bwd$/, "", head) }
    else { pass = "fwd"; sub(/_fwd$/, "", head) }
    key = head SUBSEP pass SUBSEP p[2] SUBSEP p[3]
    if (!(key in seen)) { seen[key] = 1; order[++nkeys] = key }
    res[key, path] = t; rate[key, path] = gbs[name]; errkey[key, path] = err
  }
}
END {
  print "## Fused vs composed (issues 3 and 13)"
  print ""
  if (stream != "")
    printf "STREAM-like copy (%d MiB arrays, same program, same threads): **%.1f GB/s**. ", best_mib, stream
  print "GB/s counts the minimal bytes (each input read once, each output written once; formulas in benches/bench_fused.cpp). " \
        "fwd_bwd is the op forward, then `y.backward(up)` with a fixed random upstream gradient: " \
        "the forward and backward of the op and nothing else, in every column. " \
        "fused_bwd_composed (the norms, fwd_bwd only): the fused forward with the backward op forced to its composed form, " \
        "as shipped before issue 13; fused_bwd_composed/fused is what the dedicated backward kernels buy by themselves. " \
        "\"-\" on forward rows and on softmax, whose dedicated backward predates issue 13. " \
        "target: issue 3'"'"'s (fwd_bwd speed-up on the f32 and bf16 rows only)."
  print ""
  hdrline = "| op | pass | dtype | shape | fused ms | composed ms | composed/fused | fused_bwd_composed ms | fused_bwd_composed/fused | fused GB/s | % of stream | target |"
  sepline = "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
  if (have_torch) { hdrline = hdrline " torch ms | torch/fused |"; sepline = sepline "---:|---:|" }
  fflush()
  print hdrline; print sepline
  fflush()
  sorter = "sort -t \"\t\" -k1,1 | cut -f2-"
  for (i = 1; i <= nkeys; i++) {
    key = order[i]; split(key, kk, SUBSEP)
    # fused_bwd_composed exists for the norms fwd_bwd only: "-" elsewhere. (Tested before the
    # read below, which would create the element.)
    have_fb = ((key, "fused_bwd_composed") in res)
    f = res[key, "fused"]; c = res[key, "composed"]; fb = res[key, "fused_bwd_composed"]
    g = rate[key, "fused"]
    pct = (g != "" && stream != "") ? sprintf("%.0f%%", 100 * g / stream) : "-"
    # Targets of issue 3: fwd_bwd speed-up >= 6x (softmax) / 3x (norms); fwd >= 80% of the
    # stream bandwidth on shapes whose x + y exceed the 32 MiB last-level cache the issue names.
    tgt = "-"
    if (kk[2] == "fwd_bwd" && f != "" && c != "" && kk[3] != "f64" && kk[3] != "f16") {
      need = (kk[1] == "softmax") ? 6 : 3
      tgt = sprintf("≥%d×: %s", need, (c / f >= need) ? "met" : "**missed**")
    } else if (kk[2] == "fwd" && g != "" && stream != "" && 2 * x_bytes(kk[4], kk[3]) > 32 * 1048576) {
      tgt = sprintf("≥80%%: %s", (g / stream >= 0.8) ? "met" : "**missed**")
    }
    line = sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", kk[1], kk[2], kk[3], kk[4],
                   errkey[key, "fused"] ? "error" : fmt_ms(f), errkey[key, "composed"] ? "error" : fmt_ms(c),
                   ratio(c, f), !have_fb ? "-" : errkey[key, "fused_bwd_composed"] ? "error" : fmt_ms(fb),
                   have_fb ? ratio(fb, f) : "-", (g == "" ? "-" : sprintf("%.1f", g)), pct, tgt)
    if (have_torch) {
      tt = res[key, "torch"]
      line = line sprintf(" %s | %s |", errkey[key, "torch"] ? "error" : fmt_ms(tt), ratio(tt, f))
    }
    # Rows come in the order of the CSV (interleaved): sort them by op, dtype, shape, pass.
    print sort_key(kk[1], kk[3], kk[4], kk[2]) "\t" line | sorter
  }
  close(sorter)
  if (!("BM_add_f32/16777216" in time_ms)) exit
  print ""
  print "## Primitives (issue 2)"
  print ""
  print "| benchmark | time | rate |"
  print "|---|---:|---:|"
  n = split("BM_add_f32/16777216 BM_stream_add_f32/16777216 BM_memcpy/16777216 BM_exp_f32/16777216 " \
            "BM_exp_bf16/16777216 BM_gelu_f32/16777216 BM_gelu_bf16/16777216 " \
            "BM_sum_last_dim_f32/4096/4096 BM_sum_last_dim_bf16/4096/4096 BM_sum_first_dim_f32/4096/4096 BM_sum_all_f32/10000000 " \
            "BM_matmul_f32/1024 BM_matmul_cblas_f32/1024 BM_op_overhead_add_1elem BM_op_overhead_add_1elem_grad", names, " ")
  for (i = 1; i <= n; i++) {
    nm = names[i]
    if (!(nm in time_ms)) continue
    t = time_ms[nm]
    if (nm ~ /overhead/) tm = (t == "" ? "error" : sprintf("%.2f µs", t * 1e3))
    else tm = (t == "" ? "error" : fmt_ms(t) " ms")
    if (nm in gflops) r = sprintf("%.1f GFLOP/s", gflops[nm])
    else if (gbs[nm] != "") r = sprintf("%.1f GB/s", gbs[nm])
    else r = "-"
    printf "| %s | %s | %s |\n", nm, tm, r
  }
  print ""
  a = gbs["BM_add_f32/16777216"]; m = gbs["BM_memcpy/16777216"]; s = gbs["BM_stream_add_f32/16777216"]
  if (a != "" && m != "")
    printf "- f32 add of 2^24 elements: %.1f GB/s (3 x 4 x n bytes), %.0f%% of memcpy (%.1f GB/s) and %.0f%% of a plain C++ add (%.1f GB/s).\n", a, 100 * a / m, m, 100 * a / s, s
  o = time_ms["BM_op_overhead_add_1elem"]; og = time_ms["BM_op_overhead_add_1elem_grad"]
  if (o != "") printf "- one op call on 1-element tensors: %.2f µs (%.2f µs when recording a graph node); target < 2 µs.\n", o * 1e3, og * 1e3
  mt = gflops["BM_matmul_f32/1024"]; mc = gflops["BM_matmul_cblas_f32/1024"]
  if (mt != "" && mc != "") printf "- matmul 1024³ f32: %.1f GFLOP/s through taper, %.1f GFLOP/s calling cblas_sgemm directly (%.0f%%; target ≥ 90%%).\n", mt, mc, 100 * mt / mc
}' "${files[@]}"

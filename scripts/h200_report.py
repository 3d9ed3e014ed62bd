#!/usr/bin/env python3
"""h200_report.py: renders one GPU bench run as the markdown of docs/benchmarks-h200.md.

Inputs (all from the same run on the same GPU, as scripts/gpu_run.sh's `bench` step writes them):
  --taper  FILE   bench_cuda --fused-table CSV (copy ceiling row first, then fused/composed rows)
  --torch  FILE   scripts/bench_fused_torch.py CSV (PyTorch native, torch.compile, Liger); optional
  --json   FILE   bench_cuda's Google Benchmark JSON (primitives: copy, add, sum, overhead, matmul)
  --commit SHA, --gpu NAME
"%" is the op's minimal bytes (bench_cuda.cpp's minimal_bytes) per second against the copy
ceiling measured in the same run; "vs best" is the best alternative's time over taper's fused
time (> 1: taper is faster). Output: markdown on stdout.
"""
import argparse
import csv
import json


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def primitives(path):
    with open(path) as f:
        data = json.load(f)
    med = {}
    for b in data.get("benchmarks", []):
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        for suffix in ("/real_time", "/manual_time"):
            name = name[: -len(suffix)] if name.endswith(suffix) else name
        med[name] = b
    lines = []
    copy = med.get("BM_cuda_memcpy_d2d")
    copy_bw = copy["bytes_per_second"] if copy else None

    def bw_row(name, label, target):
        b = med.get(name)
        if not b or not copy_bw:
            return
        bw = b["bytes_per_second"]
        lines.append(f"| {label} | {bw / 1e9:.0f} GB/s | {100 * bw / copy_bw:.1f}% | {target} |")

    lines.append("| primitive | result | vs copy | target |")
    lines.append("|---|---:|---:|---|")
    if copy_bw:
        lines.append(f"| d2d copy 1 GiB (cudaMemcpyAsync) | {copy_bw / 1e9:.0f} GB/s | 100% | |")
    bw_row("BM_cuda_add_f32", "add f32 2^28", ">= 90%")
    bw_row("BM_cuda_sum_last_dim_f32", "sum last dim f32 16384^2", ">= 85%")
    ov = med.get("BM_cuda_op_overhead")
    if ov:
        lines.append(f"| op overhead (host, `x + y` on 1 element) | {ov['us_per_op']:.2f} us/op | | <= 5 us |")
    for dt in ("f32", "bf16"):
        t = med.get(f"BM_cuda_matmul_taper/{dt}")
        c = med.get(f"BM_cuda_matmul_cublas/{dt}")
        if t and c:
            lines.append(f"| matmul 4096^3 {dt} (TF32 off) | {t['TFLOP/s']:.1f} TFLOP/s | "
                         f"{100 * t['TFLOP/s'] / c['TFLOP/s']:.1f}% of cuBLAS ({c['TFLOP/s']:.1f}) | >= 95% |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taper", required=True)
    ap.add_argument("--torch")
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--gpu", default="unknown")
    a = ap.parse_args()
    rows = read_csv(a.taper)
    copy = next(r for r in rows if r["op"] == "copy")
    ceiling = float(copy["bytes"]) / float(copy["median_us"]) * 1e-3  # GB/s
    alt = {}
    if a.torch:
        for r in read_csv(a.torch):
            if r["median_us"]:
                alt[(r["impl"], r["op"], r["dtype"], r["shape"], r["pass"])] = float(r["median_us"])
            elif r["note"]:
                alt[(r["impl"], r["op"], r["dtype"], r["shape"], "note")] = r["note"]
    by = {}
    for r in rows:
        if r["op"] == "copy":
            continue
        by[(r["op"], r["dtype"], r["shape"], r["pass"], r["path"])] = r
    keys = []
    for r in rows:
        k = (r["op"], r["dtype"], r["shape"], r["pass"])
        if r["op"] != "copy" and k not in keys:
            keys.append(k)

    print(f"Commit {a.commit}, {a.gpu}. Copy ceiling in this run: {ceiling:.0f} GB/s "
          f"(1 GiB device-to-device, bytes read + written).\n")
    if a.json:
        print("## Primitives (Google Benchmark, median of 3)\n")
        print(primitives(a.json))
        print()
    print("## Fused ops (CUDA events, L2 flushed and a 1 ms GPU spin before each call, "
          "median of 50)\n")
    print("Times in us. fused = taper's fused op (`kernel` = its CUDA kernels ran; `composed` = "
          "no CUDA kernel yet, the registry ran the composed form); composed = "
          "taper::composed; torch = PyTorch native; compile = torch.compile of the composed "
          "form; liger = Liger-Kernel. vs best = best alternative / taper fused.\n")
    print("| op | dtype | shape | pass | taper fused | % copy | taper composed | torch | compile | liger | vs best |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = {}
    for op, dt, shape, ps in keys:
        f = by.get((op, dt, shape, ps, "fused"))
        c = by.get((op, dt, shape, ps, "composed"))
        if not f:
            continue
        fus = float(f["median_us"])
        pct = 100 * float(f["bytes"]) / fus * 1e-3 / ceiling
        tag = "" if f["fused_kernel"] == "1" else " (composed)"
        cells = []
        best = None
        for impl in ("torch", "compile", "liger"):
            v = alt.get((impl, op, dt, shape, ps))
            if v is None:
                cells.append("n/a")
            else:
                cells.append(f"{v:.1f}")
                best = v if best is None else min(best, v)
        vs = f"{best / fus:.2f}x" if best else ""
        print(f"| {op} | {dt} | {shape} | {ps} | {fus:.1f}{tag} | {pct:.0f}% | "
              f"{float(c['median_us']):.1f} | " + " | ".join(cells) + f" | {vs} |")
        w = worst.get((op, ps))
        if w is None or pct < w[0]:
            worst[(op, ps)] = (pct, dt, shape)
    print("\nWorst row per op and pass (% of the copy ceiling):\n")
    for (op, ps), (pct, dt, shape) in worst.items():
        print(f"- {op} {ps}: {pct:.0f}% ({dt} {shape})")
    notes = sorted({(k[0], v) for k, v in alt.items() if k[4] == "note"})
    if notes:
        print("\nRows an alternative could not run:\n")
        for impl, note in notes:
            print(f"- {impl}: {note}")


if __name__ == "__main__":
    main()

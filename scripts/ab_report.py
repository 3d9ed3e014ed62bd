#!/usr/bin/env python3
"""ab_report.py: renders gpu_run.sh's `ab` step (ab_{new,base}_{1,2}.csv in a folder) as a
markdown table: per row the better median of each side, % of the copy ceiling (the best copy of
the call) and the change. Usage: python3 scripts/ab_report.py OUT_DIR [--only OPS] [--all]
(--only: comma-separated ops; --all: also the rows that moved by less than 1.5 %)."""
import argparse
import collections
import csv
import glob
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--only", default="")
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    rows = collections.defaultdict(lambda: {"new": [], "base": []})
    nbytes, copy = {}, []
    for f in sorted(glob.glob(a.dir + "/ab_*_*.csv")):
        side = f.rsplit("/", 1)[-1].split("_")[1]
        for r in csv.DictReader(open(f)):
            if r["op"] == "copy":
                copy.append(float(r["bytes"]) / float(r["median_us"]) / 1e3)
                continue
            k = (r["op"], r["dtype"], r["shape"], r["pass"])
            rows[k][side].append(float(r["median_us"]))
            nbytes[k] = float(r["bytes"])
    if not copy or not rows:
        print("ab_report: no A/B results in " + a.dir, file=sys.stderr)
        return 1
    cc = max(copy)
    only = set(filter(None, a.only.split(",")))
    print(f"Copy ceiling in this call: {cc:.0f} GB/s. Times: the better of two medians (us).\n")
    print("| op | dtype | shape | pass | before | % copy | after | % copy | change |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for k, r in rows.items():
        if not r["new"] or not r["base"] or (only and k[0] not in only):
            continue
        b, n = min(r["base"]), min(r["new"])
        if not a.all and abs(n / b - 1) < 0.015:
            continue
        pb, pn = nbytes[k] / b / 1e3 / cc * 100, nbytes[k] / n / 1e3 / cc * 100
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {b:.1f} | {pb:.0f}% | {n:.1f} | {pn:.0f}% "
              f"| {(n / b - 1) * 100:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_train_torch.py: PyTorch's time for the job of `finetune --bench-train` and
`--bench-forward` (examples/finetune/main.cpp) on the same GPU; taper is not imported.
Model: HuggingFace's BertModel (all-MiniLM-L6-v2, no pooler) from --model-dir, made f32 (the
.devmodel copy stores f16 values; taper's loader widens the same values to f32).
  train  zero_grad(set_to_none=True), forward, cross entropy, backward, AdamW(fused=True).step(),
         loss.item(). logits = Linear(384, 6)(sqrt(384) * normalize(mean over the mask of the
         last hidden state)), the head in f32 in every mode. AdamW lr 3e-4, betas (0.9, 0.999),
         eps 1e-8, weight decay 0.01 on rank >= 2 tensors, 0 on biases and LayerNorm weights.
         Hidden dropout --dropout (0, as the fine-tuning and bench-train's default), attention
         dropout 0. Batches 16 x 64 and 128 x 128.
  fwd    eval(), no_grad: normalize(mean pool) of a batch, copied to the host (as bench-forward's
         to_vector). Batches 32 x 128 and 512 x 128.
Modes: fp32 (TF32 off), tf32 (on), bf16 (autocast, f32 master weights, TF32 off), compile_bf16
(torch.compile of the classifier's forward + bf16 autocast; run last).
Inputs from --seed: ids uniform in [1000, 30000), mask all ones, token types 0, labels in [0, 6).
Each cell builds its model and optimizer afresh, runs --warmup steps (compile: >= 5), then times
--steps steps between torch.cuda.synchronize() calls (wall clock, as taper's): median, min,
tokens/s = batch * seq / median, and max_memory_allocated over the timed steps (weights and AdamW
state included, as taper's peak). Prints progress and a markdown table; --json PATH writes
[{cell, mode, batch, seq, median_ms, min_ms, tokens_per_s, peak_mib, tf32}] (a failed cell: nulls
and "error"; the exit status is then 1). Without CUDA it exits 2, unless --cpu-smoke.
Usage: python3 scripts/bench_train_torch.py --json /tmp/x.json [--cells train16x64:fp32,fwd512x128]
       [--steps 20] [--warmup 3] [--no-compile] [--time-budget 600] [--cpu-smoke]
"""
import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

WORK = (("train16x64", "train", 16, 64, "train 16x64"), ("train128x128", "train", 128, 128,
        "train 128x128"), ("fwd32x128", "fwd", 32, 128, "forward 32x128"),
        ("fwd512x128", "fwd", 512, 128, "forward 512x128"))
MODES = {"train": ("fp32", "tf32", "bf16", "compile_bf16"), "fwd": ("fp32", "bf16")}
CLASSES, LR, WEIGHT_DECAY = 6, 3e-4, 0.01


def all_cells():
    """(work, kind, batch, seq, mode) in run order: the compiled cells last."""
    cells = [(w, k, b, t, m) for w, k, b, t, _ in WORK for m in MODES[k]]
    return sorted(cells, key=lambda c: c[4] == "compile_bf16")  # stable: the order kept


def set_tf32(on):
    """TF32 for cuBLAS and cuDNN through the allow_tf32 flags (deprecation warning silenced), or
    the fp32_precision API where those are gone. Returns the matmul state."""
    if not torch.cuda.is_available():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on
            return bool(torch.backends.cuda.matmul.allow_tf32)
        except (AttributeError, RuntimeError):
            torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
            torch.backends.cudnn.fp32_precision = "tf32" if on else "ieee"
            return torch.backends.cuda.matmul.fp32_precision == "tf32"


def load_bert(args, dev):
    import transformers
    # The dtype argument is `dtype` from transformers 4.56 (`torch_dtype` before); 5.x defaults
    # to the file's dtype (f16 here), so it is always given, and checked below.
    ver = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    kw = {"dtype" if ver >= (4, 56) else "torch_dtype": torch.float32}
    bert = transformers.BertModel.from_pretrained(
        args.model_dir, add_pooling_layer=False, attn_implementation=args.attn,
        local_files_only=True, hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=0.0,
        **kw).float().to(dev)
    bad = [n for n, p in bert.named_parameters() if p.dtype != torch.float32]
    assert not bad, f"parameters not f32 after loading: {bad[:3]}"
    return bert


def embed(bert, ids, mask, types):
    """sentence-transformers' embedding: the mean over the mask, L2-normalised (eps 1e-12)."""
    h = bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    m = mask.unsqueeze(-1).to(h.dtype)
    return F.normalize(((h * m).sum(1) / m.sum(1).clamp(min=1e-9)).float(), dim=-1, eps=1e-12)


def run_cell(args, dev, kind, b, t, mode, warmup, steps):
    """Builds the cell's model (and optimizer) and times it -> (times_s, peak_mib, tf32, loss)."""
    tf32 = set_tf32(mode == "tf32")
    amp = {"device_type": dev.type, "dtype": torch.bfloat16,
           "enabled": mode in ("bf16", "compile_bf16")}  # off: a no-op context
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(1000, 30000, (b, t), generator=g).to(dev)
    labels = torch.randint(0, CLASSES, (b,), generator=g).to(dev)
    mask = torch.ones(b, t, dtype=torch.long, device=dev)
    types = torch.zeros(b, t, dtype=torch.long, device=dev)
    torch.manual_seed(args.seed)
    bert = load_bert(args, dev)
    last = {"loss": float("nan")}
    if kind == "fwd":
        bert.eval()

        def step():
            with torch.no_grad(), torch.autocast(**amp):
                return embed(bert, ids, mask, types).cpu()
    else:
        bert.train()
        hidden = bert.config.hidden_size
        head = torch.nn.Linear(hidden, CLASSES).to(dev)

        def logits(i, m, ty):
            e = embed(bert, i, m, ty)
            with torch.autocast(dev.type, enabled=False):  # taper's head stays f32
                return head(e.float() * math.sqrt(hidden))
        fwd = torch.compile(logits, dynamic=False) if mode == "compile_bf16" else logits
        params = [p for mod in (bert, head) for p in mod.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(**amp):
                out = fwd(ids, mask, types)
            loss = F.cross_entropy(out.float(), labels)
            loss.backward()
            opt.step()
            last["loss"] = loss.item()
    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    return times, peak, tf32, last["loss"]


def pick(spec, cells):
    """The cells named by --cells (work:mode, or work for all its modes), in run order."""
    chosen = set()
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        w, _, m = item.partition(":")
        hit = [c for c in cells if c[0] == w and (not m or c[4] == m)]
        if not hit:
            valid = ", ".join(f"{c[0]}:{c[4]}" for c in cells)
            print(f"bench_train_torch: no cell '{item}'; the cells are: {valid}", file=sys.stderr)
            sys.exit(2)
        chosen.update(hit)
    return [c for c in cells if c in chosen] if spec.strip() else cells


def table(results):
    modes = MODES["train"]
    got = {(r["cell"], r["mode"]): r for r in results}
    lines = ["| work | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    for w, _, _, _, label in WORK:
        cols = []
        for m in modes:
            r = got.get((w, m))
            if r is None or r["median_ms"] is None:
                cols.append("-" if r is None else "error")
            else:
                peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} MiB"
                cols.append(f"{r['median_ms']:.2f} ms ({peak})")
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="PyTorch beside finetune --bench-train/-forward")
    ap.add_argument("--model-dir", default=".devmodel/all-MiniLM-L6-v2")
    ap.add_argument("--cells", default="", help="comma list of work[:mode] (default: all)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per cell")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (compile: at least 5)")
    ap.add_argument("--json", default="", help="write the results to this file")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile_bf16 cells")
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds after which no new cell starts (default 0: no limit)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check the logic on the CPU: batch 2 x seq 8, 1 warm-up + 1 step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dropout", type=float, default=0.0, help="hidden dropout while training")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa or eager)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("bench_train_torch: CUDA is not available; this benchmark needs a GPU "
              "(--cpu-smoke checks the script on the CPU)", file=sys.stderr)
        sys.exit(2)
    if not os.path.isdir(args.model_dir) and not os.path.isabs(args.model_dir):
        # A relative --model-dir is also looked for under the repository root.
        alt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", args.model_dir)
        args.model_dir = os.path.normpath(alt) if os.path.isdir(alt) else args.model_dir
    for f in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(args.model_dir, f)):
            print(f"bench_train_torch: {os.path.join(args.model_dir, f)} not found (make .devmodel "
                  "with scripts/fetch_device_deps.sh, or pass --model-dir)", file=sys.stderr)
            sys.exit(2)
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    cells = pick(args.cells, all_cells())
    if args.no_compile:
        cells = [c for c in cells if c[4] != "compile_bf16"]
    import transformers
    gpu = "cpu (smoke run)" if args.cpu_smoke else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {gpu}; "
          f"{len(cells)} cells, {args.steps} steps after {args.warmup} warm-up", flush=True)
    t_start = time.time()
    results, skipped, failed = [], [], 0
    for w, kind, b, t, mode in cells:
        name = f"{w}:{mode}"
        if args.time_budget > 0 and time.time() - t_start > args.time_budget:
            skipped.append(name)
            continue
        warmup, steps = max(args.warmup, 5 if mode == "compile_bf16" else 0), max(1, args.steps)
        if args.cpu_smoke:
            b, t, warmup, steps = 2, 8, 1, 1
        print(f"[{time.time() - t_start:6.1f} s] start {name}: batch {b} x seq {t}, {warmup} "
              f"warm-up + {steps} timed steps", flush=True)
        row = {"cell": w, "mode": mode, "batch": b, "seq": t, "median_ms": None, "min_ms": None,
               "tokens_per_s": None, "peak_mib": None, "tf32": None}
        try:
            times, peak, tf32, loss = run_cell(args, dev, kind, b, t, mode, warmup, steps)
            med = statistics.median(times)
            row.update(median_ms=1e3 * med, min_ms=1e3 * min(times), tokens_per_s=b * t / med,
                       peak_mib=peak, tf32=tf32)
            pk = "n/a" if peak is None else f"{peak:.1f} MiB"
            print(f"[{time.time() - t_start:6.1f} s] done  {name}: median {1e3 * med:.2f} ms (min "
                  f"{1e3 * min(times):.2f}), {b * t / med:.0f} tokens/s, peak {pk}, TF32 "
                  f"{'on' if tf32 else 'off'}" + (f", loss {loss:.4f}" if kind == "train" else ""),
                  flush=True)
        except Exception as ex:  # a failed cell is reported; the others still run
            failed += 1
            row["error"] = (type(ex).__name__ + ": " + str(ex)).splitlines()[0][:300]
            print(f"[{time.time() - t_start:6.1f} s] FAIL  {name}: {row['error']}", flush=True)
        results.append(row)
        # The cell's model, optimizer and graphs went with run_cell's frame; free their memory.
        if mode == "compile_bf16":
            torch._dynamo.reset()
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if skipped:
        print(f"time budget of {args.time_budget:.0f} s spent; skipped: {', '.join(skipped)}",
              flush=True)
    print("\n" + table(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

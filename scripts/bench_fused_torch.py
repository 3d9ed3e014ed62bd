#!/usr/bin/env python3
"""bench_fused_torch.py: times the alternatives to taper's fused CUDA ops on the same GPU, by the
method of `bench_cuda --fused-table` (benches/bench_cuda.cpp): CUDA events around each call,
the L2 cache flushed before every timed iteration (a 256 MiB buffer summed: read, so the L2 is
left holding clean lines), then a spin of HIDE_CYCLES on the GPU (torch.cuda._sleep; bench_cuda's
gpu_spin.cu) so that the events time the GPU's work, not Python's queueing of it, 5 warm-up calls,
the median of --iters (default 50) timed calls. Implementations:
  torch      PyTorch native (F.softmax, F.rms_norm, F.layer_norm, F.group_norm)
  compile    torch.compile of the composed form (primitive ops), forward and backward graphs
  liger      Liger-Kernel's Triton kernels (LigerSoftmaxFunction, LigerRMSNormFunction,
             LigerLayerNormFunction, LigerGroupNormFunction), when its source is on
             PYTHONPATH (a fetched copy, never part of taper); rows that it cannot run say why
"fwd_bwd" times y = f(x); y.backward(up) with x, w and b requiring gradients.
Output: CSV on stdout (impl,op,dtype,shape,pass,median_us,note); progress on stderr.
Runs on a GPU machine only; taper itself never imports Python.
Usage: python3 scripts/bench_fused_torch.py [--iters 50] [--budget-s 300] > torch.csv
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

EPS = 1e-5
# About 1 ms of SM clocks: longer than Python takes to queue any row's call. Without it a slow
# host's queueing time entered the times (run 94 of docs/cuda.md: Liger's bf16 softmax forward
# 111.4 us, where run 86 measured 21.7 us).
HIDE_CYCLES = 2_000_000


def cases():
    """The rows of bench_cuda --fused-table: (op, shape, groups, dtype)."""
    out = []
    for dt in (torch.bfloat16, torch.float32):
        for op in ("softmax", "rms_norm", "layer_norm"):
            for shape in ((16384, 1024), (4096, 16384)):
                out.append((op, shape, 0, dt))
        for shape, g in (((16, 32, 256, 256), 8), ((16, 512, 64, 64), 32), ((1, 16, 256, 256), 4)):
            out.append(("group_norm", shape, g, dt))
    for op in ("softmax", "rms_norm", "layer_norm"):
        out.append((op, (16384, 1024), 0, torch.float64))
    out.append(("group_norm", (16, 32, 256, 256), 8, torch.float64))
    return out


def dname(dt):
    return {torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}[dt]


def sname(shape, g):
    s = "x".join(str(d) for d in shape)
    return s + (f"_g{g}" if g else "")


def native(op, g):
    if op == "softmax":
        return lambda x, w, b: F.softmax(x, dim=-1)
    if op == "rms_norm":
        return lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, EPS)
    if op == "layer_norm":
        return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS)
    return lambda x, w, b: F.group_norm(x, g, w, b, EPS)


def composed(op, g):
    """The composed forms, as taper's metal_fallback/composed.cpp (f32 compute for half types)."""
    def up(t):
        return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t

    def softmax(x, w, b):
        xc = up(x)
        e = (xc - xc.amax(-1, keepdim=True)).exp()
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)

    def rms(x, w, b):
        xc = up(x)
        r = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + EPS)
        return (xc * r * up(w)).to(x.dtype)

    def layer(x, w, b):
        xc = up(x)
        xm = xc - xc.mean(-1, keepdim=True)
        r = torch.rsqrt((xm * xm).mean(-1, keepdim=True) + EPS)
        return (xm * r * up(w) + up(b)).to(x.dtype)

    def group(x, w, b):
        n, c = x.shape[0], x.shape[1]
        xg = up(x).reshape(n, g, -1)
        xm = xg - xg.mean(-1, keepdim=True)
        r = torch.rsqrt((xm * xm).mean(-1, keepdim=True) + EPS)
        y = (xm * r).reshape(x.shape)
        pshape = (c,) + (1,) * (x.dim() - 2)
        return (y * up(w).reshape(pshape) + up(b).reshape(pshape)).to(x.dtype)

    return {"softmax": softmax, "rms_norm": rms, "layer_norm": layer, "group_norm": group}[op]


def liger(op, g):
    if op == "softmax":
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        return lambda x, w, b: LigerSoftmaxFunction.apply(x)
    if op == "rms_norm":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        # in_place=False: the upstream gradient is reused across iterations.
        return lambda x, w, b: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    if op == "layer_norm":
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)
    from liger_kernel.ops.group_norm import LigerGroupNormFunction
    # Liger's group norm takes (N, C, hidden): the spatial dims flattened (a 4-d input is read
    # out of bounds), its output reshaped back.
    return lambda x, w, b: LigerGroupNormFunction.apply(
        x.reshape(x.shape[0], x.shape[1], -1), w, b, x.shape[1], g, EPS).reshape(x.shape)


def time_fn(fn, iters, flush):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.sum()
        torch.cuda._sleep(HIDE_CYCLES)
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--ops", default="", help="comma-separated ops to run (default: all)")
    ap.add_argument("--dtypes", default="", help="comma-separated dtypes to run (default: all)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="torch.compile rows are skipped once this much time has passed")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)
    t0 = time.time()
    print("impl,op,dtype,shape,pass,median_us,note")
    for op, shape, g, dt in cases():
        if (args.ops and op not in args.ops.split(",")) or \
                (args.dtypes and dname(dt) not in args.dtypes.split(",")):
            continue
        gen = torch.Generator(device=dev).manual_seed(11)
        x0 = torch.randn(shape, device=dev, dtype=torch.float32, generator=gen).to(dt)
        p = shape[1] if op == "group_norm" else shape[-1]
        w0 = (1 + 0.1 * torch.randn(p, device=dev, generator=gen)).to(dt)
        b0 = (0.1 * torch.randn(p, device=dev, generator=gen)).to(dt)
        up = torch.randn(shape, device=dev, dtype=torch.float32, generator=gen).to(dt)
        impls = [("torch", lambda: native(op, g)), ("compile", None), ("liger", lambda: liger(op, g))]
        for impl, make in impls:
            note = ""
            try:
                if impl == "compile":
                    if time.time() - t0 > args.budget_s:
                        raise RuntimeError("skipped: time budget spent")
                    # A fresh start for each row: each shape, dtype and grad mode is a
                    # recompile of the same function, and after dynamo's recompile limit (8)
                    # it ran the rest eagerly (run 96: the f64 rows, f32 group norm's last two).
                    torch._dynamo.reset()
                    f = torch.compile(composed(op, g), dynamic=False)
                else:
                    f = make()
                for ps in ("fwd", "fwd_bwd"):
                    if ps == "fwd":
                        x, w, b = x0, w0, b0
                        def run():
                            with torch.no_grad():
                                f(x, w, b)
                    else:
                        x = x0.clone().requires_grad_(True)
                        w = w0.clone().requires_grad_(True)
                        b = b0.clone().requires_grad_(True)
                        def run():
                            y = f(x, w, b)
                            y.backward(up)
                            x.grad = None
                            w.grad = None
                            b.grad = None
                    us = time_fn(run, args.iters, flush)
                    print(f"{impl},{op},{dname(dt)},{sname(shape, g)},{ps},{us:.2f},", flush=True)
            except Exception as ex:  # a row an implementation cannot run is reported, not fatal
                note = (type(ex).__name__ + ": " + str(ex)).splitlines()[0][:120].replace(",", ";")
                print(f"{impl},{op},{dname(dt)},{sname(shape, g)},fwd,,{note}", flush=True)
            print(f"[{time.time() - t0:.0f} s] {impl} {op} {dname(dt)} {sname(shape, g)} {note}",
                  file=sys.stderr, flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

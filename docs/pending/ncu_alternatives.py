#!/usr/bin/env python3
"""ncu_alternatives.py: calls the alternatives' bf16 forward kernels (Liger-Kernel's rms_norm,
layer_norm and softmax; torch.compile of the composed rms_norm and layer_norm, as
scripts/bench_fused_torch.py builds them) a few times on one shape, for ncu to profile beside
taper's (session 22, runs 62 and 63 of docs/cuda.md). Liger's source comes from .liger/src (a
fetched copy, never part of taper). Usage on a GPU machine:
  ncu --clock-control none -k 'regex:_forward_kernel|triton_' -c 15 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    python3 docs/pending/ncu_alternatives.py 16384 1024
"""
import sys

import torch

sys.path.insert(0, ".liger/src")
from liger_kernel.ops.layer_norm import LigerLayerNormFunction  # noqa: E402
from liger_kernel.ops.rms_norm import LigerRMSNormFunction  # noqa: E402
from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: E402

EPS = 1e-5


def layer(x, w, b):
    xc = x.float()
    xm = xc - xc.mean(-1, keepdim=True)
    r = torch.rsqrt((xm * xm).mean(-1, keepdim=True) + EPS)
    return (xm * r * w.float() + b.float()).to(x.dtype)


def rms(x, w, b):
    xc = x.float()
    r = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + EPS)
    return (xc * r * w.float()).to(x.dtype)


def main():
    rows, cols = int(sys.argv[1]), int(sys.argv[2])
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    x = torch.randn(rows, cols, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(cols, device="cuda")).bfloat16()
    b = (0.1 * torch.randn(cols, device="cuda")).bfloat16()
    with torch.no_grad():
        for _ in range(calls):
            LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
        for _ in range(calls):
            LigerLayerNormFunction.apply(x, w, b, EPS)
        for _ in range(calls):
            LigerSoftmaxFunction.apply(x)
        for f in (layer, rms):
            g = torch.compile(f, dynamic=False)
            for _ in range(calls):
                g(x, w, b)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

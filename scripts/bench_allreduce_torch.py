"""bench_allreduce_torch.py: torch.distributed's NCCL all_reduce timed as
benches/bench_allreduce.cpp times taper's (the same sizes, Avg, 5 warm-up runs, median of
--iters, each from a synchronised device to a synchronised device): NCCL's own time for issue 16.
It does not import taper. Run: torchrun --standalone --nproc_per_node N
scripts/bench_allreduce_torch.py --mib 100"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=100.0)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as taper: NVLink multicast off
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    n = int(a.mib * (1 << 20) / 4)
    g = torch.Generator(device="cuda").manual_seed(7 + rank)
    t = torch.randn(n, device="cuda", generator=g)
    ms = []
    for i in range(5 + a.iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
        if i >= 5:
            ms.append((time.perf_counter() - t0) * 1e3)
    dist.barrier()
    ms.sort()
    med = ms[len(ms) // 2]
    algbw = n * 4 / (med * 1e-3) / 1e9
    if rank == 0:
        print(f"bench-allreduce: torch.distributed (nccl {torch.cuda.nccl.version()}) {a.mib:.1f} MiB "
              f"f32 over {world} ranks: median {med:.3f} ms (min {ms[0]:.3f}, max {ms[-1]:.3f}, "
              f"{a.iters} runs), algbw {algbw:.1f} GB/s, busbw {algbw * 2 * (world - 1) / world:.1f} GB/s",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

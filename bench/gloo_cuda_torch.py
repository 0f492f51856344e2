#!/usr/bin/env python3
"""torch.distributed's gloo with CUDA tensors, the peer of c10d-bench
--backend tcp --device cuda: an in-place float32 all_reduce from -b to -e
bytes (x -f per step), -n timed ops each after -w warm-up ones, every op
waited for (async_op=False: gloo's CUDA work blocks until its copy back is
done), on the GPU LOCAL_RANK % count. One process per rank, launched with
env:// variables set (c10drun -n 2 python3 gloo_cuda_torch.py). Prints, on
rank 0, size, time per op (us, slowest rank) and bus bandwidth (GB/s) as
c10d-bench's columns do.

  gloo_cuda_torch.py [-b BYTES] [-e BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=size, default=4096)
    p.add_argument("-e", type=size, default=256 << 20)
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    a = p.parse_args()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("# torch %s gloo, CUDA tensors, %d ranks, all_reduce float32" % (torch.__version__, n))
        print("%12s %12s %12s" % ("size", "time(us)", "busbw(GB/s)"))
    b = a.b
    while b <= a.e:
        t = torch.ones(max(b // 4, 1), dtype=torch.float32, device=dev)
        for _ in range(a.w):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.n):
            dist.all_reduce(t)
        torch.cuda.synchronize(dev)
        us = (time.perf_counter() - t0) * 1e6 / a.n
        slowest = torch.tensor([us], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            us = slowest.item()
            busbw = (t.numel() * 4) * 2 * (n - 1) / n / (us * 1e-6) / 1e9
            print("%12d %12.2f %12.4f" % (t.numel() * 4, us, busbw))
        b *= a.f
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

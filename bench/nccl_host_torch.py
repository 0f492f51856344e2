#!/usr/bin/env python3
"""Host cost per op of torch.distributed's NCCL backend, as bench_nccl_host
measures ours: one rank, an in-place float32 all_reduce of BYTES, ITERS ops
issued back to back per round (the time to issue them / ITERS), the median
and min of ROUNDS rounds, then issue + complete. dist.all_reduce is called
as most code calls it (async_op=False: for NCCL that makes the current
stream wait, it does not block the host).

  python3 nccl_host_torch.py [-n ITERS] [-r ROUNDS] [-b BYTES] [-d DEVICE]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("-r", type=int, default=11)
    p.add_argument("-b", type=int, default=4)
    p.add_argument("-d", type=int, default=0)
    a = p.parse_args()
    dev = torch.device("cuda", a.d)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    t = torch.zeros(a.b // 4, dtype=torch.float32, device=dev)
    issue, done = [], []
    for r in range(-1, a.r):  # round -1: warm-up
        t0 = time.perf_counter()
        for _ in range(a.n):
            dist.all_reduce(t)
        t1 = time.perf_counter()
        torch.cuda.synchronize(dev)
        t2 = time.perf_counter()
        if r >= 0:
            issue.append((t1 - t0) * 1e6 / a.n)
            done.append((t2 - t0) * 1e6 / a.n)
    print(
        f"torch  {a.b:9d} B  host us/op: median {statistics.median(issue):7.3f}  min "
        f"{min(issue):7.3f}   issue+complete us/op: median {statistics.median(done):7.3f}  "
        f"({a.r} rounds x {a.n} ops)  torch {torch.__version__}, nccl "
        f"{'.'.join(map(str, torch.cuda.nccl.version()))}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""torch.distributed gloo all_reduce sweep, the peer c10d-bench is compared with.

Launched once per rank with torchrun's environment (c10drun provides it):
    c10drun -n 2 /usr/bin/python3 bench/peer/gloo_allreduce.py --min 4 --max 64M --factor 4
Rank 0 prints one line per size: "size time_us busbw_GBps" (float32 SUM,
busbw = bytes / time * 2(n-1)/n as nccl-tests and c10d-bench define it).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in mult:
        return int(text[:-1]) * mult[text[-1].upper()]
    return int(text)


def iterations(nbytes):
    return max(20, min(1000, (64 << 20) // max(nbytes, 1) // 4))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", default="4")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=4)
    args = ap.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    size = parse_size(args.min)
    while size <= parse_size(args.max):
        count = max(size // 4, 1)
        t = torch.ones(count, dtype=torch.float32)
        iters = iterations(size)
        for _ in range(max(2, iters // 10)):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        elapsed = (time.perf_counter() - start) / iters
        # Slowest rank's time, like c10d-bench and nccl-tests.
        worst = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            us = worst.item() * 1e6
            busbw = count * 4 / (us * 1e-6) / 1e9 * 2 * (n - 1) / n
            print(f"{count * 4} {us:.2f} {busbw:.3f}", flush=True)
        size *= args.factor
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

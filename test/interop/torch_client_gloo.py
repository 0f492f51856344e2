"""A 2-rank torch.distributed gloo job whose rendezvous goes through c10d-store.

Run by test/test_interop_torch_client.sh, which starts the server:
    torch_client_gloo.py --port P [--world-size 2] [--server-pid PID --server-log FILE]

Each rank is its own /usr/bin/python3 process with MASTER_ADDR/MASTER_PORT
pointing at c10d-store and TORCHELASTIC_USE_AGENT_STORE=True (plus
TORCHELASTIC_RESTART_COUNT=0, which torchrun sets and 1.13 then reads), so no rank
starts a TCPStore server: init_process_group("gloo", init_method="env://")
connects every rank as a client of ours. The ranks all_reduce, barrier and
destroy; the parent checks each rank's result and that the store saw them.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001
    print("SKIP: cannot import torch.distributed: %s" % e)
    sys.exit(77)


def rank_main():
    import datetime
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    assert dist.get_rank() == rank and dist.get_world_size() == world
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    want = float(world * (world + 1) // 2)
    if not bool((t == want).all()):
        print("rank %d: all_reduce gave %s, want %s" % (rank, t[:4].tolist(), want))
        return 1
    m = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    if int(m.item()) != world - 1:
        print("rank %d: all_reduce MAX gave %d" % (rank, int(m.item())))
        return 1
    dist.barrier()
    dist.destroy_process_group()
    print("rank %d: all_reduce ok, barrier ok, destroyed" % rank)
    return 0


def stats(pid, log):
    before = open(log).read().count(" stats {")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [l for l in open(log).read().splitlines() if " stats {" in l]
        if len(lines) > before:
            return json.loads(lines[-1].split(" stats ", 1)[1])
        time.sleep(0.05)
    raise RuntimeError("no stats line from the server within 10 s of SIGUSR1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--server-log")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        sys.exit(rank_main())

    before = stats(a.server_pid, a.server_log) if a.server_pid else None
    procs = []
    for r in range(a.world_size):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(r),
                   LOCAL_RANK=str(r), WORLD_SIZE=str(a.world_size),
                   TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank"], env=env))
    rcs = []
    try:
        for p in procs:
            rcs.append(p.wait(timeout=120))
    except subprocess.TimeoutExpired:
        print("FAIL: a rank did not finish within 120 s")
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ok = rcs == [0] * a.world_size
    print("%s ranks exited with %s" % ("ok  " if ok else "FAIL", rcs))
    if a.server_pid:
        after = stats(a.server_pid, a.server_log)
        accepted = after["connections"]["accepted"] - before["connections"]["accepted"]
        ops = after["ops_total"] - before["ops_total"]
        # Each 1.13 rank opens 2 connections to the store and runs its
        # rendezvous (ADD init/, the store barrier, gloo's address exchange).
        seen = accepted >= 2 * a.world_size and ops > 0
        print("%s the store accepted %d connections and served %d requests during the job"
              % ("ok  " if seen else "FAIL", accepted, ops))
        ok = ok and seen
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch 1.13's TCPStore client (is_master=False) against c10d-store.

Run by test/test_interop_torch_client.sh, which starts the server:
    torch_client_store.py --port P --server-pid PID --server-log FILE

Covers every command the 1.13 Python client has (set, get, add, compare_set,
wait with and without timeout, check (sent raw: the 1.13 Python binding lacks it), delete_key,
num_keys, set_timeout), a
wait that times out followed by more commands on the same store, the client's
two connections (read from the server's stats line, which SIGUSR1 triggers),
and several client processes at once.
"""
import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

try:
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
    print("SKIP: cannot import torch.distributed: %s" % e)
    sys.exit(77)

HOST = "127.0.0.1"
failures = []


def check(cond, what):
    if cond:
        print("ok   %s" % what)
    else:
        print("FAIL %s" % what)
        failures.append(what)


def client(port, timeout_s=10):
    return dist.TCPStore(HOST, port, 1, False, datetime.timedelta(seconds=timeout_s))


def raw_check(port, keys):
    """CHECK as the 1.13 C++ client sends it (its Python binding has no check()):
    command byte 4, u64 count, then each key as u64 length + "/" + key."""
    import socket
    import struct
    msg = bytes([4]) + struct.pack("<Q", len(keys))
    for k in keys:
        kb = ("/" + k).encode()
        msg += struct.pack("<Q", len(kb)) + kb
    with socket.create_connection((HOST, port), timeout=10) as so:
        so.sendall(msg)
        reply = so.recv(1)
    if reply not in (b"\x00", b"\x01"):
        raise RuntimeError("CHECK answered %r" % reply)
    return reply == b"\x00"  # READY


def server_stats(pid, log):
    """Asks the server for a stats line (SIGUSR1) and returns it parsed."""
    before = open(log).read().count(" stats {")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [l for l in open(log).read().splitlines() if " stats {" in l]
        if len(lines) > before:
            return json.loads(lines[-1].split(" stats ", 1)[1])
        time.sleep(0.05)
    raise RuntimeError("the server wrote no stats line within 10 s of SIGUSR1")


def wait_for_open_connections(pid, log, want):
    """Connections close asynchronously: poll the server until it agrees."""
    deadline = time.monotonic() + 10
    while True:
        n = server_stats(pid, log)["connections"]["open"]
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_commands(port):
    s = client(port)
    # set / get, binary-safe values
    s.set("k1", "v1")
    check(s.get("k1") == b"v1", "set then get")
    s.set("k1", b"\x00\xffbin")
    check(s.get("k1") == b"\x00\xffbin", "overwrite with binary bytes")
    s.set("empty", "")
    check(s.get("empty") == b"", "empty value")
    big = os.urandom(1 << 20)
    s.set("big", big)
    check(s.get("big") == big, "1 MiB value")

    # add: missing key counts as 0, stored as decimal text
    check(s.add("ctr", 5) == 5, "add on a missing key")
    check(s.add("ctr", -7) == -2, "add a negative delta")
    check(s.get("ctr") == b"-2", "counter reads back as decimal text")
    check(s.add("ctr", 0) == -2, "add 0 reads the counter")

    # compare_set, every row of the protocol table
    check(s.compare_set("cs", "", "d1") == b"d1", "compare_set: missing key, empty expected -> desired")
    check(s.get("cs") == b"d1", "compare_set: stored")
    check(s.compare_set("cs2", "x", "d2") == b"x", "compare_set: missing key, other expected -> expected")
    check(not raw_check(port, ["cs2"]), "compare_set: missing key stays missing")
    check(s.compare_set("cs", "d1", "d3") == b"d3", "compare_set: equal -> desired")
    check(s.compare_set("cs", "zz", "d4") == b"d3", "compare_set: different -> current value")
    check(s.get("cs") == b"d3", "compare_set: unchanged after mismatch")

    # check / wait on present keys
    check(raw_check(port, ["k1", "ctr"]), "check: present keys")
    check(not raw_check(port, ["k1", "nope"]), "check: one key missing")
    s.wait(["k1", "ctr"])
    s.wait(["k1"], datetime.timedelta(seconds=5))
    check(True, "wait on present keys, with and without a timeout")

    # num_keys and delete_key
    n0 = s.num_keys()
    s.set("nk_a", "1")
    s.set("nk_b", "2")
    check(s.num_keys() == n0 + 2, "num_keys counts new keys")
    check(s.delete_key("nk_a") is True, "delete_key of a present key")
    check(s.delete_key("nk_a") is False, "delete_key of a missing key")
    check(s.num_keys() == n0 + 1, "num_keys after delete")
    check(not raw_check(port, ["nk_a"]), "deleted key is gone")

    # A wait that times out, then more commands on the same store: the
    # server must drop the abandoned wait so no late reply lands on them.
    t0 = time.monotonic()
    try:
        s.wait(["late"], datetime.timedelta(milliseconds=500))
        check(False, "wait on a missing key times out")
    except RuntimeError as e:
        check("imeout" in str(e) or "timed out" in str(e), "wait on a missing key times out (%s)" % e)
    s.set("after", "a1")
    check(s.get("after") == b"a1", "set/get after a timed-out wait")
    other = client(port)
    other.set("late", "L")  # would fire the abandoned wait if it were still registered
    check(s.get("late") == b"L", "get of the key the abandoned wait named")
    check(s.add("ctr", 1) == -1, "add after the abandoned wait fired nothing late")
    check(raw_check(port, ["after", "late"]), "check after the abandoned wait")
    check(s.compare_set("cs", "d3", "d5") == b"d5", "compare_set after the abandoned wait")

    # A blocking wait released by another client.
    import threading
    threading.Timer(0.3, lambda: client(port).set("released", "r")).start()
    s.wait(["released"], datetime.timedelta(seconds=10))
    check(s.get("released") == b"r", "wait released by another client's set")

    # set_timeout: the store-wide timeout applies to later waits and gets.
    s.set_timeout(datetime.timedelta(milliseconds=300))
    try:
        s.get("never")  # WAIT then GET: times out on the WAIT
        check(False, "get of a missing key times out after set_timeout")
    except RuntimeError:
        check(True, "get of a missing key times out after set_timeout")
    s.set_timeout(datetime.timedelta(seconds=10))
    check(s.get("k1") == b"\x00\xffbin", "store still consistent after set_timeout timeouts")
    del other
    del s


def test_two_connections(port, pid, log):
    base = wait_for_open_connections(pid, log, 0)
    check(base == 0, "no connection open before (got %d)" % base)
    stores = [client(port) for _ in range(3)]
    n = wait_for_open_connections(pid, log, 6)
    check(n == 6, "3 PyTorch 1.13 clients hold 2 connections each (server counts %d)" % n)
    for st in stores:
        st.set("twoconn", "x")
    del stores, st
    n = wait_for_open_connections(pid, log, 0)
    check(n == 0, "connections closed when the clients went away (server counts %d)" % n)


def worker(port, wid, iters):
    s = client(port, 30)
    for i in range(iters):
        s.add("conc/ctr", 1)
        s.set("conc/%d/%d" % (wid, i), "w%d-%d" % (wid, i))
        if s.get("conc/%d/%d" % (wid, i)) != ("w%d-%d" % (wid, i)).encode():
            print("worker %d: wrong value at %d" % (wid, i))
            return 1
    s.add("conc/done", 1)
    s.wait(["conc/go"], datetime.timedelta(seconds=30))  # released by the parent
    return 0


def test_concurrent(port, nworkers=6, iters=200):
    procs = [subprocess.Popen([sys.executable, __file__, "--port", str(port), "--worker", str(w),
                               "--iters", str(iters)]) for w in range(nworkers)]
    try:
        s = client(port, 60)
        deadline = time.monotonic() + 90
        while int(s.add("conc/done", 0)) < nworkers and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
        check(int(s.add("conc/done", 0)) == nworkers, "%d concurrent clients finished" % nworkers)
        s.set("conc/go", "1")
        rcs = [p.wait(timeout=60) for p in procs]
        check(rcs == [0] * nworkers, "concurrent clients exit 0 (got %s)" % rcs)
        check(s.get("conc/ctr") == str(nworkers * iters).encode(),
              "shared counter is %d (got %s)" % (nworkers * iters, s.get("conc/ctr")))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--server-log")
    ap.add_argument("--worker", type=int)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    if a.worker is not None:
        sys.exit(worker(a.port, a.worker, a.iters))
    print("torch %s, TCPStore client against c10d-store on port %d" % (dist.__file__, a.port))
    test_two_connections(a.port, a.server_pid, a.server_log)
    test_commands(a.port)
    test_concurrent(a.port)
    if failures:
        print("%d check(s) failed: %s" % (len(failures), "; ".join(failures)))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()

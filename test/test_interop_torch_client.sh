#!/usr/bin/env bash
# Interop: PyTorch 1.13's own clients (Debian python3-torch, /usr/bin/python3)
# against c10d-store. Starts the server on a free port, runs
#   test/interop/torch_client_store.py   the TCPStore client, every command
#   test/interop/torch_client_gloo.py    a 2-rank gloo job rendezvousing on it
# and kills the server at the end, also on failure or ^C.
#
#   test_interop_torch_client.sh C10D_STORE_EXE [store|gloo|all]
# Exit: 0 passed, 1 failed, 77 skipped (no torch).
set -u
STORE=${1:?usage: test_interop_torch_client.sh C10D_STORE_EXE [store|gloo|all]}
WHICH=${2:-all}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

if [ ! -x "$PY" ] || ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
    echo "SKIP: $PY cannot import torch.distributed (apt-get install python3-torch)"
    exit 77
fi

TMP=$(mktemp -d /tmp/c10d_interop.XXXXXX)
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null
        for _ in $(seq 50); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$SERVER_PID" 2>/dev/null
    fi
    [ -n "$SERVER_PID" ] && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

start_server() {
    rm -f "$TMP/port"
    "$STORE" serve --host 127.0.0.1 --port 0 --port-file "$TMP/port" --stats-interval-s 0 \
        >"$TMP/server.out" 2>"$TMP/server.log" &
    SERVER_PID=$!
    for _ in $(seq 100); do
        [ -s "$TMP/port" ] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "FAIL: c10d-store exited at start:"
            cat "$TMP/server.log"
            exit 1
        fi
        sleep 0.1
    done
    [ -s "$TMP/port" ] || { echo "FAIL: c10d-store wrote no port file within 10 s"; exit 1; }
    PORT=$(cat "$TMP/port")
}

stop_server() {
    kill "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID"
    local rc=$?
    SERVER_PID=""
    # SIGTERM is a clean shutdown: anything else (a crash, a sanitizer report) fails the test.
    if [ "$rc" != 0 ]; then
        echo "FAIL: c10d-store exited with status $rc"
        return 1
    fi
}

status=0
run_part() { # name script [args]
    local name=$1 script=$2
    echo "=== $name"
    start_server
    timeout -k 5 240 "$PY" "$HERE/interop/$script" --port "$PORT" --server-pid "$SERVER_PID" \
        --server-log "$TMP/server.log"
    local rc=$?
    stop_server || rc=1
    if [ "$rc" = 77 ]; then
        exit 77
    elif [ "$rc" != 0 ]; then
        echo "FAIL: $name (status $rc); server log:"
        grep -v ' stats {' "$TMP/server.log" | tail -n 30
        status=1
    fi
}

case $WHICH in
store | all) run_part "TCPStore 1.13 client" torch_client_store.py ;;
esac
case $WHICH in
gloo | all) run_part "2-rank gloo job" torch_client_gloo.py ;;
esac
exit $status

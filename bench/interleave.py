"""bench/interleave.py: the Python side of bench/interleave.lua's peers: a
script that bench/interleave.lua's I.peer started serves its commands with
serve(handler, hello). It opens $LUTRA_BENCH_CMD.0 (a FIFO), prints hello
as one JSON line, then for each command line prints handler(line) (a dict)
as one JSON line, flushed; it returns at "quit" or at the FIFO's end (the
driving lutra gone). Before each reply it waits until its threads are idle
(settle): threads that spin after their work (OpenMP's and OpenBLAS's under
their default waiting, about 0.1 s) would otherwise take the cores of the
side that runs next. thread_env() is the thread variables it runs under."""
import json
import os
import sys
import time

THREAD_VARS = ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")


def thread_env():
    """{name: value or None} for the thread variables lutra sets for itself."""
    return {k: os.environ.get(k) for k in THREAD_VARS}


def cpu_seconds():
    """CPU time of all this process's threads so far (from /proc/self/task/*/schedstat)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total * 1e-9


def settle(window=0.005, limit=2.0):
    """Waits (up to limit seconds) until a window passes in which this
    process's threads used under a tenth of a core; returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        c0 = cpu_seconds()
        time.sleep(window)
        if cpu_seconds() - c0 < 0.1 * window:
            break
    return time.perf_counter() - t0


def serve(handler, hello):
    """Runs the command loop; handler(command) returns the reply dict."""
    with open(os.environ["LUTRA_BENCH_CMD"] + ".0") as f:
        print(json.dumps(hello), flush=True)
        for line in f:
            line = line.strip()
            if line == "quit":
                break
            reply = handler(line)
            reply["settle"] = settle()
            print(json.dumps(reply), flush=True)
    sys.stdout.flush()

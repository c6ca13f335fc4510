#!/usr/bin/env python3
"""Samples a process's threads' CPU every half second until it exits.

Prints, per interval, the busiest threads as PERCENT:TID:NAME (percent of
one core). The CUDA engine names its threads (mm-lane<d>.<l>, mm-done<d>.<i>,
mm-poll<d>.<p>; common/thread_name.h), so this tells which of them a run
keeps busy; bench/LOG.md section 18 used it on matmul-pipeline-bench.

    bench/tools/thread_cpu.py PID [TOP]
"""
import os
import sys
import time


def sample(pid):
    """Returns {tid: (user + system ticks, name)} for the process's threads."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        threads[tid] = (int(fields[11]) + int(fields[12]), name)
    return threads


def running(pid):
    """Whether the process exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    pid = int(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) == 3 else 6
    hz = os.sysconf("SC_CLK_TCK")
    interval = 0.5
    start = time.time()
    previous = {}
    while running(pid):
        try:
            current = sample(pid)
        except FileNotFoundError:
            break
        busy = sorted(
            ((100.0 * (ticks - previous[tid][0]) / hz / interval, tid, name)
             for tid, (ticks, name) in current.items() if tid in previous),
            reverse=True)
        if busy:
            print(f"{time.time() - start:5.1f}s " +
                  " ".join(f"{b:.0f}%:{tid}:{name}" for b, tid, name in busy[:top]),
                  flush=True)
        previous = current
        time.sleep(interval)


if __name__ == "__main__":
    main()

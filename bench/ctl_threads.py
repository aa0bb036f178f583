#!/usr/bin/env python3
"""The controller's CPU time, system calls and wake-ups per job, thread by thread, during 1000-job runs.

    python bench/ctl_threads.py [--runs 3] [--jobs 1000] [--prefill] [--array | --each]
    cp bench/ctl_threads.py OTHER/bench/ && python OTHER/bench/ctl_threads.py    # another checkout, same day

bench/cpu_per_job.py gives the controller process as one (and its wake-ups are its main thread's
alone: /proc/PID/status counts the thread group's leader). This splits it by thread, from
/proc/PID/task/TID/{stat,status,io}: user and system CPU, voluntary context switches (wake-ups),
read and write system calls, each per job, for each thread that used any. The threads are named
by role: `tick` (the main thread: collect, schedule, commit, launch), `agent reader` (the thread
that reads the local agent's lines: reads, no writes), `API worker` (one that writes replies: the
batch POST, and the long-poll `GET /jobs/wait` with its reply), the others by number. A throw-away cluster
(bench/cluster.py, one local host of 2 slots), warmed with 20 jobs; each run is one batch POST of
--jobs `true` jobs (--array: one --jobs-element array, as bench/run.py's array line; --each: --jobs
POSTs of one job, as its one-POST line), waited for
with /jobs/wait; `--prefill`: with `controller: prefill: true` (queued successors). Asserts
nothing; measures the tree this file is in.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, wait_done, warm
from cpu_per_job import submit

TICKS = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[int, tuple[float, float, int, int, int]]:
    """tid -> (user s, system s, voluntary switches, read calls, write calls) of each live thread."""
    found = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            io = dict(line.split(": ") for line in Path(f"/proc/{pid}/task/{tid}/io").read_text().splitlines())
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        found[tid] = (int(stat[11]) / TICKS, int(stat[12]) / TICKS, switches, int(io["syscr"]), int(io["syscw"]))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--prefill", action="store_true", help="controller: prefill: true (queued successors)")
    ap.add_argument("--array", action="store_true", help="each run one POST of a --jobs-element array")
    ap.add_argument("--each", action="store_true", help="each run --jobs POSTs of one job (run.py's one POST)")
    args = ap.parse_args()
    c = BenchCluster(slots=2, prefill=True if args.prefill else None)
    try:
        c.start()
        warm(c)
        client, spec = c.client(), c.spec(["true"])
        for run in range(1, args.runs + 1):
            before = threads(c.pid)
            t0 = time.perf_counter()
            wait_done(client, submit(client, spec, args.jobs, args.array, args.each), time.monotonic() + 600)
            wall = time.perf_counter() - t0
            after = threads(c.pid)
            parts = []
            for tid, now in sorted(after.items()):
                was = before.get(tid, (0.0, 0.0, 0, 0, 0))
                user, system = (1000 * (a - b) / args.jobs for a, b in zip(now[:2], was[:2]))  # ms per job
                woke, reads, writes = ((a - b) / args.jobs for a, b in zip(now[2:], was[2:]))  # per job
                if user + system == 0 and woke < 0.05:
                    continue  # idle through the run (a timer, the scheduler's starter)
                name = ("tick" if tid == c.pid else "agent reader" if writes == 0 and reads > 0.1
                        else "API worker" if writes > 0 else f"thread {tid}")  # an API worker writes replies
                parts.append(f"{name}: CPU {user + system:.2f} ms (user {user:.2f}, sys {system:.2f}), "
                             f"wake-ups {woke:.2f}, reads {reads:.2f}, writes {writes:.2f}")
            print(f"run {run}: {args.jobs / wall:.0f} jobs/s; per job: " + "; ".join(parts), flush=True)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

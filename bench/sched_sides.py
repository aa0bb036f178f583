#!/usr/bin/env python3
"""What a scheduling session costs the controller's thread inline and through the worker, by the
pending set's size: the figures behind controller/sched_switch.py's bound (bench/README.md).

    python bench/sched_sides.py [--sizes 1000,2000,5000,10000,20000] [--sessions 30]
    python bench/sched_sides.py --sizes 10000 --sessions 300 --no-add --sides worker   # a backlog worked off

For each size and side: one full session (everything sent: the first, or a side taking over; the
worker is started before it and its start not counted), then --sessions steady ones, each after
its dispatches are taken out and one job added (one host of 2 slots, 1 free: one dispatch each).
Prints the calling thread's CPU (what holds the GIL) and wall, medians for the steady ones.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xce_lite.controller.pending_set import PendingSet
from xce_lite.controller.sched_worker import InlineScheduler, SchedulerProcess
from xce_lite.sched.core import PendingJob, QueuePolicy, Snapshot
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.resreq import parse


def _job(job_id: int) -> PendingJob:
    return PendingJob(id=job_id, user="alice", queue="normal", request=JobRequest(job_id, 1, None, parse("")))


def _base(now: float) -> Snapshot:
    return Snapshot((HostView("h1", "ok", {"slots": 2}, {"slots": 1}),), (), (QueuePolicy("normal", 30),), now=now)


def _timed(side, pending: PendingSet, now: float):
    c0, w0 = time.thread_time(), time.perf_counter()
    side.send(pending, _base(now), 1_000_000)
    decisions = side.receive()
    return decisions, (time.thread_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3


def _proc_cpu_ms(pid: int) -> float:
    """A process's CPU so far (its threads' run time, /proc/PID/schedstat), in ms."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


def run(kind: str, size: int, sessions: int, add: bool = True) -> str:
    pending = PendingSet()
    for job_id in range(1, size + 1):
        pending.add(_job(job_id))
    side = InlineScheduler(shortcut=False) if kind == "inline" else SchedulerProcess(timeout=600, shortcut=False)
    try:
        if isinstance(side, SchedulerProcess):
            side.start()
        decisions, full_cpu, full_wall = _timed(side, pending, 1000.0)
        worker = side._proc.pid if isinstance(side, SchedulerProcess) else None
        worker_before = _proc_cpu_ms(worker) if worker else 0.0
        steady = []
        next_id = size + 1
        for k in range(sessions):
            for d in decisions.dispatches:
                pending.discard(d.job_id)
            if add:  # else the set shrinks by the dispatches, as a backlog being worked off
                pending.add(_job(next_id))
                next_id += 1
            decisions, cpu, wall = _timed(side, pending, 1001.0 + k)
            steady.append((cpu, wall))
        worker_ms = (_proc_cpu_ms(worker) - worker_before) / sessions if worker else None
    finally:
        side.close()
    cpu = statistics.median(c for c, _w in steady)
    wall = statistics.median(w for _c, w in steady)
    return (f"{kind:8} {size:7}: full {full_cpu:7.1f} ms CPU ({full_wall:7.1f} wall); "
            f"steady {cpu:5.2f} ms CPU ({wall:5.2f} wall)"
            + (f"; the worker's CPU per steady session {worker_ms:5.3f} ms" if worker_ms is not None else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,2000,5000,10000,20000")
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--no-add", action="store_true",
                    help="no job added per session: the set shrinks by its dispatches (bench/run.py's backlog run)")
    ap.add_argument("--sides", default="inline,worker")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    for size in (int(s) for s in args.sizes.split(",")):
        for kind in args.sides.split(","):
            print(run(kind, size, args.sessions, not args.no_add), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

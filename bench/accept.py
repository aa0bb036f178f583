#!/usr/bin/env python3
"""The cost of accepting jobs: POST -> reply, and the controller's CPU for it (issue 18).

    python bench/accept.py [--runs 5] [--jobs 1000]
    cp bench/accept.py OTHER/bench/ && python OTHER/bench/accept.py    # another checkout, same hour

A throw-away cluster (bench/cluster.py: one local host of 2 slots, the store durable as configured)
whose two slots hold `sleep` jobs, so that what is accepted pends and nothing runs. Each run sends,
in turn (each kind first once in three runs): one POST of a --jobs-element array, one batch POST of
--jobs plain jobs, and --jobs POSTs of one job each over one keep-alive connection. Per kind: the
wall time from before the POST to the reply (for one-each: the mean per POST), and the controller
process's CPU time (its threads' schedstat) over the same span, per POST for the array and the
batch, per job for one-each. The CPU figure is what the machine's load leaves alone: wall times on
the shared 2-core box move with the other engineers' work, CPU time much less. After each kind the
jobs are killed (so that every run sees the same backlog) and the controller is let settle.
Asserts nothing; prints medians, min and max.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster


def cpu(process: psutil.Process) -> float:
    """Seconds on a CPU of all the process's threads alive now, to the nanosecond (schedstat's first
    field; psutil's user + system count clock ticks of 10 ms, too coarse for one POST)."""
    total = 0
    for task in os.listdir(f"/proc/{process.pid}/task"):
        try:
            with open(f"/proc/{process.pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def settle(process: psutil.Process, quiet: float = 0.3, timeout: float = 30.0) -> None:
    """Until the controller has used no CPU for `quiet` seconds (its tick after the last request)."""
    deadline = time.monotonic() + timeout
    last = cpu(process)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu(process)
        if now - last < 0.002:
            return
        last = now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args(argv)
    n = args.jobs
    c = BenchCluster(slots=2)
    c.start()
    try:
        client = c.client()
        client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * 2})  # both slots busy: the rest pends
        controller = psutil.Process(c.pid)
        spec = c.spec(["true"], name="acc")
        bodies = {"array": [{"jobs": [dict(spec, array=f"1-{n}")]}],
                  "batch": [{"jobs": [spec] * n}],
                  "one-each": [{"jobs": [spec]}] * n}
        for body in (bodies["array"][0], bodies["batch"][0], {"jobs": [spec] * 20}):  # warm up
            client.post("/jobs/kill", {"ids": client.post("/jobs", body)["ids"]})
        settle(controller)
        walls: dict[str, list[float]] = {kind: [] for kind in bodies}
        cpus: dict[str, list[float]] = {kind: [] for kind in bodies}
        kinds = list(bodies)
        for run in range(args.runs):
            order = kinds[run % 3:] + kinds[:run % 3]
            for kind in order:
                per = n if kind == "one-each" else 1
                ids: list[int] = []
                before, start = cpu(controller), time.perf_counter()
                for body in bodies[kind]:
                    ids += client.post("/jobs", body)["ids"]
                wall, used = time.perf_counter() - start, cpu(controller) - before
                walls[kind].append(1000 * wall / per)
                cpus[kind].append(1000 * used / per)
                print(f"run {run + 1} {kind}: POST -> reply {1000 * wall / per:.2f} ms, controller CPU "
                      f"{1000 * used / per:.2f} ms per {'job' if per > 1 else 'POST'}", flush=True)
                settle(controller)
                client.post("/jobs/kill", {"ids": ids})
                settle(controller)
        load = os.getloadavg()
        print(f"\n{args.runs} runs, {n} jobs each, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
              f"median (min-max), ms")
        for kind in kinds:
            unit = "per job" if kind == "one-each" else "per POST"
            w, u = walls[kind], cpus[kind]
            print(f"  {kind:9s} POST -> reply {statistics.median(w):7.2f} ({min(w):.2f}-{max(w):.2f})   "
                  f"controller CPU {statistics.median(u):7.2f} ({min(u):.2f}-{max(u):.2f}) {unit}")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

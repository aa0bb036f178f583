#!/usr/bin/env python3
"""What the supervisors' look at SPOOL/lease costs (exec/agent/watch.py look_at_lease): the CPU of
the supervisors of sleeping jobs over a window, on a throw-away cluster (bench/cluster.py, one
local host of 2 slots, the default lease of 3 minutes: so no grant changes the file in the window
beyond one renewal or so).

    python bench/lease_reread.py [--runs 3] [--jobs 2] [--window 20]
    cp bench/lease_reread.py OTHER/bench/ && python OTHER/bench/lease_reread.py    # another checkout

Each run: --jobs `sleep` jobs start; once they run, the supervisors' own CPU (user + system, the
jobs' excluded: they are still running) is read, then again after --window seconds; printed per
supervisor per hour, with the load (`uptime`). With the look every second, a supervisor wakes
3,600 times an hour (a stat each, and a read when the file changed); before, only when the lease it
had read ran out. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, warm


def cpu(p: psutil.Process) -> float:
    """The process's CPU seconds so far, to the nanosecond (/proc/PID/schedstat: a clock tick,
    psutil's unit, is longer than many looks)."""
    return int(Path(f"/proc/{p.pid}/schedstat").read_text().split()[0]) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args(argv)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    c = BenchCluster(slots=args.jobs)
    c.start()
    figures = []
    try:
        warm(c)
        client = c.client()
        for run in range(args.runs):
            ids = client.post("/jobs", {"jobs": [c.spec(["sleep", str(args.window + 30)])] * args.jobs})["ids"]
            deadline = time.monotonic() + 60
            sleepers: list[psutil.Process] = []
            while len(sleepers) < args.jobs and time.monotonic() < deadline:
                sleepers = [p for p in psutil.Process(c.pid).children(recursive=True)
                            if p.name() == "sleep" and p.cmdline()[1:] == [str(args.window + 30)]]
                time.sleep(0.1)
            supervisors = [psutil.Process(p.ppid()) for p in sleepers]
            time.sleep(1.0)  # past the supervisors' start
            before = [cpu(p) for p in supervisors]
            time.sleep(args.window)
            after = [cpu(p) for p in supervisors]
            per_hour = [(a - b) * 3600 / args.window for a, b in zip(after, before)]
            figures.append(statistics.median(per_hour))
            print(f"run {run + 1}: supervisor CPU per hour of a sleeping job: "
                  + ", ".join(f"{x:.3f} s" for x in per_hour), flush=True)
            c.xce("kill", *map(str, ids))
            time.sleep(2)
    finally:
        c.stop()
    print(f"median over runs: {statistics.median(figures):.3f} s CPU per supervisor-hour "
          f"({100 * statistics.median(figures) / 3600:.3f} % of a core); load: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

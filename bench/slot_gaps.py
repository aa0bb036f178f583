#!/usr/bin/env python3
"""Where a 2-slot run leaves its slots empty: the gaps between one job's end and the next start on
a slot, and how many of the long ones coincide with a tick of the controller (session 19).

    python bench/slot_gaps.py [--runs 2] [--jobs 1000] [--kind array|batch|each] [--long 0.002]

A throw-away cluster (bench/cluster.py, one local host of 2 slots) runs --jobs `true` jobs per run.
From the store's own stamps (each job's start and end, as its supervisor took them), the jobs are
laid on two slots in start order (each on the slot that freed first), and each start's wait since
its slot freed is a gap. For the gaps longer than --long seconds it counts those with a dispatch
(a tick of the controller that dispatched jobs: the `dispatched` events' times) from 3 ms before
the gap to its end, beside the same count for as many windows of the same mean length put at random
in the run: a share well above the random one says the ticks' CPU bursts take the slots' CPU.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import bisect
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, wait_done, warm
from cpu_per_job import submit

SLOTS = 2
BEFORE = 0.003  # a tick this long before a gap began may have delayed its start


def runs_of(store: Path, since: float) -> tuple[list[tuple[float, float]], list[float]]:
    """((start, end) of each job submitted since `since`, by start; the distinct dispatch times)."""
    import apsw

    con = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        jobs = con.execute("SELECT start_time, end_time FROM jobs WHERE submit_time >= ? AND end_time IS NOT NULL "
                           "ORDER BY start_time", (since,)).fetchall()
        ticks = con.execute("SELECT DISTINCT e.time FROM events e JOIN jobs j ON j.id = e.job_id "
                            "WHERE j.submit_time >= ? AND e.kind = 'dispatched' ORDER BY e.time", (since,)).fetchall()
    finally:
        con.close()
    return [(s, e) for s, e in jobs], [t for (t,) in ticks]


def gaps_of(jobs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(slot freed, next start) for each job, laid on SLOTS slots in start order."""
    free = [jobs[0][0]] * SLOTS
    out = []
    for start, end in jobs:
        slot = min(range(SLOTS), key=lambda k: free[k])
        out.append((free[slot], max(start, free[slot])))
        free[slot] = max(free[slot], end)
    return out


def with_tick(windows: list[tuple[float, float]], ticks: list[float]) -> int:
    found = 0
    for begin, end in windows:
        k = bisect.bisect_left(ticks, begin - BEFORE)
        found += k < len(ticks) and ticks[k] <= end
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kind", choices=("array", "batch", "each"), default="array")
    parser.add_argument("--long", type=float, default=0.002, help="seconds: a longer gap is a long one")
    args = parser.parse_args()
    c = BenchCluster(slots=SLOTS)
    c.start()
    try:
        warm(c)
        client = c.client()
        spec = c.spec(["true"])
        for run in range(1, args.runs + 1):
            time.sleep(0.5)
            t0 = time.time()
            if args.kind == "each":
                ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(args.jobs)]
            else:
                ids = submit(client, spec, args.jobs, args.kind == "array")
            wait_done(client, ids, time.monotonic() + 300)
            jobs, ticks = runs_of(c.home / "xce.db", t0 - 0.001)
            windows = gaps_of(jobs)
            gaps = [end - begin for begin, end in windows]
            span = jobs[-1][1] - jobs[0][0]
            long = [(b, e) for b, e in windows if e - b > args.long]
            mean = statistics.mean(e - b for b, e in long) if long else 0.0
            rand = [(x, x + mean) for x in (random.uniform(jobs[0][0], jobs[-1][1]) for _ in range(2000))]
            print(f"run {run}: {len(jobs)} jobs in {1000 * span:.0f} ms, {len(ticks)} ticks that dispatched")
            print(f"  slot gaps {1000 * sum(gaps):.0f} ms of {SLOTS} x {1000 * span:.0f}, median "
                  f"{1000 * statistics.median(gaps):.2f} ms")
            print(f"  {len(long)} longer than {1000 * args.long:g} ms, {1000 * sum(e - b for b, e in long):.0f} ms in "
                  f"all; {100 * with_tick(long, ticks) / max(1, len(long)):.0f}% with a tick (random windows alike: "
                  f"{100 * with_tick(rand, ticks) / len(rand):.0f}%)", flush=True)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

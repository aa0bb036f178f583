#!/usr/bin/env python3
"""What a one-POST run would gain if its request path ran in a process of its own (issue 18, session 25).

    python bench/split_ceiling.py [--rounds 6] [--jobs 1000]

A what-if, measured by splitting the work of a one-POST run over two clusters (bench/cluster.py, one
local host of 2 slots each, on this machine together): REQUESTS, whose two slots hold `sleep` jobs, so
that what is submitted to it pends and its tick runs no job (what it does per POST is the request path
alone); and JOBS, which runs a --jobs-element array of `true` (the job side, its tick in its own
process) started the moment the POSTs begin. A third cluster, REAL, runs the figure as bench/run.py does
(--jobs POSTs of one job each, waited for: bench/ab_trees.py's `one_run`). Each round runs REAL, then
the split pair, and prints both rates: REAL's, and the split's jobs over the time until both the POSTs
and the array are done, with the POSTs' own rate beside. If the split ran much faster, the tick sharing
the request path's process (its GIL, the store's lock) would be what holds a one-POST run back; if not,
the machine's CPU is. REQUESTS keeps what it was sent pending: --jobs more each round. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_trees import one_run
from cluster import BenchCluster, wait_done, wait_idle, warm


def split_run(requests: BenchCluster, jobs_side: BenchCluster, jobs: int) -> tuple[float, float]:
    """(seconds until the POSTs and the array are both done, seconds of the POSTs alone)."""
    spec, array = requests.spec(["true"]), dict(jobs_side.spec(["true"]), name="split", array=f"1-{jobs}")
    client = requests.client()
    ended: dict[str, float] = {}

    def run_array() -> None:
        side = jobs_side.client()
        wait_done(side, side.post("/jobs", {"jobs": [array]})["ids"], time.monotonic() + 300)
        ended["array"] = time.perf_counter()

    t0 = time.perf_counter()
    thread = threading.Thread(target=run_array)
    thread.start()
    for _ in range(jobs):
        client.post("/jobs", {"jobs": [spec]})
    ended["posts"] = time.perf_counter()
    thread.join()
    return max(ended.values()) - t0, ended["posts"] - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    requests, jobs_side, real = BenchCluster(slots=2), BenchCluster(slots=2), BenchCluster(slots=2)
    clusters = (requests, jobs_side, real)
    try:
        for c in clusters:
            c.start()
        requests.client().post("/jobs", {"jobs": [requests.spec(["sleep", "3600"])] * 2})
        warm(jobs_side)
        warm(real)
        reals, splits, posts = [], [], []
        for r in range(args.rounds):
            reals.append(args.jobs / one_run(real, "each", args.jobs)[0])  # seconds, as the split's
            wait_idle(real)
            both, alone = split_run(requests, jobs_side, args.jobs)
            splits.append(both)
            posts.append(alone)
            wait_idle(jobs_side)
            print(f"round {r + 1}: real one-POST {args.jobs / reals[-1]:.0f} jobs/s; split: POSTs "
                  f"{args.jobs / posts[-1]:.0f}/s, both done {args.jobs / splits[-1]:.0f} jobs/s", flush=True)
        real_rate, split_rate, post_rate = (args.jobs / statistics.median(x) for x in (reals, splits, posts))
        print(f"medians: real one-POST {real_rate:.0f} jobs/s, split {split_rate:.0f} jobs/s "
              f"(its POSTs {post_rate:.0f}/s)")
    finally:
        for c in clusters:
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

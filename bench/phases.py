#!/usr/bin/env python3
"""Where a 1000-job run's wall goes, from the store's own stamps: the head (the POST to the first
dispatch, the first start and the 101st end), the steady part (the other ends, as ms per 100 jobs
and as jobs/s), and the tail (the last end to the wait's reply).

    python bench/phases.py [--kind array|batch|each] [--runs 3] [--jobs 1000] [--depth N]

bench/run.py's throughput is 1000 / (POST to the wait's reply); HyperQueue's is timed to its last
task's own end (bench/hq_floor.py). This splits ours, so that a change is seen where it acts: a
slow first tick, a refill that comes late, a reply that is slow to build. A throw-away cluster
(bench/cluster.py: one local host of 2 slots), warmed; the runs one after another, the controller
idle before each. Stamps: dispatched, the controller's clock as the tick began (events.time);
start_time and end_time, the host's (the same clock here). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, wait_done, wait_idle, warm
from cpu_per_job import submit

HEAD = 100  # ends that make the head


def stamps(store: Path, since: float) -> tuple[list[float], list[float], list[float]]:
    """(dispatch times, start times, end times) of the jobs submitted since `since`, each sorted."""
    import apsw

    con = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = con.execute("SELECT j.start_time, j.end_time, e.time FROM jobs j JOIN events e ON e.job_id = j.id "
                           "AND e.kind = 'dispatched' WHERE j.submit_time >= ? AND j.end_time IS NOT NULL",
                           (since,)).fetchall()
    finally:
        con.close()
    return sorted(r[2] for r in rows), sorted(r[0] for r in rows), sorted(r[1] for r in rows)


def one_run(c: BenchCluster, kind: str, n: int) -> dict[str, float]:
    client = c.client()
    spec = c.spec(["true"])
    t0 = time.time()
    if kind == "each":
        ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(n)]
    else:  # one batch POST, or one n-element array (as bench/run.py's lines)
        ids = submit(client, spec, n, kind == "array")
    wait_done(client, ids, time.monotonic() + 300)
    t_reply = time.time()
    dispatched, started, ended = stamps(c.home / "xce.db", t0 - 0.001)
    head = min(HEAD, len(ended) - 1)
    steady = (ended[-1] - ended[head]) / (len(ended) - 1 - head)
    return {"wall ms": 1000 * (t_reply - t0), "jobs/s": n / (t_reply - t0),
            "POST -> first dispatch ms": 1000 * (dispatched[0] - t0),
            "POST -> first start ms": 1000 * (started[0] - t0),
            f"POST -> end {head + 1} ms": 1000 * (ended[head] - t0),
            "the rest, ms per 100": 100_000 * steady, "the rest, jobs/s": 1 / steady,
            "last end -> reply ms": 1000 * (t_reply - ended[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("array", "batch", "each"), default="array")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--depth", type=int, help="controller.prefill_depth (default: the tree's)")
    args = ap.parse_args()
    c = BenchCluster(slots=2)
    if args.depth is not None:
        config = c.home / "xce.yaml"
        config.write_text(config.read_text().replace("controller:\n", f"controller:\n  prefill_depth: {args.depth}\n"))
    c.start()
    got: dict[str, list[float]] = {}
    try:
        warm(c)
        for run in range(1, args.runs + 1):
            wait_idle(c)
            out = one_run(c, args.kind, args.jobs)
            for key, value in out.items():
                got.setdefault(key, []).append(value)
            print(f"run {run} (load {os.getloadavg()[0]:.1f}): "
                  + "; ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    finally:
        c.stop()
    print(f"median of {args.runs} ({args.kind}, {args.jobs} jobs): "
          + "; ".join(f"{k} {statistics.median(v):.1f}" for k, v in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

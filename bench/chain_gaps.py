#!/usr/bin/env python3
"""How often a queued successor (prefill) starts late behind its predecessor: the host's chain ran
dry before the controller's refill landed (session 20).

    python bench/chain_gaps.py [--runs 2] [--jobs 1000] [--kind array|batch|each] [--depth N] [--long 0.002]

A throw-away cluster (bench/cluster.py, one local host of 2 slots; --depth writes xce.yaml's
controller.prefill_depth), warmed. Per run, from the store's own stamps: for each job dispatched as a
queued successor ("queued on HOST behind job N"), the gap from its predecessor's end to its own start
(both the supervisors' clocks). A gap longer than --long is a late start; for those, how long before
the predecessor's end the successor was dispatched (a lead shorter than a tick's commit and send, a
few ms, says the refill was still on its way when the chain ran dry). Also the controller's ticks
per job (its metrics) and its CPU per job. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, wait_done, warm
from cpu_per_job import submit

BEHIND = re.compile(r"behind job (\d+)")


def late_starts(store: Path, since: float, long: float) -> tuple[int, list[float], list[float]]:
    """(queued successors, the late ones' gaps, their leads) among the jobs submitted since `since`."""
    import apsw

    con = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        stamps = {i: (s, e) for i, s, e in con.execute(
            "SELECT id, start_time, end_time FROM jobs WHERE submit_time >= ?", (since,))}
        dispatched = con.execute("SELECT e.job_id, e.time, e.data FROM events e JOIN jobs j ON j.id = e.job_id "
                                 "WHERE j.submit_time >= ? AND e.kind = 'dispatched'", (since,)).fetchall()
    finally:
        con.close()
    queued, gaps, leads = 0, [], []
    for job_id, when, data in dispatched:
        match = BEHIND.search(json.loads(data).get("queued") or "")
        pred = int(match.group(1)) if match else None
        if pred is None or stamps.get(pred, (None, None))[1] is None or stamps[job_id][0] is None:
            continue
        queued += 1
        gap = stamps[job_id][0] - stamps[pred][1]
        if gap > long:
            gaps.append(gap)
            leads.append(stamps[pred][1] - when)
    return queued, gaps, leads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kind", choices=("array", "batch", "each"), default="array", help="each: one POST a job")
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--long", type=float, default=0.002, help="seconds: a longer gap is a late start")
    args = parser.parse_args()
    c = BenchCluster(slots=2)
    if args.depth is not None:
        config = c.home / "xce.yaml"
        config.write_text(config.read_text().replace("controller:\n", f"controller:\n  prefill_depth: {args.depth}\n"))
    try:
        c.start()
        warm(c)
        client = c.client()
        controller = psutil.Process(c.pid)
        for run in range(1, args.runs + 1):
            time.sleep(0.5)
            ticks0 = client.get("/metrics")["registry"]["histograms"].get("tick", {}).get("count", 0)
            cpu0 = sum(controller.cpu_times()[:2])
            since, t0 = time.time() - 0.001, time.perf_counter()
            spec = c.spec(["true"])
            if args.kind == "each":
                ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(args.jobs)]
            else:
                ids = submit(client, spec, args.jobs, args.kind == "array")
            wait_done(client, ids, time.monotonic() + 300)
            wall = time.perf_counter() - t0
            ticks = client.get("/metrics")["registry"]["histograms"].get("tick", {}).get("count", 0) - ticks0
            cpu = sum(controller.cpu_times()[:2]) - cpu0
            queued, gaps, leads = late_starts(c.home / "xce.db", since, args.long)
            print(f"run {run}: {args.jobs / wall:.0f} jobs/s; ticks per job {ticks / args.jobs:.3f}, controller CPU "
                  f"per job {1000 * cpu / args.jobs:.2f} ms; {queued} started as queued successors, {len(gaps)} of "
                  f"them more than {1000 * args.long:g} ms after their predecessor's end (median "
                  f"{1000 * statistics.median(gaps) if gaps else 0:.2f} ms, {1000 * sum(gaps):.0f} ms in all)")
            if leads:
                leads.sort()
                deciles = [round(1000 * leads[k * len(leads) // 10], 1) for k in range(10)]
                print(f"  the late ones dispatched this long before their predecessor ended (ms, deciles): {deciles}",
                      flush=True)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

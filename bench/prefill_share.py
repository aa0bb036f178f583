#!/usr/bin/env python3
"""How many jobs of a 1000-job run start as queued successors (issue 18, prefill), and what the
controller's tick does per job: sessions (the scheduler worker's wake-ups) and commits (the
store's WAL frames written are not read here: the controller's write system calls stand for its
lines to the agent). Counts, which the machine's load does not move; the wall figure is noise.

    python bench/prefill_share.py [--runs 3] [--jobs 1000] [--prefill true|false] [--depth N]

A throw-away cluster (bench/cluster.py: one local host of 2 slots), warmed with 20 jobs; each run
is one batch POST of --jobs `true` jobs until all are DONE. A job started as a successor is one
whose last `dispatched` event says `queued` (store/transitions.py); a withdrawn one (requeued
from a host's queue to free room, controller/prefilling.py) is counted apart; "behind a queued
one" counts those whose predecessor was itself queued when they were (a chain, `--depth N`
written as xce.yaml's controller.prefill_depth; default: the tree's default). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, wait_done, warm

from xce_lite.store.jobs import JobStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--prefill", choices=("true", "false"), default="true")
    parser.add_argument("--depth", type=int, default=None)
    args = parser.parse_args(argv)
    c = BenchCluster(slots=2, prefill=args.prefill == "true")
    if args.depth is not None:
        config = c.home / "xce.yaml"
        config.write_text(config.read_text().replace("controller:\n", f"controller:\n  prefill_depth: {args.depth}\n"))
    c.start()
    try:
        warm(c)
        client = c.client()
        controller = psutil.Process(c.pid)
        for run in range(args.runs):
            cpu = controller.cpu_times()
            writes = controller.io_counters()[1]
            start = time.perf_counter()
            ids = client.post("/jobs", {"jobs": [c.spec(["true"])] * args.jobs})["ids"]
            wait_done(client, ids, time.monotonic() + 600)
            wall = time.perf_counter() - start
            used = controller.cpu_times()
            ms = 1000 * (used.user + used.system - cpu.user - cpu.system) / args.jobs
            store = JobStore(c.home / "xce.db", readonly=True)  # Home.store
            try:
                queued = withdrawn = chained = 0
                behind: dict[int, tuple[float, int]] = {}
                for job_id in ids:  # its last dispatch queued it (a withdrawn one was dispatched again)
                    history = store.events(job_id)
                    dispatches = [(t, data) for t, kind, data in history if kind == "dispatched"]
                    when, last = dispatches[-1] if dispatches and dispatches[-1][1] else (0.0, {})
                    queued += "queued" in last
                    if "queued" in last:  # (when it was named, behind whom)
                        behind[job_id] = (when, int(str(last["queued"]).rsplit(" ", 1)[-1]))
                    withdrawn += any(kind == "requeued" and "withdrawn" in str(data) for _t, kind, data in history)
                started = {job.id: job.start_time for job in store.jobs([p for _w, p in behind.values()])}
                for when, pred in behind.values():  # its predecessor, queued itself, had not started then
                    chained += pred in behind and (started.get(pred) or 0.0) > when
            finally:
                store.close()
            print(f"run {run + 1}: {args.jobs / wall:.0f} jobs/s; started as queued successors {queued} of "
                  f"{args.jobs} ({chained} behind a queued one), withdrawn {withdrawn}; "
                  f"controller CPU per job {ms:.2f} ms, its writes per job "
                  f"{(controller.io_counters()[1] - writes) / args.jobs:.2f}", flush=True)
            time.sleep(1)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

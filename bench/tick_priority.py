#!/usr/bin/env python3
"""What the controller's main thread (its ticks) at a lower CPU priority does to throughput: a lead
of session 19, measured from outside, nothing in the product changed.

    python bench/tick_priority.py [--how nice19|nice5|batch|idle] [--rounds 6] [--jobs 1000]

A throw-away cluster (bench/cluster.py, one local host of 2 slots). Each round runs a --jobs array
and --jobs one-POST jobs with the main thread as it is, and again with it lowered (setpriority on
its thread id, or sched_setscheduler: SCHED_BATCH, SCHED_IDLE), in an order that alternates round
by round; prints each side's rates and medians. Why: bench/slot_gaps.py finds most long gaps of a
slot at a tick, whose CPU burst takes the slots' CPU, while the cores are ~20% idle between ticks.
Raising a thread's priority back needs root (run as root). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import BenchCluster, wait_done, warm

KINDS = ("array", "each")


def lower(tid: int, how: str, on: bool) -> None:
    """Lower the thread `tid` as `how` says (on), or put it back to SCHED_OTHER at nice 0."""
    if how.startswith("nice"):
        os.setpriority(os.PRIO_PROCESS, tid, int(how[4:]) if on else 0)
    else:
        policy = {"batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}[how] if on else os.SCHED_OTHER
        os.sched_setscheduler(tid, policy, os.sched_param(0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--how", choices=("nice19", "nice5", "batch", "idle"), default="nice19")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    c = BenchCluster(slots=2)
    c.start()
    rates: dict[bool, dict[str, list[float]]] = {on: {kind: [] for kind in KINDS} for on in (False, True)}
    try:
        warm(c)
        client = c.client()
        spec = c.spec(["true"])
        for r in range(args.rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                lower(c.pid, args.how, on)  # the main thread's id is the process's
                for kind in KINDS:
                    time.sleep(0.4)
                    t0 = time.perf_counter()
                    if kind == "array":
                        ids = [client.post("/jobs", {"jobs": [dict(spec, array=f"1-{args.jobs}")]})["ids"][0]]
                    else:
                        ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(args.jobs)]
                    wait_done(client, ids, time.monotonic() + 300)
                    rates[on][kind].append(args.jobs / (time.perf_counter() - t0))
        lower(c.pid, args.how, False)
    finally:
        c.stop()
    for kind in KINDS:
        as_is, lowered = rates[False][kind], rates[True][kind]
        wins = sum(b > a for a, b in zip(as_is, lowered))
        print(f"{kind}: as it is {[round(x) for x in as_is]} median {statistics.median(as_is):.0f} jobs/s; "
              f"{args.how} {[round(x) for x in lowered]} median {statistics.median(lowered):.0f}; "
              f"lowered faster in {wins} of {len(as_is)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())

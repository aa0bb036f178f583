#!/usr/bin/env python3
"""What sched/prefill.outranked (a queued successor gives way to a job of higher rank) costs on a
10,000-job backlog, beside successors() on the same snapshot: process CPU per call (median of
--runs) and the deterministic counts, pending jobs looked at and placements tried, which the load
does not move. Asserts nothing.

    python bench/prefill_outranked.py [--runs 5] [--jobs 10000] [--units 200] [--successors-only]
    python bench/prefill_outranked.py --units 2     # as a 2-slot host's tick sees it (bench/ticktime.py)

--successors-only measures successors() alone, so that this file run from an older tree (copied
there) compares its successors() with this one's.

The snapshot: --units full hosts of 1 slot, each with a running unit and a successor queued behind
it; --jobs pending jobs of the successors' queue and priority (none outranks them: the common case,
every job looked at stops at the first), and the worst case: every pending job ranks first (a
higher -sp) and none fits (2 slots), so EXAMINED jobs are each tried against every unit.

Each is measured twice where the tree has sched/prefill_rank.py (branch prefill3): on the whole
snapshot (the plain path: a sort of every pending job per call) and as controller/prefilling.py
calls them, on the pending jobs kept in order (`Ranked`), a tick's changes synced in each call
(one job gone, one added: what a 2-slot tick sees).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tree this file is in, not an installed one

from xce_lite.sched import prefill
from xce_lite.sched.core import PendingJob, QueuePolicy, Snapshot, schedule
from xce_lite.sched.placement import HostView, JobRequest
from xce_lite.sched.reasons import FrozenMap
from xce_lite.sched.resreq import parse

try:
    from xce_lite.sched.prefill_rank import Ranked
except ImportError:  # a tree before branch prefill3: the plain path only
    Ranked = None


def build(jobs: int, units: int, slots: int, priority: int) -> tuple:
    hosts = tuple(HostView(f"h{i}", "ok", {"slots": 1, "mem": 4 << 30}, {"slots": 0, "mem": 0}) for i in range(units))
    running = tuple(prefill.RunningUnit(i + 1, f"h{i}", "normal", "alice", FrozenMap({"slots": 1, "mem": 4 << 30}),
                                        taken=True) for i in range(units))
    queued = tuple(prefill.QueuedSuccessor(PendingJob(units + i + 1, "alice", "normal",
                                                      JobRequest(units + i + 1, 1, None, parse(""))), f"h{i}", i + 1)
                   for i in range(units))
    base = 10 * units
    pending = tuple(PendingJob(base + i, "bob", "normal", JobRequest(base + i, slots, None, parse("")),
                               priority=priority) for i in range(jobs))
    snapshot = Snapshot(hosts, pending, (QueuePolicy("normal", 30),))
    return snapshot, schedule(snapshot), queued, running


class Counting:
    """Counts prefill.place calls (placements tried) while it is installed."""

    def __init__(self) -> None:
        self.calls, self.real = 0, prefill.place

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.real(*args, **kw)


def cpu(fn, args: tuple, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.process_time()
        fn(*args)
        times.append(time.process_time() - start)
    return statistics.median(times) * 1000


class Ticking:
    """A Ranked over the snapshot's jobs, synced at each call after one job left and one came."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.jobs = {j.id: j for j in snapshot.jobs}
        self.priority = {q.name: q.priority for q in snapshot.queues}
        self.ranked, self.next_id = Ranked(), max(self.jobs) + 1
        self.ranked.sync(self.jobs, {}, self.priority)
        self.bare = replace(snapshot, jobs=())

    def __call__(self, fn, *args):
        gone = next(iter(self.jobs))
        old = self.jobs.pop(gone)
        self.jobs[self.next_id] = replace(old, id=self.next_id, request=replace(old.request, id=self.next_id))
        self.ranked.sync(self.jobs, {gone: old, self.next_id: None}, self.priority)
        self.next_id += 1
        return fn(self.bare, *args, ranked=self.ranked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--successors-only", action="store_true")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}; EXAMINED = {prefill.EXAMINED}")
    for case, slots, priority in (("none outranks", 1, 0), ("all outrank, none fits", 2, 50)):
        snapshot, decisions, queued, running = build(args.jobs, args.units, slots, priority)
        free = tuple(replace(u, taken=False) for u in running)
        counting = Counting()
        prefill.place = counting
        try:
            found = () if args.successors_only else prefill.outranked(snapshot, decisions, queued, running)
            tried_out, counting.calls = counting.calls, 0
            prefill.successors(snapshot, decisions, free)
            tried_succ = counting.calls
        finally:
            prefill.place = counting.real
        succ_ms = cpu(prefill.successors, (snapshot, decisions, free), args.runs)
        if not args.successors_only:
            out_ms = cpu(prefill.outranked, (snapshot, decisions, queued, running), args.runs)
            print(f"{case}: {args.jobs} pending, {args.units} queued successors: outranked named {len(found)}, "
                  f"{tried_out} placements tried, CPU {out_ms:.1f} ms/call")
        print(f"{case}: successors() with the same units free: {tried_succ} placements tried, "
              f"CPU {succ_ms:.1f} ms/call")
        if Ranked is None:
            continue
        tick = Ticking(snapshot)
        kept_succ = cpu(tick, (prefill.successors, decisions, free), args.runs)
        line = f"{case}: on the kept order (Ranked, a tick's changes synced): successors() {kept_succ:.2f} ms/call"
        if not args.successors_only:
            line += f", outranked() {cpu(tick, (prefill.outranked, decisions, queued, running), args.runs):.2f} ms/call"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

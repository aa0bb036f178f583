#!/usr/bin/env python3
"""CPU time per job of a whole throw-away cluster's process tree (controller, scheduler workers,
agent, zygote, supervisors, jobs: every process it started, reaped or not), measured as this
process's children's rusage with this process a child subreaper: whatever the cluster forks and
abandons is reparented here and reaped here, so nothing escapes the count. Other engineers' load
does not enter it (only CPU contention's side effects do), unlike /proc/stat's machine figure.

    python bench/tree_cpu.py [--jobs 1000] [--runs 3] [--tree CHECKOUT] [--prefill true|false]
    python bench/tree_cpu.py --tree /work/wt/NAME-old --runs 1   # alternate with this tree's runs

Each run: a fresh cluster (bench/cluster.py of --tree: one local host of 2 slots), warmed, then
--jobs `true` jobs in one batch POST, waited for, the cluster stopped, its processes reaped; and
the same with 0 jobs; the difference over --jobs is the per-job figure (user, system). The
kernel's threads (kthreads.py) over the N-job run are printed beside it (the whole machine's).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import sys
import time
from pathlib import Path


def children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def reap_all(deadline: float) -> None:
    """Reap every child (the cluster's orphans come here) until none is left or `deadline`."""
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def one(jobs: int, prefill: bool | None) -> tuple[float, float, float]:
    """(user, system, kernel threads) seconds of one cluster's whole life running `jobs` jobs."""
    from cluster import BenchCluster, wait_done, warm
    from kthreads import KernelShare

    before, kernel = children_cpu(), KernelShare()
    c = BenchCluster(slots=2, prefill=prefill)
    c.start()
    try:
        warm(c)
        if jobs:
            client = c.client()
            ids = client.post("/jobs", {"jobs": [c.spec(["true"])] * jobs})["ids"]
            wait_done(client, ids, time.monotonic() + 600)
    finally:
        c.stop()
    reap_all(time.monotonic() + 30)
    after = children_cpu()
    return after[0] - before[0], after[1] - before[1], kernel.seconds()["kernel"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to measure")
    parser.add_argument("--prefill", choices=("true", "false"), help="the controller's prefill (default: its default)")
    args = parser.parse_args(argv)
    prefill = None if args.prefill is None else args.prefill == "true"
    sys.path.insert(0, str(Path(args.tree) / "bench"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # kthreads.py, which an older tree lacks
    PR_SET_CHILD_SUBREAPER = 36
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("cannot become a child subreaper")
    print(f"tree {args.tree}; {args.jobs} `true` jobs per run; prefill {args.prefill or 'default'}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for n in range(args.runs):
        user0, sys0, _k0 = one(0, prefill)
        user, system, kernel = one(args.jobs, prefill)
        per = [1000 * (user - user0) / args.jobs, 1000 * (system - sys0) / args.jobs, 1000 * kernel / args.jobs]
        rows.append((per[0] + per[1], *per))
        print(f"run {n + 1}: cluster tree {per[0] + per[1]:.2f} ms per job (user {per[0]:.2f}, system {per[1]:.2f}); "
              f"kernel threads {per[2]:.2f} ms (whole machine); a cluster's life without jobs "
              f"{user0 + sys0:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    if args.runs > 1:
        med = [statistics.median(c) for c in zip(*rows)]
        print(f"median: cluster tree {med[0]:.2f} ms (user {med[1]:.2f}, system {med[2]:.2f}); kernel {med[3]:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

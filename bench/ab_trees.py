#!/usr/bin/env python3
"""Two checkouts side by side: a live cluster of each, runs alternated round by round (session 20).

    python bench/ab_trees.py OTHER_TREE [--env K=V,K=V] [--rounds 8] [--kinds array,each,batch] [--jobs 1000]

On this shared VM the speed drifts within minutes (the same code's CPU per job moved 1.94 -> 2.73 ms
in session 19), so two run.py invocations one after the other compare two moments as much as two
trees. Here both controllers are up at once (bench/cluster.py, one local host of 2 slots each,
warmed; A is the tree this file is in, B is OTHER_TREE, with --env added to B's environment), and
each round runs every kind on A and B back to back, the order flipped each round. Prints each
round's pairs, then per kind: both medians, how many rounds B won, and the machine CPU per job
(/proc/stat, whatever else runs on the box). Kinds: `array` (one 1,000-element array POST), `batch`
(one POST of 1,000 jobs), `each` (1,000 POSTs of one job). Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, wait_done, warm
from cpu_per_job import submit
from stats import machine_busy_seconds


def one_run(c: BenchCluster, kind: str, jobs: int) -> tuple[float, float]:
    """(jobs/s, machine CPU ms per job) of one run of `kind` on `c`."""
    client, spec = c.client(), c.spec(["true"])
    time.sleep(0.3)
    busy0, t0 = machine_busy_seconds(), time.perf_counter()
    if kind == "each":
        ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(jobs)]
    else:
        ids = submit(client, spec, jobs, kind == "array")
    wait_done(client, ids, time.monotonic() + 300)
    wall = time.perf_counter() - t0
    return jobs / wall, 1000 * (machine_busy_seconds() - busy0) / jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path)
    parser.add_argument("--env", default="", help="K=V,K=V added to B's environment")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--kinds", default="array,each,batch")
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    extra = dict(pair.split("=", 1) for pair in args.env.split(",") if pair)
    clusters = {}
    for name, tree, env in (("A", HERE.parent, {}), ("B", args.other.resolve(), extra)):
        c = BenchCluster(slots=2)
        c.env = dict(c.env, PYTHONPATH=str(tree), **env)  # its controller (and so its agent) from that tree
        clusters[name] = c
    rates: dict[tuple[str, str], list[float]] = {(n, k): [] for n in clusters for k in kinds}
    cpus: dict[tuple[str, str], list[float]] = {(n, k): [] for n in clusters for k in kinds}
    try:
        for c in clusters.values():
            c.start()
            warm(c)
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for kind in kinds:
                for name in order:
                    rate, cpu = one_run(clusters[name], kind, args.jobs)
                    rates[(name, kind)].append(rate)
                    cpus[(name, kind)].append(cpu)
            print(f"round {r + 1}: " + "  ".join(f"{k} A {rates[('A', k)][-1]:.0f} B {rates[('B', k)][-1]:.0f}"
                                                 for k in kinds), flush=True)
        for kind in kinds:
            a, b = rates[("A", kind)], rates[("B", kind)]
            won = sum(y > x for x, y in zip(a, b))
            cpu_a, cpu_b = statistics.median(cpus[("A", kind)]), statistics.median(cpus[("B", kind)])
            print(f"{kind}: A {statistics.median(a):.0f}, B {statistics.median(b):.0f} jobs/s "
                  f"({statistics.median(b) / statistics.median(a):.3f}x), B faster in {won} of {len(a)}; machine CPU "
                  f"per job A {cpu_a:.2f}, B {cpu_b:.2f} ms")
    finally:
        for c in clusters.values():
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""CPU per job of the host agent, its zygote, its reused supervisors (exec/agent/pool.py) and the
jobs those run, apart, during runs of `true` jobs on a throw-away cluster (bench/cluster.py, one
local host of 2 slots).

    python bench/sup_cpu.py [--runs 3] [--jobs 500]
    cp bench/sup_cpu.py OTHER/bench/ && python OTHER/bench/sup_cpu.py    # another checkout, alternately

bench/cpu_per_job.py counts the supervisors with their jobs; here a live worker's own CPU (user +
system) is told from its reaped jobs'. A run counts only the workers alive from its start to its
end (a worker leaves after MAX_JOBS), so keep --jobs below 2 x MAX_JOBS / 2 slots. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, wait_done, warm


def snapshot(processes: list[psutil.Process]) -> dict[int, tuple[float, float]]:
    """pid -> (own CPU seconds, its reaped children's)."""
    out = {}
    for p in processes:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = (t.user + t.system, t.children_user + t.children_system)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args(argv)
    c = BenchCluster(slots=2)
    c.start()
    try:
        warm(c)
        client = c.client()
        found = psutil.Process(c.pid).children(recursive=True)
        agents = [p for p in found if "serve" in p.cmdline()]
        agent = min(agents, key=lambda p: p.create_time())
        zygote = next(p for p in agents if p.ppid() == agent.pid)
        for run in range(args.runs):
            workers = zygote.children()
            before = snapshot([agent, zygote, *workers])
            ids = client.post("/jobs", {"jobs": [c.spec(["true"])] * args.jobs})["ids"]
            wait_done(client, ids, time.monotonic() + 600)
            after = snapshot([agent, zygote, *workers])
            kept = [w.pid for w in workers if w.pid in before and w.pid in after]
            ms = {
                "agent": after[agent.pid][0] - before[agent.pid][0],
                "zygote": after[zygote.pid][0] - before[zygote.pid][0],
                "workers": sum(after[p][0] - before[p][0] for p in kept),
                "jobs": sum(after[p][1] - before[p][1] for p in kept),
            }
            left = len(workers) - len(kept)
            parts = ", ".join(f"{k} {1000 * v / args.jobs:.3f} ms" for k, v in ms.items())
            note = f" ({left} worker(s) left meanwhile: not counted)" if left else ""
            print(f"run {run + 1}: CPU per job: {parts}{note}", flush=True)
            time.sleep(0.5)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

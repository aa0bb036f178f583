#!/usr/bin/env python3
"""Syscalls per job of the host agent and of its reused supervisors (exec/agent/pool.py), counted by
`strace -c -f` while a throw-away cluster (bench/cluster.py, one local host of 2 slots) runs a batch
of `true` jobs.

    python bench/sup_syscalls.py [--jobs 200] [--top 25]

Counts, not timings: the machine's load does not move them. strace attaches to the agent (its
serving process) and to the zygote and its idle workers, after a warm-up; the jobs themselves are
traced too (-f), and counted apart by their `execve`. Prints calls per job, per process kind and
per syscall. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, wait_done, warm


def parse_summary(path: str) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in open(path).read().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            try:
                calls[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return calls


def trace(pids: list[int], out: str) -> subprocess.Popen:
    args = ["strace", "-f", "-c", "-o", out]
    for pid in pids:
        args += ["-p", str(pid)]
    return subprocess.Popen(args, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    c = BenchCluster(slots=2)
    c.start()
    tmp = tempfile.mkdtemp(prefix="sup_syscalls.")
    try:
        warm(c)
        client = c.client()
        controller = psutil.Process(c.pid)
        agents = [p for p in controller.children(recursive=True) if "serve" in p.cmdline()]
        agent = min(agents, key=lambda p: p.create_time())  # the serving agent; its zygote is its child
        zygote = [p for p in agents if p.ppid() == agent.pid]
        workers = [w for z in zygote for w in z.children()]
        files = {"agent": os.path.join(tmp, "agent"), "supervisors": os.path.join(tmp, "sup")}
        tracers = [trace([agent.pid], files["agent"]),
                   trace([p.pid for p in zygote] + [w.pid for w in workers], files["supervisors"])]
        time.sleep(1.0)  # strace attaches
        ids = client.post("/jobs", {"jobs": [c.spec(["true"])] * args.jobs})["ids"]
        wait_done(client, ids, time.monotonic() + 600)
        time.sleep(0.5)
        for t in tracers:
            t.send_signal(signal.SIGINT)
            t.wait(30)
        for kind, path in files.items():
            calls = parse_summary(path)
            total = sum(calls.values())
            print(f"{kind}: {total / args.jobs:.1f} syscalls per job (jobs' own included for supervisors;"
                  f" {calls.get('execve', 0)} execve)")
            for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {name:24} {n / args.jobs:7.2f}")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

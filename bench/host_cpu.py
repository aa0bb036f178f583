#!/usr/bin/env python3
"""The host side's CPU per job, split by process: LocalHost (plain mode) running `true` units.

    python bench/host_cpu.py [--jobs 1000] [--batch 100] [--runs 3] [--inflight N]
    python bench/host_cpu.py --tree OTHER_CHECKOUT        # another tree's agent, same day, same load

No controller, no store: the units go straight to LocalHost in launches of --batch (launch_nowait),
and a run ends at the last finished event; one warm-up run first. Per job: the machine's busy CPU
(/proc/stat: it counts whatever else runs on the shared box), the agent's own (user + system), its
zygote's own (exec/agent/zygote.py; none before it), the supervisors with their jobs (the CPU of
reaped children, as the agent or the zygote reaps them, and of the zygote's live children: reused
supervisors, exec/agent/pool.py, live across runs), and this process (the channel's reader
thread); and the agent's and the zygote's wake-ups per job (voluntary context switches: counts,
which the load does not move). A `true` alone costs ~0.4-0.5 ms here. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

from stats import machine_busy_seconds


def own(p) -> float:
    t = p.cpu_times()
    return t.user + t.system


def reaped(p) -> float:
    t = p.cpu_times()
    return t.children_user + t.children_system


def live_children(p) -> float:
    """CPU seconds of the live children of `p` (the zygote's reused supervisors, which are reaped
    only when they exit): with the reaped ones' CPU, a sample's delta counts each one's work."""
    total = 0.0
    for child in p.children():
        try:
            total += own(child) + reaped(child)  # a reused supervisor and the jobs it has reaped
        except Exception:  # psutil.NoSuchProcess: it ended, and is counted among the reaped
            pass
    return total


def wakeups(*processes) -> list[int]:
    """Voluntary context switches of each process (0 for None): how often it blocked and was woken."""
    return [p.num_ctx_switches().voluntary if p is not None else 0 for p in processes]


def sample(agent, zygote, me) -> list[float]:
    """CPU seconds: agent's own, its reaped children's, the zygote's own and reaped (with its live
    children's), ours; the machine's busy."""
    z = (own(zygote), reaped(zygote) + live_children(zygote)) if zygote is not None else (0.0, 0.0)
    return [own(agent), reaped(agent), *z, own(me), machine_busy_seconds()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=0,
                        help="at most this many units launched and not finished (a cluster's slots on the host); "
                             "0: every launch at once")
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to measure")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.tree)
    import psutil

    from xce_lite.exec.host import LaunchRequest, UnitFinished
    from xce_lite.exec.local import LocalHost

    with tempfile.TemporaryDirectory(prefix="xb-host-") as tmp:
        host, events = LocalHost("bench", Path(tmp) / "spool", mode="plain"), queue.Queue()
        host.connect(events)
        agent, me = psutil.Process(host.agent_pid), psutil.Process()
        env = {"PATH": "/usr/bin:/bin"}
        inflight = f", at most {args.inflight} at once" if args.inflight else ""
        print(f"tree {args.tree}; {args.jobs} `true` units in launches of {args.batch}{inflight}; "
              f"load {os.getloadavg()[0]:.1f}")
        zygote = None  # after the warm-up: the agent's one child left (supervisors have ended)
        for run in range(args.runs + 1):
            requests = [LaunchRequest(unit=f"r{run}u{i}", argv=("true",), env=env, cwd=tmp, stdout=f"{tmp}/out",
                                      stderr=None) for i in range(args.jobs)]

            before, started, woke = sample(agent, zygote, me), time.perf_counter(), wakeups(agent, zygote)
            window = args.inflight or args.jobs
            done = sent = 0
            while done < args.jobs:
                while sent < args.jobs and sent - done < window:
                    host.launch_nowait(requests[sent : sent + args.batch])
                    sent += args.batch
                event = events.get(timeout=120)
                if isinstance(event, UnitFinished):
                    done += 1
            wall, after = time.perf_counter() - started, sample(agent, zygote, me)
            woke = [(a - b) / args.jobs for a, b in zip(wakeups(agent, zygote), woke)]
            host.forget([r.unit for r in requests])
            if run == 0:
                time.sleep(0.2)
                kids = agent.children()
                zygote = kids[0] if len(kids) == 1 else None
                continue
            ms = [1000 * (a - b) / args.jobs for a, b in zip(after, before)]
            print(f"run {run}: {args.jobs / wall:.0f} jobs/s; CPU per job: machine {ms[5]:.2f} ms, agent {ms[0]:.2f}, "
                  f"zygote {ms[2]:.2f}, supervisors+jobs {ms[1] + ms[3]:.2f}, channel {ms[4]:.2f}; wake-ups per job: "
                  f"agent {woke[0]:.2f}, zygote {woke[1]:.2f} (load {os.getloadavg()[0]:.1f})", flush=True)
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

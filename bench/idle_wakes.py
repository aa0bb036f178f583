#!/usr/bin/env python3
"""Where a 2-slot run leaves the CPUs idle, and what ends each idle spell: `perf sched record` of
the whole machine around one run of `true` jobs, each task named by its role (session 20).

    python bench/idle_wakes.py [--runs 2] [--jobs 1000] [--kind array|batch] [--skip 50]
    python bench/idle_wakes.py --handoff          # the floor: one pipe round trip, same CPU / other CPU

A throw-away cluster (bench/cluster.py, one local host of 2 slots), warmed. Per run, `perf sched
record -a` runs from a second before the POST to the last job's end. From its events (sched_switch,
sched_waking, sched_process_fork) each task gets a role: the controller (its pid's threads), the
agent, its zygote, the workers (the zygote's children, exec/agent/pool.py), the jobs (the workers'
children), this process ("bench client"), and the kernel's threads by name. Over the window from the
--skip'th job's fork to the last, it prints each role's share of the CPUs' time, the idle share,
and the idle spells grouped by the task that ended them and whoever woke that task: the hand-offs
on which the CPUs wait. perf drops some switch events at this rate; a spell whose end was not
seen is counted under "(not seen)". perf's own cost slows the run ~10%.

--handoff prints the cost of one hand-off between two processes (a pipe round trip) on one CPU and
across CPUs: on this VM an idle vCPU halts (cpuidle haltpoll with guest_halt_poll_ns=0, see
/proc/cmdline), so each wake of one goes through the host. Needs root and perf. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, is_agent, wait_done, warm
from cpu_per_job import submit

EVENT = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)$")


def events(data: str) -> list[tuple[str, int, int, int, float, str, str]]:
    """(comm, pid, tid, cpu, time, kind, rest) of every scheduler event recorded in `data`."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,cpu,time,event,trace"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = EVENT.match(line)
        if m:
            comm, pid, tid, cpu, t, kind, rest = m.groups()
            found.append((comm, int(pid), int(tid), int(cpu), float(t), kind, rest))
    return found


class Roles:
    """A task's role from the pids known before the run and the forks seen in it."""

    def __init__(self, evs: list, controller: int, agent: int, zygote: int | None, workers: list[int]):
        self.tgid: dict[int, int] = {}
        self.comm: dict[int, str] = {}
        self.parent: dict[int, int] = {w: zygote for w in workers if zygote is not None}
        for comm, pid, tid, _cpu, _t, kind, rest in evs:
            self.tgid[tid], self.comm[tid] = pid, comm
            if kind == "sched_process_fork":
                child = int(re.search(r"child_pid=(\d+)", rest).group(1))
                self.parent[child] = pid
                self.tgid.setdefault(child, child)
        self.controller, self.agent, self.zygote = controller, agent, zygote
        self.me = os.getpid()

    def __call__(self, tid: int) -> str:
        if tid == 0:
            return "idle"
        group = self.tgid.get(tid, tid)
        if group == self.controller:
            return "controller"
        if group == self.agent:
            return "agent"
        if group == self.me:
            return "bench client"
        if self.zygote is not None and group == self.zygote:
            return "zygote"
        up = self.parent.get(group)
        if self.zygote is not None and up == self.zygote:
            return "worker"
        if up is not None and self.parent.get(up) == self.zygote and self.zygote is not None:
            return "job"
        return re.split(r"[/:]", self.comm.get(tid, "?"))[0] or "?"


def analyse(evs: list, roles: Roles, skip: int, cpus: int) -> None:
    """Print the CPUs' time by role (sched_stat_runtime: every task's run time, whatever switch
    events perf missed) and the idle spells, each ended by the first event on its CPU or the first
    wake-up aimed at it (a spell's end is often not recorded as a switch from idle here)."""
    forks = [t for _c, pid, _tid, _cpu, t, kind, _r in evs
             if kind == "sched_process_fork" and roles(pid) == "worker"]
    if len(forks) <= skip + 1:
        print("  too few jobs forked in the recording")
        return
    t0, t1 = forks[skip], forks[-1]
    print(f"  window {1000 * (t1 - t0):.0f} ms: {len(forks) - skip} jobs forked")
    busy: Counter = Counter()
    idle_since: dict[int, float] = {}  # cpu -> when it went idle
    waker: dict[int, str] = {}
    spells: Counter = Counter()
    spell_time: defaultdict = defaultdict(float)

    def end_spell(cpu: int, t: float, key: tuple[str, str]) -> None:
        since = idle_since.pop(cpu, None)
        if since is not None and t0 <= t <= t1:
            spells[key] += 1
            spell_time[key] += t - max(since, t0)

    for _comm, _pid, tid, cpu, t, kind, rest in evs:
        if kind == "sched_waking":
            target = int(re.search(r" pid=(\d+)", rest).group(1))
            waker[target] = roles(tid)
            aimed = int(re.search(r"target_cpu=(\d+)", rest).group(1))
            if aimed in idle_since and aimed != cpu:
                end_spell(aimed, t, (roles(target), roles(tid)))
        if cpu in idle_since and tid != 0:
            end_spell(cpu, t, (roles(tid), waker.get(tid, "?")))
        if kind == "sched_stat_runtime" and t0 <= t <= t1:
            m = re.search(r" pid=(\d+) runtime=(\d+)", rest)
            busy[roles(int(m.group(1)))] += int(m.group(2)) / 1e9
        elif kind == "sched_switch" and re.search(r"next_pid=0 ", rest):
            idle_since[cpu] = t
    total = cpus * (t1 - t0)
    print(f"  share of the CPUs' time ({cpus} x the window), idle {100 * (1 - sum(busy.values()) / total):.1f}%:")
    for role, spent in busy.most_common(10):
        print(f"    {role:14s} {100 * spent / total:5.1f}%  {1000 * spent:7.1f} ms")
    print(f"  idle spells by the task that ended them (woken by): count, ms, mean us "
          f"(all: {sum(spells.values())}, {1000 * sum(spell_time.values()):.0f} ms)")
    for key in sorted(spells, key=lambda k: -spell_time[k])[:10]:
        who = f"{key[0]} (by {key[1]})"
        mean = 1e6 * spell_time[key] / spells[key]
        print(f"    {who:36s} {spells[key]:5d} {1000 * spell_time[key]:7.1f} {mean:6.0f}")


def handoff(n: int = 3000) -> None:
    """One pipe round trip between two processes: both on CPU 0, on CPUs 0 and 1, and left free."""
    def once(mine: set[int], theirs: set[int]) -> float:
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.sched_setaffinity(0, theirs)
            for _ in range(n):
                os.read(r1, 1)
                os.write(w2, b"x")
            os._exit(0)
        os.sched_setaffinity(0, mine)
        time.sleep(0.05)
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(w1, b"x")
            os.read(r2, 1)
        spent = time.perf_counter() - t0
        os.waitpid(pid, 0)
        for fd in (r1, w1, r2, w2):
            os.close(fd)
        return 1e6 * spent / n

    every = set(range(os.cpu_count() or 1))
    try:
        for run in range(3):
            print(f"run {run + 1}: a pipe round trip: same CPU {once({0}, {0}):.1f} us, other CPU "
                  f"{once({0}, {1}):.1f} us, left to the scheduler {once(every, every):.1f} us", flush=True)
    finally:
        os.sched_setaffinity(0, every)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kind", choices=("array", "batch"), default="array")
    parser.add_argument("--skip", type=int, default=50, help="jobs of the run's head left out of the window")
    parser.add_argument("--handoff", action="store_true", help="only the hand-off floor")
    args = parser.parse_args()
    if args.handoff:
        handoff()
        return 0
    c = BenchCluster(slots=2)
    scratch = Path(tempfile.mkdtemp(prefix="idle-wakes-"))
    try:
        c.start()
        warm(c)
        client = c.client()
        agent = next(p for p in c.descendants() if is_agent(p.cmdline()))
        kids = agent.children()  # the zygote: the child whose children (the idle workers) live on
        zygote = max(kids, key=lambda p: len(p.children())).pid if kids else None
        for run in range(1, args.runs + 1):
            data = str(scratch / f"sched{run}.data")
            workers = [p.pid for p in psutil.Process(zygote).children()] if zygote else []
            perf = subprocess.Popen(["perf", "sched", "record", "-a", "-o", data],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            t0 = time.perf_counter()
            ids = submit(client, c.spec(["true"]), args.jobs, args.kind == "array")
            wait_done(client, ids, time.monotonic() + 300)
            wall = time.perf_counter() - t0
            perf.send_signal(signal.SIGINT)
            perf.wait()
            print(f"run {run}: {args.jobs} jobs ({args.kind}) at {args.jobs / wall:.0f} jobs/s under perf "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
            evs = events(data)
            analyse(evs, Roles(evs, c.pid or -1, agent.pid, zygote, workers), args.skip, os.cpu_count() or 1)
            os.unlink(data)
            time.sleep(0.5)
    finally:
        c.stop()
        for leftover in scratch.iterdir():
            leftover.unlink()
        scratch.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""CPU time per job, the whole machine's and the controller's processes', during 1000-job runs.

    python bench/cpu_per_job.py [--runs 3] [--jobs 1000] [--array | --each]
    cp bench/cpu_per_job.py OTHER/bench/ && python OTHER/bench/cpu_per_job.py    # another checkout, same day

The local throughput is CPU bound on the 2-core box (every process of the path shares two
cores), so jobs/s moves with the machine's speed from day to day, while CPU per job compares two
trees measured on the same day. A throw-away cluster (bench/cluster.py: one local host of 2 slots),
warmed with 20 jobs; then each run is one batch POST of --jobs `true` jobs (--array: one
--jobs-element array, as bench/run.py's array line; --each: --jobs POSTs of one job, as its one-POST
line, this script the client) until all are DONE, with:
the machine's busy CPU time (/proc/stat: user, nice, system, irq, softirq) per job, and each of the
controller's processes' (user + system): the controller, the host agent (with its zygote), the
scheduler's worker; the supervisors with their jobs (the zygote's children, reaped or live); and
the worker's wake-ups per job (its voluntary context switches: it blocks on its pipe between
sessions, so about one per session it runs; a count, which the machine's load does not move), and
the controller's and the agent's read and write system calls and wake-ups per job (counts too: a
line to the agent is a write of the controller, a read and a wake-up of the agent); and the
kernel's share, which no process of ours is charged with (kthreads.py: its threads' CPU, jbd2,
kworker, ksoftirqd and the rest, and the interrupts'), with this script's own (it polls the jobs).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from cluster import BenchCluster, machine_busy_seconds, wait_done, warm
from kthreads import KernelShare, describe


def submit(client, spec: dict, n: int, array: bool, each: bool = False) -> list[int]:
    """One POST of `n` jobs (`spec` each), or with `array` of one `n`-element array as bench/run.py's
    array line sends it, or with `each` `n` POSTs of one job; the jobs' ids (an array's elements'
    follow its first)."""
    if each:
        return [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(n)]
    if not array:
        return client.post("/jobs", {"jobs": [spec] * n})["ids"]
    first = client.post("/jobs", {"jobs": [dict(spec, name="bench", array=f"1-{n}")]})["ids"][0]
    return list(range(first, first + n))


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def supervisors_seconds(zygotes: list[psutil.Process]) -> float:
    """CPU seconds of the zygotes' supervisors with their jobs: those reaped, and the live ones
    (reused supervisors, exec/agent/pool.py, live across runs) with what they reaped."""
    total = 0.0
    for zygote in zygotes:
        t = zygote.cpu_times()
        total += t.children_user + t.children_system
        for child in zygote.children():
            try:
                c = child.cpu_times()
                total += c.user + c.system + c.children_user + c.children_system
            except psutil.NoSuchProcess:  # it ended: counted among the reaped
                pass
    return total


def io_calls(process: psutil.Process) -> tuple[int, int]:
    """(read, write) system calls of the process itself. /proc/PID/io also counts the children it
    has reaped (the kernel adds a reaped child's counts to its parent's, as it does CPU to
    cutime): the zygote's, read so, jumped by a retired worker's whole life (~10 reads per job it
    ran, MAX_JOBS of them) in the run where it exited, which showed as 12-22 agent reads per job
    instead of ~2. A single-threaded process's own counts are its one task's (/proc/PID/task/PID/io,
    which holds no child's); a threaded one's stay the whole, since a task that ended is only there."""
    if process.num_threads() != 1:
        return tuple(process.io_counters()[:2])  # type: ignore[return-value]
    fields = dict(line.split(": ") for line in open(f"/proc/{process.pid}/task/{process.pid}/io").read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def role(process: psutil.Process, controller_pid: int) -> str:
    if process.pid == controller_pid:
        return "controller"
    argv = process.cmdline()
    return "agent" if "serve" in argv else "scheduler worker" if "-c" in argv else "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--array", action="store_true", help="each run one POST of a --jobs-element array")
    parser.add_argument("--each", action="store_true", help="each run --jobs POSTs of one job (run.py's one POST)")
    args = parser.parse_args(argv)
    c = BenchCluster(slots=2)
    c.start()
    try:
        warm(c)
        client = c.client()
        controller = psutil.Process(c.pid)
        # the controller's processes: it, its scheduler workers, the agent and its zygote; not the
        # supervisors (the zygote's children, some reused across runs, exec/agent/pool.py) nor jobs:
        # their CPU is in the machine's figure
        found = {p.pid: p for p in [controller, *controller.children(recursive=True)]}
        serving = {pid for pid, p in found.items() if pid != c.pid and "serve" in p.cmdline()}

        def serving_ancestors(p: psutil.Process) -> int:
            depth, pid = 0, p.ppid()
            while pid in found:
                depth += pid in serving
                pid = found[pid].ppid()
            return depth

        processes = [p for pid, p in found.items() if serving_ancestors(p) <= (1 if pid in serving else 0)]
        zygotes = [p for pid, p in found.items() if pid in serving and serving_ancestors(p) == 1]
        for run in range(args.runs):
            before = {p.pid: cpu_seconds(p) for p in processes}
            supervised = supervisors_seconds(zygotes)
            # the worker blocks on its pipe between sessions: its voluntary switches count its wake-ups
            woken = {p.pid: p.num_ctx_switches().voluntary for p in processes}
            syscalls = {p.pid: io_calls(p) for p in processes}  # (reads, writes): counts, as wake-ups
            kernel, me = KernelShare(), time.process_time()
            busy, start = machine_busy_seconds(), time.perf_counter()
            ids = submit(client, c.spec(["true"]), args.jobs, args.array, args.each)
            wait_done(client, ids, time.monotonic() + 600)
            wall, busy = time.perf_counter() - start, machine_busy_seconds() - busy
            kernel_spent, me = kernel.seconds(), time.process_time() - me
            per_role: dict[str, float] = {}
            for p in processes:
                name = role(p, c.pid)
                per_role[name] = per_role.get(name, 0.0) + cpu_seconds(p) - before[p.pid]
            per_role["supervisors+jobs"] = supervisors_seconds(zygotes) - supervised
            parts = ", ".join(f"{name} {1000 * s / args.jobs:.2f} ms" for name, s in per_role.items() if s > 0)
            wakes = sum(p.num_ctx_switches().voluntary - woken[p.pid] for p in processes
                        if role(p, c.pid) == "scheduler worker")
            counts = []
            for name in ("controller", "agent"):  # the tick's writes to the agent, the agent's reads and wake-ups
                mine = [p for p in processes if role(p, c.pid) == name]
                reads = sum(io_calls(p)[0] - syscalls[p.pid][0] for p in mine)
                writes = sum(io_calls(p)[1] - syscalls[p.pid][1] for p in mine)
                wake = sum(p.num_ctx_switches().voluntary - woken[p.pid] for p in mine)
                counts.append(f"{name} reads {reads / args.jobs:.2f}, writes {writes / args.jobs:.2f}, "
                              f"wake-ups {wake / args.jobs:.2f}")
            print(f"run {run + 1}: {args.jobs / wall:.0f} jobs/s; CPU per job: machine {1000 * busy / args.jobs:.2f} "
                  f"ms, {parts}; scheduler worker wake-ups per job {wakes / args.jobs:.2f}; per job: "
                  f"{'; '.join(counts)}; {describe(kernel_spent, args.jobs)}; "
                  f"this script {1000 * me / args.jobs:.2f} ms", flush=True)
            time.sleep(1)
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

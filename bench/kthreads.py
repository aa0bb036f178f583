#!/usr/bin/env python3
"""The kernel's share of the machine's CPU: its threads' (children of kthreadd, pid 2) and the
interrupts' time, which no process of ours is charged with (imported by cpu_per_job.py and
worker_loop.py; run alone, it samples the machine for a while).

    python bench/kthreads.py [--seconds 5]     # the kernel's CPU on this machine now, by group

A thread's CPU is its /proc/PID/schedstat run time (ns; /proc/PID/stat's clock ticks are 10 ms,
too coarse for a share of ~0.1 ms per job), grouped by the name before its '/' (kworker/0:1H-kblockd
is "kworker", jbd2/vda-8 "jbd2", ksoftirqd/1 "ksoftirqd"). A thread that started during the run
counts whole; one that ended during it is lost (an idle kworker exits after minutes: rare in a
run). Interrupts: /proc/stat's irq and softirq (time spent outside any thread, with the kernel's
IRQ time accounting; softirqs run by ksoftirqd are that thread's). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

GROUPS = ("jbd2", "kworker", "ksoftirqd")  # the rest of the kernel's threads are "other threads"


def _threads() -> dict[tuple[int, str], tuple[str, int]]:
    """(pid, start time) -> (group, run time in ns) of every kernel thread now."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name != "2" and rest[1] != "2":  # rest[1] is the ppid: kthreadd's children only
            continue
        group = comm.split("/", 1)[0]
        found[(int(name), rest[19])] = (group if group in GROUPS else "other threads", ns)
    return found


def _irq_seconds() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return (int(fields[6]) + int(fields[7])) / os.sysconf("SC_CLK_TCK")


class KernelShare:
    """Take the kernel's CPU now (`KernelShare()`); `seconds()` is what it spent since, by group:
    jbd2, kworker, ksoftirqd, other threads, irq+softirq, and "kernel" (their sum)."""

    def __init__(self) -> None:
        self.threads, self.irq = _threads(), _irq_seconds()

    def seconds(self) -> dict[str, float]:
        spent = dict.fromkeys((*GROUPS, "other threads"), 0.0)
        for key, (group, ns) in _threads().items():
            old = self.threads.get(key)
            spent[group] += (ns - (old[1] if old else 0)) / 1e9
        spent["irq+softirq"] = _irq_seconds() - self.irq
        spent["kernel"] = sum(spent.values())
        return spent


def describe(spent: dict[str, float], jobs: int) -> str:
    """'kernel 0.41 ms (kworker 0.30, ...)' per job; groups that spent nothing are left out."""
    parts = ", ".join(f"{k} {1000 * v / jobs:.3f}" for k, v in spent.items() if k != "kernel" and v > 0)
    return f"kernel {1000 * spent['kernel'] / jobs:.3f} ms ({parts})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    share = KernelShare()
    time.sleep(args.seconds)
    spent = share.seconds()
    print(", ".join(f"{k} {1000 * v / args.seconds:.2f} ms/s" for k, v in spent.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Units per second on one systemd test host: bare systemd-run, against the agent in system mode.

    python bench/agent_systemd.py [--runs 5] [--units 200] [--jobs 1,2,4,8] [--starts 200] [--starts-only]

Needs root: it boots one systemd test host (xce_lite.testhosts) in ~/.cache/xce-testhosts/
bench-agent-PID, and stops it and removes that directory at the end. Prints each run as it is
measured, then the medians, each with the CPU it cost per unit (all of the host's processes, PID 1
included, from the host's own cpuacct cgroup on this machine: a figure the machine's load does not
skew as it skews the rates):

- `bare serial`: a loop inside the host (one Python process entered with nsenter once, so no
  nsenter per unit) runs `systemd-run --no-block --quiet true` --units times, one after the other,
  then waits until the manager has no job queued (every unit has started): units / wall time.
- `bare K at once`: the same with K systemd-run processes at a time.
- `agent, direct units`: `agent-<hash>.py serve --mode systemd` (the one file bundle.py builds)
  inside the host (over nsenter pipes, wrapped in an AgentChannel) gets ONE launch of --units
  `true` units; from before the request until the last finished event: units / wall time. Each
  unit is started over D-Bus and runs the job as its main process (/bin/sh execs it) with a
  /bin/sh ExecStopPost that records the result: no Python in the unit.
- `agent, supervised units`: the same with an environment name systemd refuses, which puts the
  agent's Python supervisor in each unit (`exec`; its ExecStopPost is /bin/sh, which finds the
  result recorded and does not start `post`).
- `python -S -E agent.pyc`: the wall time of one such interpreter start (exec of a missing unit
  directory, which loads what a unit's `exec` loads), inside the host: the minimum and the median
  of --starts starts, one after the other. With --starts-only, only this (after one small launch,
  which compiles the agent into SPOOL/bin).

Asserts nothing; the machine is shared and noisy: compare figures within one run.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from remote_cpu import HostCpu

from xce_lite import testhosts
from xce_lite.exec import bundle
from xce_lite.exec.agentops import AgentOps
from xce_lite.exec.channel import AgentChannel
from xce_lite.exec.host import LaunchRequest, UnitFinished

AGENT = bundle.local_file()  # the one file hosts get, under the source tree (the test host sees it)
PY = "/usr/bin/python3"
BARE_LOOP = """
import subprocess, sys, time
n, k = int(sys.argv[1]), int(sys.argv[2])
started, running = time.perf_counter(), []
for _ in range(n):
    running.append(subprocess.Popen(["systemd-run", "--no-block", "--quiet", "true"]))
    if len(running) >= k:
        running.pop(0).wait()
for p in running:
    p.wait()
while subprocess.run(["systemctl", "show", "-p", "NJobs", "--value"], capture_output=True,
                     text=True).stdout.strip() != "0":
    time.sleep(0.001)
print(n / (time.perf_counter() - started))
"""


def bare(host: testhosts.TestHost, units: int, k: int) -> float:
    done = subprocess.run(host.nsenter_argv([PY, "-c", BARE_LOOP, str(units), str(k)]), capture_output=True,
                          text=True, check=True)
    return float(done.stdout)


class Agent(AgentOps):
    def __init__(self, host: testhosts.TestHost, spool: Path):
        self.name, self.events = host.name, queue.Queue()
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), "--mode", "systemd"]
        self.proc = subprocess.Popen(host.nsenter_argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._channel = AgentChannel(self.proc.stdout, self.proc.stdin, self.events.put, self.name, timeout=60)
        self.probe()

    def close(self) -> None:
        self._channel.close()
        self.proc.wait(30)


def agent_rate(agent: Agent, work: Path, units: int, supervised: bool) -> float:
    names = [f"b{uuid.uuid4().hex[:8]}-{i}" for i in range(units)]
    env = {"PATH": "/usr/bin:/bin", **({"NOT.DIRECT": "1"} if supervised else {})}
    requests = [LaunchRequest(unit=n, argv=("true",), env=env, cwd=str(work),
                              stdout=str(work / "junk.out"), stderr=None) for n in names]
    started = time.perf_counter()
    agent.launch(requests, timeout=60)
    left = set(names)
    while left:
        event = agent.events.get(timeout=120)
        if isinstance(event, UnitFinished):
            assert event.result.exit_code == 0, event
            left.discard(event.unit)
    rate = units / (time.perf_counter() - started)
    agent.forget(names)
    return rate


def interpreter_start(host: testhosts.TestHost, pyc: str, samples: int = 200) -> tuple[float, float]:
    """(minimum, median) seconds of `samples` starts of `python -S -E PYC exec /none` inside the host."""
    loop = (
        "import subprocess, sys, time\nxs = []\n"
        f"for _ in range({samples}):\n"
        "    t = time.perf_counter()\n"
        "    subprocess.run([sys.argv[1], '-S', '-E', sys.argv[2], 'exec', '/none'], stderr=subprocess.DEVNULL)\n"
        "    xs.append(time.perf_counter() - t)\n"
        "print(min(xs), sorted(xs)[len(xs) // 2])"
    )
    done = subprocess.run(host.nsenter_argv([PY, "-c", loop, PY, pyc]), capture_output=True, text=True, check=True)
    low, median = done.stdout.split()
    return float(low), float(median)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--jobs", default="2,4,8", help="K values for the bare loop, besides serial")
    parser.add_argument("--starts", type=int, default=200, help="interpreter starts to measure")
    parser.add_argument("--starts-only", action="store_true", help="measure the interpreter start only")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.jobs.split(",") if int(k) > 1]
    base = testhosts.DEFAULT_DIR.parent / f"bench-agent-{os.getpid()}"
    work = base / "work"
    [host] = testhosts.up(1, base / "hosts", die_with_caller=True)
    cpu = HostCpu(host)
    figures: dict[str, list[tuple[float, float]]] = {}

    def measure(label: str, run: int, step) -> None:
        before = cpu()
        rate = step()
        figures.setdefault(label, []).append((rate, (cpu() - before) / args.units * 1000))
        print(f"run {run + 1}: {label}: {rate:.0f} units/s, {figures[label][-1][1]:.1f} ms CPU/unit", flush=True)

    try:
        work.mkdir(parents=True)
        for k in [1, *ks]:  # warm-up, and the .pyc
            bare(host, 10, k)
        agent = Agent(host, work / "spool")
        try:
            agent_rate(agent, work, 10, False)
            for run in range(0 if args.starts_only else args.runs):
                measure("bare serial", run, lambda: bare(host, args.units, 1))
                for k in ks:
                    measure(f"bare {k} at once", run, lambda k=k: bare(host, args.units, k))
                measure("agent, direct units", run, lambda: agent_rate(agent, work, args.units, False))
                measure("agent, supervised units", run, lambda: agent_rate(agent, work, args.units, True))
        finally:
            agent.close()
        pyc = next((work / "spool" / "bin").glob("agent-*.pyc"))
        start, start_median = interpreter_start(host, str(pyc), args.starts)
    finally:
        testhosts.down(base / "hosts")
        shutil.rmtree(base, ignore_errors=True)
    print(f"\non {host.name} (systemd test host), load {os.getloadavg()[0]:.1f}:")
    serial = statistics.median(rate for rate, _ in figures["bare serial"]) if figures else 0.0
    if figures:
        print(f"{args.units} `true` units, medians of {args.runs} runs:")
    for label, xs in figures.items():
        rates = [rate for rate, _ in xs]
        rate, ms = statistics.median(rates), statistics.median(ms for _, ms in xs)
        print(f"  {label:24} {rate:6.0f} units/s  ({rate / serial:4.0%} of bare serial; min {min(rates):.0f}, "
              f"max {max(rates):.0f}); {ms:5.1f} ms CPU per unit")
    print(f"  python -S -E agent.pyc    {start * 1000:6.1f} ms per interpreter start (minimum of {args.starts}; "
          f"median {start_median * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

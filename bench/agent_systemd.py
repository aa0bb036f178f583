"""Units per second on one systemd test host: bare systemd-run, against the agent in system mode.

    python bench/agent_systemd.py [--runs 5] [--units 200] [--jobs 1,2,4,8]

Needs root: it boots one systemd test host (xce_lite.testhosts) in ~/.cache/xce-testhosts/
bench-agent-PID, and stops it and removes that directory at the end. Prints each run as it is
measured, then the medians:

- `bare serial`: a loop inside the host (one Python process entered with nsenter once, so no
  nsenter per unit) runs `systemd-run --no-block --quiet true` --units times, one after the other,
  then waits until the manager has no job queued (every unit has started): units / wall time.
- `bare K at once`: the same with K systemd-run processes at a time.
- `agent, K systemd-runs`: `agent.py serve --mode systemd --systemd-run-jobs K` inside the host
  (over nsenter pipes, wrapped in an AgentChannel) gets ONE launch of --units `true` units; from
  before the request until the last finished event: units / wall time. A unit whose job ends by
  itself runs one Python interpreter (its supervisor, `exec`) besides what systemd does; its
  ExecStopPost is /bin/sh, which finds the result recorded and does not start `post`.
- `python -S -E agent.pyc`: the wall time of one such interpreter start (exec of a missing unit
  directory), inside the host, for reference.

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

from xce_lite import testhosts
from xce_lite.exec.channel import AgentChannel, AgentOps
from xce_lite.exec.host import LaunchRequest, UnitFinished

AGENT = Path(__file__).resolve().parents[1] / "xce_lite" / "exec" / "agent.py"
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
    def __init__(self, host: testhosts.TestHost, spool: Path, jobs: int):
        self.name, self.events = host.name, queue.Queue()
        argv = [PY, "-S", "-E", str(AGENT), "serve", "--spool", str(spool), "--mode", "systemd",
                "--systemd-run-jobs", str(jobs)]
        self.proc = subprocess.Popen(host.nsenter_argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._channel = AgentChannel(self.proc.stdout, self.proc.stdin, self.events.put, self.name, timeout=60)
        self.probe()

    def close(self) -> None:
        self._channel.close()
        self.proc.wait(30)


def agent_rate(agent: Agent, work: Path, units: int) -> float:
    names = [f"b{uuid.uuid4().hex[:8]}-{i}" for i in range(units)]
    requests = [LaunchRequest(unit=n, argv=("true",), env={"PATH": "/usr/bin:/bin"}, cwd=str(work),
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


def interpreter_start(host: testhosts.TestHost, pyc: str, samples: int = 20) -> float:
    loop = (
        "import subprocess, sys, time\nxs = []\n"
        f"for _ in range({samples}):\n"
        "    t = time.perf_counter()\n"
        "    subprocess.run([sys.argv[1], '-S', '-E', sys.argv[2], 'exec', '/none'], stderr=subprocess.DEVNULL)\n"
        "    xs.append(time.perf_counter() - t)\n"
        "print(sorted(xs)[len(xs) // 2])"
    )
    done = subprocess.run(host.nsenter_argv([PY, "-c", loop, PY, pyc]), capture_output=True, text=True, check=True)
    return float(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--jobs", default="1,2,4,8", help="K values, for the bare loop and the agent")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.jobs.split(",")]
    base = testhosts.DEFAULT_DIR.parent / f"bench-agent-{os.getpid()}"
    work = base / "work"
    [host] = testhosts.up(1, base / "hosts", die_with_caller=True)
    figures: dict[str, list[float]] = {}
    try:
        work.mkdir(parents=True)
        for k in ks:  # warm-up and the .pyc: one small run of each
            bare(host, 10, k)
        for run in range(args.runs):
            for label, k in [("bare serial", 1)] + [(f"bare {k} at once", k) for k in ks if k > 1]:
                figures.setdefault(label, []).append(bare(host, args.units, k))
                print(f"run {run + 1}: {label}: {figures[label][-1]:.0f} units/s", flush=True)
            for k in ks:
                agent = Agent(host, work / f"spool-{k}", k)
                try:
                    label = f"agent, {k} systemd-runs"
                    figures.setdefault(label, []).append(agent_rate(agent, work, args.units))
                    print(f"run {run + 1}: {label}: {figures[label][-1]:.0f} units/s", flush=True)
                finally:
                    agent.close()
        pyc = next((work / "spool-1" / "bin").glob("agent-*.pyc"))
        start = interpreter_start(host, str(pyc))
    finally:
        testhosts.down(base / "hosts")
        shutil.rmtree(base, ignore_errors=True)
    serial = statistics.median(figures["bare serial"])
    print(f"\n{args.units} `true` units, medians of {args.runs} runs, on {host.name} (systemd test host):")
    for label, xs in figures.items():
        rate = statistics.median(xs)
        print(f"  {label:24} {rate:6.0f} units/s  ({rate / serial:4.0%} of bare serial; min {min(xs):.0f}, "
              f"max {max(xs):.0f})")
    print(f"  python -S -E agent.pyc    {start * 1000:6.1f} ms per interpreter start (one per unit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

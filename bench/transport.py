#!/usr/bin/env python3
"""The SSH transport's costs, against LocalHost's on this machine: prints figures, asserts nothing.

    python bench/transport.py                    # about a minute on the 2-core box
    python bench/transport.py --runs 20 --jobs 2000 --batch 200

Boots ONE plain test host (xce_lite.testhosts: a real sshd on a loopback address, as root) in
--dir (default ~/.cache/xce-testhosts/bench-transport-PID, outside /tmp: the host has its own /tmp),
and stops it, by PID, at the end, whatever happens. Figures, each the median (and min, max) of runs:

  connect            SshHost.connect(): TCP + key exchange + auth + the one exec that checks for the
                     agent's copy and starts it + hello, then close() (not timed). The host's python
                     is this interpreter's absolute path; `connect, python3 on PATH` takes `python3`
                     from the login shell's PATH instead (here a pyenv shim: a bash script), to show
                     what the user's shell costs. `first connect` includes copying the agent.
  round trip         one `list` request on an open connection; one `launch` of one `true` unit
                     (the reply, not the job's end). LocalHost's over pipes beside them. And one
                     exec of `true` on the open connection: what a command per job would cost.
  1000 true units    launch N `true` units in batches of B, one request per batch, until every
                     finished event is in: jobs/s. LocalHost's beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # measure the tree this file is in, not whatever is installed

from stats import fmt, summary, table

from xce_lite import testhosts
from xce_lite.exec.host import LaunchRequest, UnitFinished
from xce_lite.exec.local import LocalHost
from xce_lite.exec.ssh import SshHost, SshTarget


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def true_units(prefix: str, n: int, workdir: Path) -> list[LaunchRequest]:
    env = {"PATH": "/usr/bin:/bin"}
    return [LaunchRequest(unit=f"{prefix}-{i}", argv=("true",), env=env, cwd=str(workdir),
                          stdout=str(workdir / "junk.out"), stderr=None) for i in range(n)]


def run_units(host, events: queue.Queue, requests: list[LaunchRequest], batch: int) -> float:
    """Jobs per second from the first launch to the last finished event."""
    start = time.perf_counter()
    for i in range(0, len(requests), batch):
        replies = host.launch(requests[i:i + batch])
        assert all(r.status == "started" for r in replies), replies
    waiting = {r.unit for r in requests}
    while waiting:
        event = events.get(timeout=120)
        if isinstance(event, UnitFinished):
            waiting.discard(event.unit)  # other units' events (the round trips' jobs) may come between
    rate = len(requests) / (time.perf_counter() - start)
    host.forget([r.unit for r in requests])
    return rate


def round_trips(host, workdir: Path, prefix: str, runs: int) -> tuple[list[float], list[float]]:
    lists = [timed(host.list_units) for _ in range(runs)]
    launches = [timed(lambda r=r: host.launch([r])) for r in true_units(prefix, runs, workdir)]
    return lists, launches


def exec_true(host: SshHost) -> float:
    """One exec of `true` beside the agent's channel: what a command per job would cost (the login
    shell's start, its rc files included, is most of it)."""
    transport = host._stream.route.transport
    start = time.perf_counter()
    chan = transport.open_session(timeout=10)
    chan.exec_command("true")
    chan.recv_exit_status()
    took = time.perf_counter() - start
    chan.close()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="samples of each connect and round trip figure")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--unit-runs", type=int, default=3, help="runs of the N-units figure")
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "xce-testhosts"
                        / f"bench-transport-{os.getpid()}")
    args = parser.parse_args()
    problems = testhosts.missing_prerequisites(plain=True)
    if problems:
        print("cannot boot a test host here: " + "; ".join(problems), file=sys.stderr)
        return 2
    rows = [("figure", "median", "min", "max", "runs")]

    def add(name: str, xs: list[float], unit: str) -> None:
        s = summary(xs)
        rows.append((name, fmt(s["median"], unit), fmt(s["min"], unit), fmt(s["max"], unit), str(s["runs"])))
        print(f"{name}: median {fmt(s['median'], unit)}", flush=True)

    hostdir, workdir = args.dir / "host", args.dir / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        [th] = testhosts.up(1, hostdir, plain=True, die_with_caller=True)
        target = SshTarget(th.name, ssh_config=str(th.ssh_config_path), known_hosts=(),
                           agent_dir=str(workdir / "agents"), python=sys.executable)

        def ssh_connect(t: SshTarget) -> float:
            host = SshHost(th.name, t, str(workdir / "spool"), log_path=workdir / "agent.log")
            took = timed(lambda: host.connect(queue.Queue()))
            host.close()
            return took

        add("first connect (copies the agent)", [ssh_connect(target)], "s")
        add("connect", [ssh_connect(target) for _ in range(args.runs)], "s")
        shell_python = dataclasses.replace(target, python="python3")
        add("connect, python3 on PATH", [ssh_connect(shell_python) for _ in range(args.runs)], "s")

        with tempfile.TemporaryDirectory() as tmp:
            local, local_events = LocalHost("local", Path(tmp) / "spool"), queue.Queue()
            add("LocalHost connect", [timed(lambda: local.connect(local_events)) for _ in range(args.runs)], "s")
            lists, launches = round_trips(local, Path(tmp), "rt", args.runs)
            add("LocalHost list round trip", lists, "s")
            add("LocalHost launch round trip", launches, "s")
            local_rates = [run_units(local, local_events, true_units(f"n{k}", args.jobs, Path(tmp)), args.batch)
                           for k in range(args.unit_runs)]
            local.close()

        ssh, events = SshHost(th.name, target, str(workdir / "spool"), log_path=workdir / "agent.log"), queue.Queue()
        ssh.connect(events)
        lists, launches = round_trips(ssh, workdir, "rt", args.runs)
        add("ssh exec of `true` on the open connection", [exec_true(ssh) for _ in range(args.runs)], "s")
        add("ssh list round trip", lists, "s")
        add("ssh launch round trip", launches, "s")
        label = f"{args.jobs} true units, batches of {args.batch}"
        add(f"LocalHost: {label}", local_rates, "jobs/s")
        add(f"ssh to a plain host: {label}",
            [run_units(ssh, events, true_units(f"n{k}", args.jobs, workdir), args.batch)
             for k in range(args.unit_runs)], "jobs/s")
        ssh.close()
    finally:
        if (hostdir / testhosts.STATE).exists():
            testhosts.down(hostdir)
        shutil.rmtree(args.dir, ignore_errors=True)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What running jobs as their user costs a plain agent: jobs/s and CPU per job of `true` jobs
launched as the agent's user (root: posix_spawn) and as another user (the supervisor forks and
drops to the user: runas.py), through a local agent in plain mode. Must run as root.

    python bench/runas.py [--jobs 300] [--runs 3] [--user nobody]

Each run launches --jobs units in batches of 50 and waits for every finished event; the figures
are medians over the runs. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xce_lite.exec import bundle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def busy_seconds() -> float:
    user, nice, system, _idle, _iowait, irq, softirq = map(int, open("/proc/stat").readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one_run(work: Path, jobs: int, user: dict | None, tag: str) -> tuple[float, float]:
    """(jobs/s, machine CPU ms per job) of one run with a fresh agent and spool."""
    spool = work / f"spool-{tag}"
    agent = subprocess.Popen([PY, "-S", "-E", str(bundle.local_file()), "serve", "--spool", str(spool), "--mode",
                              "plain"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    rid = 0

    def send(op: str, **fields) -> None:
        nonlocal rid
        rid += 1
        agent.stdin.write(json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n")
        agent.stdin.flush()

    send("hello")
    agent.stdout.readline()
    out = work / "out"
    began, cpu, finished = time.monotonic(), busy_seconds(), 0
    for start in range(0, jobs, 50):
        units = [{"unit": f"{tag}-{i}", "argv": ["true"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(out),
                  "stdout": str(out / f"{tag}.out"), "stderr": None, **({"user": user} if user else {})}
                 for i in range(start, min(jobs, start + 50))]
        send("launch", units=units)
    while finished < jobs:
        msg = json.loads(agent.stdout.readline())
        if msg.get("event") == "finished":
            finished += 1
            if msg["result"]["exit_code"] != 0:
                raise SystemExit(f"a job failed: {msg['result']}")
        elif msg.get("ok") is True and "replies" in msg:
            refused = [r for r in msg["replies"] if r["status"] == "refused"]
            if refused:
                raise SystemExit(f"refused: {refused[0]['error']}")
    wall, used = time.monotonic() - began, busy_seconds() - cpu
    agent.stdin.close()
    agent.wait(30)
    return jobs / wall, used / jobs * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--user", default="nobody", help="an existing user to run the jobs as")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run this as root: only root runs jobs as other users")
    entry = pwd.getpwnam(args.user)
    user = {"name": entry.pw_name, "uid": entry.pw_uid, "gid": entry.pw_gid, "groups": []}
    work = Path(tempfile.mkdtemp(prefix="xce-bench-runas-", dir="/var/tmp"))
    try:
        work.chmod(0o711)
        (work / "out").mkdir()
        os.chown(work / "out", entry.pw_uid, entry.pw_gid)
        for label, who in (("as the agent's user (root)", None), (f"as {args.user}", user)):
            figures = [one_run(work, args.jobs, who, f"{'u' if who else 'r'}{run}") for run in range(args.runs)]
            rate = statistics.median(f[0] for f in figures)
            cpu = statistics.median(f[1] for f in figures)
            print(f"{label:32s} {rate:7.0f} jobs/s  {cpu:6.2f} ms CPU per job  ({args.jobs} jobs, {args.runs} runs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

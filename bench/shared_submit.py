#!/usr/bin/env python3
"""What a shared controller's submit-time check costs: the job's directories checked with the
submitter's own permissions (controller/useraccess.py: a child process with the user's
credentials runs coreutils' test), and the permission policy a route consults (permissions.py).
Must run as root.

    python bench/shared_submit.py [--runs 200] [--user nobody]

Prints medians and p95 over the runs, in milliseconds (the check) and microseconds (the policy).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xce_lite.controller import permissions, useraccess
from xce_lite.models import JobSpec


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--user", default="nobody")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the check switches to the user, as a shared controller does")
    entry = pwd.getpwnam(args.user)
    work = Path(tempfile.mkdtemp(prefix="xce-shared-bench-", dir="/var/tmp"))
    try:
        os.chmod(work, 0o755)
        mine = work / "mine"
        mine.mkdir()
        os.chown(mine, entry.pw_uid, entry.pw_gid)
        spec = JobSpec(argv=("true",), cwd=str(mine))
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        check = []
        for _ in range(args.runs):
            began = time.perf_counter()
            useraccess.check_paths(spec, entry.pw_name, entry.pw_uid, entry.pw_gid, groups)
            check.append((time.perf_counter() - began) * 1000)
        policy = permissions.Policy.of(0, True, ["boss", "@staff"], {"lab": ["carol"], "lab/vision": ["dave"]},
                                       "summary")
        who = permissions.Who(entry.pw_name, entry.pw_uid, frozenset({"users"}))
        decide = []
        for _ in range(args.runs):
            began = time.perf_counter()
            for _ in range(100):
                permissions.may("kill", who, "alice", "lab/vision/gpu", policy)
            decide.append((time.perf_counter() - began) * 1e6 / 100)
        print(f"directory check as {args.user} (per submit request): median {statistics.median(check):.2f} ms, "
              f"p95 {p95(check):.2f} ms over {args.runs} runs")
        print(f"permission decision (kill, project 3 deep, refused): median {statistics.median(decide):.2f} us, "
              f"p95 {p95(decide):.2f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

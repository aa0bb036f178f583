#!/usr/bin/env python3
"""A TERM trap's child when a direct unit is stopped: how often systemd's control-group sweep kills it.

    python bench/stop_sweep.py [--units 60] [--quota 0.4]

Needs root. Boots one systemd test host (xce_lite.testhosts) under ~/.cache/xce-testhosts/
stop-sweep-PID and stops it BY PID at the end. In it, --units transient units per variant are
started, each a shell that traps TERM, makes a marker file in the trap and exits 0, waiting on a
`sleep` meanwhile (the jobs of tests/e2e/test_trust_kills.py), with KillMode=control-group (a direct
unit's); then each is stopped (`systemctl stop`: TERM to every process of the unit, and systemd
sweeps the cgroup again until it finds none it has not signalled), and the markers are counted.
Variant `touch`: the trap forks `touch` to make it; `builtin`: the shell makes it itself (`: >`).
With --quota Q (CPUs, e.g. 0.4) this process first moves into a cpu cgroup of its own with that CFS
quota, so that its hosts (whose cgroups are made under the caller's) run as on a busy box while the
rest of the machine is left alone; the cgroup is removed at the end.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)

from xce_lite import testhosts

TRAPS = {"touch": 'trap "touch {m}; exit 0" TERM; sleep 300 & wait',
         "builtin": 'trap ": > {m}; exit 0" TERM; sleep 300 & wait'}


def quota_cgroup(cpus: float) -> tuple[Path, Path]:
    """Move this process into a new child of its cgroup in the cpu hierarchy (v1, as on this machine's
    hybrid layout, or v2) with a CFS quota of `cpus`: (the new cgroup, the one it left)."""
    v1 = next((Path(p) for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct") if Path(p, "tasks").exists()),
              None)
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 is not None and "cpu" in controllers.split(",")) or (v1 is None and controllers == ""):
            left = (v1 or Path("/sys/fs/cgroup")) / path.lstrip("/")
            break
    else:
        raise SystemExit("no cpu cgroup hierarchy found for --quota")
    mine = left / f"stop-sweep-{os.getpid()}"
    mine.mkdir()
    if v1 is not None:
        (mine / "cpu.cfs_quota_us").write_text(str(round(cpus * 100_000)))
    else:
        (mine / "cpu.max").write_text(f"{round(cpus * 100_000)} 100000")
    (mine / "cgroup.procs").write_text(str(os.getpid()))
    return mine, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=60)
    parser.add_argument("--quota", type=float, default=None, help="CPUs for this bench's processes (CFS quota)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/stop_sweep.py needs root (it boots a systemd test host): run it as root", file=sys.stderr)
        return 1
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; quota {args.quota or 'none'}", flush=True)
    cgroup = quota_cgroup(args.quota) if args.quota else None
    base = testhosts.DEFAULT_DIR.parent / f"stop-sweep-{os.getpid()}"
    try:
        [host] = testhosts.up(1, base, die_with_caller=True, prefix="s")
        marks = base / "marks"
        marks.mkdir()
        for variant, trap in TRAPS.items():
            units = [f"stop-sweep-{variant}-{i}" for i in range(args.units)]
            script = [f"systemd-run -q --unit={u} -p KillMode=control-group -p TimeoutStopSec=5 "
                      f"sh -c '{trap.format(m=marks / u)}'" for u in units]
            script += ["sleep 1"] + [f"systemctl stop {u}" for u in units]  # each has set its trap by then
            done = subprocess.run(host.nsenter_argv(["sh", "-c", "\n".join(script)]), capture_output=True,
                                  text=True, timeout=600)
            if done.returncode != 0:
                print(f"{variant}: the host's script failed: {done.stderr.strip()[-800:]}", file=sys.stderr)
            made = sum((marks / u).exists() for u in units)
            print(f"{variant:8} {made} of {args.units} markers made; load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        testhosts.down(base)
        shutil.rmtree(base, ignore_errors=True)
        if cgroup is not None:
            (cgroup[1] / "cgroup.procs").write_text(str(os.getpid()))
            cgroup[0].rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())

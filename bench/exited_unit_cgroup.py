#!/usr/bin/env python3
"""Is an exited unit's cgroup still there for the agent to read its accounting? (issue 18, sysd3)

    python bench/exited_unit_cgroup.py

Needs root: it boots one systemd test host (xce_lite.testhosts) under ~/.cache/xce-testhosts/
exited-cgroup-PID and stops it BY PID at the end. Inside it, over the manager's private socket (the
agent's dbus.py), it starts units as the agent starts a direct unit whose end it records itself
(RemainAfterExit=yes, CollectMode=inactive, MemoryAccounting=yes, DelegateControllers= empty, no
ExecStopPost), with CPUAccounting no and yes: a job that touches 60 MB, burns 0.3 s of CPU, then
sleeps 1.5 s; the same under MemoryMax=30M (killed: failed); and `exit 3` (failed). For each it
prints ControlGroup, CPUUsageNSec and MemoryCurrent, and the accounting files the stop script reads
(cpu.stat, cpuacct.usage, memory.max_usage_in_bytes, memory.oom_control, memory.peak,
memory.events) found in any hierarchy: while the job runs, then once the unit is exited or failed.
Seen with systemd 252 (hybrid): every directory is gone once the unit is exited or failed
(service.c prunes the cgroup on entering "exited"), so an agent cannot read what STOP_SCRIPT reads.
Asserts nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)

from xce_lite import testhosts

PY = "/usr/bin/python3"
JOB = """import time
b = bytearray(60 * 2**20)
for i in range(0, len(b), 4096):
    b[i] = 1
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
time.sleep(float(__import__("sys").argv[1]))
"""
INNER = r"""
import glob, os, sys, time
sys.path.insert(0, sys.argv[1])
from xce_lite.exec.agent.dbus import Bus
job = sys.argv[2]
bus = Bus("/run/systemd/private")
FILES = ("cpu.stat", "cpuacct.usage", "memory.max_usage_in_bytes", "memory.oom_control", "memory.peak",
         "memory.events")

def start(name, extra, argv):
    props = [("Type", ("s", "exec")), ("CollectMode", ("s", "inactive")), ("RemainAfterExit", ("b", True)),
             ("MemoryAccounting", ("b", True)), ("DelegateControllers", ("as", [])),
             ("ExecStart", ("a(sasb)", [(argv[0], argv, False)]))] + extra
    bus.call("StartTransientUnit", "ssa(sv)a(sa(sv))", (name + ".service", "fail", props, []))

def show(name):
    path = bus.call("GetUnit", "s", (name + ".service",))[0]
    get = lambda iface: bus.call("GetAll", "s", ("org.freedesktop.systemd1." + iface,), path=path,
                                 interface="org.freedesktop.DBus.Properties")[0]
    unit, service = get("Unit"), get("Service")
    nothing = (1 << 64) - 1
    value = lambda k: "-" if service[k][1] == nothing else service[k][1]
    print(f"  {name}: {unit['ActiveState'][1]}/{unit['SubState'][1]} Result={service['Result'][1]} "
          f"ControlGroup={service['ControlGroup'][1]!r} CPUUsageNSec={value('CPUUsageNSec')} "
          f"MemoryCurrent={value('MemoryCurrent')}")
    dirs = sorted(glob.glob(f"/sys/fs/cgroup/*/system.slice/{name}.service"))
    for d in dirs:
        found = {f: open(os.path.join(d, f)).readline().strip() for f in FILES if os.path.exists(os.path.join(d, f))}
        print(f"    {d.split('/')[4]}: {found or 'no accounting file'}")
    if not dirs:
        print(f"    no /sys/fs/cgroup/*/system.slice/{name}.service in any hierarchy")

job_argv = lambda pause: ["/usr/bin/python3", job, pause]
start("exited-cpuacct-no", [("CPUAccounting", ("b", False))], job_argv("1.5"))
start("exited-cpuacct-yes", [("CPUAccounting", ("b", True))], job_argv("1.5"))
time.sleep(1.0)
print("while the job runs:")
for name in ("exited-cpuacct-no", "exited-cpuacct-yes"):
    show(name)
start("failed-oom", [("MemoryMax", ("t", 30 * 2**20))], job_argv("0"))
start("failed-exit3", [], ["/bin/sh", "-c", "exit 3"])
time.sleep(3.0)
print("once over:")
for name in ("exited-cpuacct-no", "exited-cpuacct-yes", "failed-oom", "failed-exit3"):
    show(name)
"""


def main() -> int:
    if os.geteuid() != 0:
        print("bench/exited_unit_cgroup.py needs root (it boots a systemd test host): run it as root", file=sys.stderr)
        return 1
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    base = testhosts.DEFAULT_DIR.parent / f"exited-cgroup-{os.getpid()}"
    try:
        [host] = testhosts.up(1, base, die_with_caller=True, prefix="c")
        (base / "job.py").write_text(JOB)
        version = subprocess.run(host.nsenter_argv(["systemctl", "--version"]), capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()[:1]
        print(f"{host.name} up: {' '.join(version)}, kernel {os.uname().release}", flush=True)
        done = subprocess.run(host.nsenter_argv([PY, "-c", INNER, ROOT, str(base / "job.py")]),
                              capture_output=True, text=True, timeout=300)
        print(done.stdout, end="")
        if done.returncode != 0:
            print(f"the probe failed in the host: {done.stderr.strip()[-800:]}", file=sys.stderr)
            return 1
    finally:
        testhosts.down(base)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

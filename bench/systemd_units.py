#!/usr/bin/env python3
"""What one transient unit costs the service manager, property by property (issue 18).

    python bench/systemd_units.py [--runs 3] [--units 150] [--variants bare,stop_post,...]

Needs root: it boots one systemd test host (xce_lite.testhosts) under ~/.cache/xce-testhosts/
bench-units-PID and stops it BY PID at the end. Inside the host one Python process (entered with
nsenter once) starts --units `true` units over the manager's private socket (the agent's dbus.py),
ONE AT A TIME as a host with one slot runs jobs: StartTransientUnit, then wait for its UnitRemoved.
Each variant adds one thing to the bare unit (Type=exec, CollectMode=inactive-or-failed,
ExecStart=/bin/true), so the figures say what each costs (the stop_* variants' journal and record
files lie on the machine's disk, in the host's directory, as a spool does). Printed per variant,
medians of --runs runs interleaved: wall ms per unit (start -> removed), PID 1's CPU ms per unit (/proc/1/stat), and
the whole host's CPU ms per unit (its cpuacct cgroup on this machine: PID 1, the units, the loop).
The CPU figures are what to compare on a busy machine; the wall figures move with its load. A unit
gone without its UnitRemoved seen (a second with no message, then GetUnit says no such unit) is
counted and printed: seen here under load, not understood yet.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)

from remote_cpu import HostCpu

from xce_lite import testhosts

PY = "/usr/bin/python3"
VARIANTS = {
    "bare": "Type=exec, CollectMode=inactive-or-failed, ExecStart=/bin/true",
    "stop_post": "+ ExecStopPost=/bin/true (a direct unit's record is written by one)",
    "stop_sh": "+ ExecStopPost=/bin/sh -c : (the shell that runs a direct unit's stop script, doing nothing)",
    "stop_flock_sync": "+ ExecStopPost=/bin/sh appending a line to a journal under `flock -s`, then `exec sync -d` "
                       "(the stop script's execs until branch sysd4); the loop fdatasyncs the journal, as the agent",
    "stop_file": "+ ExecStopPost=/bin/sh writing the line to a file of its own with builtins; the loop appends "
                 "it to the journal and fdatasyncs that, as the agent does since branch sysd4",
    "sh_start": "+ ExecStart=/bin/sh -c 'exec true' (a direct unit's EXEC_SCRIPT is one /bin/sh)",
    "memory_acct": "+ MemoryAccounting=yes",
    "delegate_all": "+ Delegate=yes (every controller: the agent's units before issue 18's change)",
    "delegate_none": "+ DelegateControllers= (delegated, no controller: the agent's units now)",
    "one_more_bus": "+ one more idle connection to the private socket (the manager signals it too)",
    "kept_released": "+ RemainAfterExit=yes, CollectMode=inactive, and a StopUnit once its PropertiesChanged say "
                     "it exited (a direct unit whose end the agent records: no ExecStopPost)",
}
LINE = 'printf \'{"event":"finished","unit":"%s","result":{"exit_code":%s}}\\n\' "$SERVICE_RESULT" "$EXIT_STATUS"'
FLOCK_SYNC = f'exec 3>>"$0" && flock -s 3 || exit 1; {LINE} >&3; exec 3>&-; exec sync -d "$0"'
TO_FILE = f'umask 077; {LINE} > "$0"'
EXTRA = {
    "memory_acct": [("MemoryAccounting", ("b", True))],
    "delegate_all": [("Delegate", ("b", True))],
    "delegate_none": [("DelegateControllers", ("as", []))],
    "stop_post": [("ExecStopPost", ("a(sasb)", [("/bin/true", ["true"], True)]))],
    "stop_sh": [("ExecStopPost", ("a(sasb)", [("/bin/sh", ["sh", "-c", ":"], True)]))],
    "stop_flock_sync": [("ExecStopPost", ("a(sasb)", [("/bin/sh", ["sh", "-c", FLOCK_SYNC, "@J@"], True)]))],
    "stop_file": [("ExecStopPost", ("a(sasb)", [("/bin/sh", ["sh", "-c", TO_FILE, "@F@"], True)]))],
    "kept_released": [("RemainAfterExit", ("b", True))],
}
LOOP = r"""
import json, os, select, sys, time
sys.path.insert(0, sys.argv[1])
from xce_lite.exec.agent.dbus import DBUS_SIGNAL, Bus, DBusError, unit_path
variant, n, extra, work = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
journal = os.path.join(work, f"journal-{os.getpid()}")
jfd = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
extra = [(k, tuple(v)) for k, v in extra]
extra = [(k, (v[0], [tuple(x) for x in v[1]])) if v[0].startswith("a(") else (k, v) for k, v in extra]
bus = Bus("/run/systemd/private")
bus.call("Subscribe")  # without it this loop waited for UnitRemoved in vain (the agent, which sends no
# Subscribe, gets them: not looked into further)
others = [Bus("/run/systemd/private")] if variant == "one_more_bus" else []
start = ("/bin/sh", ["sh", "-c", "exec true"], False) if variant == "sh_start" else ("/bin/true", ["true"], False)
collect = "inactive" if variant == "kept_released" else "inactive-or-failed"
base = [("Type", ("s", "exec")), ("CollectMode", ("s", collect)), ("ExecStart", ("a(sasb)", [start]))]
def pid1_cpu():
    fields = open("/proc/1/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
cpu, t, missed = pid1_cpu(), time.perf_counter(), 0
for i in range(n):
    name = f"bench-units-{variant.replace('_', '-')}-{os.getpid()}-{i}.service"
    if variant == "kept_released":  # as the agent does: its PropertiesChanged read, released once exited
        bus.watch = {unit_path(name)}
    record = os.path.join(work, name)
    props = [(k, (v[0], [(p, [a.replace("@J@", journal).replace("@F@", record) for a in argv], f)
                         for p, argv, f in v[1]])) if k == "ExecStopPost" else (k, v) for k, v in extra]
    bus.call("StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", base + props, []))
    gone = False
    while not gone:
        for m in bus.backlog + bus.read():
            gone = gone or (m.kind == DBUS_SIGNAL and m.member == "UnitRemoved" and m.body[:1] == [name])
            if m.path is not None and m.interface.endswith(".Unit"):  # let go once over, as the agent does
                if m.prop("SubState") == "exited":
                    bus.send("StopUnit", "ss", (name, "replace"))
                elif m.prop("ActiveState") == "failed":
                    bus.send("ResetFailedUnit", "s", (name,))
                bus.write()
        bus.backlog = []
        if gone and variant == "stop_file":  # the agent's part: the unit's line into the journal
            with open(record, "rb") as f:
                os.write(jfd, f.read())
            os.unlink(record)
        if gone and variant in ("stop_file", "stop_flock_sync"):
            os.fdatasync(jfd)  # the agent makes a result durable before it reports it
        for other in others:
            other.read()  # as an agent's connection would be read
        if not gone and not select.select([bus.fileno()], [], [], 1.0)[0]:
            try:  # a second without a word: is the unit still there? (see `missed`)
                path = bus.call("GetUnit", "s", (name,))[0]
                if variant == "kept_released":  # kept, and its end not seen: say so, and let it go
                    state = bus.call("Get", "ss", ("org.freedesktop.systemd1.Unit", "SubState"), path=path,
                                     interface="org.freedesktop.DBus.Properties")[0][1]
                    print(f"{name}: {state} with no end seen", file=sys.stderr)
                    bus.send("StopUnit", "ss", (name, "replace"))
                    bus.send("ResetFailedUnit", "s", (name,))
            except DBusError:
                gone, missed = True, missed + 1
os.close(jfd)
os.unlink(journal)
print(json.dumps({"wall": (time.perf_counter() - t) / n, "pid1": (pid1_cpu() - cpu) / n, "missed": missed}))
"""


def one(host: testhosts.TestHost, cpu: HostCpu, variant: str, units: int, work: Path) -> dict:
    before = cpu()
    done = subprocess.run(host.nsenter_argv([PY, "-c", LOOP, ROOT, variant, str(units),
                                             json.dumps(EXTRA.get(variant, [])), str(work)]),
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed in the host: {done.stderr.strip()[-800:]}")
    out = json.loads(done.stdout)
    if out["missed"]:  # their wall time holds a second of waiting each: say so beside the figure
        print(f"  ({variant}: {out['missed']} of {units} units were gone without a UnitRemoved seen)", flush=True)
    return {"wall": out["wall"] * 1000, "pid1": out["pid1"] * 1000, "host": (cpu() - before) / units * 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--units", type=int, default=150)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {','.join(VARIANTS)}")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if set(variants) - set(VARIANTS):
        parser.error(f"--variants takes a comma-separated list of {', '.join(VARIANTS)}")
    if os.geteuid() != 0:
        print("bench/systemd_units.py needs root (it boots a systemd test host): run it as root", file=sys.stderr)
        return 1
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    base = testhosts.DEFAULT_DIR.parent / f"bench-units-{os.getpid()}"
    figures: dict[str, list[dict]] = {v: [] for v in variants}
    try:
        [host] = testhosts.up(1, base, die_with_caller=True, prefix="u")
        cpu = HostCpu(host)
        print(f"{host.name} up; warming", flush=True)
        work = base / "work"  # the journal and records: on the machine's disk, as a spool is (not a tmpfs)
        work.mkdir()
        one(host, cpu, "bare", 10, work)  # warm
        for run in range(args.runs):
            for variant in variants[run % len(variants):] + variants[:run % len(variants)]:
                o = one(host, cpu, variant, args.units, work)
                figures[variant].append(o)
                print(f"run {run + 1} {variant}: {o['wall']:.2f} ms wall, PID 1 {o['pid1']:.2f} ms CPU, "
                      f"host {o['host']:.2f} ms CPU per unit; load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        testhosts.down(base)
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{args.units} units one at a time, medians of {args.runs} runs; load at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  {'variant':14} {'wall ms':>8} {'PID 1 ms':>9} {'host ms':>8}  what")
    for variant, xs in figures.items():
        med = {k: statistics.median(x[k] for x in xs) for k in ("wall", "pid1", "host")}
        print(f"  {variant:14} {med['wall']:8.2f} {med['pid1']:9.2f} {med['host']:8.2f}  {VARIANTS[variant]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What one transient unit costs the service manager, property by property (issue 18).

    python bench/systemd_units.py [--runs 3] [--units 150] [--variants bare,stop_post,...]
    python bench/systemd_units.py --runs 5 --units 200 --variants direct,direct-stop,direct-delegate,bare
    python bench/systemd_units.py --variants direct,direct_agent,direct_sentinel [--show-record]

Needs root: it boots one systemd test host (xce_lite.testhosts) under ~/.cache/xce-testhosts/
bench-units-PID and stops it BY PID at the end. Inside the host one Python process (entered with
nsenter once) starts --units `true` units over the manager's private socket (the agent's dbus.py),
ONE AT A TIME as a host with one slot runs jobs: StartTransientUnit, then wait for its UnitRemoved.
Each variant adds one thing to the bare unit (Type=exec, CollectMode=inactive-or-failed,
ExecStart=/bin/true), so the figures say what each costs (the stop_* variants' journal and record
files lie on the machine's disk, in the host's directory, as a spool does). `direct` is the agent's
own direct unit (manager.unit_properties on a stand-in state, `unit` records), its directory, env
file and record handled as the agent does; `direct-NAME(-NAME...)` is it without the properties
DROPS names (`direct-stop`: no ExecStopPost), so what each property costs is told on the real unit.
`direct_agent` and `direct_sentinel`: see VARIANTS. Printed per variant,
medians of --runs runs interleaved: wall ms per unit (start -> removed), PID 1's CPU ms per unit
(/proc/1/stat), the whole host's CPU ms per unit (its cpuacct cgroup on this machine: PID 1, the
units, the loop), and the machine's (/proc/stat: everything on the shared box, kernel threads too).
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
from stats import machine_busy_seconds

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
    "direct": "the agent's own direct unit of a `true` job (manager.unit_properties: exec script, stop script, "
              "env file, output file), its record appended to a journal and fdatasync'ed as the agent does",
    "direct_bus": "direct, and one more idle connection to the private socket (read as the agent's is)",
    "direct_agent": "the agent's direct unit with `--records agent`: no ExecStopPost, RemainAfterExit, its end "
                    "from PropertiesChanged, recorded (fdatasync'ed), then released (no accounting)",
    "direct_sentinel": "direct_agent, whose exec script first double-forks a `sh` that waits on a fifo and, on the "
                       "TERM of the release, writes the unit's CPU time, peak memory and OOM count from its cgroup "
                       "(a what-if, SENTINEL: accounting without an ExecStopPost; not in xce_lite)",
}
# direct-NAME(-NAME...): the direct unit without the properties named (DROPS), to tell what each costs
DROPS = {
    "delegate": ("DelegateControllers",), "memacct": ("MemoryAccounting",), "cpuacct": ("CPUAccounting",),
    "stop": ("ExecStopPost", "ExecStopPostEx"), "output": ("StandardOutputFileToAppend", "StandardErrorFileToAppend"),
    "cwd": ("WorkingDirectory",), "sigpipe": ("IgnoreSIGPIPE",), "umask": ("UMask",), "kill": ("KillMode",),
    "timeout": ("TimeoutStopUSec",), "collect": ("CollectMode",), "type": ("Type",),
}
LINE = 'printf \'{"event":"finished","unit":"%s","result":{"exit_code":%s}}\\n\' "$SERVICE_RESULT" "$EXIT_STATUS"'
FLOCK_SYNC = f'exec 3>>"$0" && flock -s 3 || exit 1; {LINE} >&3; exec 3>&-; exec sync -d "$0"'
TO_FILE = f'umask 077; {LINE} > "$0"'
EXTRA: dict[str, list] = {
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
import json, os, select, shutil, sys, time
sys.path.insert(0, sys.argv[1])
from xce_lite.exec.agent.dbus import DBUS_SIGNAL, Bus, DBusError, unit_path
variant, n, extra, work = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
journal = os.path.join(work, f"journal-{os.getpid()}")
jfd = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
extra = [(k, tuple(v)) for k, v in extra]
extra = [(k, (v[0], [tuple(x) for x in v[1]])) if v[0].startswith("a(") else (k, v) for k, v in extra]
direct = variant.startswith("direct")  # `extra` is the whole unit, @UNIT@ and @DIR@ to be filled in
bus = Bus("/run/systemd/private")
bus.call("Subscribe")  # without it this loop waited for UnitRemoved in vain (the agent, which sends no
# Subscribe, gets them: not looked into further)
others = [Bus("/run/systemd/private")] if variant in ("one_more_bus", "direct_bus") else []
start = ("/bin/sh", ["sh", "-c", "exec true"], False) if variant == "sh_start" else ("/bin/true", ["true"], False)
kept = variant in ("kept_released", "direct_agent", "direct_sentinel")  # RemainAfterExit: released once over
collect = "inactive" if kept else "inactive-or-failed"
base = [("Type", ("s", "exec")), ("CollectMode", ("s", collect)), ("ExecStart", ("a(sasb)", [start]))]
def pid1_cpu():
    fields = open("/proc/1/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
cpu, t, missed, taken, last = pid1_cpu(), time.perf_counter(), 0, 0, b""
for i in range(n):
    name = f"bench-units-{variant.replace('_', '-')}-{os.getpid()}-{i}.service"
    if kept:  # as the agent does: its PropertiesChanged read, released once exited
        bus.watch = {unit_path(name)}
    record = os.path.join(work, name)
    if direct:  # as the agent's launch_unit: the unit's directory and the job's env file, then the unit
        unit = name.removesuffix(".service")
        record = os.path.join(work, "units", unit)
        os.makedirs(record, mode=0o700)
        with open(os.path.join(record, "job-env.sh"), "w") as f:
            f.write("export PATH='/usr/sbin:/usr/bin:/sbin:/bin'\nset -- 'true'\n")
        if variant == "direct_sentinel":
            os.mkfifo(os.path.join(record, "fifo"), 0o600)
        fill = lambda a: a.replace("@UNIT@", unit).replace("@DIR@", record)
        props = [(k, (v[0], [(fill(p), [fill(a) for a in argv], f) for p, argv, f in v[1]]))
                 if k.startswith("Exec") else (k, v) for k, v in extra]
        bus.call("StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", props, []))
    else:
        props = [(k, (v[0], [(p, [a.replace("@J@", journal).replace("@F@", record) for a in argv], f)
                         for p, argv, f in v[1]])) if k == "ExecStopPost" else (k, v) for k, v in extra]
    if not direct:
        bus.call("StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", base + props, []))
    gone = recorded = False
    while not gone:
        for m in bus.backlog + bus.read():
            gone = gone or (m.kind == DBUS_SIGNAL and m.member == "UnitRemoved" and m.body[:1] == [name])
            if m.path is not None and m.interface.endswith(".Service"):
                service = m  # its ExecMain* and Result, read when the unit's state says it is over
            if m.path is not None and m.interface.endswith(".Unit"):  # let go once over, as the agent does
                over = m.prop("SubState") == "exited" or m.prop("ActiveState") == "failed"
                if over and variant == "direct_agent" and not recorded:  # the agent records its end, then releases
                    recorded = True
                    props = {k: service.prop(k) for k in ("Result", "ExecMainCode", "ExecMainStatus")}
                    taken += os.write(jfd, json.dumps(props).encode() + b"\n") > 0
                    os.fdatasync(jfd)
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
                if kept:  # kept, and its end not seen: say so, and let it go
                    state = bus.call("Get", "ss", ("org.freedesktop.systemd1.Unit", "SubState"), path=path,
                                     interface="org.freedesktop.DBus.Properties")[0][1]
                    print(f"{name}: {state} with no end seen", file=sys.stderr)
                    bus.send("StopUnit", "ss", (name, "replace"))
                    bus.send("ResetFailedUnit", "s", (name,))
            except DBusError:
                gone, missed = True, missed + 1
    if direct and variant != "direct_agent":  # the agent's part: the unit's record into the journal
        try:
            with open(os.path.join(record, "acct" if variant == "direct_sentinel" else "finished"), "rb") as f:
                last = f.read()
                taken += os.write(jfd, last) > 0
        except FileNotFoundError:  # no stop script (direct-stop): nothing to take
            pass
        os.fdatasync(jfd)
    if direct:
        shutil.rmtree(record)
os.close(jfd)
os.unlink(journal)
print(json.dumps({"wall": (time.perf_counter() - t) / n, "pid1": (pid1_cpu() - cpu) / n, "missed": missed,
                  "taken": taken, "last": last.decode()}))
"""


# The what-if sentinel: forked twice (so that it is no child of the job, which might wait for every child
# it has), it blocks on a fifo it holds open for writing too (no EOF, no fd in the job) until the TERM
# that stops the unit, then writes what the stop script reads from the unit's cgroup (v1 or v2).
SENTINEL = r"""[ -r "$1" ] || exit 126
d=${1%/*}
( ( trap 'acct; exit 0' TERM
    acct() {
      cpu=0 peak=0 oom=0
      while IFS=: read -r _ c p; do
        case ,$c, in
          ,,) g=/sys/fs/cgroup/unified$p; [ -r "$g/cpu.stat" ] && while read -r k v; do
                [ "$k" = usage_usec ] && cpu=$((v * 1000)); done < "$g/cpu.stat" ;;
          *,cpuacct,*) g=/sys/fs/cgroup/$c$p; [ -r "$g/cpuacct.usage" ] && read -r cpu < "$g/cpuacct.usage" ;;
          *,memory,*) g=/sys/fs/cgroup/memory$p
            [ -r "$g/memory.max_usage_in_bytes" ] && read -r peak < "$g/memory.max_usage_in_bytes"
            [ -r "$g/memory.oom_control" ] && while read -r k v; do [ "$k" = oom_kill ] && oom=$v
            done < "$g/memory.oom_control" ;;
        esac
      done < /proc/self/cgroup
      printf '{"cpu":%d,"peak":%d,"oom":%d}\n' "$cpu" "$peak" "$oom" > "$d/acct"
    }
    exec 3<>"$d/fifo"
    read -r _ <&3 ) </dev/null >/dev/null 2>&1 & )
. "$1"
exec "$@"
"""


def direct_unit(work: Path, drops: list[str], records: str = "unit") -> list:
    """The properties of the agent's direct unit of a `true` job in `work` (its spool), as
    manager.unit_properties makes them on this hybrid host, less those DROPS names; @UNIT@ and @DIR@
    for the unit's name and directory."""
    from types import SimpleNamespace

    from xce_lite.exec.agent.manager import Manager
    from xce_lite.exec.agent.systemd import boot_epoch_cs, unit_scripts

    (work / "bin").mkdir(exist_ok=True)
    (work / "out").touch()
    state = SimpleNamespace(host={"cgroup": "hybrid", "direct_records": records}, mode="systemd",
                            scripts=unit_scripts(str(work), "hybrid"), boot_cs=boot_epoch_cs())
    spec = {"unit": "@UNIT@", "host_dir": "@DIR@", "grace": 10.0, "cwd": "/", "stdout": str(work / "out"),
            "stderr": None, "start_time": 1.0}
    gone = {name for drop in drops for name in DROPS[drop]}
    props = Manager(state, None, None).unit_properties(spec, True)  # type: ignore[arg-type]
    return [(k, v) for k, v in props if k not in gone]


def one(host: testhosts.TestHost, cpu: HostCpu, variant: str, units: int, work: Path,
        show_record: bool = False) -> dict:
    before, busy = cpu(), machine_busy_seconds()
    extra: list
    if variant in ("direct_agent", "direct_sentinel"):
        extra = direct_unit(work, [], "agent")
        if variant == "direct_sentinel":
            (work / "bin" / "sentinel.sh").write_text(SENTINEL)
            extra = [(k, ("a(sasb)", [("/bin/sh", ["sh", str(work / "bin" / "sentinel.sh"), "@DIR@/job-env.sh"],
                                      False)])) if k == "ExecStart" else (k, v) for k, v in extra]
    elif variant.startswith("direct"):
        extra = direct_unit(work, [] if variant == "direct_bus" else variant.split("-")[1:])
    else:
        extra = EXTRA.get(variant, [])
    done = subprocess.run(host.nsenter_argv([PY, "-c", LOOP, ROOT, variant, str(units),
                                             json.dumps(extra), str(work)]),
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed in the host: {done.stderr.strip()[-800:]}")
    out = json.loads(done.stdout)
    if out["missed"]:  # their wall time holds a second of waiting each: say so beside the figure
        print(f"  ({variant}: {out['missed']} of {units} units were gone without a UnitRemoved seen)", flush=True)
    if show_record and out["last"]:
        print(f"  ({variant}'s last record: {out['last'].strip()})")
    if variant.startswith("direct") and "stop" not in variant.split("-") and out["taken"] != units:
        print(f"  ({variant}: {units - out['taken']} of {units} units left no record)", flush=True)
    return {"wall": out["wall"] * 1000, "pid1": out["pid1"] * 1000, "host": (cpu() - before) / units * 1000,
            "machine": (machine_busy_seconds() - busy) / units * 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--units", type=int, default=150)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--show-record", action="store_true", help="print each run's last record (direct variants)")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    known = set(VARIANTS) | {v for v in variants if v.startswith("direct-") and set(v.split("-")[1:]) <= set(DROPS)}
    if set(variants) - known:
        parser.error(f"--variants takes a comma-separated list of {', '.join(VARIANTS)}, or direct-NAME(-NAME...) "
                     f"with NAMEs of {', '.join(DROPS)}")
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
                o = one(host, cpu, variant, args.units, work, args.show_record)
                figures[variant].append(o)
                print(f"run {run + 1} {variant}: {o['wall']:.2f} ms wall, PID 1 {o['pid1']:.2f} ms CPU, "
                      f"host {o['host']:.2f} ms, machine {o['machine']:.2f} ms CPU per unit; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        testhosts.down(base)
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{args.units} units one at a time, medians of {args.runs} runs; load at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  {'variant':14} {'wall ms':>8} {'PID 1 ms':>9} {'host ms':>8} {'machine':>8}  what")
    for variant, xs in figures.items():
        med = {k: statistics.median(x[k] for x in xs) for k in ("wall", "pid1", "host", "machine")}
        what = VARIANTS.get(variant) or f"the direct unit without {', '.join(variant.split('-')[1:])}"
        print(f"  {variant:14} {med['wall']:8.2f} {med['pid1']:9.2f} {med['host']:8.2f} {med['machine']:8.2f}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

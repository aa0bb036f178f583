#!/usr/bin/env python3
"""Issue 18's remote goals in one run: local, plain ssh hosts, systemd ssh hosts and a bare
`systemd-run` loop on those same systemd hosts, interleaved, with the two ratios met / MISSED.

    python bench/remote.py                          # ~4 minutes on the 2-core box, as root
    python bench/remote.py --runs 5 --jobs 1000 --slots 2
    python bench/remote.py --latency 20 --pending 10000   # the optional figures too
    python bench/remote.py --kinds systemd,floor          # only these (boots only the hosts they need)
    python bench/remote.py --kinds systemd,floor --direct-records agent   # the agent records direct units' ends

Needs root (it boots two systemd and two plain test hosts, xce_lite.testhosts, under
~/.cache/xce-testhosts/bench-remote-PID, and stops them BY PID at the end, whatever happens).
bench/run.py runs the same as its section `remote` (`--only remote`), and says why it skips it.

Three controllers (temporary homes in /tmp), all up for the whole run, each given the SAME job
count and the SAME slots in total (--slots, default 2 as run.py's local host): `local`, the
embedded one-host cluster as run.py's sections 1-2 have it; `plain`, two plain test hosts over
SSH (`type: ssh`, slots split between them); `systemd`, two systemd test hosts over SSH. Each run
takes, in an order that rotates from run to run, one batch POST of --jobs `true` jobs on each
controller (POST -> last job DONE: jobs/s), and `floor`: a bare loop of
`systemd-run --no-block --quiet true` inside each systemd host (one process entered with nsenter,
so no nsenter per unit), --jobs / 2 units on each, both hosts at once, until each manager has no
job queued: units/s of the two hosts together, what the same hosts give without xce_lite.

The goals (issue 18): plain >= 0.5x local; systemd >= 0.8x the floor; ratios of the medians of
this run. Beside each rate: the machine's busy CPU per job (/proc/stat, everything on the box),
and per party (controller, ssh gateway, agents, the hosts' sshd; the systemd hosts' own cgroup:
PID 1, the units). Asserts nothing; the machine is shared: compare figures within one run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, is_agent, machine_busy_seconds, proc_status, wait_done, wait_idle
from remote_cpu import HostCgroupCpu, agent_pids, cpu_by_pid, cpu_spent, named_pids
from report import Report, remote_goals, section
from stats import table

from xce_lite import testhosts

PY = "/usr/bin/python3"
KINDS = ("local", "plain", "systemd", "floor")
SYSTEMD_RUN_LOOP = """
import subprocess, sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    subprocess.run(["systemd-run", "--no-block", "--quiet", "true"], check=True)
while subprocess.run(["systemctl", "show", "-p", "NJobs", "--value"], capture_output=True,
                     text=True).stdout.strip() != "0":
    time.sleep(0.001)
print(time.perf_counter() - t)
"""


def why_not() -> str | None:
    """Why this machine cannot run the remote figures, or None."""
    if os.geteuid() != 0:
        return "needs root (it boots systemd test hosts in namespaces): run as root"
    problems = testhosts.missing_prerequisites(plain=False)
    return "; ".join(problems) if problems else None


def config(kind: str, hosts: list[testhosts.TestHost], slots: int, more: str = "") -> str:
    """`slots` in total, spread over the hosts (the first ones take what does not divide); `more`:
    further fields of each host's entry."""
    each = [slots // len(hosts) + (1 if i < slots % len(hosts) else 0) for i in range(len(hosts))]
    entries = "".join(f"  - {{name: {h.name}, type: ssh, address: '{h.ip}', user: root, identity: '{h.key_path}', "
                      f"slots: {n}, mem: 4G{more}}}\n" for h, n in zip(hosts, each))
    known = ", ".join(f"'{h.known_hosts_path}'" for h in hosts)
    return (f"cluster: br{kind[0]}{os.getpid()}\nhosts:\n{entries}queues:\n  - {{name: normal, default: true}}\n"
            f"ssh: {{config: /nonexistent, known_hosts: [{known}]}}\ncontroller: {{tick: 1s, grace: 2s}}\n")


# ---- the parties of one run ----------------------------------------------------------------------


class Side:
    """One controller of the run with its hosts (none: the local host), and how to time a batch."""

    def __init__(self, kind: str, c: BenchCluster, hosts: list[testhosts.TestHost]):
        self.kind, self.c, self.hosts = kind, c, hosts
        self.host_cpu = HostCgroupCpu(hosts) if kind == "systemd" else None

    def parties(self) -> dict[str, list[int]]:
        if not self.hosts:
            return {"ctl": [self.c.pid],
                    "agents": [p.pid for p in self.c.descendants() if is_agent(_cmdline(p))]}
        gateway = [p.pid for p in self.c.descendants() if "xce_lite.exec.sshgate" in " ".join(_cmdline(p))]
        return {"ctl": [self.c.pid], "gateway": gateway, "agents": agent_pids(self.hosts),
                "sshd": named_pids(self.hosts, "sshd")}

    def batch(self, n: int) -> dict:
        """One batch POST of n `true` jobs until the last is DONE: the rate and CPU per job (ms)."""
        client = self.c.client()
        parties = self.parties()
        before = {k: cpu_by_pid(v) for k, v in parties.items()}
        host0, busy0 = self.host_cpu() if self.host_cpu else None, machine_busy_seconds()
        t0 = time.perf_counter()
        ids = client.post("/jobs", {"jobs": [self.c.spec(["true"])] * n})["ids"]
        reply = wait_done(client, ids, time.monotonic() + 900)
        wall = time.perf_counter() - t0
        out = {"rate": n / wall, "done": reply["states"].get("DONE", 0) if reply else 0,
               "machine_ms": (machine_busy_seconds() - busy0) / n * 1000,
               **{f"{k}_ms": cpu_spent(before[k], v) / n * 1000 for k, v in parties.items()}}
        host1 = self.host_cpu() if self.host_cpu else None
        if host0 is not None and host1 is not None:
            out["hosts_ms"] = (host1 - host0) / n * 1000
        out.update(cycle(client, ids))
        wait_idle(self.c)
        return out


def cycle(client, ids: list[int]) -> dict:
    """Where a job's time goes, medians over the batch (read after it, from the jobs' history):
    dispatched (the controller's commit) -> started (the job's start on the host) -> ended (the
    job's end as its host recorded it) -> finished (the controller's commit of the result)."""
    parts: dict[str, list[float]] = {"disp_start": [], "start_end": [], "end_done": []}
    for job in client.get("/jobs", ids=",".join(map(str, ids)), history="1")["jobs"]:
        times = {e["kind"]: e["time"] for e in job.get("history") or ()}
        if {"dispatched", "finished"} <= times.keys() and job["start_time"] and job["end_time"]:
            parts["disp_start"].append(job["start_time"] - times["dispatched"])
            parts["start_end"].append(job["end_time"] - job["start_time"])
            parts["end_done"].append(times["finished"] - job["end_time"])
    return {k: statistics.median(v) for k, v in parts.items() if v}


def floor(hosts: list[testhosts.TestHost], n: int) -> dict:
    """The bare systemd-run loop, n units on each host, all hosts at once: units/s together."""
    host_cpu, busy0 = HostCgroupCpu(hosts), machine_busy_seconds()
    cpu0 = host_cpu()

    def one(host: testhosts.TestHost) -> float:
        done = subprocess.run(host.nsenter_argv([PY, "-c", SYSTEMD_RUN_LOOP, str(n)]), capture_output=True,
                              text=True, check=True)
        return float(done.stdout)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
        walls = list(pool.map(one, hosts))
    wall = time.perf_counter() - t0
    total = n * len(hosts)
    out = {"rate": total / wall, "per_host": [n / w for w in walls], "done": total,
           "machine_ms": (machine_busy_seconds() - busy0) / total * 1000}
    cpu1 = host_cpu()
    if cpu0 is not None and cpu1 is not None:
        out["hosts_ms"] = (cpu1 - cpu0) / total * 1000
    return out


def wait_hosts_up(c: BenchCluster, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for h in c.client().get("/hosts")["hosts"] if h["state"] == "ok") >= n:
            return
        time.sleep(0.1)
    raise RuntimeError("the test hosts did not come up in the controller within 120 s")


def latency(c: BenchCluster, samples: int) -> list[float]:
    """Idle cluster, one job at a time: POST -> the job's `date`."""
    client, found = c.client(), []
    for i in range(samples):
        out = c.work / f"lat{i}"
        time.sleep(0.1)  # the controller goes back to sleep between samples
        t0 = time.time()
        wait_done(client, client.post("/jobs", {"jobs": [c.spec(["sh", "-c", f"date +%s.%N > {out}"])]})["ids"],
                  time.monotonic() + 60)
        try:
            found.append(float(out.read_text()) - t0)
        except (OSError, ValueError):
            pass
    return found


def rss_with_backlog(c: BenchCluster, pending: int, slots: int) -> dict:
    client = c.client()
    blockers = client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * slots})["ids"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.get("/status")["jobs"]["active"] < slots:
        time.sleep(0.1)
    for start in range(0, pending, 1000):
        client.post("/jobs", {"jobs": [c.spec(["true"])] * min(1000, pending - start)})
    time.sleep(2)
    status = proc_status(c.pid)
    client.post("/jobs/kill", {"ids": blockers})
    return {"rss": status["VmRSS"], "hwm": status["VmHWM"]}


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:  # gone or unreadable
        return []


def _print_run(r: int, kind: str, o: dict) -> None:
    parts = ", ".join(f"{k[:-3]} {v:.2f}" for k, v in o.items() if k.endswith("_ms") and k != "machine_ms")
    if "disp_start" in o:
        parts += (f"; cycle (ms): dispatched -> started {o['disp_start'] * 1000:.1f}, started -> ended "
                  f"{o['start_end'] * 1000:.1f}, ended -> committed {o['end_done'] * 1000:.1f}")
    extra = f"; per host {', '.join(f'{x:.0f}' for x in o['per_host'])} units/s" if "per_host" in o else ""
    print(f"    run {r + 1} {kind}: {o['rate']:.0f} jobs/s, {o['done']} DONE, machine CPU {o['machine_ms']:.1f} "
          f"ms/job; CPU per job (ms): {parts or '-'}{extra}; load {os.getloadavg()[0]:.1f}", flush=True)


# ---- the whole measurement -----------------------------------------------------------------------


LABELS = {"local": "local (one local host)", "plain": "plain ssh hosts (2)", "systemd": "systemd ssh hosts (2)",
          "floor": "bare systemd-run loop on the 2 systemd hosts at once"}


def bench_remote(rep: Report, runs: int, jobs: int, slots: int, latency_samples: int = 0,
                 pending: int = 0, systemd_slots: int | None = None, kinds: tuple[str, ...] = KINDS,
                 direct_records: str | None = None) -> None:
    """Measure into `rep` (keys remote_local, remote_plain, remote_systemd, remote_floor; those of
    `kinds`), or note why not (rep.why_not["remote"])."""
    systemd_slots = systemd_slots or slots
    other = f", the systemd hosts {systemd_slots}" if systemd_slots != slots else ""
    section(f"7. remote: {jobs} x `true` on local, plain ssh and systemd ssh hosts ({slots} slots in total "
            f"each{other}) and a bare systemd-run loop, {runs} runs interleaved; measured: {', '.join(kinds)}")
    labels = dict(LABELS, systemd=f"systemd ssh hosts (2, {systemd_slots} slots)") if other else LABELS
    if other:
        rep.note("remote: note", f"the systemd hosts have {systemd_slots} slots in total, local and plain {slots}")
    reason = why_not()
    if reason:
        rep.why_not["remote"] = reason
        rep.note("remote: skipped", reason)
        return
    base = testhosts.DEFAULT_DIR.parent / f"bench-remote-{os.getpid()}"
    sides: dict[str, Side] = {}
    try:
        booted = {}
        if {"systemd", "floor"} & set(kinds):
            booted["systemd"] = testhosts.up(2, base / "systemd", die_with_caller=True, prefix="s")
        if "plain" in kinds or pending:
            booted["plain"] = testhosts.up(2, base / "plain", plain=True, die_with_caller=True, prefix="p")
        if "local" in kinds:
            sides["local"] = Side("local", BenchCluster(slots=slots), [])
        for kind, hosts in booted.items():
            if kind not in kinds and not (kind == "plain" and pending):
                continue  # the floor's hosts, without the systemd controller
            n = systemd_slots if kind == "systemd" else slots
            # the hosts' choice of who records a direct unit's end (config/cluster.py unit_accounting)
            more = ", unit_accounting: false" if kind == "systemd" and direct_records == "agent" else ""
            sides[kind] = Side(kind, BenchCluster(config=config(kind, hosts, n, more), work=base / f"work-{kind}"),
                               hosts)
        for side in sides.values():
            side.c.start()
        for kind in [k for k in ("plain", "systemd") if k in sides]:
            wait_hosts_up(sides[kind].c, 2)
            modes = {h["name"]: (h["agent"] or {}).get("mode") for h in sides[kind].c.client().get("/hosts")["hosts"]}
            print(f"  {kind} hosts' agents: {modes}", flush=True)
        for side in sides.values():  # warm: the agents' first jobs, the controllers' first sessions
            client = side.c.client()
            wait_done(client, client.post("/jobs", {"jobs": [side.c.spec(["true"])] * 20})["ids"],
                      time.monotonic() + 120)
            wait_idle(side.c)
        res: dict[str, list[dict]] = {k: [] for k in kinds}
        for r in range(runs):
            for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                o = floor(booted["systemd"], jobs // 2) if kind == "floor" else sides[kind].batch(jobs)
                res[kind].append(o)
                _print_run(r, kind, o)
        for kind in kinds:
            outs = res[kind]
            rep.add(f"remote: {labels[kind]}, {jobs} x true", "jobs/s", [o["rate"] for o in outs],
                    key=f"remote_{kind}")
            rep.add(f"remote: {labels[kind]}: machine CPU per job", "s", [o["machine_ms"] / 1000 for o in outs])
            for key, who in (("ctl", "controller"), ("gateway", "ssh gateway"), ("agents", "agents"),
                             ("sshd", "the hosts' sshd"), ("hosts", "the hosts' cgroups")):
                if all(f"{key}_ms" in o for o in outs):
                    rep.add(f"remote: {labels[kind]}: {who} CPU per job", "s", [o[f"{key}_ms"] / 1000 for o in outs])
            for key, what in (("disp_start", "dispatched -> started"), ("start_end", "started -> ended (the unit)"),
                              ("end_done", "ended -> result committed")):
                if all(key in o for o in outs):
                    rep.add(f"remote: {labels[kind]}: a job's cycle, {what}", "s", [o[key] for o in outs])
            if any(o["done"] != jobs for o in outs):
                rep.note(f"remote {kind}: WARNING", "a run had jobs not DONE")
        if latency_samples:
            for kind in [k for k in ("plain", "systemd") if k in sides]:
                lat = latency(sides[kind].c, latency_samples)
                rep.add(f"remote: {labels[kind]}: submit -> running (idle)", "s", lat, p95=True)
        if pending:
            side = sides["plain"]
            side.c.stop()  # a fresh controller, as run.py's figure: this one's heap kept the runs above
            side.c = BenchCluster(config=config("plain", side.hosts, slots), work=base / "work-plain-rss")
            side.c.start()
            wait_hosts_up(side.c, 2)
            got = rss_with_backlog(side.c, pending, slots)
            rep.add(f"remote: controller VmRSS, {pending} pending, plain ssh hosts", "MB", [got["rss"] / 2**20])
    except (testhosts.TestHostError, RuntimeError) as exc:  # run.py goes on with its other sections
        rep.why_not["remote"] = f"it could not run: {exc}"
        rep.note("remote: FAILED", str(exc))
    finally:
        for side in sides.values():
            side.c.stop()
        for kind in ("systemd", "plain"):
            if (base / kind).exists():
                testhosts.down(base / kind)
        shutil.rmtree(base, ignore_errors=True)


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=2, help="slots in total of each cluster (default 2)")
    parser.add_argument("--latency", type=int, default=0, help="submit -> running samples per ssh kind (0: none)")
    parser.add_argument("--pending", type=int, default=0, help="controller RSS with this many pending (0: none)")
    parser.add_argument("--systemd-slots", type=int, help="slots in total of the systemd hosts (default --slots)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"which to measure, comma-separated, of {','.join(KINDS)} (default all)")
    parser.add_argument("--direct-records", choices=("unit", "agent"),
                        help="who records a direct unit's end on the systemd hosts: its ExecStopPost (unit, "
                             "the default) or the agent (the hosts' `unit_accounting: false`: no CPU time or "
                             "peak memory)")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in KINDS if k in args.kinds.split(","))
    if not kinds or set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"--kinds takes a comma-separated list of {', '.join(KINDS)}, not {args.kinds!r}")
    if args.slots < 2:
        parser.error("--slots must be at least 2 (one per ssh host)")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"remote bench at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load {load}")
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: the finally clauses stop all by PID
    rep = Report()
    bench_remote(rep, args.runs, args.jobs, args.slots, args.latency, args.pending, args.systemd_slots, kinds,
                 args.direct_records)
    print(f"\n== summary (medians); load at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rep.print_table()
    print("\n== goals of issue 18 over SSH (ratios within this run; medians)")
    print(table([("goal", "this run", "verdict"), *remote_goals(rep)]))
    return 0 if "remote" not in rep.why_not else 1


if __name__ == "__main__":
    sys.exit(main())


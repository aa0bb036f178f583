#!/usr/bin/env python3
"""Remote hosts end to end: the real controller, real sshd, two systemd and two plain test hosts.

    python bench/remote.py                 # ~5 minutes on the 2-core box, as root
    python bench/remote.py --runs 5 --jobs 1000 --latency 40
    python bench/remote.py --only systemd --slots 8   # what a host's agent can take, not the latency

Needs root: it boots two systemd test hosts and two plain ones (xce_lite.testhosts) under
~/.cache/xce-testhosts/bench-remote-PID, and stops them BY PID at the end, whatever happens.
For each kind (--only one of them), one controller (a temporary home in /tmp) with both hosts as
`type: ssh` hosts of --slots each (default 2, 4 slots in all, latency bound: the foundation's local
figures used one host of 2 slots), jobs running in a directory outside /tmp (each test host has a
/tmp of its own). Figures, each a median
(with min and max) of --runs samples:

- `N x true, one batch POST`: from the POST until the last job is DONE: jobs/s end to end; with
  the CPU time (user + system, from /proc) per job of the controller, its SSH gateway, the agents
  and the hosts' sshd (both found in the hosts' namespaces);
- `submit -> running`: an idle cluster, one job at a time: from the POST until the job's `date`
  runs (the job writes the time), --latency samples, median and p95;
- floors on one host of each kind, inside it (one process entered with nsenter, so no nsenter per
  unit): a loop of bare `systemd-run --no-block --quiet true` until the manager has no job queued
  (on one host alone, then on both at once: the jobs ran on both, sharing the same cores);
  a loop of bare fork+exec of /bin/true;
- the controller's RSS with 10,000 jobs pending behind jobs holding every slot, ssh hosts in use
  (a fresh controller, as in run.py's figure).

Asserts nothing; the machine is shared and noisy: compare figures within one run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, proc_status, wait_done
from stats import fmt, summary

from xce_lite import testhosts

PY = "/usr/bin/python3"
SYSTEMD_RUN_LOOP = """
import subprocess, sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    subprocess.run(["systemd-run", "--no-block", "--quiet", "true"], check=True)
while subprocess.run(["systemctl", "show", "-p", "NJobs", "--value"], capture_output=True,
                     text=True).stdout.strip() != "0":
    time.sleep(0.001)
print(n / (time.perf_counter() - t))
"""
FORK_EXEC_LOOP = """
import subprocess, sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    subprocess.run(["/bin/true"])
print(n / (time.perf_counter() - t))
"""


def config(kind: str, hosts: list[testhosts.TestHost], slots: int) -> str:
    entries = "".join(f"  - {{name: {h.name}, type: ssh, address: '{h.ip}', user: root, identity: '{h.key_path}', "
                      f"slots: {slots}, mem: 4G}}\n" for h in hosts)
    known = ", ".join(f"'{h.known_hosts_path}'" for h in hosts)
    return (f"cluster: br{kind[0]}{os.getpid()}\nhosts:\n{entries}queues:\n  - {{name: normal, default: true}}\n"
            f"ssh: {{config: /nonexistent, known_hosts: [{known}]}}\ncontroller: {{tick: 1s, grace: 2s}}\n")


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def agent_pids(hosts: list[testhosts.TestHost]) -> list[int]:
    found = []
    for host in hosts:
        for pid in testhosts.namespace_pids(host.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith((b".py", b".pyc")) and b"agent-" in part for part in cmd) and b"serve" in cmd:
                found.append(pid)
    return found


def wait_hosts_up(c: BenchCluster, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for h in c.client().get("/hosts")["hosts"] if h["state"] == "ok") >= n:
            return
        time.sleep(0.1)
    raise RuntimeError("the hosts did not come up")


def wait_idle(c: BenchCluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = c.client().get("/status")["jobs"]
        if jobs["pending"] == 0 and jobs["active"] == 0:
            time.sleep(0.3)
            return
        time.sleep(0.05)


def named_pids(hosts: list[testhosts.TestHost], comm: str) -> list[int]:
    return [pid for h in hosts for pid in testhosts.namespace_pids(h.pid) if testhosts._comm(pid) == comm]


def gateway_pids(c: BenchCluster) -> list[int]:
    return [p.pid for p in c.descendants() if "xce_lite.exec.sshgate" in " ".join(p.cmdline())]


def throughput(c: BenchCluster, hosts: list[testhosts.TestHost], n: int) -> dict:
    """One batch of n `true` jobs; the CPU each party spent on it, per job (ms)."""
    client = c.client()
    spec = c.spec(["true"])
    parties = {"ctl": [c.pid], "gateway": gateway_pids(c), "agents": agent_pids(hosts),
               "sshd": named_pids(hosts, "sshd")}
    before = {k: cpu_seconds(v) for k, v in parties.items()}
    t0 = time.perf_counter()
    ids = client.post("/jobs", {"jobs": [spec] * n})["ids"]
    reply = wait_done(client, ids, time.monotonic() + 900)
    wall = time.perf_counter() - t0
    done = sum(1 for j in reply["jobs"] if j["state"] == "DONE") if reply else 0
    return {"rate": n / wall, "done": done,
            **{f"{k}_ms": (cpu_seconds(v) - before[k]) / n * 1000 for k, v in parties.items()}}


def latency(c: BenchCluster, samples: int) -> list[float]:
    client = c.client()
    found = []
    for i in range(samples):
        out = c.work / f"lat{i}"
        time.sleep(0.1)  # the controller goes back to sleep between samples
        t0 = time.time()
        ids = client.post("/jobs", {"jobs": [c.spec(["sh", "-c", f"date +%s.%N > {out}"])]})["ids"]
        wait_done(client, ids, time.monotonic() + 60)
        try:
            found.append(float(out.read_text()) - t0)
        except (OSError, ValueError):
            pass
    return found


def rss_with_backlog(c: BenchCluster, pending: int) -> dict:
    client = c.client()
    blockers = client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * 4})["ids"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.get("/status")["jobs"]["active"] < 4:
        time.sleep(0.1)
    for start in range(0, pending, 1000):
        client.post("/jobs", {"jobs": [c.spec(["true"])] * min(1000, pending - start)})
    time.sleep(2)
    status = proc_status(c.pid)
    client.post("/jobs/kill", {"ids": blockers})
    return {"rss": status["VmRSS"], "hwm": status["VmHWM"]}


def floor(host: testhosts.TestHost, loop: str, n: int) -> float:
    done = subprocess.run(host.nsenter_argv([PY, "-c", loop, str(n)]), capture_output=True, text=True, check=True)
    return float(done.stdout)


def floors_at_once(hosts: list[testhosts.TestHost], loop: str, n: int) -> list[float]:
    """`floor` on every host at the same time: what each host's mechanism gives while the others
    share the machine's cores, as they do when the jobs run on all of them."""
    with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
        return list(pool.map(lambda h: floor(h, loop, n), hosts))


def line(name: str, xs: list[float], unit: str, extra: str = "") -> None:
    s = summary(xs)
    print(f"  {name}: median {fmt(s['median'], unit)} (min {fmt(s['min'], unit)}, max {fmt(s['max'], unit)}; "
          f"{s['runs']} runs){extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--latency", type=int, default=40)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=2, help="slots per host (2: latency bound, as the local figures)")
    parser.add_argument("--only", choices=["systemd", "plain"], help="one kind of host only")
    args = parser.parse_args(argv)
    base = testhosts.DEFAULT_DIR.parent / f"bench-remote-{os.getpid()}"
    dirs = {"systemd": base / "systemd", "plain": base / "plain"}
    try:
        booted = {}
        if args.only in (None, "systemd"):
            booted["systemd"] = testhosts.up(2, dirs["systemd"], die_with_caller=True, prefix="s")
        if args.only in (None, "plain"):
            booted["plain"] = testhosts.up(2, dirs["plain"], plain=True, die_with_caller=True, prefix="p")
        for kind, hosts in booted.items():
            print(f"\n== {kind} hosts: {', '.join(h.name for h in hosts)}, {args.slots} slots each", flush=True)
            c = BenchCluster(config=config(kind, hosts, args.slots), work=base / f"work-{kind}")
            try:
                c.start()
                wait_hosts_up(c, 2)
                modes = {h["name"]: (h["agent"] or {}).get("mode") for h in c.client().get("/hosts")["hosts"]}
                print(f"  modes: {modes}", flush=True)
                wait_done(c.client(), c.client().post("/jobs", {"jobs": [c.spec(["true"])] * 20})["ids"],
                          time.monotonic() + 120)
                wait_idle(c)
                runs = []
                for r in range(args.runs):
                    runs.append(throughput(c, hosts, args.jobs))
                    o = runs[-1]
                    print(f"    run {r + 1}: {o['rate']:.0f} jobs/s, {o['done']}/{args.jobs} DONE; CPU per job: "
                          f"controller {o['ctl_ms']:.2f} ms, ssh gateway {o['gateway_ms']:.2f} ms, agents "
                          f"{o['agents_ms']:.2f} ms, the hosts' sshd {o['sshd_ms']:.2f} ms", flush=True)
                    wait_idle(c)
                line(f"{args.jobs} x true, one batch POST, end to end", [o["rate"] for o in runs], "jobs/s")
                for key, who in (("ctl", "controller"), ("gateway", "ssh gateway"), ("agents", "agents"),
                                 ("sshd", "the hosts' sshd")):
                    line(f"  {who} CPU per job", [o[f"{key}_ms"] / 1000 for o in runs], "s")
                lat = latency(c, args.latency)
                s = summary(lat)
                line("submit -> running (idle)", lat, "s", f", p95 {fmt(s['p95'], 's')}")
                if kind == "systemd":
                    bare = [floor(hosts[0], SYSTEMD_RUN_LOOP, 200) for _ in range(args.runs)]
                    line("floor: bare `systemd-run --no-block true` loop on one host", bare, "units/s")
                    both = [statistics.mean(floors_at_once(hosts, SYSTEMD_RUN_LOOP, 200)) for _ in range(args.runs)]
                    line("floor: the same loop on both hosts at once, per host", both, "units/s")
                    per_host = statistics.median([o["rate"] for o in runs]) / 2
                    print(f"  per host: {per_host:.0f} jobs/s = {per_host / statistics.median(bare):.0%} of the "
                          f"bare systemd-run rate on one host alone, {per_host / statistics.median(both):.0%} of "
                          f"it on both at once (as the jobs ran)", flush=True)
                else:
                    bare = [floor(hosts[0], FORK_EXEC_LOOP, 1000) for _ in range(args.runs)]
                    line("floor: bare fork+exec of /bin/true on one host", bare, "execs/s")
                    # A fresh controller, as the foundation's figure has it (run.py): this one has run
                    # thousands of jobs, and its heap and SQLite's page cache show it.
                    c.stop()
                    c = BenchCluster(config=config(kind, hosts, args.slots), work=base / f"work-{kind}-rss")
                    c.start()
                    wait_hosts_up(c, 2)
                    r = rss_with_backlog(c, args.pending)
                    print(f"  controller with {args.pending} pending, ssh hosts: VmRSS {r['rss'] / 2**20:.1f} MB, "
                          f"VmHWM {r['hwm'] / 2**20:.1f} MB", flush=True)
            finally:
                c.stop()
    finally:
        for d in dirs.values():
            testhosts.down(d)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

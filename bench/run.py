#!/usr/bin/env python3
"""xce_lite benchmark: prints figures (median, min, max, run count), asserts nothing.

    python bench/run.py                # the full set, ~3-5 minutes on the 2-core box
    python bench/run.py --runs 5       # more runs of the 1000-job throughput figures
    python bench/run.py --only latency,cli --no-hq

Sections (see bench/README.md for what each figure means):
  throughput  1000 x `true`, one POST each, one batch POST and one 1000-element array: wall to all
              done, jobs/s, submit phase, the machine's CPU per job (/proc/stat)
  latency     submit -> start on an idle cluster, 30+ samples, median and p95
  cli         one `xce submit` and one `xce --help` process against `python -c pass` (ratios), plus
              the -X importtime top 10 beyond a bare start
  rss         controller VmHWM/VmRSS with 10,000 jobs pending behind two `sleep 600` jobs; then, the
              sleepers killed, the rate of the first 200 jobs with that backlog behind them; --rss-runs
              times (5), each on a fresh controller, medians
  floors      `seq 1000 | xargs -P2 -n1 true`, one fdatasync on the temp dir's disk, and HyperQueue's
              LocalCluster (from a separate venv): with throughput, one HQ run after each of its rounds
  remote      bench/remote.py: the same jobs on local, plain ssh and systemd ssh test hosts (same slots
              in total) and a bare systemd-run loop on those hosts, interleaved; needs root and boots
              test hosts (skipped, with the reason printed, where it cannot run)

Every controller runs in its own temporary home (/tmp/xb-*), with one local host of 2 slots, and is
stopped, with everything it started, by PID at the end, whatever happens.

At the end, each goal of issue 18 with its figure from this run and `met` or `MISSED` (ratios
taken within the run), or why this run cannot judge it (a section not run, HyperQueue missing).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, is_agent, machine_busy_seconds, proc_status, pss, wait_done, wait_idle
from cli_start import bench_cli
from floors import HyperQueue, bench_fsync, bench_hq, bench_xargs
from remote import bench_remote
from report import KINDS, Report, goals, section
from stats import summary, table

SECTIONS = ("throughput", "latency", "cli", "rss", "floors", "remote")
MB = 1024 * 1024

PEERS_TPUT = "Slurm 2, GNU parallel 115, HQ 164, tsp 260, xargs -P2 ~600 jobs/s"
PEERS_LAT = "Slurm 0.98 s, HQ 6.5 ms"
PEERS_RSS = "Slurm 48.6 MB (10k pending), HQ 41.6 MB (whole process)"


# ---- 1 and 2: throughput ---------------------------------------------------------------------------




def run_throughput_once(c: BenchCluster, n: int, kind: str) -> dict:
    client = c.client()
    spec = c.spec(["true"])
    busy = machine_busy_seconds()
    t0 = time.perf_counter()
    if kind == "each":
        ids = [client.post("/jobs", {"jobs": [spec]})["ids"][0] for _ in range(n)]
    elif kind == "batch":
        ids = client.post("/jobs", {"jobs": [spec] * n})["ids"]
    else:  # one job of n elements, as `xce submit -J "bench[1-n]"` sends it
        ids = client.post("/jobs", {"jobs": [dict(spec, name="bench", array=f"1-{n}")]})["ids"]
    t_sub = time.perf_counter()
    reply = wait_done(client, ids, time.monotonic() + 300)
    t_done = time.perf_counter()
    cpu = (machine_busy_seconds() - busy) / n
    if reply is None:
        return {"ok": False, "submit": t_sub - t0, "wall": float("nan"), "done": 0, "cpu": cpu}
    done = reply["states"].get("DONE", 0)
    return {"ok": True, "submit": t_sub - t0, "wall": t_done - t0, "done": done, "cpu": cpu}


def bench_throughput(rep: Report, c: BenchCluster, runs: int, n: int, hq: HyperQueue | None = None) -> None:
    """`runs` rounds of the three kinds; with `hq`, one HyperQueue run after each round (floors.py)."""
    section(f"1-2. throughput: {n} x `true`, 2 slots, {runs} runs of each kind (interleaved"
            + (", and a HyperQueue run after each round)" if hq is not None else ")"))
    client = c.client()
    wait_done(client, client.post("/jobs", {"jobs": [c.spec(["true"])] * 10})["ids"], time.monotonic() + 60)
    wait_idle(c)
    res: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for r in range(runs):
        order = list(KINDS)
        order = order[r % len(order):] + order[:r % len(order)]  # each kind goes first once in three runs
        for kind in order:
            out = run_throughput_once(c, n, kind)
            res[kind].append(out)
            print(f"    run {r + 1} {KINDS[kind]}: submit {out['submit']:.3f} s, all done {out['wall']:.2f} s, "
                  f"{out['done']}/{n} DONE, machine CPU {1000 * out['cpu']:.1f} ms/job", flush=True)
            wait_idle(c)
        if hq is not None:
            before = len(hq.results)
            hq.run(1, n)
            if len(hq.results) > before:  # else its trouble is noted with its figures
                last = hq.results[-1]
                print(f"    run {r + 1} HyperQueue: {n / last['jobs_wall']:.0f} one-task jobs/s, "
                      f"{n / last['array_wall']:.0f} array tasks/s", flush=True)
                for kind, hq_wall in (("each", "jobs_wall"), ("array", "array_wall")):  # this round's pair
                    if res[kind][-1]["ok"]:
                        rep.rounds.setdefault(kind, []).append(last[hq_wall] / res[kind][-1]["wall"])
            wait_idle(c)
    for kind, how in KINDS.items():
        label = f"{n} jobs, {how}" if kind != "array" else f"{n}-element array, {how}"
        outs = [o for o in res[kind] if o["ok"]]
        rates = [n / o["wall"] for o in outs]
        rep.add(f"{label}: first submit -> all done", "s", [o["wall"] for o in outs], peers="")
        rep.add(f"{label}: throughput", "jobs/s", rates, peers=PEERS_TPUT, key=f"tput_{kind}")
        rep.add(f"{label}: machine CPU per job", "ms", [1000 * o["cpu"] for o in outs], key=f"cpu_{kind}")
        if kind == "each":
            rep.add(f"{label}: submit phase alone", "s", [o["submit"] for o in outs],
                    peers="tsp 3.8 s (1000 CLI calls); Slurm 6.5 s")
            rep.add(f"{label}: submit rate", "submits/s", [n / o["submit"] for o in outs],
                    peers="Slurm 123-154/s, tsp ~260/s")
        else:
            rep.add(f"{label}: submit call alone (POST -> reply)", "s", [o["submit"] for o in outs],
                    peers="Slurm array 8.3 ms, HQ 5.6 ms", key=f"accept_{kind}")
        bad = [o for o in res[kind] if not o["ok"] or o["done"] != n]
        if bad:
            rep.note(f"{label}: WARNING", f"{len(bad)} run(s) timed out or had jobs not DONE")


# ---- 3: submit -> start latency --------------------------------------------------------------------


def bench_latency(rep: Report, c: BenchCluster, samples: int) -> None:
    section(f"3. submit -> start latency, idle cluster, {samples} samples")
    client = c.client()
    wait_idle(c)
    outside, inside = [], []
    for i in range(samples):
        f = c.work / f"lat{i}"
        spec = c.spec(["sh", "-c", f"date +%s.%N > {f}"])
        time.sleep(0.05 + random.random() * 0.1)  # let the controller go back to sleep
        t0 = time.time()
        ids = client.post("/jobs", {"jobs": [spec]})["ids"]
        reply = wait_done(client, ids, time.monotonic() + 60, brief=False)
        try:
            outside.append(float(f.read_text()) - t0)
        except (OSError, ValueError):
            continue
        if reply is not None:
            job = reply["jobs"][0]
            if job["start_time"] is not None:
                inside.append(job["start_time"] - job["submit_time"])
    # The measuring method's own cost: the same `sh -c date` spawned straight from here.
    floor = []
    for i in range(min(samples, 20)):
        f = c.work / f"floor{i}"
        t0 = time.time()
        subprocess.run(["sh", "-c", f"date +%s.%N > {f}"], check=False)
        floor.append(float(f.read_text()) - t0)
    med = summary(outside)["median"]
    rep.add("submit -> start (POST to `date` in the job)", "s", outside, goal="median <= 10 ms",
            met=bool(outside) and med <= 0.010, peers=PEERS_LAT, p95=True, key="latency")
    rep.add("submit -> start, controller's own stamps (start_time - submit_time)", "s", inside, p95=True)
    rep.add("(method floor: `sh -c date` spawned directly, no engine)", "s", floor, p95=True)


# ---- 5: controller RSS with 10,000 pending ------------------------------------------------------------


def bench_rss(rep: Report, n_pending: int, batch: int, backlog_jobs: int, runs: int = 1,
              prefill: bool | None = None) -> None:
    """Section 5, `runs` times (each on a fresh controller), every figure a median over them: the
    backlog figure times ~0.6 s of work, so one run of it swings with whatever else the shared
    machine does in that second (0.62x-0.85x of the empty queue in one session, same tree)."""
    section(f"5. controller memory with {n_pending} jobs pending (fresh controller, {runs} runs)")
    got: dict[str, list[float]] = {}
    pending_seen = n_pending
    for run in range(runs):
        pending_seen = _rss_once(got, n_pending, batch, backlog_jobs, run + 1, prefill)
    peak, rss = got.get("peak", []), got.get("rss", [])
    rep.add(f"controller VmHWM (peak RSS) with {pending_seen} pending", "MB", peak, goal="<= 60 MB",
            met=bool(peak) and statistics.median(peak) <= 60, peers=PEERS_RSS, key="rss_peak")
    rep.add(f"controller VmRSS with {pending_seen} pending", "MB", rss, goal="<= 60 MB",
            met=bool(rss) and statistics.median(rss) <= 60, key="rss")
    rep.add("controller VmRSS idle, just started", "MB", got.get("idle", []))
    rep.add(f"controller + scheduler forkserver/pool PSS with {pending_seen} pending", "MB", got.get("pss", []),
            peers="performance.md proposed <= 45 MB")
    rep.add(f"POST of {batch} jobs while up to {n_pending} pend", "s", got.get("posts", []))
    rep.add(f"{n_pending} jobs submitted: first POST -> a scheduling pass saw the last job", "s",
            got.get("sched", []))
    rep.add("  of which: last POST -> that scheduling pass", "s", got.get("sched_last", []))
    rep.add("POST /jobs/kill of the 2 sleepers", "s", got.get("kill", []))
    if backlog_jobs:
        rep.add(f"throughput of the first {backlog_jobs} jobs with {pending_seen} pending "
                f"(from the sleepers' kill)", "jobs/s", got.get("backlog", []),
                peers="Slurm at 10k pending: main sched cycle 15 ms", key="tput_backlog")


def _rss_once(got: dict[str, list[float]], n_pending: int, batch: int, backlog_jobs: int, run: int,
              prefill: bool | None) -> int:
    """One run of section 5 on a fresh controller; its figures appended to `got`. The pending
    count the controller reported."""
    c = BenchCluster(slots=2, prefill=prefill)
    pending_seen = n_pending
    try:
        c.start()
        client = c.client()
        time.sleep(0.5)
        idle = proc_status(c.pid)
        sleepers = client.post("/jobs", {"jobs": [c.spec(["sleep", "600"])] * 2})["ids"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {j["state"] for j in client.get("/jobs", ids=",".join(map(str, sleepers)))["jobs"]}
            if states == {"RUN"}:
                break
            time.sleep(0.05)
        else:
            print(f"    run {run}: WARNING: the sleepers did not reach RUN (states {states})")
        last_id, first_ids = None, []
        spec = c.spec(["true"])
        t_first = time.perf_counter()
        for _ in range(n_pending // batch):
            t0 = time.perf_counter()
            ids = client.post("/jobs", {"jobs": [spec] * batch})["ids"]
            got.setdefault("posts", []).append(time.perf_counter() - t0)
            first_ids = first_ids or ids[:backlog_jobs]
            last_id = ids[-1]
        t_last = time.perf_counter()
        # A scheduling session that saw the last job stores its pend reason: wait for that.
        deadline = time.monotonic() + 120
        scheduled = False
        while time.monotonic() < deadline:
            job = client.get("/jobs", ids=str(last_id))["jobs"][0]
            if job["pend_reason"]:
                scheduled = True
                break
            time.sleep(0.02)
        t_sched = time.perf_counter()
        pending_seen = client.get("/status")["jobs"]["pending"]
        time.sleep(0.2)
        now = proc_status(c.pid)
        tree = c.descendants()
        pool_pss = sum(pss(p.pid) for p in tree if not is_agent(_cmdline(p)))
        got.setdefault("peak", []).append(now["VmHWM"] / MB)
        got.setdefault("rss", []).append(now["VmRSS"] / MB)
        got.setdefault("idle", []).append(idle["VmRSS"] / MB)
        got.setdefault("pss", []).append((pss(c.pid) + pool_pss) / MB)
        if scheduled:
            got.setdefault("sched", []).append(t_sched - t_first)
            got.setdefault("sched_last", []).append(t_sched - t_last)
        else:
            print(f"    run {run}: WARNING: no scheduling pass stored a pend reason for the last job within 120 s")
        t0 = time.perf_counter()
        client.post("/jobs/kill", {"ids": sleepers})
        got.setdefault("kill", []).append(time.perf_counter() - t0)
        # The RSS is read; now the slots free up: how fast do jobs run with a 10k backlog behind them?
        line = f"    run {run}: VmHWM {now['VmHWM'] / MB:.1f} MB with {pending_seen} pending"
        if backlog_jobs:
            reply = wait_done(client, first_ids, time.monotonic() + 120)
            wall = time.perf_counter() - t0
            if reply:
                got.setdefault("backlog", []).append(len(first_ids) / wall)
                line += f"; the first {len(first_ids)} jobs at {len(first_ids) / wall:.0f} jobs/s"
        load = os.getloadavg()
        print(f"{line} (load {load[0]:.2f})", flush=True)
    finally:
        t0 = time.perf_counter()
        c.stop()
        print(f"    (controller with {n_pending} pending stopped and cleaned up in "
              f"{time.perf_counter() - t0:.1f} s)")
    return pending_seen


def interpreter_build() -> str:
    """Whether this interpreter runs its core from a shared libpython (as pyenv's default build) or
    has it linked into its executable (as Debian's python3): every controller and agent here runs
    on it, and on this VM the first took ~25% longer per Python operation (bench/README.md, session
    23), which moves every figure but the ratios to `python -c pass` against it."""
    try:
        with open("/proc/self/maps") as maps:
            shared = sorted({line.split()[-1] for line in maps if "libpython" in line})
    except OSError:
        return "unknown (no /proc/self/maps)"
    return f"libpython from a shared library ({shared[0]})" if shared else "libpython linked into the executable"


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:  # gone or unreadable
        return []


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt


# ---- main ------------------------------------------------------------------------------------------


PREFILL = {"default": None, "on": True, "off": False}  # --prefill -> BenchCluster(prefill=)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs of each 1000-job figure and floor (default 3)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per throughput run (default 1000)")
    ap.add_argument("--latency-samples", type=int, default=40, help="submit->start samples (default 40)")
    ap.add_argument("--cli-samples", type=int, default=20, help="samples per CLI command (default 20)")
    ap.add_argument("--pending", type=int, default=10_000, help="jobs pending for the RSS figure (default 10000)")
    ap.add_argument("--backlog-jobs", type=int, default=200,
                    help="after the RSS reading, time this many jobs running with the backlog pending (0: skip)")
    ap.add_argument("--rss-runs", type=int, default=5,
                    help="runs of section rss, each on a fresh controller: its figures (the backlog's too) are "
                         "medians over them (default 5: the backlog's 200 jobs take ~0.3 s, and one run of them "
                         "moved 487-902 jobs/s within ten minutes in session 20)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {','.join(SECTIONS)}")
    ap.add_argument("--prefill", choices=("default", "on", "off"), default="default",
                    help="the controllers' `prefill:` (throughput, latency, cli, rss): default leaves it unset")
    ap.add_argument("--no-hq", action="store_true", help="skip the HyperQueue floor")
    ap.add_argument("--hq-venv", default="/tmp/bench-hq-venv", help="venv holding hyperqueue (made if missing)")
    ap.add_argument("--no-hq-install", action="store_true", help="never pip install hyperqueue into --hq-venv")
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")

    # SIGTERM ends the run like Ctrl-C, so the finally clauses stop every controller by PID.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.perf_counter()
    import xce_lite

    print(f"xce_lite benchmark: python {sys.version.split()[0]} ({sys.executable}), {os.cpu_count()} CPUs, "
          f"xce_lite at {Path(xce_lite.__file__).parent}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"interpreter: {interpreter_build()}")
    try:
        head = subprocess.run(["git", "-C", str(HERE.parent), "log", "-1", "--format=%h %s"], check=False,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain", "--", "xce_lite"],
                               check=False, capture_output=True, text=True, timeout=10).stdout.strip()
        print(f"source: commit {head or '?'}" + (" + uncommitted changes in xce_lite/" if dirty else ""))
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        load = os.getloadavg()
        print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (the machine is shared)")
    except OSError:
        pass
    print(f"prefill: {args.prefill} (xce.yaml's controller.prefill; the default is on)")
    rep = Report()
    hq = None if args.no_hq or "floors" not in only else HyperQueue(Path(args.hq_venv), not args.no_hq_install)
    if only & {"throughput", "latency", "cli"}:
        c = BenchCluster(slots=2, prefill=PREFILL[args.prefill])
        try:
            c.start()
            if "throughput" in only:
                bench_throughput(rep, c, args.runs, args.jobs, hq)
            if "latency" in only:
                bench_latency(rep, c, args.latency_samples)
            if "cli" in only:
                bench_cli(rep, c, args.cli_samples)
        finally:
            c.stop()
    if "rss" in only:
        bench_rss(rep, args.pending, 1000, args.backlog_jobs, args.rss_runs, PREFILL[args.prefill])
    if "floors" in only:
        bench_xargs(rep, args.runs, args.jobs)
        bench_fsync(rep, args.runs)
        if hq is not None:
            bench_hq(rep, args.runs, args.jobs, hq)
    if "remote" in only:
        bench_remote(rep, args.runs, args.jobs, 2)
    print(f"\n== summary (medians; {time.perf_counter() - started:.0f} s in all)")
    rep.print_table()
    try:
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    except OSError:
        pass
    print("\n== goals of issue 18 (ratios within this run; medians)")
    print(table([("goal", "this run", "verdict"), *goals(rep, only, not args.no_hq)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

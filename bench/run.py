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
              sleepers killed, the rate of the first 200 jobs with that backlog behind them
  floors      `seq 1000 | xargs -P2 -n1 true`, and HyperQueue's LocalCluster (from a separate venv)

Every controller runs in its own temporary home (/tmp/xb-*), with one local host of 2 slots, and is
stopped, with everything it started, by PID at the end, whatever happens.

At the end, each goal of issue 18 with its figure from this run and `met` or `MISSED` (ratios
taken within the run), or why this run cannot judge it (a section not run, HyperQueue missing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster, is_agent, proc_status, pss, wait_done
from stats import fmt, summary, table

SECTIONS = ("throughput", "latency", "cli", "rss", "floors")
MB = 1024 * 1024

PEERS_TPUT = "Slurm 2, GNU parallel 115, HQ 164, tsp 260, xargs -P2 ~600 jobs/s"
PEERS_LAT = "Slurm 0.98 s, HQ 6.5 ms"
PEERS_RSS = "Slurm 48.6 MB (10k pending), HQ 41.6 MB (whole process)"


class Report:
    """Collects figures; prints each as it is measured and a summary table at the end."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.figures: dict[str, float] = {}  # key -> median, for the goals (only figures with samples)
        self.why_not: dict[str, str] = {}  # key -> why the figure is missing

    def add(self, name: str, unit: str, samples: list[float], goal: str = "", met: bool | None = None,
            peers: str = "", p95: bool = False, key: str = "") -> dict:
        s = summary(samples)
        if key and samples:
            self.figures[key] = s["median"]
        row = {"name": name, "unit": unit, "peers": peers, "goal": goal, "met": met, "show_p95": p95, **s}
        self.rows.append(row)
        extra = f", p95 {fmt(s['p95'], unit)}" if p95 else ""
        verdict = "" if met is None else ("  [goal met]" if met else "  [goal MISSED]")
        goal_text = f"  goal {goal}" if goal else ""
        print(f"  {name}: median {fmt(s['median'], unit)} (min {fmt(s['min'], unit)}, max "
              f"{fmt(s['max'], unit)}{extra}; {s['runs']} runs){goal_text}{verdict}", flush=True)
        return row

    def note(self, name: str, text: str) -> None:
        self.rows.append({"name": name, "text": text})
        print(f"  {name}: {text}", flush=True)

    def print_table(self) -> None:
        rows = [("figure", "median", "min", "max", "runs", "goal", "verdict", "peers on this machine")]
        for r in self.rows:
            if "text" in r:
                rows.append((r["name"], r["text"], "", "", "", "", "", ""))
                continue
            median = fmt(r["median"], r["unit"])
            if r["show_p95"]:
                median += f" (p95 {fmt(r['p95'], r['unit'])})"
            verdict = "" if r["met"] is None else ("met" if r["met"] else "MISSED")
            rows.append((r["name"], median, fmt(r["min"], r["unit"]), fmt(r["max"], r["unit"]),
                         str(r["runs"]), r["goal"], verdict, r["peers"]))
        print(table(rows))


def section(title: str) -> None:
    print(f"\n== {title} ({time.strftime('%H:%M:%S')})", flush=True)


def wait_idle(c: BenchCluster, timeout: float = 60.0) -> None:
    """Until the controller holds no pending or active job (and has had a moment to settle)."""
    client = c.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = client.get("/status")["jobs"]
        if jobs["pending"] == 0 and jobs["active"] == 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)


# ---- 1 and 2: throughput ---------------------------------------------------------------------------


KINDS = {"each": "one POST each", "batch": "one batch POST", "array": "one array POST"}


def machine_busy_seconds() -> float:
    """The whole machine's busy CPU time so far (as bench/cpu_per_job.py counts it)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


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
    done = sum(1 for j in reply["jobs"] if j["state"] == "DONE")
    return {"ok": True, "submit": t_sub - t0, "wall": t_done - t0, "done": done, "cpu": cpu}


def bench_throughput(rep: Report, c: BenchCluster, runs: int, n: int) -> None:
    section(f"1-2. throughput: {n} x `true`, 2 slots, {runs} runs of each kind (interleaved)")
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
        reply = wait_done(client, ids, time.monotonic() + 60)
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


# ---- 4: one `xce submit` process ------------------------------------------------------------------


def console_script() -> tuple[list[str], str]:
    beside = Path(sys.executable).parent / "xce"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)], f"console script {beside}"
    found = shutil.which("xce")
    if found:
        return [found], f"`xce` on PATH ({found}; may be a pyenv shim, which adds its own cost)"
    return [sys.executable, "-m", "xce_lite"], f"{sys.executable} -m xce_lite (no `xce` script found)"


def bench_cli(rep: Report, c: BenchCluster, samples: int) -> None:
    section(f"4. one `xce submit` / `xce --help` process vs `python -c pass`, {samples} samples each (interleaved)")
    script, how = console_script()
    print(f"    xce = {how}")
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
        "xce submit -- true": [*script, "submit", "-o", c.out, "--", "true"],
        "xce --help": [*script, "--help"],
        "python -m xce_lite submit -- true": [sys.executable, "-m", "xce_lite", "submit", "-o", c.out, "--", "true"],
    }
    times: dict[str, list[float]] = {k: [] for k in cmds}
    failures: dict[str, str] = {}

    def once(name: str) -> float | None:
        t0 = time.perf_counter()
        r = subprocess.run(cmds[name], check=False, cwd=c.work, env=c.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            failures.setdefault(name, f"exit {r.returncode}: {r.stderr.strip()[:300]}")
            return None
        return dt

    for name in cmds:  # warm the page cache
        once(name)
        once(name)
    for _ in range(samples):
        order = list(cmds)
        random.shuffle(order)
        for name in order:
            dt = once(name)
            if dt is not None:
                times[name].append(dt)
    for name, msg in failures.items():
        rep.note(f"{name}: FAILED", msg)
    base = summary(times["python -c pass"])["median"]
    rep.add("python -c pass (same interpreter)", "s", times["python -c pass"], peers="performance.md: 20.5 ms")
    rep.add("xce submit -- true (one process, wall)", "s", times["xce submit -- true"],
            peers="sbatch 8.3 ms, tsp 3.8 ms")
    rep.add("python -m xce_lite submit -- true", "s", times["python -m xce_lite submit -- true"])
    rep.add("xce --help (one process, wall)", "s", times["xce --help"], peers="bsub -h, sbatch --help")
    for name, key in (("xce submit -- true", "cli_submit"), ("xce --help", "cli_help")):
        if not times[name] or base <= 0:
            rep.why_not[key] = f"`{name}` failed: {failures.get(name, 'no samples')}"
            continue
        med_ratio = summary(times[name])["median"] / base
        rep.figures[key] = med_ratio
        rep.add(f"{name} / python -c pass (each sample / baseline median)", "x", [t / base for t in times[name]],
                goal="<= 4x (median / median)", met=med_ratio <= 4.0)
    bare = summary(times["python -I -S -c pass"])["median"]
    rep.add("python -I -S -c pass (no site, no .pth hooks: the bare floor)", "s", times["python -I -S -c pass"])
    rep.add("xce submit / python -I -S -c pass (information, no goal)", "x",
            [t / bare for t in times["xce submit -- true"]])
    wait_idle(c)

    # What the CLI path imports, once, beyond what a bare `python -c pass` imports (site, .pth hooks).
    def imported(*args: str) -> list[tuple[int, int, str]]:
        r = subprocess.run([sys.executable, "-X", "importtime", *args], check=False, cwd=c.work, env=c.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = []
        for line in r.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            try:
                _, rest = line.split(":", 1)
                self_us, cum_us, name = (part for part in rest.split("|"))
                found.append((int(cum_us), int(self_us), name.rstrip()))
            except ValueError:
                continue
        return found

    floor = {name.strip() for _, _, name in imported("-c", "pass")}
    entries = sorted((e for e in imported("-m", "xce_lite", "--help") if e[2].strip() not in floor), reverse=True)
    print(f"\n    python -X importtime -m xce_lite --help: top 10 cumulative import costs beyond `python -c pass` "
          f"({len(entries)} modules more)")
    print(f"    {'cumulative':>10}  {'self':>8}  module (indent = nesting)")
    for cum, self_us, name in entries[:10]:
        print(f"    {cum / 1000:8.1f} ms  {self_us / 1000:6.1f} ms  {name}")
    heavy = [n.strip() for _, _, n in entries if n.strip().split(".")[0] in
             ("pydantic", "apsw", "fabric", "paramiko", "yaml", "psutil", "http", "multiprocessing")]
    print(f"    heavy modules on the CLI path: {', '.join(sorted(set(heavy))) or 'none'}")


# ---- 5: controller RSS with 10,000 pending ------------------------------------------------------------


def bench_rss(rep: Report, n_pending: int, batch: int, backlog_jobs: int) -> None:
    section(f"5. controller memory with {n_pending} jobs pending (fresh controller)")
    c = BenchCluster(slots=2)
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
            rep.note("rss: WARNING", f"the sleepers did not reach RUN (states {states})")
        posts, last_id, first_ids = [], None, []
        spec = c.spec(["true"])
        t_first = time.perf_counter()
        for _ in range(n_pending // batch):
            t0 = time.perf_counter()
            ids = client.post("/jobs", {"jobs": [spec] * batch})["ids"]
            posts.append(time.perf_counter() - t0)
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
        status = client.get("/status")["jobs"]
        time.sleep(0.2)
        now = proc_status(c.pid)
        tree = c.descendants()
        pool_pss = sum(pss(p.pid) for p in tree if not is_agent(_cmdline(p)))
        rep.add(f"controller VmHWM (peak RSS) with {status['pending']} pending", "MB", [now["VmHWM"] / MB],
                goal="<= 60 MB", met=now["VmHWM"] <= 60 * MB, peers=PEERS_RSS, key="rss_peak")
        rep.add(f"controller VmRSS with {status['pending']} pending", "MB", [now["VmRSS"] / MB],
                goal="<= 60 MB", met=now["VmRSS"] <= 60 * MB, key="rss")
        rep.add("controller VmRSS idle, just started", "MB", [idle["VmRSS"] / MB])
        rep.add(f"controller + scheduler forkserver/pool PSS with {status['pending']} pending", "MB",
                [(pss(c.pid) + pool_pss) / MB], peers="performance.md proposed <= 45 MB")
        rep.add(f"POST of {batch} jobs while up to {n_pending} pend", "s", posts)
        rep.add(f"{n_pending} jobs submitted: first POST -> a scheduling pass saw the last job", "s",
                [t_sched - t_first] if scheduled else [])
        rep.add("  of which: last POST -> that scheduling pass", "s", [t_sched - t_last] if scheduled else [])
        if not scheduled:
            rep.note("rss: WARNING", "no scheduling pass stored a pend reason for the last job within 120 s")
        t0 = time.perf_counter()
        client.post("/jobs/kill", {"ids": sleepers})
        rep.add("POST /jobs/kill of the 2 sleepers", "s", [time.perf_counter() - t0])
        # The RSS is read; now the slots free up: how fast do jobs run with a 10k backlog behind them?
        if backlog_jobs:
            reply = wait_done(client, first_ids, time.monotonic() + 120)
            wall = time.perf_counter() - t0
            rep.add(f"throughput of the first {len(first_ids)} jobs with {status['pending']} pending "
                    f"(from the sleepers' kill)", "jobs/s", [len(first_ids) / wall] if reply else [],
                    peers="Slurm at 10k pending: main sched cycle 15 ms", key="tput_backlog")
    finally:
        t0 = time.perf_counter()
        c.stop()
        print(f"    (controller with {n_pending} pending stopped and cleaned up in "
              f"{time.perf_counter() - t0:.1f} s)")


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:  # gone or unreadable
        return []


# ---- 6: floors ---------------------------------------------------------------------------------------


def bench_xargs(rep: Report, runs: int, n: int) -> None:
    section(f"6a. floor: `seq {n} | xargs -P2 -n1 true`, {runs} runs")
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(f"seq {n} | xargs -P2 -n1 true", shell=True, check=False)
        walls.append(time.perf_counter() - t0)
    rep.add(f"xargs -P2: {n} x true, wall", "s", walls, peers="performance.md: 1.77 s")
    rep.add("xargs -P2: throughput", "jobs/s", [n / w for w in walls], peers="performance.md: 564 jobs/s",
            key="tput_xargs")


def hq_python(venv: Path, allow_install: bool) -> tuple[Path | None, str]:
    python = venv / "bin" / "python"
    if python.exists() and _hq_importable(python):
        return python, f"HyperQueue from {venv}"
    if not allow_install:
        return None, f"no HyperQueue in {venv} and --no-hq-install given"
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        r = subprocess.run([str(python), "-m", "pip", "install", "-q", "hyperqueue"], check=False, capture_output=True,
                           text=True, timeout=240)
        if r.returncode != 0:
            return None, f"pip install hyperqueue failed: {r.stderr.strip()[-300:]}"
    except (subprocess.SubprocessError, OSError) as err:
        return None, f"could not make the venv {venv}: {err}"
    if not _hq_importable(python):
        return None, f"hyperqueue installed in {venv} but does not import"
    return python, f"HyperQueue freshly installed in {venv}"


def _hq_importable(python: Path) -> bool:
    r = subprocess.run([str(python), "-c", "import hyperqueue"], check=False, capture_output=True, timeout=60)
    return r.returncode == 0


def bench_hq(rep: Report, runs: int, n: int, venv: Path, allow_install: bool) -> None:
    section(f"6b. floor: HyperQueue LocalCluster (1 worker, 2 cores), {n} tasks, {runs} runs")
    python, how = hq_python(venv, allow_install)
    print(f"    {how}")
    if python is None:
        rep.note("HyperQueue", f"skipped: {how}")
        rep.why_not["hq"] = how
        return
    tmp = tempfile.mkdtemp(prefix="xbhq-", dir="/tmp")  # HQ leaves sockets in $TMPDIR: keep them here
    proc = subprocess.Popen([str(python), str(HERE / "hq_floor.py"), str(runs), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=tmp))
    try:
        out, err = proc.communicate(timeout=60 + 40 * runs)
    except subprocess.TimeoutExpired:
        _kill_with_children(proc.pid)
        out, err = proc.communicate()
        rep.note("HyperQueue", "timed out; its process was killed (by PID)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = []
    for line in out.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
    if not results:
        rep.note("HyperQueue", f"no result (exit {proc.returncode}): {err.strip()[-300:]}")
        rep.why_not["hq"] = f"HyperQueue gave no result (exit {proc.returncode})"
        return
    rep.add(f"HQ {n}-task array job: submit", "s", [r["array_submit"] for r in results],
            peers="performance.md: 21.7 ms")
    rep.add(f"HQ {n}-task array job: throughput", "tasks/s", [n / r["array_wall"] for r in results],
            peers="performance.md: 164 tasks/s", key="hq_array")
    rep.add(f"HQ {n} one-task jobs: submit phase", "s", [r["jobs_submit"] for r in results],
            peers="performance.md: 0.64 s")
    rep.add(f"HQ {n} one-task jobs: throughput", "jobs/s", [n / r["jobs_wall"] for r in results],
            peers="performance.md: 141 jobs/s", key="hq_jobs")
    print("    (HQ's client polls about once a second: its wall times may be overstated by up to ~1 s)")


def _kill_with_children(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
        victims = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in victims:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt


# ---- the goals of issue 18, each judged on figures of this run -----------------------------------------


def _ratio(rep: Report, top: str, bottom: str) -> float | None:
    a, b = rep.figures.get(top), rep.figures.get(bottom)
    return a / b if a is not None and b else None


def goals(rep: Report, only: set[str], hq: bool) -> list[tuple[str, str, str]]:
    """(goal, figure of this run, met / MISSED / why it cannot be judged here) for each goal."""
    f = rep.figures
    no_hq = rep.why_not.get("hq") or ("--no-hq given" if not hq else "the floors section did not run")
    rows = []

    def judge(goal: str, value: float | None, text: str, ok, missing: str, scale: float = 1.0) -> None:
        if value is None:
            rows.append((goal, "-", f"not judged: {missing}"))
        else:
            rows.append((goal, text.format(value * scale), "met" if ok(value * scale) else "MISSED"))

    need_tput = "throughput section not run" if "throughput" not in only else "no successful run"
    for kind, hq_key, hq_name in (("each", "hq_jobs", "HQ's 1,000 one-task jobs"),
                                  ("array", "hq_array", "HQ's 1,000-task array")):
        what = "1,000 one-POST jobs" if kind == "each" else "1,000-element array"
        missing = need_tput if f"tput_{kind}" not in f else no_hq
        value = _ratio(rep, f"tput_{kind}", hq_key)
        text = "{:.2f}x" + (f" ({f[f'tput_{kind}']:.0f} vs {f[hq_key]:.0f} jobs/s)" if value is not None else "")
        judge(f"{what} >= 1.5x {hq_name}", value, text, lambda v: v >= 1.5, missing)
    value = _ratio(rep, "tput_backlog", "tput_batch")
    judge("first 200 jobs with 10,000 pending >= 0.8x the empty queue (1,000-job batch POST)", value,
          "{:.2f}x" + (f" ({f['tput_backlog']:.0f} vs {f['tput_batch']:.0f} jobs/s)" if value else ""),
          lambda v: v >= 0.8, "needs the rss and throughput sections")
    judge("machine CPU per job <= 5 ms (1,000-job batch POST, /proc/stat as bench/cpu_per_job.py)",
          f.get("cpu_batch"), "{:.1f} ms", lambda v: v <= 5.0, need_tput)
    for key, what in (("cli_submit", "`xce submit -- true`"), ("cli_help", "`xce --help`")):
        judge(f"{what} <= 4x `python -c pass`", f.get(key), "{:.2f}x", lambda v: v <= 4.0,
              rep.why_not.get(key, "cli section not run"))
    judge("accepting a 1,000-element array <= 20 ms POST -> reply", f.get("accept_array"),
          "{:.1f} ms", lambda v: v <= 20.0, need_tput, scale=1000)
    rows.append(("over SSH: plain >= 0.5x local, systemd >= 0.8x a bare systemd-run loop", "-",
                 "not judged here: bench/remote.py measures it (root, test hosts)"))
    judge("keep: submit -> start median <= 10 ms", f.get("latency"), "{:.1f} ms", lambda v: v <= 10.0,
          "latency section not run", scale=1000)
    judge("keep: controller RSS <= 60 MB at 10,000 pending", f.get("rss"), "{:.1f} MB",
          lambda v: v <= 60.0, "rss section not run")
    rows.append(("keep: decisions hashes unchanged; bench/scheduling.py no worse", "-",
                 "not judged here: tests/ and bench/scheduling.py"))
    if "tput_xargs" in f:
        for kind in ("each", "batch", "array"):
            if f"tput_{kind}" in f:
                rows.append((f"(beside: {KINDS[kind]} / xargs -P2, no goal)",
                             f"{f[f'tput_{kind}'] / f['tput_xargs']:.2f}x", ""))
    return rows


# ---- main ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs of each 1000-job figure and floor (default 3)")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per throughput run (default 1000)")
    ap.add_argument("--latency-samples", type=int, default=40, help="submit->start samples (default 40)")
    ap.add_argument("--cli-samples", type=int, default=20, help="samples per CLI command (default 20)")
    ap.add_argument("--pending", type=int, default=10_000, help="jobs pending for the RSS figure (default 10000)")
    ap.add_argument("--backlog-jobs", type=int, default=200,
                    help="after the RSS reading, time this many jobs running with the backlog pending (0: skip)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {','.join(SECTIONS)}")
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
    rep = Report()
    if only & {"throughput", "latency", "cli"}:
        c = BenchCluster(slots=2)
        try:
            c.start()
            if "throughput" in only:
                bench_throughput(rep, c, args.runs, args.jobs)
            if "latency" in only:
                bench_latency(rep, c, args.latency_samples)
            if "cli" in only:
                bench_cli(rep, c, args.cli_samples)
        finally:
            c.stop()
    if "rss" in only:
        bench_rss(rep, args.pending, 1000, args.backlog_jobs)
    if "floors" in only:
        bench_xargs(rep, args.runs, args.jobs)
        if not args.no_hq:
            bench_hq(rep, args.runs, args.jobs, Path(args.hq_venv), not args.no_hq_install)
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

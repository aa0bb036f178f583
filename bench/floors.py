"""bench/run.py's floors: what the machine itself does (`seq N | xargs -P2 -n1 true`) and what
HyperQueue's LocalCluster does (bench/hq_floor.py, in a venv of its own), for scale.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


from report import Report, section


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


def bench_fsync(rep: Report, runs: int, writes: int = 200) -> None:
    """The disk's floor under a durable submit: one fdatasync after a 4 KiB append (as SQLite's WAL
    gets after each commit), on the file system the benchmark's homes are on (the temp dir).
    A client that POSTs one job at a time and waits for each reply pays at least one per job."""
    section(f"6c. floor: write 4 KiB + fdatasync on {tempfile.gettempdir()}, {writes} x {runs} runs")
    medians = []
    for _ in range(runs):
        fd, path = tempfile.mkstemp(prefix="xb-fsync-")
        try:
            took = []
            for _ in range(writes):
                os.write(fd, b"x" * 4096)
                t0 = time.perf_counter()
                os.fdatasync(fd)
                took.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
            os.unlink(path)
        medians.append(sorted(took)[len(took) // 2])
    rep.add("fdatasync of a 4 KiB append (each run's median)", "s", medians,
            peers="the least a durable one-POST round trip waits", key="fsync")


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


class HyperQueue:
    """HyperQueue's runs (bench/hq_floor.py in its venv, each on a fresh LocalCluster), kept as they
    come: run.py has one made after each round of its own throughput runs, so that both see the same
    hour of a shared machine (a block of HQ runs minutes later paired two different loads)."""

    def __init__(self, venv: Path, allow_install: bool):
        self.python, self.how = hq_python(venv, allow_install)
        self.results: list[dict] = []
        self.trouble: str | None = None  # why a run gave no result, if one did not

    def run(self, runs: int, n: int) -> None:
        """`runs` more runs of `n` tasks, in one process of the HQ venv."""
        if self.python is None:
            return
        tmp = tempfile.mkdtemp(prefix="xbhq-", dir="/tmp")  # HQ leaves sockets in $TMPDIR: keep them here
        proc = subprocess.Popen([str(self.python), str(HERE / "hq_floor.py"), str(runs), str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, TMPDIR=tmp))
        try:
            out, err = proc.communicate(timeout=60 + 40 * runs)
        except subprocess.TimeoutExpired:
            _kill_with_children(proc.pid)
            out, err = proc.communicate()
            self.trouble = "timed out; its process was killed (by PID)"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not got:
            self.trouble = f"no result (exit {proc.returncode}): {err.strip()[-300:]}"
        self.results += got


def bench_hq(rep: Report, runs: int, n: int, hq: HyperQueue) -> None:
    """HyperQueue's figures: of the runs `hq` made already (interleaved with ours), else `runs` now."""
    interleaved = bool(hq.results)
    section(f"6b. floor: HyperQueue LocalCluster (1 worker, 2 cores), {n} tasks, "
            + (f"{len(hq.results)} runs, one after each round of section 1-2" if interleaved else f"{runs} runs"))
    print(f"    {hq.how}")
    if hq.python is None:
        rep.note("HyperQueue", f"skipped: {hq.how}")
        rep.why_not["hq"] = hq.how
        return
    if not interleaved:
        hq.run(runs, n)
    if hq.trouble:
        rep.note("HyperQueue", hq.trouble)
    results = hq.results
    if not results:
        rep.why_not["hq"] = "HyperQueue gave no result"
        return
    rep.add(f"HQ {n}-task array job: submit", "s", [r["array_submit"] for r in results],
            peers="performance.md: 21.7 ms")
    rep.add(f"HQ {n}-task array job: throughput", "tasks/s", [n / r["array_wall"] for r in results],
            peers="performance.md: 164 tasks/s", key="hq_array")
    rep.add(f"HQ {n}-task array job: all done as its client's wait says (polls every 1 s)", "s",
            [r["array_polled"] for r in results])
    rep.add(f"HQ {n}-task array job: machine CPU per task", "ms", [1000 * r["array_cpu"] for r in results],
            key="hq_array_cpu")
    rep.add(f"HQ {n} one-task jobs: submit phase", "s", [r["jobs_submit"] for r in results],
            peers="performance.md: 0.64 s")
    rep.add(f"HQ {n} one-task jobs: throughput", "jobs/s", [n / r["jobs_wall"] for r in results],
            peers="performance.md: 141 jobs/s", key="hq_jobs")
    rep.add(f"HQ {n} one-task jobs: all done as its client's wait says (polls every 1 s)", "s",
            [r["jobs_polled"] for r in results])
    rep.add(f"HQ {n} one-task jobs: machine CPU per job", "ms", [1000 * r["jobs_cpu"] for r in results])
    print("    (HQ's throughput is timed to the end of its last task, which stamps the clock; its client's "
          "wait, which polls every second, is shown beside)")


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

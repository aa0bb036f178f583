#!/usr/bin/env python3
"""What one controller tick's commit costs the store, in a 2-slot `true` run's steady state.

    python bench/record_tick.py [--jobs 2000] [--runs 3] [--dir /tmp] [--together]
    cp bench/record_tick.py OTHER/bench/ && python OTHER/bench/record_tick.py    # another tree

A real store file (synchronous=FULL, WAL) gets --jobs jobs, one `submit` each (as one POST each),
with the spec, effective values and allocation a real run stores; then each tick is one
`record_tick` as the controller makes it while 2 slots turn over: job i dispatched, job i-1 started,
job i-2 finished (--together: job i-1 started and finished, as a tick records a job whose start
waited for its end: controller/start_wait.py). Per tick it prints medians of: the thread's CPU (all
of record_tick, and its COMMIT alone: writing the WAL frames and the fsync), the wall time, and two
counts the machine's load does not move: statements run (apsw's exec trace; an executemany counts
each row) and WAL frames written by the commit (SQLite's WAL hook: pages appended); and the means of
the CPU and the frames, which count the ticks whose COMMIT ran the WAL's auto-checkpoint (the
medians hide them). The same for one submit.
Asserts nothing; measures the tree this file is in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xce_lite.models import JobSpec
from xce_lite.store.jobs import Finish, JobStore, Plan, TickWrites

SPEC = {"argv": ["true"], "cwd": "/tmp/xb-bench/w", "stdout": "/tmp/xb-bench/w/out",
        "env": {"PATH": "/root/.pyenv/versions/3.11.7/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"},
        "app": "default", "exdata": {"app_origin": "default"}, "project": "default"}
# as a real run's dispatch stores them (one local host, the default profile)
ALLOC = {"allocs": [["local", 1, {"slots": 1}, []]], "shared": {}}
EFFECTIVE = {"schema": 1, "app": "default", "profile_hash": "04b22bb4b9c8ef7e", "min_tasks": 1, "max_tasks": 1,
             "resreq": "", "run_limit": None, "mem_limit": None, "profile_env": {}, "params": {},
             "annotations": {}, "hooks": {}, "job_starter": [], "mode": "direct", "launch": "auto",
             "origins": {"app": "default", "launch": "profile", "mem_limit": "default", "mode": "profile",
                         "run_limit": "default", "tasks": "default"},
             "retry": 0, "retry_on": None, "job_hooks": {}, "post_failure": "record"}


class Counter:
    """Statements and WAL frames of the writer connection, and the CPU time at its last COMMIT."""

    def __init__(self, con) -> None:
        self.statements = 0
        self.frames = 0
        self.commit_cpu_at = 0.0
        self._wal = 0
        con.exec_trace = self._trace
        con.set_wal_hook(self._wal_hook)

    def _trace(self, _cursor, sql: str, _bindings) -> bool:
        self.statements += 1
        if sql == "COMMIT":
            self.commit_cpu_at = time.thread_time()
        return True

    def _wal_hook(self, con, name: str, pages: int) -> int:
        # the hook replaces SQLite's auto-checkpoint: do what it does (a passive one past 1000 pages)
        self.frames += pages - self._wal if pages >= self._wal else pages
        self._wal = pages
        if pages >= 1000:
            con.wal_checkpoint(name)
            self._wal = 0
        return 0


def one_run(jobs: int, where: str, together: bool = False) -> dict[str, float]:
    spec = JobSpec.model_validate(SPEC) if hasattr(JobSpec, "model_validate") else JobSpec(**SPEC)
    with tempfile.TemporaryDirectory(prefix="xrt-", dir=where) as tmp:
        store = JobStore(Path(tmp) / "xce.db")
        count = Counter(store._con)
        sub_cpu, sub_frames, sub_statements = [], [], []
        now = time.time()
        ids = []
        for _ in range(jobs):
            s0, f0, c0 = count.statements, count.frames, time.thread_time()
            ids += store.submit([(spec, "normal")], "root", now)
            sub_cpu.append(time.thread_time() - c0)
            sub_frames.append(count.frames - f0)
            sub_statements.append(count.statements - s0)
        cpu, commit, wall, frames, statements = [], [], [], [], []
        for i in range(len(ids) + 2):
            t = now + i * 0.01
            lag = 1 if together else 2
            finishes = [(Finish(ids[i - lag], "RUN", "DONE", t - 0.005, t, 0, None, 0.0004, 8_970_240, None),
                         "finished")] if lag <= i < len(ids) + lag else []
            started = [(ids[i - 1], t - 0.001)] if 1 <= i <= len(ids) else []
            plans = [Plan(ids[i], 1, [["local", 1]], f"xce-b1-{ids[i]}-1-0", ALLOC, EFFECTIVE)] if i < len(ids) else []
            s0, f0 = count.statements, count.frames
            w0, c0 = time.perf_counter(), time.thread_time()
            store.record_tick(TickWrites(t, finishes, started, plans))
            c1 = time.thread_time()
            wall.append(time.perf_counter() - w0)
            cpu.append(c1 - c0)
            commit.append(c1 - count.commit_cpu_at)
            frames.append(count.frames - f0)
            statements.append(count.statements - s0)
        done = store._con.execute("SELECT count(*) FROM jobs WHERE state = 'DONE'").get
        store.close()
        assert done == jobs, done
    med = statistics.median
    return {"tick_cpu_ms": med(cpu) * 1e3, "commit_cpu_ms": med(commit) * 1e3, "tick_wall_ms": med(wall) * 1e3,
            "frames": med(frames), "statements": med(statements), "submit_cpu_ms": med(sub_cpu) * 1e3,
            "submit_frames": med(sub_frames), "submit_statements": med(sub_statements),
            # means too: the median hides the WAL's auto-checkpoints (one COMMIT in ~125 copies the pages back)
            "tick_cpu_mean_ms": statistics.fmean(cpu) * 1e3, "frames_mean": statistics.fmean(frames)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the store file goes (its file system)")
    parser.add_argument("--together", action="store_true", help="each tick starts and ends the same job")
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"tree {ROOT} ({head.stdout.strip()}); load {os.getloadavg()[0]:.2f}")
    runs = []
    for n in range(args.runs):
        r = one_run(args.jobs, args.dir, args.together)
        runs.append(r)
        print(f"run {n + 1}: record_tick CPU {r['tick_cpu_ms']:.3f} ms (COMMIT {r['commit_cpu_ms']:.3f}), wall "
              f"{r['tick_wall_ms']:.3f} ms, {r['statements']:g} statements, {r['frames']:g} WAL frames; submit "
              f"CPU {r['submit_cpu_ms']:.3f} ms, {r['submit_statements']:g} statements, {r['submit_frames']:g} frames")
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(f"median of {args.runs}: record_tick CPU {med['tick_cpu_ms']:.3f} ms "
          f"(COMMIT {med['commit_cpu_ms']:.3f}), wall {med['tick_wall_ms']:.3f} ms, {med['statements']:g} statements, "
          f"{med['frames']:g} WAL frames per tick (means, checkpoints included: CPU {med['tick_cpu_mean_ms']:.3f} ms, "
          f"{med['frames_mean']:.2f} frames); "
          f"submit CPU {med['submit_cpu_ms']:.3f} ms, {med['submit_statements']:g} statements, "
          f"{med['submit_frames']:g} WAL frames")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

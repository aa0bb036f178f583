#!/usr/bin/env python3
"""Accounting and retention benchmark (issue 17). Prints figures, asserts nothing.

    python bench/accounting.py                          # every figure: a few minutes here
    python bench/accounting.py --only acct --archived 1000000
    python bench/accounting.py --only retention --jobs 100000
    python bench/accounting.py --only size --rounds 30

  1. acct: an archive of --archived jobs (built directly through the store layer, as retention
     writes it: rows and day sums, over a year, 40 users, 4 queues, 16 hosts, 8 projects), then
     `xce acct` through a real controller, as a user runs it (process start, request, sums, print):
     by user over the whole year, by host over 60 days, by project from a time inside a day (the
     partial days read job by job), one user's by queue (read job by job). Goal: under 1 s.
  2. retention: --jobs finished jobs older than keep_finished in the live store (each with its
     four events and a spec carrying a 1 KB environment), then a real controller archives them:
     the time until none is left, and its ticks over 100 ms while it did (from the tick
     histogram of /metrics). Goal: no tick over 100 ms. Also each batch's time, measured
     directly on the store with the controller's Retention step.
  3. size: --rounds rounds of (submit --per-round jobs, run and finish them, retention) on a
     simulated clock, one day per round, keep_finished 3 days and keep_archived 10 days: the
     store's size (pages in use, and the file) after each round. Bounded: flat once both horizons
     have passed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # measure the tree this file is in, not whatever is installed

from cluster import BenchCluster

from xce_lite.config.cluster import ControllerConfig
from xce_lite.controller.retention import Retention
from xce_lite.models import JobSpec
from xce_lite.store.jobs import Finish, JobStore
from xce_lite.store.workflows import NewJob

DAY = 86400.0
ENV = {f"VAR{i}": "x" * 40 for i in range(20)}  # ~1 KB, as a submit's copy of an environment is


def _config(keep_finished: str = "30d") -> str:
    return (f"cluster: xb{random.randrange(10**6)}\nhosts:\n  - {{name: local, slots: 2, mem: 1G}}\n"
            f"queues:\n  - {{name: normal, default: true}}\ncontroller:\n  tick: 1s\n  grace: 2s\n"
            f"  keep_finished: {keep_finished}\n")


# ---- 1. acct over a big archive ------------------------------------------------------------------

def build_archive(store: JobStore, count: int, now: float, chunk: int = 50_000) -> float:
    rng = random.Random(1)
    began = time.monotonic()
    users = [f"user{i}" for i in range(40)]
    queues = ["normal", "short", "long", "gpu"]
    hosts = [f"node{i:02d}" for i in range(16)]
    projects = [None, "lab", "lab/vision", "lab/vision/gpu", "lab/nlp", "lab/nlp/big", "ops", "teach"]
    own = {u: rng.sample(projects, rng.choice((1, 2))) for u in users}  # a user works in one or two projects
    next_id = 1
    first = now - 365 * DAY
    while next_id <= count:
        rows = []
        for job_id in range(next_id, min(count, next_id + chunk - 1) + 1):
            end = first + (job_id + rng.random()) / count * 334 * DAY  # in the order they ended
            user = rng.choice(users)
            run = rng.expovariate(1 / 1800)
            wait = rng.expovariate(1 / 300)
            slots, gpus = rng.choice((1, 1, 2, 4, 8)), rng.choice((0, 0, 0, 1, 2))
            done = rng.random() < 0.9
            rows.append({"id": job_id, "user": user, "queue": rng.choice(queues), "project": rng.choice(own[user]),
                         "name": "sim", "state": "DONE" if done else "EXIT",
                         "array_id": None, "array_index": None, "submit_time": end - run - wait,
                         "start_time": end - run, "end_time": end, "exit_code": 0 if done else 1, "exit_signal": None,
                         "reason": None if done else "exit code 1", "slots": slots, "gpus": gpus,
                         "hosts": [[rng.choice(hosts), slots]], "cpu_time": run * slots * rng.random(),
                         "max_rss": rng.randrange(1 << 20, 1 << 33), "attempt": 1, "retries": 0,
                         "command": ["./sim", str(job_id)]})
        store.add_archived(rows)
        next_id += len(rows)
    return time.monotonic() - began


def figure_acct(count: int, runs: int) -> None:
    bench = BenchCluster(config=_config())
    try:
        store = JobStore(bench.home / "xce.db")
        took = build_archive(store, count, time.time())
        days = store._reader().execute("SELECT count(*) FROM usage_daily").get
        store.close()
        size = (bench.home / "xce.db").stat().st_size
        print(f"acct: built {count:,} archived jobs in {took:.1f} s ({days:,} day sums; store {size / 2**20:.0f} MB)")
        bench.start()
        inside_a_day = time.strftime("%Y-%m-%dT13:00", time.localtime(time.time() - 200 * DAY))
        for label, args in (("by user, the whole year", ["--since", "400d"]),
                            ("by host, last 60 days", ["--by", "host", "--since", "60d"]),
                            ("by project, from inside a day", ["--by", "project", "--since", inside_a_day]),
                            ("of one user, by queue, the whole year", ["-u", "user7", "--by", "queue", "--since",
                                                                        "400d"])):
            times = []
            for _ in range(runs):
                began = time.monotonic()
                result = bench.xce("acct", *args, "--json")
                times.append(time.monotonic() - began)
                if result.returncode != 0:
                    raise RuntimeError(result.stderr)
            total = json.loads(result.stdout)["total"]["jobs"]
            print(f"acct: xce acct {label}: {total:,} jobs counted; median {statistics.median(times):.3f} s, "
                  f"max {max(times):.3f} s over {runs} runs (goal: under 1 s)")
    finally:
        bench.stop()


# ---- 2. retention of 100,000 jobs ------------------------------------------------------------------

def build_live(store: JobStore, count: int, ended: float, chunk: int = 10_000) -> float:
    """`count` finished jobs through the store's own writes (submit, dispatch, start, finish)."""
    began = time.monotonic()
    spec = JobSpec(argv=("./sim",), cwd="/tmp", env=ENV)
    done = 0
    while done < count:
        n = min(chunk, count - done)
        ids = store.submit([NewJob(spec, "normal") for _ in range(n)], "alice", ended - 100)
        store.dispatch([(i, 1, [["local", 1]], f"u-{i}", {"allocs": [["local", 1, {"slots": 1}, []]], "shared": {}},
                         None) for i in ids], ended - 90)
        store.started([(i, ended - 90) for i in ids], ended - 90)
        store.finish([Finish(i, "RUN", "DONE", None, ended, 0, None, 1.0, 1 << 20, None) for i in ids], ended)
        done += n
    return time.monotonic() - began


def figure_retention(count: int) -> None:
    bench = BenchCluster(config=_config("30d"))
    try:
        store = JobStore(bench.home / "xce.db")
        took = build_live(store, count, time.time() - 40 * DAY)
        store.close()
        print(f"retention: built {count:,} finished jobs 40 days old in {took:.1f} s "
              f"(store {(bench.home / 'xce.db').stat().st_size / 2**20:.0f} MB)")
        before = _ticks(bench)
        began = time.monotonic()
        bench.start()
        reader = JobStore(bench.home / "xce.db", readonly=True)
        while reader._reader().execute("SELECT count(*) FROM jobs").get > 0:
            time.sleep(0.2)
        drained = time.monotonic() - began
        reader.close()
        after = _ticks(bench)
        slow = after["over"] - before["over"]
        print(f"retention: {count:,} jobs archived by a running controller in {drained:.1f} s "
              f"({count / drained:,.0f} jobs/s); ticks: {after['count']:,}, over 100 ms: {slow} "
              f"(goal: none); slowest tick at most {after['max_bucket']}")
    finally:
        bench.stop()
    # each batch, measured directly with the controller's own step on a fresh copy
    bench = BenchCluster(config=_config("30d"))
    try:
        store = JobStore(bench.home / "xce.db")
        build_live(store, count, time.time() - 40 * DAY)
        step = Retention(lambda _m: None)
        config = ControllerConfig()
        times, batches = [], []
        while store._reader().execute("SELECT count(*) FROM jobs").get > 0:
            batch = step.batch
            began = time.monotonic()
            step.next_at = 0.0
            step.step(store, config, time.time(), busy=False)
            times.append(time.monotonic() - began)
            batches.append(batch)
        store.close()
        times.sort()
        print(f"retention: {len(times)} batches of {min(batches)}-{max(batches)} jobs: median "
              f"{statistics.median(times) * 1000:.1f} ms, p99 {times[int(len(times) * 0.99)] * 1000:.1f} ms, "
              f"max {times[-1] * 1000:.1f} ms (goal: under 100 ms)")
    finally:
        bench.stop()


def _ticks(bench: BenchCluster) -> dict:
    """The tick histogram of /metrics: ticks, ticks over 100 ms, the bucket of the slowest."""
    if bench.pid is None:
        return {"count": 0, "over": 0, "max_bucket": "-"}
    tick = bench.client().get("/metrics")["registry"]["histograms"]["tick"]
    buckets = tick["buckets"]  # [[le, cumulative count], ...], the last le "+Inf"
    within = next(n for le, n in buckets if le == 0.1)
    top = next(le for le, n in buckets if n == tick["count"])
    return {"count": tick["count"], "over": tick["count"] - within, "max_bucket": f"{top} s"}


# ---- 3. the store's size under a steady load --------------------------------------------------------

def figure_size(rounds: int, per_round: int) -> None:
    bench = BenchCluster(config=_config())
    try:
        path = bench.home / "xce.db"
        store = JobStore(path)
        config = ControllerConfig(keep_finished=3 * DAY, keep_archived=10 * DAY)
        step = Retention(lambda _m: None)
        t0 = time.time() - rounds * DAY
        sizes = []
        for r in range(rounds):
            now = t0 + r * DAY
            build_live(store, per_round, now, chunk=per_round)
            step.next_at = 0.0
            while True:
                step.step(store, config, now, busy=False)
                if step.next_at > time.monotonic():
                    break
                step.next_at = 0.0
            con = store._reader()
            used = (con.execute("PRAGMA page_count").get - con.execute("PRAGMA freelist_count").get) \
                * con.execute("PRAGMA page_size").get
            live = con.execute("SELECT count(*) FROM jobs").get
            archived = con.execute("SELECT count(*) FROM jobs_archive").get
            sizes.append(path.stat().st_size)
            print(f"size: round {r + 1:3d}: {live:6,} live, {archived:7,} archived; pages in use "
                  f"{used / 2**20:6.1f} MB, file {sizes[-1] / 2**20:6.1f} MB")
        store.close()
        late = sizes[len(sizes) // 2:]
        print(f"size: second half of the rounds: file from {min(late) / 2**20:.1f} to {max(late) / 2**20:.1f} MB "
              f"(bounded: flat once keep_archived has passed)")
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="acct,retention,size")
    parser.add_argument("--archived", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--per-round", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    only = set(args.only.split(","))
    if "acct" in only:
        figure_acct(args.archived, args.runs)
    if "retention" in only:
        figure_retention(args.jobs)
    if "size" in only:
        figure_size(args.rounds, args.per_round)


if __name__ == "__main__":
    main()

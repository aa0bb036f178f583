"""HyperQueue floor, run by the HQ venv's python (never the main environment):

    /tmp/bench-hq-venv/bin/python bench/hq_floor.py RUNS N

HyperQueue's PyPI wheel has no `hq` binary; its .so embeds the server and the worker, started
in this very process by `hyperqueue.LocalCluster` (one worker, 2 cores). Per run, on a fresh
cluster: one job of N `true` tasks (like `hq submit --array 1-N -- true`), then N one-task jobs
(like N x `hq submit -- true`); stdout/stderr disabled. Prints one JSON object per line.

HQ's client waits by polling once a second (crates/pyhq/src/client/job.rs sleeps 1 s between status
queries), so the wall it gives ("*_polled") is late by up to 1 s: 2.02 s where the tasks had ended at
1.81 s. The wall we compare with ("*_wall") is the end of the LAST task submitted: it runs
`sh -c 'date +%s.%N > FILE'` instead of `true` and writes the clock as it ends. Another task may still
run a moment after it (or many, were HQ to start it early): if anything this figure is early, which
flatters HQ, never us.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from hyperqueue import Job, LocalCluster
from hyperqueue.cluster import WorkerConfig
from stats import machine_busy_seconds


def _wait(client, submitted) -> None:
    # The FFI wait without Client.wait_for_jobs's tqdm progress bar.
    failed = client.connection.wait_for_jobs(tuple(s.id for s in submitted), lambda _jobs: None)
    if failed:
        raise RuntimeError(f"{len(failed)} HQ job(s) failed")


def _program(job: Job, last: bool, marker: str) -> None:
    """`true`, or for the last task the one that stamps the end (see the module's docstring)."""
    argv = ["sh", "-c", f"date +%s.%N > {marker}"] if last else ["true"]
    job.program(argv, stdout=None, stderr=None)


def _ended(marker: str) -> float:
    with open(marker) as f:
        return float(f.read())


def one_run(n: int, cwd: str) -> dict:
    server_dir = tempfile.mkdtemp(prefix="hq-", dir=cwd)
    cluster = LocalCluster(server_dir=server_dir, worker_config=WorkerConfig(cores=2))
    try:
        client = cluster.client()
        # warm-up: one task, so the worker is registered before timing starts
        warm = Job(default_workdir=cwd)
        warm.program(["true"], stdout=None, stderr=None)
        _wait(client, [client.submit(warm)])

        marker = os.path.join(cwd, "ended")
        job = Job(default_workdir=cwd)
        for i in range(n):
            _program(job, i == n - 1, marker)
        busy0 = machine_busy_seconds()
        w0, t0 = time.time(), time.perf_counter()
        sub = client.submit(job)
        t1 = time.perf_counter()
        _wait(client, [sub])
        t2 = time.perf_counter()
        array_wall = _ended(marker) - w0
        array_cpu = (machine_busy_seconds() - busy0) / n

        subs = []
        busy3 = machine_busy_seconds()
        w3, t3 = time.time(), time.perf_counter()
        for i in range(n):
            one = Job(default_workdir=cwd)
            _program(one, i == n - 1, marker)
            subs.append(client.submit(one))
        t4 = time.perf_counter()
        _wait(client, subs)
        t5 = time.perf_counter()
        jobs_cpu = (machine_busy_seconds() - busy3) / n
        return {"array_submit": t1 - t0, "array_wall": array_wall, "array_polled": t2 - t0, "array_cpu": array_cpu,
                "jobs_submit": t4 - t3, "jobs_wall": _ended(marker) - w3, "jobs_polled": t5 - t3, "jobs_cpu": jobs_cpu}
    finally:
        cluster.stop()


def main() -> int:
    runs, n = int(sys.argv[1]), int(sys.argv[2])
    cwd = tempfile.mkdtemp(prefix="w-")  # under $TMPDIR, which bench/run.py points at its own temp dir
    os.chdir(cwd)
    try:
        for _ in range(runs):
            print(json.dumps(one_run(n, cwd)), flush=True)
    finally:
        os.chdir("/")
        shutil.rmtree(cwd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

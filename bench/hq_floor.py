"""HyperQueue floor, run by the HQ venv's python (never the main environment):

    /tmp/bench-hq-venv/bin/python bench/hq_floor.py RUNS N

HyperQueue's PyPI wheel has no `hq` binary; its .so embeds the server and the worker, started
in this very process by `hyperqueue.LocalCluster` (one worker, 2 cores). Per run, on a fresh
cluster: one job of N `true` tasks (like `hq submit --array 1-N -- true`), then N one-task jobs
(like N x `hq submit -- true`); stdout/stderr disabled. Prints one JSON object per line.

Caveat (as in performance.md 1.2): HQ's client waits by polling about once a second, so its wall
times may be overstated by up to ~1 s.
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


def _wait(client, submitted) -> None:
    # The FFI wait without Client.wait_for_jobs's tqdm progress bar.
    failed = client.connection.wait_for_jobs(tuple(s.id for s in submitted), lambda _jobs: None)
    if failed:
        raise RuntimeError(f"{len(failed)} HQ job(s) failed")


def one_run(n: int, cwd: str) -> dict:
    server_dir = tempfile.mkdtemp(prefix="hq-", dir=cwd)
    cluster = LocalCluster(server_dir=server_dir, worker_config=WorkerConfig(cores=2))
    try:
        client = cluster.client()
        # warm-up: one task, so the worker is registered before timing starts
        warm = Job(default_workdir=cwd)
        warm.program(["true"], stdout=None, stderr=None)
        _wait(client, [client.submit(warm)])

        job = Job(default_workdir=cwd)
        for _ in range(n):
            job.program(["true"], stdout=None, stderr=None)
        t0 = time.perf_counter()
        sub = client.submit(job)
        t1 = time.perf_counter()
        _wait(client, [sub])
        t2 = time.perf_counter()

        t3 = time.perf_counter()
        subs = []
        for _ in range(n):
            one = Job(default_workdir=cwd)
            one.program(["true"], stdout=None, stderr=None)
            subs.append(client.submit(one))
        t4 = time.perf_counter()
        _wait(client, subs)
        t5 = time.perf_counter()
        return {"array_submit": t1 - t0, "array_wall": t2 - t0, "jobs_submit": t4 - t3, "jobs_wall": t5 - t3}
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

#!/usr/bin/env python3
"""What a one-job submit with a request id reads and writes, with many ids kept (branch post4).

    python bench/request_ids.py [--kept 200000] [--submits 3000] [--runs 2]
    python bench/request_ids.py --kept 0 --no-sync [--kinds ordered,none]   # SQLite and Python alone

A throw-away store (JobStore, durable, in /tmp) gets --kept request ids (as a day of `keep_requests`
holds them), random ones or time-ordered ones (api/client.py's new_request_id: the time in ns, then
random bits), then --submits one-job `submit_once` calls with ids of the same kind. Printed per
submit: read and write system calls and bytes written (this process's /proc/self/io: deterministic
counts, unlike times) and the thread's CPU (noise on a busy box). Both kinds alternate, --runs each.
--kinds none submits without a request id (`submit`, as run.py's one-POST figure sends them); --no-sync
opens the store with durable=False (no fdatasync: the CPU of SQLite and the Python around it alone,
which the fdatasync's, several times larger on a busy disk, otherwise hides).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xce_lite.models import JobSpec
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob

_FILL = ("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
         "INSERT INTO submit_requests(request_id, user, job_ids, submit_time) SELECT {key}, 'u', '[1]', "
         "?2 - 3600 + i * 3600.0 / ?1 FROM c")
_KEYS = {"random": "lower(hex(randomblob(16)))",
         "ordered": "printf('%016x', CAST((?2 - 3600 + i * 3600.0 / ?1) * 1e9 AS INTEGER)) "
                    "|| lower(hex(randomblob(8)))"}


def request_id(kind: str) -> str:
    return os.urandom(16).hex() if kind == "random" else f"{time.time_ns():016x}{os.urandom(8).hex()}"


def _io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def run(kind: str, kept: int, submits: int, durable: bool = True) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="xb-rid-", dir="/tmp"))
    store = JobStore(root / "x.db", durable=durable)
    try:
        if kept and kind != "none":
            with store._write() as con:
                con.execute(_FILL.format(key=_KEYS[kind]), (kept, time.time()))
        item = NewJob(JobSpec(argv=["true"], cwd=str(root), stdout=str(root / "out"), name="post"), "normal", (), None)
        def submit() -> None:
            if kind == "none":
                store.submit([item], "u", time.time())
            else:
                store.submit_once([item], "u", time.time(), request_id(kind))

        for _ in range(300):  # the cache warm, the WAL at its size
            submit()
        before, cpu = _io(), time.thread_time()
        for _ in range(submits):
            submit()
        cpu, after = time.thread_time() - cpu, _io()
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"reads": (after["syscr"] - before["syscr"]) / submits,
            "writes": (after["syscw"] - before["syscw"]) / submits,
            "kb": (after["wchar"] - before["wchar"]) / submits / 1024, "cpu": cpu / submits * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=200_000, help="request ids stored before")
    parser.add_argument("--submits", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--kinds", default="random,ordered", help="of random, ordered, none (no request id)")
    parser.add_argument("--no-sync", action="store_true", help="durable=False: no fdatasync per commit")
    args = parser.parse_args(argv)
    for _ in range(args.runs):
        for kind in args.kinds.split(","):
            r = run(kind, args.kept, args.submits, durable=not args.no_sync)
            print(f"{kind:8s} ids, {args.kept} kept: per submit {r['reads']:.2f} read calls, {r['writes']:.2f} write "
                  f"calls, {r['kb']:.1f} KB written; thread CPU {r['cpu']:.0f} us (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

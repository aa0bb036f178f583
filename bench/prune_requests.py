"""What forgetting old submit request ids costs the store: figures, no assertions.

    python bench/prune_requests.py                      # 20,000 ids, half of them old
    python bench/prune_requests.py --ids 50000 --batch 5000

A fresh store (a real SQLite file, WAL, synchronous=FULL) gets `--ids` one-job submissions with a
request id each, one transaction apiece as the controller makes them, half of them a day older than
the rest; then `prune_requests` runs in batches of `--batch` until nothing old is left, as the
retention step does. Printed: the batches, the median and slowest batch (ms: the write lock is held
that long), and how long a repeat lookup of a kept id takes before and after (ms, median of 200).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from xce_lite.models import JobSpec
from xce_lite.store.jobs import JobStore
from xce_lite.store.workflows import NewJob

T = 1_700_000_000.0
DAY = 86400.0


def lookups(store: JobStore, ids: list[str]) -> float:
    took = []
    for request_id in ids:
        began = time.perf_counter()
        store.submitted(request_id, "alice")
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(Path(tmp) / "jobs.db")
        job = NewJob(JobSpec(argv=("true",), cwd="/"), "normal")
        began = time.perf_counter()
        for i in range(args.ids):
            when = T + i if i < args.ids // 2 else T + DAY + i
            store.submit_once([job], "alice", when, f"bench-{i:08d}")
        filled = time.perf_counter() - began
        kept = [f"bench-{i:08d}" for i in range(args.ids - 200, args.ids)]
        before = lookups(store, kept)
        batches = []
        while True:
            began = time.perf_counter()
            gone = store.prune_requests(T + DAY, args.batch)
            batches.append(time.perf_counter() - began)
            if gone < args.batch:
                break
        after = lookups(store, kept)
        left = store.request_count()
        store.close()
    print(f"{args.ids} ids stored in {filled:.1f} s ({filled / args.ids * 1000:.2f} ms per submission)")
    print(f"pruned in {len(batches)} batches of {args.batch}: median {statistics.median(batches) * 1000:.1f} ms, "
          f"slowest {max(batches) * 1000:.1f} ms; {left} ids left")
    print(f"repeat lookup of a kept id: {before:.3f} ms before, {after:.3f} ms after")


if __name__ == "__main__":
    main()

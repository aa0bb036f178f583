"""Throughput of LocalHost end to end: launch N `true` units in batches, wait for every finished event.

Run by hand (not a test; timings are not assertions):

    python -m tests.support.bench_local_host [N] [BATCH] [DIR]

DIR (default: the system's temporary directory) holds the spool and the jobs' output. The spool's
file system matters less than it did: a unit appends four records to the spool's journal (one with
an fdatasync) and creates no file, whereas creating an inode costs ~0.3-1 ms of CPU on ext4 without
a journal. Run it under `/usr/bin/time` too: the CPU time of the whole tree varies less than the
rate on a busy machine.
"""

from __future__ import annotations

import os
import queue
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's xce_lite

from xce_lite.exec.host import LaunchRequest, UnitFinished
from xce_lite.exec.local import LocalHost


def bench(n: int = 1000, batch: int = 100, base: str | None = None) -> float:
    """Jobs per second from the first launch to the last finished event."""
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        host, events = LocalHost("bench", Path(tmp) / "spool"), queue.Queue()
        host.connect(events)
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        requests = [
            LaunchRequest(unit=f"u{i}", argv=("true",), env=env, cwd=tmp, stdout=f"{tmp}/out", stderr=None)
            for i in range(n)
        ]
        started = time.perf_counter()
        for i in range(0, n, batch):
            replies = host.launch(requests[i : i + batch])
            assert all(r.status == "started" for r in replies), replies
        done = 0
        while done < n:
            event = events.get(timeout=60)
            assert isinstance(event, UnitFinished) and event.result.exit_code == 0, event
            done += 1
        elapsed = time.perf_counter() - started
        host.close()
    return n / elapsed


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    base = sys.argv[3] if len(sys.argv) > 3 else None
    rate = bench(n, batch, base)
    print(
        f"{n} true units in batches of {batch}, spool in {base or tempfile.gettempdir()}: {rate:.0f} jobs/s"
    )

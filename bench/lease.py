#!/usr/bin/env python3
"""What the host lease costs and how closely a host keeps it, on a local agent in plain mode.

    python bench/lease.py [--grants 200] [--expiries 10] [--lease 1.0]

1. `grant round trip`: one `lease` request answered (the agent replaces SPOOL/lease each time),
   --grants samples, one after the other: the controller renews every host every lease/4 seconds,
   so this is the whole cost of the lease on the channel.
2. `expiry -> job ended`: a lease of --lease seconds is granted, a `sleep` job launched and the
   lease left to run out; the job's recorded end time minus the lease's end (both converted to
   this machine's wall clock: the agent runs here, so the lease clock is ours). This is what
   `controller.lease_margin` must cover beyond the job's grace and post hooks. --expiries samples.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xce_lite.exec.host import LaunchRequest, UnitFinished
from xce_lite.exec.local import LocalHost, supervisor_pids
from xce_lite.testhosts.base import kill_tree


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grants", type=int, default=200)
    parser.add_argument("--expiries", type=int, default=10)
    parser.add_argument("--lease", type=float, default=1.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="xb-lease-"))
    events: queue.Queue = queue.Queue()
    host = LocalHost("bench", root / "spool", mode="plain")
    try:
        probe = host.connect(events)
        boot = probe.extra["boot_id"]
        trips = []
        for _ in range(args.grants):
            host.ping()  # the channel warm, as the controller's is
            began = time.perf_counter()
            reply = host.grant_lease(boottime() + 60, 60, boot)
            trips.append(time.perf_counter() - began)
            assert reply["ok"]
        print(f"grant round trip: median {statistics.median(trips) * 1e3:.3f} ms, "
              f"p95 {sorted(trips)[int(len(trips) * 0.95)] * 1e3:.3f} ms ({len(trips)} grants)")
        lags = []
        for n in range(args.expiries):
            host.close()
            (root / "spool" / "lease").unlink()  # start each sample from no lease at all
            host = LocalHost("bench", root / "spool", mode="plain")
            host.connect(events)
            until = boottime() + args.lease
            host.grant_lease(until, args.lease, boot)
            unit = f"xb-lease-{n}"
            host.launch([LaunchRequest(unit, ("sleep", "60"), {"PATH": "/usr/bin:/bin"}, str(root),
                                       str(root / "out"), None, grace=1.0)])
            offset = time.time() - boottime()
            while True:
                event = events.get(timeout=60)
                if isinstance(event, UnitFinished) and event.unit == unit:
                    break
            lags.append(event.result.end_time - (until + offset))
        print(f"expiry -> job ended: median {statistics.median(lags) * 1e3:.1f} ms, "
              f"max {max(lags) * 1e3:.1f} ms ({len(lags)} expiries of a {args.lease:g} s lease)")
    finally:
        host.close()
        for pid in supervisor_pids(root / "spool"):
            kill_tree(pid)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

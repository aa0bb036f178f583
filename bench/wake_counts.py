#!/usr/bin/env python3
"""Which host events woke the controller's tick and which waited for the next (controller/quiet_ends.py):
bench/ticktime.py with one more count per event type, in the timed controller process only.

    python bench/wake_counts.py [ticktime's options: --jobs 1000 --depth 3 ...]

Adds to ticktime's step table one line per host event type and outcome: "event UnitFinished quiet"
(queued without waking the tick: seams.WakingQueue's `quiet` rule said so) or "... WAKES". Counts,
which the machine's load moves little; ticktime's own figures beside them. Nothing in xce_lite/ changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ticktime  # (bench/ on the path first)


def _count() -> None:
    """Count each event put on the controller's queue by type and by whether it woke the tick."""
    import queue

    from xce_lite.controller import seams

    stats, lock = ticktime._stats, ticktime._stats_lock

    def put(self, item, block=True, timeout=None):  # WakingQueue.put's own steps, and the count
        queue.Queue.put(self, item, block, timeout)
        quiet = self._quiet is not None and self._quiet(item)
        if not quiet:
            self._wake.set()
        with lock:
            stats[f"event {type(item).__name__} {'quiet' if quiet else 'WAKES'}"][0] += 1

    seams.WakingQueue.put = put


def main() -> int:
    if "--serve" in sys.argv:
        _count()
    ticktime.__file__ = str(Path(__file__).resolve())  # the --serve child is this file
    return ticktime.main()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())

"""The controller's scheduler seam: a small session on the controller's own thread, a large one in the
worker process (sched_worker.py).

Why both: the hop to the worker (pickle, pipe, two wake-ups) costs each session ~0.75 ms of the
tick's wall, the serial bottleneck of a busy small cluster, while a small session costs the core
~0.3 ms; but a session over 10,000s of pending jobs must not hold the GIL over the API's threads
(DESIGN.md), and in the worker it does not. So the side is chosen per session by the pending set's
size, with hysteresis (to the worker above `up` jobs, back below `down`) so that it does not flap,
and a session run inline that cost more than `slow` seconds of the thread's CPU (a large cluster,
a costly policy) sends the next ones to the worker and lowers the bounds to that size.

Invariants: the side taking over starts afresh (`resync`: the whole pending set, every reason
answered, no session skipped on the memory of an earlier answer), so neither side ever answers
from what it held before the other ran: decisions and reasons are the core's alone on the whole
snapshot, whichever side ran. The worker process is started only when a session first goes to it
(a small cluster never pays its memory); one that died, on either side's watch, is started again
by the next session sent to it, as before.
"""

from __future__ import annotations

import time
from typing import Any

from xce_lite.controller import sched_worker
from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched.core import Decisions, Snapshot

UP, DOWN = 2000, 1000  # pending jobs: to the worker above UP, back inline at DOWN or fewer
SLOW = 0.05  # s of the controller thread's CPU for one inline session (not a full one): too long


class SwitchingScheduler:
    """SchedulerProcess's contract (send under the controller's lock, then receive; close), each
    session on the side its size calls for (module docstring). Not thread-safe: the tick alone."""

    def __init__(self, up: int = UP, down: int = DOWN, slow: float | None = SLOW, timeout: float = 60.0,
                 shortcut: bool = True) -> None:
        if not 0 <= down < up:
            raise ValueError(f"the scheduler's bounds must be 0 <= down < up (down {down}, up {up})")
        self.up, self.down, self.slow = up, down, slow
        self._timeout, self._shortcut = timeout, shortcut
        self._inline = sched_worker.InlineScheduler(shortcut=shortcut)
        self._process: Any = None  # made when a session first goes to the worker
        self._in_worker = False  # the side of the sessions now
        self._side: Any = None  # the side of the session sent, for receive
        self._size = 0  # the pending set's size at the session sent
        self._full = False  # the inline session sent takes the whole set (its cost says nothing)
        self.switches = 0  # times a session went to the other side than the last one's

    @property
    def skipped(self) -> int:
        """Sessions not run on either side: they would have repeated the last answer."""
        return self._inline.skipped + (self._process.skipped if self._process is not None else 0)

    @property
    def in_worker(self) -> bool:
        return self._in_worker

    def _worker(self) -> Any:
        if self._process is None:
            # looked up now, not at import: bench/ticktime.py's what-ifs put their own in its place
            self._process = sched_worker.SchedulerProcess(timeout=self._timeout, shortcut=self._shortcut)
        return self._process

    def send(self, pending: PendingSet, base: Snapshot, budget: int) -> None:
        """Start a session on the side `pending`'s size calls for; see SchedulerProcess.send."""
        size = self._size = len(pending)
        to_worker = size > self.up if not self._in_worker else size > self.down
        if to_worker != self._in_worker:
            self._in_worker = to_worker
            self.switches += 1
            # the side taking over missed the changes the other one took: it starts afresh
            (self._worker() if to_worker else self._inline).resync()
        self._side = self._worker() if to_worker else self._inline
        self._full = not to_worker and self._inline.full_next
        self._side.send(pending, base, budget)

    def receive(self) -> Decisions | None:
        """The session's decisions; None if it must be sent again in full (see SchedulerProcess.receive)."""
        side, self._side = self._side, None
        if side is not self._inline:
            return side.receive() if side is not None else None
        began = time.thread_time()
        decisions = side.receive()
        if self.slow is not None and not self._full and time.thread_time() - began > self.slow:
            self._too_slow()
        return decisions

    def _too_slow(self) -> None:
        """An inline session held the thread too long at this size: this size and more go to the
        worker from now on (the worker resyncs at the next send, as any switch does)."""
        self.up = max(1, min(self.up, self._size - 1))
        self.down = min(self.down, self.up // 2)

    def close(self) -> None:
        self._inline.close()
        if self._process is not None:
            self._process.close()

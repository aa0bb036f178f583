"""The controller's scheduler seam: sessions on the controller's own thread while they are cheap there,
in the worker process (sched_worker.py) when they are not.

Why (bench/README.md, "The scheduler's worker"): the hop to the worker (pickle, pipe, two wake-ups)
costs each session ~0.7 ms of the tick's wall, the serial bottleneck of a busy small cluster, while
a steady session inline costs the thread ~0.2 ms at 1,000 pending; but an inline session's cost
grows with the set (~0.8 ms at 10,000), all of it holding the GIL, while the worker's costs the
controller's thread ~0.25 ms at any size: measured with one POST per job and every slot full, the
controller's main thread spends less per POST inline at 1,500 pending, more at 4,000, and 5x more
at 10,000, where the API's rate drops (DESIGN.md's promise: a large session does not hold the GIL
over the API's threads). The bound is 1,000, not the 1,500-2,000 that CPU alone would choose: an
inline session of 2,000 jobs raised the controller's peak RSS with 10,000 pending by ~1.5 MB, to the
60 MB goal's edge (bench/run.py --only rss, 19:18 on 2026-12-02). So a session goes to the worker
when the set is larger than `up`, or when `slow_run` inline sessions in a row (full ones aside:
their cost is known, and is less inline than through the worker's pickling) each took more than
`slow` seconds of the thread's CPU (many hosts, a costly policy); then `up` drops to that size. It
comes back at `down` jobs or fewer (hysteresis: `down` < `up`, so the side does not flap). A
lowered bound is a guess from a few sessions (a GC pass, a burst of submissions, a busy core can
make them slow), so it rises again: after
`rise_after` sessions in a row with no slow inline one (fast inline sessions, and sessions in the
worker, whose cost to this thread does not grow with the set), `up` doubles, never past the bounds
it was made with; each lowering that follows a rise doubles the wait before the next rise (up to
RISE_CAP), so a cluster whose sessions really are costly pays a probe more and more rarely.

Invariants: the side taking over starts afresh (`resync`: the whole pending set, every reason
answered, no session skipped on the memory of an earlier answer), so neither side answers from
what it held before the other ran: decisions and reasons are the core's alone on the whole
snapshot, whichever side ran. The worker process is first started when the set passes `down`, on a
thread of its own (never under the controller's lock), and sessions stay inline until it is up (a
cluster whose sets stay small never pays its ~30 MB PSS); one that died, whichever side ran then,
is started again by the next session sent to it, as before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from xce_lite.controller import sched_worker
from xce_lite.controller.pending_set import PendingSet
from xce_lite.sched.core import Decisions, Snapshot

UP, DOWN = 1000, 500  # pending jobs: to the worker above UP, back inline at DOWN or fewer
SLOW = 0.003  # s of the controller thread's CPU for an inline session (not a full one): too long,
SLOW_RUN = 3  # when that many in a row are (one alone may be a GC pass or a burst of submissions)
RISE_AFTER = 100  # sessions in a row without a slow inline one: a lowered `up` doubles (module docstring)
RISE_CAP = 64  # the wait before a rise grows to RISE_AFTER * RISE_CAP sessions at most


class SwitchingScheduler:
    """SchedulerProcess's contract (send under the controller's lock, then receive; close), each
    session on the side its size calls for (module docstring). Not thread-safe: the tick alone."""

    def __init__(self, up: int = UP, down: int = DOWN, slow: float | None = SLOW, slow_run: int = SLOW_RUN,
                 timeout: float = 60.0, shortcut: bool = True, background_start: bool = True,
                 rise_after: int = RISE_AFTER) -> None:
        if not 0 <= down < up:
            raise ValueError(f"the scheduler's bounds must be 0 <= down < up (down {down}, up {up})")
        self.up, self.down, self.slow, self.slow_run = up, down, slow, slow_run
        self._bounds = (up, down)  # as made: a lowered bound rises back to these at most
        self.rise_after = rise_after  # the wait before the next rise, in sessions (doubles per failed rise)
        self._slow_seen = 0  # inline sessions in a row that took more than `slow`
        self._fine_seen = 0  # sessions in a row, since the last change of `up`, with no slow inline one
        self._rose = False  # the last change of `up` was a rise: a lowering now is a failed probe
        self._timeout, self._shortcut = timeout, shortcut
        self._inline = sched_worker.InlineScheduler(shortcut=shortcut)
        self._process: Any = None  # made when the set first passes `down`
        self._background = background_start  # False: the worker's first start is made in send (tests)
        self._starter: threading.Thread | None = None  # the worker's first start, under way
        self._in_worker = False  # the side of the sessions now
        self._side: Any = None  # the side of the session sent, for receive
        self._size = 0  # the pending set's size at the session sent
        self._measure = False  # the inline session sent is one whose cost counts (receive)
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

    def _worker_ready(self, size: int) -> bool:
        """Whether a session may go to the worker. Its first start (~0.3 s of forkserver and imports)
        is made on a thread of its own once the set passes `down`, not in `send`, which runs under
        the controller's lock (the API's requests would wait on it); until it is up, sessions stay
        inline. A worker that died later is started again by its next send, as always."""
        if self._starter is not None:
            if self._starter.is_alive():
                return False
            self._starter.join()
            self._starter = None
            return True
        if self._process is not None:
            return True
        if size <= self.down:
            return False
        if not self._background:
            self._worker().start()
            return True
        self._starter = threading.Thread(target=_start_quietly, args=(self._worker(),), name="xce-scheduler-start",
                                         daemon=True)
        self._starter.start()
        return False

    def send(self, pending: PendingSet, base: Snapshot, budget: int) -> None:
        """Start a session on the side `pending`'s size calls for; see SchedulerProcess.send."""
        size = self._size = len(pending)
        ready = self._in_worker or self._worker_ready(size)
        to_worker = ready and (size > self.up if not self._in_worker else size > self.down)
        if to_worker != self._in_worker:
            self._in_worker = to_worker
            self.switches += 1
            # the side taking over missed the changes the other one took: it starts afresh
            (self._worker() if to_worker else self._inline).resync()
            if to_worker:
                self._inline.let_go()  # what it holds of the set is the controller's memory, idle now
        self._side = self._worker() if to_worker else self._inline
        # an inline session's cost tells something unless it is a full one (known to cost) or skipped
        measure, skipped = not to_worker and not self._inline.full_next, self._inline.skipped
        self._side.send(pending, base, budget)
        self._measure = measure and self._inline.skipped == skipped

    def receive(self) -> Decisions | None:
        """The session's decisions; None if it must be sent again in full (see SchedulerProcess.receive)."""
        side, self._side = self._side, None
        if side is not self._inline:
            decisions = side.receive() if side is not None else None
            if decisions is not None:
                self._fine()  # the worker's session: its cost to this thread does not grow with the set
            return decisions
        began = time.thread_time()
        decisions = side.receive()
        if self.slow is None or not self._measure:
            return decisions
        if time.thread_time() - began <= self.slow:
            self._slow_seen = 0
            self._fine()
            return decisions
        self._slow_seen += 1
        self._fine_seen = 0
        if self._slow_seen >= self.slow_run:
            # this size and more go to the worker from now on (it resyncs at the next send)
            self._slow_seen = 0
            up = max(1, min(self.up, self._size - 1))
            if up < self.up:  # (a set past `up` ran inline only while the worker started: no news)
                if self._rose:  # the last rise was too much: wait longer before the next one
                    self.rise_after = min(self.rise_after * 2, RISE_AFTER * RISE_CAP)
                self._rose = False
            self.up = up
            self.down = min(self.down, self.up // 2)
        return decisions

    def _fine(self) -> None:
        """A session with no slow inline cost: after `rise_after` in a row, a lowered `up` doubles
        (never past the bounds made with); the next slow run brings it down again."""
        if (self.up, self.down) == self._bounds:
            return
        self._fine_seen += 1
        if self._fine_seen < self.rise_after:
            return
        self._fine_seen = 0
        self._rose = True
        self.up = min(self._bounds[0], self.up * 2)
        self.down = min(self._bounds[1], self.up // 2) if self.up < self._bounds[0] else self._bounds[1]

    def close(self) -> None:
        self._inline.close()
        if self._starter is not None:
            self._starter.join()
            self._starter = None
        if self._process is not None:
            self._process.close()


def _start_quietly(process: Any) -> None:
    """The worker's first start, on a thread of its own. A failure (no fd, no memory) is not told
    here, where it would be a bare traceback in the log: the next send to the worker starts it
    again, under the controller's lock, and a failure there is the controller's to report."""
    try:
        process.start()
    except Exception:  # told by the next send's start, as above
        pass

"""The tick's retention step: finished jobs older than `controller.keep_finished` go to the archive,
archived ones older than `controller.keep_archived` keep only their day sums (store/archive.py);
submit request ids older than `controller.keep_requests` are forgotten (store/requests.py).

Invariants: at most one batch per tick, never while the tick had other work to commit unless the
last look is a look's interval old (a quarter of keep_finished, at most RETAIN_EVERY); a backlog
goes on at half duty (a batch, then a pause as long as it took); a batch's size follows its
measured time so that it stays near TARGET (its write holds the store's lock, which submits and
the next tick wait on); a failing batch is logged and retried later, never troubling the tick.
Moving finished jobs changes nothing the controller holds in memory (it holds unfinished jobs only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from xce_lite import errors
from xce_lite.config.cluster import ControllerConfig
from xce_lite.store.jobs import JobStore

RETAIN_EVERY = 60.0  # seconds between looks (at most) when the last one found nothing more to move
TARGET = 0.02  # seconds a batch should take: a batch 4 times slower still ends within a 100 ms tick
MIN_BATCH, MAX_BATCH = 20, 5000


class Retention:
    def __init__(self, log: Callable[[str], None], wake: Callable[[], None] | None = None, batch: int = 100):
        """`wake`: wakes the tick, so that a backlog drains between the ticks' own work (a batch,
        then a pause as long as it took) rather than one batch a tick."""
        self.log = log
        self.wake = wake
        self.batch = batch
        self.next_at = 0.0  # monotonic time of the next look
        self.moved = 0  # jobs archived since the controller started (for the log)
        self.per_job: float | None = None  # seconds a job costs in a batch, a moving average

    def step(self, store: JobStore, config: ControllerConfig, now: float, busy: bool) -> None:
        """One batch if one is due: `now` is wall time (job end times are), the pacing monotonic."""
        began = time.monotonic()
        # look often enough that a job stays at most a quarter of keep_finished past it
        every = min(RETAIN_EVERY, config.keep_finished / 4)
        if began < self.next_at or (busy and began < self.next_at + every):
            return
        try:
            done = store.retain(now - config.keep_finished, self.batch)
            pruned = store.prune_archive(now - config.keep_archived, self.batch) if not done.more else 0
            # request ids (store/requests.py) are cheap rows: a batch of them beside the jobs' batch
            forgot = store.prune_requests(now - config.keep_requests, self.batch) if not done.more else 0
        except Exception as err:  # a failing batch (busy store, a bug) must not stop the tick
            what = str(err) if isinstance(err, errors.XceError) else f"{type(err).__name__}: {err}"
            self.log(f"retention: {what}; trying again in {every:g} s")
            self.next_at = began + every
            return
        took = time.monotonic() - began
        more = done.more or pruned == self.batch or forgot == self.batch
        if done.jobs or pruned:
            # size the next batch to what a job has cost lately (a moving average: one batch slowed
            # by a busy disk neither collapses nor bloats the next), growing by doubling at most
            cost = took / (done.jobs + pruned)
            self.per_job = cost if self.per_job is None else 0.7 * self.per_job + 0.3 * cost
            fits = int(TARGET / self.per_job) if self.per_job > 0 else MAX_BATCH
            self.batch = max(MIN_BATCH, min(MAX_BATCH, 2 * self.batch, fits))
        self.moved += done.jobs
        self.next_at = began + (0.0 if more else every)
        if more and self.wake is not None:
            timer = threading.Timer(max(0.01, took), self.wake)
            timer.daemon = True
            timer.start()
        if done.jobs and not more:
            self.log(f"retention: {self.moved} finished jobs archived so far (keep_finished "
                     f"{config.keep_finished / 86400:g} days)")

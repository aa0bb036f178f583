"""The tick's commit when the store refuses it: whether to try now, the backoff, what status says.

A part of the controller (`Controller.commits`), given its dependencies: the store (whose
`impatient` flag makes submits fail at once while the store refuses writes), the clock and the log.
It owns the retry state alone; the controller puts back what a failed commit carried (faults.py)
and tells this part how many reports wait. Invariants: `problem` is None exactly when the last
commit tried succeeded (or none failed yet); no commit is due before `retry_at` while it is not;
the wait doubles from STORE_RETRY_FIRST to STORE_RETRY_MAX; a failure is logged once per reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xce_lite import errors

STORE_RETRY_FIRST = 0.5  # seconds before the first retry of a failed commit
STORE_RETRY_MAX = 15.0  # the longest wait between two retries


class StoreRetry:
    """See the module docstring. Called on the tick's thread; `status` under the controller's lock."""

    def __init__(self, store: Any, clock: Any, log: Callable[[str], None]) -> None:
        self.store, self.clock, self.log = store, clock, log
        self.problem: str | None = None  # why the last commit failed; None: the store takes writes
        self.since: float | None = None  # wall clock of the first failure in a row
        self.failures = 0
        self.retry_at = 0.0  # monotonic: no commit before then
        self.in_commit = 0  # how many reports the commit being tried carries (for status)

    def due(self) -> bool:
        """Whether the tick may try its commit now (not while backing off after a failure)."""
        return self.problem is None or self.clock.monotonic() >= self.retry_at

    def wait(self) -> float | None:
        """Seconds until the next retry of a failed commit, or None when the store is fine."""
        if self.problem is None:
            return None
        return max(0.0, self.retry_at - self.clock.monotonic())

    def failed(self, err: errors.StoreUnavailable, waiting: Callable[[], int]) -> None:
        """The tick's commit did not happen (what it carried is back in the queues, `waiting()` of
        them): back off, and say so once per reason."""
        now = self.clock.time()
        first = self.problem is None
        self.failures += 1
        delay = min(STORE_RETRY_MAX, STORE_RETRY_FIRST * 2 ** (self.failures - 1))
        self.retry_at = self.clock.monotonic() + delay
        if first or str(err) != self.problem:
            self.log(f"the job store cannot take the tick's commit: {err}; nothing of it was stored, "
                     f"{waiting()} report(s) wait; retrying by itself (every {STORE_RETRY_MAX:g} s "
                     "at most)")
        self.problem = str(err)
        self.store.impatient = True  # submits meanwhile are refused at once, not after 10 s more
        if first:
            self.since = now

    def done(self) -> None:
        """The tick's commit succeeded (or there was nothing to commit)."""
        if self.problem is not None:
            self.log(f"the job store takes writes again (after {self.failures} failed commit(s) in "
                     f"{self.clock.time() - (self.since or self.clock.time()):.0f} s); carrying on")
        self.problem, self.since, self.failures = None, None, 0
        self.store.impatient = False

    def status(self, waiting: int) -> dict | None:
        """The store's problem as `controller status` shows it, None when there is none; `waiting`:
        the reports not stored yet (queued, or in the commit being tried)."""
        if self.problem is None:
            return None
        return {"what": "store", "since": self.since, "why": self.problem, "waiting": waiting,
                "message": f"the job store cannot be written: {self.problem}; new jobs and "
                           f"changes are refused (exit 4), reads go on; "
                           f"{waiting} host report(s) wait to be stored, "
                           "and the controller retries by itself"}

"""The controller's own counters and duration histograms, kept in memory for `/metrics`.

Thread-safe (one lock; the tick and the API threads both write) and free of I/O: the controller
records a duration or a count where it happens, and the metrics handler takes a `snapshot()`, a
plain JSON-able dict that the client side renders as Prometheus text (api/prometheus.py). Counters
count from the controller's start (Prometheus' `rate()` copes with the reset at a restart).

Invariants: a histogram's buckets are cumulative and its last bound is +Inf, so `count` equals the
+Inf bucket; a counter never goes down.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

# Seconds. A tick is usually a few ms; a scheduling session of 10,000 jobs a good part of a second.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# name -> help text; the names the controller records (a typo is an error, not a new metric)
HISTOGRAMS = {
    "tick": "Duration of one controller tick (collect, gate, schedule, commit, act).",
    "session": "Duration of one scheduling session in the scheduler process, from send to reply.",
}
COUNTERS = {
    "submits": "Jobs accepted (each array element counts), since the controller started.",
    "dispatches": "Jobs dispatched (recorded DISP), since the controller started.",
    "finished": "Jobs that ended, by state (DONE or EXIT), since the controller started.",
}


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is (bound[-1], +Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def to_json(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for bound, n in zip((*self.bounds, "+Inf"), self.counts):
            running += n
            cumulative.append([bound, running])
        return {"buckets": cumulative, "sum": self.total, "count": running}


class Registry:
    """The controller's metrics. `observe("tick", 0.004)`, `inc("finished", state="DONE")`."""

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS):
        self._lock = threading.Lock()
        self._histograms = {name: _Histogram(buckets) for name in HISTOGRAMS}
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = {name: {} for name in COUNTERS}

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self._histograms[name].observe(max(0.0, seconds))

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"counter {name} cannot go down (amount {amount})")
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0) + amount

    def snapshot(self) -> dict[str, Any]:
        """{"histograms": {name: {help, buckets: [[le, n], ...], sum, count}},
        "counters": {name: {help, series: [{labels, value}]}}}; a consistent copy."""
        with self._lock:
            histograms = {name: {"help": HISTOGRAMS[name], **h.to_json()} for name, h in self._histograms.items()}
            counters = {name: {"help": COUNTERS[name],
                               "series": [{"labels": dict(key), "value": n} for key, n in sorted(series.items())]}
                        for name, series in self._counters.items()}
        return {"histograms": histograms, "counters": counters}


# ---- pend reasons by kind ------------------------------------------------------------------------

REASON_KINDS = ("held", "dependency", "throttle", "queue_limit", "user_limit", "reservation", "declined",
                "resources", "new")

# The leading words of the reasons the gate, the scheduler and the dispatch check write (their texts
# are in workflow/gate.py, controller/gating.py, sched/core.py and controller/handlers/config.py).
_PREFIXES = (
    ("waiting for its dependency", "dependency"),
    ("its dependency can never be satisfied", "dependency"),
    ("dependency can never be satisfied", "dependency"),
    ("array ", "throttle"),
    ("queue ", "queue_limit"),
    ("user ", "user_limit"),
    ("waiting behind job", "reservation"),
    ("dispatch declined", "declined"),
)


def reason_kind(state: str, reason: str | None) -> str:
    """The kind of why a pending (PEND) or held (PSUSP) job waits, for `xce_jobs_pending_reason`.
    A reason the scheduler has not given yet is `new`; any placement refusal is `resources`."""
    if state == "PSUSP":
        return "held"
    if not reason:
        return "new"
    for prefix, kind in _PREFIXES:
        if reason.startswith(prefix):
            return kind
    return "resources"


def count_applied(registry: Registry, record: Any, finishing: list) -> None:
    """What a tick's commit did (the store's TickRecord; `finishing`: its (Finish, event) pairs),
    for the counters."""
    ended = set(record.finished)
    for f, _event in finishing:
        if f.job_id in ended:
            registry.inc("finished", state=f.state)
    if record.cancelled:
        registry.inc("finished", len(record.cancelled), state="EXIT")
    if record.dispatched:
        registry.inc("dispatches", len(record.dispatched))

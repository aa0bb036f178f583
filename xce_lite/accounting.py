"""Accounting arithmetic for `xce acct` and retention: finished jobs summed into groups, wait-time
percentiles, and the times users type for --since and --until. Pure: no I/O; `now` is an argument.

A group's numbers come from two kinds of input that never overlap: finished jobs one by one (the
live table, and archived jobs inside a partial day) and whole days of archived jobs already summed
(`usage_daily`, which keeps waits as a log-scale histogram of BUCKETS counts, one column each, so
that SQLite sums a year of day sums). Percentiles are exact while every wait is known
one by one; once a day sum takes part they come from the histogram, whose buckets are 2^(1/4)
wide (a value is off by at most ~9%), and the result says so (`exact`).

Definitions (as bacct and sacct users expect): wait = start - submit of a job that started (its
last attempt's start); run = end - start; slot-seconds = run x slots (its placement's tasks);
GPU-seconds = run x GPUs it held; efficiency = CPU time / slot-seconds, over the jobs whose CPU
time the host reported.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from xce_lite.errors import SpecError

_STEPS = 4  # histogram buckets per doubling
_FLOOR = 0.1  # waits below 0.1 s fall in bucket 0 (counted as 0)
BUCKETS = 104  # the last one holds every wait from ~55 days on (usage_daily's w0..w103)


def wait_bucket(wait: float) -> int:
    if wait < _FLOOR:
        return 0
    return min(BUCKETS - 1, 1 + int(math.floor(_STEPS * math.log2(wait / _FLOOR))))


def add_hists(hists: list[list[int]]) -> list[int]:
    """Dense histograms added bucket by bucket."""
    return [sum(column) for column in zip(*hists)] if hists else [0] * BUCKETS


def bucket_value(bucket: int) -> float:
    """A bucket's representative wait: the geometric middle of its bounds."""
    if bucket <= 0:
        return 0.0
    return _FLOOR * 2 ** ((bucket - 0.5) / _STEPS)


@dataclass
class Tally:
    """One group's sums. `waits` holds exact waits; `hist` bucketed ones (from day sums)."""

    jobs: int = 0
    done: int = 0
    exit: int = 0
    started: int = 0
    wait_s: float = 0.0
    run_s: float = 0.0
    cpu_s: float = 0.0
    cpu_slot_s: float = 0.0
    slot_s: float = 0.0
    gpu_s: float = 0.0
    max_rss: int = 0
    waits: list[float] = field(default_factory=list)
    hist: list[int] | None = None  # dense, BUCKETS long; None: no day sum took part

    def add_job(self, state: str, submit: float, start: float | None, end: float, slots: int, gpus: int,
                cpu: float | None, rss: int | None) -> None:
        self.jobs += 1
        self.done += state == "DONE"
        self.exit += state != "DONE"
        if start is not None:
            wait, run = max(0.0, start - submit), max(0.0, end - start)
            self.started += 1
            self.wait_s += wait
            self.waits.append(wait)
            self.run_s += run
            self.slot_s += run * slots
            self.gpu_s += run * gpus
            if cpu is not None:
                self.cpu_s += cpu
                self.cpu_slot_s += run * slots
        elif cpu is not None:
            self.cpu_s += cpu
        self.max_rss = max(self.max_rss, rss or 0)

    def add_day(self, row: dict) -> None:
        """Sums: a `usage_daily` row (with its `wait_hist`), or jobs summed by SQL (their waits come
        one by one, `waits`)."""
        for name in ("jobs", "done", "exit", "started", "wait_s", "run_s", "cpu_s", "cpu_slot_s", "slot_s", "gpu_s"):
            setattr(self, name, getattr(self, name) + row[name])
        self.max_rss = max(self.max_rss, row["max_rss"])
        if "wait_hist" in row:
            self.hist = add_hists([self.hist, row["wait_hist"]] if self.hist is not None else [row["wait_hist"]])

    def merge(self, other: Tally) -> None:
        for name in ("jobs", "done", "exit", "started", "wait_s", "run_s", "cpu_s", "cpu_slot_s", "slot_s", "gpu_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_rss = max(self.max_rss, other.max_rss)
        self.waits.extend(other.waits)
        if other.hist is not None:
            self.hist = add_hists([h for h in (self.hist, other.hist) if h is not None])

    def day_row(self) -> dict:
        """These sums as a `usage_daily` row (exact waits go into the histogram)."""
        hist = self._all_waits()
        return {"jobs": self.jobs, "done": self.done, "exit": self.exit, "started": self.started,
                "wait_s": self.wait_s, "run_s": self.run_s, "cpu_s": self.cpu_s, "cpu_slot_s": self.cpu_slot_s,
                "slot_s": self.slot_s, "gpu_s": self.gpu_s, "max_rss": self.max_rss,
                "wait_hist": hist}

    def _all_waits(self) -> list[int]:
        hist = list(self.hist) if self.hist is not None else [0] * BUCKETS
        for w in self.waits:
            hist[wait_bucket(w)] += 1
        return hist

    def report(self) -> dict:
        """The numbers `xce acct --json` shows for the group (schema 1)."""
        exact = self.hist is None
        if exact:
            median, p95 = percentile(sorted(self.waits), 50), percentile(sorted(self.waits), 95)
        else:
            hist = self._all_waits()
            median, p95 = hist_percentile(hist, 50), hist_percentile(hist, 95)
        return {
            "jobs": self.jobs, "done": self.done, "exit": self.exit,
            "wait": {"mean": _r(self.wait_s / self.started) if self.started else None,
                     "median": _r(median), "p95": _r(p95), "exact": exact},
            "run": {"total": _r(self.run_s), "mean": _r(self.run_s / self.started) if self.started else None},
            "cpu_time": _r(self.cpu_s),
            "max_rss": self.max_rss,
            "slot_hours": _r(self.slot_s / 3600),
            "gpu_hours": _r(self.gpu_s / 3600),
            "slot_seconds": _r(self.slot_s),
            "gpu_seconds": _r(self.gpu_s),
            "efficiency": _r(self.cpu_s / self.cpu_slot_s) if self.cpu_slot_s > 0 else None,
        }


def percentile(ordered: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def hist_percentile(hist: list[int], p: float) -> float | None:
    total = sum(hist)
    if not total:
        return None
    rank, seen = max(1, math.ceil(p / 100 * total)), 0
    for bucket, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return bucket_value(bucket)
    return None  # pragma: no cover - the loop always reaches rank


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summarise(sums: Iterable[tuple[str, dict]], waits: Iterable[tuple[str, float]],
              days: Iterable[tuple[str, dict]] = ()) -> dict[str, Tally]:
    """Group key -> Tally from store.accounting_inputs: sums of jobs read one by one (key, row),
    their waits (key, wait), and day sums (key, usage_daily row)."""
    groups: dict[str, Tally] = {}
    for key, row in (*sums, *days):
        tally = groups.get(key)
        if tally is None:
            tally = groups[key] = Tally()
        tally.add_day(row)
    for key, wait in waits:
        groups[key].waits.append(wait)
    return groups


# ---- the times users type -----------------------------------------------------------------------

_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
WHEN_HELP = "an ISO date (2026-11-30), a date and time (2026-11-30T14:00), an age (7d, 12h, 30m), today or yesterday"


def parse_when(text: str, now: float, option: str = "time") -> float:
    """Seconds since the epoch for what a user typed; local time where none is given."""
    value = text.strip().lower()
    if value == "now":
        return now
    if value in ("today", "yesterday"):
        midnight = local_midnight(now)
        return midnight if value == "today" else local_midnight(midnight - 3600)
    match = _AGE.match(value)
    if match:
        return now - float(match.group(1)) * _AGE_UNITS[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SpecError(f"{option} {text!r} is not a time: give {WHEN_HELP}") from None


def local_midnight(t: float) -> float:
    """The start of the local day that holds `t`."""
    day = time.localtime(t)
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0, 0, -1))


def whole_days(since: float, until: float, summed_before: float = 0.0) -> tuple[float, float] | None:
    """[start, end) of the local days wholly inside [since, until), whose archived jobs are read as
    day sums; the rest of the window is read job by job. Where per-job archive rows are gone (ended
    before `summed_before`, see keep_archived) a first day that is only partly inside counts whole.
    None: no whole day."""
    start = local_midnight(since)
    if start < since and since >= summed_before:
        start = local_midnight(start + 36 * 3600)  # the next midnight, DST or not
    end = local_midnight(until)
    return (start, end) if start < end else None


def day_of(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(t))


# ---- a job's time by state, from its events (xce hist) ------------------------------------------

_ENTERS = {"held": "PSUSP", "released": "PEND", "dispatched": "DISP", "started": "RUN", "suspended": "USUSP",
           "resumed": "RUN"}
_ENDS = ("finished", "launch_failed", "lost", "killed_pending", "dependency_failed")


def time_in_states(events: Iterable[tuple[float, str, dict | None]], now: float) -> dict[str, float]:
    """Seconds spent in each state (LSF's bhist summary), walking the events in order; a job not
    ended yet counts up to `now`. `total` is submit to end (or now)."""
    spent: dict[str, float] = {}
    state, since, first = None, None, None
    for t, kind, data in events:
        data = data or {}
        if kind == "submitted":
            state, since, first = ("PSUSP" if data.get("held") else "PEND"), t, t
            continue
        if state is None or since is None:
            continue
        if kind in _ENTERS or kind == "requeued" or kind in _ENDS:
            spent[state] = spent.get(state, 0.0) + max(0.0, t - since)
            since = t
            if kind in _ENDS:
                state = None
                break
            state = data.get("to", "PEND") if kind == "requeued" else _ENTERS[kind]
    end = since if state is None else now
    if state is not None and since is not None:
        spent[state] = spent.get(state, 0.0) + max(0.0, now - since)
    if first is not None and end is not None:
        spent["total"] = max(0.0, end - first)
    return {k: round(v, 3) for k, v in spent.items()}

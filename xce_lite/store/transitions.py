"""The guarded state changes of a tick's commit (JobStore.record_tick and the single-purpose writes),
each kind as ONE prepared statement run over all its rows, with its events appended likewise.

Invariants, as in jobs.py: each change is `UPDATE ... WHERE id = ? AND state = ?`, so a change based
on a stale view is refused, and only a row that moved gets its event, in the same transaction.
`RETURNING ?` hands back the position of each item that moved (the statement runs its rows in
order), so the events are exactly those the row-at-a-time loop wrote, in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import apsw

from xce_lite.store.db import insert_events as events


def guarded(con: apsw.Connection, sql: str, rows: list[tuple]) -> list[int]:
    """Run `sql` (an UPDATE ending in `RETURNING ?`) once per row, each row's last value being its
    position: the positions of the rows that changed, in order."""
    if not rows:
        return []
    return [i for (i,) in con.executemany(sql, rows)]


# Effective values' id -> (them, their JSON), kept from tick to tick: the plans of one merge share one
# dict (the controller's merge memo, controller/dispatching.py), which nothing changes once merged,
# and its JSON is the largest text a dispatch writes (~0.5 KB). The dict is kept beside its text, so
# that its id stays its own; bounded like the memo it mirrors. Dispatches run under the store's lock.
_EFFECTIVE_TEXTS: dict[int, tuple[dict, str]] = {}
EFFECTIVE_TEXTS_KEPT = 256


def _effective_text(effective: dict) -> str:
    known = _EFFECTIVE_TEXTS.get(id(effective))
    if known is not None and known[0] is effective:
        return known[1]
    if len(_EFFECTIVE_TEXTS) >= EFFECTIVE_TEXTS_KEPT:
        _EFFECTIVE_TEXTS.clear()
    text = json.dumps(effective, ensure_ascii=True)
    _EFFECTIVE_TEXTS[id(effective)] = (effective, text)
    return text


def dispatch(con: apsw.Connection, plans: Sequence, now: float, plan_type: type) -> list[int]:
    """Plans, or tuples (job id, attempt, [[host, tasks]], unit[, alloc[, effective]]) in Plan's order;
    the dispatched event carries the profile's name and hash from `effective`."""
    items: list[Any] = [plan if isinstance(plan, plan_type) else plan_type(*plan) for plan in plans]
    rows = []
    for i, p in enumerate(items):
        effective = _effective_text(p.effective) if p.effective is not None else None
        rows.append((p.attempt, json.dumps(p.hosts), p.unit,
                     json.dumps(p.alloc, ensure_ascii=True) if p.alloc is not None else None, effective,
                     getattr(p, "reason", None), p.job_id, i))
    moved = guarded(con, "UPDATE jobs SET state = 'DISP', attempt = ?, hosts = ?, unit = ?, alloc = ?, effective = ?, "
                         "pend_reason = ? WHERE id = ? AND state = 'PEND' RETURNING ?", rows)
    happened = []
    for i in moved:
        p = items[i]
        data = {"attempt": p.attempt, "hosts": p.hosts, "unit": p.unit}
        if p.effective is not None:
            data.update(app=p.effective.get("app"), profile_hash=p.effective.get("profile_hash"))
        if getattr(p, "queued", None):  # a queued successor (controller/prefilling.py)
            data["queued"] = p.queued
        happened.append((p.job_id, now, "dispatched", data))
    events(con, happened)
    return [items[i].job_id for i in moved]


def started(con: apsw.Connection, items: Sequence[tuple[int, float]], now: float) -> list[int]:
    moved = _started(con, items)
    events(con, _started_events(items, moved, now))
    return [items[i][0] for i in moved]


def _started(con: apsw.Connection, items: Sequence[tuple[int, float]]) -> list[int]:
    return guarded(con, "UPDATE jobs SET state = 'RUN', start_time = ?, pend_reason = NULL WHERE id = ? "
                        "AND state = 'DISP' RETURNING ?",
                   [(start_time, job_id, i) for i, (job_id, start_time) in enumerate(items)])


def _started_events(items: Sequence[tuple[int, float]], moved: list[int], now: float) -> list[tuple]:
    return [(items[i][0], now, "started", {"start_time": items[i][1]}) for i in moved]


def finish(con: apsw.Connection, items: Sequence[tuple[Any, str]], now: float) -> list[int]:
    """(Finish, event kind) pairs."""
    moved = _finished(con, items)
    events(con, _finished_events(items, moved, now))
    return [items[i][0].job_id for i in moved]


def _finished(con: apsw.Connection, items: Sequence[tuple[Any, str]]) -> list[int]:
    return guarded(con, "UPDATE jobs SET state = ?, start_time = coalesce(start_time, ?), end_time = ?, "
                        "exit_code = ?, exit_signal = ?, cpu_time = ?, max_rss = ?, reason = ? "
                        "WHERE id = ? AND state = ? RETURNING ?",
                   [(f.state, f.start_time, f.end_time, f.exit_code, f.exit_signal, f.cpu_time, f.max_rss,
                     f.reason, f.job_id, f.from_state, i) for i, (f, _event) in enumerate(items)])


def _finished_events(items: Sequence[tuple[Any, str]], moved: list[int], now: float) -> list[tuple]:
    rows = []
    for i in moved:
        f, event = items[i]
        data: dict[str, object] = {"state": f.state, "exit_code": f.exit_code, "signal": f.exit_signal,
                                   "reason": f.reason, "cpu_time": f.cpu_time, "max_rss": f.max_rss}
        if f.hooks:
            data["hooks"] = list(f.hooks)
        rows.append((f.job_id, now, event, data))
    return rows


def started_and_finished(con: apsw.Connection, starts: Sequence[tuple[int, float]],
                         finishes: Sequence[tuple[Any, str]], now: float) -> tuple[list[int], list[int]]:
    """`started(starts)` then `finish(finishes)`, as one commit records them, but a job whose start
    and end both come in it (once each; it ends from RUN, the state its start gives it) is moved
    by ONE UPDATE, DISP -> its end, instead of two: the row ends as the two leave it (the start's
    time, kept by the end's coalesce; the start's pend_reason NULL), and its two events are
    written as the two would write them, in the same order (every start's, then every end's). One
    that row does not take (it is not DISP) is left to the two statements, as before: the same
    guards decide. Returns (ids started, ids finished)."""
    once = _once(job_id for job_id, _t in starts)
    start_of = {job_id: t for job_id, t in starts if job_id in once}
    ended_once = _once(f.job_id for f, _e in finishes)
    both = [(f, start_of[f.job_id]) for f, _e in finishes
            if f.from_state == "RUN" and f.job_id in start_of and f.job_id in ended_once]
    if not both:
        return started(con, starts, now), finish(con, finishes, now)
    fused = {both[i][0].job_id for i in guarded(
        con, "UPDATE jobs SET state = ?, start_time = coalesce(?, ?), end_time = ?, exit_code = ?, exit_signal = ?, "
             "cpu_time = ?, max_rss = ?, reason = ?, pend_reason = NULL WHERE id = ? AND state = 'DISP' RETURNING ?",
        [(f.state, t, f.start_time, f.end_time, f.exit_code, f.exit_signal, f.cpu_time, f.max_rss, f.reason,
          f.job_id, i) for i, (f, t) in enumerate(both)])}
    rest = [i for i, (job_id, _t) in enumerate(starts) if job_id not in fused]
    s_moved = {rest[k] for k in _started(con, [starts[i] for i in rest])}
    rest = [i for i, (f, _e) in enumerate(finishes) if f.job_id not in fused]
    f_moved = {rest[k] for k in _finished(con, [finishes[i] for i in rest])}
    s_moved.update(i for i, (job_id, _t) in enumerate(starts) if job_id in fused)
    f_moved.update(i for i, (f, _e) in enumerate(finishes) if f.job_id in fused)
    s_order, f_order = sorted(s_moved), sorted(f_moved)
    events(con, _started_events(starts, s_order, now) + _finished_events(finishes, f_order, now))
    return [starts[i][0] for i in s_order], [finishes[i][0].job_id for i in f_order]


def _once(ids: Any) -> set[int]:
    """The ids that come exactly once in `ids`."""
    seen: set[int] = set()
    twice: set[int] = set()
    for job_id in ids:
        (twice if job_id in seen else seen).add(job_id)
    return seen - twice


def cancel(con: apsw.Connection, items: Sequence[tuple[int, str, str]], now: float) -> list[int]:
    moved = guarded(con, "UPDATE jobs SET state = 'EXIT', end_time = ?, reason = ?, pend_reason = NULL "
                         "WHERE id = ? AND state = ? RETURNING ?",
                    [(now, reason, job_id, from_state, i) for i, (job_id, from_state, reason) in enumerate(items)])
    events(con, [(items[i][0], now, "dependency_failed", {"from": items[i][1], "reason": items[i][2]}) for i in moved])
    return [items[i][0] for i in moved]


def pend_reasons(con: apsw.Connection, reasons: dict[int, str | None]) -> None:
    con.executemany("UPDATE jobs SET pend_reason = ? WHERE id = ? AND state = 'PEND'",
                    [(reason, job_id) for job_id, reason in reasons.items()])

"""Chains of queued successors (issue 18, `controller: prefill_depth`): the controller's bookkeeping
of who waits behind whom when a queued successor has one queued behind it (prefilling.py uses these).

`behind` is the controller state's map successor -> predecessor (`state.behind`), `active` its active
jobs; each function runs holding the controller's lock. The host's agent keeps the same chains
(exec/agent/successors.py): a successor that leaves its host's queue unstarted passes its follower
to its own predecessor there, and these keep the controller's map matching.

Invariant kept: a successor's predecessor in `behind` is active, or has ended after it was reported
started (then the successor holds its own allocation), or it is the unit its host has it behind.
"""

from __future__ import annotations

import re
from typing import Any


_BEHIND = re.compile(r"^queued on \S+ behind job (\d+)$")


def behind_of(reason: str | None) -> int | None:
    """The predecessor `reason` ("queued on HOST behind job N") names, or None."""
    match = _BEHIND.match(reason or "")
    return int(match.group(1)) if match else None


def behind_in(events: list[tuple[float, str, dict | None]]) -> int | None:
    """The predecessor a DISP job waits behind, from its events (the last dispatch's "queued"; a
    restart rebuilds `state.behind` from it), or None: it was dispatched as any job."""
    last = next((data for _t, kind, data in reversed(events) if kind == "dispatched"), None)
    return behind_of((last or {}).get("queued"))


def repoint(behind: dict[int, int], active: Any) -> None:
    """Each successor behind one that ended never reported started (killed in its host's queue: its
    agent passed the follower on likewise) follows that one's predecessor instead. A start reported
    takes a job out of `behind`, so one still in it that is no longer active left unstarted."""
    for job_id, pred in list(behind.items()):
        first = pred
        for _ in range(len(behind)):  # (never circular: bounded anyway)
            if pred in active or pred not in behind:
                break
            pred = behind[pred]
        if pred != first:
            behind[job_id] = pred
            if (job := active.get(job_id)) is not None:
                job.after = pred


def pass_on(behind: dict[int, int], active: Any, job_id: int, pred: int | None) -> None:
    """`job_id` left its host's queue unstarted (its host said so): its follower waits behind `pred` now."""
    if pred is None:
        return
    for follower in [f for f, p in behind.items() if p == job_id]:
        behind[follower] = pred
        if (job := active.get(follower)) is not None:
            job.after = pred


def chain_depth(job: Any, active: Any) -> int:
    """How many queued successors deep `job` is: 0 for a unit that runs (or is on its way), 1 behind it..."""
    depth = 0
    while job.after is not None and depth <= len(active):
        depth += 1
        pred = active.get(job.after)
        if pred is None:
            break
        job = pred
    return depth


def recover_chains(behind: dict[int, int], active: Any, store: Any) -> None:
    """After a restart (recovery.py): a successor whose predecessor ended unstarted while queued
    itself (killed in its host's queue) waits behind that one's predecessor, as its agent says
    (`repoint`, from the store: the ended job is no longer in `behind`)."""
    for job_id, first in list(behind.items()):
        pred: int | None = first
        for _ in range(8):  # (a chain is at most prefill_depth long)
            if pred is None or pred in active:
                break
            rows = store.jobs([pred])
            if not rows or rows[0].start_time is not None:
                pred = None  # it ran: what it followed has ended too
                break
            pred = behind_in(store.events(pred))
        if pred is not None and pred in active and pred != first:
            behind[job_id] = active[job_id].after = pred

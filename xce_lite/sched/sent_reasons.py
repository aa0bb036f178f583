"""The pend reasons a scheduler has already reported, so that a session reports only what changed.

With a backlog every session gives every pending job its reason again (10,000s of them, mostly the
same), and taking them all into the controller's live map costs more than the session itself. The
scheduler's side (controller/sched_worker.py, in the worker or in-process) keeps here the reason it
last reported for each job and turns a session's `waiting` into the part the receiver has not seen.

Invariant: the receiver's reason for a job equals the one recorded here, or the job is not recorded.
So a job is forgotten whenever the receiver may hold something else for it: it was dispatched (a
declined dispatch gets another reason), it left or (re)joined the pending set, or the receiver
asked for it again; `clear` (a full resend) forgets everything. Pure: no I/O, no clock. The group
operations run on sets, so a session with nothing new costs no Python step per job.

`tails` (backlog.py, Told tails) goes further: the sessions given it leave out of their answer the
class tails told already, so a steady session over a backlog costs no step per waiting job at all.
It holds only while every job of such a tail was told that reason: so `ask_again` (the receiver
wants some jobs' reasons: a pool reworded them) and `clear` drop it. Jobs forgotten because they
left or joined the set, or were dispatched, leave it true: the backlog's classes see them go, or
count them as added (`_Class.fresh`), and a dispatched job was examined, ranked before its tail.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xce_lite.sched.backlog import Told

Waiting = tuple[tuple[str, tuple[int, ...]], ...]


class SentReasons:
    __slots__ = ("_by", "_of", "tails")

    def __init__(self) -> None:
        self._of: dict[int, str] = {}  # job id -> the reason last reported
        self._by: dict[str, set[int]] = {}  # the same, by reason
        self.tails: Told = {}  # the class tails told (module docstring): given to schedule(told=)

    def __len__(self) -> int:
        return len(self._of)

    def clear(self) -> None:
        self._of, self._by, self.tails = {}, {}, {}

    def ask_again(self, ids: Iterable[int]) -> None:
        """The receiver wants these jobs' reasons again (it may hold others): `forget`, and no tail
        is taken as told any more (the jobs may be anywhere in one)."""
        self.forget(ids)
        self.tails.clear()

    def forget(self, ids: Iterable[int]) -> None:
        """The receiver may hold another reason for these jobs (or none): report them again."""
        for job_id in self._of.keys() & set(ids):
            self._drop(job_id)

    def _drop(self, job_id: int) -> None:
        reason = self._of.pop(job_id)
        ids = self._by[reason]
        ids.discard(job_id)
        if not ids:
            del self._by[reason]

    def delta(self, waiting: Waiting) -> Waiting:
        """The groups of `waiting` cut to the jobs whose reason was not reported yet, in the same
        order (the receiver's map keeps its insertion order); recorded as reported."""
        out = []
        for reason, ids in waiting:
            known = self._by.get(reason)
            if known is not None and known.issuperset(ids):
                # the usual group with a backlog: every job already told; checked without building
                # a set of its (10,000s of) ids, the larger part of a steady session's cost
                continue
            new = set(ids) if known is None else set(ids).difference(known)
            if not new:
                continue
            for job_id in new & self._of.keys():  # it had another reason
                self._drop(job_id)
            self._of.update(dict.fromkeys(new, reason))
            known = self._by.get(reason)  # a drop above may have emptied and removed it
            if known is None:
                self._by[reason] = new
            else:
                known |= new
            out.append((reason, ids if len(new) == len(ids) else tuple(filter(new.__contains__, ids))))
        return tuple(out)

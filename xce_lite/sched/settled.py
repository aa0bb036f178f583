"""Whether a scheduling session would only repeat what the last one answered, so it need not run.

A session that dispatches jobs is often followed by another one that can decide nothing new: the
controller records the dispatches (and the job ends that freed their room) and asks again. When
the new input is exactly the last one with its dispatches taken out (the dispatched jobs gone from
the pending set and nothing else; their reservations taken from the hosts, the shared counters
and the running sums; queues, limits and budget as they were) and the last answer was settled
(`core.SessionCache.settled`: every waiting job was examined on the state those dispatches leave),
a session would dispatch nothing and give every job the reason it already has: its answer is
known, and empty.

Jobs that waited may leave the pending set too (prefill names them successors: controller/
prefilling.py; a kill, a hold): a job that was examined and waited changed nothing the jobs after
it met (no room, no running sum, no reservation: see `repeats`), so the others' answers stand and
the departed ones need none. A job that may have held a reservation is the exception: the jobs
behind it name it in their reasons.

Time is the one input that moves. It counts only where a job may come to hold a reservation, so a
job whose wait passes `reserve_after` between the two stops the shortcut; so do fair share (usage
decays with time) and project limits (what running jobs hold per project is summed by the
caller, not here). Pure: no I/O, no clock. A wrong "no" costs a session; "yes" needs the proof.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import islice

from xce_lite.sched.core import Decisions, PendingJob, Snapshot, take

ROUNDING = 1e-3  # seconds: far above a float's rounding of epoch times (~2e-7 s), far below a tick


@dataclass(frozen=True)
class Expected:
    """The input a session that would repeat the last answer must be given."""

    base: Snapshot  # the last session's, with its dispatches taken from hosts and shared counters
    running: Mapping[tuple[str, str], int]  # (queue, user) -> slots, zero sums left out
    gone: frozenset[int]  # the jobs that must have left the pending set since the last session sent
    budget: int


def _running(rows: tuple[tuple[str, str, int], ...]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for queue, user, slots in rows:
        out[(queue, user)] = out.get((queue, user), 0) + slots
    return {key: n for key, n in out.items() if n}


def expect(base: Snapshot, decisions: Decisions, dispatched: Mapping[int, PendingJob], budget: int,
           settled: bool) -> Expected | None:
    """What the next input must be for the last answer (`decisions` on `base`, with `base.jobs`
    left out by the caller) to hold as it is; None when no input can prove that. `dispatched`:
    the dispatched jobs (their queue and user)."""
    if not settled or not decisions.complete or base.fairshare is not None or \
            (base.projects is not None and not base.projects.open):
        return None
    hosts, shared = list(base.hosts), base.shared_free
    running = _running(base.running)
    for d in decisions.dispatches:
        job = dispatched.get(d.job_id)
        if job is None:
            return None
        hosts, shared = take(hosts, shared, d.placement)
        running[(job.queue, job.user)] = running.get((job.queue, job.user), 0) + d.placement.tasks
    out = Snapshot(tuple(hosts), (), base.queues, shared, (), base.now, base.reserve_after, base.projects, (),
                   None)
    return Expected(out, running, frozenset(d.job_id for d in decisions.dispatches), budget)


def repeats(expected: Expected, base: Snapshot, budget: int, removed: Mapping[int, PendingJob], added: bool,
            reasons_again: bool, waits_passing: Callable[[float, float], bool], checked: int = 0) -> bool:
    """Whether a session on `base` (the jobs left out), with these changes to the pending set since
    the last session sent (`removed`: the jobs that left it, as they were, in the order they left),
    would answer nothing: no dispatch, no reason changed. `waits_passing(after, upto)`: whether a
    pending job was submitted in (after, upto]. `checked`: the first entries of `removed` that an
    earlier call with this `expected` (moved on) found left nothing behind (`_only_waited`): a job
    that was no holder when it left is in no later answer either, so it is not looked at again
    (removed grows while sessions are skipped: each call would walk all of it)."""
    e = expected.base
    if added or reasons_again or budget != expected.budget or len(removed) < len(expected.gone) \
            or not expected.gone.issubset(removed.keys()):
        return False
    if len(removed) > len(expected.gone) and not _only_waited(expected, removed, checked):
        return False
    if base.fairshare is not None or base.reserve_after != e.reserve_after or \
            not (base.projects is e.projects or base.projects == e.projects):
        return False
    if not (base.queues is e.queues or base.queues == e.queues) or base.hosts != e.hosts or \
            base.shared_free != e.shared_free or _running(base.running) != expected.running:
        return False
    if e.reserve_after <= 0 or base.now == e.now:
        return True
    # a job whose wait reached reserve_after in between would now hold a reservation (and time
    # going back could take one away). The core compares `now - submit >= reserve_after`, which
    # rounds otherwise than `submit <= now - reserve_after` near the bound: the window is widened by
    # ROUNDING both ways, so a job at the bound costs a session instead of a missed reservation
    return base.now > e.now and not waits_passing(e.now - e.reserve_after - ROUNDING,
                                                  base.now - e.reserve_after + ROUNDING)


def _only_waited(expected: Expected, removed: Mapping[int, PendingJob], checked: int = 0) -> bool:
    """Whether the jobs in `removed` but not dispatched by the last answer left nothing behind that
    a later job's answer read. Such a job was pending and waiting at the last answer (or came and
    went since: no session saw it); settled (`expect`), it was examined on the state the dispatches
    leave and changed none of it: a job that waits takes no room, adds to no running sum (queue,
    user, project: closed projects and fair share give no `Expected`), and a refusal it proved is
    proved again alike by the next job of its shape (placement is pure). Only a reservation would
    stay behind it ("waiting behind job N" in every later reason): a job whose wait had reached
    `reserve_after` (ROUNDING early, as `repeats`) stops the shortcut. Where it left to (prefill
    named it a successor, hidden in the views; a kill) the caller's hosts and running sums say,
    compared by `repeats` as ever."""
    e = expected.base
    if e.reserve_after <= 0:
        return True
    bound = e.now - e.reserve_after + ROUNDING
    gone = expected.gone
    return all(job.submit_time > bound for job_id, job in islice(removed.items(), checked, None) if job_id not in gone)


def moved_on(expected: Expected, now: float) -> Expected:
    """`expected` after a session skipped at `now`: the same input, seen at that time."""
    return replace(expected, base=replace(expected.base, now=now))

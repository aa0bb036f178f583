"""Queued successors (issue 18, "prefill"): after a session, a pending job that fits inside a running
job's allocation on its host (sched/prefill.py decides) is dispatched there queued behind it: stored
DISP, launched with `after` = that job's unit, and started by the host's agent the moment that unit
ends, so a freed slot never waits for the controller (HyperQueue's prefill). Its pend reason stays
the one the session gave it (why a dispatch could not place it: what an LSF user looks for); where
it waits is `state.behind` (the API's `queued_behind`), and its dispatched event's "queued" says
it in the store (a restart reads it there: `behind_in`).

A part of the controller (`Controller.prefill`), given the shared state and the projects' part. The
tick asks it `hidden(closing)` before its snapshot and `extend(decisions, ...)` after its session;
the units' part calls `unqueued` (a host's word that a successor left its queue) and `request_of`
(the launch request with `after`).

Withdrawal (HyperQueue retracts prefilled tasks): after each session, a queued successor that a
dispatch could place now on free room (sched/prefill.withdrawals) is asked off its host's queue
(`withdraw_nowait`); the host's answer decides the race: "withdrawn" -> the job is requeued to PEND
(no retry counted) and dispatched as any; "started" first -> it is RUN where it is. One withdrawal
in flight per job (`Active.withdrawing`). A queued successor is withdrawn the same way when a
pending job of higher rank could take its place (sched/prefill.outranked; looked for after this
session's successors are named, so a job named elsewhere now displaces nobody). A restart
rebuilds a successor's request from its row (recovery.py), so one recovered queued is withdrawn as
well.

Chains (`controller: prefill_depth`, default 5; 1: one per running unit): a queued successor
that has none of its own may get one, inside its allocation, while the chain behind the unit that
runs is shorter than the depth (prefill_chains.chain_depth) and it ranks before every pending job
that may run (`_ranks_before`: a chain keeps a dispatch's order). One session fills a chain to the
depth (`_name`'s rounds: each names behind the last round's successors), so that the controller may
tick once per chain drained (quiet_ends.py), not once per link. Only a chain's TAIL is withdrawn
(a middle would have to pass its follower on). A successor that leaves its host's queue unstarted
(withdrawn, refused, killed) passes its follower to its own predecessor, as the host's agent does
(exec/agent/successors.py): `pass_on` when the host says so, `repoint` for one that ended (a kill)
without a word of its queue. One dropped at a lease's end whose predecessor is not running there
either (it was queued, or is being launched again itself) goes back to PEND rather than be
launched beside it.

Invariants: no double booking: while its predecessor is active (and not ending in this tick) a
successor holds nothing of its own in a session's view (`Active.queued`; the predecessor's
allocation contains it), queued or started early (before the predecessor's end reached us), and
once the predecessor's end is known, the successor's allocation counts.
`state.behind` maps each successor to its predecessor until it starts; at most one successor per
unit, running or queued (it is `taken` while one is behind it, or started early). Never run twice:
a successor is a DISP job like any other (unit names fence it; the agent journals its queue); a
queue dropped when the host's lease ran out is launched again (or, behind a unit not running
there, requeued).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any

from xce_lite import errors
from xce_lite.controller.prefill_chains import chain_depth, pass_on, repoint
from xce_lite.controller.state import NEW, RUNNING, SENT, Active, ControllerState
from xce_lite.exec.host import LaunchRequest, UnitUnqueued
from xce_lite.models import EXIT
from xce_lite.sched.backlog import rank_of
from xce_lite.sched.core import Decisions, Dispatch, Snapshot
from xce_lite.sched.prefill import QueuedSuccessor, RunningUnit, Successor, outranked, successors, withdrawals
from xce_lite.sched.prefill_memo import PlaceMemo
from xce_lite.sched.prefill_rank import Ranked
from xce_lite.store.jobs import Requeue

FIRST_LOOKED = 64  # pending jobs looked at for the first that may run (_first_rank): past them, none is taken


class Prefill:
    """See the module docstring. `enabled`: the seams allow it (not the simulator); the config's
    `controller: prefill` is read at each session. Everything here runs holding the state's lock,
    except `extend`, which takes it."""

    def __init__(self, state: ControllerState, projects: Any, units: Any, log: Any, enabled: bool = True) -> None:
        self.state, self.projects, self.units, self.log, self.enabled = state, projects, units, log, enabled
        units.on_unqueued, units.request_of = self.unqueued, self.request_of
        self.requests = state.behind_requests  # each successor's request (to withdraw it); recovery.py too
        self.why: dict[int, str] = {}  # a withdrawal asked -> why (the requeue's reason says it)
        self.returning: set[int] = set()  # withdrawn (or dropped) from a queue, active until back in PEND
        # successor -> predecessor, for a successor that runs while its predecessor's end has not
        # reached us yet (a launch reply may overtake that end): the predecessor stays taken, so
        # it gets no second successor, which its host would start at once beside the first
        self.started_early: dict[int, int] = {}
        # the pending jobs in a dispatch's order, kept from tick to tick (sched/prefill_rank.py):
        # successors() and outranked() read the best-ranked few, not a sort of the whole backlog
        self.ranked, self.changed = Ranked(), state.pending.watch()
        self.memo = PlaceMemo()  # placements inside units, kept from session to session (sched/prefill_memo.py)

    def hidden(self, closing: AbstractSet[int]) -> set[int]:
        """The successors that hold nothing of their own in this tick's session (their predecessor
        is active, not ending, and not in `closing` unless it holds nothing itself: a chain's links
        behind the unit that runs, so `closing` may hold what an earlier call returned); each one's
        `queued` is set to match."""
        active = self.state.active
        with self.state.mu:
            repoint(self.state.behind, self.state.active)
            followed = set(self.state.behind.values())
            for job_id, pred in list(self.state.behind.items()):
                job = active.get(job_id)
                if job is None:  # not applied yet (extend cleans up: the tick's thread alone)
                    continue
                if job.status[0] == RUNNING:  # it started (adopted after a restart, or its reply came first)
                    del self.state.behind[job_id]
                    self._started(job_id, pred, closing)
                    job.after, job.queued = None, False
                    # one with no follower may take a successor now; nothing else may mark the state dirty
                    # before it ends (its launch reply came after its predecessor's end: no unqueued). One
                    # with a follower keeps its chain going: it is refilled when it runs short (quiet_ends.py)
                    if job_id not in followed:
                        self.state.dirty = True
                        self.state.wake.set()
            memo: dict[int, bool] = {}
            for job_id in (*self.state.behind, *self.started_early):
                if (job := active.get(job_id)) is not None:
                    job.queued = self._holds_nothing(job_id, closing, memo)
            return {job_id for job_id, hides in memo.items() if hides}

    def _holds_nothing(self, job_id: int, closing: AbstractSet[int], memo: dict[int, bool]) -> bool:
        """Whether successor `job_id` holds nothing of its own (see hidden; holding the lock). One
        that started before its predecessor's end reached us (started_early) holds nothing either
        while that end is unknown here and it is not ending itself: the host started it in the slot
        its predecessor left, which the predecessor, active here still, holds in the views (counted
        twice, the host's view went below zero: a free slot of -1 in ~1 session in 4 of a
        1,000-element array, bench/README.md, branch ctlcpu4)."""
        if job_id in memo:
            return memo[job_id]
        memo[job_id] = False  # (a chain is never circular: guarded anyway)
        if job_id not in self.state.behind and job_id in self.started_early:
            job = self.state.active.get(job_id)
            hides = job is not None and not job.ending and self._unended(self.started_early[job_id], closing)
            memo[job_id] = hides
            return hides
        pred = self.state.behind.get(job_id)
        if pred is None or job_id not in self.state.active:
            return False
        job = self.state.active.get(pred)
        hides = job is not None and not job.ending and (pred not in closing or self._holds_nothing(pred, closing, memo))
        memo[job_id] = hides
        return hides

    def _unended(self, pred: int, closing: AbstractSet[int]) -> bool:
        """Whether job `pred` is active and its end not known here (not ending, not in `closing`
        unless there as a queued successor that holds nothing: hidden)."""
        job = self.state.active.get(pred)
        return job is not None and (pred not in closing or job.queued) and not job.ending

    def _started(self, job_id: int, pred: int, closing: AbstractSet[int]) -> None:
        """Successor `job_id` of `pred` runs (holding the lock): if `pred`'s end has not reached us,
        `pred` stays taken until it does (started_early)."""
        if self._unended(pred, closing):
            self.started_early[job_id] = pred

    def extend(self, decisions: Decisions | None, hosts: Any, shared: Any, now: float,
               closing: AbstractSet[int]) -> Decisions | None:
        """`decisions` with a successor's dispatch for each running unit that can have one."""
        config = self.state.config.controller
        with self.state.mu:  # successors that ended, or whose dispatch was declined: all applied by now
            repoint(self.state.behind, self.state.active)
            for job_id in [j for j in self.state.behind if j not in self.state.active]:
                del self.state.behind[job_id]
            for job_id, pred in list(self.started_early.items()):
                if not self._unended(pred, closing) or job_id not in self.state.active:
                    del self.started_early[job_id]
                    if (job := self.state.active.get(job_id)) is not None and job_id not in self.state.behind:
                        job.queued = False  # it holds its allocation now (hidden() decided so in this tick too)
            for job_id in [j for j in self.requests if j not in self.state.behind]:
                del self.requests[job_id]
        if hosts is None or not self.enabled or not config.prefill or self.state.config.pools:
            with self.state.mu:
                # a tick without a session (hosts None) keeps what changed for the next: sorting
                # 10,000 again costs ~2.6 ms; past what a sync sorts anyway (prefill off for long,
                # a submission) it is dropped and the order sorted anew when next read
                if self.ranked.sorts_anyway(len(self.changed)):
                    self.changed.clear()
                    self.ranked.reset()
            return decisions  # (a pool's hosts come and go with their allocations: none queues there)
        chosen = self._name(decisions, hosts, shared, now, closing) if decisions is not None else ()
        # after naming: a job named a successor now takes no queued one's place
        self.withdraw(decisions, hosts, shared, now, closing, frozenset(s.job_id for s in chosen))
        if decisions is None or not chosen:
            return decisions
        named = {s.job_id for s in chosen}
        waiting = []
        with self.state.mu:
            for reason, ids in decisions.waiting:
                kept = tuple(i for i in ids if i not in named)
                if len(kept) < len(ids):  # a successor keeps the reason this session gave it (its pend reason)
                    self.state.reasons.update((i, reason) for i in ids if i in named)
                if kept:
                    waiting.append((reason, kept))
        extra = tuple(Dispatch(s.job_id, s.placement, s.profile_hash) for s in chosen)
        return Decisions(decisions.dispatches + extra, tuple(waiting), decisions.complete)

    def _ranked_now(self) -> Ranked:
        """The pending jobs in a dispatch's order as they are now (holding the lock, as long as it
        is read: a submit meanwhile would change them under it)."""
        self.ranked.sync(self.state.pending, self.changed, {q.name: q.priority for q in self.state.queue_policies})
        self.changed.clear()
        return self.ranked

    def _snapshot(self, hosts: Any, shared: Any, now: float, closing: AbstractSet[int]) -> Snapshot:
        """The session's own inputs (holding the lock), its jobs left out: they are `self.ranked`'s
        (its dispatches are no candidates, and their slots count for the limits)."""
        return Snapshot(hosts, (), self.state.queue_policies, shared,
                        self.state.active.running(closing), now, self.state.config.controller.reserve_after,
                        **self.projects.inputs(now, closing))

    def _name(self, decisions: Decisions, hosts: Any, shared: Any, now: float,
              closing: AbstractSet[int]) -> tuple[Successor, ...]:
        """The successors named now (recorded in `state.behind`): one for each unit that can have one,
        then again behind each one just named while its chain is shorter than the depth (a whole
        chain in one session: an emptied chain does not take `depth` sessions to fill)."""
        depth = self.state.config.controller.prefill_depth
        with self.state.mu:
            taken = set(self.state.behind.values()) | set(self.started_early.values())
            # units that run, are on their way, or are dispatched now (their launch goes first, on
            # the same channel), and queued successors launched less than `depth` deep: each may
            # have one successor (a queued one on its host's queue, behind which it waits)
            units = [
                job for job in self.state.active.values()
                if len(job.units) == 1 and job.status[0] in (SENT, RUNNING) and not job.ending and not job.killed
                and not job.withdrawing and (job.after is None or chain_depth(job, self.state.active) < depth)
                and not job.holding.shared and (job.id not in closing or job.queued)]
            priority = {q.name: q.priority for q in self.state.queue_policies}
            if any(job.after is not None for job in units):
                first = self._first_rank(priority)
                units = [job for job in units if job.after is None or self._ranks_before(job.id, first, priority)]
            deep = {job.id: chain_depth(job, self.state.active) for job in units}  # queued links before it
            running = [_unit_of(job, job.id in taken) for job in units]
            for d in decisions.dispatches:
                pending = self.state.pending.get(d.job_id)
                if pending is not None and len(d.placement.allocs) == 1 and not d.placement.shared:
                    running.append(_unit_named(d.job_id, d.placement, pending))
                    deep[d.job_id] = 0
            if not running or all(u.taken for u in running):
                return ()
            snapshot, everyone = self._snapshot(hosts, shared, now, closing), list[Successor]()
            while running and len(self.state.pending) > len(decisions.dispatches):  # else nobody left to follow
                chosen = successors(snapshot, decisions, tuple(running), ranked=self._ranked_now(), memo=self.memo)
                for s in chosen:
                    self.state.behind[s.job_id] = s.after
                    deep[s.job_id] = deep[s.after] + 1
                    if (job := self.state.pending.get(s.job_id)) is not None:
                        self.requests[s.job_id] = job
                everyone += chosen
                # the next round: behind each one just named, as a dispatch (its launch follows its
                # predecessor's, in the same batch) that ranks before every pending job left that may run
                links = tuple(Dispatch(s.job_id, s.placement, s.profile_hash) for s in chosen)
                decisions = Decisions(decisions.dispatches + links, decisions.waiting, decisions.complete)
                self.returning &= self.state.active.keys()
                if self.why or self.returning:  # a withdrawal in flight or unapplied: its job, pending
                    break  # again after this tick, may rank before what a later round would name
                first = self._first_rank(priority, {d.job_id for d in decisions.dispatches})
                running = [_unit_named(s.job_id, s.placement, job) for s in chosen
                           if deep[s.job_id] < depth and (job := self.requests.get(s.job_id)) is not None
                           and rank_of(job, priority) < first]
        return tuple(everyone)

    def _first_rank(self, priority: dict[str, int], leaving: AbstractSet[int] = frozenset()) -> tuple:
        """The rank of the best-ranked pending job that may run, not in `leaving` (dispatched or named
        now) (holding the lock; `()`, which no rank is below, when the first few are all blocked);
        `priority`: each queue's."""
        for looked, job in enumerate(self._ranked_now()):
            if job.blocked is None and job.id not in leaving:
                return rank_of(job, priority)
            if looked >= FIRST_LOOKED:
                break
        return ()

    def _ranks_before(self, job_id: int, first: tuple, priority: dict[str, int]) -> bool:
        """Whether queued successor `job_id` ranks before `first`: only then may it take a follower,
        so that a chain keeps a dispatch's order (one of higher rank pending instead gets the chain's
        place, sched/prefill.outranked, its tail first, and no job is named again behind the job it
        is to go ahead of)."""
        job = self.requests.get(job_id)
        return job is not None and rank_of(job, priority) < first

    def withdraw(self, decisions: Decisions | None, hosts: Any, shared: Any, now: float,
                 closing: AbstractSet[int], placed: frozenset[int] = frozenset()) -> None:
        """Ask off its host's queue each queued successor that a dispatch could place now on the
        room `decisions` leave free in `hosts` (the session's views, where it holds nothing), and
        each one a pending job of higher rank, not in `placed`, could replace (sched/prefill.outranked)."""
        with self.state.mu:
            active, unsent = self.state.active, set(self.units.to_launch)
            followed = set(self.state.behind.values()) | set(self.started_early.values())
            # on its host: launched (SENT), or listed queued there after a restart (NEW: reconcile
            # leaves it as it is), not one whose launch is still to go; a chain's tail only
            queued = tuple(
                QueuedSuccessor(pending, job.host_of(0), job.after) for job_id, pending in self.requests.items()
                if job_id not in followed and pending.blocked is None and (job := active.get(job_id)) is not None
                and job.queued
                and job.after is not None and not (job.withdrawing or job.ending or job.killed)
                and (job.status[0] == SENT or (job.status[0] == NEW and job.units[0] not in unsent)))
            if self.why:  # a withdrawal never answered (its host was lost, the job requeued): forgotten
                self.why = {job_id: why for job_id, why in self.why.items() if job_id in active}
            if not queued:
                return
            snapshot = Snapshot(hosts, (), self.state.queue_policies, shared, (), now,
                                self.state.config.controller.reserve_after)
            named = [(job_id, f"room is free on {p.allocs[0].host}")
                     for job_id, p in withdrawals(snapshot, decisions, queued)]
            withdrawn = {job_id for job_id, _why in named}
            left = tuple(q for q in queued if q.job.id not in withdrawn)
            if left and decisions is not None and len(self.state.pending) > len(decisions.dispatches) + len(placed):
                units = tuple(_unit_of(pred, True) for q in left
                              if (pred := active.get(q.after)) is not None and len(pred.units) == 1)
                named += [(job_id, f"job {first} ranks before it") for job_id, first in
                          outranked(self._snapshot(hosts, shared, now, closing), decisions, left, units, placed,
                                    ranked=self._ranked_now(), memo=self.memo)]
            asks = []
            for job_id, why in named:
                job = active[job_id]
                job.withdrawing = True
                self.why[job_id] = why
                asks.append((job, self.state.hosts.get(job.host_of(0)), why))
        for job, host, why in asks:  # no commit needed first: nothing changes until the host answers
            try:
                if host is None:
                    raise errors.HostUnreachable(f"host {job.host_of(0)} is not connected")
                host.withdraw_nowait(job.units[0])
                self.log(f"job {job.id}: withdrawing it from host {job.host_of(0)}'s queue (behind job {job.after}): "
                         f"{why}")
            except errors.HostUnreachable:
                with self.state.mu:
                    job.withdrawing = False  # asked again by a later session
                    self.why.pop(job.id, None)

    def _not_running(self, pred: int) -> bool:
        """Whether active job `pred` is not known to run on its host: a queued successor still, or
        to be launched (again); False if it ended (nothing of it holds the slot)."""
        job = self.state.active.get(pred)
        return job is not None and (pred in self.state.behind or job.status[0] == NEW)

    def request_of(self, job: Active, request: LaunchRequest) -> LaunchRequest:
        """The launch of `job`'s unit: with `after` while it is a successor of an active job."""
        pred = self.state.active.get(job.after) if job.after is not None else None
        job.withdrawing = False  # launched again (its host lost a withdrawal's answer): it may be asked again
        if pred is None or request.unit != job.units[0]:
            return request
        return replace(request, after=pred.units[0])

    def unqueued(self, event: UnitUnqueued, now: float) -> None:
        """A successor left its host's queue (holding the lock): it runs, or it was refused, or
        dropped at its host's lease end (launched again, after the lease is renewed)."""
        units = self.units
        job, index = units._unit(event.unit)
        if job is None or index != 0:
            return
        pred = self.state.behind.pop(job.id, None)
        # dropped behind a predecessor that was queued too (or is being launched again): launched
        # now, it would start beside the unit that still holds the slot; dispatched again as any instead
        behind_unstarted = event.status == "dropped" and pred is not None and self._not_running(pred)
        if pred is not None and event.status in ("started", "running"):
            self._started(job.id, pred, frozenset())
        elif event.status in ("withdrawn", "refused"):
            # it left unstarted: its follower waits behind its predecessor now
            pass_on(self.state.behind, self.state.active, job.id, pred)
        why = self.why.pop(job.id, "")  # why it was withdrawn, if it was asked (none after a restart)
        job.after, job.queued, job.withdrawing = None, False, False
        self.state.dirty = True  # it holds its allocation now (its predecessor's is gone), or nothing
        if event.status == "withdrawn":
            self._requeue(job, index, f"withdrawn from host {event.host}'s queue" + (f": {why}" if why else ""))
        elif behind_unstarted and not job.ending:
            self._requeue(job, index, f"dropped from host {event.host}'s queue behind job {pred}: {event.error}")
        elif event.status in ("started", "running"):
            units._mark_running(job, index, event.start_time or now)
        elif event.status == "refused" and not job.ending:
            units.end_job(job, EXIT, f"launch refused by host {event.host}: {event.error}", "launch_failed", now)
        elif event.status == "dropped" and not job.ending:
            self.log(f"job {job.id}: {event.error}; launching it again")
            job.status[index] = NEW
            units.to_launch.append(event.unit)

    def _requeue(self, job: Active, index: int, reason: str) -> None:
        """`job`, whose unit left its host's queue unstarted, back to PEND (holding the lock): nothing
        of it is on its host, nothing to stop or forget there; a kill meanwhile wins (kills.kill_wins)."""
        job.status[index] = NEW
        if not job.ending:
            job.ending = True
            self.returning.add(job.id)
            self.state.unrecorded_requeues.append(Requeue(job.id, job.state, reason))
            self.state.wake.set()


def _unit_named(job_id: int, placement: Any, pending: Any) -> RunningUnit:
    """A job dispatched or named a successor in this session, as a predecessor sees it."""
    alloc = placement.allocs[0]
    return RunningUnit(job_id, alloc.host, pending.queue, pending.user, alloc.reserved, alloc.gpus)


def _unit_of(job: Active, taken: bool) -> RunningUnit:
    """`job`'s one unit as a predecessor sees it (what it holds on its host)."""
    alloc = job.holding.allocs[0]
    return RunningUnit(job.id, job.host_of(0), job.queue, job.user, alloc.reserved, alloc.gpus, taken)

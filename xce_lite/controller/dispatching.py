"""The tick's decisions turned into what it stores (dispatch plans checked against the store and the
configuration of now, the pend reasons worth a write), and the in-memory view brought in line with
what the commit stored (`apply`).

A part of the controller (`Controller.dispatching`), given the shared state, the store, the clock,
the log, the gate's part, the projects' part, the counters, and how the units' part ends an active
job, adds one and queues units to launch. A decision that no longer holds (the job was killed or
held meanwhile, its profile changed) is declined: the job stays PEND and is scheduled again, never EXIT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xce_lite import errors
from xce_lite.config.merge import Effective
from xce_lite.config.sched_view import Holding, effective
from xce_lite.controller.jobunits import job_units
from xce_lite.controller.gating import Gating
from xce_lite.controller.metrics import Registry, count_applied
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.seams import Clock
from xce_lite.controller.state import NEW, Active, ControllerState, LaunchWith
from xce_lite.models import DISP, PEND, Job, JobSpec, unit_name
from xce_lite.sched.core import Decisions
from xce_lite.sched.prefill import queued_reason
from xce_lite.store.jobs import Finish, Plan, Requeue, TickRecord


MERGES_KEPT = 4096  # (spec, queue) merges kept between sessions
REASONS_EVERY = 1.0  # s: while busy, the changed pend reasons go to the store at most this often
QUIET = 0.05  # s without a wake-up or a submit after which serve ticks to store the reasons held back


def _with(job: Job, **changes: Any) -> Job:
    """`job` with `changes`, as dataclasses.replace makes it (no field computes anything at init), at a
    fraction of its cost: a dispatch makes one per job."""
    row = object.__new__(Job)
    row.__dict__.update(job.__dict__)
    row.__dict__.update(changes)
    return row


class Dispatching:
    """See the module docstring. `end_active(job_id, why)` and `add_active(active)` are called
    holding the lock; `launch_later(units)` too."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, log: Callable[[str], None], gating: Gating,
                 projects: ProjectShares, metrics: Registry, end_active: Callable[[int, str], None],
                 add_active: Callable[[Active], None], launch_later: Callable[[tuple[str, ...]], None]) -> None:
        self.state, self.store, self.clock, self.log, self.gating = state, store, clock, log, gating
        self.projects, self.metrics = projects, metrics
        self.end_active, self.add_active, self.launch_later = end_active, add_active, launch_later
        self.reasons_flushed_at = 0.0
        self.held_back = False  # a tick left changed reasons unstored (REASONS_EVERY): `quiet_wait`
        self.planned: dict[int, LaunchWith] = {}  # of the last `plans`: job id -> what its launch needs
        # (spec id, queue) -> (the spec, kept so that its id stays its own; its merge now, or why it
        # fails; the merge's JSON): `_merged_now`
        self._merges: dict[tuple[int, str], tuple[JobSpec, Effective | str, dict | None]] = {}
        self._merges_under: tuple[Any, Any] | None = None  # (config, profiles) the merges were made under

    def plans(self, decisions: Decisions) -> list[Plan]:
        """The dispatches to record, each under the next attempt's unit names and with the effective
        values it will run with. A decision made on a profile that has changed or vanished since (a
        reconfig during the session), or whose task count the job's queue no longer allows, is
        declined: the job stays PEND and is scheduled again with what holds now, never EXIT."""
        self.planned = {}
        if not decisions.dispatches:
            return []
        # through the writer connection: its page cache outlives the tick's commits (JobReads.jobs)
        jobs = {job.id: job for job in self.store.jobs([d.job_id for d in decisions.dispatches], writer=True)}
        merged = self._merged_now()
        plans = []
        for d in decisions.dispatches:
            job = jobs.get(d.job_id)
            if job is None or job.state != PEND:
                continue  # killed or held meanwhile: the store's guarded update would refuse it anyway
            key = (id(job.spec), job.queue)  # the spec is kept beside its id: the id stays its own
            memo = merged.get(key)
            if memo is None:
                eff = self._merge(job)
                memo = merged[key] = (job.spec, eff, eff.to_json() if not isinstance(eff, str) else None)
            declined = self._stale(memo[1], job.spec.app, d.profile_hash, sum(n for _, n in d.hosts))
            if isinstance(declined, str):
                self.decline(job.id, d.profile_hash, declined)
                continue
            with self.state.mu:
                attempt = self.state.attempts.get(d.job_id, 0) + 1
                self.state.retries[d.job_id] = job.retries  # the dispatched job's retry count so far
                pred = self.state.behind.get(d.job_id)  # a queued successor (prefilling.py): it keeps
                reason = None if pred is None else self.state.reasons.get(d.job_id)  # its pend reason
            unit = unit_name(self.state.cluster, d.job_id, attempt, 0)
            holding = Holding.of(d.placement)
            # the merge's JSON is shared by the plans of one (spec, queue): nothing changes a plan's
            plan = Plan(d.job_id, attempt, [list(h) for h in d.hosts], unit, holding.to_json(), memo[2], reason,
                        None if pred is None else queued_reason(d.hosts[0][0], pred))
            plans.append(plan)
            # the row as this dispatch stores it: its launch reads nothing back (unitwork `_launch`)
            self.planned[d.job_id] = LaunchWith(
                _with(job, state=DISP, attempt=attempt, hosts=tuple((h, n) for h, n in d.hosts), unit=unit,
                      alloc=plan.alloc, effective=plan.effective, pend_reason=reason), declined, holding)
        return plans

    def _merged_now(self) -> dict[tuple[int, str], tuple[JobSpec, Effective | str, dict | None]]:
        """The merges of (spec, queue) under the configuration in use, kept from session to session:
        the store hands jobs submitted alike one spec (job_reads.py), an array's elements share
        theirs. A new configuration or profile set starts it afresh; it is bounded like the specs."""
        setup = (self.state.config, self.state.profiles)
        if self._merges_under is None or self._merges_under[0] is not setup[0] \
                or self._merges_under[1] is not setup[1] or len(self._merges) > MERGES_KEPT:
            self._merges_under, self._merges = setup, {}
        return self._merges

    def _merge(self, job: Job) -> Effective | str:
        """The job's effective values now, or why it cannot run as configured now."""
        try:
            return effective(job.spec, job.queue, self.state.config, self.state.profiles)
        except errors.SpecError as err:
            return f"its configuration changed since the scheduler's decision: {err}"

    @staticmethod
    def _stale(eff: Effective | str, app: str | None, decided_hash: str, tasks: int) -> Effective | str:
        """The job's effective values now (`_merge`), or why the decision taken for it no longer holds."""
        if isinstance(eff, str):
            return eff
        if eff.profile_hash != decided_hash:
            return (f"application {app} changed since the scheduler's decision "
                    f"(hash {decided_hash or 'none'} -> {eff.profile_hash})")
        if not eff.min_tasks <= tasks <= eff.max_tasks:
            return f"its task range is now {eff.min_tasks}..{eff.max_tasks}, the decision gave it {tasks} tasks"
        return eff

    def decline(self, job_id: int, decided_hash: str, why: str) -> None:
        """A dispatch the configuration no longer allows: the job stays PEND (retryable), never EXIT."""
        self.log(f"job {job_id}: dispatch declined: {why}")
        self.store.record_event(job_id, "dispatch_declined", self.clock.time(),
                                {"reason": why, "decided_profile_hash": decided_hash})
        with self.state.mu:
            if job_id in self.state.pending:
                self.state.reasons[job_id] = f"dispatch declined: {why}; it is scheduled again"
            self.state.dirty = True

    def with_workflow(self, active: Active, array_id: int | None, effective: dict | Effective | None) -> Active:
        """The active job with its array and its retry rule (from the effective values it runs with:
        as stored, or the plan's own)."""
        if array_id is not None:
            self.gating.note_element(active.id, array_id)
        active.array_id = array_id
        if effective:
            eff = effective if isinstance(effective, Effective) else Effective.from_json(effective)
            active.retry, active.retry_on = eff.retry, eff.retry_on
        return active

    def reasons_to_store(self, decisions: Decisions | None, now: float, quiet: bool = False) -> dict[int, str | None]:
        """Keep every pend reason live in memory; hand the store the changed ones at most once a
        second while busy, so a busy queue costs no write per job per tick (the API reads the live
        ones), and at once in a `quiet` tick (nothing woke it, no submit waits: sleeping.py). A backlog's reasons
        are thus written while the controller has nothing else to do, not in the tick that next has
        work: 10,000 new jobs' reasons are a ~50 ms write, which held up the first launch after
        the slots freed (bench/README.md, branch backlog3). `decisions` carries only the reasons
        that changed since the scheduler's last answer (sched_worker.py): the rest are in memory."""
        with self.state.mu:
            if decisions is not None:
                for reason, ids in decisions.waiting:  # whole groups at C speed: a backlog has 10,000s
                    gone = self.state.pending.missing(ids)  # killed or held while the scheduler thought
                    still = ids if not gone else [i for i in ids if i not in gone]
                    self.state.reasons.update(dict.fromkeys(still, reason))
            if now - self.reasons_flushed_at < REASONS_EVERY and not (quiet and self.held_back):
                self.held_back = True
                return {}
            self.reasons_flushed_at, self.held_back = now, False
            changed = {job_id: reason for job_id, reason in self.state.reasons.items()
                       if self.state.stored_reasons.get(job_id) != reason}
            self.state.stored_reasons.update(changed)
            return changed

    def quiet_wait(self) -> float:
        """How long the serve loop may sleep before a quiet tick stores the reasons held back: QUIET
        while some are, else forever (its other bounds apply)."""
        return QUIET if self.held_back else float("inf")

    def apply(self, record: TickRecord, finishing: list[tuple[Finish, str]], requeues: list[Requeue],
               plans: list[Plan]) -> None:
        """Bring the in-memory view in line with what `record_tick` stored."""
        requeued = self.store.jobs(list(record.requeued)) if record.requeued else []
        count_applied(self.metrics, record, finishing)  # metrics:
        with self.state.mu:
            for f, _event in finishing:  # the other hosts' post hooks see it as XCE_JOB_REASON
                self.projects.finished(f.job_id, f.start_time, f.end_time)
                self.end_active(f.job_id, f"job {f.job_id} ended {f.state}" + (f": {f.reason}" if f.reason else ""))
                self.gating.ended_element(f.job_id)
            for r in requeues:
                self.end_active(r.job_id, f"job {r.job_id} was requeued: {r.reason}")
            for job in requeued:
                self.state.attempts[job.id] = job.attempt
                if job.state == PEND:
                    self.gating.enqueue(job.id, job.user, job.queue, job.spec, job.submit_time, job.array_id,
                                        job.depend)
                else:
                    self.state.held[job.id] = job.user
            for job_id in record.cancelled:
                self.gating.dequeue(job_id)
                self.gating.ended_element(job_id)
            for job_id in record.killed:  # a requeue the store refused: the job was killed (kills.py)
                self.gating.ended_element(job_id)
            dispatched = set(record.dispatched)
            for plan in plans:
                job_id, attempt, hosts = plan.job_id, plan.attempt, plan.hosts
                pending = self.state.pending.get(job_id)
                if job_id not in dispatched or pending is None:
                    continue  # killed or held while the scheduler thought: it stays as it is now
                self.gating.dequeue(job_id)
                self.state.attempts.pop(job_id, None)
                units = (plan.unit,) if len(hosts) == 1 else job_units(self.state.cluster, job_id, attempt, len(hosts))
                carried = self.planned.get(job_id)
                holding = carried.holding if carried is not None and carried.holding is not None \
                    else Holding.from_json(plan.alloc, ())
                active = Active(job_id, pending.user, pending.queue, DISP, attempt, holding, units, [NEW] * len(units),
                                retries=self.state.retries.pop(job_id, 0), project=pending.project,
                                since=self.clock.time(), launch_with=carried, after=self.state.behind.get(job_id))
                effective = carried.effective if carried is not None else plan.effective
                self.add_active(self.with_workflow(active, self.gating.array_of.get(job_id), effective))
                self.launch_later(units)
            if record.finished or record.requeued or record.cancelled or record.started or record.killed:
                self.state.gate_dirty = True
                if len(self.gating.gate):
                    self.state.wake.set()  # a dependant may go now, or be cancelled: do not wait a tick
            if record.finished or record.requeued or record.cancelled or record.killed:
                self.state.dirty = True
                if self.state.waited and not self.state.waited.keys().isdisjoint(
                        (*record.finished, *record.cancelled, *record.killed, *(r.job_id for r in requeues),
                         *(f.job_id for f, _event in finishing))):  # only a wait this tick may end (wait_ended.py)
                    self.state.finished.notify_all()
        self.planned = {}

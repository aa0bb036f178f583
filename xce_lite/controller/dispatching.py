"""The tick's decisions turned into what it stores (dispatch plans checked against the store and the
configuration of now, the pend reasons worth a write), and the in-memory view brought in line with
what the commit stored (`_apply`).

A mixin of `Controller` (it shares the controller's lock and view), kept apart so the tick reads on
its own. A decision that no longer holds (the job was killed or held meanwhile, its profile
changed) is declined: the job stays PEND and is scheduled again, never EXIT.
"""

from __future__ import annotations


from xce_lite import errors
from xce_lite.config.merge import Effective
from xce_lite.config.sched_view import Holding, effective
from xce_lite.controller.jobunits import job_units
from xce_lite.controller.metrics import count_applied
from xce_lite.controller.unitwork import NEW, Active
from xce_lite.models import DISP, PEND, Job, unit_name
from xce_lite.sched.core import Decisions
from xce_lite.store.jobs import Finish, Plan, Requeue, TickRecord


class Dispatching:
    """See the module docstring. Expects the controller's attributes (store, config, _mu, ...)."""

    def _plans(self, decisions: Decisions) -> list[Plan]:
        """The dispatches to record, each under the next attempt's unit names and with the effective
        values it will run with. A decision made on a profile that has changed or vanished since (a
        reconfig during the session), or whose task count the job's queue no longer allows, is
        declined: the job stays PEND and is scheduled again with what holds now, never EXIT."""
        if not decisions.dispatches:
            return []
        jobs = {job.id: job for job in self.store.jobs([d.job_id for d in decisions.dispatches])}
        plans = []
        for d in decisions.dispatches:
            job = jobs.get(d.job_id)
            if job is None or job.state != PEND:
                continue  # killed or held meanwhile: the store's guarded update would refuse it anyway
            declined = self._stale(job, d.profile_hash, sum(n for _, n in d.hosts))
            if isinstance(declined, str):
                self._decline(job.id, d.profile_hash, declined)
                continue
            with self._mu:
                attempt = self._attempts.get(d.job_id, 0) + 1
                self._retries[d.job_id] = job.retries  # the dispatched job's retry count so far
            unit = unit_name(self.cluster, d.job_id, attempt, 0)
            plans.append(Plan(d.job_id, attempt, [list(h) for h in d.hosts], unit, Holding.of(d.placement).to_json(),
                              declined.to_json()))
        return plans

    def _stale(self, job: Job, decided_hash: str, tasks: int) -> Effective | str:
        """The job's effective values now, or why the decision taken for it no longer holds."""
        try:
            eff = effective(job.spec, job.queue, self.config, self.profiles)
        except errors.SpecError as err:
            return f"its configuration changed since the scheduler's decision: {err}"
        if eff.profile_hash != decided_hash:
            return (f"application {job.spec.app} changed since the scheduler's decision "
                    f"(hash {decided_hash or 'none'} -> {eff.profile_hash})")
        if not eff.min_tasks <= tasks <= eff.max_tasks:
            return f"its task range is now {eff.min_tasks}..{eff.max_tasks}, the decision gave it {tasks} tasks"
        return eff

    def _reasons_to_store(self, decisions: Decisions | None, now: float) -> dict[int, str | None]:
        """Keep every pend reason live in memory; hand the store the changed ones at most once a
        second, so a busy queue costs no write per job per tick (the API reads the live ones)."""
        with self._mu:
            if decisions is not None:
                for reason, ids in decisions.waiting:
                    for job_id in ids:
                        if job_id in self._pending:
                            self._reasons[job_id] = reason
            if now - self._reasons_flushed_at < 1.0:
                return {}
            self._reasons_flushed_at = now
            changed = {job_id: reason for job_id, reason in self._reasons.items()
                       if self._stored_reasons.get(job_id) != reason}
            self._stored_reasons.update(changed)
            return changed

    def _apply(self, record: TickRecord, finishing: list[tuple[Finish, str]], requeues: list[Requeue],
               plans: list[Plan]) -> None:
        """Bring the in-memory view in line with what `record_tick` stored."""
        requeued = self.store.jobs(list(record.requeued)) if record.requeued else []
        count_applied(self.metrics, record, finishing)  # metrics:
        with self._mu:
            for f, _event in finishing:  # the other hosts' post hooks see it as XCE_JOB_REASON
                self.projects.finished(f.job_id, f.start_time, f.end_time)
                self._end_active(f.job_id, f"job {f.job_id} ended {f.state}" + (f": {f.reason}" if f.reason else ""))
                self.gating.ended_element(f.job_id)
            for r in requeues:
                self._end_active(r.job_id, f"job {r.job_id} was requeued: {r.reason}")
            for job in requeued:
                self._attempts[job.id] = job.attempt
                if job.state == PEND:
                    self.gating.enqueue(job.id, job.user, job.queue, job.spec, job.submit_time, job.array_id,
                                        job.depend)
                else:
                    self._held[job.id] = job.user
            for job_id in record.cancelled:
                self.gating.dequeue(job_id)
                self.gating.ended_element(job_id)
            for job_id in record.killed:  # a requeue the store refused: the job was killed (kills.py)
                self.gating.ended_element(job_id)
            dispatched = set(record.dispatched)
            for plan in plans:
                job_id, attempt, hosts = plan.job_id, plan.attempt, plan.hosts
                pending = self._pending.get(job_id)
                if job_id not in dispatched or pending is None:
                    continue  # killed or held while the scheduler thought: it stays as it is now
                self.gating.dequeue(job_id)
                self._attempts.pop(job_id, None)
                holding = Holding.from_json(plan.alloc, ())
                units = job_units(self.cluster, job_id, attempt, len(hosts))
                active = Active(job_id, pending.user, pending.queue, DISP, attempt, holding, units, [NEW] * len(units),
                                retries=self._retries.pop(job_id, 0), project=pending.project, since=self._clock.time())
                self._add_active(self._with_workflow(active, self.gating.array_of.get(job_id), plan.effective))
                self._to_launch.extend(units)
            if record.finished or record.requeued or record.cancelled or record.started or record.killed:
                self._gate_dirty = True
                if len(self.gating.gate):
                    self._wake.set()  # a dependant may go now, or be cancelled: do not wait a tick
            if record.finished or record.requeued or record.cancelled or record.killed:
                self._dirty = True
                self._finished.notify_all()

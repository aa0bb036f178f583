"""The controller's API routes that act on jobs: kill, hold, release, suspend, resume and requeue
(`xce kill`, `xce hold`, ...), on jobs, whole arrays and elements.

A part of the controller (`Controller.actions`), given the shared state, the store, the clock, the
counters, gating, projects, the access rules, the kills and the hosts in trouble. A handler never
acts on a host itself, but for suspend and resume (a signal the reply waits for): a kill is
recorded, then marked for the tick to deliver (kill_marks.py); a requeue goes with the tick's
commit, as a lost host's does. Pending jobs move under the lock, so the tick cannot dispatch them
between the check and the change; the store's guarded update refuses a stale view.

`xce requeue` takes a dispatched or running job back to PEND (or PSUSP with --hold) on the same
path as a job whose host was lost: its units are asked to stop and drain, the job keeps its id and
submit time, and its next dispatch is a new attempt.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.controller.gating import Gating
from xce_lite.controller.host_trouble import HostTrouble
from xce_lite.controller.kill_marks import KillMarks
from xce_lite.controller.metrics import Registry
from xce_lite.controller.projects import ProjectShares
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Access, Handler
from xce_lite.controller.state import ControllerState
from xce_lite.lifecycle import next_state
from xce_lite.models import ACTIVE_STATES, DISP, DONE, EXIT, FINISHED_STATES, PEND, PSUSP, RUN, Job
from xce_lite.sched.prefill import queued_reason
from xce_lite.store.jobs import Requeue


class JobActions:
    """See the module docstring."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, metrics: Registry, gating: Gating,
                 projects: ProjectShares, access: Access, kills: KillMarks, trouble: HostTrouble) -> None:
        self.state, self.store, self.clock, self.metrics, self.gating = state, store, clock, metrics, gating
        self.projects, self.access, self.kills, self.trouble = projects, access, kills, trouble

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("POST", "/jobs/kill"): self.api_kill,
            ("POST", "/jobs/hold"): self.api_hold,
            ("POST", "/jobs/release"): self.api_release,
            ("POST", "/jobs/suspend"): self.api_suspend,
            ("POST", "/jobs/resume"): self.api_resume,
            ("POST", "/jobs/requeue"): self.api_requeue,
        }

    def owned_refs(self, caller: Caller, body: Any) -> list[tuple[str, list[Job], bool]]:
        """(as named, its jobs, is a whole array) for each job, array or element the request names."""
        refs = self.gating.expand_refs(_refs_of(body))
        named = list(dict.fromkeys(i for _l, ids, _w in refs for i in ids))
        owned = {j.id: j for j in self.access.owned(caller, named)}
        return [(label, [owned[i] for i in ids], whole) for label, ids, whole in refs]

    def kill_pending(self, jobs: list[Job], caller: Caller, now: float) -> set[int]:
        """End pending jobs at once, one transaction per state; the ids that moved."""
        moved: set[int] = set()
        for state in (PEND, PSUSP):
            ids = [j.id for j in jobs if j.state == state]
            if not ids:
                continue
            with self.state.mu:
                done = self.store.change_state(ids, state, EXIT, "killed_pending", now,
                                               reason=f"killed by {caller.user} while pending", end_time=now)
                self.metrics.inc("finished", len(done), state="EXIT")  # metrics:
                for job_id in done:
                    self.gating.dequeue(job_id)
                    self.state.held.pop(job_id, None)
                    self.gating.ended_element(job_id)
                self.state.dirty = True
                self.state.finished.notify_all()
            moved.update(done)
        return moved

    def move_pending(self, movable: list[tuple[Job, str]], event: str, reason: str | None) -> set[int]:
        """Hold or release: PEND <-> PSUSP, one transaction per (state, target)."""
        moved: set[int] = set()
        groups: dict[tuple[str, str], list[Job]] = defaultdict(list)
        for job, target in movable:
            groups[(job.state, target)].append(job)
        for (state, target), jobs in groups.items():
            with self.state.mu:  # the tick may not dispatch them between our check and the change
                done = set(self.store.change_state([j.id for j in jobs], state, target, event, self.clock.time(),
                                                   reason=reason))
                for job in jobs:
                    if job.id not in done:
                        continue
                    if target == PSUSP:
                        self.gating.dequeue(job.id)
                        self.state.held[job.id] = job.user
                    else:
                        self.state.held.pop(job.id, None)
                        self.gating.enqueue(job.id, job.user, job.queue, job.spec, job.submit_time, job.array_id,
                                      job.depend)
                self.state.dirty = True
            moved |= done
        return moved

    def api_requeue(self, caller: Caller, query: dict, body: Any) -> dict:
        """Dispatched or running jobs back to PEND (`hold`: PSUSP), by the lost-host path."""
        hold = bool(body.get("hold")) if isinstance(body, dict) else False
        results = []
        for _label, jobs, _whole in self.owned_refs(caller, body):
            for job in jobs:
                ok, message = self._requeue_one(job, f"requeued by {caller.user}", hold)
                results.append({"id": job.display_id, "ok": ok, "message": message})
        self.state.wake.set()
        return {"results": results}

    def _requeue_one(self, job: Job, reason: str, hold: bool) -> tuple[bool, str]:
        """A dispatched or running job back to PEND (`hold`: PSUSP) by the tick: (done, what to say)."""
        name = job.display_id
        with self.state.mu:
            active = self.state.active.get(job.id)
            if active is None or active.ending or job.state not in ACTIVE_STATES:
                return False, (f"Job <{name}> is {job.state}: only a dispatched or running job is requeued"
                               + ("; submit it again" if job.state in FINISHED_STATES else ""))
            if active.killed:  # kill wins (kills.py): the store would refuse it too
                return False, f"Job <{name}> is being killed ({active.killed}); it is not requeued"
            active.ending = True
            self.state.unrecorded_requeues.append(Requeue(job.id, active.state, reason, hold=hold))
            return True, f"Job <{name}> is being requeued" + (" and held" if hold else "")

    def api_kill(self, caller: Caller, query: dict, body: Any) -> dict:
        results = []
        now = self.clock.time()
        for label, jobs, whole in self.owned_refs(caller, body):
            if not whole:
                results.append({"id": label, **self._kill_one(jobs[0], caller, now)})
                continue
            pending = self.kill_pending([j for j in jobs if j.state in (PEND, PSUSP)], caller, now)
            active = [self._kill_one(j, caller, now) for j in jobs
                      if j.id not in pending and j.state not in (DONE, EXIT)]
            killed = len(pending) + sum(1 for r in active if r["ok"])
            results.append({"id": label, "ok": killed > 0 or len(active) == 0,
                            "message": f"Array <{label}>: {killed} element(s) being terminated"
                                       + (f", {len(jobs) - killed} had finished or were out of reach"
                                          if killed < len(jobs) else "")})
        return {"results": results}

    def _kill_one(self, job: Job, caller: Caller, now: float) -> dict:
        reason = f"killed by {caller.user}"
        name = job.display_id
        if job.state in (PEND, PSUSP):
            if self.kill_pending([job], caller, now):
                return {"ok": True, "message": f"Job <{name}> is being terminated"}
            job = self.store.get(job.id) or job  # it was dispatched meanwhile: kill it there
        if job.state in (DISP, RUN) and job.unit:
            # Recorded first (kill wins across restarts and lost hosts), then delivered by the tick on
            # the host's worker (kills.py): a host that does not answer holds up neither this reply
            # nor the tick; one out of reach gets the kill when it answers, or the job ends EXIT
            # with this reason when the host is declared lost.
            self.store.record_event(job.id, "kill_requested", now, {"by": caller.user, "reason": reason})
            first = job.hosts[0][0]
            with self.state.mu:
                self.kills.mark(job.id, reason)
                reachable = first in self.state.hosts and first not in self.trouble
            self.state.wake.set()
            if reachable:
                return {"ok": True, "message": f"Job <{name}> is being terminated"}
            return {"ok": True, "message": f"Job <{name}> is being terminated: its host {first} does not answer "
                                           f"now; the kill is recorded and reaches it when it answers (if the "
                                           f"host is declared lost first, the job ends EXIT all the same)"}
        return {"ok": False, "message": f"Job <{name}> has already finished ({job.state})"}

    def api_hold(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._hold_or_release(caller, body, "held", f"held by {caller.user}")

    def api_release(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._hold_or_release(caller, body, "released", None)

    def _hold_or_release(self, caller: Caller, body: Any, event: str, reason: str | None) -> dict:
        """PEND <-> PSUSP, as the lifecycle allows; the store's guarded update refuses a stale view.
        A whole array moves in one transaction per state, with one result line."""
        results = []
        for label, jobs, whole in self.owned_refs(caller, body):
            refused: list[dict] = []
            queued = self._hold_queued(jobs, reason) if event == "held" else {}
            if queued and not whole:
                results.append({"id": label, "ok": queued[jobs[0].id], "message": f"Job <{label}> is held" if
                                queued[jobs[0].id] else f"Job <{label}> changed meanwhile; look again with "
                                                        f"`xce jobs {label}`"})
                continue
            movable = [(job, target) for job in jobs if job.id not in queued
                       and (target := _next_or_refuse(job, event, refused)) is not None]
            if event == "released":  # a job outside its project stays held (projects.py)
                movable = self.projects.releasable(movable, refused)
            moved = self.move_pending(movable, event, reason) | {i for i, ok in queued.items() if ok}
            if whole:
                results.append({"id": label, "ok": bool(moved) or not movable,
                                "message": f"Array <{label}>: {len(moved)} element(s) {event}"
                                           + (f", {len(jobs) - len(moved)} were not pending" if len(moved) < len(jobs)
                                              else "")})
                continue
            results.extend({**r, "id": label} for r in refused)
            if movable:
                results.append({"id": label, "ok": bool(moved),
                                "message": f"Job <{label}> is {event}" if moved
                                else f"Job <{label}> changed meanwhile; look again with `xce jobs {label}`"})
        self.state.wake.set()
        return {"results": results}

    def _hold_queued(self, jobs: list[Job], reason: str | None) -> dict[int, bool]:
        """Hold the queued successors of `jobs` (prefilling.py: stored DISP, shown PEND, so held as
        a pending job is): each leaves its host's queue and is PSUSP, as `xce requeue --hold` does it.
        Their ids -> whether that is under way."""
        with self.state.mu:
            queued = [job for job in jobs if job.state == DISP and job.id in self.state.behind]
        return {job.id: self._requeue_one(job, reason or "held", True)[0] for job in queued}

    def api_suspend(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._suspend_or_resume(caller, body, "suspended", "STOP")

    def api_resume(self, caller: Caller, query: dict, body: Any) -> dict:
        return self._suspend_or_resume(caller, body, "resumed", "CONT")

    def _suspend_or_resume(self, caller: Caller, body: Any, event: str, signal: str) -> dict:
        """RUN <-> USUSP (LSF's bstop and bresume): every unit of the job gets STOP or CONT, which
        its supervisor passes to the job's processes (and its `xce launch` tasks). The run limit
        keeps counting while a job is suspended."""
        results: list[dict] = []
        for job in (j for _label, jobs, _whole in self.owned_refs(caller, body) for j in jobs):
            with self.state.mu:
                behind = self.state.behind.get(job.id) if job.state == DISP else None  # prefilling.py
            if behind is not None:
                verb, where = "suspend" if event == "suspended" else "resume", queued_reason(job.hosts[0][0], behind)
                results.append({"id": job.id, "ok": False, "message": (
                    f"Job <{job.id}> is {where} and has not started: nothing to {verb}; "
                    f"`xce hold {job.id}` (or `xce requeue --hold {job.id}`) holds it (PSUSP), `xce kill {job.id}` "
                    f"drops it")})
                continue
            job = self._start_stored(job) if job.state == DISP and event == "suspended" else job
            target = _next_or_refuse(job, event, results)
            if target is None:
                continue
            with self.state.mu:
                active = self.state.active.get(job.id)
                units = [(active.host_of(i), u) for i, u in enumerate(active.units)] if active else []
            hosts = [(self.state.hosts.get(name), unit) for name, unit in units]
            if not units or hosts[0][0] is None:
                results.append({"id": job.id, "ok": False,
                                "message": f"Job <{job.id}>: its first host is out of reach; try again later"})
                continue
            delivered = [host.signal(unit, signal, f"{event} by {caller.user}")
                         for host, unit in hosts if host is not None]
            if not delivered[0]:
                results.append({"id": job.id, "ok": False, "message": f"Job <{job.id}> is not running any more"})
                continue
            with self.state.mu:
                moved = self.store.change_state([job.id], job.state, target, event, self.clock.time(),
                                                reason=f"{event} by {caller.user}" if event == "suspended" else None)
                if moved and job.id in self.state.active:
                    self.state.active[job.id].state = target
            results.append({"id": job.id, "ok": bool(moved), "message": f"Job <{job.id}> is {event}" if moved
                            else f"Job <{job.id}> changed meanwhile; look again with `xce jobs {job.id}`"})
        return {"results": results}


    def _start_stored(self, job: Job, patience: float = 1.0) -> Job:
        """`job` (DISP in the store) read again once its start is stored, if it was launched: a start
        may wait up to START_WAIT to share a commit (start_wait.py), a moment a suspend must not see
        as "not running". Wakes the tick to store it now; gives up after `patience` seconds."""
        with self.state.mu:
            if job.id not in self.state.active:
                return job
            self.state.store_starts_now = True
        self.state.wake.set()
        deadline = time.monotonic() + patience  # real time, not the clock seam: the tick it waits for runs apart
        while time.monotonic() < deadline:
            again = self.store.get(job.id)
            if again is None or again.state != DISP:
                return again or job
            time.sleep(0.005)
        return job


def _next_or_refuse(job: Job, event: str, results: list[dict]) -> str | None:
    """The job's state after `event`, or None with the lifecycle's refusal added to `results`."""
    try:
        return next_state(job.state, event)
    except errors.TransitionError as err:
        results.append({"id": job.id, "ok": False, "message": f"Job <{job.id}>: {err}"})
        return None


def _refs_of(body: Any) -> list:
    """The jobs a request names: ids, or text such as "42" and "42[7]"."""
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, (int, str)) and not isinstance(i, bool)
                                                       for i in ids):
        raise errors.SpecError('send {"ids": [job id or "42[7]", ...]} naming at least one job')
    return ids

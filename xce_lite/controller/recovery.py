"""A start of the controller: the shared state rebuilt from the store (the store is the truth).

Pending jobs go back on the pending path (gating.py), held ones are held, and each dispatched or
running job is active again with its units: unit 0 of a job stored RUN is known to have run, the
others (and every unit of a DISP job) are NEW until their hosts list them (unitwork.py reconciles).
A kill recorded for an active job is marked again: the first may never have reached its host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xce_lite.config.sched_view import Holding
from xce_lite.controller.dispatching import Dispatching
from xce_lite.controller.gating import Gating
from xce_lite.controller.jobunits import job_units
from xce_lite.controller.kill_marks import KillMarks
from xce_lite.controller.prefill_chains import behind_in, recover_chains
from xce_lite.controller.seams import Clock
from xce_lite.controller.state import NEW, RUNNING, Active, ControllerState
from xce_lite.controller.unitwork import Units
from xce_lite.models import DISP, PEND, PSUSP


def load(state: ControllerState, store: Any, clock: Clock, log: Callable[[str], None], gating: Gating,
         dispatching: Dispatching, units: Units, kills: KillMarks) -> None:
    """See the module docstring. Called once, before the links start and the API serves."""
    jobs = store.unfinished()
    killed = store.kill_requested([j.id for j in jobs if j.state not in (PEND, PSUSP)])
    for job in jobs:
        if job.state == PEND:
            gating.enqueue(job.id, job.user, job.queue, job.spec, job.submit_time, job.array_id, job.depend)
            state.reasons[job.id] = state.stored_reasons[job.id] = job.pend_reason
            if job.attempt:
                state.attempts[job.id] = job.attempt
        elif job.state == PSUSP:
            state.held[job.id] = job.user
            if job.array_id is not None:
                gating.note_element(job.id, job.array_id)
            if job.attempt:
                state.attempts[job.id] = job.attempt
        else:
            holding = Holding.from_json(job.alloc, job.hosts)
            names = job_units(state.cluster, job.id, job.attempt, len(holding.allocs))
            # Unit 0 of a job stored RUN is known to have run; the others are matched as their
            # hosts list them (a unit of a job that runs may not have reached its host yet).
            status = [RUNNING if i == 0 and job.state != DISP else NEW for i in range(len(names))]
            active = Active(job.id, job.user, job.queue, job.state, job.attempt, holding, names, status,
                            retries=job.retries, killed=killed.get(job.id), project=job.project,
                            since=job.start_time or clock.time())
            if job.state == DISP and (pred := behind_in(store.events(job.id))) is not None:
                state.behind[job.id] = active.after = pred  # a queued successor (prefilling.py)
                state.behind_requests[job.id] = gating.pending_job(job.id, job.user, job.queue, job.spec,
                                                                   job.submit_time)
            units.add_active(dispatching.with_workflow(active, job.array_id, job.effective))
            if active.killed:  # sent again: the first may never have reached the host (kills.py)
                kills.mark(job.id, active.killed)
    recover_chains(state.behind, state.active, store)
    if state.active:
        log(f"recovering {len(state.active)} dispatched or running jobs")

"""The answers of a Session (session.py): the Placement of the hosts and task counts it chose, or
the Refusal that says why a job cannot be placed now. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from xce_lite.sched import resreq as rr
from xce_lite.sched.fit import GPUS, Demand, Term
from xce_lite.sched.reasons import (
    FrozenMap,
    HostAlloc,
    HostRefusal,
    NoFirstHost,
    Placement,
    Refusal,
    SharedShort,
    TooFewTasks,
    format_amount,
)

if TYPE_CHECKING:
    from xce_lite.sched.placement import JobRequest
    from xce_lite.sched.session_state import SessionHost


def placement_of(job: JobRequest, chosen: list[tuple[SessionHost, int]], host_terms: list[Term],
                 shared_terms: list[Term]) -> Placement:
    allocs = []
    for position, (host, tasks) in enumerate(chosen):
        first = position == 0
        reserved = {name: amount for name, per_task, per_host, per_job in host_terms
                    if (amount := per_task * tasks + (per_host + (per_job if first else 0)))}
        gpus = host.gpu_free[:math.ceil(reserved.get(GPUS, 0))]
        allocs.append(HostAlloc(host.name, tasks, FrozenMap(reserved), gpus))
    tasks, count = sum(a.tasks for a in allocs), len(allocs)
    shared = {name: amount for name, per_task, per_host, per_job in shared_terms
              if (amount := per_task * tasks + (per_host * count + per_job))}
    return Placement(job.id, tuple(allocs), FrozenMap(shared))


def refusal_of(job: JobRequest, refused: list[HostRefusal], capacity: list[tuple[str, int]], most: int,
               demand: Demand, shared_free: Mapping[str, Any], no_first: bool) -> Refusal:
    """The Refusal: `refused` and `capacity` (the hosts with room) by host name; `no_first`: hosts
    have room but none for the per-job rusage too."""
    reasons: list[Any] = []
    if no_first:
        reasons.append(NoFirstHost(", ".join(f"{name}={format_amount(name, j)}/job"
                                             for name, _, _, j in demand.host_terms if j)))
    for name, per_task, per_host, per_job_amount in demand.shared_terms:
        need, have = per_task * job.min_tasks + (per_host * 1 + per_job_amount), shared_free.get(name, 0)
        if need > have:
            reasons.append(SharedShort(name, need, max(have, 0)))
    if capacity:
        span = rr.format_span(job.resreq.span) if job.resreq.span else ""
        reasons.insert(0, TooFewTasks(job.min_tasks, most, span, job.resreq.same))
    return Refusal(job.id, tuple(reasons), tuple(refused), tuple(capacity))

"""The controller's in-memory view checked against what must always hold (tako's `sanity_check`):
tests call `check_invariants` after every tick; it reads, never changes, and says every broken
rule at once.

- a job is in at most one of: pending (the scheduler's set), held (PSUSP), active (DISP/RUN), and
  one waiting at the gate (a dependency, an array's throttle) is not active;
- every active job's units line up: one unit and one status per allocation, each unit indexed back
  to (job, index), results exactly for the ENDED units; no unit both active and draining;
- no host has more of any resource reserved (active and draining units together) than it has,
  and no GPU is given twice;
- a job someone killed is never pending or held again;
- the active jobs' index (active.py: allocations per host, tasks per queue and user, shared
  counters) equals its computation from scratch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from xce_lite.controller.state import ENDED, NEW, RUNNING, SENT, Active, ControllerState

if TYPE_CHECKING:
    from xce_lite.controller.core import Controller

STATUSES = frozenset({NEW, SENT, RUNNING, ENDED})


class InvariantBroken(AssertionError):
    """The controller's view broke a rule; the message lists each one."""


def problems(view: Controller) -> list[str]:
    """Every rule the controller `view` breaks now, as sentences."""
    found: list[str] = []
    state = view.state
    pending, held, active = set(state.pending), set(state.held), set(state.active)
    for a, b, what in ((pending, held, "pending and held"), (pending, active, "pending and active"),
                       (held, active, "held and active")):
        for job_id in sorted(a & b):
            found.append(f"job {job_id} is both {what}")
    for job_id in sorted(set(view.gating.gate.waiters) & active):
        found.append(f"job {job_id} waits at the gate for its dependency, yet it is active")
    for job in state.active.values():
        found.extend(_units_problems(state, job))
    for unit, drain in state.draining.items():
        if unit in state.by_unit:
            found.append(f"unit {unit} is both draining (job {drain.job_id}) and active")
    for job_id, where in ((w[0], unit) for unit, w in state.by_unit.items()):
        if job_id not in state.active:
            found.append(f"unit {where} is indexed to job {job_id}, which is not active")
    found.extend(_over_allocated(state))
    found.extend(state.active.problems())  # what sessions read of the active jobs, kept as they change
    return found


def check_invariants(view: Controller, killed: AbstractSet[int] = frozenset()) -> None:
    """Raise InvariantBroken naming every broken rule. `killed`: jobs a test knows were killed
    while active or pending (the view keeps a kill only while the job is active)."""
    found = problems(view)
    state = view.state
    for job_id in sorted(killed & (set(state.pending) | set(state.held))):
        found.append(f"job {job_id} was killed, yet it is {'pending' if job_id in state.pending else 'held'}")
    if found:
        raise InvariantBroken("; ".join(found))


def _units_problems(state: ControllerState, job: Active) -> list[str]:
    n = len(job.holding.allocs)
    if not (len(job.units) == len(job.status) == n) or n == 0:
        return [f"job {job.id}: {len(job.units)} units, {len(job.status)} statuses, {n} allocations"]
    found = []
    for index, unit in enumerate(job.units):
        if state.by_unit.get(unit) != (job.id, index):
            found.append(f"job {job.id}: unit {unit} is indexed as {state.by_unit.get(unit)}")
        if job.status[index] not in STATUSES:
            found.append(f"job {job.id}: unit {unit} has status {job.status[index]!r}")
        if (job.status[index] == ENDED) != (index in job.results):
            found.append(f"job {job.id}: unit {unit} is {job.status[index]} with"
                         f"{'' if index in job.results else 'out'} a result")
    return found


def _over_allocated(state: ControllerState) -> list[str]:
    used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gpus: dict[str, dict[int, int]] = defaultdict(dict)
    found = []
    allocs = [(job.id, a) for job in state.active.values() for a in job.holding.allocs]
    allocs += [(d.job_id, d.alloc) for d in state.draining.values()]
    for job_id, alloc in allocs:
        for name, amount in alloc.reserved.items():
            used[alloc.host][name] += amount
        for gpu in alloc.gpus:
            other = gpus[alloc.host].setdefault(gpu, job_id)
            if other != job_id:
                found.append(f"GPU {gpu} of host {alloc.host} is given to jobs {other} and {job_id}")
    totals = {host.name: host.total for host in state.host_totals}
    for host, amounts in sorted(used.items()):
        total = totals.get(host)
        if total is None:
            continue  # a host removed from the configuration: what it still holds drains
        for name, amount in sorted(amounts.items()):
            if amount > total.get(name, 0) + 1e-9:
                found.append(f"host {host}: {amount:g} {name} reserved, it has {total.get(name, 0):g}")
    return found

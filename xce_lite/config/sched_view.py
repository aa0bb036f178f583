"""Building the scheduler's values from the configuration and the jobs: host totals, what running
jobs hold, what is free, and each job's effective values (the merge of its own values, its
application profile and its queue: merge.py).

Pure functions over plain values (no store, no clock), shared by the controller's tick, its submit
checks, `xce why` and the simulator, so all of them see a job, a queue and a host the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from dataclasses import dataclass, replace

from xce_lite.config.cluster import ClusterConfig
from xce_lite.config.merge import merge
from xce_lite.config.merge_values import Effective, Profile, QueueLimits, parse_resreq
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.sched import resreq as rr
from xce_lite.sched.core import PendingJob, QueuePolicy
from xce_lite.sched.placement import GPUS, SLOTS, HostView, JobRequest, why_never
from xce_lite.sched.reasons import NOTHING, FrozenMap, HostAlloc, Placement


@dataclass(frozen=True)
class Holding:
    """What one dispatched or running job holds: per host allocations and shared counters."""

    allocs: tuple[HostAlloc, ...]
    shared: FrozenMap = NOTHING

    @property
    def hosts(self) -> tuple[tuple[str, int], ...]:
        return tuple((a.host, a.tasks) for a in self.allocs)

    @cached_property
    def tasks(self) -> int:
        """Its tasks on all its hosts (read for every running job at every session: kept once made)."""
        return sum(a.tasks for a in self.allocs)

    def to_json(self) -> dict:
        return {"allocs": [[a.host, a.tasks, dict(a.reserved), list(a.gpus)] for a in self.allocs],
                "shared": dict(self.shared)}

    @classmethod
    def from_json(cls, data: dict | None, hosts: Iterable[tuple[str, int]]) -> Holding:
        """From a stored alloc; a job stored before allocs were (schema 1) held only its slots."""
        if not data:
            return cls(tuple(HostAlloc(h, n, FrozenMap({SLOTS: n})) for h, n in hosts))
        allocs = tuple(HostAlloc(h, n, FrozenMap(reserved), tuple(gpus)) for h, n, reserved, gpus in data["allocs"])
        return cls(allocs, FrozenMap(data.get("shared") or {}))

    @classmethod
    def of(cls, placement: Placement) -> Holding:
        return cls(placement.allocs, placement.shared)


def host_totals(config: ClusterConfig) -> tuple[HostView, ...]:
    """Every configured host, open and empty: totals in base units, attributes and tags."""
    views = []
    for h in config.hosts:
        total: dict[str, int | float] = {SLOTS: h.slots, "mem": h.mem, GPUS: h.gpus}
        for name, amount in h.resources.items():
            total[name] = config.resource_amount(name, amount, f"host {h.name}")
        attrs = {"type": h.type, **h.attrs}
        views.append(HostView(h.name, "ok", total, None, tuple(range(h.gpus)), attrs, frozenset(h.tags)))
    return tuple(views)


def hosts_now(totals: tuple[HostView, ...], states: dict[str, str],
              holdings: Iterable[Holding]) -> tuple[HostView, ...]:
    """The hosts as the scheduler sees them: each state, and totals less what `holdings` reserve."""
    allocs: dict[str, list[HostAlloc]] = {h.name: [] for h in totals}
    for holding in holdings:
        for alloc in holding.allocs:
            if alloc.host in allocs:  # else a host removed from the config while a job still held it
                allocs[alloc.host].append(alloc)
    return tuple(host_now(host, states.get(host.name, "unreachable"), allocs[host.name]) for host in totals)


class HostsNow:
    """`hosts_now` that rebuilds only the hosts whose view, state or allocations changed since its
    last call, handing back the same HostView object for the others: a cache (the same inputs give
    equal views), never a decision. 1,000 hosts rebuilt per session cost ~0.1 s; a session after a
    few ends touches a few hosts."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[HostView, str, tuple[HostAlloc, ...], HostView]] = {}

    def __call__(self, totals: tuple[HostView, ...], states: dict[str, str],
                 holdings: Iterable[Holding]) -> tuple[HostView, ...]:
        allocs: dict[str, list[HostAlloc]] = {h.name: [] for h in totals}
        for holding in holdings:
            for alloc in holding.allocs:
                if alloc.host in allocs:  # else a host removed from the config while a job still held it
                    allocs[alloc.host].append(alloc)
        return self.of(totals, states, {name: tuple(mine) for name, mine in allocs.items()})

    def of(self, totals: tuple[HostView, ...], states: dict[str, str],
           allocs: Mapping[str, tuple[HostAlloc, ...]]) -> tuple[HostView, ...]:
        """The same from the allocations already grouped by host (controller/active.py keeps them:
        the same tuple object for a host nothing changed on makes its test an identity test)."""
        views = []
        for host in totals:
            state, mine = states.get(host.name, "unreachable"), allocs.get(host.name, ())
            last = self._last.get(host.name)
            if last is not None and last[0] is host and last[1] == state and (last[2] is mine or last[2] == mine):
                views.append(last[3])
                continue
            view = host_now(host, state, mine)
            self._last[host.name] = (host, state, mine, view)
            views.append(view)
        return tuple(views)


def host_now(total: HostView, state: str, allocs: Iterable[HostAlloc]) -> HostView:
    """One host as the scheduler sees it: `total` (a host_totals view) less what `allocs`, the
    allocations on it, reserve, summed in their order (the simulator rebuilds only changed hosts)."""
    used: dict[str, float] = {}
    gpus_used: set[int] = set()
    for alloc in allocs:
        for name, amount in alloc.reserved.items():
            used[name] = used.get(name, 0) + amount
        gpus_used.update(alloc.gpus)
    free = {name: amount - used.get(name, 0) for name, amount in total.total.items()}
    gpu_free = tuple(i for i in total.gpu_free if i not in gpus_used)
    free[GPUS] = len(gpu_free)
    return total.with_free(free, gpu_free, state)


def shared_free(config: ClusterConfig, holdings: Iterable[Holding]) -> FrozenMap:
    """The cluster's shared counters less what `holdings` hold."""
    return less_shared(config.shared, holdings)


def less_shared(shared: Mapping[str, float], holdings: Iterable[Holding]) -> FrozenMap:
    """`shared` less what `holdings` hold, subtracted in their order."""
    free = dict(shared)
    for holding in holdings:
        for name, amount in holding.shared.items():
            free[name] = free.get(name, 0) - amount
    return FrozenMap(free)


def size_resources(config: ClusterConfig) -> frozenset[str]:
    """Resources whose amounts are sizes: mem-like built-ins and custom resources of kind size."""
    builtin = {"mem", "swp", "swap", "tmp", "maxmem", "maxswp", "maxtmp"}
    return frozenset(builtin | {name for name, r in config.resources.items() if r.kind == "size"})


def check_units(resreq: rr.ResReq, sizes: frozenset[str]) -> None:
    """A size unit (K, M, G, T) on a count (`rusage[gpus=2G]`) is a mistake, not a multiplier."""
    named = [(term.name, term.unit) for term in resreq.rusage]
    stack = [resreq.select] if resreq.select is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, rr.Compare) and isinstance(node.right, rr.Number):
            named.append((node.left.name, node.right.unit))
        stack.extend(getattr(node, "items", ()))
        if isinstance(node, rr.Not):
            stack.append(node.operand)
    for name, unit in named:
        if unit and unit.upper() not in ("", "B") and name not in sizes:
            raise SpecError(f"-R: {name} is a count, so the unit {unit} does not apply; write a plain number")


def job_request(job_id: int, min_tasks: int, max_tasks: int | None, resreq: tuple[str, ...]) -> JobRequest:
    """The job's effective request; SpecError (with the column) for a malformed -R."""
    try:
        return JobRequest(job_id, min_tasks, max_tasks, parse_resreq(resreq))
    except SpecError:
        raise
    except ValueError as err:  # a value the parser let through that the types refuse
        raise SpecError(f"-R: {err}") from None


def queue_limits(config: ClusterConfig, queue: str | None) -> QueueLimits:
    """What the merge reads of a queue; SpecError (listing the queues) for an unknown one."""
    q = config.queue(queue)
    return QueueLimits(q.name, q.run_limit, q.mem_limit, q.max_tasks)


def effective(spec: JobSpec, queue: str | None, config: ClusterConfig, profiles: dict[str, Profile]) -> Effective:
    """The job's effective values under this configuration (merge.py); SpecError if its queue or
    profile is not defined, or it breaks a rule. `spec.app` None or "": no profile (the controller
    resolves None to the default application at submit)."""
    limits = queue_limits(config, queue)
    profile = None
    if spec.app:
        profile = profiles.get(spec.app)
        if profile is None:
            raise SpecError(f"application {spec.app!r} is not defined; the applications are: "
                            f"{', '.join(sorted(profiles))} (see `xce apps`)")
    return merge(spec, profile, limits)


def queue_policies(config: ClusterConfig) -> tuple[QueuePolicy, ...]:
    """What the scheduler reads of each queue: priority, hosts, running limits."""
    return tuple(QueuePolicy(q.name, q.priority, frozenset(q.hosts) if q.hosts is not None else None,
                             q.running_limit, q.user_running_limit) for q in config.queues)


def pending_job(job_id: int, user: str, queue: str, spec: JobSpec, submit_time: float, config: ClusterConfig,
                profiles: dict[str, Profile]) -> tuple[PendingJob, Effective | None]:
    """The scheduler's view of a pending job, and its effective values: its request merged live, so a
    changed profile or queue ceiling applies to jobs already waiting. A job that cannot be merged
    now (its profile or queue is gone, a reconfig made it unrunnable) is blocked with the reason
    (and no effective values): it pends, never EXIT, until the configuration lets it run."""
    try:
        eff = effective(spec, queue, config, profiles)
    except SpecError as err:
        return PendingJob(job_id, user, queue, JobRequest(job_id), spec.priority, submit_time,
                          blocked=f"cannot run as configured now: {err}", project=spec.project), None
    request = JobRequest(job_id, eff.min_tasks, eff.max_tasks, eff.resreq)
    return PendingJob(job_id, user, queue, request, spec.priority, submit_time, eff.profile_hash,
                      project=spec.project), eff


def admit(spec: JobSpec, config: ClusterConfig, profiles: dict[str, Profile], totals: tuple[HostView, ...],
          never: Callable[[JobRequest], str | None] | None = None) -> tuple[JobSpec, str, Effective]:
    """What submit checks before anything is stored: the spec as it will be stored (a job without
    -app gets the cluster's default_application, and remembers it did), its queue's name and its
    effective values; SpecError if they break a rule or no host could ever run them. `never`
    answers `why_never(request, totals, config.shared)`; the simulator passes a memo of it (the
    answer depends on the request alone, and reading 1,000 hosts per submit is 0.1 s)."""
    queue_name = config.queue(spec.queue).name
    if spec.app is None:  # the job keeps the name it was submitted under, whatever the default becomes
        spec = replace(spec, app=config.default_application, exdata={**spec.exdata, "app_origin": "default"})
    eff = effective(spec, queue_name, config, profiles)
    check_units(eff.resreq, size_resources(config))
    request = JobRequest(0, eff.min_tasks, eff.max_tasks, eff.resreq)
    why = why_never(request, totals, config.shared) if never is None else never(request)
    if why is not None:
        raise SpecError(f"{why} (see `xce hosts -l`)")
    return spec, queue_name, eff

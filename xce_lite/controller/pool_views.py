"""What the scheduler, submit, pend reasons and `xce hosts -l` see of the host pools (pools.py).

A part of the controller beside Pools (pools.py), sharing with it the allocation records (`PoolRecords`):
- each pool is a template host named as the pool, standing for one whole allocation and never up,
  so that submit can tell a job no allocation could ever run, and the pool's entry in a pend reason
  says what the pool is doing (`_pool_words`) instead of `unreachable`;
- each node of a running allocation is a host with the pool's slots and mem and the attribute
  `time_left`; a queue naming a pool may use the pool's hosts;
- a job with a run limit gets the select term that keeps it off a host whose allocation ends first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from xce_lite.config.cluster import PoolConfig
from xce_lite.config.merge import Effective
from xce_lite.config.sched_view import queue_policies
from xce_lite.controller.seams import Clock
from xce_lite.controller.state import ControllerState
from xce_lite.errors import SpecError
from xce_lite.quantities import format_duration
from xce_lite.sched import pools as policy
from xce_lite.sched.core import Decisions, PendingJob, QueuePolicy
from xce_lite.sched.placement import GPUS, SLOTS, HostView, JobRequest

LIVE = ("submitting", "pending", "running")
NO_LIMIT = 10**9  # time_left of a host whose allocation has no time limit
# Seconds of an allocation no job is placed in: its launch takes time, and the hosts' time_left is
# refreshed once a tick, so a job with -W exactly the time left would be killed by Slurm's limit.
DRAIN_MARGIN = 5.0


@dataclass
class AllocRecord:
    """One allocation of a pool: `submitting` (stored, sbatch not yet answered), `pending`, `running`,
    `ended` or `failed` (sbatch refused it). `reason` is Slurm's reason while pending, else why it
    ended or failed; `release` why xce cancelled it."""

    pool: str
    seq: int
    job_id: str | None = None
    state: str = "submitting"
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    nodelist: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    idle_since: float | None = None
    release: str | None = None
    settled: bool = True  # False while Slurm still says COMPLETING: its final state is to come
    unsure_since: float | None = None  # its sbatch timed out then: Slurm may have it all the same

    def host_names(self) -> list[str]:
        if len(self.nodes) == 1:
            return [f"{self.pool}-{self.job_id}"]
        return [f"{self.pool}-{self.job_id}-{i}" for i in range(len(self.nodes))]


@dataclass
class PoolRecords:
    """The pools' allocation records and what the controller knows of Slurm: shared by PoolViews
    (what is shown) and Pools (what is done, pools.py). Changed on the tick's thread only."""

    seq: int = 0  # the last allocation's sequence number (stored before its sbatch)
    allocs: list[AllocRecord] = field(default_factory=list)
    polled: dict[str, float] = field(default_factory=dict)  # pool -> when its last squeue was handed over
    retry_at: dict[str, float] = field(default_factory=dict)  # pool -> no sbatch before then
    host_of: dict[str, tuple[AllocRecord, str]] = field(default_factory=dict)  # host -> (allocation, node)
    trouble: dict[str, tuple[str, float]] = field(default_factory=dict)  # pool -> (Slurm's failure, since when)
    sending: set[tuple[str, int]] = field(default_factory=set)  # (pool, seq): its sbatch is handed over
    cancel_at: dict[str, float] = field(default_factory=dict)  # allocation -> when its scancel was handed over


class PoolViews:
    """See the module docstring. A part of the controller (`Controller.pool_views`), given the shared
    state (whose host totals, queue policies and addresses it brings up to date) and the records."""

    def __init__(self, state: ControllerState, records: PoolRecords, clock: Clock) -> None:
        self.state, self.records, self.clock = state, records, clock
        self._said: dict[str, str] = {}  # pool -> its status as the last session's reasons word it

    def reworded(self, pending: Iterable[PendingJob]) -> list[int]:
        """The pending jobs whose reasons `reasons` words anew since the last call: those of the
        queues that may use a pool whose status changed (its words are in their reasons)."""
        said = {pool.name: self.status(pool) for pool in self.state.config.pools}
        changed = {name for name, words in said.items() if self._said.get(name) != words}
        self._said = said
        if not changed:
            return []
        queues = {q.name for q in self.state.queue_policies if q.hosts is None or not changed.isdisjoint(q.hosts)}
        return [job.id for job in pending if job.queue in queues]

    def views(self, now: float) -> tuple[HostView, ...]:
        """A template host per pool (named as the pool, never up: submit checks a job against it,
        as if one allocation were one host) and a host per node of each running allocation."""
        views = []
        for pool in self.state.config.pools:
            total = {SLOTS: pool.slots, "mem": pool.mem, GPUS: 0}
            attrs: dict[str, str | int | float] = {**pool.attrs, "type": "slurm", "pool": pool.name}
            # the template stands for a whole allocation (submit asks: could one ever run the job?)
            n = pool.nodes_per_allocation
            whole = {SLOTS: pool.slots * n, "mem": pool.mem * n, GPUS: 0}
            template = {**attrs, policy.TIME_LEFT: int(pool.time_limit)}
            views.append(HostView(pool.name, "ok", whole, None, (), template, frozenset(pool.tags)))
            for r in self.records.allocs:
                if r.pool == pool.name and r.state == "running":
                    left = NO_LIMIT if r.end_time is None else max(0, int(r.end_time - now - DRAIN_MARGIN))
                    for name in r.host_names():
                        views.append(HostView(name, "ok", total, None, (), {**attrs, policy.TIME_LEFT: left},
                                              frozenset(pool.tags)))
        return tuple(views)

    def policies(self) -> tuple[QueuePolicy, ...]:
        """The queues' policies, a pool's name in `hosts:` standing for the pool and its hosts."""
        members: dict[str, set[str]] = {p.name: {p.name} for p in self.state.config.pools}
        for r in self.records.allocs:
            if r.state == "running" and r.pool in members:
                members[r.pool].update(r.host_names())
        out = []
        for q in queue_policies(self.state.config):
            if q.hosts is not None and (named := q.hosts & members.keys()):
                q = replace(q, hosts=frozenset().union(q.hosts, *(members[p] for p in named)))
            out.append(q)
        return tuple(out)

    def with_pool_time(self, job: PendingJob, eff: Effective | None) -> PendingJob:
        """A pending job (sched_view.pending_job's pair) with the time-left term of its run limit,
        where the cluster has pools: no pool host takes a job whose -W outlasts its allocation."""
        if not self.state.config.pools or eff is None or eff.run_limit is None:
            return job
        return replace(job, request=replace(job.request, resreq=policy.with_time_left(job.request.resreq,
                                                                                      eff.run_limit)))

    def admit(self, queue_name: str, eff: Effective) -> None:
        """At submit: a job whose queue runs on pools alone, with a -W longer than every such
        pool's time_limit, could never run: SpecError, with what to do."""
        if not self.state.config.pools or eff.run_limit is None:
            return
        hosts = self.state.config.queue(queue_name).hosts
        pools = [p for p in self.state.config.pools if hosts is not None and p.name in hosts]
        if hosts is None or not pools or len(pools) < len(hosts) or any(eff.run_limit <= p.time_limit for p in pools):
            return
        limits = ", ".join(f"{p.name} {format_duration(p.time_limit)}" for p in pools)
        raise SpecError(f"run limit {format_duration(eff.run_limit)} is longer than any allocation of the pools of "
                        f"queue {queue_name} can last (time_limit: {limits}); ask for less with -W, or raise "
                        f"the pool's time_limit")

    def refresh(self, now: float) -> None:
        """Put the pools' hosts into the configuration's (after a reconfig, and at each step)."""
        if not self.state.config.pools and not self.records.host_of:
            return
        names = self.names()
        base = tuple(v for v in self.state.host_totals if v.name not in names)
        self.state.host_totals = base + self.views(now)
        self.state.queue_policies = self.policies()
        # a hostfile names a pool host by its Slurm node (what mpirun and srun on the nodes know),
        # not by its xce name, which nothing on the nodes resolves
        nodes = {name: node for r in self.records.allocs if r.state == "running" and r.job_id
                 for name, node in zip(r.host_names(), r.nodes)}
        self.state.addresses = {**{k: v for k, v in self.state.addresses.items() if k not in names}, **nodes}

    def names(self) -> set[str]:
        return {p.name for p in self.state.config.pools} | set(self.records.host_of) | {
            n for r in self.records.allocs if r.job_id for n in r.host_names()}

    def status(self, pool: PoolConfig) -> str:
        """What a job that waits for the pool waits for, in a pend reason (the pool's own entry,
        a template host that is never up, says this instead of `unreachable`)."""
        trouble = self.records.trouble.get(pool.name)
        if trouble is not None:
            return f"Slurm does not answer ({trouble[0]})"
        live = [r for r in self.records.allocs if r.pool == pool.name and r.state in LIVE]
        pending = [r for r in live if r.state == "pending"]
        if pending:
            return "; ".join(f"allocation {r.job_id} pending in Slurm ({r.reason})" for r in pending)
        if any(r.state == "submitting" for r in live):
            return "an allocation is being submitted"
        failed = next((r for r in reversed(self.records.allocs) if r.pool == pool.name and r.state == "failed"), None)
        if failed is not None and self.records.retry_at.get(pool.name, 0) > self.clock.time():
            return f"{failed.reason}; sbatch again soon"
        if len(live) >= pool.max_allocations:
            return f"its {len(live)} allocation(s) (max_allocations) are in use"
        return "an allocation will be submitted"

    def words(self, text: str) -> str:
        for pool in self.state.config.pools:
            words = f"pool {pool.name}: {self.status(pool)}"
            text = re.sub(rf"(?<![\w.-]){re.escape(pool.name)}: unreachable", words, text)
        return text

    def reasons(self, decisions: Decisions | None) -> Decisions | None:
        """The scheduler's decisions with the pools' own entries worded as what they wait for."""
        if decisions is None or not self.state.config.pools:
            return decisions
        return replace(decisions, waiting=tuple((self.words(r), ids) for r, ids in decisions.waiting))

    def why(self, queue: str, hosts: tuple[HostView, ...], request: JobRequest,
            run_limit: float | None) -> tuple[tuple[HostView, ...], JobRequest]:
        """For `xce why`, where there are pools: the hosts the job's queue allows (a pool stands for
        its hosts), and its request with the time-left term of its run limit."""
        if not self.state.config.pools:
            return hosts, request
        allowed = next((q.hosts for q in self.state.queue_policies if q.name == queue), None)
        if allowed is not None:
            hosts = tuple(h for h in hosts if h.name in allowed)
        if run_limit is not None:
            request = replace(request, resreq=policy.with_time_left(request.resreq, run_limit))
        return hosts, request

    def wire(self, now: float) -> list[dict]:
        out = []
        for pool in self.state.config.pools:
            allocs = []
            for r in self.records.allocs:
                if r.pool != pool.name:
                    continue
                left = None if r.state != "running" or r.end_time is None else max(0.0, r.end_time - now)
                allocs.append({"job_id": r.job_id, "state": r.state, "reason": r.reason, "nodes": r.nodes,
                               "hosts": r.host_names() if r.job_id and r.nodes else [], "time_left": left,
                               "submit_time": r.submit_time, "start_time": r.start_time, "release": r.release})
            trouble = self.records.trouble.get(pool.name)
            out.append({"name": pool.name, "type": pool.type, "partition": pool.partition, "via": pool.via,
                        "trouble": trouble[0] if trouble else None, "trouble_since": trouble[1] if trouble else None,
                        "max_allocations": pool.max_allocations, "time_limit": pool.time_limit,
                        "idle_timeout": pool.idle_timeout, "allocations": allocs})
        return out

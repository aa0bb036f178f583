"""What the scheduler, submit, pend reasons and `xce hosts -l` see of the host pools (pools.py).

A mixin of the controller, beside PoolWork (which keeps `_allocs`, the pools' allocation records):
- each pool is a template host named as the pool, standing for one whole allocation and never up,
  so that submit can tell a job no allocation could ever run, and the pool's entry in a pend reason
  says what the pool is doing (`_pool_words`) instead of `unreachable`;
- each node of a running allocation is a host with the pool's slots and mem and the attribute
  `time_left`; a queue naming a pool may use the pool's hosts;
- a job with a run limit gets the select term that keeps it off a host whose allocation ends first.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

from xce_lite.config.cluster import PoolConfig
from xce_lite.config.sched_view import queue_policies
from xce_lite.errors import SpecError
from xce_lite.quantities import format_duration
from xce_lite.sched import pools as policy
from xce_lite.sched.placement import GPUS, SLOTS, HostView

LIVE = ("submitting", "pending", "running")
NO_LIMIT = 10**9  # time_left of a host whose allocation has no time limit
# Seconds of an allocation no job is placed in: its launch takes time, and the hosts' time_left is
# refreshed once a tick, so a job with -W exactly the time left would be killed by Slurm's limit.
DRAIN_MARGIN = 5.0


class PoolViews:
    """See the module docstring. Expects the controller's attributes and PoolWork's `_allocs`."""

    def _pool_views(self, now: float) -> tuple[HostView, ...]:
        """A template host per pool (named as the pool, never up: submit checks a job against it,
        as if one allocation were one host) and a host per node of each running allocation."""
        views = []
        for pool in self.config.pools:
            total = {SLOTS: pool.slots, "mem": pool.mem, GPUS: 0}
            attrs = {**pool.attrs, "type": "slurm", "pool": pool.name}
            # the template stands for a whole allocation (submit asks: could one ever run the job?)
            n = pool.nodes_per_allocation
            whole = {SLOTS: pool.slots * n, "mem": pool.mem * n, GPUS: 0}
            template = {**attrs, policy.TIME_LEFT: int(pool.time_limit)}
            views.append(HostView(pool.name, "ok", whole, None, (), template, frozenset(pool.tags)))
            for r in self._allocs:
                if r.pool == pool.name and r.state == "running":
                    left = NO_LIMIT if r.end_time is None else max(0, int(r.end_time - now - DRAIN_MARGIN))
                    for name in r.host_names():
                        views.append(HostView(name, "ok", total, None, (), {**attrs, policy.TIME_LEFT: left},
                                              frozenset(pool.tags)))
        return tuple(views)

    def _pool_policies(self):
        """The queues' policies, a pool's name in `hosts:` standing for the pool and its hosts."""
        members: dict[str, set[str]] = {p.name: {p.name} for p in self.config.pools}
        for r in self._allocs:
            if r.state == "running" and r.pool in members:
                members[r.pool].update(r.host_names())
        out = []
        for q in queue_policies(self.config):
            named = q.hosts & members.keys() if q.hosts is not None else set()
            if named:
                q = replace(q, hosts=frozenset().union(q.hosts, *(members[p] for p in named)))
            out.append(q)
        return tuple(out)

    def _with_pool_time(self, job, eff):
        """A pending job (sched_view.pending_job's pair) with the time-left term of its run limit,
        where the cluster has pools: no pool host takes a job whose -W outlasts its allocation."""
        if not self.config.pools or eff is None or eff.run_limit is None:
            return job
        return replace(job, request=replace(job.request, resreq=policy.with_time_left(job.request.resreq,
                                                                                      eff.run_limit)))

    def _pool_admit(self, queue_name: str, eff) -> None:
        """At submit: a job whose queue runs on pools alone, with a -W longer than every such
        pool's time_limit, could never run: SpecError, with what to do."""
        if not self.config.pools or eff.run_limit is None:
            return
        hosts = self.config.queue(queue_name).hosts
        pools = [p for p in self.config.pools if hosts is not None and p.name in hosts]
        if not pools or len(pools) < len(hosts) or any(eff.run_limit <= p.time_limit for p in pools):
            return
        limits = ", ".join(f"{p.name} {format_duration(p.time_limit)}" for p in pools)
        raise SpecError(f"run limit {format_duration(eff.run_limit)} is longer than any allocation of the pools of "
                        f"queue {queue_name} can last (time_limit: {limits}); ask for less with -W, or raise "
                        f"the pool's time_limit")

    def _refresh_pool_views(self, now: float) -> None:
        """Put the pools' hosts into the configuration's (after a reconfig, and at each step)."""
        if not hasattr(self, "_allocs") or (not self.config.pools and not self._pool_host_of):
            return
        names = self._pool_names()
        base = tuple(v for v in self.host_totals if v.name not in names)
        self.host_totals = base + self._pool_views(now)
        self.queue_policies = self._pool_policies()
        # a hostfile names a pool host by its Slurm node (what mpirun and srun on the nodes know),
        # not by its xce name, which nothing on the nodes resolves
        nodes = {name: node for r in self._allocs if r.state == "running" and r.job_id
                 for name, node in zip(r.host_names(), r.nodes)}
        self.addresses = {**{k: v for k, v in self.addresses.items() if k not in names}, **nodes}

    def _pool_names(self) -> set[str]:
        return {p.name for p in self.config.pools} | set(self._pool_host_of) | {
            n for r in self._allocs if r.job_id for n in r.host_names()}

    def _pool_status(self, pool: PoolConfig) -> str:
        """What a job that waits for the pool waits for, in a pend reason (the pool's own entry,
        a template host that is never up, says this instead of `unreachable`)."""
        trouble = self._pool_trouble.get(pool.name)
        if trouble is not None:
            return f"Slurm does not answer ({trouble[0]})"
        live = [r for r in self._allocs if r.pool == pool.name and r.state in LIVE]
        pending = [r for r in live if r.state == "pending"]
        if pending:
            return "; ".join(f"allocation {r.job_id} pending in Slurm ({r.reason})" for r in pending)
        if any(r.state == "submitting" for r in live):
            return "an allocation is being submitted"
        failed = next((r for r in reversed(self._allocs) if r.pool == pool.name and r.state == "failed"), None)
        if failed is not None and self._pool_retry_at.get(pool.name, 0) > time.time():
            return f"{failed.reason}; sbatch again soon"
        if len(live) >= pool.max_allocations:
            return f"its {len(live)} allocation(s) (max_allocations) are in use"
        return "an allocation will be submitted"

    def _pool_words(self, text: str) -> str:
        for pool in self.config.pools:
            words = f"pool {pool.name}: {self._pool_status(pool)}"
            text = re.sub(rf"(?<![\w.-]){re.escape(pool.name)}: unreachable", words, text)
        return text

    def _pool_reasons(self, decisions):
        """The scheduler's decisions with the pools' own entries worded as what they wait for."""
        if decisions is None or not self.config.pools:
            return decisions
        return replace(decisions, waiting=tuple((self._pool_words(r), ids) for r, ids in decisions.waiting))

    def _pool_why(self, queue: str, hosts: tuple[HostView, ...], request, run_limit: float | None):
        """For `xce why`, where there are pools: the hosts the job's queue allows (a pool stands for
        its hosts), and its request with the time-left term of its run limit."""
        if not self.config.pools:
            return hosts, request
        allowed = next((q.hosts for q in self.queue_policies if q.name == queue), None)
        if allowed is not None:
            hosts = tuple(h for h in hosts if h.name in allowed)
        if run_limit is not None:
            request = replace(request, resreq=policy.with_time_left(request.resreq, run_limit))
        return hosts, request

    def _pools_wire(self, now: float) -> list[dict]:
        out = []
        for pool in self.config.pools:
            allocs = []
            for r in self._allocs:
                if r.pool != pool.name:
                    continue
                left = None if r.state != "running" or r.end_time is None else max(0.0, r.end_time - now)
                allocs.append({"job_id": r.job_id, "state": r.state, "reason": r.reason, "nodes": r.nodes,
                               "hosts": r.host_names() if r.job_id and r.nodes else [], "time_left": left,
                               "submit_time": r.submit_time, "start_time": r.start_time, "release": r.release})
            trouble = self._pool_trouble.get(pool.name)
            out.append({"name": pool.name, "type": pool.type, "partition": pool.partition, "via": pool.via,
                        "trouble": trouble[0] if trouble else None, "trouble_since": trouble[1] if trouble else None,
                        "max_allocations": pool.max_allocations, "time_limit": pool.time_limit,
                        "idle_timeout": pool.idle_timeout, "allocations": allocs})
        return out

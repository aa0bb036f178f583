"""The allocation policy of a host pool (Slurm): what to submit and what to release, now.

A pure function (no I/O, no clock): `decide(pool, allocations, demand, now)` takes the pool's
settings, its live allocations and the jobs that wait for room, and says how many allocations to
submit and which to release, each with why. The controller (controller/pools.py) carries it out.

The rules, in order:
1. Demand is the waiting jobs the pool could ever run: no more slots than one allocation has, and
   no run limit (-W) longer than an allocation's time limit. Jobs the scheduler could place now
   are not demand (the controller passes only jobs a session left pending).
2. An allocation that runs no job is kept while a waiting job fits in its time left (the
   scheduler is about to place it there); otherwise it is released after `idle_timeout` of
   idleness, and at once when jobs wait and none fits in its time left (it is draining: the
   scheduler places no job whose -W outlasts it, see `time_left_term`), so that a fresh one can
   take its place.
3. Allocations to submit: enough for the demand's slots less what running allocations have free
   and what pending ones will bring, never more than `max_allocations` live at once (pending ones
   count), and none while a failed sbatch's back-off lasts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xce_lite.sched import resreq as rr
from xce_lite.sched.resreq_parse import parse

TIME_LEFT = "time_left"  # the host attribute: seconds until the allocation's time limit (pool hosts only)


@dataclass(frozen=True)
class PoolShape:
    max_allocations: int
    slots_per_allocation: int  # slots per node x nodes
    time_limit: float  # seconds
    idle_timeout: float  # seconds


@dataclass(frozen=True)
class Allocation:
    """One live allocation: `pending` (submitted, waiting for Slurm) or `running`. For a running
    one: `end_time` (epoch seconds; None: no limit), `busy` (a job holds one of its hosts),
    `idle_since` (since when it has had no job: its start, or its last job's end), and
    `free_slots` (slots free on its hosts that are up)."""

    job_id: str
    state: str
    end_time: float | None = None
    busy: bool = False
    idle_since: float | None = None
    free_slots: int = 0


@dataclass(frozen=True)
class Demand:
    """A job waiting for room: the slots it needs at least, and its run limit (None: none)."""

    job_id: int
    slots: int
    run_limit: float | None = None


@dataclass(frozen=True)
class PoolDecision:
    submit: int = 0
    release: tuple[tuple[str, str], ...] = ()  # (allocation's job id, why)


def usable(pool: PoolShape, demand: tuple[Demand, ...] | list[Demand]) -> list[Demand]:
    """The waiting jobs an allocation of this pool could ever run (rule 1)."""
    return [d for d in demand
            if d.slots <= pool.slots_per_allocation and (d.run_limit is None or d.run_limit <= pool.time_limit)]


def decide(pool: PoolShape, allocations: list[Allocation], demand: list[Demand], now: float,
           retry_at: float | None = None) -> PoolDecision:
    """See the module docstring. `retry_at`: no sbatch before this time (a failed one's back-off)."""
    wanted = usable(pool, demand)
    release: list[tuple[str, str]] = []
    for a in allocations:
        if a.state != "running" or a.busy:
            continue
        idle_for = now - a.idle_since if a.idle_since is not None else 0.0
        left = a.end_time - now if a.end_time is not None else None
        fits = any(left is None or d.run_limit is None or d.run_limit <= left for d in wanted)
        if fits:
            continue  # a waiting job is about to be placed there: not idle, whatever the clock says
        if idle_for >= pool.idle_timeout:
            release.append((a.job_id, f"idle for {_duration(idle_for)} (idle_timeout {_duration(pool.idle_timeout)})"))
        elif wanted:
            release.append((a.job_id, f"draining: its {_duration(max(0.0, left or 0.0))} left are too short for "
                                      f"the {len(wanted)} waiting job(s)"))
    released = {j for j, _ in release}
    live = [a for a in allocations if a.job_id not in released]
    submit = 0
    if wanted and (retry_at is None or now >= retry_at):
        need_slots = sum(d.slots for d in wanted) - sum(a.free_slots for a in live if a.state == "running")
        coming = sum(1 for a in live if a.state == "pending")
        needed = math.ceil(max(0, need_slots) / pool.slots_per_allocation) - coming
        submit = max(0, min(needed, pool.max_allocations - len(live)))
    return PoolDecision(submit, tuple(release))


def time_left_term(run_limit: float) -> str:
    """The select term a job with run limit `run_limit` gets: on a pool host, at least that much
    time must be left before the allocation's limit (other hosts have no such attribute)."""
    return f"select[type!=slurm || {TIME_LEFT}>={int(math.ceil(run_limit))}]"


def with_time_left(resreq: rr.ResReq, run_limit: float | None) -> rr.ResReq:
    """`resreq` with the time-left term of a job with run limit `run_limit` (none without one)."""
    if run_limit is None:
        return resreq
    return rr.combine([resreq, parse(time_left_term(run_limit))])


def run_limit_of(resreq: rr.ResReq) -> float | None:
    """The run limit a time-left term in `resreq` says, or None (the inverse of with_time_left)."""
    stack = [resreq.select] if resreq.select is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, rr.Or) and len(node.items) == 2:
            right = node.items[1]
            if isinstance(right, rr.Compare) and right.op == ">=" and right.left.name == TIME_LEFT:
                return float(right.right.value)
        stack.extend(getattr(node, "items", ()))
    return None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"

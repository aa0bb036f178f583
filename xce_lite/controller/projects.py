"""The controller's side of projects and fair share: the project a job goes to (at submit), what the
scheduler reads of projects and past usage (each session), holding pending jobs a reconfig put
outside their project, and the `/projects` route.

A part of the controller (`Controller.projects`), given the shared state, the store, the clock,
the log and how pending jobs are held (handlers/flow.py). The policy itself is pure and shared with the
simulator: sched/projects.py (membership, defaults, limits that roll up) and sched/fairshare.py
(decayed usage, dynamic priority, the session's order). What is kept here:
- a `fairshare.Book` per half-life in use, built from the store at start and at a reconfig
  (`store.fairshare_usage`, the one read of past usage), then fed each job as it finishes;
- the caller's groups: its effective gid (SO_PEERCRED) and the supplementary groups of its process
  (/proc/PID/status), else the group database; a job's owner's groups after a reconfig come from
  the group database (the owner is not calling then).
Project admins act on the jobs of their project's subtree and see its usage (permissions.py,
applied at the route table by shared.py).
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import replace
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from xce_lite import errors
from xce_lite.api.caller import Caller
from xce_lite.config.cluster import ClusterConfig, QueueConfig
from xce_lite.config.merge import Effective
from xce_lite.controller.seams import Clock
from xce_lite.controller.shared import Handler
from xce_lite.controller.state import ControllerState
from xce_lite.models import PEND, PSUSP, Job, JobSpec
from xce_lite.sched.fairshare import PROJECT, USER, Book, FairShareInput, QueueShare, entity_of, standing, usage_now
from xce_lite.sched.placement import JobRequest
from xce_lite.sched.projects import Usage, describe_use, held, summed
from xce_lite.sched.reasons import FrozenMap

BOOK_SPAN = 20  # half-lives of past usage read at start: older usage weighs less than a millionth


def caller_groups(caller: Caller) -> tuple[str, ...]:
    """The caller's group names, its effective group first."""
    gids: list[int] = [caller.gid] if caller.gid >= 0 else []
    try:
        with open(f"/proc/{caller.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Groups:"):
                    gids += [int(g) for g in line.split()[1:]]
                    break
    except (OSError, ValueError):
        return user_groups(caller.user, gids)
    return _names(gids)


def user_groups(user: str, first: list[int] | None = None) -> tuple[str, ...]:
    """A user's groups from the group database (primary first)."""
    gids = list(first or [])
    try:
        primary = pwd.getpwnam(user).pw_gid
        gids += [primary, *os.getgrouplist(user, primary)]
    except KeyError:
        pass
    return _names(gids)


def _names(gids: list[int]) -> tuple[str, ...]:
    names: list[str] = []
    for gid in gids:
        try:
            name = grp.getgrgid(gid).gr_name
        except KeyError:
            name = str(gid)
        if name not in names:
            names.append(name)
    return tuple(names)


class ProjectShares:
    """See the module docstring. `move_pending(moves, verb, why)` holds pending jobs (the ids moved)."""

    def __init__(self, state: ControllerState, store: Any, clock: Clock, log: Callable[[str], None],
                 move_pending: Callable[[list[tuple[Job, str]], str, str], set[int]]) -> None:
        self.state, self.store, self.clock, self.log, self.move_pending = state, store, clock, log, move_pending
        self.books: dict[float, Book] = {}
        # fair share as the last session saw it, and under which configuration (none yet under another)
        self.last_fair: tuple[ClusterConfig, FairShareInput] | None = None
        # the last caller's groups: a request's specs share its caller, read /proc and the group
        # database once (the caller is kept, so a later one is never taken for it)
        self._groups: tuple[Caller, tuple[str, ...]] | None = None
        self._projected: tuple[JobSpec, str | None, JobSpec] | None = None  # project_of's last (spec, path, result)
        self.fair_books(clock.time())

    def fair_books(self, now: float) -> None:
        """A book per half-life the queues use now, from the store for one not kept yet."""
        wanted = {q.fairshare.half_life for q in self.state.config.queues if q.fairshare is not None}
        for half_life in list(self.books):
            if half_life not in wanted:
                del self.books[half_life]
        for half_life in wanted - set(self.books):
            book = Book(half_life, now)
            for row in self.store.fairshare_usage(now - BOOK_SPAN * half_life):
                book.add(*row)
            self.books[half_life] = book

    # ---- submit ----------------------------------------------------------------------------------

    def project_of(self, spec: JobSpec, eff: Effective, caller: Caller | None) -> JobSpec:
        """The spec with its project resolved (-P, the caller's group default, the cluster's);
        SpecError if the caller may not submit there or no project limit could ever allow it."""
        if caller is None:
            return spec
        view = self.state.project_view
        memo = self._groups  # one read: API threads submit at once
        if memo is None or memo[0] is not caller:
            memo = self._groups = (caller, caller_groups(caller))
        path = view.resolve(caller.user, memo[1], spec.project)
        why = view.never(JobRequest(0, eff.min_tasks, eff.max_tasks, eff.resreq), path)
        if why is not None:
            raise errors.SpecError(why + " (see `xce projects -l`)")
        if path == spec.project:
            return spec
        last = self._projected  # submits alike (one POST each) get one spec object, as the admit memo
        if last is not None and last[0] is spec and last[1] == path:  # gives them: the store encodes it
            return last[2]  # once, accept keeps its merge (identity: the spec is kept, its id its own)
        projected = replace(spec, project=path)
        self._projected = (spec, path, projected)
        return projected

    # ---- each session ----------------------------------------------------------------------------

    def held_by_project(self, closing: AbstractSet[int] = frozenset()) -> list[tuple[str | None, FrozenMap]]:
        """What each active job holds, by its project; jobs ending in this tick (`closing`) hold nothing."""
        return [(job.project, held(job.holding)) for job in self.state.active.values() if job.id not in closing]

    def inputs(self, now: float, closing: AbstractSet[int] = frozenset()) -> dict[str, Any]:
        """What a Snapshot reads of projects and fair share (sched/core.py); `closing`: jobs ending in
        this tick. Holds _mu."""
        inputs: dict[str, Any] = {}
        view = self.state.project_view
        if not view.open:
            inputs["projects"] = view
            inputs["project_held"] = summed(self.held_by_project(closing))
        fair = [q for q in self.state.config.queues if q.fairshare is not None]
        if fair:
            inputs["fairshare"] = fair_now = self.fair_input(fair, now, closing)
            self.last_fair = (self.state.config, fair_now)
        return inputs

    def fair_input(self, queues: list[QueueConfig], now: float,
                   closing: AbstractSet[int] = frozenset()) -> FairShareInput:
        """Usage: the books plus every active job's time so far (a job ending in this tick joins the
        books only after the commit, so its run counts here); running slots: only jobs that go on,
        as the host views free a closing job's (an ending user would otherwise count twice)."""
        jobs = list(self.state.active.values())
        running = [(j.user, j.project, j.since, sum(n for _, n in j.hosts), sum(len(a.gpus) for a in j.holding.allocs))
                   for j in jobs]
        slots: dict[str, dict[str, float]] = {USER: {}, PROJECT: {}}
        for job, (user, project, _since, n, _gpus) in zip(jobs, running):
            if job.id in closing:
                continue
            for by, entity in ((USER, user), (PROJECT, project or "")):
                slots[by][entity] = slots[by].get(entity, 0) + n
        shares = []
        for q in queues:
            assert q.fairshare is not None  # the callers pass the fair-share queues only
            policy = q.fairshare.policy()
            book = self.books.get(policy.half_life)
            if book is None:  # a reconfig added the half-life a moment ago
                self.fair_books(now)
                book = self.books[policy.half_life]
            shares.append(QueueShare(q.name, policy, usage_now(policy, book.at(now), running, now)))
        return FairShareInput(tuple(shares), FrozenMap({by: FrozenMap(m) for by, m in slots.items()}))

    def finished(self, job_id: int, start: float | None, end: float) -> None:
        """A job ended: its run joins every book. Holds _mu (before the job leaves `_active`)."""
        job = self.state.active.get(job_id)
        if job is None or start is None or not self.books:
            return
        slots = sum(n for _, n in job.hosts)
        gpus = sum(len(a.gpus) for a in job.holding.allocs)
        for book in self.books.values():
            book.add(job.user, job.project, start, end, slots, gpus)

    def fair_standing(self, job: Job) -> dict | None:
        """Fair share as the last session saw it, for a job of a fair-share queue (`xce why`, `jobs -l`)."""
        with self.state.mu:
            last = self.last_fair
            if last is not None and last[0] is self.state.config:
                fair = last[1]
            else:
                queues = [q for q in self.state.config.queues if q.fairshare is not None and q.name == job.queue]
                if not queues:
                    return None
                fair = self.fair_input(queues, self.clock.time())
        share = next((q for q in fair.queues if q.queue == job.queue), None)
        if share is None:
            return None
        entity = entity_of(share.policy.by, job.user, job.project)
        return standing(share, entity, fair.running.get(share.policy.by, FrozenMap()).get(entity, 0))

    def project_room(self, job: Job, eff: Effective) -> str | None:
        """Why the job's projects are too full for it now (`xce why`), or None."""
        with self.state.mu:
            view = self.state.project_view
            if view.open:
                return None
            usage = Usage(view, self.held_by_project())
        return usage.room(job.project, JobRequest(job.id, eff.min_tasks, eff.max_tasks, eff.resreq))[0]

    # ---- a reconfig --------------------------------------------------------------------------------

    def hold_outside(self, jobs: list[Job]) -> list[int]:
        """Pending jobs whose project is gone, or whose owner left it, are held (PSUSP) with the
        reason, never killed: release them once the configuration lets them run."""
        view = self.state.project_view
        if view.open:
            return []
        groups: dict[str, tuple[str, ...]] = {}
        by_reason: dict[str, list[Job]] = {}
        for job in jobs:
            if job.state != PEND or job.project is None:
                continue
            if job.user not in groups:
                groups[job.user] = user_groups(job.user)
            why = view.why_not(job.user, groups[job.user], job.project)
            if why is not None:
                by_reason.setdefault(why, []).append(job)
        held_ids: list[int] = []
        for why, group in by_reason.items():
            held_ids += self.move_pending([(job, PSUSP) for job in group], "held", why)
        if held_ids:
            self.log(f"held {len(held_ids)} pending job(s) outside their project after a configuration change")
        return held_ids

    def releasable(self, movable: list[tuple[Job, str]], refused: list[dict]) -> list[tuple[Job, str]]:
        """Of the held jobs asked to be released, those whose owner may still use their project; the
        others get a refusal saying why (they stay held)."""
        view = self.state.project_view
        kept = []
        for job, target in movable:
            why = view.why_not(job.user, user_groups(job.user), job.project)
            if why is None:
                kept.append((job, target))
            else:
                refused.append({"id": job.id, "ok": False, "message": f"Job <{job.display_id}> stays held: {why}"})
        return kept

    # ---- the route ---------------------------------------------------------------------------------

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("GET", "/projects"): self.api_projects}

    def api_projects(self, caller: Caller, query: dict, body: Any) -> dict:
        """The project tree: members, groups, admins, limits and what the subtree's running jobs
        hold now (rolled up); jobs pending and running per project (its own)."""
        counts = self.store.counts_by_project()
        with self.state.mu:
            view = self.state.project_view
            held_now = self.held_by_project()
            seen = {p.path for p in view.projects} | {p for p, _state in counts if p is not None} | \
                {p for p, _amounts in held_now if p is not None}
            use = describe_use(view, held_now, seen)
            default, group_defaults = view.default, dict(view.group_defaults)
        mine = set(view.mine(caller.user, caller_groups(caller)))
        projects = []
        for path in sorted(seen):
            p = view.get(path)
            own = {state: n for (name, state), n in counts.items() if name == path}
            projects.append({
                "name": path, "defined": p is not None, "description": p.description if p else "",
                "members": sorted(p.members) if p else [], "groups": sorted(p.groups) if p else [],
                "admins": sorted(p.admins) if p else [], "limits": dict(p.limits) if p else {},
                "use": use.get(path, {}), "yours": path in mine or view.open,
                "pend": own.get(PEND, 0), "held": own.get(PSUSP, 0),
                "run": sum(n for state, n in own.items() if state not in (PEND, PSUSP))})
        return {"schema": 1, "open": view.open, "default": default, "group_defaults": group_defaults,
                "projects": projects}

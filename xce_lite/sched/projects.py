"""Projects: who may submit to which, and the limits that roll up the project tree. Pure: no I/O,
no clock; the controller's submit and scheduling paths and the simulator call these same functions.

A project is named by its path (`lab/vision/gpu-study`); its ancestors are the paths before each
`/` (`lab/vision`, `lab`), and the configuration defines every ancestor of a project it defines.

Who may submit (checked at submit, never inherited down or up the tree): the project's `members`,
its `admins`, and users in one of its `groups`. A user may be in several projects. A job without
`-P` goes to its submitter's group default (the first of the caller's groups, primary first, that
names one), else to the cluster default. Open mode, until the first project is defined: any user,
any project name, no limits; the job's project is then a label for bookkeeping.

Limits roll up: a running job counts against its own project and every ancestor, and a project's
limit bounds what its whole subtree holds at once: `slots`, `mem`, `gpus`, custom resources (what
the jobs reserve, as placed), and `jobs` (running jobs). A request no limit on its chain could ever
allow is refused at submit (`never`); one that does not fit now pends with a reason naming the
project and the resource (`Usage.room` before placement, `Usage.over` for the placement itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from xce_lite.errors import SpecError
from xce_lite.sched.fit import SLOTS, most_fitting, request_terms
from xce_lite.sched.placement import JobRequest
from xce_lite.sched.reasons import NOTHING, FrozenMap, HostAlloc, format_amount

JOBS = "jobs"  # the limit on running jobs, beside the resources
DEFAULT_PROJECT = "default"  # the cluster default when the configuration names none


def ancestors(path: str) -> tuple[str, ...]:
    """`lab/vision/x` -> (`lab/vision/x`, `lab/vision`, `lab`): the path first, the root last."""
    parts = path.split("/")
    return tuple("/".join(parts[:i]) for i in range(len(parts), 0, -1))


@dataclass(frozen=True)
class Project:
    path: str
    members: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    admins: frozenset[str] = frozenset()
    limits: FrozenMap = NOTHING  # resource (or JOBS) -> the most its subtree's running jobs hold at once
    description: str = ""

    def admits(self, user: str, groups: Iterable[str]) -> bool:
        return user in self.members or user in self.admins or not self.groups.isdisjoint(groups)


@dataclass(frozen=True)
class Projects:
    """The configured projects, the cluster default and the groups' defaults. No projects: open mode."""

    projects: tuple[Project, ...] = ()
    default: str = DEFAULT_PROJECT
    group_defaults: FrozenMap = NOTHING  # group -> project path
    _by_path: dict = field(default_factory=dict, compare=False, repr=False)
    _chains: dict = field(default_factory=dict, compare=False, repr=False)  # path -> limited_chain(path)

    def __post_init__(self) -> None:
        self._by_path.update((p.path, p) for p in self.projects)

    @property
    def open(self) -> bool:
        return not self.projects

    def get(self, path: str | None) -> Project | None:
        return self._by_path.get(path) if path is not None else None

    def limited_chain(self, path: str | None) -> tuple[Project, ...]:
        """The project and its ancestors that have limits, nearest first."""
        if path is None or not self.projects:
            return ()
        chain = self._chains.get(path)
        if chain is None:
            chain = self._chains[path] = tuple(p for a in ancestors(path)
                                               if (p := self._by_path.get(a)) is not None and p.limits)
        return chain

    def mine(self, user: str, groups: Iterable[str]) -> list[str]:
        groups = tuple(groups)
        return [p.path for p in self.projects if p.admits(user, groups)]

    def resolve(self, user: str, groups: Iterable[str], asked: str | None) -> str:
        """The project a job goes to: `asked` (-P), else the first of `groups` with a default, else
        the cluster default. SpecError, saying what to do, when `user` may not submit to it."""
        groups = tuple(groups)
        origin = "-P"
        path = asked
        if path is None:
            origin = "the cluster's default project"
            path = self.default
            for group in groups:
                if group in self.group_defaults:
                    path, origin = self.group_defaults[group], f"the default project of your group {group}"
                    break
        if self.open:
            return path
        project = self._by_path.get(path)
        if project is None:
            raise SpecError(f"{origin}: there is no project {path!r}; {self._yours(user, groups)}")
        if not project.admits(user, groups):
            raise SpecError(f"{origin}: you ({user}) are not a member of project {path} (membership is not "
                            f"inherited from parent or child projects); {self._yours(user, groups)}")
        return path

    def _yours(self, user: str, groups: tuple[str, ...]) -> str:
        mine = self.mine(user, groups)
        if not mine:
            return "you are a member of no project: ask an admin to add you (see `xce projects`)"
        return f"give -P with one of yours: {', '.join(mine)}"

    def why_not(self, user: str, groups: Iterable[str], path: str | None) -> str | None:
        """Why a job of `user` in `path` may no longer wait to run (after a reconfig), or None."""
        if self.open or path is None:
            return None
        project = self._by_path.get(path)
        if project is None:
            return f"project {path} is no longer defined; kill the job, or define the project again and release it"
        if not project.admits(user, groups):
            return (f"{user} is no longer a member of project {path}; kill the job, or add the membership "
                    f"again and release it")
        return None

    def never(self, request: JobRequest, path: str | None) -> str | None:
        """Why no limit on the job's chain could ever allow it (the least it could start with is
        more than a limit), or None."""
        for project in self.limited_chain(path):
            for resource, limit in project.limits.items():
                least = 1 if resource == JOBS else _least(request, resource)
                if least > limit:
                    what = "running jobs" if resource == JOBS else resource
                    return (f"project {project.path} allows at most {format_amount(resource, limit)} {what} at once "
                            f"(its limits.{resource}); this job needs at least {format_amount(resource, least)}: "
                            f"ask for less, or use another project")
        return None


def _terms(request: JobRequest) -> dict[str, tuple]:
    return {name: (per_task, per_host, per_job) for name, per_task, per_host, per_job in request_terms(request, ())[0]}


def _least(request: JobRequest, resource: str) -> float:
    """What the job holds of `resource` at the least: its minimum tasks, on one host."""
    per_task, per_host, per_job = _terms(request).get(resource, (0, 0, 0))
    return per_task * request.min_tasks + per_host + per_job


class Placed(Protocol):
    """What `held` reads of a placement: a Placement, or the controller's Holding of a running job."""

    @property
    def allocs(self) -> tuple[HostAlloc, ...]: ...

    @property
    def shared(self) -> FrozenMap: ...


def held(placement: Placed) -> FrozenMap:
    """What a placed job counts against its projects: what it reserves on hosts and shared
    counters (slots and GPUs included), and one running job."""
    amounts: dict[str, float] = {JOBS: 1}
    for alloc in placement.allocs:
        for name, amount in alloc.reserved.items():
            amounts[name] = amounts.get(name, 0) + amount
    for name, amount in placement.shared.items():
        amounts[name] = amounts.get(name, 0) + amount
    return FrozenMap(amounts)


def summed(holding: Iterable[tuple[str | None, Mapping[str, float]]]) -> tuple[tuple[str | None, FrozenMap], ...]:
    """What jobs hold, summed per project path (in path order): what a Snapshot carries, so that its
    size grows with the projects, not with the running jobs."""
    sums: dict[str | None, dict[str, float]] = {}
    for path, amounts in holding:
        total = sums.setdefault(path, {})
        for name, amount in amounts.items():
            total[name] = total.get(name, 0) + amount
    return tuple((path, FrozenMap(total)) for path, total in sorted(sums.items(), key=lambda item: item[0] or ""))


def _reason(project: Project, resource: str, used: float, need: float) -> str:
    limit = project.limits[resource]
    what = "running jobs" if resource == JOBS else resource
    if need > limit:  # a limit lowered since the job was submitted: no amount of waiting helps
        return (f"project {project.path}: the job needs {format_amount(resource, need)} {what}, more than its limit "
                f"of {format_amount(resource, limit)}; raise limits.{resource} or kill the job")
    text = f"project {project.path}: {what} {format_amount(resource, used)} of {format_amount(resource, limit)} in use"
    return text if used >= limit else f"{text}, the job needs {format_amount(resource, need)}"


class Usage:
    """What running jobs hold, per project with limits (rolled up the tree), during one session.
    Mutable, and the session's own: `add` takes in each dispatch the session makes."""

    def __init__(self, projects: Projects, holding: Iterable[tuple[str | None, Mapping[str, float]]]) -> None:
        self.projects = projects
        self.used: dict[str, dict[str, float]] = {}
        self._terms: dict = {}  # -R -> its amounts by resource (a session sees few distinct requests)
        for path, amounts in holding:
            self.add(path, amounts)

    def add(self, path: str | None, amounts: Mapping[str, float]) -> None:
        for project in self.projects.limited_chain(path):
            used = self.used.setdefault(project.path, {})
            for resource in project.limits:
                used[resource] = used.get(resource, 0) + amounts.get(resource, 0)

    def of(self, path: str, resource: str) -> float:
        return self.used.get(path, {}).get(resource, 0)

    def room(self, path: str | None, request: JobRequest) -> tuple[str | None, JobRequest]:
        """(why the job's projects are too full for it now, or None; its request with the task range
        cut to what their limits leave). Per-task amounts cut the range; per-host amounts count
        once here (one host), and the placement is checked exactly by `over`."""
        chain = self.projects.limited_chain(path)
        if not chain:
            return None, request
        terms = self._terms.get(request.resreq)
        if terms is None:
            terms = self._terms[request.resreq] = _terms(request)
        most = request.max_tasks
        for project in chain:
            for resource, limit in project.limits.items():
                used = self.of(project.path, resource)
                if resource == JOBS:
                    if used + 1 > limit:
                        return _reason(project, resource, used, 1), request
                    continue
                per_task, per_host, per_job = terms.get(resource, (0, 0, 0))
                if not (per_task or per_host or per_job):
                    continue
                fits = most_fitting(limit - used, per_task, per_host + per_job, most)
                if fits < request.min_tasks:
                    return _reason(project, resource, used, per_task * request.min_tasks + per_host + per_job), request
                most = fits
        if most < request.max_tasks:
            return None, replace(request, max_tasks=most)
        return None, request

    def over(self, path: str | None, amounts: Mapping[str, float]) -> str | None:
        """Why holding `amounts` (a placement's `held`) would pass a limit of the job's chain, or None."""
        for project in self.projects.limited_chain(path):
            for resource, limit in project.limits.items():
                used, need = self.of(project.path, resource), amounts.get(resource, 0)
                if need and used + need > limit:
                    return _reason(project, resource, used, need)
        return None


def describe_use(projects: Projects, holding: Iterable[tuple[str | None, Mapping[str, float]]],
                 more: Iterable[str] = ()) -> dict[str, dict]:
    """Per defined project, and per path in `more` (names jobs were given in open mode, or projects
    since removed): what its subtree's running jobs hold now (rolled up), every resource named in
    any limit plus slots and jobs. For `xce projects`."""
    names = {SLOTS, JOBS} | {r for p in projects.projects for r in p.limits}
    paths = {p.path for p in projects.projects} | set(more)
    totals: dict[str, dict[str, float]] = {path: dict.fromkeys(sorted(names), 0) for path in paths}
    for path, amounts in holding:
        for a in ancestors(path) if path else ():
            if a in totals:
                for name in names:
                    totals[a][name] += amounts.get(name, 0)
    return totals

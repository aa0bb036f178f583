"""Projects, group defaults and fair share in `xce.yaml`, as pydantic models, and the pure values the
scheduler reads of them (sched/projects.py, sched/fairshare.py).

    projects:
      - {name: lab, members: [alice], groups: [lab], admins: [alice], limits: {slots: 64, gpus: 8}}
      - {name: lab/vision, members: [bob], limits: {gpus: 4, mem: 256G, jobs: 20}}
    groups: {vision: {default_project: lab/vision}}
    default_project: lab
    queues:
      - {name: normal, fairshare: {by: user, half_life: 7d, shares: {alice: 2, default: 1}}}

The checks that need the rest of the file (a limit on an undeclared resource, a default naming no
project, a project whose parent is not defined) are in `check`, which ClusterConfig runs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from xce_lite.errors import SpecError

from xce_lite.models import PROJECT_RE
from xce_lite.quantities import parse_duration
from xce_lite.sched.fairshare import PROJECT, USER, FairShare
from xce_lite.sched.projects import DEFAULT_PROJECT, Project, Projects, ancestors
from xce_lite.sched.reasons import FrozenMap

_PATH = "^" + PROJECT_RE.pattern + "$"
_WORD = r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"  # a user or group name


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectConfig(_Model):
    # The project's path: `lab`, `lab/vision`; every ancestor must be defined too.
    name: str = Field(pattern=_PATH)
    description: str = ""
    members: list[Annotated[str, Field(pattern=_WORD)]] = Field(default_factory=list)  # users who may submit
    groups: list[Annotated[str, Field(pattern=_WORD)]] = Field(default_factory=list)  # Unix groups who may
    # who act on the subtree's jobs and see its usage: users, and "@group" for a group's members
    admins: list[Annotated[str, Field(pattern="^@?" + _WORD[1:])]] = Field(default_factory=list)
    # The most its subtree's running jobs hold at once: slots, mem, gpus, custom resources, jobs.
    limits: dict[str, int | float | str] = Field(default_factory=dict)


class GroupConfig(_Model):
    default_project: str | None = Field(default=None, pattern=_PATH)  # for members' jobs without -P


def _half_life(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        try:
            seconds = parse_duration(str(value))
        except SpecError as err:
            raise ValueError(str(err)) from None
    if seconds <= 0:
        raise ValueError("half_life must be more than zero, e.g. 7d or 12h")
    return seconds


class FairshareConfig(_Model):
    by: str = Field(default=USER, pattern=f"^({USER}|{PROJECT})$")
    half_life: Annotated[float, BeforeValidator(_half_life)] = 7 * 86400.0  # 7d, 12h, or seconds
    # user (or project path) -> share; `default` is everyone not named (1 when not given)
    shares: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    gpu_weight: float = Field(default=1.0, ge=0)  # a GPU-second counts this many slot-seconds

    def policy(self) -> FairShare:
        shares = {k: v for k, v in self.shares.items() if k != "default"}
        return FairShare(self.by, self.half_life, FrozenMap(shares), self.shares.get("default", 1.0),
                         self.gpu_weight)


def check_tree(projects: list[ProjectConfig]) -> None:
    """ValueError unless names are unique and every project's parent is defined."""
    paths = [p.name for p in projects]
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    if repeated:
        raise ValueError(f"project names must be unique; repeated: {', '.join(repeated)}")
    defined = set(paths)
    for p in projects:
        missing = [a for a in ancestors(p.name)[1:] if a not in defined]
        if missing:
            raise ValueError(f"project {p.name}: its parent {missing[0]} is not defined; define it too (limits "
                             f"roll up the tree)")


def check(projects: list[ProjectConfig], groups: dict[str, GroupConfig], default: str | None, limit_amount) -> None:
    """ValueError naming what is wrong. `limit_amount(resource, amount, where)`: the amount in base
    units, ValueError for a resource the cluster does not have."""
    paths = [p.name for p in projects]
    defined = set(paths)
    for p in projects:
        for resource, amount in p.limits.items():
            limit_amount(resource, amount, f"project {p.name}: limits.{resource}")
    if defined:
        named = [("default_project", default)] + [(f"groups.{g}.default_project", c.default_project)
                                                  for g, c in groups.items()]
        for where, path in named:
            if path is not None and path not in defined:
                raise ValueError(f"{where}: there is no project {path!r}; the projects are: {', '.join(paths)}")


def to_projects(projects: list[ProjectConfig], groups: dict[str, GroupConfig], default: str | None,
                limit_amount) -> Projects:
    """The scheduler's view of the projects (limits in base units)."""
    values = tuple(
        Project(p.name, frozenset(p.members), frozenset(p.groups), frozenset(p.admins),
                FrozenMap({r: limit_amount(r, a, f"project {p.name}") for r, a in p.limits.items()}), p.description)
        for p in projects)
    defaults = FrozenMap({g: c.default_project for g, c in groups.items() if c.default_project is not None})
    return Projects(values, default or DEFAULT_PROJECT, defaults)


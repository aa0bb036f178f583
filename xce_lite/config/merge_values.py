"""The merge's values (merge.py): its inputs, an application profile (`Profile`, with its
resources, hooks and params) and a queue's ceilings (`QueueLimits`), and its output, a job's
effective values (`Effective`), each field with where it came from. Frozen and plain: the
controller builds them from its configuration, the scheduler snapshot and the launch read them.

Environment names: a param NAME is exported as XCE_APP_PARAM_<NAME in upper case>; an annotation
as XCE_APP_ANN_<name in upper case, every character other than A-Z and 0-9 turned into _>
(`team.owner` -> XCE_APP_ANN_TEAM_OWNER). The profile loader refuses two names that convert alike.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import NOTHING, FrozenMap

JOB, PRESET, PROFILE, QUEUE, DEFAULT = "job", "preset", "profile", "queue", "default"
BATCH, SERVICE = "batch", "service"
HOOK_POINTS = ("pre_job_exec", "post_job_exec", "pre_host_exec", "post_host_exec")
PARAM_ENV_PREFIX, ANNOTATION_ENV_PREFIX = "XCE_APP_PARAM_", "XCE_APP_ANN_"
EFFECTIVE_SCHEMA = 1


def param_env_name(name: str) -> str:
    return PARAM_ENV_PREFIX + name.upper()


def annotation_env_name(name: str) -> str:
    return ANNOTATION_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper())


@lru_cache(maxsize=4096)
def parse_resreq(texts: tuple[str, ...]) -> rr.ResReq:
    """The `-R` strings of a job, parsed and combined; cached, so identical requests share one value
    (10,000 jobs of one shape hold one ResReq, and cross to the scheduler process once)."""
    parsed = [rr.parse(text) for text in texts]
    if not parsed:
        return rr.ResReq()
    return parsed[0] if len(parsed) == 1 else rr.combine(parsed)


# ---- the inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RusageEntry:
    """A profile's rusage entry: the resource, its unit of account, and the default reservation
    (None: every job must reserve it itself, in that unit)."""

    name: str
    per: str = "task"
    default: rr.RusageTerm | None = None


@dataclass(frozen=True)
class ProfileResources:
    """A profile's resource requirements, section by section (hashable: a merge cache key)."""

    select: rr.Expr | None = None
    rusage: tuple[RusageEntry, ...] = ()
    span: rr.Span | None = None
    same: tuple[str, ...] = ()
    order: tuple[rr.OrderKey, ...] = ()


DEFAULT_HOOK_TIMEOUT = 300.0  # seconds a hook without a timeout of its own may run


@dataclass(frozen=True)
class Hook:
    argv: tuple[str, ...]
    timeout: float | None = None  # seconds; None: DEFAULT_HOOK_TIMEOUT
    # A profile's hook marked `as: root`: runs as root in a job run as its user (an admin's cleanup);
    # a job's own hooks never are.
    as_root: bool = False


@dataclass(frozen=True)
class Param:
    name: str
    default: str | None = None  # None: not exported unless the job gives a value
    description: str = ""


@dataclass(frozen=True)
class Profile:
    """An application profile as plain values (profiles.py builds it from applications.yaml)."""

    name: str
    description: str = ""
    kind: str = BATCH
    mode: str = "direct"
    launch: str = "auto"
    env: FrozenMap = NOTHING
    hooks: FrozenMap = NOTHING  # hook point -> Hook
    job_hooks: bool = True  # a job may give its own -E / -Ep
    post_failure: str = "record"  # "exit": a post hook that fails ends a DONE job EXIT
    resources: ProfileResources = ProfileResources()
    run_limit: float | None = None
    mem_limit: int | None = None
    min_tasks: int | None = None
    max_tasks: int | None = None
    default_tasks: int | None = None
    job_starter: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    annotations: FrozenMap = NOTHING
    retry: int | None = None  # retries of a failed attempt: the default and the maximum
    retry_on: tuple[int, ...] | None = None  # exit codes to retry on (None: any failure)

    @cached_property
    def hash(self) -> str:
        """Canonical content hash: equal meaning, equal hash (2G and 2048 of mem alike); the
        description, of the profile and of its params, is left out (documentation changes nothing)."""
        text = json.dumps(_canonical(self), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(p: Profile) -> dict[str, Any]:
    r = p.resources
    retries = {"retry": [p.retry, list(p.retry_on) if p.retry_on else None]} if p.retry is not None else {}
    return {**retries,
        "kind": p.kind, "mode": p.mode, "launch": p.launch, "env": dict(p.env),
        "hooks": {point: [list(h.argv), h.timeout, *(["root"] if h.as_root else [])] for point, h in p.hooks.items()},
        "job_hooks": p.job_hooks, "post_failure": p.post_failure,
        "select": rr.format_expr(r.select) if r.select is not None else None,
        "rusage": [[e.name, e.per, None if e.default is None else
                    rr.amount_in_base_units(e.default, rr.default_unit(e.name))] for e in r.rusage],
        "span": rr.format_span(r.span) if r.span is not None else None,
        "same": list(r.same), "order": [rr.format_key(k) for k in r.order],
        "run_limit": p.run_limit, "mem_limit": p.mem_limit,
        "tasks": [p.min_tasks, p.max_tasks, p.default_tasks], "job_starter": list(p.job_starter),
        "params": [[q.name, q.default] for q in p.params], "annotations": dict(p.annotations),
    }


@dataclass(frozen=True)
class QueueLimits:
    """What the merge reads of a queue: its ceilings (LSF's RUNLIMIT, MEMLIMIT, TASKLIMIT)."""

    name: str
    run_limit: float | None = None
    mem_limit: int | None = None
    max_tasks: int | None = None


# ---- the output ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Effective:
    """What a job runs with. `origins` maps each field to where it came from; rusage terms are
    `rusage:<name>`, params `param:<NAME>`."""

    app: str  # "" for no profile
    profile_hash: str
    min_tasks: int
    max_tasks: int
    resreq: rr.ResReq
    run_limit: float | None = None
    mem_limit: int | None = None
    profile_env: FrozenMap = NOTHING
    params: FrozenMap = NOTHING
    annotations: FrozenMap = NOTHING
    hooks: FrozenMap = NOTHING
    job_starter: tuple[str, ...] = ()
    mode: str = "direct"
    launch: str = "auto"
    origins: FrozenMap = NOTHING
    retry: int = 0  # a failed attempt is requeued up to this many times
    retry_on: tuple[int, ...] | None = None  # only for these exit codes (None: any failure)
    job_hooks: FrozenMap = NOTHING  # the job's own: pre_job_exec / post_job_exec -> Hook (/bin/sh -c CMD)
    post_failure: str = "record"

    def exported_env(self) -> dict[str, str]:
        """XCE_APP_PARAM_* and XCE_APP_ANN_*: what the job learns of its params and annotations."""
        env = {param_env_name(name): value for name, value in self.params.items()}
        env.update({annotation_env_name(name): value for name, value in self.annotations.items()})
        return env

    def job_environment(self, job_env: dict[str, str]) -> dict[str, str]:
        """The job's environment: the profile's layer, the job's own on top, then its params and
        annotations. XCE_APP_* names in the job's env are dropped first: a job submitted from inside
        another job copies that job's environment, and must not inherit its params."""
        env = dict(self.profile_env)
        env.update((k, v) for k, v in job_env.items() if not k.startswith("XCE_APP_"))
        env.update(self.exported_env())
        return env

    def to_json(self) -> dict[str, Any]:
        return {"schema": EFFECTIVE_SCHEMA, "app": self.app, "profile_hash": self.profile_hash,
                "min_tasks": self.min_tasks, "max_tasks": self.max_tasks, "resreq": rr.format(self.resreq),
                "run_limit": self.run_limit, "mem_limit": self.mem_limit, "profile_env": dict(self.profile_env),
                "params": dict(self.params), "annotations": dict(self.annotations),
                "hooks": _hooks_to_json(self.hooks),
                "job_starter": list(self.job_starter), "mode": self.mode, "launch": self.launch,
                "origins": dict(self.origins), "retry": self.retry,
                "retry_on": list(self.retry_on) if self.retry_on is not None else None,
                "job_hooks": _hooks_to_json(self.job_hooks),
                "post_failure": self.post_failure}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Effective:
        return cls(
            app=data["app"], profile_hash=data["profile_hash"], min_tasks=data["min_tasks"],
            max_tasks=data["max_tasks"], resreq=parse_resreq((data["resreq"],)), run_limit=data["run_limit"],
            mem_limit=data["mem_limit"], profile_env=FrozenMap(data["profile_env"]),
            params=FrozenMap(data["params"]), annotations=FrozenMap(data["annotations"]),
            hooks=_hooks_from_json(data["hooks"]),
            job_starter=tuple(data["job_starter"]), mode=data["mode"], launch=data["launch"],
            origins=FrozenMap(data["origins"]), retry=data.get("retry", 0),
            retry_on=tuple(data["retry_on"]) if data.get("retry_on") is not None else None,
            job_hooks=_hooks_from_json(data.get("job_hooks", {})),
            post_failure=data.get("post_failure", "record"))


def _hooks_to_json(hooks: FrozenMap) -> dict[str, Any]:
    return {point: {"argv": list(h.argv), "timeout": h.timeout, **({"as": "root"} if h.as_root else {})}
            for point, h in hooks.items()}


def _hooks_from_json(data: dict[str, Any]) -> FrozenMap:
    return FrozenMap({point: Hook(tuple(h["argv"]), h["timeout"], h.get("as") == "root") for point, h in data.items()})

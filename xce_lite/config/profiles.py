"""Application profiles: `applications.yaml` beside `xce.yaml`, as pydantic models that mirror it.

The file is optional. A built-in profile `default` (asking for nothing) always exists; a profile
of that name in the file replaces it. `default_application` in xce.yaml names the profile of jobs
submitted without `-app` ("" for none); a name that is not defined is a ConfigError here, so at
`xceadmin check`, at `xce reconfig` and at controller start alike, never a silent fallback.

    applications:
      matlab:
        description: MATLAB batch runs (documentation; not part of the profile's hash)
        env: {MLM_LICENSE_FILE: 27000@lic1}       # the profile's layer; the job's env goes on top
        resources:
          select: "avx512"                         # ANDed with the job's select
          rusage:
            mem: 2G                                # a default: the job's own mem term wins whole
            lic_matlab: {default: 1, per: job}     # per must match in a job's own term
            scratch: {per: host}                   # no default: every job must reserve it
          span: "hosts=1"
          same: [model]
          order: "-mem"
        limits: {run_limit: 4h, mem_limit: 8G}     # maxima: a job may ask for less
        tasks: {min: 1, max: 8, default: 2}        # -n must lie within; without -n: default
        job_starter: [nice, -n, "5"]               # the job runs as job_starter + its command
        hooks: {pre_job_exec: [/opt/matlab/check]} # see README "Hooks"; also job_hooks, post_failure
        retry: {count: 2, exit_codes: [75]}        # requeue a failed attempt (default and maximum)
        params: {SOLVER: {default: direct}}        # XCE_APP_PARAM_SOLVER; --app-param SOLVER=...
        annotations: {team.owner: imaging}         # XCE_APP_ANN_TEAM_OWNER, for tools

Invariants once `load_profiles` returns: every profile's resources parse, name resources the
cluster knows, with units of the right kind; names of params and annotations are unique once
converted to environment names; no annotation name looks like a secret; `default_application`
names a profile. The merge rules are in merge.py; this module only builds its `Profile` values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator, model_validator

from xce_lite.config import yamlfile
from xce_lite.config.cluster import BUILTIN_RESOURCES, ClusterConfig, load_config
from xce_lite.config.fields import NAME, Seconds, Size, StrictModel
from xce_lite.config.merge_values import (
    HOOK_POINTS,
    Hook,
    Param,
    Profile,
    ProfileResources,
    RusageEntry,
    annotation_env_name,
    param_env_name,
)
from xce_lite.config.sched_view import check_units, size_resources
from xce_lite.config.yamlmodel import load_yaml, problem
from xce_lite.errors import ConfigError, SpecError
from xce_lite.models import MAX_PARAM_VALUE, PARAM_NAME_RE
from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import FrozenMap

DEFAULT_PROFILE = "default"
MAX_ANNOTATIONS = 64
MAX_ANNOTATION_VALUE = 1024  # characters
MAX_ANNOTATIONS_TOTAL = 16 * 1024  # characters of names and values together
# Names that suggest a secret: a profile is configuration every user can read (`xce apps -l`) and
# every job's environment carries; secrets belong in files only their owners can read.
_SECRET = re.compile(r"pass(wd|word)?($|[^a-z])|secret|token|api[_.-]?key|credential|private[_.-]?key|auth",
                     re.IGNORECASE)
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ANNOTATION_NAME = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$"
_ResourceName = Annotated[str, Field(pattern=rr.NAME_RE.pattern)]


def looks_secret(name: str) -> bool:
    return _SECRET.search(name) is not None


def _argv(value: list[str], what: str) -> tuple[str, ...]:
    if not value or not value[0] or any("\0" in a for a in value):
        raise ValueError(f"{what} is a command: a list of words, the first one a program, no NUL bytes")
    return tuple(value)


class HookConfig(StrictModel):
    argv: list[str]
    timeout: Seconds | None = None  # how long the hook may run (default merge.DEFAULT_HOOK_TIMEOUT), then TERM, KILL
    # Whom it runs as in a job run as its submitter (shared mode): `user` (the default), or `root`
    # for an admin's setup or cleanup. Profiles are the admins' config; a job's own -E/-Ep cannot say it.
    as_: str = Field(default="user", alias="as", pattern=r"^(user|root)$")

    @field_validator("argv")
    @classmethod
    def _a_command(cls, value: list[str]) -> list[str]:
        _argv(value, "a hook")
        return value


def _hook(value: object) -> object:
    return {"argv": value} if isinstance(value, list) else value  # `pre_job_exec: [cmd, arg]` for short


HookValue = Annotated[HookConfig, BeforeValidator(_hook)]


class HooksConfig(StrictModel):
    """Outer-layer hooks: job ones run once on the first host, host ones once on each host. A job's
    own -E/-Ep (the inner layer) are allowed unless `job_hooks: false`; a post hook that fails is
    recorded, and ends a DONE job EXIT only with `post_failure: exit`."""

    pre_job_exec: HookValue | None = None
    post_job_exec: HookValue | None = None
    pre_host_exec: HookValue | None = None
    post_host_exec: HookValue | None = None
    job_hooks: bool = True
    post_failure: str = Field(default="record", pattern=r"^(record|exit)$")


def _section(name: str, text: str) -> rr.ResReq:
    """`text` as the inside of one -R section; ValueError (a pydantic error at the field) if bad."""
    try:
        return rr.parse(f"{name}[{text}]")
    except SpecError as err:
        raise ValueError(str(err)) from None


class RusageEntryConfig(StrictModel):
    default: int | float | str | None = None  # the reservation when the job names none; None: it must
    per: str = Field(default="task", pattern=r"^(task|host|job)$")

    @field_validator("default")
    @classmethod
    def _an_amount(cls, value: int | float | str | None) -> int | float | str | None:
        if value is not None:
            _section("rusage", f"x={value}")
        return value

    def term(self, name: str) -> rr.RusageTerm | None:
        per = "" if self.per == "task" else "/" + self.per
        return None if self.default is None else _section("rusage", f"{name}={self.default}{per}").rusage[0]


def _rusage_entry(value: object) -> object:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):  # `mem: 2G` or `lic: 1/job`
        amount, _, per = str(value).partition("/")
        return {"default": amount, "per": per or "task"}
    return {} if value is None else value


class ResourcesConfig(StrictModel):
    """The profile's resource requirements, by `-R` section; texts as inside the brackets."""

    select: str | None = None
    rusage: dict[_ResourceName, Annotated[RusageEntryConfig, BeforeValidator(_rusage_entry)]] = Field(
        default_factory=dict)
    span: str | None = None
    same: list[_ResourceName] = Field(default_factory=list)
    order: str | None = None

    @field_validator("select", "span", "order")
    @classmethod
    def _parses(cls, text: str | None, info) -> str | None:
        if text is not None:
            _section(info.field_name, text)
        return text

    def to_resources(self) -> ProfileResources:
        def section(name: str, text: str | None) -> rr.ResReq:
            return rr.ResReq() if text is None else _section(name, text)

        return ProfileResources(section("select", self.select).select,
                                tuple(RusageEntry(name, e.per, e.term(name)) for name, e in self.rusage.items()),
                                section("span", self.span).span, tuple(sorted(set(self.same))),
                                section("order", self.order).order)


class LimitsConfig(StrictModel):
    run_limit: Seconds | None = Field(default=None, gt=0)  # a maximum: a job's -W may be lower
    mem_limit: Size | None = None  # a maximum: a job's -M may be lower


class TasksConfig(StrictModel):
    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1, le=100_000)
    default: int | None = Field(default=None, ge=1)  # without -n; else min, else 1

    @model_validator(mode="after")
    def _ordered(self) -> TasksConfig:
        low, high = self.min or 1, self.max
        if high is not None and low > high:
            raise ValueError(f"min {low} is above max {high}")
        if self.default is not None and (self.default < low or (high is not None and self.default > high)):
            raise ValueError(f"default {self.default} is outside min..max ({low}..{high or 'any'})")
        return self


class ParamConfig(StrictModel):
    default: str | None = Field(default=None, max_length=MAX_PARAM_VALUE)
    description: str = ""


def _param(value: object) -> object:
    if value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool)):
        return {"default": None if value is None else str(value)}  # `SOLVER: direct` for short
    return value


class RetryConfig(StrictModel):
    count: int = Field(ge=0, le=100)  # retries of a failed attempt: the default and the maximum
    # only these exit codes (default: any failure); not `on:`, which YAML reads as true
    exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = None


class ProfileConfig(StrictModel):
    description: str = ""
    # batch (every job today) or service (rejected for batch jobs; services come later)
    kind: str = Field(default="batch", pattern=r"^(batch|service)$")
    mode: str = Field(default="direct", pattern=r"^direct$")  # runs on its hosts directly (containers later)
    launch: str = Field(default="auto", pattern=r"^(auto|systemd|user|plain)$")  # units, where a host offers both
    env: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = Field(default_factory=dict)
    hooks: HooksConfig = HooksConfig()
    resources: ResourcesConfig = ResourcesConfig()
    limits: LimitsConfig = LimitsConfig()
    tasks: TasksConfig = TasksConfig()
    job_starter: list[str] = Field(default_factory=list)
    params: dict[str, Annotated[ParamConfig, BeforeValidator(_param)]] = Field(default_factory=dict)
    annotations: dict[Annotated[str, Field(pattern=_ANNOTATION_NAME)], Annotated[
        str, Field(max_length=MAX_ANNOTATION_VALUE)]] = Field(default_factory=dict)
    retry: RetryConfig | None = None  # {count: 2, exit_codes: [75]}: requeue a failed attempt (--retry)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in env if k.startswith("XCE_"))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: XCE_ names are set by xce itself; choose other names")
        if any("\0" in v for v in env.values()):
            raise ValueError("environment values cannot contain a NUL byte")
        return env

    @field_validator("job_starter")
    @classmethod
    def _starter(cls, value: list[str]) -> list[str]:
        if value:
            _argv(value, "job_starter")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, params: dict[str, ParamConfig]) -> dict[str, ParamConfig]:
        bad = [name for name in params if not PARAM_NAME_RE.fullmatch(name)]
        if bad:
            raise ValueError(f"param {bad[0]!r}: a param name is a letter, then letters, digits or _")
        _unique_env_names(params, param_env_name, "params")
        return params

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        secret = [name for name in annotations if looks_secret(name)]
        if secret:
            raise ValueError(f"annotation {secret[0]!r} looks like a secret; annotations are readable by every "
                             f"user and job: keep secrets in files only their owners can read")
        if len(annotations) > MAX_ANNOTATIONS:
            raise ValueError(f"at most {MAX_ANNOTATIONS} annotations")
        if sum(len(k) + len(v) for k, v in annotations.items()) > MAX_ANNOTATIONS_TOTAL:
            raise ValueError(f"annotations hold at most {MAX_ANNOTATIONS_TOTAL} characters in all")
        _unique_env_names(annotations, annotation_env_name, "annotations")
        return annotations

    def to_profile(self, name: str) -> Profile:
        hooks = {point: Hook(tuple(h.argv), h.timeout, h.as_ == "root") for point in HOOK_POINTS
                 if (h := getattr(self.hooks, point)) is not None}
        return Profile(
            name=name, description=self.description, kind=self.kind, mode=self.mode, launch=self.launch,
            env=FrozenMap(self.env), hooks=FrozenMap(hooks), job_hooks=self.hooks.job_hooks,
            post_failure=self.hooks.post_failure, resources=self.resources.to_resources(),
            run_limit=self.limits.run_limit, mem_limit=self.limits.mem_limit, min_tasks=self.tasks.min,
            max_tasks=self.tasks.max, default_tasks=self.tasks.default, job_starter=tuple(self.job_starter),
            params=tuple(Param(n, p.default, p.description) for n, p in self.params.items()),
            annotations=FrozenMap(self.annotations), retry=self.retry.count if self.retry else None,
            retry_on=tuple(sorted(set(self.retry.exit_codes))) if self.retry and self.retry.exit_codes else None)


def _unique_env_names(names, convert, what: str) -> None:
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(convert(name), name)
        if other != name:
            raise ValueError(f"{what} {other!r} and {name!r} both become {convert(name)} in the job's "
                             f"environment; rename one")


class ApplicationsFile(StrictModel):
    applications: dict[Annotated[str, Field(pattern=NAME)], ProfileConfig] = Field(default_factory=dict)


def applications_path(config_path: Path) -> Path:
    return config_path.with_name("applications.yaml")


def load_cluster(config_path: Path) -> tuple[ClusterConfig, dict[str, Profile]]:
    """xce.yaml and the applications.yaml beside it, checked together (see the module docstring)."""
    config = load_config(config_path)
    return config, load_profiles(applications_path(config_path), config, config_path)


def load_profiles(path: Path, config: ClusterConfig, config_path: Path) -> dict[str, Profile]:
    """The profiles by name: the built-in `default`, then the file's (if it exists)."""
    profiles = {DEFAULT_PROFILE: Profile(DEFAULT_PROFILE, description="built in: asks for nothing")}
    root = None
    if path.exists():
        parsed, root = load_yaml(path, ApplicationsFile, "", "a mapping with `applications`")
        problems: list[str] = []
        for name, profile_config in parsed.applications.items():
            profile = profiles[name] = profile_config.to_profile(name)
            problems.extend(problem(path, root, ("applications", name, "resources", *loc), message)
                            for loc, message in _resource_problems(profile, config))
        if problems:
            raise ConfigError("\n".join(problems) + "\nfix the file, then run the command again")
    if config.default_application and config.default_application not in profiles:
        config_root = yamlfile.read(config_path)[1]
        raise ConfigError(problem(config_path, config_root, ("default_application",),
                                  f"no application profile {config.default_application!r} is defined (known: "
                                  f"{', '.join(sorted(profiles))}); define it in {path.name} or name another"))
    return profiles


def _resource_problems(profile: Profile, config: ClusterConfig) -> list[tuple[tuple, str]]:
    """Rusage names the cluster does not know, and units of the wrong kind (a size on a count)."""
    known = set(BUILTIN_RESOURCES) | set(config.resources) | set(config.shared) | set(size_resources(config))
    found = []
    for entry in profile.resources.rusage:
        if entry.name not in known:
            found.append((("rusage", entry.name), f"unknown resource {entry.name}; declare it under `resources:` "
                                                  f"or `shared:` in xce.yaml"))
        elif entry.default is not None:
            try:
                check_units(rr.ResReq(rusage=(entry.default,)), size_resources(config))
            except SpecError as err:
                found.append((("rusage", entry.name), str(err).removeprefix("-R: ")))
    return found

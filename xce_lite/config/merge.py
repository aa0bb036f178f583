"""The merge: a job's own values + its application profile + its queue's policy -> effective values.

One pure function (`merge`), used by submit (refuse what could never run), the scheduler snapshot
(what to place), the launch (what to run with), `xce why` and `xce jobs -l` (what and from where),
and later the simulator. Values in, values out: no I/O, no clock, no config files; the controller
turns its configuration into the plain values here (`Profile`, `QueueLimits`). Effective values are
computed live, never frozen at submit: the job keeps its profile NAME and its own values, so a
profile changed by `xce reconfig` reaches jobs still waiting. At dispatch the controller stores the
effective values with the job (`to_json`), and a running job keeps those.

The rules (a profile holds what every job of the application must have; see README "Profiles"):

- Every profile value binds; a job may add to it, never change or remove it.
  select: the profile's and the job's are ANDed. span: the profile's; a job may repeat it, not give
  another. same: the union. order: the profile's keys first, then the job's others; a job may not
  sort a profile key the other way. Run and memory limits: the profile's is a maximum; a job may ask
  for less (`-W`, `-M`), never more. Tasks: a job's `-n` must lie within the profile's range; without
  `-n` it gets the profile's default count (else its minimum). env, hooks, job starter, launch,
  annotations: the profile's as they are (the job's own env is a separate layer, on top; so are its
  own hooks, `-E`/`-Ep`, the inner layer of pre/post_job_exec, refused if the profile says
  `job_hooks: false`).
- rusage is the one per-resource default: the union of the profile's terms and the job's; for a
  resource in both, the job's term wins whole, higher or lower, but must keep the profile's unit of
  account (`per`: task, host or job), so a per-host reservation cannot silently become per-task. A
  profile entry without a default must be given by every job. `name=0` drops the term: the
  scheduler sees none.
- params: the profile's declared settings, each its default unless the job gives a value
  (`--app-param`); an undeclared name is refused. xce carries them and never interprets them.
- The queue's ceilings check the effective values: a run or memory limit above the queue's, or a
  minimum task count above its `max_tasks`, could never run there and is refused. Without any limit
  the job gets the queue's ceiling; a task range is cut to `max_tasks`.
- A service profile is refused: every job is a batch job (services come later).
- Retries: the profile's count is the default and a maximum (`--retry` may ask for fewer); the
  exit codes to retry on are the job's (`--retry-on`) if it gives them, else the profile's, else
  any failure. Codes without a count are refused: there would be nothing to retry.

Each effective field says where it came from: `job`, `preset` (a job value the client's preset
set: the client lists those fields in exdata.meta.preset.fields), `profile`, `queue` or `default`.
SpecError says which rule a request breaks; the controller refuses it at submit, and pends a
stored job with the message when a reconfig made it unrunnable.

Its values (Profile, QueueLimits, Effective) are in merge_values.py.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from xce_lite.config.merge_values import (
    BATCH,
    DEFAULT,
    JOB,
    PRESET,
    PROFILE,
    QUEUE,
    Effective,
    Hook,
    Profile,
    ProfileResources,
    QueueLimits,
    parse_resreq,
)
from xce_lite.errors import SpecError
from xce_lite.models import JobSpec
from xce_lite.quantities import format_duration, format_size
from xce_lite.sched import resreq as rr
from xce_lite.sched.reasons import NOTHING, FrozenMap

# Also importable from here, as the controller does (issue 15's controller work imports merge_values)
from xce_lite.config.merge_values import DEFAULT_HOOK_TIMEOUT as DEFAULT_HOOK_TIMEOUT


# ---- the merge ----------------------------------------------------------------------------------


def merge(spec: JobSpec, profile: Profile | None, queue: QueueLimits) -> Effective:
    """The job's effective values by the rules in the module docstring; SpecError names the rule a
    request breaks and what to do. `profile` is the one `spec.app` names (None: no profile)."""
    name = profile.name if profile is not None else ""
    if profile is not None and profile.kind != BATCH:
        raise SpecError(f"application {name} is a {profile.kind} profile; batch jobs cannot use it "
                        f"(choose another with -app, see `xce apps`)")
    job_origin = _job_origin(spec)
    origins: dict[str, str] = {"app": job_origin("app") if spec.app is not None else DEFAULT}
    if spec.exdata.get("app_origin") == DEFAULT:
        origins["app"] = DEFAULT
    low, high, origins["tasks"] = _tasks(spec, profile, queue, job_origin("slots"))
    try:
        resreq, resreq_origins = _merged_resreq(parse_resreq(spec.resreq),
                                                profile.resources if profile else ProfileResources(), name)
    except SpecError:
        raise
    except ValueError as err:  # a value the parser let through that the types refuse
        raise SpecError(f"-R: {err}") from None
    origins.update((key, job_origin("resreq") if origin == JOB else origin) for key, origin in resreq_origins)
    run_limit, origins["run_limit"] = _limit(
        "run limit", "-W", spec.run_limit, job_origin("run_limit"), profile, profile and profile.run_limit,
        queue, queue.run_limit, format_duration)
    mem_limit, origins["mem_limit"] = _limit(
        "memory limit", "-M", spec.mem_limit, job_origin("mem_limit"), profile, profile and profile.mem_limit,
        queue, queue.mem_limit, format_size)
    params = _params(spec, profile, job_origin("app_params"), origins)
    retry, retry_on = _retries(spec, profile, job_origin, origins)
    job_hooks = _job_hooks(spec, profile)
    if job_hooks:
        origins["job_hooks"] = job_origin("hooks")
    if profile is None:
        return Effective("", "", low, high, resreq, run_limit, mem_limit, params=params,
                         origins=FrozenMap(origins), retry=retry, retry_on=retry_on, job_hooks=job_hooks)
    for key, present in (("env", profile.env), ("annotations", profile.annotations), ("hooks", profile.hooks),
                         ("job_starter", profile.job_starter)):
        if present:
            origins[key] = PROFILE
    origins["launch"] = origins["mode"] = PROFILE
    if profile.hooks or job_hooks:
        origins["post_failure"] = PROFILE
    return Effective(name, profile.hash, low, high, resreq, run_limit, mem_limit, profile.env, params,
                     profile.annotations, profile.hooks, profile.job_starter, profile.mode, profile.launch,
                     origins=FrozenMap(origins), retry=retry, retry_on=retry_on, job_hooks=job_hooks,
                     post_failure=profile.post_failure)


def _retries(spec: JobSpec, profile: Profile | None, job_origin, origins: dict[str, str]
             ) -> tuple[int, tuple[int, ...] | None]:
    """(retries, exit codes to retry on) by the rule in the module docstring."""
    ceiling = profile.retry if profile is not None else None
    if spec.retry is not None:
        if profile is not None and ceiling is not None and spec.retry > ceiling:
            raise SpecError(f"--retry {spec.retry} is above application {profile.name}'s {ceiling} retries; "
                            f"ask for fewer, or leave --retry out")
        retry, origins["retry"] = spec.retry, job_origin("retry")
    elif ceiling:
        retry, origins["retry"] = ceiling, PROFILE
    else:
        retry = 0
    if spec.retry_on is not None:
        if not retry:
            raise SpecError("--retry-on names exit codes to retry on, but the job has no retries: add --retry N")
        retry_on, origins["retry_on"] = spec.retry_on, job_origin("retry_on")
    elif retry and profile is not None and profile.retry_on:
        retry_on, origins["retry_on"] = profile.retry_on, PROFILE
    else:
        retry_on = None
    return retry, retry_on


def _job_hooks(spec: JobSpec, profile: Profile | None) -> FrozenMap:
    """The job's own -E / -Ep as the inner layer of pre/post_job_exec (run through /bin/sh -c, as
    LSF runs them); SpecError if its profile does not allow them."""
    given = spec.job_hooks
    if not given:
        return NOTHING
    if profile is not None and not profile.job_hooks:
        raise SpecError(f"application {profile.name} does not allow a job's own hooks (-E, -Ep): its profile "
                        "says job_hooks: false; submit without them, or ask for another profile")
    points = {"pre_exec": "pre_job_exec", "post_exec": "post_job_exec"}
    return FrozenMap({points[key]: Hook(("/bin/sh", "-c", command)) for key, command in sorted(given.items())})


def _job_origin(spec: JobSpec):
    """origin(field) -> "preset" if the client's preset set that spec field, else "job"."""
    preset = spec.meta.get("preset")
    fields = preset.get("fields") if isinstance(preset, dict) else None
    from_preset = frozenset(f for f in fields if isinstance(f, str)) if isinstance(fields, list) else frozenset()
    return lambda field: PRESET if field in from_preset else JOB


def _tasks(spec: JobSpec, profile: Profile | None, queue: QueueLimits, job_origin: str) -> tuple[int, int, str]:
    if spec.slots is not None:
        low, high, origin = spec.slots, spec.max_slots or spec.slots, job_origin
        if profile is not None:
            top = profile.max_tasks
            if low < (profile.min_tasks or 1) or (top is not None and high > top):
                span = f"{profile.min_tasks or 1} to {top}" if top is not None else f"at least {profile.min_tasks}"
                raise SpecError(f"-n {task_range(low, high)}: application {profile.name} runs jobs of {span} tasks; "
                                f"ask within that range, or leave -n out for its default")
    elif profile is not None and (profile.default_tasks or profile.min_tasks):
        low = high = profile.default_tasks or profile.min_tasks or 1
        origin = PROFILE
    else:
        low, high, origin = 1, 1, DEFAULT
    if queue.max_tasks is not None:
        if low > queue.max_tasks:
            raise SpecError(f"-n {low}: queue {queue.name} runs jobs of at most {queue.max_tasks} tasks; "
                            f"ask for fewer or use another queue")
        if high > queue.max_tasks:
            high, origin = queue.max_tasks, QUEUE
    return low, high, origin


def task_range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low},{high}"


def _limit(what: str, option: str, job_value, job_origin: str, profile: Profile | None, profile_value,
           queue: QueueLimits, ceiling, show) -> tuple[Any, str]:
    if job_value is not None:
        if profile is not None and profile_value is not None and job_value > profile_value:
            raise SpecError(f"{what} {option} {show(job_value)} is above application {profile.name}'s "
                            f"{what} of {show(profile_value)}; ask for less, or leave {option} out")
        value, origin, source = job_value, job_origin, f"{what} {option} {show(job_value)}"
    elif profile is not None and profile_value is not None:  # (a profile's value comes with the profile)
        value, origin, source = profile_value, PROFILE, f"application {profile.name}'s {what} of {show(profile_value)}"
    elif ceiling is not None:
        return ceiling, QUEUE
    else:
        return None, DEFAULT
    if ceiling is not None and value > ceiling:
        raise SpecError(f"{source} is above queue {queue.name}'s ceiling of {show(ceiling)}; "
                        f"ask for less or use another queue")
    return value, origin


def _params(spec: JobSpec, profile: Profile | None, job_origin: str, origins: dict[str, str]) -> FrozenMap:
    declared = {p.name: p for p in profile.params} if profile is not None else {}
    unknown = sorted(set(spec.app_params) - set(declared))
    if unknown:
        if profile is None:
            raise SpecError(f"--app-param {unknown[0]}: the job has no application profile, so no params; "
                            f"name one with -app (see `xce apps -l`)")
        known = ", ".join(declared) or "none"
        raise SpecError(f"--app-param {unknown[0]}: application {profile.name} declares no such param "
                        f"(it declares: {known}; see `xce apps -l`)")
    params = {}
    for param in declared.values():
        if param.name in spec.app_params:
            params[param.name], origins[f"param:{param.name}"] = spec.app_params[param.name], job_origin
        elif param.default is not None:
            params[param.name], origins[f"param:{param.name}"] = param.default, PROFILE
    return FrozenMap(params)


@lru_cache(maxsize=4096)
def _merged_resreq(job: rr.ResReq, profile: ProfileResources, app: str) -> tuple[rr.ResReq, tuple]:
    """(effective ResReq, ((field, origin), ...)); cached: jobs of one shape and profile share it."""
    origins: list[tuple[str, str]] = []
    if profile.select is not None and job.select is not None and profile.select != job.select:
        select: rr.Expr | None = rr.And((profile.select, job.select))
        origins.append(("select", f"{PROFILE}+{JOB}"))
    else:
        select = profile.select if profile.select is not None else job.select
        if select is not None:
            origins.append(("select", PROFILE if profile.select is not None else JOB))
    rusage = _merged_rusage(job, profile, app, origins)
    if profile.span is not None and job.span is not None and job.span != profile.span:
        raise SpecError(f"-R span[{rr.format_span(job.span)}]: application {app} fixes "
                        f"span[{rr.format_span(profile.span)}]; leave span out of -R")
    span = profile.span or job.span
    if span is not None:
        origins.append(("span", PROFILE if profile.span is not None else JOB))
    same = tuple(sorted(set(profile.same) | set(job.same)))
    if same:
        origins.append(("same", PROFILE if set(same) == set(profile.same) else
                        JOB if not profile.same else f"{PROFILE}+{JOB}"))
    fixed = {k.name: k for k in profile.order}
    for key in job.order:
        if key.name in fixed and fixed[key.name] != key:
            raise SpecError(f"-R order[{rr.format_key(key)}]: application {app} sorts by "
                            f"{rr.format_key(fixed[key.name])}; a job may add order keys, not turn one around")
    order = profile.order + tuple(k for k in job.order if k.name not in fixed)
    if order:
        origins.append(("order", PROFILE if len(order) == len(profile.order) else
                        JOB if not profile.order else f"{PROFILE}+{JOB}"))
    return rr.ResReq(select, order, rusage, span, same), tuple(origins)


def _merged_rusage(job: rr.ResReq, profile: ProfileResources, app: str,
                   origins: list[tuple[str, str]]) -> tuple[rr.RusageTerm, ...]:
    own = {t.name: t for t in job.rusage}
    terms: list[tuple[rr.RusageTerm, str]] = []
    for entry in profile.rusage:
        term = own.pop(entry.name, None)
        if term is None:
            if entry.default is None:
                raise SpecError(f"application {app} needs every job to reserve {entry.name} per {entry.per}; "
                                f"add -R 'rusage[{entry.name}=AMOUNT{_per_suffix(entry.per)}]'")
            terms.append((entry.default, PROFILE))
        elif term.per != entry.per:
            raise SpecError(f"-R rusage[{rr.format_term(term)}]: application {app} reserves {entry.name} per "
                            f"{entry.per}, so the unit must match: write "
                            f"rusage[{rr.format_term(replace(term, per=entry.per))}]")
        elif entry.default is None and term.amount == 0:
            raise SpecError(f"-R rusage[{entry.name}=0]: application {app} needs every job to reserve "
                            f"{entry.name}; ask for more than 0")
        else:
            terms.append((term, JOB))
    terms.extend((term, JOB) for term in own.values())
    kept = []
    for term, origin in terms:
        if term.amount != 0:  # `name=0` drops the term: the scheduler sees none
            kept.append(term)
            origins.append((f"rusage:{term.name}", origin))
    return tuple(kept)


def _per_suffix(per: str) -> str:
    return "" if per == "task" else "/" + per

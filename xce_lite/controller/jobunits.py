"""A job's units: one per host it holds, what each host is asked to run, and how a host's list of
units is matched with what the controller expects after a (re)connect.

Pure: values in, values out; no store, no clock, no hosts.

A job placed on hosts h0..hN (first host first, as the scheduler placed it) has one unit per host,
named `models.unit_name(cluster, job, attempt, index)`: deterministic, so a repeated launch finds
the unit it already started (the fencing token), and a new attempt never shares a name with a copy
of an old one. Unit 0 runs the job's command (role "job"); the others (role "host") run no command:
they hold the job's allocation on their host and run its tasks of `xce launch`. The job's outcome is
unit 0's result; when it ends, the controller stops the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from xce_lite.config.merge import DEFAULT_HOOK_TIMEOUT, Effective
from xce_lite.config.sched_view import Holding
from xce_lite.exec.host import HookRun, JobResult, JobUser, LaunchRequest, UnitInfo
from xce_lite.models import Job, JobSpec, unit_name

ROLE_JOB, ROLE_HOST = "job", "host"


def job_units(cluster: str, job_id: int, attempt: int, hosts: int) -> tuple[str, ...]:
    """The unit names of one attempt of a job placed on `hosts` hosts, first host first."""
    return tuple(unit_name(cluster, job_id, attempt, index) for index in range(hosts))


def parse_unit(cluster: str, unit: str) -> tuple[int, int, int] | None:
    """(job id, attempt, host index) of one of this cluster's unit names, or None."""
    match = re.fullmatch(rf"xce-{re.escape(cluster)}-(\d+)-(\d+)-(\d+)", unit)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def hostfile(hosts: Iterable[tuple[str, int]], addresses: Mapping[str, str]) -> str:
    """One line per host with its task count, in the form `mpirun --hostfile` reads (Open MPI's
    `NAME slots=N`). A host is named as the controller reaches it: its address when it has one."""
    return "".join(f"{addresses.get(host, host)} slots={tasks}\n" for host, tasks in hosts)


def unit_hooks(eff: Effective | None, first: bool) -> tuple[HookRun, ...]:
    """The hooks one unit of a job runs, in order: host pre, job pre (the profile's, then the job's
    own -E), [the job], job post (the job's -Ep, then the profile's), host post. The job ones run on
    the first host only; the profile's are the outer layer on both sides of the job's."""
    if eff is None or not (eff.hooks or eff.job_hooks):
        return ()
    layers = {"profile": eff.hooks, "job": eff.job_hooks}
    order = [("pre_host_exec", "profile")]
    if first:
        order += [("pre_job_exec", "profile"), ("pre_job_exec", "job"), ("post_job_exec", "job"),
                  ("post_job_exec", "profile")]
    order.append(("post_host_exec", "profile"))
    return tuple(HookRun(point, layer, hook.argv, DEFAULT_HOOK_TIMEOUT if hook.timeout is None else hook.timeout,
                         as_root=hook.as_root and layer == "profile")  # a job's own hook never runs as root
                 for point, layer in order if (hook := layers[layer].get(point)) is not None)


def run_as(spec: JobSpec) -> JobUser | None:
    """Whom the job runs as: the submitter a shared controller stamped at submit (shared.py); None
    in personal mode (the agent's own user)."""
    who = spec.exdata.get("run_as")
    if not who:
        return None
    return JobUser(who["name"], who["uid"], who.get("gid"),
                   None if who.get("groups") is None else tuple(who["groups"]))


@dataclass(frozen=True)
class UnitLaunch:
    """One unit of a job to start: on `host`, as `request`."""

    host: str
    index: int
    request: LaunchRequest


def launch_requests(cluster: str, job: Job, grace: float, run_limit: float | None, mem_limit: int | None,
                    addresses: Mapping[str, str], effective: Effective | None = None,
                    holding: Holding | None = None) -> list[UnitLaunch]:
    """What each host of a dispatched job is asked to run, first host first.

    The job runs with the effective values fixed at its dispatch (merge.py: the profile's env under
    the job's, params and annotations, the job starter before its command, the limits); a job
    dispatched before those were stored gets its own limits, else `run_limit`/`mem_limit` (its
    queue's). Every unit sees that environment plus XCE_JOBID, XCE_JOB_NAME, XCE_QUEUE, XCE_SLOTS
    (all tasks), XCE_HOSTS (the hosts, first first), XCE_HOST_NTASKS and XCE_HOST_TASK_INDEX (its
    tasks, and the global index of the first of them), XCE_ATTEMPT, XCE_APP (with a profile),
    XCE_ARRAY_ID and XCE_ARRAY_INDEX (an array's element), and CUDA_VISIBLE_DEVICES when it holds
    GPUs; the agent adds XCE_JOB_HOST_DIR and XCE_HOSTFILE.
    Each unit gets its hooks (unit_hooks) and the profile's post_failure rule. `effective`: those
    values when the caller holds them (the plan's, equal to `job.effective`), saving their parse;
    `holding` likewise (the plan's, equal to `job.alloc`'s).
    """
    spec = job.spec
    eff = effective if effective is not None else Effective.from_json(job.effective) if job.effective else None
    argv, profile_env = spec.argv, {}
    if eff is not None:
        argv, profile_env = eff.job_starter + spec.argv, dict(eff.profile_env)
        run_limit, mem_limit = eff.run_limit, eff.mem_limit
    if holding is None:
        holding = Holding.from_json(job.alloc, job.hosts)
    hosts = holding.hosts
    units = job_units(cluster, job.id, job.attempt, len(hosts))
    text = hostfile(hosts, addresses)
    common = eff.job_environment(spec.env) if eff is not None else dict(spec.env)
    if eff is not None and eff.app:
        common["XCE_APP"] = eff.app
    common.update({"XCE_JOBID": str(job.id), "XCE_JOB_NAME": job.name, "XCE_QUEUE": job.queue,
                   "XCE_SLOTS": str(sum(n for _, n in hosts)), "XCE_HOSTS": " ".join(h for h, _ in hosts),
                   "XCE_ATTEMPT": str(job.attempt)})
    for name in ("XCE_ARRAY_ID", "XCE_ARRAY_INDEX"):
        common.pop(name, None)  # a job submitted from inside an element copied its environment
    if job.array_id is not None:
        common.update(XCE_ARRAY_ID=str(job.array_id), XCE_ARRAY_INDEX=str(job.array_index))
    launches, first_task = [], 0
    for index, alloc in enumerate(holding.allocs):
        env = dict(common, XCE_HOST_NTASKS=str(alloc.tasks), XCE_HOST_TASK_INDEX=str(first_task))
        if alloc.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, alloc.gpus))
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # the submitter's own value means nothing here
        first_task += alloc.tasks
        request = LaunchRequest(
            unit=units[index], argv=argv if index == 0 else (), env=env, cwd=spec.cwd,
            stdout=job.output_path(), stderr=job.error_path(), run_limit=run_limit, mem_limit=mem_limit,
            grace=grace, role=ROLE_JOB if index == 0 else ROLE_HOST, hostfile=text, profile_env=profile_env,
            hooks=unit_hooks(eff, index == 0), post_failure=eff.post_failure if eff is not None else "record",
            starter=eff.job_starter if eff is not None else (), umask=spec.umask, user=run_as(spec))
        launches.append(UnitLaunch(alloc.host, index, request))
    return launches


def failed_pre_hook(result: JobResult) -> str | None:
    """The reason of a unit that ended because one of its pre hooks failed, else None."""
    if any(h.get("point", "").startswith("pre_") and not h.get("ok", True) for h in result.hooks):
        return result.reason
    return None


# ---- matching a host's units with what the controller expects -------------------------------------


@dataclass(frozen=True)
class Expected:
    """A unit the controller expects on a host: of an active job, or draining (its job has ended
    or was requeued, and the unit may still run)."""

    job_id: int
    index: int
    started: bool  # known to have run (RUN, or reported running): absent now means it vanished
    draining: bool = False


@dataclass
class Reconciliation:
    """What a host's list of units means, unit by unit (see `reconcile`)."""

    finished: list[tuple[str, JobResult]] = field(default_factory=list)  # ended: record them
    running: list[tuple[str, float | None]] = field(default_factory=list)  # adopted, with start times
    to_launch: list[str] = field(default_factory=list)  # expected, never reached the host: launch
    vanished: list[str] = field(default_factory=list)  # ran, and the host no longer knows them
    stale: list[str] = field(default_factory=list)  # running for no active job: stop them
    forget: list[str] = field(default_factory=list)  # finished and recorded already: drop them
    gone: list[str] = field(default_factory=list)  # draining units the host no longer knows


def reconcile(listed: Iterable[UnitInfo], expected: Mapping[str, Expected]) -> Reconciliation:
    """Match the units a host lists with the units the controller expects there.

    - a listed unit that ended is recorded if expected (draining ones too), else forgotten;
    - a listed unit that runs is adopted if it belongs to an active job; running for a job that
      ended or was requeued (draining), or for no job at all (a copy from before a host was
      declared lost, or from a store restored from a backup), it is stopped;
    - a listed unit still queued behind another (prefill) is left to start there, if expected;
    - an expected unit the host does not list is launched if it never ran (the launch may not have
      reached the host; its name makes the launch safe to repeat), and has vanished if it did;
      a draining unit not listed is gone (nothing holds its resources any more).
    """
    result = Reconciliation()
    seen = set()
    for info in listed:
        seen.add(info.unit)
        want = expected.get(info.unit)
        if info.status == "finished":
            if want is not None and info.result is not None:
                result.finished.append((info.unit, info.result))
            else:
                result.forget.append(info.unit)
        elif info.status == "queued" and want is not None and not want.draining:
            continue  # a successor waiting behind a unit on its host (prefill): launched, not started
        elif want is None or want.draining:
            result.stale.append(info.unit)  # a queued one too: a stop drops it from its host's queue
        else:
            result.running.append((info.unit, info.start_time))
    for unit, want in expected.items():
        if unit in seen:
            continue
        if want.draining:
            result.gone.append(unit)
        elif want.started:
            result.vanished.append(unit)
        else:
            result.to_launch.append(unit)
    return result

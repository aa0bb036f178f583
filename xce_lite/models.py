"""Plain value types shared by the controller, the store, the API and the CLI.

A `JobSpec` is what a user asked for, exactly; the controller validates it with `JobSpec.from_wire`
(which raises SpecError naming the field) before anything is stored. A `Job` is a stored row.
Standard library only: the scheduler and the CLI import this module.

A spec keeps the job's OWN values only: what its application profile and queue add is merged in
live (`merge.py`), never written into the spec, so a changed profile reaches a waiting job. So a
value the user did not give stays unset here (`slots` None: no `-n`), and the spec names its
profile (`app`) and carries its `exdata`: `app_params` (its values for the profile's declared
params), `hooks` (its own pre and post exec commands, `-E` and `-Ep`, run through /bin/sh -c)
and `meta` (client data such as the preset used, passed through uninterpreted). Requeue and job
arrays copy the spec, and with it the profile name and these values.

Workflows (README "Workflows"): `array` makes the spec an array of elements (arrays.py), which
share this one spec; `depend` is the `-w` condition as the user wrote it (deps.py; the controller
stores it resolved to job ids); `retry`/`retry_on` ask for a failed attempt to be requeued.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal, overload

from xce_lite.errors import SpecError
from xce_lite.workflow import arrays, deps

# LSF's state names, where users see them. DISP: dispatched, not yet known to be running.
PEND, PSUSP, DISP, RUN, USUSP, SSUSP, DONE, EXIT = "PEND", "PSUSP", "DISP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT"
STATES = (PEND, PSUSP, DISP, RUN, USUSP, SSUSP, DONE, EXIT)
PENDING_STATES = frozenset({PEND, PSUSP})
ACTIVE_STATES = frozenset({DISP, RUN, USUSP, SSUSP})  # holding resources on hosts
FINISHED_STATES = frozenset({DONE, EXIT})

MAX_NAME = 256
MAX_PRIORITY = 100  # LSF's default MAX_USER_PRIORITY
MAX_ARGS_BYTES = 1024 * 1024  # argv + env, as stored: a job is a request, not a payload
MAX_PARAM_VALUE = 4096  # characters of one --app-param value
MAX_META_BYTES = 16 * 1024  # exdata.meta as JSON: labels for tools, not a payload
MAX_HOOK_COMMAND = 4096  # characters of a job's own -E / -Ep command
JOB_HOOK_KEYS = ("pre_exec", "post_exec")  # exdata.hooks: -E and -Ep
APP_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
PARAM_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
EXDATA_KEYS = ("app_params", "meta", "app_origin", "hooks")
ON_DEP_FAIL = ("cancel", "pend")  # a dependency that can never hold: cancel the job, or keep it pending
MAX_RETRIES = 100


@dataclass(frozen=True)
class JobSpec:
    """A submit request, as the client sent it. `argv` runs directly, never through a shell."""

    argv: tuple[str, ...]
    cwd: str
    name: str | None = None
    queue: str | None = None  # None: the default queue
    slots: int | None = None  # tasks: at least this many (`-n min`); None: not given (1, or the profile's)
    max_slots: int | None = None  # `-n min,max`: as many as fit up to this; None: exactly `slots`
    resreq: tuple[str, ...] = ()  # the `-R` strings as given (parsed and combined by the controller)
    stdout: str | None = None  # None: <cwd>/xce-%J.out; %J expands to the job id
    stderr: str | None = None  # None: into stdout's file, as in LSF
    env: dict[str, str] = field(default_factory=dict)
    run_limit: float | None = None  # seconds
    mem_limit: int | None = None  # bytes
    hold: bool = False
    priority: int = 0  # -sp: among its queue's jobs, higher goes first (LSF's user priority)
    # -app: the application profile. None: the cluster's default_application (the controller stores
    # the name it resolved to); "": no profile at all.
    app: str | None = None
    # {"app_params": {NAME: VALUE}, "meta": {...}, "app_origin": "default", "hooks": {"pre_exec": CMD,
    # "post_exec": CMD}}; only these keys (see the module docstring). app_origin: set by the controller
    # when `app` came from default_application. A shared controller adds "run_as": {name, uid, gid,
    # groups}, the submitter's identity (controller/shared.py), which no client may send.
    exdata: dict[str, Any] = field(default_factory=dict)
    array: str | None = None  # "[1-20:2]%5" (arrays.ArraySpec.text): an array of elements
    depend: str | None = None  # -w, as written
    on_dep_fail: str = "cancel"  # or "pend" (--on-dep-fail)
    retry: int | None = None  # --retry N: requeue a failed attempt up to N times (None: the profile's)
    retry_on: tuple[int, ...] | None = None  # --retry-on: only these exit codes (None: any failure)
    # The submitter's umask, which the job's processes get and its output files are made with, as
    # LSF does; None (a client that did not say): 0o022. The agents' own files are 0600 whatever it is.
    umask: int | None = None
    # -P: the project, by path (lab/vision). None: the submitter's group default, then the cluster's
    # (the controller stores the path it resolved to, as it does for `app`).
    project: str | None = None

    @property
    def app_params(self) -> dict[str, str]:
        return self.exdata.get("app_params") or {}

    @property
    def meta(self) -> dict[str, Any]:
        return self.exdata.get("meta") or {}

    @property
    def job_hooks(self) -> dict[str, str]:
        """The job's own hook commands: {"pre_exec": CMD (-E), "post_exec": CMD (-Ep)}, either may be absent."""
        return self.exdata.get("hooks") or {}

    def to_wire(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: that deep-copies the environment, and cost half of
        # a 1,000-step flow's submit (measured by bench/workflows.py). The values are only serialised.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["argv"] = list(self.argv)
        data["resreq"] = list(self.resreq)
        if self.retry_on is not None:
            data["retry_on"] = list(self.retry_on)
        return data

    @classmethod
    def from_wire(cls, data: Any) -> JobSpec:
        """Validate a decoded JSON request; SpecError names the field and what to send instead."""
        if not isinstance(data, dict):
            raise SpecError("a job spec must be a JSON object")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise SpecError(f"unknown job spec field(s): {', '.join(unknown)}")
        argv = data.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise SpecError("the command is empty: give one after `--`, e.g. `xce submit -- ./run.sh`")
        if argv[0] == "":
            raise SpecError("the command's first word is empty: name a program to run")
        cwd = _text(data, "cwd", required=True)
        if not cwd.startswith("/"):
            raise SpecError(f"cwd {cwd!r} must be an absolute path")
        name = _text(data, "name")
        if name is not None and (len(name) > MAX_NAME or not name.strip()):
            raise SpecError(f"job name must be 1 to {MAX_NAME} characters and not blank")
        slots = data.get("slots")
        if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= 100_000):
            raise SpecError(f"slots (-n) must be a whole number from 1 to 100000, not {slots!r}")
        max_slots = data.get("max_slots")
        if max_slots is not None and slots is None:
            raise SpecError("max_slots needs slots: send -n MIN,MAX as slots and max_slots")
        if max_slots is not None and slots is not None and (
                not isinstance(max_slots, int) or isinstance(max_slots, bool) or not slots <= max_slots <= 100_000):
            raise SpecError(f"-n {slots},{max_slots}: the maximum must be a whole number from {slots} to 100000")
        resreq = data.get("resreq") or []
        if not isinstance(resreq, list) or not all(isinstance(r, str) and len(r) <= 8192 for r in resreq):
            raise SpecError("resreq (-R) must be a list of requirement strings of at most 8192 characters")
        env = data.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SpecError("env must map names to string values")
        bad = [k for k in env if not k or "=" in k or "\0" in k]
        if bad:
            raise SpecError(f"environment variable name {bad[0]!r} is invalid: no '=' and not empty")
        if any("\0" in a for a in argv) or any("\0" in v for v in env.values()):
            raise SpecError("arguments and environment values cannot contain a NUL byte")
        run_limit = _positive(data, "run_limit", float)
        mem_limit = _positive(data, "mem_limit", int)
        priority = data.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_PRIORITY:
            raise SpecError(f"-sp {priority!r}: the job priority is a whole number from 0 to {MAX_PRIORITY}")
        hold = data.get("hold", False)
        if not isinstance(hold, bool):
            raise SpecError("hold must be true or false")
        umask = data.get("umask")
        if umask is not None and (not isinstance(umask, int) or isinstance(umask, bool) or not 0 <= umask <= 0o777):
            raise SpecError(f"umask {umask!r} must be a number from 0 to 0o777 (511), or left out")
        spec = cls(
            argv=tuple(argv), cwd=cwd, name=name, queue=_text(data, "queue"), slots=slots,
            max_slots=max_slots if max_slots != slots else None, resreq=tuple(resreq),
            stdout=_path(data, "stdout"), stderr=_path(data, "stderr"), env=dict(env),
            run_limit=run_limit, mem_limit=mem_limit, hold=hold, priority=priority,
            app=_app_name(data), exdata=_exdata(data), umask=umask, project=_project_path(data),
            **_workflow(data),
        )
        if len(spec.to_json()) > MAX_ARGS_BYTES:
            raise SpecError(f"the job's command and environment exceed {MAX_ARGS_BYTES} bytes; "
                            f"pass large data in a file instead")
        return spec

    def to_json(self) -> str:
        # ensure_ascii: lone surrogates (undecodable bytes from os.environ or argv) survive as \udcXX.
        return json.dumps(self.to_wire(), ensure_ascii=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data = json.loads(text)
        data["argv"] = tuple(data["argv"])
        data["resreq"] = tuple(data.get("resreq", ()))
        if data.get("retry_on") is not None:
            data["retry_on"] = tuple(data["retry_on"])
        return cls(**data)


@overload
def _text(data: dict, key: str, required: Literal[True]) -> str: ...
@overload
def _text(data: dict, key: str, required: bool = False) -> str | None: ...
def _text(data: dict, key: str, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise SpecError(f"{key} is required")
        return None
    if not isinstance(value, str) or "\0" in value:
        raise SpecError(f"{key} must be text without NUL bytes")
    return value


PROJECT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,62}){0,15}")


def _project_path(data: dict) -> str | None:
    project = _text(data, "project")
    if project is not None and not PROJECT_RE.fullmatch(project):
        raise SpecError(f"-P {project!r} is not a project path: names of letters, digits, _ . - joined by / "
                        f"(lab/vision); see `xce projects`")
    return project


def _app_name(data: dict) -> str | None:
    app = _text(data, "app")
    if app and not APP_NAME_RE.fullmatch(app):
        raise SpecError(f"-app {app!r} is not an application name (letters, digits, _ . -; see `xce apps`)")
    return app


def _exdata(data: dict) -> dict[str, Any]:
    """exdata holds app_params (NAME -> text) and meta (a JSON object, passed through); nothing else."""
    exdata = data.get("exdata") or {}
    if not isinstance(exdata, dict):
        raise SpecError("exdata must be a JSON object")
    if "run_as" in exdata:  # set by a shared controller from the kernel's word, never by a client
        raise SpecError("exdata.run_as is set by the controller (a job runs as the user who submits it); "
                        "leave it out")
    unknown = sorted(set(exdata) - set(EXDATA_KEYS))
    if unknown:
        raise SpecError(f"unknown exdata key(s) {', '.join(unknown)}; exdata holds {', '.join(EXDATA_KEYS)}")
    params = exdata.get("app_params") or {}
    if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
        raise SpecError("app_params must map names to text values (--app-param NAME=VALUE)")
    for name, value in params.items():
        if not PARAM_NAME_RE.fullmatch(name):
            raise SpecError(f"--app-param {name!r}: a param name is a letter, then letters, digits or _")
        if len(value) > MAX_PARAM_VALUE or "\0" in value:
            raise SpecError(f"--app-param {name}: the value must be at most {MAX_PARAM_VALUE} characters, no NUL")
    meta = exdata.get("meta") or {}
    if not isinstance(meta, dict):
        raise SpecError("exdata.meta must be a JSON object")
    if len(json.dumps(meta, ensure_ascii=True)) > MAX_META_BYTES:
        raise SpecError(f"exdata.meta is above {MAX_META_BYTES} bytes as JSON; keep labels small")
    origin = exdata.get("app_origin")
    if origin not in (None, "default"):
        raise SpecError('exdata.app_origin is "default" or absent')
    hooks = exdata.get("hooks") or {}
    if not isinstance(hooks, dict) or set(hooks) - set(JOB_HOOK_KEYS):
        raise SpecError(f"exdata.hooks holds {' and '.join(JOB_HOOK_KEYS)} only (-E and -Ep)")
    for key, command in hooks.items():
        flag = "-E" if key == "pre_exec" else "-Ep"
        if isinstance(command, dict) and "as" in command:
            raise SpecError(f"{flag}: a job's own hook runs as the job's user and cannot say `as`; a hook that "
                            "must run as root belongs in an application profile (`as: root`, the admins' config)")
        if not isinstance(command, str) or not command.strip() or len(command) > MAX_HOOK_COMMAND or "\0" in command:
            raise SpecError(f"{flag}: give a shell command of at most {MAX_HOOK_COMMAND} characters, no NUL")
    return {key: value for key, value in (("app_params", dict(params)), ("meta", meta), ("app_origin", origin),
                                          ("hooks", dict(hooks))) if value}


def _workflow(data: dict) -> dict[str, Any]:
    """array, depend, on_dep_fail, retry, retry_on: checked here, so a malformed one is refused
    with its position before anything is stored (names in `depend` resolve in the controller)."""
    array = _text(data, "array")
    if array is not None:
        array = arrays.parse(array).text()
    depend = _text(data, "depend")
    if depend is not None:
        deps.parse(depend)
    on_dep_fail = data.get("on_dep_fail") or "cancel"
    if on_dep_fail not in ON_DEP_FAIL:
        raise SpecError(f"--on-dep-fail {on_dep_fail!r}: say cancel (the default) or pend")
    retry = data.get("retry")
    if retry is not None and (not isinstance(retry, int) or isinstance(retry, bool) or not 0 <= retry <= MAX_RETRIES):
        raise SpecError(f"--retry {retry!r}: the number of retries is a whole number from 0 to {MAX_RETRIES}")
    retry_on = data.get("retry_on")
    if retry_on is not None:
        if not isinstance(retry_on, list) or not retry_on or not all(
                isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in retry_on):
            raise SpecError(f"--retry-on {retry_on!r}: list exit codes from 1 to 255, e.g. --retry-on 1,75")
        retry_on = tuple(sorted(set(retry_on)))
    return {"array": array, "depend": depend, "on_dep_fail": on_dep_fail, "retry": retry, "retry_on": retry_on}


def _path(data: dict, key: str) -> str | None:
    value = _text(data, key)
    if value is not None and not value.startswith("/"):
        raise SpecError(f"{key} {value!r} must be an absolute path (the CLI makes paths absolute)")
    return value


def _positive(data: dict, key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise SpecError(f"{key} must be a number above zero, not {value!r}")
    return kind(value)


@dataclass(frozen=True)
class Job:
    """A stored job. Fields beyond `spec` are filled as the job moves through its states."""

    id: int
    user: str
    queue: str
    state: str
    spec: JobSpec
    submit_time: float
    attempt: int = 0
    hosts: tuple[tuple[str, int], ...] = ()  # (host, tasks) while it holds resources, and after
    unit: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    cpu_time: float | None = None
    max_rss: int | None = None
    reason: str | None = None  # why it ended (EXIT, or DONE with a remark) or why it is held
    pend_reason: str | None = None
    # what it holds while dispatched or running: {"allocs": [[host, tasks, {resource: amount},
    # [gpu indices]], ...], "shared": {counter: amount}}; None for jobs stored before schema 2
    alloc: dict | None = None
    # what it runs with, fixed at dispatch: merge_values.Effective.to_json(); None before dispatch (its
    # effective values are computed live then) and for jobs dispatched before schema 4
    effective: dict | None = None
    # an array's element: its array (the array's id is its first element's job id) and its index;
    # its spec is the array's, shared by every element
    array_id: int | None = None
    array_index: int | None = None
    depend: dict | None = None  # the dependency, resolved (deps.to_json); an element's is its array's
    retries: int = 0  # times it was requeued to retry after a failed attempt

    @property
    def project(self) -> str | None:
        """Its project's path, resolved at submit (None: stored before projects existed)."""
        return self.spec.project

    @property
    def name(self) -> str:
        return self.spec.name or (self.spec.argv[0].rsplit("/", 1)[-1] if self.spec.argv else "")

    @property
    def display_id(self) -> str:
        """`42` for a job, `42[7]` for element 7 of array 42 (as LSF shows them)."""
        return str(self.id) if self.array_id is None else f"{self.array_id}[{self.array_index}]"

    def output_path(self) -> str:
        default = "xce-%J.out" if self.array_id is None else "xce-%J_%I.out"
        return self._expand(self.spec.stdout or f"{self.spec.cwd.rstrip('/')}/{default}")

    def error_path(self) -> str | None:
        return self._expand(self.spec.stderr) if self.spec.stderr else None

    def _expand(self, path: str) -> str:
        if self.array_id is None:
            return expand_job_path(path, self.id)
        return expand_job_path(path, self.array_id, self.array_index)


def expand_job_path(path: str, job_id: int, index: int | None = None) -> str:
    """`%J` is the job id (an element's array id, as in LSF), `%I` an element's index (0 for a job
    that is not in an array); `%%` is a literal percent sign."""
    return (path.replace("%%", "\0").replace("%J", str(job_id)).replace("%I", str(index or 0))
            .replace("\0", "%"))


def unit_name(cluster: str, job_id: int, attempt: int, host_index: int) -> str:
    """Deterministic, so a repeated launch finds the unit it already started (the fencing token)."""
    return f"xce-{cluster}-{job_id}-{attempt}-{host_index}"

"""The Host seam: the one narrow interface between the controller and the machines that run jobs.

Every implementation (local, SSH, the simulator's fake) keeps the same contract:

- `launch(requests)` starts each request's unit, or adopts it when a unit of that name already
  exists on the host (the unit name is the fencing token: a repeated launch never runs a job twice).
  It returns one `LaunchReply` per request, in order, without waiting for any job to end.
  `launch_nowait(requests)` does the same without a round trip on the caller's time: the replies
  come back as an `UnitsLaunched` event, ahead of any other event of those units.
- Results come back as `UnitFinished` events on the queue given to the host; they are also kept by
  the host (in the unit's result file) until `forget(units)` says the controller has stored them, so
  an event lost with a dead controller is found again by `list_units()` after a restart.
- `signal(unit, name, reason)` asks the unit's supervisor to deliver a signal; for TERM/KILL the
  supervisor escalates TERM -> grace -> KILL and records `reason` as the end reason.
- `list_units()` reports every unit the host knows: running ones, and finished ones not yet forgotten.
- `xce launch` inside a job on the host arrives as a `LaunchRequested` event; `tasks(unit, launch_id,
  tasks)` starts tasks inside a running unit, each end a `TaskFinished` event; `launch_done(launch_id,
  exit_code)` answers the waiting `xce launch` on the job's first host.
- `read(path, offset, max)` returns a piece of a file on the host (`xce peek`); `ping()` is cheap.

Values crossing the seam are plain frozen dataclasses of JSON-able fields.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class HookRun:
    """One hook a unit runs: at `point` (pre_host_exec, pre_job_exec, post_job_exec, post_host_exec),
    of `layer` "profile" (run with the profile's env only) or "job" (the job's -E/-Ep, with its env),
    for at most `timeout` seconds (then TERM, then KILL). A unit runs its pre hooks in order, then
    the job, then its post hooks in order, however the job ended."""

    point: str
    layer: str
    argv: tuple[str, ...]
    timeout: float
    as_root: bool = False  # `as: root` in the profile: run as root even in a job run as its user


@dataclass(frozen=True)
class JobUser:
    """Whom a unit runs as (shared mode), as the submitter's kernel credentials said: the host
    checks `name` has `uid` there and refuses the launch otherwise. gid None: the passwd entry's;
    groups None: the host's supplementary groups of that user."""

    name: str
    uid: int
    gid: int | None = None
    groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LaunchRequest:
    """What a host needs to run one unit. `argv` is executed directly, never through a shell."""

    unit: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    stdout: str  # absolute path; opened for append by the supervisor
    stderr: str | None  # None: stderr goes to stdout's file
    run_limit: float | None = None  # seconds of wall time, then TERM, grace, KILL
    mem_limit: int | None = None  # bytes of resident memory summed over the job's processes
    grace: float = 10.0  # seconds between TERM and KILL
    # "job": runs argv (a job's first host). "host": a multi-host job's unit on another host: runs
    # no command, holds the allocation until it is signalled, and runs the job's `xce launch` tasks.
    role: str = "job"
    hostfile: str | None = None  # written to the unit's XCE_JOB_HOST_DIR/hostfile (XCE_HOSTFILE)
    # The application profile's env layer, apart from the job's (`env` already holds both, the
    # job's on top): the clean outer layer for the profile's hooks, and what remote tasks get
    # beneath the job's own. Sent to the agent with the hooks.
    profile_env: dict[str, str] = field(default_factory=dict)
    hooks: tuple[HookRun, ...] = ()  # in run order: the pre ones, then the post ones
    starter: tuple[str, ...] = ()  # the job starter (already before argv): the unit's tasks of `xce launch` get it too
    post_failure: str = "record"  # "exit": a post hook that fails makes a DONE job EXIT
    umask: int | None = None  # the submitter's: the job's processes and new output files get it (None: 0o022)
    # The user the job runs as (shared mode; the agent must be root). None: as the agent's own user.
    user: JobUser | None = None
    # A queued successor (issue 18, prefill): the unit on this host whose allocation it takes over;
    # the host starts it when that unit ends (at once if it has). None: start now.
    after: str | None = None


@dataclass(frozen=True)
class LaunchReply:
    unit: str
    status: str  # "started" | "running" (adopted, still running) | "finished" (adopted, ended) | "queued"
    start_time: float | None = None  # epoch seconds the job started, when known
    error: str | None = None  # set when the launch was refused; status is then "refused"


@dataclass(frozen=True)
class JobResult:
    """How a unit ended. Written by the supervisor however the job ended."""

    exit_code: int | None  # None when the job was killed by a signal
    signal: int | None  # the signal number that ended the job, if any
    start_time: float
    end_time: float
    cpu_time: float  # user + system seconds of the job and its waited-for descendants
    max_rss: int  # peak resident set size in bytes (largest process, from wait4)
    reason: str | None = None  # "killed by user", "run limit 00:10:00 reached", "exec failed: ...", ...
    service_result: str | None = None  # systemd's $SERVICE_RESULT for the unit; None in plain mode
    mode: str | None = None  # how it ran: "plain", "systemd" or "user"; None from a version 1 agent
    # What post hooks that failed say, when that does not fail the job ("post_job_exec hook
    # (profile) exited 2"): stored with the job's reason, the job stays DONE.
    note: str | None = None
    # Each hook run, in order: {point, layer, exit_code, signal, timed_out, error, seconds}.
    hooks: tuple[dict, ...] = ()


@dataclass(frozen=True)
class UnitFinished:
    host: str
    unit: str
    result: JobResult


@dataclass(frozen=True)
class UnitUnqueued:
    """A queued successor left its host's queue: "started" (or "running", "finished": adopted),
    "refused" (error says why), "dropped" (the host's lease ran out: it never started), or
    "withdrawn" (the controller asked, withdraw_nowait, before it started)."""

    host: str
    unit: str
    status: str
    start_time: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class HostLost:
    """The host's agent stopped answering. Its units may still be running; reconnect and list."""

    host: str
    why: str


@dataclass(frozen=True)
class UnitInfo:
    unit: str
    status: str  # "running" | "finished" | "queued" (a successor waiting behind a unit: not started)
    start_time: float | None = None
    result: JobResult | None = None


@dataclass(frozen=True)
class UnitsLaunched:
    """The replies to a `launch_nowait`; on failure, `error` says why and `failed` names the units
    (their state is unknown: the controller learns it by listing the host's units on reconnect)."""

    host: str
    replies: tuple[LaunchReply, ...]
    failed: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class LaunchRequested:
    """A job ran `xce launch -- argv` in `unit` on `host`: the controller sends `tasks` to the job's
    hosts, then `launch_done(launch_id, ...)` to this one."""

    host: str
    launch_id: str
    unit: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class TaskFinished:
    """A task of `xce launch` ended (exit_code, or signal), or never started (error says why)."""

    host: str
    unit: str
    launch_id: str
    index: int
    exit_code: int | None
    signal: int | None
    error: str | None = None


@dataclass(frozen=True)
class Task:
    """One task of `xce launch` for a host: `index` is its global task index."""

    index: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class FileChunk:
    """A piece of a file on a host: `data` from the requested offset, `offset` just past it."""

    data: bytes
    offset: int
    size: int  # the file's size when it was read
    eof: bool


HostEvent = UnitFinished | HostLost | UnitsLaunched | LaunchRequested | TaskFinished | UnitUnqueued


class EventSink(Protocol):
    """Where a host's events go: a queue.Queue[HostEvent], or anything with its put()."""

    def put(self, item: HostEvent, /) -> None: ...


class Host(Protocol):
    name: str

    def connect(self, events: EventSink) -> HostProbe:
        """Start or reach the agent; events (finished units, a lost agent) go to `events`."""
        ...

    def launch(self, requests: list[LaunchRequest]) -> list[LaunchReply]:
        """Start or adopt each unit; one reply per request, in order."""
        ...

    def launch_nowait(self, requests: list[LaunchRequest]) -> None:
        """Send the launch and go on; the replies arrive as one UnitsLaunched event, before any
        event of those units."""
        ...

    def signal(self, unit: str, name: str, reason: str) -> bool:
        """True if the unit was found running and signalled; False if it is not running."""
        ...

    def list_units(self) -> list[UnitInfo]:
        """Every unit the host holds: running, and finished but not yet forgotten."""
        ...

    def withdraw_nowait(self, unit: str) -> None:
        """Ask the host to drop a queued successor unstarted; the answer is a UnitUnqueued event
        (status "withdrawn", or "started" when it started first)."""
        ...

    def forget(self, units: list[str], wait: bool = True) -> None:
        """The controller has stored these units' results: the host may drop them.

        wait=False: send and go on; a unit not dropped is listed again after a reconnect.
        """
        ...

    def close(self) -> None:
        """Stop talking to the host. Running units go on."""
        ...

    def corked(self) -> AbstractContextManager[None]:
        """A block whose requests sent without waiting (launch_nowait, forget(wait=False), ...)
        reach the host together when it ends; one that waits for its reply goes at once."""
        ...

    def ping(self, timeout: float | None = None) -> float:
        """The host's clock (epoch seconds); HostUnreachable if it does not answer in time."""
        ...

    def read(self, path: str, offset: int = 0, max: int = 1 << 20) -> FileChunk:
        """Up to `max` (at most 1 MiB) bytes of the host's file `path` from `offset`."""
        ...

    def tasks(self, unit: str, launch_id: str, tasks: list[Task]) -> None:
        """Start `tasks` inside the running `unit`; each end comes as a TaskFinished event."""
        ...

    def launch_done(self, launch_id: str, exit_code: int) -> bool:
        """Answer the `xce launch` waiting for `launch_id`; True if it was connected to hear it."""
        ...


@dataclass(frozen=True)
class HostProbe:
    hostname: str
    cpus: int
    mem: int  # bytes
    agent_version: int
    extra: dict = field(default_factory=dict)

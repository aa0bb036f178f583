#!/usr/bin/env python3
"""The xce_lite host agent and plain supervisor. ONE self-contained, standard-library-only file.

The controller copies this file to a host (by content hash) and runs it; it must never import
xce_lite or a third-party package. Two modes:

    python3 agent.py serve --spool DIR [--host-name NAME] [--lock-timeout SECONDS]
    python3 agent.py exec SPOOL/UNIT

`serve` speaks JSON lines on stdin/stdout (one object per line, ASCII-only JSON so that lone
surrogates from os.environ survive). Requests `{"id": N, "op": OP, ...}` get exactly one reply
`{"id": N, "ok": true, ...}` or `{"id": N, "ok": false, "error": "..."}`. Unsolicited events carry no
id: `{"event": "finished", "unit": U, "result": {...}}`, and `{"event": "fatal", "error": "..."}`
just before the agent exits because it cannot serve (another agent holds the spool).
Ops: hello, launch, signal, list, forget (see the `op_*` methods).

Each unit lives in SPOOL/UNIT, a directory that holds, in the order they appear:
    spec.json       what to run; written (atomically) BEFORE the supervisor is forked
    supervisor.pid  line 1: "PID STARTTIME START_EPOCH": the supervisor's pid, its /proc start time
                    (field 22 of /proc/PID/stat, which defends against pid reuse) and the job's
                    start time; line 2, once the job runs: the job's pid, which is also its
                    process group (a member of the supervisor's session)
    kill_reason     the text of the last `signal` request (the end reason of a requested kill)
    result.json     how the job ended; written atomically, however it ended; its presence = finished

Invariants:
- A unit runs at most once: os.mkdir(SPOOL/UNIT) is the fence. An existing directory with a
  spec.json is adopted (reported running or finished), never started again. A directory without
  spec.json was left by an agent that died between mkdir and writing spec.json; no supervisor was
  ever forked for it, so it is started.
- One agent per spool: `serve` holds an exclusive flock on SPOOL/.lock. A forked supervisor shares
  that lock until it has written supervisor.pid, so a new agent never sees a unit whose supervisor
  is alive but not yet recorded (which it would misreport as "supervisor lost").
- The agent is single-threaded, so os.fork is safe; a job costs a fork of this small process, never
  a new interpreter. The agent never touches running jobs when it exits (on stdin EOF).
- The supervisor writes result.json however the job ends. A unit with spec.json, no live
  supervisor and no result has lost its supervisor (kill -9); whoever notices writes a result
  saying so (exit_code null), with os.link so a real result is never overwritten.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import re
import select
import signal
import sys
import time

try:  # the C function: signal.pthread_sigmask turns the old mask into enums, a cost on every fork
    from _signal import pthread_sigmask
except ImportError:  # pragma: no cover - other Pythons
    from signal import pthread_sigmask

VERSION = 1

# Names a `signal` request may use. The agent asks a supervisor to deliver signal NAME to its job by
# sending it SIGRTMIN + index(NAME): real-time signals queue (none is merged or lost) and, unlike
# STOP and KILL themselves, can be blocked and taken by the supervisor. A plain SIGTERM (or INT,
# HUP) to a supervisor, from an admin or systemd, means "kill requested" too; USR1/USR2 to a
# supervisor are passed on to its job.
REQUEST_NAMES = ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "STOP", "CONT")
KILL_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
REQUEST_SIGNALS = tuple(signal.SIGRTMIN + i for i in range(len(REQUEST_NAMES)))
SUPERVISOR_SIGNALS = (*KILL_SIGNALS, *FORWARD_SIGNALS, *REQUEST_SIGNALS, signal.SIGCHLD)
# Reset to default in the job: Python ignores PIPE and XFSZ, and ignored signals survive exec.
JOB_DEFAULT_SIGNALS = (*SUPERVISOR_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT)

UNIT_NAME = re.compile(r"^[A-Za-z0-9_@+][A-Za-z0-9_.@:+=-]{0,199}$")
MEM_SAMPLE_INTERVAL = 0.5  # seconds between RSS samples of a job with a memory limit
WATCH_INTERVAL = 0.5  # seconds between checks of adopted units this agent did not fork
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- small helpers (both modes)


def format_size(size: int) -> str:
    """The largest binary unit that keeps one decimal honest: 2147483648 -> '2G', 1536M -> '1.5G'."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size}B"


def format_limit(seconds: float) -> str:
    """HH:MM:SS with hours zero-padded to two digits: 600 -> '00:10:00'."""
    total = round(seconds)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def proc_stat(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (index 0 is field 3, the state), or None if there is no such pid.

    Parsed after the last ')' because the command name (field 2) may itself contain spaces or ')'.
    Index 2 = pgrp, 3 = session, 19 = starttime (field 22), 21 = rss in pages (field 24).
    """
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[data.rindex(b")") + 2 :].split()


def is_alive(pid: int, starttime: int) -> bool:
    """True if `pid` runs and is the same process as the one recorded with `starttime`.

    A zombie counts as dead: an orphan's zombie may linger where PID 1 is slow to reap.
    """
    fields = proc_stat(pid)
    return fields is not None and int(fields[19]) == starttime and fields[0] not in (b"Z", b"X")


def write_file(path: str, data: bytes, durable: bool = False) -> None:
    """Replace `path` atomically (tmp + rename); with `durable`, fsync the data and the directory."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_text(path: str) -> str | None:
    """The file's text, or None if it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> dict | None:
    text = read_text(path)
    return None if text is None else json.loads(text)


def dumps(obj: object) -> bytes:
    """One protocol line. ASCII-only so lone surrogates (undecodable bytes in env) survive."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def read_pid_file(path: str) -> tuple[int, int, float, int | None] | None:
    """(pid, starttime, start_epoch, job pid or None) from supervisor.pid, or None if absent.

    It cannot be incomplete: it is written whole (tmp + rename) and its second line is appended by a
    single write.
    """
    text = read_text(path)
    if not text:
        return None
    lines = text.split("\n")
    pid, starttime, start = lines[0].split()
    job = int(lines[1]) if len(lines) > 1 and lines[1].strip() else None
    return int(pid), int(starttime), float(start), job


def remove_dir(path: str) -> None:
    """Remove a unit directory (flat: files only) if it exists."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    os.rmdir(path)


def make_result(start_time: float, reason: str | None, exit_code: int | None = None, **usage) -> dict:
    """A result for a job that never ran (or whose end is unknown): no usage, `reason` says why."""
    return {
        "exit_code": exit_code,
        "signal": None,
        "start_time": start_time,
        "end_time": time.time(),
        "cpu_time": 0.0,
        "max_rss": 0,
        "reason": reason,
        **usage,
    }


# ---------------------------------------------------------------- the supervisor


class JobEnded(Exception):
    """The job cannot start; `result` says why. Raised before any job process exists."""

    def __init__(self, result: dict):
        super().__init__(result["reason"])
        self.result = result


def become_supervisor(unit_dir: str, spec: dict, start_time: float, detach: bool) -> None:
    """Run the unit as its supervisor and write its result.json. Called with SUPERVISOR_SIGNALS
    blocked; they stay blocked for good: the supervisor takes them with sigtimedwait.

    Order matters: supervisor.pid is written FIRST, while this process still shares the agent's spool
    lock (see the module docstring); only then are the inherited fds (the agent's pipes, which would
    hide EOF from the controller, and the lock) closed.
    """
    pid = os.getpid()
    starttime = int(proc_stat(pid)[19])
    write_file(os.path.join(unit_dir, "supervisor.pid"), f"{pid} {starttime} {start_time!r}\n".encode())
    try:
        os.setsid()
    except OSError:  # exec mode under a process-group leader (systemd): already detached enough
        pass
    if detach:
        os.closerange(0, 1 << 20)  # close_range(2) underneath: cheap whatever the fd limit
        null = os.open(os.devnull, os.O_RDWR)  # becomes fd 0
        os.set_inheritable(null, True)  # the job's stdin (os.open makes fds close-on-exec)
        os.dup2(null, 1)
        os.dup2(null, 2)
    else:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if null != 0:
            os.close(null)
    supervise(unit_dir, spec, start_time)


def supervise(unit_dir: str, spec: dict, start_time: float) -> None:
    """Start the job, watch it, and write result.json, whatever happens (even a bug here)."""
    watch = Watch(unit_dir, spec, start_time)
    try:
        result = watch.run()
    except JobEnded as ended:
        result = ended.result
    except BaseException as exc:
        import traceback  # only here: keeps the agent, which every supervisor copies, small

        if watch.pid:
            watch.killpg(signal.SIGKILL)  # no job may run on once its result is written

        with open(os.path.join(unit_dir, "supervisor.log"), "a") as log:
            traceback.print_exc(file=log)
        result = make_result(start_time, f"supervisor error: {exc!r} (see supervisor.log in {unit_dir})")
    write_file(os.path.join(unit_dir, "result.json"), dumps(result), durable=True)


def open_outputs(spec: dict, start_time: float) -> tuple[int, int]:
    """The job's stdout and stderr fds (append, create); stderr is stdout's when spec has none."""
    fds = []
    for path in (spec["stdout"], spec.get("stderr") or None):
        if path is None:
            fds.append(fds[0])
            continue
        try:
            fds.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as exc:
            raise JobEnded(make_result(start_time, f"cannot open output file {path}: {exc.strerror}"))
    return fds[0], fds[1]


def spawn_job(spec: dict, out: int, err: int, start_time: float) -> int:
    """Start the job as the leader of a new process group; its pid. Never through a shell.

    posix_spawn (vfork underneath) is 2-3x faster than fork+exec from Python, and reports an exec
    failure as an exception here. The program is looked up in the JOB's PATH, like execvpe. As in a
    shell, a command not found ends the job with 127, one that cannot be executed with 126.
    """
    argv, env = spec["argv"], spec["env"]
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        raise JobEnded(make_result(start_time, f"cannot change directory to {spec['cwd']}: {exc.strerror}"))
    error = None
    for path in program_candidates(argv[0], env):
        try:
            return os.posix_spawn(
                path,
                argv,
                env,
                setpgroup=0,
                setsigmask=(),
                setsigdef=JOB_DEFAULT_SIGNALS,
                file_actions=[(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)],
            )
        except OSError as exc:
            if error is None or exc.errno != errno.ENOENT:
                error = exc  # like execvp: a permission error beats a later "not found"
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                break
    code = error.errno if error else errno.ENOENT
    reason = f"exec failed: {os.strerror(code)}: {argv[0]}"
    raise JobEnded(make_result(start_time, reason, exit_code=127 if code == errno.ENOENT else 126))


def program_candidates(name: str, env: dict) -> list[str]:
    """Paths to try for argv[0], in execvpe's order, skipping ones that do not exist."""
    if "/" in name:
        return [name]
    dirs = env.get("PATH", os.defpath).split(os.pathsep)
    return [path for path in (os.path.join(d or ".", name) for d in dirs) if os.path.isfile(path)]


class Watch:
    """Runs one job and waits for it, enforcing its limits and acting on requested signals.

    The supervisor keeps SUPERVISOR_SIGNALS (SIGCHLD among them) blocked and waits in sigtimedwait
    with a timeout that is the nearest deadline (run limit, end of the grace period, next memory
    sample): no busy sleeps, no handlers, no wake-up pipe, and no signal can be missed between a
    check and the wait, because a blocked signal stays pending until it is taken.
    """

    def __init__(self, unit_dir: str, spec: dict, start_time: float):
        self.unit_dir, self.spec, self.start_time = unit_dir, spec, start_time
        self.reason: str | None = None  # the end reason once a kill has begun
        self.kill_at: float | None = None  # monotonic time to send KILL after TERM
        self.forwarded: set[int] = set()
        self.pid = 0

    def run(self) -> dict:
        out, err = open_outputs(self.spec, self.start_time)
        self.pid = spawn_job(self.spec, out, err, self.start_time)
        os.close(out)
        if err != out:
            os.close(err)
        # The job's pid goes on supervisor.pid's second line: appending costs no new file (inode
        # creation is the dearest step of a launch on ext4).
        fd = os.open(os.path.join(self.unit_dir, "supervisor.pid"), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.write(fd, f"{self.pid}\n".encode())
        os.close(fd)
        began = time.monotonic()
        run_limit, mem_limit = self.spec.get("run_limit"), self.spec.get("mem_limit")
        run_deadline = began + run_limit if run_limit else None
        next_sample = began + MEM_SAMPLE_INTERVAL if mem_limit else None
        while True:
            waited, status, usage = os.wait4(self.pid, os.WNOHANG)
            if waited == self.pid:
                break
            now = time.monotonic()
            if run_deadline is not None and now >= run_deadline:
                self.begin_kill(f"run limit {format_limit(run_limit)} reached")
                run_deadline = None
            if next_sample is not None and now >= next_sample:
                if self.group_rss() > mem_limit:
                    self.begin_kill(f"memory limit {format_size(mem_limit)} exceeded")
                next_sample = now + MEM_SAMPLE_INTERVAL
            if self.kill_at is not None and now >= self.kill_at:
                self.killpg(signal.SIGKILL)
                self.kill_at = None
            deadlines = [d for d in (run_deadline, next_sample, self.kill_at) if d is not None]
            if deadlines:
                info = signal.sigtimedwait(SUPERVISOR_SIGNALS, max(0.0, min(deadlines) - now))
            else:
                info = signal.sigwaitinfo(SUPERVISOR_SIGNALS)
            if info is not None:
                self.handle_signal(info.si_signo)
        if self.reason is not None:
            self.killpg(signal.SIGKILL)  # a killed job's leftover processes go too
        return self.result(status, usage)

    def result(self, status: int, usage) -> dict:
        exit_code = os.waitstatus_to_exitcode(status)
        signum = -exit_code if exit_code < 0 else None
        reason = self.reason
        if reason is None and signum is not None:
            reason = self.kill_reason(None) if signum in self.forwarded else None
            reason = reason or f"killed by signal {signal.Signals(signum).name}"
        return {
            "exit_code": None if signum else exit_code,
            "signal": signum,
            "start_time": self.start_time,
            "end_time": time.time(),
            "cpu_time": usage.ru_utime + usage.ru_stime,
            "max_rss": usage.ru_maxrss * 1024,
            "reason": reason,
        }

    def handle_signal(self, signum: int) -> None:
        """Act on one signal sent to the supervisor (SIGCHLD only wakes the loop)."""
        if signum in REQUEST_SIGNALS:
            signum = getattr(signal, "SIG" + REQUEST_NAMES[signum - signal.SIGRTMIN])
        if signum in KILL_SIGNALS:
            self.begin_kill(self.kill_reason("killed"))
        elif signum == signal.SIGKILL:
            self.reason = self.reason or self.kill_reason("killed")
            self.killpg(signal.SIGKILL)
            self.kill_at = None
        elif signum != signal.SIGCHLD:
            self.forwarded.add(signum)
            self.killpg(signum)

    def begin_kill(self, reason: str) -> None:
        """TERM the job's group (CONT, in case it is stopped), then KILL after the grace period.
        The first reason given is the one the result keeps."""
        if self.reason is None:
            self.reason = reason
        self.killpg(signal.SIGTERM)
        self.killpg(signal.SIGCONT)
        if self.kill_at is None:
            grace = self.spec.get("grace")
            self.kill_at = time.monotonic() + (10.0 if grace is None else float(grace))

    def kill_reason(self, default: str | None) -> str | None:
        text = read_text(os.path.join(self.unit_dir, "kill_reason"))
        return text.strip() if text and text.strip() else default

    def killpg(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def group_rss(self) -> int:
        """Resident bytes summed over the job's process group (a best-effort sample from /proc)."""
        total, pgrp = 0, str(self.pid).encode()
        for name in os.listdir("/proc"):
            if name.isdigit():
                fields = proc_stat(int(name))
                if fields is not None and fields[2] == pgrp:
                    total += int(fields[21]) * PAGE_SIZE
        return total


# ---------------------------------------------------------------- the agent


class Refused(Exception):
    """A launch request this host cannot run; the message says what to fix."""


def validate(u: dict) -> None:
    """Raise Refused unless `u` is a launchable unit spec."""
    if not isinstance(u, dict):
        raise Refused(f"a unit must be an object, not {u!r}")
    unit = u.get("unit")
    if not isinstance(unit, str) or not UNIT_NAME.match(unit):
        raise Refused(f"bad unit name {unit!r}: use letters, digits and _.@:+=- (not starting with .)")
    argv, env = u.get("argv"), u.get("env")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise Refused("env must map strings to strings")
    if any("\0" in a for a in argv) or any("\0" in k + v or "=" in k or not k for k, v in env.items()):
        raise Refused("argv and env cannot hold NUL bytes, and env names must be non-empty without '='")
    cwd = u.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
        raise Refused(f"cwd {cwd!r} is not an existing directory (give an absolute path)")
    if not os.access(cwd, os.X_OK):
        raise Refused(f"cwd {cwd} is not accessible: fix its permissions")
    for key in ("stdout", "stderr"):
        path = u.get(key)
        if not (isinstance(path, str) and os.path.isabs(path)) and not (key == "stderr" and path is None):
            raise Refused(f"{key} must be an absolute path{' or null' if key == 'stderr' else ''}")
    for key in ("run_limit", "mem_limit", "grace"):
        value = u.get(key)
        if value is not None and (not isinstance(value, (int, float)) or value < 0):
            raise Refused(f"{key} must be a non-negative number or null")


class Agent:
    """The serve loop. Single-threaded: requests, SIGCHLD and the watch timer share one poll()."""

    def __init__(self, spool: str, host_name: str):
        self.spool, self.host_name = spool, host_name
        self.out: list[bytes] = []  # lines to write at the end of this loop turn
        self.children: dict[int, str] = {}  # supervisor pid -> unit, for supervisors forked here
        self.child_units: dict[str, tuple[int, float]] = {}  # unit -> (pid, start_time), the same
        self.watched: set[str] = set()  # running units adopted from a previous agent: polled

    # -- unit state

    def unit_dir(self, unit: str) -> str:
        return os.path.join(self.spool, unit)

    def unit_status(self, unit: str) -> tuple[str, float | None, dict | None, int | None] | None:
        """(status, start_time, result, supervisor pid) of a unit, or None if it was never started.

        A unit with spec.json, no live supervisor and no result lost its supervisor: this writes
        the result that says so, so that every later answer is the same.
        """
        d = self.unit_dir(unit)
        result = read_json(os.path.join(d, "result.json"))
        if result is not None:
            return "finished", result.get("start_time"), result, None
        if unit in self.child_units:
            pid, start_time = self.child_units[unit]
            return "running", start_time, None, pid
        pids = read_pid_file(os.path.join(d, "supervisor.pid"))
        if pids and is_alive(pids[0], pids[1]):
            return "running", pids[2], None, pids[0]
        result = read_json(os.path.join(d, "result.json"))  # it may have ended since we looked
        if result is not None:
            return "finished", result.get("start_time"), result, None
        spec = read_json(os.path.join(d, "spec.json")) if os.path.isdir(d) else None
        if spec is None:
            return None
        result = self.record_lost(d, spec, pids)
        return "finished", result.get("start_time"), result, None

    def record_lost(self, d: str, spec: dict, pids: tuple | None) -> dict:
        """Write (if none exists yet) and return the result of a unit whose supervisor died.

        The job's remaining processes are killed, so that nothing runs unsupervised. The job's
        process group is recognised by its session, the dead supervisor's pid: the kernel does not
        reuse a pid while a session or group of that number exists.
        """
        reason = "supervisor lost: it was killed or crashed, so the job's exit status is unknown"
        job = pids[3] if pids else None
        fields = proc_stat(job) if job else None
        if fields is not None and fields[2] == str(job).encode() and fields[3] == str(pids[0]).encode():
            os.killpg(job, signal.SIGKILL)
            reason += "; its remaining processes were killed"
        tmp = os.path.join(d, f"result.json.lost{os.getpid()}")
        write_file(tmp, dumps(make_result(spec.get("start_time") or time.time(), reason)), durable=True)
        try:
            os.link(tmp, os.path.join(d, "result.json"))  # fails if a real result appeared
        except FileExistsError:
            pass
        os.unlink(tmp)
        return read_json(os.path.join(d, "result.json"))

    def emit_finished(self, unit: str, result: dict) -> None:
        self.out.append(dumps({"event": "finished", "unit": unit, "result": result}))

    def report_if_finished(self, unit: str) -> bool:
        """Emit `finished` for the unit if it has ended; True if it is no longer running."""
        status = self.unit_status(unit)
        if status is not None and status[0] == "finished":
            self.emit_finished(unit, status[2])
        return status is None or status[0] == "finished"

    def reap(self) -> None:
        """Collect every exited supervisor forked here and report its unit (gone if forgotten)."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            unit = self.children.pop(pid, None)
            if unit is not None:
                del self.child_units[unit]
                self.report_if_finished(unit)

    def poll_watched(self) -> None:
        for unit in sorted(self.watched):
            if self.report_if_finished(unit):
                self.watched.discard(unit)

    # -- ops

    def op_hello(self, req: dict) -> dict:
        mem = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
        return {
            "version": VERSION,
            "hostname": os.uname().nodename,
            "host_name": self.host_name,
            "cpus": len(os.sched_getaffinity(0)),
            "mem": mem,
            "pid": os.getpid(),
            "spool": self.spool,
        }

    def op_launch(self, req: dict) -> dict:
        return {"replies": [self.launch_one(u) for u in req.get("units", [])]}

    def launch_one(self, u: dict) -> dict:
        """Start one unit, or adopt it if its directory exists (a unit never runs twice)."""
        unit = u.get("unit") if isinstance(u, dict) else None
        reply = {"unit": unit, "status": "refused", "start_time": None, "error": None}
        try:
            validate(u)
            d = self.unit_dir(unit)
            try:
                os.mkdir(d)
            except FileExistsError:
                status = self.unit_status(unit)
                if status is not None:
                    return self.adopt(unit, reply, status)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        except OSError as exc:
            reply["error"] = f"cannot create {exc.filename}: {exc.strerror}; check the spool directory"
            return reply
        start_time = time.time()
        spec = {
            k: u.get(k)
            for k in ("unit", "argv", "env", "cwd", "stdout", "stderr", "run_limit", "mem_limit", "grace")
        }
        spec["start_time"] = start_time
        if spec["grace"] is None:
            spec["grace"] = 10.0
        try:
            write_file(os.path.join(d, "spec.json"), dumps(spec))
            pid = fork_supervisor(d, spec, start_time)
        except OSError as exc:
            remove_dir(d)  # nothing started: the unit may be launched again
            reply["error"] = f"cannot start the supervisor: {exc}; the host may be out of resources"
            return reply
        self.children[pid] = unit
        self.child_units[unit] = (pid, start_time)
        reply.update(status="started", start_time=start_time)
        return reply

    def adopt(self, unit: str, reply: dict, status: tuple) -> dict:
        state, start_time, result, _pid = status
        reply.update(status=state, start_time=start_time)
        if state == "finished":
            reply["result"] = result
            self.emit_finished(unit, result)
        elif unit not in self.child_units:
            self.watched.add(unit)
        return reply

    def op_signal(self, req: dict) -> dict:
        unit, name = req.get("unit"), req.get("signal")
        if name not in REQUEST_NAMES:
            raise Refused(f"unknown signal {name!r}: use one of {', '.join(REQUEST_NAMES)}")
        if not isinstance(unit, str) or not UNIT_NAME.match(unit):
            raise Refused(f"bad unit name {unit!r}")
        status = self.unit_status(unit)
        if status is None or status[0] != "running":
            return {"found": False}
        write_file(
            os.path.join(self.unit_dir(unit), "kill_reason"),
            str(req.get("reason") or "").encode("utf-8", "surrogateescape"),
        )
        signum = signal.SIGTERM if name == "TERM" else signal.SIGRTMIN + REQUEST_NAMES.index(name)
        try:
            os.kill(status[3], signum)
        except ProcessLookupError:
            return {"found": False}
        return {"found": True}

    def op_list(self, req: dict) -> dict:
        units = []
        for unit in sorted(os.listdir(self.spool)):
            if not UNIT_NAME.match(unit):
                continue  # .lock, temporary files
            status = self.unit_status(unit)
            if status is None:
                continue
            state, start_time, result, _pid = status
            if state == "running" and unit not in self.child_units:
                self.watched.add(unit)
            units.append({"unit": unit, "status": state, "start_time": start_time, "result": result})
        return {"units": units}

    def op_forget(self, req: dict) -> dict:
        replies = []
        for unit in req.get("units", []):
            reply = {"unit": unit, "ok": True, "error": None}
            if not isinstance(unit, str) or not UNIT_NAME.match(unit):
                reply.update(ok=False, error=f"bad unit name {unit!r}")
            elif (self.unit_status(unit) or ("gone",))[0] == "running":
                reply.update(
                    ok=False,
                    error=f"unit {unit} is still running: signal it and forget it after its finished event",
                )
            else:
                remove_dir(self.unit_dir(unit))
                self.watched.discard(unit)
            replies.append(reply)
        return {"units": replies}

    # -- the loop

    def handle_line(self, line: bytes) -> None:
        try:
            req = json.loads(line)
            rid, op = req["id"], req["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.out.append(dumps({"event": "error", "error": f"unreadable request {line[:200]!r}: {exc}"}))
            return
        method = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        try:
            if method is None:
                raise Refused(
                    f"unknown op {op!r}: agent version {VERSION} speaks hello, launch, signal, "
                    "list, forget; update the controller or the agent"
                )
            reply = {"id": rid, "ok": True, **method(req)}
        except Refused as exc:
            reply = {"id": rid, "ok": False, "error": str(exc)}
        except Exception as exc:
            import traceback  # only here: keeps the agent, which every supervisor copies, small

            traceback.print_exc()
            reply = {"id": rid, "ok": False, "error": f"agent error in {op}: {exc!r}; see the agent's log"}
        self.out.append(dumps(reply))

    def flush(self) -> None:
        data = b"".join(self.out)
        self.out.clear()
        while data:
            data = data[os.write(1, data) :]

    def serve(self) -> None:
        """Serve until stdin reaches EOF (the controller closed or died). Running jobs go on."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
        poller = select.poll()
        poller.register(0, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        pending = bytearray()
        next_watch = time.monotonic() + WATCH_INTERVAL
        while True:
            timeout = max(0.0, next_watch - time.monotonic()) * 1000 if self.watched else None
            ready = {fd for fd, _ev in poller.poll(timeout)}
            if wake_r in ready:
                drain(wake_r)
            if 0 in ready:
                data = os.read(0, 1 << 16)
                if not data:
                    return
                pending += data
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        self.handle_line(line)
            self.reap()
            if time.monotonic() >= next_watch:
                self.poll_watched()
                next_watch = time.monotonic() + WATCH_INTERVAL
            self.flush()


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def fork_supervisor(unit_dir: str, spec: dict, start_time: float) -> int:
    """Fork the unit's supervisor and return its pid. The child never returns from here.

    SUPERVISOR_SIGNALS are blocked across the fork and stay blocked in the child, which takes them
    with sigtimedwait: a `signal` request that arrives at once is held, not fatal to the supervisor.
    """
    old_mask = pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise
    if pid == 0:
        code = 70
        try:
            gc.disable()  # a short-lived copy: collections would only add copy-on-write faults
            signal.set_wakeup_fd(-1)  # the agent's wake-up pipe is not ours
            become_supervisor(unit_dir, spec, start_time, detach=True)
            code = 0
        finally:
            os._exit(code)  # never return into the agent's loop
    pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid


def take_spool_lock(spool: str, timeout: float) -> int:
    """Hold the spool's exclusive lock (one agent per spool); wait up to `timeout` seconds for it."""
    fd = os.open(os.path.join(spool, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise SystemExit(
                    fatal(
                        f"another agent (pid {holder}) is serving spool {spool}; stop it "
                        "(or wait for it to see its controller gone), then reconnect"
                    )
                )
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def fatal(message: str) -> int:
    """Tell the controller why this agent cannot serve; the exit code to use."""
    os.write(1, dumps({"event": "fatal", "error": message}))
    print(f"agent: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "exec":
        unit_dir = os.path.abspath(argv[1])
        spec = read_json(os.path.join(unit_dir, "spec.json"))
        if spec is None:
            print(f"agent exec: no spec.json in {unit_dir}; the controller writes it", file=sys.stderr)
            return 2
        signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
        become_supervisor(unit_dir, spec, time.time(), detach=False)
        return 0
    opts = dict(zip(argv[1::2], argv[2::2]))
    if not argv or argv[0] != "serve" or "--spool" not in opts or len(argv) % 2 != 1:
        print(
            "usage: agent.py serve --spool DIR [--host-name NAME] [--lock-timeout SECONDS]\n"
            "       agent.py exec SPOOL/UNIT",
            file=sys.stderr,
        )
        return 2
    spool = os.path.abspath(opts["--spool"])
    try:
        os.makedirs(spool, exist_ok=True)
    except OSError as exc:
        return fatal(f"cannot create spool {spool}: {exc.strerror}; choose a writable directory")
    lock_fd = take_spool_lock(spool, float(opts.get("--lock-timeout", 10)))
    try:
        Agent(spool, opts.get("--host-name") or os.uname().nodename).serve()
    except BrokenPipeError:
        pass  # the controller went away while we wrote: exit as on EOF
    os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

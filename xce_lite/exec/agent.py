#!/usr/bin/env python3
"""The xce_lite host agent and plain supervisor. ONE self-contained, standard-library-only file.

The controller copies this file to a host (by content hash) and runs it; it must never import
xce_lite or a third-party package. Two modes:

    python3 agent.py serve --spool DIR [--host-name NAME] [--lock-timeout SECONDS]
                           [--journal-limit BYTES]
    python3 agent.py exec UNIT_DIR

`serve` speaks JSON lines on stdin/stdout (one object per line, ASCII-only JSON so that lone
surrogates from os.environ survive). Requests `{"id": N, "op": OP, ...}` get exactly one reply
`{"id": N, "ok": true, ...}` or `{"id": N, "ok": false, "error": "..."}`. Unsolicited events carry no
id: `{"event": "finished", "unit": U, "result": {...}}`, and `{"event": "fatal", "error": "..."}`
just before the agent exits because it cannot serve (another agent holds the spool).
Ops: hello, launch, signal, list, forget (see the `op_*` methods).

`exec UNIT_DIR` supervises the job that UNIT_DIR/spec.json describes in this very process (for a
service manager that starts it) and writes UNIT_DIR/supervisor.pid and UNIT_DIR/result.json.

The spool of `serve` holds a fixed set of files, however many units come and go:
    .lock         the exclusive flock of the agent that serves the spool; its text is that pid
    journal       every unit's life as records appended one after the other (below); durable
    journal.new   a compacted journal being written, for a moment
    supervisor-errors.log   tracebacks of supervisors that failed (a bug), if any
There is no file per unit. Creating an inode was the dearest step of a launch on ext4 without a
journal, where each new inode pays a scan of the recently deleted ones (measured here: 0.4-0.5 ms
per created file, and a unit made four and a directory, and deleted them again), whereas an append
to an existing file costs some microseconds, and an append with fdatasync about 0.15 ms.
Nothing lives on a tmpfs (/dev/shm, $XDG_RUNTIME_DIR) either, though it would make inodes cheap:
logind removes a regular user's files there when their last session ends (RemoveIPC=yes, the
default; the runtime dir goes too) while the jobs run on, and a reboot empties it, so the fence
and the pids would vanish under running units. Measured here, too: unit directories on /dev/shm
plus one durable result file per unit on disk took ~25% more CPU than the journal, and more with
every run (the deleted result files), for the same rate.

A journal record is one line of ASCII JSON. A unit's records, in the order they are appended:
    {"event":"launched","unit":U,"start_time":T}        by the agent, BEFORE it forks the supervisor
    {"event":"started","unit":U,"pid":P,"starttime":S,"boot":B,"job":J}
                by the supervisor once the job runs, before it lets go of the agent's spool lock:
                its pid, its /proc start time (field 22 of /proc/PID/stat, which defends against pid
                reuse), the boot id (a pid of another boot means nothing) and the job's pid, which is
                also its process group (a member of the supervisor's session)
    {"event":"kill_requested","unit":U,"reason":R}      by the agent, before it signals the supervisor
    {"event":"finished","unit":U,"result":{...}}        by the supervisor however the job ended,
                fdatasync'ed before it exits; or by the agent (fdatasync'ed) when the supervisor is lost
    {"event":"forgotten","units":[U,...]}               by the agent, on `forget`
and the first line of every journal file is {"event":"journal","version":1}. Each record is ONE
write(2) to the file opened O_APPEND (the kernel never interleaves two), of newline + JSON +
newline: a record cut short (a writer killed in mid-write, an OS crash) is then a line of its own,
which readers skip, never glued to the next one. Readers take lines up to the last newline only.

The agent keeps the fold of the journal in memory (one Unit per launched, not yet forgotten unit)
and reads what others appended when it needs to know. Once the journal outgrows --journal-limit
(default 1 MiB), the agent compacts it: the live units' records go to journal.new, which is
fsynced and renamed over the journal, and the directory fsynced. It holds an exclusive flock on
the old file meanwhile; supervisors append under a shared flock and check that the file they hold
is the one the path names, so nothing is ever appended to a file that was renamed away.

Invariants:
- A unit runs at most once: it is known from its `launched` record to its `forgotten` one, and a
  launch of a known unit is adopted (reported running or finished), never started again.
  `launched` is appended before the fork, so whoever reads the journal after a crash knows the unit.
- One agent per spool: `serve` holds an exclusive flock on SPOOL/.lock. A forked supervisor shares
  that lock until it has appended `started`, so a new agent never sees a unit whose supervisor is
  alive but not recorded (which it would misreport as "supervisor lost").
- The agent is single-threaded, so os.fork is safe; a job costs a fork of this small process, never
  a new interpreter. The agent never touches running jobs when it exits (on stdin EOF).
- The supervisor records a result however the job ends. A unit with no result and no live
  supervisor (none forked by this agent, none recorded in `started` that is still alive in this
  boot) has lost its supervisor: killed -9, crashed, or the host restarted. Whoever notices appends
  a result saying so (exit_code null); the FIRST `finished` record of a unit is its result, so a
  real result is never overwritten and every later answer is the same.
- A result is durable before the agent reports it (finished event, launch reply, list reply): the
  supervisor fdatasyncs its record before it exits, so a result whose supervisor exited with status
  0 is durable; for any other, the agent fdatasyncs the journal before it writes the line.
- `launched`, `started`, `kill_requested` and `forgotten` are not fsynced (no more than the unit
  directories and pid files they replace were): they survive any process's crash, and an OS crash
  once the kernel has written them back (within about 30 s). After a reboot every unit of the old
  boot without a result is reported lost ("the host restarted"), never started again; a forgotten
  unit may come back as finished, and is forgotten again.
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
JOURNAL = "journal"
JOURNAL_VERSION = 1
JOURNAL_LIMIT = 1 << 20  # bytes: a journal that grows past this is compacted

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


def boot_id() -> str:
    """This boot's random id: a pid and start time recorded in another boot name no process now."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def write_file(path: str, data: bytes, durable: bool = False) -> None:
    """Replace `path` atomically (tmp + rename); with `durable`, fsync the data and the directory."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data, tmp)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path))


def write_all(fd: int, data: bytes, path: str) -> None:
    """One write(2) of all of `data`. On a regular file a short write means the disk is full."""
    if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, "short write: no space left on the device?", path)


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


# ---------------------------------------------------------------- the journal (see the docstring)


def record(event: str, **fields: object) -> bytes:
    """One journal record as it is written: newline, ASCII JSON, newline."""
    return b"\n" + dumps({"event": event, **fields})


def parse_records(data: bytes, offset: int):
    """Yield (record, offset just past it) for each readable line of `data`, read at `offset`.

    `data` must end at a newline; empty lines and lines that are not a JSON object (a record torn
    by a crash) are skipped.
    """
    end = offset
    for line in data.split(b"\n"):
        end += len(line) + 1
        if line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec, end


def append_shared(path: str, data: bytes, sync: bool) -> None:
    """Append records to the journal from a process that does not compact it (a supervisor).

    Under a shared flock, and to the file that the path names at that moment: the agent renames a
    compacted journal over the path while it holds an exclusive flock on the old one, so a writer
    that opened the old file finds out here and writes to the new one. With `sync`, the records
    are on disk (fdatasync) when this returns, and so is the file's name if this made the file
    (only if someone removed the journal under running jobs).
    """
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            held, named = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                continue  # compacted since we opened it
            write_all(fd, data, path)
            if sync:
                os.fdatasync(fd)
                if held.st_size == 0:
                    fsync_dir(os.path.dirname(path))
            return
        finally:
            os.close(fd)


class JournalRecorder:
    """Where a supervisor forked by `serve` records its unit: the spool's journal."""

    def __init__(self, spool: str, unit: str, boot: str):
        self.spool, self.unit, self.boot = spool, unit, boot
        self.path = os.path.join(spool, JOURNAL)

    def started(self, pid: int, starttime: int, start_time: float, job: int) -> None:
        data = record("started", unit=self.unit, pid=pid, starttime=starttime, boot=self.boot, job=job)
        append_shared(self.path, data, sync=False)

    def finished(self, result: dict) -> None:
        append_shared(self.path, record("finished", unit=self.unit, result=result), sync=True)

    def kill_reason(self) -> str | None:
        """The reason of this unit's last `kill_requested` since its last `launched` (this launch).

        The whole journal is read, so that a compaction in between cannot hide a record; it is
        done once per kill, and the journal is small (compacted past --journal-limit).
        """
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        name = json.dumps(self.unit).encode("ascii")
        launched, killed = b'"event":"launched","unit":' + name, b'"event":"kill_requested","unit":' + name
        reason = None
        for line in data.split(b"\n"):
            if launched in line:
                reason = None
            elif killed in line:
                try:
                    reason = json.loads(line)["reason"]
                except (ValueError, KeyError, TypeError):
                    pass
        return reason

    def error_log(self) -> str:
        return os.path.join(self.spool, "supervisor-errors.log")


class DirRecorder:
    """Where a supervisor run by `exec UNIT_DIR` records its unit: files in UNIT_DIR.

    supervisor.pid: "PID STARTTIME START_EPOCH" and, on line 2, the job's pid; result.json, written
    atomically and durably; kill_reason, read when the supervisor is asked to kill its job.
    """

    def __init__(self, unit_dir: str):
        self.unit_dir = unit_dir

    def started(self, pid: int, starttime: int, start_time: float, job: int) -> None:
        text = f"{pid} {starttime} {start_time!r}\n{job}\n"
        write_file(os.path.join(self.unit_dir, "supervisor.pid"), text.encode())

    def finished(self, result: dict) -> None:
        write_file(os.path.join(self.unit_dir, "result.json"), dumps(result), durable=True)

    def kill_reason(self) -> str | None:
        return read_text(os.path.join(self.unit_dir, "kill_reason"))

    def error_log(self) -> str:
        return os.path.join(self.unit_dir, "supervisor.log")


# ---------------------------------------------------------------- the supervisor


class JobEnded(Exception):
    """The job cannot start; `result` says why. Raised before any job process exists."""

    def __init__(self, result: dict):
        super().__init__(result["reason"])
        self.result = result


def become_supervisor(recorder, spec: dict, start_time: float, detach: bool) -> None:
    """Run the unit as its supervisor and record its result, whatever happens (even a bug here).
    Called with SUPERVISOR_SIGNALS blocked; they stay blocked for good: the supervisor takes them
    with sigtimedwait.

    Order matters: the job is started and `started` recorded while this process still holds the
    fds it inherited from the agent, the spool lock among them (see the module docstring); only
    then are they closed (with `detach`): the agent's pipes would hide EOF from the controller.
    The job itself inherits none of them: they are close-on-exec or replaced in spawn_job.
    """
    try:
        os.setsid()  # the job's group joins this session: how a lost supervisor's job is known
    except OSError:  # exec mode under a process-group leader (systemd): already detached enough
        pass
    watch = Watch(recorder, spec, start_time)
    try:
        try:
            watch.start()
        except JobEnded as ended:
            result = ended.result
        else:
            pid = os.getpid()
            recorder.started(pid, int(proc_stat(pid)[19]), start_time, watch.pid)
            if detach:
                os.closerange(0, 1 << 20)  # close_range(2) underneath: cheap whatever the fd limit
                null = os.open(os.devnull, os.O_RDWR)  # becomes fd 0
                os.dup2(null, 1)
                os.dup2(null, 2)
            result = watch.wait()
    except BaseException as exc:
        import traceback  # only here: keeps the agent, which every supervisor copies, small

        if watch.pid:
            watch.killpg(signal.SIGKILL)  # no job may run on once its result is written
        log = recorder.error_log()
        with open(log, "a") as f:
            f.write(f"supervisor of {spec.get('unit')} (pid {os.getpid()}):\n")
            traceback.print_exc(file=f)
        result = make_result(start_time, f"supervisor error: {exc!r} (see {log})")
    recorder.finished(result)


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
    failure as an exception here. The program is looked up in the JOB's PATH (its env's, or
    /bin:/usr/bin), like execvpe: glibc's posix_spawnp searches the PATH of this process, which is
    set to the job's first (a supervisor is a short-lived copy: its own environment serves no one
    else). As in a shell, a command not found ends the job with 127, one that cannot be executed
    with 126 (a permission error anywhere on the PATH beats a later "not found").
    """
    argv, env = spec["argv"], spec["env"]
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        raise JobEnded(make_result(start_time, f"cannot change directory to {spec['cwd']}: {exc.strerror}"))
    if "PATH" in env:
        os.environ["PATH"] = env["PATH"]
    else:
        os.environ.pop("PATH", None)
    try:
        return os.posix_spawnp(
            argv[0],
            argv,
            env,
            setpgroup=0,
            setsigmask=(),
            setsigdef=JOB_DEFAULT_SIGNALS,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, err, 2),
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            ],
        )
    except OSError as exc:
        reason = f"exec failed: {os.strerror(exc.errno)}: {argv[0]}"
        raise JobEnded(make_result(start_time, reason, exit_code=127 if exc.errno == errno.ENOENT else 126))


class Watch:
    """Runs one job and waits for it, enforcing its limits and acting on requested signals.

    The supervisor keeps SUPERVISOR_SIGNALS (SIGCHLD among them) blocked and waits in sigtimedwait
    with a timeout that is the nearest deadline (run limit, end of the grace period, next memory
    sample): no busy sleeps, no handlers, no wake-up pipe, and no signal can be missed between a
    check and the wait, because a blocked signal stays pending until it is taken.
    """

    def __init__(self, recorder, spec: dict, start_time: float):
        self.recorder, self.spec, self.start_time = recorder, spec, start_time
        self.reason: str | None = None  # the end reason once a kill has begun
        self.kill_at: float | None = None  # monotonic time to send KILL after TERM
        self.forwarded: set[int] = set()
        self.pid = 0

    def start(self) -> None:
        """Start the job (self.pid); JobEnded if it cannot start."""
        out, err = open_outputs(self.spec, self.start_time)
        try:
            self.pid = spawn_job(self.spec, out, err, self.start_time)
        finally:
            os.close(out)
            if err != out:
                os.close(err)

    def wait(self) -> dict:
        """Wait for the job to end, acting on limits and signals meanwhile; its result."""
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
        text = self.recorder.kill_reason()
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


class Unit:
    """What the journal says of one unit: one launch of it, from `launched` until `forgotten`."""

    __slots__ = ("boot", "durable", "job", "kill", "pid", "result", "result_end", "start_time", "starttime")

    def __init__(self, start_time: float | None):
        self.start_time = start_time
        self.pid: int | None = None  # the supervisor, once `started`
        self.starttime: int | None = None
        self.boot: str | None = None
        self.job: int | None = None
        self.kill: str | None = None  # the last kill reason requested
        self.result: dict | None = None
        self.result_end = 0  # where its `finished` record ends in the journal file
        self.durable = False  # the result is known to be on disk (besides result_end <= synced)


def fold(units: dict[str, Unit], data: bytes, offset: int) -> None:
    """Apply the journal records in `data` (read at `offset`, ending at a newline) to `units`."""
    for rec, end in parse_records(data, offset):
        try:
            event = rec["event"]
            if event == "launched":
                units[rec["unit"]] = Unit(rec["start_time"])
            elif event == "forgotten":
                for name in rec["units"]:
                    units.pop(name, None)
            elif event != "journal":
                u = units.get(rec["unit"])
                if u is None:
                    continue  # cannot happen: a unit's records come between launched and forgotten
                if event == "started":
                    u.pid, u.starttime, u.boot, u.job = rec["pid"], rec["starttime"], rec["boot"], rec["job"]
                elif event == "kill_requested":
                    u.kill = rec["reason"]
                elif event == "finished" and u.result is None:  # the first result is the result
                    u.result, u.result_end, u.durable = rec["result"], end, False
        except (KeyError, TypeError, AttributeError):
            continue  # not a record this agent wrote or knows: skipped like a torn one


def read_journal(spool: str) -> dict[str, Unit]:
    """The units SPOOL's journal knows, read-only (for tools; a serving agent keeps its own fold)."""
    units: dict[str, Unit] = {}
    try:
        with open(os.path.join(spool, JOURNAL), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return units
    fold(units, data[: data.rfind(b"\n") + 1], 0)
    return units


class Agent:
    """The serve loop. Single-threaded: requests, SIGCHLD and the watch timer share one poll()."""

    def __init__(self, spool: str, host_name: str, journal_limit: int = JOURNAL_LIMIT):
        self.spool, self.host_name = spool, host_name
        self.boot = boot_id()
        self.out: list[bytes] = []  # lines to write at the end of this loop turn
        self.children: dict[int, str] = {}  # supervisor pid -> unit, for supervisors forked here
        self.child_units: dict[str, tuple[int, float]] = {}  # unit -> (pid, start_time), the same
        self.watched: set[str] = set()  # running units adopted from a previous agent: polled
        self.units: dict[str, Unit] = {}  # the fold of the journal
        self.journal_path = os.path.join(spool, JOURNAL)
        self.base_limit = self.journal_limit = journal_limit
        self.offset = 0  # bytes of the journal file read and applied
        self.synced = 0  # bytes of the journal file known to be on disk
        self.need_sync = False  # a result about to be reported may not be on disk yet
        self.jfd = self.open_journal()
        self.catch_up()
        self.sync()  # whatever earlier agents and supervisors left is durable before it is reported

    # -- the journal

    def open_journal(self) -> int:
        """Open the journal for appending and reading; a new one is made durable, name included
        (with the spool's own name: fdatasync'ed records are worth nothing in a file that an OS
        crash can unlink)."""
        fd = os.open(self.journal_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if os.fstat(fd).st_size == 0:
            write_all(fd, record("journal", version=JOURNAL_VERSION), self.journal_path)
            os.fsync(fd)
            fsync_dir(self.spool)
            fsync_dir(os.path.dirname(self.spool))
        return fd

    def append(self, data: bytes, sync: bool = False) -> None:
        """Append the agent's own records, then apply everything new. No flock: only the agent
        replaces the file, so its fd always names the journal."""
        write_all(self.jfd, data, self.journal_path)
        if sync:
            end = os.lseek(self.jfd, 0, os.SEEK_CUR)  # just past our write
            os.fdatasync(self.jfd)
            self.synced = max(self.synced, end)
        self.catch_up()

    def sync(self) -> None:
        """Make everything appended so far durable."""
        size = os.fstat(self.jfd).st_size
        os.fdatasync(self.jfd)
        self.synced = max(self.synced, size)
        self.need_sync = False

    def catch_up(self) -> None:
        """Apply the records appended since the last call (up to the last complete line)."""
        size = os.fstat(self.jfd).st_size
        if size <= self.offset:
            return
        data = os.pread(self.jfd, size - self.offset, self.offset)
        end = data.rfind(b"\n") + 1
        fold(self.units, data[:end], self.offset)
        self.offset += end

    def maybe_compact(self) -> None:
        """Rewrite the journal as the live units' records once it has grown past the limit."""
        if self.offset < self.journal_limit:
            return
        old = self.jfd
        try:
            fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a supervisor is appending: try again next turn
        tmp, fd = self.journal_path + ".new", -1
        try:
            self.catch_up()
            data = self.live_records()
            fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            write_all(fd, data, tmp)
            os.fsync(fd)
            os.rename(tmp, self.journal_path)  # from here on, fd is the journal
            self.jfd, fd = fd, -1
            self.offset, self.synced = len(data), 0  # offsets now are the new file's
            self.journal_limit = max(self.base_limit, 2 * len(data))
            fsync_dir(self.spool)
            self.synced = len(data)
            for u in self.units.values():
                u.durable = True  # its result, if it has one, is in the fsynced file
        except OSError as exc:
            self.journal_limit = 2 * self.offset  # not at every turn: the spool may be full
            print(f"agent: cannot compact {self.journal_path}: {exc}; it grows meanwhile", file=sys.stderr)
            if fd >= 0:
                os.close(fd)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        finally:
            fcntl.flock(old, fcntl.LOCK_UN)
            if old != self.jfd:
                os.close(old)

    def live_records(self) -> bytes:
        parts = [record("journal", version=JOURNAL_VERSION)]
        for name, u in self.units.items():
            parts.append(record("launched", unit=name, start_time=u.start_time))
            if u.pid is not None:
                parts.append(
                    record("started", unit=name, pid=u.pid, starttime=u.starttime, boot=u.boot, job=u.job)
                )
            if u.kill is not None:
                parts.append(record("kill_requested", unit=name, reason=u.kill))
            if u.result is not None:
                parts.append(record("finished", unit=name, result=u.result))
        return b"".join(parts)

    # -- unit state

    def unit_status(self, unit: str) -> tuple[str, float | None, dict | None, int | None] | None:
        """(status, start_time, result, supervisor pid) of a unit, or None if it is not known.

        The caller has caught up with the journal. A unit with no result and no live supervisor
        lost its supervisor: this records the result that says so.
        """
        u = self.units.get(unit)
        if u is None:
            return None
        if u.result is None and unit in self.child_units:
            pid, start_time = self.child_units[unit]
            return "running", start_time, None, pid
        if u.result is None and u.pid and u.boot == self.boot and is_alive(u.pid, u.starttime):
            return "running", u.start_time, None, u.pid
        if u.result is None:
            self.catch_up()  # it may have ended since we looked
        if u.result is None:
            self.record_lost(unit, u)
        return "finished", u.result.get("start_time"), u.result, None

    def record_lost(self, unit: str, u: Unit) -> None:
        """Record (durably) the result of a unit whose supervisor died, or whose host restarted.

        The job's remaining processes are killed, so that nothing runs unsupervised. The job's
        process group is recognised by its session, the dead supervisor's pid: the kernel does not
        reuse a pid while a session or group of that number exists.
        """
        if u.pid and u.boot != self.boot:
            reason = "supervisor lost: the host restarted while the job ran, so its exit status is unknown"
        else:
            reason = "supervisor lost: it was killed or crashed, so the job's exit status is unknown"
            fields = proc_stat(u.job) if u.job else None
            if fields is not None and fields[2] == str(u.job).encode() and fields[3] == str(u.pid).encode():
                try:
                    os.killpg(u.job, signal.SIGKILL)
                    reason += "; its remaining processes were killed"
                except ProcessLookupError:
                    pass
        result = make_result(u.start_time or time.time(), reason)
        self.append(record("finished", unit=unit, result=result), sync=True)

    def reported(self, unit: str, result: dict) -> dict:
        """`result` of `unit`, about to go out: make sure it is on disk before the line is written."""
        u = self.units.get(unit)
        if u is not None and not u.durable and u.result_end > self.synced:
            self.need_sync = True
        return result

    def emit_finished(self, unit: str, result: dict) -> None:
        self.out.append(dumps({"event": "finished", "unit": unit, "result": self.reported(unit, result)}))

    def report_if_finished(self, unit: str) -> bool:
        """Emit `finished` for the unit if it has ended; True if it is no longer running."""
        status = self.unit_status(unit)
        if status is not None and status[0] == "finished":
            self.emit_finished(unit, status[2])
        return status is None or status[0] == "finished"

    def reap(self) -> None:
        """Collect every exited supervisor forked here and report its unit (gone if forgotten)."""
        reaped = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            unit = self.children.pop(pid, None)
            if unit is not None and self.child_units[unit][0] == pid:  # not a forgotten launch's
                del self.child_units[unit]
                reaped.append((unit, status))
        if not reaped:
            return
        self.catch_up()
        for unit, status in reaped:
            u = self.units.get(unit)
            if status == 0 and u is not None and u.result is not None:
                u.durable = True  # a supervisor exits 0 only once its result is fdatasync'ed
            self.report_if_finished(unit)

    def poll_watched(self) -> None:
        self.catch_up()
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
        self.catch_up()
        return {"replies": [self.launch_one(u) for u in req.get("units", [])]}

    def launch_one(self, u: dict) -> dict:
        """Start one unit, or adopt it if the journal knows it (a unit never runs twice)."""
        unit = u.get("unit") if isinstance(u, dict) else None
        reply = {"unit": unit, "status": "refused", "start_time": None, "error": None}
        try:
            validate(u)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        if unit in self.units:
            return self.adopt(unit, reply, self.unit_status(unit))
        start_time = time.time()
        spec = {
            k: u.get(k)
            for k in ("unit", "argv", "env", "cwd", "stdout", "stderr", "run_limit", "mem_limit", "grace")
        }
        spec["start_time"] = start_time
        if spec["grace"] is None:
            spec["grace"] = 10.0
        try:
            self.append(record("launched", unit=unit, start_time=start_time))
        except OSError as exc:
            reply["error"] = f"cannot write {self.journal_path}: {exc.strerror}; check the spool's file system"
            return reply
        try:
            pid = fork_supervisor(JournalRecorder(self.spool, unit, self.boot), spec, start_time)
        except OSError as exc:
            self.append(record("forgotten", units=[unit]))  # nothing started: it may be launched again
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
            reply["result"] = self.reported(unit, result)
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
        self.catch_up()
        status = self.unit_status(unit)
        if status is None or status[0] != "running":
            return {"found": False}
        self.append(record("kill_requested", unit=unit, reason=str(req.get("reason") or "")))
        signum = signal.SIGTERM if name == "TERM" else signal.SIGRTMIN + REQUEST_NAMES.index(name)
        try:
            os.kill(status[3], signum)
        except ProcessLookupError:
            return {"found": False}
        return {"found": True}

    def op_list(self, req: dict) -> dict:
        self.catch_up()
        units = []
        for unit in sorted(self.units):
            state, start_time, result, _pid = self.unit_status(unit)
            if state == "running" and unit not in self.child_units:
                self.watched.add(unit)
            if result is not None:
                self.reported(unit, result)
            units.append({"unit": unit, "status": state, "start_time": start_time, "result": result})
        return {"units": units}

    def op_forget(self, req: dict) -> dict:
        self.catch_up()
        replies, gone = [], []
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
                if unit in self.units and unit not in gone:
                    gone.append(unit)
                self.watched.discard(unit)
            replies.append(reply)
        if gone:
            self.append(record("forgotten", units=gone))
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
        """Write this turn's lines, once every result they carry is on disk."""
        if self.need_sync:
            self.sync()
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
            self.maybe_compact()
            self.flush()


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def fork_supervisor(recorder: JournalRecorder, spec: dict, start_time: float) -> int:
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
            become_supervisor(recorder, spec, start_time, detach=True)
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


USAGE = (
    "usage: agent.py serve --spool DIR [--host-name NAME] [--lock-timeout SECONDS] [--journal-limit BYTES]\n"
    "       agent.py exec UNIT_DIR"
)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "exec":
        unit_dir = os.path.abspath(argv[1])
        spec = read_json(os.path.join(unit_dir, "spec.json"))
        if spec is None:
            print(f"agent exec: no spec.json in {unit_dir}; the controller writes it", file=sys.stderr)
            return 2
        signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
        become_supervisor(DirRecorder(unit_dir), spec, time.time(), detach=False)
        return 0
    opts = dict(zip(argv[1::2], argv[2::2]))
    if not argv or argv[0] != "serve" or "--spool" not in opts or len(argv) % 2 != 1:
        print(USAGE, file=sys.stderr)
        return 2
    # Jobs inherit the fds of their supervisor, a fork of this process, that are not close-on-exec:
    # keep none but stdin, stdout and stderr (which every job gets replaced).
    os.closerange(3, 1 << 20)
    spool = os.path.abspath(opts["--spool"])
    try:
        os.makedirs(spool, exist_ok=True)
    except OSError as exc:
        return fatal(f"cannot create spool {spool}: {exc.strerror}; choose a writable directory")
    lock_fd = take_spool_lock(spool, float(opts.get("--lock-timeout", 10)))
    try:
        limit = int(opts.get("--journal-limit", JOURNAL_LIMIT))
        agent = Agent(spool, opts.get("--host-name") or os.uname().nodename, limit)
    except OSError as exc:
        return fatal(f"cannot use the journal in spool {spool}: {exc}; check the spool's file system")
    try:
        agent.serve()
    except BrokenPipeError:
        pass  # the controller went away while we wrote: exit as on EOF
    os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""The xce_lite host agent and plain supervisor. ONE self-contained, standard-library-only file.

The controller copies this file to a host (by content hash) and runs it; it must never import
xce_lite or a third-party package. Started from source, `serve` first execs itself again from
this file's bytecode in SPOOL/bin (run_as_bytecode: same pid, same pipes). Commands:

    python3 -S -E agent.py serve --spool DIR [--host-name NAME] [--mode auto|systemd|user|plain]
                    [--lock-timeout SECONDS] [--journal-limit BYTES]
    python3 -S -E agent.py exec UNIT_DIR     the supervisor, as a supervised systemd unit's main process
    python3 -S -E agent.py pre UNIT_DIR      its ExecStartPre, with pre hooks: runs them
    python3 -S -E agent.py post UNIT_DIR     its ExecStopPost: runs the post hooks, records THE result
    python3 -S -E agent.py launch -- CMD...  inside a job: `xce launch` (SPOOL/bin/xce runs this)

PROTOCOL (version 2). `serve` speaks JSON lines on stdin/stdout (one object per line, ASCII-only
JSON so that lone surrogates from os.environ survive). Requests `{"id": N, "op": OP, ...}` get
exactly one reply `{"id": N, "ok": true, ...}` or `{"id": N, "ok": false, "error": "..."}`; events
an op causes come after its reply. Ops:
    hello -> version, hostname, host_name, cpus, mem (bytes), pid, spool, mode (the one in use),
             modes {systemd|user|plain: {ok, why (what is missing, and the fix), memory ("systemd"
             or "supervisor": who enforces mem_limit; "memory_why" says why not systemd), direct
             (jobs can be their unit's main process; "direct_why" says why not)}},
             load [1, 5, 15 min], gpus [{index, name, memory (bytes)}] (nvidia-smi; [] without),
             cgroup ("v1", "v2", "hybrid" or null), systemd (the manager's version or null), user,
             uid, boot_id, python (its version)
    ping -> time (the host's clock): cheap, for heartbeats
    launch {units: [UNIT]} -> replies: [{unit, status "started"|"running"|"finished"|"refused",
             start_time, error, result (when finished)}], in order, at once (a systemd unit is
             "started" once its `launched` is journaled; systemd is asked after the reply).
             UNIT: {unit, argv, env, cwd, stdout, stderr (null: into stdout), run_limit (s),
             mem_limit (bytes), grace (s between TERM and KILL; default 10), role ("job": runs argv,
             the default; "host": a secondary host's unit of a multi-host job, which runs no command,
             holds the allocation until signalled and runs tasks; argv may be empty), hostfile
             (text, written to XCE_JOB_HOST_DIR/hostfile; XCE_HOSTFILE names it), hooks ([{point
             (pre_host_exec, pre_job_exec, post_job_exec, post_host_exec), layer ("profile": run with
             profile_env; "job": with env), argv, timeout (s)}], in run order: see HOOKS), profile_env,
             post_failure ("record", the default, or "exit"), starter (the job starter: before each
             task's argv too)}. Null or missing optional fields keep version 1's behaviour.
    signal {unit, signal (TERM KILL INT HUP USR1 USR2 STOP CONT), reason} -> found. TERM and KILL
             end the job (TERM, then KILL after its grace) with `reason` as the result's reason;
             STOP/CONT suspend and resume the job's (and tasks') groups; the same in every mode.
    list -> units: [{unit, status "running"|"finished", start_time, result}]
    forget {units: [U]} -> units: [{unit, ok, error}]: drop finished units (refused for running ones)
    read {path, offset (0), max (<= 1 MiB)} -> data_b64, offset (the new one), size, eof: for
             `xce peek`; a missing or unreadable file is an error that says so
    tasks {unit, launch_id, tasks: [{index (global task index), argv, env, cwd}]} -> accepted: the
             unit's supervisor starts them inside the unit (its session, its cgroup under systemd,
             killed with it); their output is appended to the unit's stdout and stderr files
    launch_done {launch_id, exit_code} -> delivered: answers the `xce launch` waiting for it (kept
             for it if it is not connected now)
Events (no id):
    {"event": "finished", "unit", "result": RESULT}
    {"event": "launch_requested", "launch_id", "unit", "argv", "env", "cwd"}: a job ran `xce launch`
    {"event": "task_finished", "unit", "launch_id", "index", "exit_code", "signal", "error"}
             (error: why it never started, else null)
    {"event": "fatal", "error"} just before the agent exits because it cannot serve (another agent
             holds the spool; an explicit --mode this host cannot do)
    {"event": "error", "error"} for a line that is not a request
RESULT: {exit_code (null if killed by a signal), signal, start_time, end_time, cpu_time, max_rss,
    reason ("killed by alice", "run limit 00:10:00 reached", "memory limit 2G exceeded",
    "exec failed: ...", "systemd refused the unit: ...", "supervisor lost: ...", "lost: ..."),
    service_result (systemd's $SERVICE_RESULT; null in plain mode), mode, and with hooks: hooks (each
    run: {point, layer, ok, exit_code, signal, timed_out, stopped, error, timeout, seconds}) and note
    (post hooks that failed, when they do not fail the job)}. cpu_time and max_rss are
    wait4's (the job and its waited-for descendants; the largest process) under a supervisor, the
    unit's cgroup's (all its processes, page cache included in memory) in a direct unit.

MODES. `auto` picks systemd system units (root, and systemd is PID 1 of this host: /run/systemd/
system exists and the manager answers) over user units (a lingering user manager reachable through
$XDG_RUNTIME_DIR, /run/user/UID when unset) over plain; an explicit mode the host cannot do is
fatal. In plain mode the agent forks a supervisor per unit (below). Under systemd each unit is one
transient service of its name, which the agent asks the manager for itself, over D-Bus on the
manager's private socket (class Bus: StartTransientUnit, StopUnit, KillUnit, ListUnitsByNames,
AttachProcessesToUnit; no systemd-run, no systemctl): Type=exec, CollectMode=inactive-or-failed,
TimeoutStopSec (which also bounds its ExecStopPost: the grace, at least STOP_MARGIN, in a direct unit;
grace + STOP_MARGIN under a supervisor, which KILLs after the grace itself), RuntimeMaxSec=<run_limit>,
MemoryMax=<mem_limit> (MemorySwapMax=0 on cgroup v2) where systemd enforces memory. Two kinds:

DIRECT units, the rule: the job is the unit's main process, with no Python in the unit.
    ExecStart=/bin/sh SPOOL/bin/unit-exec-H.sh ARGC    rebuilds the job's argv and execs it (same pid)
    ExecStopPost=-/bin/sh SPOOL/bin/unit-stop-H.sh UNIT START_TIME MODE RUN_LIMIT MEM_LIMIT BOOT
with KillMode=control-group, Delegate=yes, MemoryAccounting, WorkingDirectory,
Environment= (the job's env, and its argv as XCE_ARGV_0.., which the exec script drops),
StandardOutput/StandardError=append:PATH and IgnoreSIGPIPE=no. Command lines hold only checked
paths, names and numbers: systemd 252 expands $VAR in them and writes them back for a
daemon-reload in a form it reads back wrong (see EXEC_SCRIPT); the Environment= it keeps exact. The
stop script (STOP_SCRIPT: shell builtins, flock and sync) appends THE `finished` record however the
unit ended: exit code or signal ($EXIT_CODE, $EXIT_STATUS), $SERVICE_RESULT, CPU time and peak
memory from the unit's cgroup (v1 or v2), and the reason, worded as the supervisor words it (memory
limit from the OOM counter, the kill reason the agent wrote to UNIT_DIR/kill_reason before it asked
systemd to stop the unit, run limit on `timeout`, "killed by signal ..."), fdatasync'ed, under the
journal's shared lock. Before asking systemd, the agent checks what the supervisor would report as
the job's failure to start (its output files, its program on the job's PATH: "exec failed") and
records that result instead. A kill is StopUnit (TERM to every process of the unit, KILL after
TimeoutStopSec; a start job still waiting is cancelled, and nothing runs) or KillUnit (KILL, and
the other signals, to all its processes; held until the unit's start job is over); suspend and
resume are KillUnit STOP and CONT. Tasks of `xce launch` get a supervisor of their own, forked here
and moved into the unit (AttachProcessesToUnit, which needs Delegate=yes), so they share its
cgroup, limits and end.

SUPERVISED units, where a job needs a process of ours: a host unit (role "host": it runs no
command, holds the allocation and runs tasks), a memory limit systemd cannot enforce (user units on
cgroup v1: the supervisor's RSS watch does), a unit with hooks (see HOOKS: its steps are Python
anyway, and `post` merges the supervisor's result with theirs), a job whose argv, env or paths
D-Bus cannot carry (not UTF-8, an env name systemd refuses), and hosts without flock or sync.
    [ExecStartPre=PYTHON -S -E AGENT.pyc pre UNIT_DIR]   (with pre hooks)
    ExecStart=PYTHON -S -E AGENT.pyc exec UNIT_DIR    (KillMode=mixed)
    ExecStopPost=-/bin/sh -c "test ! -d UNIT_DIR || exec PYTHON -S -E AGENT.pyc post UNIT_DIR"
(AGENT.pyc: this file compiled into SPOOL/bin). The job's argv and env are in UNIT_DIR/spec.json,
and the python, agent and spool paths are checked to hold nothing systemd would expand or split.
Inside the unit the same supervisor as in plain mode runs the job and appends `started`. When the
job ends by itself (no kill, no limit, no OOM kill), the supervisor appends THE `finished` record
(service_result "success": it exits 0), fdatasync'ed, and removes UNIT_DIR. Otherwise it leaves
its result in UNIT_DIR/result.json, and `post`, which systemd runs however the unit ended (the
shell test above finds UNIT_DIR still there), merges it (or nothing, if the supervisor was
SIGKILLed) with $SERVICE_RESULT, $EXIT_CODE, $EXIT_STATUS, the unit's OOM counter and the requested
kill reason, and appends THE `finished` record, fdatasync'ed; then it removes UNIT_DIR. Either pokes
the agent through SPOOL/agent.sock. Signals go to the supervisor, held until its `started` record;
a kill before it (its pre hooks may run) is StopUnit.

In both, RuntimeMaxSec enforces the run limit (the supervisor does not: one reason, not two racing),
MemoryMax the memory limit where systemd can (not user units on cgroup v1, where it is ignored
without a word, as hello's modes say). The agent never waits for the manager: calls are answered,
and the manager's UnitRemoved signals come (it sends every signal to every private connection),
on the same poll() as everything else. A call systemd refuses is the unit's finished result
("systemd refused the unit: ..."). A unit with no result runs while its supervisor does, while its
start is unanswered, or while systemd knows it (it said so, and its UnitRemoved has not come; or
ListUnitsByNames says loaded and active, activating, deactivating or with a job), or for START_GRACE
after its launch by another agent, whose call systemd may not have read yet.

HOOKS run in the step runner (run_hooks): in plain mode inside the supervisor, under systemd as the
unit's `pre` (ExecStartPre) and `post` (ExecStopPost) steps of a supervised unit. Each is a process
group of its own, never through a shell, with its output after a header line in the job's files,
bounded by its timeout (then TERM, KILL after HOOK_KILL_GRACE). Pre hooks run in order until one
fails (non-zero, a signal, its timeout, or it cannot start): then the job does not run and that
failure is the result's reason; a kill stops them (the reason is the kill's). The post hooks all
run, once, however the job ended, with its status in their env; those that fail are the result's
note, or its reason with post_failure "exit" when it has none. Under systemd the unit's
TimeoutStartSec covers its pre hooks and its TimeoutStopSec (which also bounds the stop of its
main process) its post hooks, so that systemd never cuts a step short.

JOBS get, besides their env: XCE_UNIT, XCE_JOB_HOST_DIR (SPOOL/units/UNIT: made by the supervisor
in plain mode, by the agent under systemd, where spec.json, result.json, kill_reason and
tasks-*.json live too; removed once the unit's result is durable), XCE_LAUNCH_SOCKET, XCE_HOSTFILE
(with a hostfile) and SPOOL/bin at the end of PATH; in a direct unit also what systemd gives every
service (INVOCATION_ID, SYSTEMD_EXEC_PID; a user manager's HOME, USER, XDG_RUNTIME_DIR...) unless
the job's env sets the same names. `xce launch -- CMD` (launch_tasks()) sends {"op": "launch", "unit",
"argv", "env", "cwd"} to SPOOL/agent.sock and blocks; the agent answers {"launch_id"} and emits
launch_requested; the controller sends `tasks` to each host of the job and, when every task has
ended, `launch_done` here, which answers {"exit_code"}. An `xce launch` whose agent goes away asks
the next one with {"op": "launch_wait", "launch_id"}. Supervisors and `post` send {"op": "poke"}.

SPOOL. The spool of `serve` holds a fixed set of files, however many units come and go:
    .lock         the exclusive flock of the agent that serves the spool; its text is that pid
    journal       every unit's life as records appended one after the other (below); durable
    journal.new   a compacted journal being written, for a moment
    agent.sock    the agent's socket for jobs and supervisors (0600)
    bin/          the `xce` shim, this agent compiled for units and the unit scripts (systemd modes)
    units/        each running unit's host directory (XCE_JOB_HOST_DIR)
    supervisor-errors.log   tracebacks of supervisors that failed (a bug), if any
The agent itself creates no file per unit in plain mode. Creating an inode was the dearest step of
a launch on ext4 without a journal, where each new inode pays a scan of the recently deleted ones
(measured here: 0.4-0.5 ms per created file), whereas an append to an existing file costs some
microseconds, and an append with fdatasync about 0.15 ms: the host directory is made (and removed)
by the supervisor, beside the agent, off its serial path. Nothing lives on a tmpfs (/dev/shm,
$XDG_RUNTIME_DIR) either: logind removes a regular user's files there when their last session
ends (RemoveIPC=yes, the default) while the jobs run on, and a reboot empties it, so the fence and
the pids would vanish under running units.

A journal record is one line of ASCII JSON. A unit's records, in the order they are appended:
    {"event":"launched","unit":U,"start_time":T[,"mode":M][,"direct":D]}   by the agent, BEFORE it
                forks the supervisor or asks systemd (mode: "systemd" or "user"; none: plain; D: a
                direct unit's {"stdout", "stderr", "grace"}, for its tasks' supervisors)
    {"event":"started","unit":U,"pid":P,"starttime":S,"boot":B,"job":J}
                by the supervisor once the job runs, before it lets go of the agent's spool lock:
                its pid, its /proc start time (field 22 of /proc/PID/stat, which defends against pid
                reuse), the boot id (a pid of another boot means nothing) and the job's pid, which is
                also its process group (a member of the supervisor's session; 0 for a "host" unit);
                a plain supervisor with hooks appends it first with job 0, before its pre hooks
    {"event":"kill_requested","unit":U,"reason":R}      by the agent, before it signals the supervisor
    {"event":"task_finished","unit":U,"launch_id":L,"index":I,"exit_code":C,"signal":S,"error":E}
                by the supervisor, as each task of `xce launch` ends
    {"event":"finished","unit":U,"result":{...}}        by the supervisor, `post` or the stop script
                however the job ended, fdatasync'ed before it exits; or by the agent (fdatasync'ed)
                when the supervisor is lost, the job cannot start or systemd refused the unit
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
  `launched` is appended before the fork (or the call to systemd), so whoever reads the journal
  after a crash knows the unit; under systemd the unit name is systemd's too, and a second
  StartTransientUnit of it fails.
- One agent per spool: `serve` holds an exclusive flock on SPOOL/.lock. A forked supervisor shares
  that lock until it has appended `started`, so a new agent never sees a plain unit that is alive
  but not visible (which it would misreport as "supervisor lost"); a systemd unit another agent
  launched is not judged lost before START_GRACE has passed (that agent's call may be in flight).
- The agent is single-threaded, so os.fork is safe; a plain job costs a fork of this small process,
  never a new interpreter. The agent never touches running jobs when it exits (on stdin EOF); it
  first waits for systemd's answer to the starts it has asked for.
- The supervisor records a result however the job ends, and so do `post` and the stop script
  however a unit ends. A unit with no result and nothing that runs it (no live supervisor forked
  here or recorded in `started` in this boot; under systemd, a unit systemd no longer knows) is lost:
  killed -9, crashed, or the host restarted. Whoever notices appends a result saying so
  (exit_code null); the FIRST `finished` record of a unit is its result, so a real result is never
  overwritten and every later answer is the same.
- A result is durable before the agent reports it (finished event, launch reply, list reply): the
  supervisor fdatasyncs its record before it exits, so a result whose supervisor exited with status
  0 is durable, and so is one that `post` poked about (it says up to where it fdatasync'ed); for
  any other (the stop script's among them: it cannot poke), the agent fdatasyncs the journal
  before it writes the line.
- `launched`, `started`, `kill_requested`, `task_finished` and `forgotten` are not fsynced: they
  survive any process's crash, and an OS crash once the kernel has written them back (within about
  30 s). After a reboot every unit of the old boot without a result is reported lost ("the host
  restarted"), never started again; a forgotten unit may come back as finished, and is forgotten
  again.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import sys
import time

import _struct  # the C module under `struct`: D-Bus marshalling

# The C modules under `signal` and `json`: their Python wrappers import enum and re, some 15 ms of
# every unit's start under systemd, where `exec` and `post` are fresh interpreters (measured here:
# 25 ms for `python -S -E agent.pyc` with them, 12 ms without). `signal` below is `_signal`: the
# same functions and constants, numbers instead of enums (signal_name() gives the names).
try:
    import _signal as signal
except ImportError:  # pragma: no cover - other Pythons
    import signal
try:
    import _json
except ImportError:  # pragma: no cover - other Pythons
    _json = None

VERSION = 2
JOURNAL = "journal"
JOURNAL_VERSION = 1
JOURNAL_LIMIT = 1 << 20  # bytes: a journal that grows past this is compacted
SOCKET = "agent.sock"  # in the spool: requests from jobs (`xce launch`) and pokes from supervisors
UNITS = "units"  # in the spool: one host directory per unit, while it runs
BIN = "bin"  # in the spool: the `xce` shim for jobs, and the agent compiled for units to run
MODES = ("auto", "systemd", "user", "plain")
OPS = ("hello", "ping", "launch", "signal", "list", "forget", "read", "tasks", "launch_done")
READ_MAX = 1 << 20  # bytes a `read` may return at once
STOP_MARGIN = 5.0  # seconds systemd waits beyond a unit's grace before it KILLs what is left
# Seconds a unit launched by another agent (now gone) may be unknown to systemd before it counts as
# lost: that agent's StartTransientUnit may still lie unread in the manager's socket buffer.
START_GRACE = 10.0
LAUNCH_RECONNECT = 120.0  # seconds `xce launch` waits for a host agent that went away to come back

# Names a `signal` request may use. The agent asks a supervisor to deliver signal NAME to its job by
# sending it SIGRTMIN + index(NAME): real-time signals queue (none is merged or lost) and, unlike
# STOP and KILL themselves, can be blocked and taken by the supervisor. A plain SIGTERM (or INT,
# HUP) to a supervisor, from an admin or systemd, means "kill requested" too; USR1/USR2 to a
# supervisor are passed on to its job. TASKS_SIGNAL says "tasks of `xce launch` wait in your host
# directory".
REQUEST_NAMES = ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "STOP", "CONT")
KILL_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
REQUEST_SIGNALS = tuple(signal.SIGRTMIN + i for i in range(len(REQUEST_NAMES)))
TASKS_SIGNAL = signal.SIGRTMIN + len(REQUEST_NAMES)
SUPERVISOR_SIGNALS = (*KILL_SIGNALS, *FORWARD_SIGNALS, *REQUEST_SIGNALS, TASKS_SIGNAL, signal.SIGCHLD)
# Reset to default in the job: Python ignores PIPE and XFSZ, and ignored signals survive exec.
JOB_DEFAULT_SIGNALS = (*SUPERVISOR_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT)
SIGNAL_NAMES = {
    getattr(signal, name): name
    for name in (
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL",
        "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGCHLD", "SIGCONT",
        "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM",
        "SIGPROF", "SIGWINCH", "SIGIO", "SIGPWR", "SIGSYS",
    )
    if hasattr(signal, name)
}

_LETTERS_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
UNIT_FIRST_CHARS = frozenset(_LETTERS_DIGITS + "_@+")
UNIT_CHARS = UNIT_FIRST_CHARS | frozenset(".:=-")
SYSTEMD_UNIT_CHARS = frozenset(_LETTERS_DIGITS + "_.:-")  # what systemd allows, less '@' and '\'
ENV_NAME_CHARS = frozenset(_LETTERS_DIGITS + "_")  # what systemd 252 takes in Environment= names
# Nothing systemd splits, unquotes or expands ($VAR, %i, quotes, \, spaces) in a unit's command line.
SYSTEMD_PATH_CHARS = frozenset(_LETTERS_DIGITS + "/_.,:+=@-")
MEM_SAMPLE_INTERVAL = 0.5  # seconds between RSS samples of a job with a memory limit
WATCH_INTERVAL = 0.5  # seconds between checks of units this agent did not fork
COMPACT_RETRY = 50.0  # milliseconds before the next try to compact, when the journal's lock was busy
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- small helpers (every mode)


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


def signal_name(signum: int) -> str:
    """'SIGKILL' for 9; real-time signals as 'SIGRTMIN+3'."""
    if signum in SIGNAL_NAMES:
        return SIGNAL_NAMES[signum]
    if signal.SIGRTMIN <= signum <= signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    return f"signal {signum}"


def valid_unit_name(name: object) -> bool:
    return (
        isinstance(name, str) and 0 < len(name) <= 200 and name[0] in UNIT_FIRST_CHARS and set(name) <= UNIT_CHARS
    )


def dbus_text_ok(text: str) -> bool:
    """True if systemd takes `text` as a D-Bus string: UTF-8 (no lone surrogate, which is how a raw
    byte from os.environ looks), without the noncharacters its UTF-8 check refuses."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(0xFDD0 <= ord(c) <= 0xFDEF or (ord(c) & 0xFFFE) == 0xFFFE for c in text)


def normal_path(path: str) -> bool:
    """True for an absolute path systemd calls normalized: no '//', '/./', '/../', trailing '/'."""
    return (path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path
            and len(path) < 4096 and all(len(part) < 256 for part in path.split("/")))


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


def write_file(path: str, data: bytes, durable: bool = False, mode: int = 0o644) -> None:
    """Replace `path` atomically (tmp + rename); with `durable`, fsync the data and the directory."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
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
    return None if text is None else loads(text)


def remove_tree(path: str) -> None:
    """rm -rf `path`, never following a symlink; what cannot be removed stays (it is only clean-up)."""
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return
    except OSError:
        entries = None
    if entries is not None:
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
    try:
        os.rmdir(path)
    except OSError:
        pass


class _JsonContext:
    """What the C scanner of `json` reads from its decoder: strict JSON into plain dicts and numbers."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")


if _json is not None:
    _scan, _quote = _json.make_scanner(_JsonContext()), _json.encode_basestring_ascii
else:  # pragma: no cover - other Pythons
    import json as _std_json

    _scan, _quote = _std_json.JSONDecoder().scan_once, _std_json.encoder.encode_basestring_ascii


def loads(text: str | bytes) -> object:
    """json.loads, without importing json (see the imports)."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8")
    start = len(text) - len(text.lstrip(" \t\r\n"))
    try:
        try:
            obj, end = _scan(text, start)
        except SystemError:  # the C scanner words some errors with json.decoder, if it is loaded
            import json.decoder  # noqa: F401 - only for a malformed line (a torn record)

            obj, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"no JSON value at character {exc.value}") from None
    if text[end:].strip(" \t\r\n"):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return obj


def encode(obj: object) -> str:
    """Compact ASCII-only JSON of dicts (string keys), lists, strings, numbers, bools and None:
    json.dumps(obj, ensure_ascii=True, separators=(",", ":")), without importing json."""
    if isinstance(obj, str):
        return _quote(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise ValueError(f"{obj} is not JSON")
        return float.__repr__(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(_quote(k) + ":" + encode(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join([encode(v) for v in obj]) + "]"
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def dumps(obj: object) -> bytes:
    """One protocol line. ASCII-only so lone surrogates (undecodable bytes in env) survive."""
    return encode(obj).encode("ascii") + b"\n"


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
        "service_result": None,
        "mode": "plain",
        **usage,
    }


def unix_address(path: str) -> tuple[str, int]:
    """(an address for bind/connect naming `path`, an fd to close afterwards or -1).

    sun_path holds 108 bytes: a longer path is reached through /proc/self/fd of its directory.
    """
    if len(os.fsencode(path)) < 100:
        return path, -1
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def poke(spool: str, **fields: object) -> None:
    """Tell the agent serving `spool` to read its journal now. Best effort and never blocking: the
    agent reads it every WATCH_INTERVAL anyway, and there may be no agent (the controller is away)."""
    import _socket  # the C module: `socket` imports enum (see the imports)

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        address, fd = unix_address(os.path.join(spool, SOCKET))
        try:
            sock.connect(address)
        finally:
            if fd >= 0:
                os.close(fd)
        sock.send(dumps({"op": "poke", **fields}))
    except OSError:
        pass
    finally:
        sock.close()


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
                rec = loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec, end


def append_shared(path: str, data: bytes, sync: bool) -> tuple[int, int]:
    """Append records to the journal from a process that does not compact it (a supervisor, `post`);
    (the journal's inode, the offset just past them).

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
            end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: just past our write
            if sync:
                os.fdatasync(fd)
                if held.st_size == 0:
                    fsync_dir(os.path.dirname(path))
            return held.st_ino, end
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

    def finished(self, result: dict, by_itself: bool = True) -> None:
        append_shared(self.path, record("finished", unit=self.unit, result=result), sync=True)

    def task_finished(self, launch_id: str, index: int, status: int | None, error: str | None = None) -> None:
        """A task of `xce launch` ended (`status` as from waitpid), or never started (`error`)."""
        code = None if status is None else os.waitstatus_to_exitcode(status)
        fields = {"unit": self.unit, "launch_id": launch_id, "index": index}
        fields.update(exit_code=None if code is None or code < 0 else code, signal=-code if code and code < 0 else None)
        append_shared(self.path, record("task_finished", **fields, error=error), sync=False)
        poke(self.spool)

    def kill_reason(self) -> str | None:
        """The reason of this unit's last `kill_requested` since its last `launched` (this launch).

        The whole journal is read, so that a compaction in between cannot hide a record; it is
        done once per kill, and the journal is small (compacted past --journal-limit).
        """
        return journal_kill_reason(self.path, self.unit)

    def error_log(self) -> str:
        return os.path.join(self.spool, "supervisor-errors.log")


def journal_kill_reason(path: str, unit: str) -> str | None:
    """The reason of `unit`'s last `kill_requested` record since its last `launched`, in the journal."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    name = encode(unit).encode("ascii")
    launched, killed = b'"event":"launched","unit":' + name, b'"event":"kill_requested","unit":' + name
    reason = None
    for line in data.split(b"\n"):
        if launched in line:
            reason = None
        elif killed in line:
            try:
                reason = loads(line)["reason"]
            except (ValueError, KeyError, TypeError):
                pass
    return reason


class UnitRecorder(JournalRecorder):
    """Where a supervisor inside a systemd unit records it: `started` and task ends in the journal.

    Its result: when the job ended by itself (no kill began: no request, no stop from systemd, and
    no OOM kill in the unit's cgroup where systemd enforces the memory limit), systemd has nothing
    to add (it will say `success`, as the supervisor exits 0), so the supervisor appends THE
    finished record itself, fdatasync'ed, and removes UNIT_DIR, which tells the unit's
    ExecStopPost that it has nothing to do: one Python interpreter per unit instead of two
    (measured here: ~14 ms of CPU each). Otherwise it writes UNIT_DIR/result.json, which `post`
    merges with what systemd says; always, when the unit has hooks (`post` runs its post hooks).
    Not fsynced: `post` reads it at once, and after an OS crash a unit of the old boot is lost
    whatever it wrote.
    """

    def __init__(self, spool: str, unit: str, boot: str, unit_dir: str, systemd_memory: bool, hooks: bool):
        super().__init__(spool, unit, boot)
        self.unit_dir, self.systemd_memory, self.hooks = unit_dir, systemd_memory, hooks

    def finished(self, result: dict, by_itself: bool = True) -> None:
        if by_itself and not self.hooks and not (self.systemd_memory and oom_kills() > 0):
            result["service_result"] = "success"
            inode, end = append_shared(self.path, record("finished", unit=self.unit, result=result), sync=True)
            remove_tree(self.unit_dir)
            poke(self.spool, synced=[inode, end])
        else:
            write_file(os.path.join(self.unit_dir, "result.json"), dumps(result))


class DirRecorder:
    """Where a supervisor run by `exec UNIT_DIR` on a spec without a spool records its unit: files in
    UNIT_DIR (for a service manager of its own, without an agent).

    supervisor.pid: "PID STARTTIME START_EPOCH" and, on line 2, the job's pid; result.json, written
    atomically and durably; kill_reason, read when the supervisor is asked to kill its job.
    """

    def __init__(self, unit_dir: str):
        self.unit_dir = unit_dir

    def started(self, pid: int, starttime: int, start_time: float, job: int) -> None:
        text = f"{pid} {starttime} {start_time!r}\n{job}\n"
        write_file(os.path.join(self.unit_dir, "supervisor.pid"), text.encode())

    def finished(self, result: dict, by_itself: bool = True) -> None:
        write_file(os.path.join(self.unit_dir, "result.json"), dumps(result), durable=True)

    def task_finished(self, launch_id: str, index: int, status: int | None, error: str | None = None) -> None:
        pass  # tasks come from an agent, which this unit has not

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


def make_host_dir(spec: dict) -> None:
    """The unit's host directory (XCE_JOB_HOST_DIR), with its hostfile if the launch gave one.

    An existing one is kept: in plain mode the agent may have put tasks of `xce launch` there first.
    """
    path = spec["host_dir"]
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if spec.get("hostfile") is not None:
        write_file(os.path.join(path, "hostfile"), spec["hostfile"].encode("utf-8", "surrogateescape"))


def become_supervisor(recorder, spec: dict, start_time: float, detach: bool) -> None:
    """Run the unit as its supervisor and record its result, whatever happens (even a bug here).
    Called with SUPERVISOR_SIGNALS blocked; they stay blocked for good: the supervisor takes them
    with sigtimedwait.

    Order matters: `started` is recorded while this process still holds the fds it inherited from
    the agent, the spool lock among them (see the module docstring); only then are they closed
    (with `detach`): the agent's pipes would hide EOF from the controller. The job itself inherits
    none of them: they are close-on-exec or replaced in spawn_job. In plain mode (spec host_dir_by
    "supervisor") this makes the unit's host directory, beside the agent rather than on its serial
    path, and removes it once the result is durable; and with spec hooks_by "supervisor" it runs
    the unit's hooks itself: `started` (job 0) first, so that the lock is not held while they run,
    then the pre hooks (the job runs only if they all succeed; a kill stops them), the job (its
    run limit counts from here; `started` again with its pid), and the post hooks once it has
    ended, however it ended, before the result is recorded.
    """
    try:
        os.setsid()  # the job's group joins this session: how a lost supervisor's job is known
    except OSError:  # exec mode under a process-group leader (systemd): already detached enough
        pass
    watch = Watch(recorder, spec, start_time)
    own_dir = spec.get("host_dir_by") == "supervisor"
    hooks = spec.get("hooks_by") == "supervisor" and bool(spec.get("hooks"))
    by_itself = True  # the job ended (or could not start) with no kill begun, nor a bug here
    detached, outcomes = not detach, []

    def started(job: int) -> None:
        nonlocal detached
        pid = os.getpid()
        recorder.started(pid, int(proc_stat(pid)[19]), start_time, job)
        if not detached:
            detached = True
            os.closerange(0, 1 << 20)  # close_range(2) underneath: cheap whatever the fd limit
            null = os.open(os.devnull, os.O_RDWR)  # becomes fd 0
            os.dup2(null, 1)
            os.dup2(null, 2)

    try:
        try:
            if own_dir:
                try:
                    make_host_dir(spec)
                except OSError as exc:
                    reason = f"cannot make the job's host directory {spec['host_dir']}: {exc.strerror}"
                    raise JobEnded(make_result(start_time, reason)) from None
            if hooks:
                started(0)
                outcomes, failure = run_hooks(spec, "pre")
                if outcomes and outcomes[-1]["stopped"]:
                    raise JobEnded(make_result(start_time, watch.kill_reason("killed")))
                if failure:
                    raise JobEnded(make_result(start_time, failure))
            watch.start()
        except JobEnded as ended:
            result = ended.result
        else:
            started(watch.pid)
            result = watch.wait()
            by_itself = watch.reason is None
        if hooks:
            result["mode"] = spec.get("mode", "plain")
            outcomes += run_hooks(spec, "post", result)[0]
    except BaseException as exc:
        import traceback  # only here: keeps the agent, which every supervisor copies, small

        watch.kill_all(signal.SIGKILL)  # no job may run on once its result is written
        log = recorder.error_log()
        with open(log, "a") as f:
            f.write(f"supervisor of {spec.get('unit')} (pid {os.getpid()}):\n")
            traceback.print_exc(file=f)
        result = make_result(start_time, f"supervisor error: {exc!r} (see {log})")
        by_itself = False
    result["mode"] = spec.get("mode", "plain")
    recorder.finished(with_hooks(result, outcomes, spec.get("post_failure")), by_itself)
    if own_dir:
        remove_tree(spec["host_dir"])


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
    """Start `spec`'s argv (the job's, or a task's) as the leader of a new process group; its pid.
    Never through a shell.

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


def find_program(name: str, path: str | None, cwd: str) -> tuple[str | None, int]:
    """Where spawn_job would find `name` from directory `cwd` with the job's PATH `path`: (its
    path, 0), or (None, ENOENT; EACCES if a file was there that cannot be executed)."""
    dirs = [""] if "/" in name else (path if path is not None else "/bin:/usr/bin").split(":")
    denied = False
    for d in dirs if name else ():
        candidate = os.path.join(cwd, d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, 0
        denied = denied or os.path.exists(candidate)
    return None, errno.EACCES if denied else errno.ENOENT


def direct_start_problem(spec: dict) -> dict | None:
    """The result of a direct job that cannot start, checked where it would start (its output files,
    then its program), worded as the supervisor words it; None if it can start."""
    try:
        out, err = open_outputs(spec, spec["start_time"])
    except JobEnded as ended:
        return ended.result
    os.close(out)
    if err != out:
        os.close(err)
    name = spec["argv"][0]
    found, why = find_program(name, spec["env"].get("PATH"), spec["cwd"])
    if found is None:
        reason = f"exec failed: {os.strerror(why)}: {name}"
        return make_result(spec["start_time"], reason, exit_code=127 if why == errno.ENOENT else 126)
    return None


def fork_task_supervisor(recorder: JournalRecorder, spec: dict) -> tuple[int, int]:
    """Fork a supervisor for the tasks of `xce launch` that wait in a direct unit's host directory
    (spec: role "tasks", host_dir, stdout, stderr, grace); (its pid, the fd to answer it on, see
    Agent.answer_tasks). It starts no task before the answer says systemd has moved it into the
    unit, and ends once its tasks have."""
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        os.close(go_r)
        os.close(go_w)
        raise
    if pid == 0:
        code = 70
        try:
            gc.disable()
            signal.set_wakeup_fd(-1)
            os.setsid()
            os.closerange(0, go_r)  # the agent's pipes, lock, journal and sockets are not ours
            os.closerange(go_r + 1, 1 << 20)
            answer = os.read(go_r, 512)
            os.close(go_r)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            watch = Watch(recorder, spec, time.time())
            if answer != b"ok":
                why = answer[3:].decode("utf-8", "replace") or "the agent went away"
                watch.refused = f"cannot start the task inside unit {spec['unit']}: {why}"
            watch.wait()
            code = 0
        except BaseException:
            import traceback

            with open(recorder.error_log(), "a") as f:
                f.write(f"tasks' supervisor of {spec.get('unit')} (pid {os.getpid()}):\n")
                traceback.print_exc(file=f)
        finally:
            os._exit(code)
    os.close(go_r)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid, go_w


class Watch:
    """Runs one unit's job (none for a "host" unit) and its tasks of `xce launch`, and waits for
    them, enforcing the limits it is given and acting on requested signals.

    The supervisor keeps SUPERVISOR_SIGNALS (SIGCHLD among them) blocked and waits in sigtimedwait
    with a timeout that is the nearest deadline (run limit, end of the grace period, next memory
    sample): no busy sleeps, no handlers, no wake-up pipe, and no signal can be missed between a
    check and the wait, because a blocked signal stays pending until it is taken.

    The job and each task lead process groups of their own in the supervisor's session; signals,
    kills and the memory sample cover them all. A "job" unit ends when its job has ended and its
    tasks are gone (those left when the job ends are killed: TERM, KILL after the grace period);
    a "host" unit, once a kill (a request, a limit) has begun and its tasks are gone.
    """

    def __init__(self, recorder, spec: dict, start_time: float):
        self.recorder, self.spec, self.start_time = recorder, spec, start_time
        self.reason: str | None = None  # the end reason once a kill has begun
        self.kill_at: float | None = None  # monotonic time to send KILL after TERM
        self.forwarded: set[int] = set()
        self.pid = 0  # the job, and its process group; 0 for a "host" unit, which runs none
        self.job_status: tuple | None = None  # (wait status, rusage) once the job has ended
        self.tasks: dict[int, tuple[str, int]] = {}  # pid -> (launch id, index) of running tasks
        self.tasks_seen: set[tuple[str, int]] = set()  # a task repeated in a request starts once
        self.tasks_ending = False
        self.task_cpu, self.task_rss = 0.0, 0
        self.refused: str | None = None  # why no task may start (a tasks' supervisor outside its unit)

    def start(self) -> None:
        """Start the job (self.pid); JobEnded if it cannot start. A "host" unit starts nothing."""
        if self.spec.get("role") in ("host", "tasks"):
            return
        out, err = open_outputs(self.spec, self.start_time)
        try:
            self.pid = spawn_job(self.spec, out, err, self.start_time)
        finally:
            os.close(out)
            if err != out:
                os.close(err)

    def wait(self) -> dict:
        """Wait for the unit to end, acting on limits and signals meanwhile; its result."""
        began = time.monotonic()
        run_limit = self.spec.get("run_limit") if self.spec.get("watch_run_limit", True) else None
        mem_limit = self.spec.get("mem_limit") if self.spec.get("watch_mem_limit", True) else None
        run_deadline = began + run_limit if run_limit else None
        next_sample = began + MEM_SAMPLE_INTERVAL if mem_limit else None
        self.start_tasks()  # any that came before the supervisor could take its signal
        while True:
            self.reap()
            if self.ended():
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
                self.kill_all(signal.SIGKILL)
                self.kill_at = None
            deadlines = [d for d in (run_deadline, next_sample, self.kill_at) if d is not None]
            if deadlines:
                info = signal.sigtimedwait(SUPERVISOR_SIGNALS, max(0.0, min(deadlines) - now))
            else:
                info = signal.sigwaitinfo(SUPERVISOR_SIGNALS)
            if info is not None:
                self.handle_signal(info.si_signo)
        if self.reason is not None and self.pid:
            self.killpg(self.pid, signal.SIGKILL)  # a killed job's leftover processes go too
        return self.result()

    def reap(self) -> None:
        """Collect every ended child: the job, and tasks (each reported as it ends)."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.job_status = (status, usage)
                continue
            self.task_cpu += usage.ru_utime + usage.ru_stime
            self.task_rss = max(self.task_rss, usage.ru_maxrss * 1024)
            task = self.tasks.pop(pid, None)
            if task is not None:
                self.recorder.task_finished(task[0], task[1], status)

    def ended(self) -> bool:
        """True once the unit is over; ends leftover tasks once the job (or the host unit) is. A
        tasks' supervisor (role "tasks", fork_task_supervisor) is over once its tasks are."""
        if self.spec.get("role") == "tasks":
            return not self.tasks
        over = self.job_status is not None if self.pid else self.reason is not None
        if over and self.tasks and not self.tasks_ending:
            self.tasks_ending = True
            self.end_tasks()
        return over and not self.tasks

    def result(self) -> dict:
        reason = self.reason
        if self.pid:
            status, usage = self.job_status
            exit_code = os.waitstatus_to_exitcode(status)
            cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024
        else:
            exit_code, cpu, rss = 0, 0.0, 0
        signum = -exit_code if exit_code < 0 else None
        if reason is None and signum is not None:
            reason = self.kill_reason(None) if signum in self.forwarded else None
            reason = reason or f"killed by signal {signal_name(signum)}"
        return {
            "exit_code": None if signum else exit_code,
            "signal": signum,
            "start_time": self.start_time,
            "end_time": time.time(),
            "cpu_time": cpu + self.task_cpu,
            "max_rss": max(rss, self.task_rss),
            "reason": reason,
            "service_result": None,
        }

    def handle_signal(self, signum: int) -> None:
        """Act on one signal sent to the supervisor (SIGCHLD only wakes the loop)."""
        if signum == TASKS_SIGNAL:
            self.start_tasks()
            return
        if signum in REQUEST_SIGNALS:
            signum = getattr(signal, "SIG" + REQUEST_NAMES[signum - signal.SIGRTMIN])
        if signum in KILL_SIGNALS:
            self.begin_kill(self.kill_reason("killed"))
        elif signum == signal.SIGKILL:
            self.reason = self.reason or self.kill_reason("killed")
            self.kill_all(signal.SIGKILL)
            self.kill_at = None
        elif signum != signal.SIGCHLD:
            self.forwarded.add(signum)
            self.kill_all(signum)

    def begin_kill(self, reason: str) -> None:
        """TERM every group (CONT, in case it is stopped), then KILL after the grace period.
        The first reason given is the one the result keeps."""
        if self.reason is None:
            self.reason = reason
        self.end_tasks()
        self.killpg(self.pid, signal.SIGTERM)
        self.killpg(self.pid, signal.SIGCONT)

    def end_tasks(self) -> None:
        """TERM (and CONT) the tasks' groups, and KILL what is left after the grace period."""
        for pid in list(self.tasks):
            self.killpg(pid, signal.SIGTERM)
            self.killpg(pid, signal.SIGCONT)
        if self.kill_at is None:
            grace = self.spec.get("grace")
            self.kill_at = time.monotonic() + (10.0 if grace is None else float(grace))

    def kill_reason(self, default: str | None) -> str | None:
        text = self.recorder.kill_reason()
        return text.strip() if text and text.strip() else default

    def kill_all(self, signum: int) -> None:
        for pid in (self.pid, *self.tasks):
            self.killpg(pid, signum)

    @staticmethod
    def killpg(pid: int, signum: int) -> None:
        if pid:
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                pass

    def group_rss(self) -> int:
        """Resident bytes summed over the job's and the tasks' process groups (a best-effort sample
        from /proc)."""
        total, groups = 0, {str(pid).encode() for pid in (self.pid, *self.tasks) if pid}
        for name in os.listdir("/proc"):
            if name.isdigit():
                fields = proc_stat(int(name))
                if fields is not None and fields[2] in groups:
                    total += int(fields[21]) * PAGE_SIZE
        return total

    def start_tasks(self) -> None:
        """Start the tasks that the agent left in the host directory (tasks-LAUNCH_ID.json, each
        {"launch_id", "tasks": [{"index", "argv", "env", "cwd"}]}), each file once. Their output
        is appended to the unit's own stdout and stderr files. None starts once the unit is ending:
        each is reported finished at once, with why."""
        host_dir = self.spec.get("host_dir")
        try:
            names = sorted(n for n in os.listdir(host_dir) if n.startswith("tasks-") and n.endswith(".json"))
        except (OSError, TypeError):
            return
        for name in names:
            path = os.path.join(host_dir, name)
            try:
                batch = read_json(path)
                os.unlink(path)
                launch_id, tasks = batch["launch_id"], batch["tasks"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for task in tasks:
                self.start_task(launch_id, task)

    def start_task(self, launch_id: str, task: dict) -> None:
        key = (launch_id, task["index"])
        if key in self.tasks_seen:
            return
        self.tasks_seen.add(key)
        if self.reason is not None or self.job_status is not None or self.refused:
            why = self.refused or "the unit was ending: the task did not start"
            self.recorder.task_finished(launch_id, key[1], None, why)
            return
        if self.spec.get("starter"):  # the job starter wraps each task as it wraps the job
            task = {**task, "argv": [*self.spec["starter"], *task["argv"]]}
        try:
            out, err = open_outputs(self.spec, self.start_time)
            try:
                self.tasks[spawn_job(task, out, err, self.start_time)] = key
            finally:
                os.close(out)
                if err != out:
                    os.close(err)
        except JobEnded as ended:
            code = ended.result["exit_code"]
            self.recorder.task_finished(launch_id, key[1], None if code is None else code << 8, ended.result["reason"])


# ---------------------------------------------------------------- hooks: the step runner

# The hooks of a unit run here, in order, each bounded by its own timeout: in plain mode inside the
# supervisor (pre hooks before the job, post hooks after it however it ended); under systemd as the
# unit's own steps, `pre UNIT_DIR` its ExecStartPre and `post UNIT_DIR` its ExecStopPost (so they
# run however the unit ends: a kill, RuntimeMaxSec, an OOM kill, a lost agent). One step for all of
# a phase's hooks rather than one systemd step per hook: systemd gives every step the unit's
# Environment= (the job's), where a profile's hooks must see the profile's env only; a step that
# hits its timeout skips the ExecStopPost steps after it (the other post hooks, the result); and
# each hook's outcome must reach the result, and a post hook's env must say how the job ended.
HOOK_POINTS = ("pre_host_exec", "pre_job_exec", "post_job_exec", "post_host_exec")
HOOK_KILL_GRACE = 2.0  # seconds from TERM to KILL for a hook past its timeout, or stopped by a kill
HOOK_PATH = "/usr/local/bin:/usr/bin:/bin"  # a profile hook's PATH when the profile's env sets none
_PLAIN_WORD = frozenset(_LETTERS_DIGITS + "/_.,:+=@%-")


def hook_name(hook: dict) -> str:
    return f"{hook['point']} hook ({hook['layer']})"


def hook_failure(outcome: dict) -> str | None:
    """Why a hook failed, worded for a job's reason ("pre_job_exec hook (profile) exited 3"), or None."""
    name = hook_name(outcome)
    if outcome["ok"]:
        return None
    if outcome["error"]:
        return f"{name} could not start: {outcome['error']}"
    if outcome["stopped"]:
        return f"{name} was stopped by a kill"
    if outcome["timed_out"]:
        return f"{name} timed out after {outcome['timeout']:g} s"
    if outcome["signal"]:
        return f"{name} was killed by signal {signal_name(outcome['signal'])}"
    return f"{name} exited {outcome['exit_code']}"


def job_status(spec: dict, result: dict) -> str:
    """DONE or EXIT as the controller will say ("" for a host unit: its job's end is not known here)."""
    if spec.get("role") == "host":
        return ""
    return "DONE" if result["exit_code"] == 0 and result["signal"] is None and result["reason"] is None else "EXIT"


def hook_env(spec: dict, hook: dict, ended: dict | None) -> dict[str, str]:
    """A hook's environment. A profile's: the profile's env, xce's own XCE_* names of the job (job id,
    hosts, host dir, hostfile...) and a PATH; a job's own (-E, -Ep): the job's env. Both get XCE_HOOK
    and XCE_HOOK_LAYER, and post hooks XCE_JOB_STATUS, XCE_JOB_EXIT_CODE, XCE_JOB_SIGNAL and
    XCE_JOB_REASON (empty when there is none)."""
    if hook["layer"] == "job":
        env = dict(spec["env"])
    else:
        env = dict(spec.get("profile_env") or {})
        env.update((k, v) for k, v in spec["env"].items() if k.startswith("XCE_"))
        env.setdefault("PATH", HOOK_PATH)
    env.update(XCE_HOOK=hook["point"], XCE_HOOK_LAYER=hook["layer"])
    if ended is not None:
        env.update(XCE_JOB_STATUS=job_status(spec, ended), XCE_JOB_REASON=ended["reason"] or "",
                   XCE_JOB_EXIT_CODE="" if ended["exit_code"] is None else str(ended["exit_code"]),
                   XCE_JOB_SIGNAL=signal_name(ended["signal"]) if ended["signal"] else "")
    return env


def is_kill(signum: int) -> bool:
    """True for a signal that asks the supervisor (or a hooks step) to end the unit."""
    if signum in REQUEST_SIGNALS:
        signum = getattr(signal, "SIG" + REQUEST_NAMES[signum - signal.SIGRTMIN])
    return signum in KILL_SIGNALS or signum == signal.SIGKILL


def run_hook(spec: dict, hook: dict, ended: dict | None, stoppable: bool) -> dict:
    """Run one hook to its end, or to its timeout (then TERM, and KILL after HOOK_KILL_GRACE), with
    its output appended to the job's own files after a header line; its outcome. With SUPERVISOR_
    SIGNALS blocked (they are taken here); `stoppable` (pre hooks): a kill stops it, as a timeout does."""
    outcome = {"point": hook["point"], "layer": hook["layer"], "ok": False, "exit_code": None, "signal": None,
               "timed_out": False, "stopped": False, "error": None, "timeout": hook["timeout"], "seconds": 0.0}
    began = time.monotonic()
    try:
        out, err = open_outputs(spec, spec["start_time"])
    except JobEnded as ended_early:
        outcome["error"] = ended_early.result["reason"]
        return outcome
    try:
        words = " ".join(a if a and set(a) <= _PLAIN_WORD else shell_quote(a) for a in hook["argv"])
        os.write(out, f"[xce] {hook_name(hook)} on {os.uname().nodename}: {words}\n".encode("utf-8", "replace"))
        try:
            pid = spawn_job({"argv": hook["argv"], "env": hook_env(spec, hook, ended), "cwd": spec["cwd"]}, out, err,
                            spec["start_time"])
        except JobEnded as failed:
            outcome.update(error=failed.result["reason"], exit_code=failed.result["exit_code"])
            return outcome
        status = wait_hook(pid, hook["timeout"], outcome, stoppable)
        code = os.waitstatus_to_exitcode(status)
        outcome.update(exit_code=None if code < 0 else code, signal=-code if code < 0 else None)
        outcome["ok"] = code == 0 and not outcome["timed_out"] and not outcome["stopped"]
        outcome["seconds"] = round(time.monotonic() - began, 3)
        end = "ok" if outcome["ok"] else hook_failure(outcome).removeprefix(hook_name(outcome) + " ")
        os.write(out, f"[xce] {hook_name(hook)}: {end} ({outcome['seconds']:.1f} s)\n".encode())
        return outcome
    finally:
        os.close(out)
        if err != out:
            os.close(err)


def wait_hook(pid: int, timeout: float, outcome: dict, stoppable: bool) -> int:
    """Wait for a hook (the leader of its own process group); its wait status. Past its timeout, or
    on a kill when `stoppable`, its group gets TERM, then KILL after HOOK_KILL_GRACE; what is left of
    a hook stopped so is killed once it has ended."""
    deadline, kill_at = time.monotonic() + timeout, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if outcome["timed_out"] or outcome["stopped"]:
                Watch.killpg(pid, signal.SIGKILL)
            return status
        now = time.monotonic()
        if kill_at is None and now >= deadline:
            outcome["timed_out"] = True
            kill_at = now + HOOK_KILL_GRACE
            Watch.killpg(pid, signal.SIGTERM)
            Watch.killpg(pid, signal.SIGCONT)
        elif kill_at is not None and now >= kill_at:
            Watch.killpg(pid, signal.SIGKILL)
            kill_at = now + 3600.0  # KILL is sent; wait for the end
        info = signal.sigtimedwait(SUPERVISOR_SIGNALS, max(0.0, (deadline if kill_at is None else kill_at) - now))
        if info is not None and stoppable and is_kill(info.si_signo) and kill_at is None:
            outcome["stopped"] = True
            kill_at = time.monotonic() + HOOK_KILL_GRACE
            Watch.killpg(pid, signal.SIGTERM)
            Watch.killpg(pid, signal.SIGCONT)


def run_hooks(spec: dict, phase: str, ended: dict | None = None) -> tuple[list[dict], str | None]:
    """Run the unit's hooks of `phase` ("pre" or "post") in order: (their outcomes, the first
    failure's text or None). Pre hooks stop at the first failure, and a kill stops them; post hooks
    all run, each to its end or its timeout, a kill notwithstanding (they run once the job is over)."""
    outcomes, failure = [], None
    for hook in spec.get("hooks") or ():
        if not hook["point"].startswith(phase + "_"):
            continue
        outcome = run_hook(spec, hook, ended, stoppable=phase == "pre")
        outcomes.append(outcome)
        failure = failure or hook_failure(outcome)
        if phase == "pre" and failure:
            break
    return outcomes, failure


def with_hooks(result: dict, outcomes: list[dict], post_failure: str | None) -> dict:
    """`result` with its hooks' outcomes; post hooks that failed are its note ("post_job_exec hook
    (profile) exited 2"), or its reason if it has none and the profile says post_failure: exit."""
    if not outcomes:
        return result
    result["hooks"] = outcomes
    failed = [text for o in outcomes if o["point"].startswith("post_") and (text := hook_failure(o))]
    if failed and post_failure == "exit" and result["reason"] is None:
        result["reason"] = "; ".join(failed)
    elif failed:
        result["note"] = "; ".join(failed)
    return result


def hooks_budget(spec: dict, phase: str) -> float:
    """Seconds the hooks of `phase` may take together, each to its timeout and its KILL."""
    return sum(h["timeout"] + HOOK_KILL_GRACE for h in spec.get("hooks") or () if h["point"].startswith(phase + "_"))


# ---------------------------------------------------------------- systemd units: exec and post


def exec_main(unit_dir: str) -> int:
    """`exec UNIT_DIR`: supervise the unit that UNIT_DIR/spec.json describes, in this process (the
    main process of a systemd unit). With a spool in the spec (the agent wrote it), `started` and
    task ends go to the spool's journal and the result to UNIT_DIR/result.json for `post`;
    without one, everything goes to files in UNIT_DIR (DirRecorder)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # first: a TERM now is held, not fatal
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent exec: no spec.json in {unit_dir}; the agent (or you) writes it", file=sys.stderr)
        return 2
    if spec.get("spool"):
        systemd_memory = spec.get("watch_mem_limit") is False and bool(spec.get("mem_limit"))
        hooks = bool(spec.get("hooks"))
        recorder = UnitRecorder(spec["spool"], spec["unit"], boot_id(), unit_dir, systemd_memory, hooks)
        become_supervisor(recorder, spec, spec["start_time"], detach=False)
    else:
        become_supervisor(DirRecorder(unit_dir), spec, time.time(), detach=False)
    return 0


def pre_main(unit_dir: str) -> int:
    """`pre UNIT_DIR`, the unit's ExecStartPre: run its pre hooks (run_hooks; a stop of the unit
    stops them) and leave their outcomes in UNIT_DIR/hooks.json for `post`; exit 1 if one failed,
    so that systemd does not start the job (and runs the unit's ExecStopPost)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # first: a TERM now is held, not fatal
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent pre: no spec.json in {unit_dir}; the agent (or you) writes it", file=sys.stderr)
        return 2
    outcomes, failure = run_hooks(spec, "pre")
    write_file(os.path.join(unit_dir, "hooks.json"), dumps(outcomes))
    return 1 if failure else 0


def post_main(unit_dir: str) -> int:
    """`post UNIT_DIR`, the unit's ExecStopPost, which systemd runs however the unit ended: append
    THE finished record (fdatasync'ed), remove UNIT_DIR, poke the agent. Also when the supervisor
    wrote nothing (SIGKILLed by the OOM killer or at the stop timeout, or never started). With
    hooks: the pre hooks' outcomes (one that failed is the reason: the job never ran), then the
    post hooks, run here once the result is known (their env says it), each to its timeout."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)  # a hook's end, and systemd's TERM, wait here
    spec = read_json(os.path.join(unit_dir, "spec.json"))
    if spec is None:
        print(f"agent post: no spec.json in {unit_dir}: nothing to record", file=sys.stderr)
        return 0
    spool, unit = spec["spool"], spec["unit"]
    journal = os.path.join(spool, JOURNAL)
    try:
        supervised = read_json(os.path.join(unit_dir, "result.json"))
    except ValueError:  # torn by a crash of the supervisor in mid-write
        supervised = None
    oom = oom_kills() if spec.get("watch_mem_limit") is False and spec.get("mem_limit") else 0
    result = post_result(spec, supervised, os.environ, oom, lambda: journal_kill_reason(journal, unit))
    if spec.get("hooks"):
        try:
            outcomes = read_json(os.path.join(unit_dir, "hooks.json")) or []
        except ValueError:
            outcomes = []
        failed = [hook_failure(o) for o in outcomes if not o["ok"] and not o["stopped"]]
        if failed and supervised is None:  # a pre hook failed: the job never ran
            result.update(reason=failed[0], exit_code=None, signal=None)
        outcomes += run_hooks(spec, "post", result)[0]
        with_hooks(result, outcomes, spec.get("post_failure"))
    inode, end = append_shared(journal, record("finished", unit=unit, result=result), sync=True)
    remove_tree(unit_dir)
    poke(spool, synced=[inode, end])
    return 0


def post_result(spec: dict, supervised: dict | None, env, oom: int, kill_reason) -> dict:
    """The unit's result: the supervisor's (None if it wrote none) merged with what systemd says
    ($SERVICE_RESULT, $EXIT_CODE, $EXIT_STATUS), `oom` (OOM kills counted in the unit's memory
    cgroup) and `kill_reason()` (the kill requested, if any), worded as the plain supervisor words
    its reasons. systemd is the authority on why it stopped the unit; the supervisor on the job."""
    service = env.get("SERVICE_RESULT") or None
    result = dict(supervised) if supervised else make_result(spec["start_time"], None)
    reason = result.get("reason")
    run_limit, mem_limit = spec.get("run_limit"), spec.get("mem_limit")
    # observed: systemd 252 on cgroup v1 reports a MemoryMax kill as `signal` (or as the job's own
    # end, when the kernel picked a process other than the supervisor): the OOM counter tells
    if mem_limit and (oom > 0 or service == "oom-kill"):
        reason = f"memory limit {format_size(mem_limit)} exceeded"
    elif (service == "timeout" and run_limit) or supervised is None:
        kill = (kill_reason() or "").strip()
        status, how = env.get("EXIT_STATUS", ""), env.get("EXIT_CODE", "")
        if kill:
            reason = reason if supervised else kill  # a supervisor words a requested kill itself
        elif service == "timeout" and run_limit:
            reason = f"run limit {format_limit(run_limit)} reached"
        elif how == "exited" and status.isdigit() and 200 <= int(status) < 250:
            reason = (
                f"exec failed: systemd could not start the supervisor (status {status}); "
                f"see journalctl -u {spec['unit']}"
            )
        else:
            reason = (
                f"supervisor lost: it ended without a result ({service}: {how} {status}), so the job's "
                f"exit status is unknown; see journalctl -u {spec['unit']}"
            )
    result.update(reason=reason, service_result=service, mode=spec.get("mode"))
    return result


def oom_kills() -> int:
    """OOM kills counted in this process's memory cgroup: `post` runs in its unit's. cgroup v1's
    memory hierarchy first (hybrid hosts have their memory controller there), then v2's."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _counter(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control", "oom_kill")
    for line in lines:
        if line.startswith("0::"):
            return _counter(f"/sys/fs/cgroup{line[3:].rstrip('/')}/memory.events", "oom_kill")
    return 0


def _counter(path: str, name: str) -> int:
    """The value of the `name N` line of a cgroup file, 0 if there is none."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


# ---------------------------------------------------------------- the host: facts and modes


def which(name: str, path: str | None = None) -> str | None:
    for d in (path if path is not None else os.environ.get("PATH", os.defpath)).split(os.pathsep):
        candidate = os.path.join(d or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_command(argv: list[str], env: dict | None = None, timeout: float = 10.0) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of a short command; status None if it could not run or finish."""
    import subprocess  # only in `serve`, and only for the rare commands (systemctl, nvidia-smi)

    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", str(exc)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def cgroup_version() -> str | None:
    """"v2" (unified), "hybrid" (v1 controllers, v2 at /sys/fs/cgroup/unified), "v1", or None."""
    mounts: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4 and right:
                    mounts[fields[4]] = right.split()[0]  # a later mount hides an earlier one
    except OSError:
        return None
    if mounts.get("/sys/fs/cgroup") == "cgroup2":
        return "v2"
    if mounts.get("/sys/fs/cgroup/unified") == "cgroup2":
        return "hybrid"
    return "v1" if "cgroup" in mounts.values() else None


def gpus() -> list[dict]:
    """The host's NVIDIA GPUs as nvidia-smi lists them ([] without nvidia-smi, or if it fails):
    [{"index", "name", "memory" (bytes)}]."""
    exe = which("nvidia-smi")
    if exe is None:
        return []
    code, out, _err = run_command([exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"])
    found = []
    for line in out.splitlines() if code == 0 else ():
        parts = [p.strip() for p in line.split(",")]
        try:
            found.append({"index": int(parts[0]), "name": ",".join(parts[1:-1]), "memory": int(float(parts[-1])) << 20})
        except (ValueError, IndexError):
            continue  # a line that is no GPU ("[N/A]", a warning): never fail because of it
    return found


def user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.getuid())


def unsafe_for_systemd(paths: dict[str, str]) -> str | None:
    """Why one of `paths` cannot go on a unit's command line, or None."""
    for what, path in paths.items():
        bad = sorted(set(path) - SYSTEMD_PATH_CHARS)
        if bad or not os.path.isabs(path):
            return (
                f"the {what} path {path!r} has characters systemd would split or expand in a unit's command "
                f"line ({''.join(bad)!r}): use a path of letters, digits and /_.,:+=@- only"
            )
    return None


def probe_modes(paths: dict[str, str], cgroup: str | None) -> tuple[dict, dict]:
    """What each way of running units needs, and whether this host has it: ({mode: {"ok", "why",
    "memory", "direct"}}, {"systemd": the manager's version or None, "env": the environment (with
    XDG_RUNTIME_DIR), "tools": {"flock", "sync"}: their paths, or None if a direct unit's
    ExecStopPost cannot have them}). `paths` (what -> path) must be fit for a unit's command line
    (unsafe_for_systemd).

    `systemd` (system units): root, systemd is PID 1 of this host (/run/systemd/system) and its
    manager answers on its private socket. `user`: a lingering user manager reachable through
    $XDG_RUNTIME_DIR (set to /run/user/UID when unset). `memory` says who enforces a memory limit:
    "systemd" (MemoryMax) or "supervisor" (its RSS watch), where systemd cannot (user managers on
    cgroup v1 get no memory controller, and systemd ignores MemoryMax there without a word).
    `direct` says whether jobs can be their unit's main process (with /bin/sh, flock and sync; see
    EXEC_SCRIPT); "direct_why" why not.
    """
    uid, user, env = os.getuid(), user_name(), dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", f"/run/user/{uid}")
    tools = {name: which(name, "/usr/bin:/bin") for name in ("flock", "sync")}
    missing = sorted(name for name, path in tools.items() if path is None or set(path) - SYSTEMD_PATH_CHARS)
    if not os.path.exists("/bin/sh"):
        missing.insert(0, "/bin/sh")
    direct_why = f"{' and '.join(missing)} missing (in /usr/bin and /bin): jobs run under the supervisor" if (
        missing) else None
    facts = {"systemd": None, "env": env, "tools": None if missing else tools}
    unsafe = unsafe_for_systemd(paths)

    def manager(mode: str) -> str | None:
        """Why the manager cannot serve (None if it can); notes its version."""
        path = manager_socket(mode, env)
        try:
            bus = Bus(path)
            try:
                version = bus.call("Get", "ss", (MANAGER, "Version"), path=MANAGER_PATH, interface=PROPERTIES)
            finally:
                bus.close()
        except (OSError, DBusError) as exc:
            return f"the {'user' if mode == 'user' else 'system'} manager does not answer on {path}: {exc}"
        facts["systemd"] = facts["systemd"] or str(version[0][1]) or None
        return unsafe

    if uid != 0:
        why = f"system units need root, and this agent runs as {user} (uid {uid}): use mode user"
    elif not os.path.isdir("/run/systemd/system"):
        why = "systemd is not this host's init (no /run/systemd/system): use mode plain"
    else:
        why = manager("systemd")
    memory = "systemd" if (cgroup in ("v1", "hybrid") and os.path.isdir("/sys/fs/cgroup/memory")) or (
        cgroup == "v2" and "memory" in (read_text("/sys/fs/cgroup/cgroup.controllers") or "").split()
    ) else "supervisor"
    modes = {"systemd": {"ok": why is None, "why": why, "memory": memory, "direct": direct_why is None}}
    if memory == "supervisor":
        modes["systemd"]["memory_why"] = (
            f"cgroup {cgroup}: no memory controller here, so the supervisor's RSS watch enforces memory limits"
        )

    runtime = env["XDG_RUNTIME_DIR"]
    if not os.path.isdir(runtime):
        why = f"XDG_RUNTIME_DIR {runtime} does not exist: {user} has no user manager running"
        why += f" (run `loginctl enable-linger {user}` as root)"
    elif not os.path.exists(f"/var/lib/systemd/linger/{user}"):
        why = f"no lingering user manager for {user}: run `loginctl enable-linger {user}`"
        why += " (without it, the manager and every job under it stop soon after the last login ends)"
    else:
        why = manager("user")
    delegated = read_text(f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers")
    memory = "systemd" if cgroup == "v2" and "memory" in (delegated or "").split() else "supervisor"
    modes["user"] = {"ok": why is None, "why": why, "memory": memory, "direct": direct_why is None}
    if memory == "supervisor":
        modes["user"]["memory_why"] = (
            f"cgroup {cgroup}: the user manager has no memory controller, so systemd would ignore MemoryMax; "
            "the supervisor's RSS watch enforces memory limits"
        )
    if direct_why:
        modes["systemd"]["direct_why"] = modes["user"]["direct_why"] = direct_why
    modes["plain"] = {"ok": True, "why": None, "memory": "supervisor", "direct": False}
    return modes, facts


def compile_agent(bin_dir: str) -> str:
    """This file compiled into BIN/agent-<hash>.<python tag>.pyc, for units to run: a unit's `exec`
    and `post` are fresh interpreters, and compiling this file from source would cost each ~15 ms.
    The path of the .pyc (this file itself, if it is one already)."""
    here = os.path.abspath(__file__)
    if here.endswith(".pyc"):
        return here
    import hashlib
    import importlib.util
    import marshal

    with open(here, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source).hexdigest()[:16]
    path = os.path.join(bin_dir, f"agent-{digest}.{sys.implementation.cache_tag}.pyc")
    if not os.path.exists(path):
        code = compile(source, here, "exec", dont_inherit=True)
        # run as a script, a .pyc's 12 bytes after the magic number (flags, source stamp) are not read
        write_file(path, importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))
    return path


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------- D-Bus: the service manager's own socket
#
# systemd answers on a private socket of its own (/run/systemd/private for the system manager, root
# only; $XDG_RUNTIME_DIR/systemd/private for a user's): a peer-to-peer D-Bus connection, no bus daemon
# between, so no Hello, no destination, no match rules. This is just enough of D-Bus for the agent:
# AUTH EXTERNAL, the marshalling of the types the manager's methods take and return, method calls
# whose replies are matched by serial, and signals skipped undecoded but UnitRemoved and JobRemoved.
# Observed (systemd 252): the manager sends every signal to every private connection, subscribed or
# not (about 30 messages, 21 KB, per transient unit's life).

MANAGER_PATH, MANAGER = "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
DBUS_CALL, DBUS_RETURN, DBUS_ERROR, DBUS_SIGNAL = 1, 2, 3, 4
DBUS_TIMEOUT = 10.0  # seconds a blocking call waits for its reply
_DBUS_ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "h": 4, "s": 4, "o": 4,
               "g": 1, "a": 4, "(": 8, "{": 8, "v": 1}
_DBUS_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q", "d": "d", "h": "I"}
_dbus_type_cache: dict[str, list[str]] = {}


class DBusError(Exception):
    """An error reply: `name` (org.freedesktop.systemd1.NoSuchUnit, ...) and the manager's message."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{message} ({name})")
        self.name = name


def dbus_types(signature: str) -> list[str]:
    """The complete types of a signature, in order: "sa(sv)" -> ["s", "a(sv)"]."""
    found = _dbus_type_cache.get(signature)
    if found is not None:
        return found
    found, i = [], 0
    while i < len(signature):
        j = i
        while signature[j] == "a":
            j += 1
        if signature[j] in "({":
            depth = 0
            while True:
                depth += (signature[j] in "({") - (signature[j] in ")}")
                j += 1
                if depth == 0:
                    break
        else:
            j += 1
        found.append(signature[i:j])
        i = j
    _dbus_type_cache[signature] = found
    return found


def dbus_put(buf: bytearray, kind: str, value) -> None:
    """Append `value` marshalled as the complete type `kind` (little-endian), aligned from the start
    of `buf`. Variants are (signature, value) pairs; dicts (a{..}) are dicts, structs tuples."""
    c = kind[0]
    buf += bytes(-len(buf) % _DBUS_ALIGN[c])
    if c in _DBUS_FIXED:
        buf += _struct.pack("<" + _DBUS_FIXED[c], value)
    elif c in "so":
        data = value.encode("utf-8")
        buf += _struct.pack("<I", len(data)) + data + b"\0"
    elif c == "g":
        data = value.encode("ascii")
        buf += bytes((len(data),)) + data + b"\0"
    elif c == "v":
        dbus_put(buf, "g", value[0])
        dbus_put(buf, value[0], value[1])
    elif c == "a":
        at = len(buf)
        buf += bytes(4)
        item = kind[1:]
        buf += bytes(-len(buf) % _DBUS_ALIGN[item[0]])
        start = len(buf)
        for v in value.items() if item[0] == "{" else value:
            dbus_put(buf, item, v)
        _struct.pack_into("<I", buf, at, len(buf) - start)
    elif c in "({":
        for field_kind, v in zip(dbus_types(kind[1:-1]), value):
            dbus_put(buf, field_kind, v)
    else:
        raise ValueError(f"cannot marshal D-Bus type {kind!r}")


def dbus_get(data: bytes, offset: int, kind: str, order: str):
    """(the value of complete type `kind` at `offset` in `data`, the offset past it); `order` is
    "<" or ">", the message's byte order."""
    c = kind[0]
    offset += -offset % _DBUS_ALIGN[c]
    if c in _DBUS_FIXED:
        fmt = order + _DBUS_FIXED[c]
        value = _struct.unpack_from(fmt, data, offset)[0]
        return (bool(value) if c == "b" else value), offset + _struct.calcsize(fmt)
    if c in "so":
        size = _struct.unpack_from(order + "I", data, offset)[0]
        return data[offset + 4 : offset + 4 + size].decode("utf-8", "replace"), offset + 5 + size
    if c == "g":
        size = data[offset]
        return data[offset + 1 : offset + 1 + size].decode("ascii", "replace"), offset + 2 + size
    if c == "v":
        signature, offset = dbus_get(data, offset, "g", order)
        value, offset = dbus_get(data, offset, signature, order)
        return (signature, value), offset
    if c == "a":
        size = _struct.unpack_from(order + "I", data, offset)[0]
        item = kind[1:]
        offset += 4
        offset += -offset % _DBUS_ALIGN[item[0]]
        end, items = offset + size, []
        while offset < end:
            value, offset = dbus_get(data, offset, item, order)
            items.append(value)
        return (dict(items) if item[0] == "{" else items), offset
    if c in "({":
        values = []
        for field_kind in dbus_types(kind[1:-1]):
            value, offset = dbus_get(data, offset, field_kind, order)
            values.append(value)
        return tuple(values), offset
    raise ValueError(f"cannot read D-Bus type {kind!r}")


class DBusMessage:
    """A received message: a reply (`reply_to` its call's serial, `error` the error name of an error
    reply) or a signal (`member`); `body` decoded for replies, UnitRemoved and JobRemoved only."""

    __slots__ = ("body", "error", "kind", "member", "reply_to")

    def __init__(self, kind: int, reply_to: int | None, member: str | None, error: str | None, body: list):
        self.kind, self.reply_to, self.member, self.error, self.body = kind, reply_to, member, error, body


class Bus:
    """A connection to a systemd manager's private socket. Non-blocking once connected: send()
    queues a call and returns its serial, write() sends what the socket takes, read() returns the
    messages received whole; call() waits (up to a deadline) for one reply, keeping what else came
    in `backlog` for the owner's loop. OSError once the connection is gone: make a new Bus."""

    def __init__(self, path: str, timeout: float = 5.0):
        import _socket

        self.path = path
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            address, fd = unix_address(path)
            try:
                self.sock.connect(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            # BEGIN goes with AUTH, so that the manager has read it when its OK comes. Observed
            # (systemd 252): a call that reaches it in one read with a late BEGIN may go unread
            # until more data comes.
            uid = str(os.getuid()).encode().hex().encode()
            self.sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n")
            line = b""
            while not line.endswith(b"\r\n") and len(line) < 512:
                data = self.sock.recv(512)
                if not data:
                    break
                line += data
            if not line.startswith(b"OK "):
                raise OSError(errno.EACCES, f"the manager refused AUTH EXTERNAL: {line.strip()!r}", path)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.serial = 0
        self.out = bytearray()
        self.inbuf = bytearray()
        self.backlog: list[DBusMessage] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def send(self, member: str, signature: str = "", args: tuple = (), path: str = MANAGER_PATH,
             interface: str = MANAGER) -> int:
        """Queue a method call; its serial. write() sends it."""
        self.serial += 1
        body = bytearray()
        for kind, value in zip(dbus_types(signature), args):
            dbus_put(body, kind, value)
        fields = [(1, ("o", path)), (2, ("s", interface)), (3, ("s", member))]
        if signature:
            fields.append((8, ("g", signature)))
        head = bytearray(_struct.pack("<cBBBII", b"l", DBUS_CALL, 0, 1, len(body), self.serial))
        dbus_put(head, "a(yv)", fields)
        head += bytes(-len(head) % 8)
        self.out += head + body
        return self.serial

    def write(self) -> None:
        """Send as much of the queued calls as the socket takes now."""
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]

    def read(self) -> list[DBusMessage]:
        """The messages that have arrived whole (none if nothing came); OSError if the manager
        closed the connection (it does so when it re-executes itself)."""
        while True:
            try:
                data = self.sock.recv(1 << 18)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                raise OSError(errno.ECONNRESET, "the manager closed the connection", self.path)
            self.inbuf += data
        return self.parse()

    def parse(self) -> list[DBusMessage]:
        found, buf, at = [], self.inbuf, 0
        while len(buf) - at >= 16:
            order = "<" if buf[at] == 0x6C else ">"  # 'l'
            size, _serial, fields_size = _struct.unpack_from(order + "III", buf, at + 4)
            head_end = at + 16 + fields_size + (-(16 + fields_size) % 8)
            end = head_end + size
            if len(buf) < end:
                break
            kind = buf[at + 1]
            head = buf[at + 16 : head_end]
            if kind != DBUS_SIGNAL or b"UnitRemoved" in head or b"JobRemoved" in head:  # the rest: skipped
                message = bytes(buf[at:end])
                fields = dict(dbus_get(message, 12, "a(yv)", order)[0])
                body, offset = [], head_end - at
                for body_kind in dbus_types(fields.get(8, ("g", ""))[1]):
                    value, offset = dbus_get(message, offset, body_kind, order)
                    body.append(value)
                reply_to, member, error = (fields.get(n, (None, None))[1] for n in (5, 3, 4))
                found.append(DBusMessage(kind, reply_to, member, error, body))
            at = end
        del buf[:at]
        return found

    def call(self, member: str, signature: str = "", args: tuple = (), timeout: float = DBUS_TIMEOUT,
             **where: str) -> list:
        """Call and wait for the reply: its body; DBusError for an error reply, OSError (TimeoutError
        after `timeout` seconds) if the connection fails. Other messages go to `backlog`."""
        import select

        serial = self.send(member, signature, args, **where)
        deadline = time.monotonic() + timeout
        poller = select.poll()
        while True:
            self.write()
            for message in self.read():
                if message.reply_to == serial and message.kind in (DBUS_RETURN, DBUS_ERROR):
                    if message.kind == DBUS_ERROR:
                        raise DBusError(message.error, str(message.body[0]) if message.body else "")
                    return message.body
                self.backlog.append(message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, f"no reply to {member} within {timeout:g} s", self.path)
            poller.register(self.sock.fileno(), select.POLLIN | (select.POLLOUT if self.out else 0))
            poller.poll(left * 1000)


def manager_socket(mode: str, env: dict) -> str:
    """The private socket of the manager that runs units in `mode` ("systemd" or "user")."""
    if mode == "user":
        return os.path.join(env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}", "systemd", "private")
    return "/run/systemd/private"



# ---------------------------------------------------------------- direct units: the job as the unit's main process

# A "direct" unit runs the job itself as its main process: ExecStart is /bin/sh on EXEC_SCRIPT, which
# rebuilds the job's argv from XCE_ARGV_0..N-1 and execs it (same pid), and ExecStopPost is /bin/sh on
# STOP_SCRIPT, which appends the unit's finished record. No Python runs in the unit.
# Observed (systemd 252): a daemon-reload re-reads transient units from /run/systemd/transient, where
# the manager wrote their settings back as unit-file text; it writes ExecStartEx= (a key it does not
# read) and escapes '$' and ';' in ways its own parser does not take back, so a command line set
# over D-Bus that holds the job's bytes loses them, or its ExecStopPost, at the next reload. Its
# Environment= survives exactly (quotes, backslashes, newlines, '$', '%'), so the job's argv travels
# there and the command lines hold only the checked paths of the scripts, numbers and names.
EXEC_SCRIPT = r"""# written by the xce host agent: a direct unit's ExecStart (see agent.py). $1 is the job's argc; its
# argv is in XCE_ARGV_0..: rebuild it exactly, drop those names, and become the job (the same pid).
n=$1 i=0
set --
while [ "$i" -lt "$n" ]; do
  eval "set -- \"\$@\" \"\$XCE_ARGV_$i\"; unset XCE_ARGV_$i"
  i=$((i + 1))
done
exec "$@"
"""
STOP_SCRIPT = r"""# written by the xce host agent: a direct unit's ExecStopPost (see agent.py), which systemd runs
# however the unit ended. Appends THE finished record of unit $1 to the journal, fdatasync'ed, worded
# as the supervisor words its results. Args: UNIT START_TIME MODE RUN_LIMIT MEM_LIMIT BOOT (the boot's
# epoch in 1/100 s); "-" for no limit. Only shell builtins, but for flock (the journal's shared lock)
# and sync.
IFS=' '
unit=$1 start=$2 mode=$3 run=$4 mem=$5 boot=$6 dir=@UNITS@/$1 j=@JOURNAL@
cpu=0 peak=0 oom=0 code=null sig=null reason=null
while IFS=: read -r _ c p; do
  case $p in */"$unit".service) ;; */"$unit".service/.control) p=${p%/.control} ;; *) continue ;; esac
  case ,$c, in
    ,,) g=@V2@$p
      [ -r "$g/cpu.stat" ] && while read -r k v; do [ "$k" = usage_usec ] && cpu=$((v * 1000)); done < "$g/cpu.stat"
      [ -r "$g/memory.peak" ] && read -r peak < "$g/memory.peak"
      [ -r "$g/memory.events" ] && while read -r k v; do [ "$k" = oom_kill ] && oom=$v; done < "$g/memory.events" ;;
    *,cpuacct,*) g=/sys/fs/cgroup/$c$p; [ -r "$g/cpuacct.usage" ] && read -r cpu < "$g/cpuacct.usage" ;;
    *,memory,*) g=/sys/fs/cgroup/memory$p
      [ -r "$g/memory.max_usage_in_bytes" ] && read -r peak < "$g/memory.max_usage_in_bytes"
      [ -r "$g/memory.oom_control" ] && while read -r k v; do [ "$k" = oom_kill ] && oom=$v
      done < "$g/memory.oom_control" ;;
  esac
done < /proc/self/cgroup
read -r st < /proc/self/stat
set -- ${st##*) }
end=$((boot + ${20} * 100 / @HZ@))
status=$EXIT_STATUS
case $EXIT_CODE in
  exited) case $status in ""|*[!0-9]*) ;; *) code=$status ;; esac ;;
  killed|dumped) case $status in @SIGNALS@ RTMIN+*) sig=$((@RTMIN@ + ${status#RTMIN+})) ;; *) sig=0 ;; esac ;;
esac
case $SERVICE_RESULT in ""|*[!a-z-]*) result=null ;; *) result="\"$SERVICE_RESULT\"" ;; esac
journalctl="journalctl -u $unit"
[ "$mode" = user ] && journalctl="journalctl --user -u $unit"
if [ "$mem" != - ] && { [ "$oom" -gt 0 ] || [ "$SERVICE_RESULT" = oom-kill ]; }; then
  reason="\"memory limit $mem exceeded\""
elif [ -r "$dir/kill_reason" ] && read -r r < "$dir/kill_reason" && [ "${r#\"}" != "$r" ]; then
  reason=$r
elif [ "$SERVICE_RESULT" = timeout ] && [ "$run" != - ]; then
  reason="\"run limit $run reached\""
elif [ "$sig" != null ]; then
  reason="\"killed by signal SIG$status\""
  [ -r "$dir/signalled" ] && read -r s r < "$dir/signalled" && [ "$s" = "$status" ] && reason=$r
elif [ -z "$EXIT_CODE" ]; then
  reason="\"the job did not start ($SERVICE_RESULT); see $journalctl\""
elif [ "$code" != null ] && [ "$code" -ge 200 ] && [ "$code" -le 249 ]; then
  reason="\"exit status $code: systemd uses 200-249 for its own failures to start a job; see $journalctl\""
fi
f='\n{"event":"finished","unit":"%s","result":{"exit_code":%s,"signal":%s,"start_time":%s,"end_time":%d.%02d,'
f=$f'"cpu_time":%d.%09d,"max_rss":%d,"reason":%s,"service_result":%s,"mode":"%s"}}\n'
exec 3>>"$j" && @FLOCK@ -s 3 || exit 1
while ! [ /proc/self/fd/3 -ef "$j" ]; do exec 3>>"$j" && @FLOCK@ -s 3 || exit 1; done
printf "$f" "$unit" "$code" "$sig" "$start" $((end / 100)) $((end % 100)) $((cpu / 1000000000)) \
  $((cpu % 1000000000)) "$peak" "$reason" "$result" "$mode" >&3
# The lock goes with the fd, before the sync: a compaction that renames a new journal over $j in
# between has copied this record into it, and fsynced it; then this syncs that one.
exec 3>&-
exec @SYNC@ -d "$j"
"""


def unit_scripts(spool: str, cgroup: str | None, tools: dict[str, str]) -> tuple[str, str]:
    """Write EXEC_SCRIPT and STOP_SCRIPT (made for this spool and host) into SPOOL/bin, named by
    their content, so that a unit started by an earlier agent keeps its own; their paths."""
    import hashlib

    table = " ".join(f"{name[3:]}) sig={num} ;;" for num, name in sorted(SIGNAL_NAMES.items()))
    v2 = "/sys/fs/cgroup/unified" if cgroup == "hybrid" else "/sys/fs/cgroup"
    stop = STOP_SCRIPT
    for key, value in (("UNITS", os.path.join(spool, UNITS)), ("JOURNAL", os.path.join(spool, JOURNAL)), ("V2", v2),
                       ("HZ", str(os.sysconf("SC_CLK_TCK"))), ("SIGNALS", table), ("RTMIN", str(signal.SIGRTMIN)),
                       ("FLOCK", tools["flock"]), ("SYNC", tools["sync"])):
        stop = stop.replace(f"@{key}@", value)
    paths = []
    for kind, text in (("exec", EXEC_SCRIPT), ("stop", stop)):
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        path = os.path.join(spool, BIN, f"unit-{kind}-{digest}.sh")
        if not os.path.exists(path):
            write_file(path, text.encode())
        paths.append(path)
    return paths[0], paths[1]


def boot_epoch_cs() -> int:
    """When this host booted, in 1/100 s since the epoch, from the clock and /proc/uptime: a
    process's start time (in clock ticks since boot) plus this is when it started."""
    with open("/proc/uptime", encoding="ascii") as f:
        uptime = float(f.read().split()[0])
    return round((time.time() - uptime) * 100)


# ---------------------------------------------------------------- the agent


class Refused(Exception):
    """A request this host cannot serve; the message says what to fix."""


def check_argv_env(argv: object, env: object, allow_empty: bool = False) -> None:
    """Raise Refused unless argv is a list of strings (non-empty unless allowed) and env maps
    strings to strings, with no NUL anywhere and env names non-empty without '='."""
    if not isinstance(argv, list) or not (argv or allow_empty) or not all(isinstance(a, str) for a in argv):
        raise Refused("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Refused("env must map strings to strings")
    if any("\0" in a for a in argv) or any("\0" in k + v or "=" in k or not k for k, v in env.items()):
        raise Refused("argv and env cannot hold NUL bytes, and env names must be non-empty without '='")


def check_cwd(cwd: object) -> None:
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
        raise Refused(f"cwd {cwd!r} is not an existing directory (give an absolute path)")
    if not os.access(cwd, os.X_OK):
        raise Refused(f"cwd {cwd} is not accessible: fix its permissions")


def validate(u: dict, mode: str = "plain") -> None:
    """Raise Refused unless `u` is a unit spec this agent can launch in `mode`."""
    if not isinstance(u, dict):
        raise Refused(f"a unit must be an object, not {u!r}")
    unit = u.get("unit")
    if not valid_unit_name(unit):
        raise Refused(f"bad unit name {unit!r}: use letters, digits and _.@:+=- (not starting with .)")
    if mode != "plain" and (not set(unit) <= SYSTEMD_UNIT_CHARS or len(unit) > 240):
        raise Refused(f"unit name {unit!r} cannot name a systemd unit: use letters, digits and _.:- only")
    role = u.get("role", "job")
    if role not in ("job", "host"):
        raise Refused(f"role {role!r} is neither 'job' (runs argv) nor 'host' (holds the allocation, runs tasks)")
    check_argv_env(u.get("argv"), u.get("env"), allow_empty=role == "host")
    check_cwd(u.get("cwd"))
    for key in ("stdout", "stderr"):
        path = u.get(key)
        if not (isinstance(path, str) and os.path.isabs(path)) and not (key == "stderr" and path is None):
            raise Refused(f"{key} must be an absolute path{' or null' if key == 'stderr' else ''}")
    for key in ("run_limit", "mem_limit", "grace"):
        value = u.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
            raise Refused(f"{key} must be a non-negative number or null")
    hostfile = u.get("hostfile")
    if hostfile is not None and (not isinstance(hostfile, str) or "\0" in hostfile):
        raise Refused("hostfile must be text (the lines of the job's hostfile) or null")
    validate_hooks(u)


def validate_hooks(u: dict) -> None:
    hooks = u.get("hooks") or []
    if not isinstance(hooks, list):
        raise Refused("hooks must be a list of {point, layer, argv, timeout}")
    for hook in hooks:
        if not isinstance(hook, dict) or hook.get("point") not in HOOK_POINTS or hook.get("layer") not in (
                "profile", "job"):
            raise Refused(f"a hook needs a point ({', '.join(HOOK_POINTS)}) and a layer (profile or job): {hook!r}")
        check_argv_env(hook.get("argv"), {})
        timeout = hook.get("timeout")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < 1e7:
            raise Refused(f"hook {hook['point']}: timeout must be a positive number of seconds")
    check_argv_env(u.get("starter") or [], u.get("profile_env") or {}, allow_empty=True)
    if u.get("post_failure") not in (None, "record", "exit"):
        raise Refused("post_failure is record or exit")


def validate_tasks(req: dict) -> None:
    if not valid_unit_name(req.get("unit")) or not valid_unit_name(req.get("launch_id")):
        raise Refused(f"bad unit {req.get('unit')!r} or launch_id {req.get('launch_id')!r}")
    tasks = req.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise Refused("tasks must be a non-empty list of {index, argv, env, cwd}")
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("index"), int) or isinstance(task["index"], bool):
            raise Refused(f"each task needs an integer index: {task!r}")
        check_argv_env(task.get("argv"), task.get("env"))
        check_cwd(task.get("cwd"))


class Unit:
    """What the journal says of one unit: one launch of it, from `launched` until `forgotten`."""

    __slots__ = (
        "boot", "direct", "durable", "job", "kill", "mode", "pid", "result", "result_end", "start_time",
        "starttime",
    )

    def __init__(self, start_time: float | None, mode: str = "plain", direct: dict | None = None):
        self.start_time = start_time
        self.mode = mode  # how it runs: "plain" (a forked supervisor), "systemd" or "user" (a unit)
        self.direct = direct  # a direct unit's {"stdout", "stderr", "grace"}; None: it has a supervisor
        self.pid: int | None = None  # the supervisor, once `started`
        self.starttime: int | None = None
        self.boot: str | None = None
        self.job: int | None = None
        self.kill: str | None = None  # the last kill reason requested
        self.result: dict | None = None
        self.result_end = 0  # where its `finished` record ends in the journal file
        self.durable = False  # the result is known to be on disk (besides result_end <= synced)


def fold(units: dict[str, Unit], data: bytes, offset: int, news: list | None = None) -> None:
    """Apply the journal records in `data` (read at `offset`, ending at a newline) to `units`; the
    records that change what the agent must do (a unit's first `finished`, `started`,
    `task_finished`) are appended to `news`, if given."""
    for rec, end in parse_records(data, offset):
        try:
            event = rec["event"]
            if event == "launched":
                units[rec["unit"]] = Unit(rec["start_time"], rec.get("mode", "plain"), rec.get("direct"))
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
                    continue
                elif event == "finished":
                    if u.result is not None:
                        continue  # the first result is the result
                    u.result, u.result_end, u.durable = rec["result"], end, False
                elif event != "task_finished":
                    continue
                if news is not None:
                    news.append(rec)
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


class Client:
    """A connection to SPOOL/agent.sock: a supervisor's poke, or `xce launch` waiting for its tasks."""

    __slots__ = ("buf", "sock")

    def __init__(self, sock):
        self.sock, self.buf = sock, bytearray()


Status = tuple[str, float | None, dict | None, int | None]  # (status, start_time, result, supervisor pid)


class Agent:
    """The serve loop. Single-threaded: requests, SIGCHLD, jobs' connections and the watch timer
    share one poll().

    `mode` is how it starts units: "plain" (forked supervisors), "systemd" or "user" (transient
    units, started by calls on the manager's private D-Bus socket, whose replies and UnitRemoved
    signals come into the same poll(), so that the loop never waits for systemd). `host` holds what
    probe_modes found; `scripts` the paths of EXEC_SCRIPT and STOP_SCRIPT (None: no direct units).
    """

    def __init__(
        self,
        spool: str,
        host_name: str,
        journal_limit: int = JOURNAL_LIMIT,
        mode: str = "plain",
        host: dict | None = None,
        lock_fd: int = -1,
        code: str | None = None,
        scripts: tuple[str, str] | None = None,
    ):
        self.spool, self.host_name, self.mode = spool, host_name, mode
        self.host = host or {"modes": {"plain": {"ok": True, "why": None, "memory": "supervisor", "direct": False}}}
        self.lock_fd, self.scripts = lock_fd, scripts
        self.python, self.code = sys.executable, code or os.path.abspath(__file__)
        self.units_dir, self.bin_dir = os.path.join(spool, UNITS), os.path.join(spool, BIN)
        self.sock_path = os.path.join(spool, SOCKET)
        self.boot = boot_id()
        self.boot_cs = boot_epoch_cs()
        self.out: list[bytes] = []  # lines to write at the end of this loop turn
        self.children: dict[int, str] = {}  # supervisor pid -> unit, for supervisors forked here
        self.child_units: dict[str, tuple[int, float]] = {}  # unit -> (pid, start_time), the same
        self.task_children: dict[int, str] = {}  # pid -> unit of the tasks' supervisors of direct units
        self.watched: set[str] = set()  # running units this agent did not fork: polled, or poked
        self.units: dict[str, Unit] = {}  # the fold of the journal
        self.news: list[dict] | None = None  # records to act on, once serving (see catch_up)
        self.bus: Bus | None = None  # the manager's private socket (systemd modes)
        self.next_connect = 0.0  # monotonic time of the next attempt to reach the manager
        self.calls: dict[int, tuple] = {}  # serial -> (what, unit, ...) of calls not answered yet
        self.starting: set[str] = set()  # units whose StartTransientUnit has no reply yet
        self.tracked: set[str] = set()  # units systemd has, as the live connection says (UnitRemoved)
        self.removed: list[str] = []  # units whose UnitRemoved came this turn
        self.accepted: set[str] = set()  # units whose start this agent saw systemd accept
        self.held: dict[str, list[str]] = {}  # direct unit -> signals held until its start job is over
        self.pending: dict[str, list[int]] = {}  # unit -> signals for a supervisor not yet started
        self.clients: dict[int, Client] = {}
        self.waiting: dict[str, int] = {}  # launch id -> fd of the `xce launch` waiting for it
        self.launch_codes: dict[str, int] = {}  # launch_done that came before its client (re)connected
        self.listener = None
        self.poller = None
        self.journal_path = os.path.join(spool, JOURNAL)
        self.base_limit = self.journal_limit = journal_limit
        self.offset = 0  # bytes of the journal file read and applied
        self.synced = 0  # bytes of the journal file known to be on disk
        self.need_sync = False  # a result about to be reported may not be on disk yet
        self.compact_soon = False  # the journal wants compacting, and its lock was busy
        self.jfd = self.open_journal()
        self.catch_up()
        self.sync()  # whatever earlier agents and supervisors left is durable before it is reported
        self.news = []

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
        """Apply the records appended since the last call (up to the last complete line), and act
        on the news: report a watched unit's result, deliver signals held for a supervisor that
        has now started, report task ends."""
        size = os.fstat(self.jfd).st_size
        if size <= self.offset:
            return
        data = os.pread(self.jfd, size - self.offset, self.offset)
        end = data.rfind(b"\n") + 1
        news = self.news
        fold(self.units, data[:end], self.offset, news)
        self.offset += end
        if not news:
            return
        for rec in news:
            unit, event = rec["unit"], rec["event"]
            if event == "finished":
                self.pending.pop(unit, None)
                self.tracked.discard(unit)
                self.accepted.discard(unit)
                self.held.pop(unit, None)
                if self.units[unit].direct is not None:  # no supervisor or `post` of its own removes it
                    remove_tree(os.path.join(self.units_dir, unit))
                if unit in self.watched:
                    self.watched.discard(unit)
                    self.emit_finished(unit, self.units[unit].result)
            elif event == "started":
                for signum in self.pending.pop(unit, ()):
                    self.kill(rec["pid"], signum)
            else:
                self.out.append(dumps({k: rec.get(k) for k in ("event", "unit", "launch_id", "index", "exit_code",
                                                              "signal", "error")}))
        news.clear()

    def maybe_compact(self) -> None:
        """Rewrite the journal as the live units' records once it has grown past the limit."""
        if self.offset < self.journal_limit:
            return
        old = self.jfd
        try:
            fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.compact_soon = True  # a supervisor or ExecStopPost is appending: try again shortly
            return
        self.compact_soon = False
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
            mode = {} if u.mode == "plain" else {"mode": u.mode}
            if u.direct is not None:
                mode["direct"] = u.direct
            parts.append(record("launched", unit=name, start_time=u.start_time, **mode))
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

    def unit_status(self, unit: str, known: dict | None = None) -> Status | None:
        """(status, start_time, result, supervisor pid or None) of a unit, or None if it is not known.

        The caller has caught up with the journal. A unit with no result runs while its supervisor
        does (forked here, or recorded in `started` and alive in this boot) and, for a systemd unit,
        while its start is not answered yet, or systemd knows it (`tracked`: it said so on the live
        connection, which will bring its UnitRemoved; else `known`: unit -> bool, from
        systemd_known, asked here if the unit is not in it), or it was launched less than
        START_GRACE ago by another agent (whose call systemd may not have read yet). One with no
        result that does not run has lost its supervisor (or its ExecStopPost recorded nothing):
        this records the result that says so.
        """
        u = self.units.get(unit)
        if u is None:
            return None
        if u.result is None and unit in self.child_units:
            pid, start_time = self.child_units[unit]
            return "running", start_time, None, pid
        if u.result is None and u.pid and u.boot == self.boot and is_alive(u.pid, u.starttime):
            return "running", u.start_time, None, u.pid
        if u.result is None and (unit in self.starting or unit in self.tracked):
            return "running", u.start_time, None, None
        if u.result is None and u.mode != "plain":  # the rare path: `post` runs, or it never started
            if known is None or unit not in known:
                known = self.systemd_known([unit])
            if known.get(unit, True):  # True: systemd did not answer, so nothing is known lost
                return "running", u.start_time, None, None
            if u.pid is None and unit not in self.accepted and time.time() - (u.start_time or 0) < START_GRACE:
                return "running", u.start_time, None, None
        if u.result is None:
            self.catch_up()  # it may have ended since we looked
        if u.result is None:
            self.record_lost(unit, u)
        return "finished", u.result.get("start_time"), u.result, None

    def systemd_known(self, units: list[str]) -> dict[str, bool]:
        """unit -> True if systemd knows it (loaded, and active, activating, deactivating or
        reloading, or with a job queued: a unit waits inactive for its start job), False if not;
        units systemd was not asked about (it did not answer; another mode's) are left out. One
        ListUnitsByNames call for all of `units`; a unit it says is there is tracked from then on."""
        names = [u for u in units if self.units[u].mode == self.mode]
        if not names or not self.connect_bus():
            return {}
        try:
            listed = self.bus.call("ListUnitsByNames", "as", ([f"{u}.service" for u in names],))[0]
        except DBusError as exc:
            print(f"agent: ListUnitsByNames failed ({exc}); its units are not judged now", file=sys.stderr)
            return {}
        except OSError as exc:
            self.bus_lost(exc)
            return {}
        known = {}
        for name, _desc, load, active, _sub, _following, _path, job, *_rest in listed:
            unit = name.removesuffix(".service")
            if unit in self.units:
                alive = active in ("active", "activating", "deactivating", "reloading")
                known[unit] = load == "loaded" and (alive or job != 0)
                if known[unit]:
                    self.tracked.add(unit)
        return known

    def record_lost(self, unit: str, u: Unit) -> None:
        """Record (durably) the result of a unit whose supervisor died, or whose host restarted.

        In plain mode the job's remaining processes are killed, so that nothing runs unsupervised
        (under systemd, the unit's end took them). The job's process group is recognised by its
        session, the dead supervisor's pid: the kernel does not reuse a pid while a session or
        group of that number exists.
        """
        if u.pid and u.boot != self.boot:
            reason = "supervisor lost: the host restarted while the job ran, so its exit status is unknown"
        elif u.mode != "plain":
            reason = (
                f"supervisor lost: systemd does not know unit {unit} (it never started, or ended without a "
                f"result), so the job's exit status is unknown; see journalctl {'--user ' if u.mode == 'user' else ''}"
                f"-u {unit}"
            )
            if u.direct is not None:
                reason = (
                    f"lost: systemd does not know unit {unit} and its ExecStopPost recorded no result (it never "
                    f"started, or ended unrecorded), so the job's exit status is unknown; see journalctl "
                    f"{'--user ' if u.mode == 'user' else ''}-u {unit}"
                )
            if u.kill:  # a kill asked for before systemd started it cancels its start: nothing ran
                reason = u.kill
        else:
            reason = "supervisor lost: it was killed or crashed, so the job's exit status is unknown"
            fields = proc_stat(u.job) if u.job else None
            if fields is not None and fields[2] == str(u.job).encode() and fields[3] == str(u.pid).encode():
                try:
                    os.killpg(u.job, signal.SIGKILL)
                    reason += "; its remaining processes were killed"
                except ProcessLookupError:
                    pass
        result = make_result(u.start_time or time.time(), reason, mode=u.mode)
        self.append(record("finished", unit=unit, result=result), sync=True)

    def reported(self, unit: str, result: dict) -> dict:
        """`result` of `unit`, about to go out: make sure it is on disk before the line is written."""
        u = self.units.get(unit)
        if u is not None and not u.durable and u.result_end > self.synced:
            self.need_sync = True
        return result

    def emit_finished(self, unit: str, result: dict) -> None:
        self.out.append(dumps({"event": "finished", "unit": unit, "result": self.reported(unit, result)}))

    def report_if_finished(self, unit: str, known: dict | None = None) -> bool:
        """Emit `finished` for the unit if it has ended; True if it is no longer running."""
        status = self.unit_status(unit, known)
        if status is not None and status[0] == "finished":
            self.emit_finished(unit, status[2])
        return status is None or status[0] == "finished"

    def reap(self) -> None:
        """Collect every exited child: supervisors forked here (their unit is reported; gone if
        forgotten), and the tasks' supervisors of direct units."""
        reaped = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if self.task_children.pop(pid, None) is not None:
                continue  # its tasks' ends are in the journal
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
        """Report the watched units that ended; ask systemd, in one go, about those whose supervisor
        is gone (or not yet started)."""
        self.catch_up()
        units = sorted(self.watched)
        known = self.ask_systemd(units)
        for unit in units:
            if self.report_if_finished(unit, known):
                self.watched.discard(unit)

    def ask_systemd(self, units: list[str]) -> dict[str, bool]:
        """systemd_known() for those of `units` that only systemd can judge now: systemd units with
        no result, not being started here nor tracked, whose supervisor is gone or not yet started."""
        doubtful = [
            unit for unit in units
            if (u := self.units.get(unit)) is not None and u.result is None and u.mode != "plain"
            and unit not in self.starting and unit not in self.tracked
            and not (u.pid and u.boot == self.boot and is_alive(u.pid, u.starttime))
        ]
        return self.systemd_known(doubtful) if doubtful else {}

    def kill(self, pid: int, signum: int) -> bool:
        try:
            os.kill(pid, signum)
            return True
        except ProcessLookupError:
            return False

    def deliver(self, unit: str, pid: int | None, signum: int) -> bool:
        """Send `signum` to the unit's supervisor, or hold it until the supervisor has started
        (a systemd unit between systemd-run and its supervisor's `started`)."""
        if pid is None:
            self.pending.setdefault(unit, []).append(signum)
            return True
        return self.kill(pid, signum)

    # -- systemd units

    def job_env(self, env: dict, unit: str, host_dir: str, hostfile: bool) -> dict:
        """The job's (or task's) environment: what the controller gave, with the unit's host
        directory, the way to `xce launch`, SPOOL/bin (the `xce` shim) at the end of PATH and,
        with a hostfile, its path."""
        env = dict(env)
        env.update(XCE_UNIT=unit, XCE_JOB_HOST_DIR=host_dir, XCE_LAUNCH_SOCKET=self.sock_path)
        path = env.get("PATH") or os.defpath.lstrip(":")
        if self.bin_dir not in path.split(":"):  # a task's env may come from its job's
            env["PATH"] = f"{path}:{self.bin_dir}"
        if hostfile:
            env["XCE_HOSTFILE"] = os.path.join(host_dir, "hostfile")
        return env

    def connect_bus(self, now: bool = False) -> bool:
        """Reach the manager's private socket, unless connected (tried at most once a second while
        it does not answer, unless `now`); True if connected."""
        if self.bus is not None:
            return True
        if self.mode == "plain" or (time.monotonic() < self.next_connect and not now):
            return False
        path = manager_socket(self.mode, self.host.get("env", os.environ))
        try:
            self.bus = Bus(path, timeout=2.0)
        except OSError as exc:
            self.next_connect = time.monotonic() + 1.0
            print(f"agent: cannot reach the manager at {path} ({exc}); trying again", file=sys.stderr)
            return False
        if self.poller is not None:
            self.poller.register(self.bus.fileno(), 1)  # POLLIN
        return True

    def bus_lost(self, exc: Exception) -> None:
        """The manager closed the connection (as it does when it re-executes itself) or broke it:
        what it did not answer is unknown, and what it tracked is doubtful, until it is asked again
        (poll_watched does, reconnecting)."""
        print(f"agent: lost the connection to the manager ({exc}); reconnecting", file=sys.stderr)
        if self.poller is not None:
            self.poller.unregister(self.bus.fileno())
        self.bus.close()
        self.bus = None
        for what, unit, *extra in self.calls.values():
            if what == "start":
                self.starting.discard(unit)
            elif what == "attach":
                self.answer_tasks(extra[0], "the connection to systemd was lost")
        self.calls.clear()
        self.tracked.clear()
        self.held.clear()  # their JobRemoved will not come: a signal now goes straight to systemd

    def handle_bus(self) -> None:
        """Act on what the manager sent: replies to calls, and the UnitRemoved of known units (whose
        result is then in the journal, or they are lost)."""
        try:
            messages = self.bus.backlog + self.bus.read()
            self.bus.backlog = []
            self.bus.write()
        except OSError as exc:
            self.bus_lost(exc)
            return
        for message in messages:
            if message.kind == DBUS_SIGNAL and message.member == "UnitRemoved" and message.body:
                unit = str(message.body[0]).removesuffix(".service")
                if unit in self.units:
                    self.tracked.discard(unit)
                    self.removed.append(unit)
            elif message.kind == DBUS_SIGNAL and message.member == "JobRemoved" and len(message.body) == 4:
                unit = str(message.body[2]).removesuffix(".service")
                for name in self.held.pop(unit, ()):  # its start job is over: it runs, or ran
                    self.signal_direct(unit, name, "")
            elif message.reply_to in self.calls:
                self.answered(self.calls.pop(message.reply_to), message)
        if self.removed:
            self.catch_up()
            units = [u for u in dict.fromkeys(self.removed) if u in self.watched]
            self.removed.clear()
            known = self.ask_systemd(units)
            for unit in units:
                if self.report_if_finished(unit, known):
                    self.watched.discard(unit)

    def answered(self, call: tuple, message: DBusMessage) -> None:
        what, unit = call[0], call[1]
        error = None
        if message.kind == DBUS_ERROR:
            error = f"{message.body[0] if message.body else ''} ({message.error})"
        if what == "start":
            self.starting.discard(unit)
            if error is None:
                self.accepted.add(unit)
                self.tracked.add(unit)
            else:
                self.start_failed(unit, f"systemd refused the unit: {error}")
        elif what == "attach":
            self.answer_tasks(call[2], error)
        elif error is not None:
            print(f"agent: {what} of unit {unit} failed: {error}", file=sys.stderr)

    def start_unit(self, spec: dict, direct: bool) -> None:
        """Ask the manager to start the unit's transient service (the reply comes to handle_bus)."""
        unit = spec["unit"]
        if not self.connect_bus(now=True):
            self.start_failed(unit, f"cannot reach systemd at {manager_socket(self.mode, self.host.get('env', {}))}")
            return
        props = self.unit_properties(spec, direct)
        serial = self.bus.send("StartTransientUnit", "ssa(sv)a(sa(sv))", (f"{unit}.service", "fail", props, []))
        self.calls[serial] = ("start", unit)
        self.starting.add(unit)
        if direct:
            self.held[unit] = []

    def unit_properties(self, spec: dict, direct: bool) -> list:
        """The unit's transient service. Its command lines hold only checked paths, names and
        numbers (see EXEC_SCRIPT): a direct unit's argv and env are in its Environment=, a
        supervisor's in UNIT_DIR/spec.json. A supervisor's ExecStopPost runs `post` only if UNIT_DIR
        is still there (see UnitRecorder), through /bin/sh, which starts in 1 ms where Python takes 10."""
        unit, host_dir = spec["unit"], spec["host_dir"]
        # A supervisor KILLs its job after the grace (systemd's stop timeout is its backstop); in a
        # direct unit systemd does, and the same timeout bounds the stop script: at least STOP_MARGIN.
        stop = max(spec["grace"], STOP_MARGIN) if direct else spec["grace"] + STOP_MARGIN
        if spec.get("hooks"):  # TimeoutStopSec bounds both the job's stop and each ExecStopPost
            stop = max(stop, hooks_budget(spec, "post") + STOP_MARGIN)
        props = [
            ("Type", ("s", "exec")), ("CollectMode", ("s", "inactive-or-failed")),
            ("KillMode", ("s", "control-group" if direct else "mixed")), ("TimeoutStopUSec", ("t", round(stop * 1e6))),
        ]
        if spec.get("run_limit"):
            props.append(("RuntimeMaxUSec", ("t", round(spec["run_limit"] * 1e6))))
        if spec.get("mem_limit") and not spec["watch_mem_limit"]:
            props.append(("MemoryMax", ("t", int(spec["mem_limit"]))))
            if self.host.get("cgroup") == "v2":
                props.append(("MemorySwapMax", ("t", 0)))
        if not direct:
            tail = [self.python, "-S", "-E", self.code]
            post = [*tail, "post", host_dir]
            if os.path.exists("/bin/sh"):
                post = ["/bin/sh", "-c", f"test ! -d {host_dir} || exec {' '.join(post)}"]
            if hooks_budget(spec, "pre"):
                props += [("ExecStartPre", ("a(sasb)", [(self.python, [*tail, "pre", host_dir], False)])),
                          ("TimeoutStartUSec", ("t", round((hooks_budget(spec, "pre") + STOP_MARGIN) * 1e6)))]
            return props + [
                ("ExecStart", ("a(sasb)", [(self.python, [*tail, "exec", host_dir], False)])),
                ("ExecStopPost", ("a(sasb)", [(post[0], post, True)])),
            ]
        exec_script, stop_script = self.scripts
        argv, env = spec["argv"], [f"{k}={v}" for k, v in spec["env"].items()]
        env += [f"XCE_ARGV_{i}={arg}" for i, arg in enumerate(argv)]
        limits = [format_limit(spec["run_limit"]) if spec.get("run_limit") else "-",
                  format_size(int(spec["mem_limit"])) if spec.get("mem_limit") else "-"]
        stop = ["sh", stop_script, unit, repr(spec["start_time"]), self.mode, *limits, str(self.boot_cs)]
        props += [
            # peak memory needs MemoryAccounting; CPU time comes from cgroup v2's cpu.stat, there without
            # CPUAccounting (which costs a v1 cpu cgroup: ~15 ms of a unit's life here), but on pure v1
            ("MemoryAccounting", ("b", True)), ("CPUAccounting", ("b", self.host.get("cgroup") == "v1")),
            ("Delegate", ("b", True)),  # AttachProcessesToUnit (tasks of `xce launch`) needs it
            ("IgnoreSIGPIPE", ("b", False)),  # as a process started by the supervisor has it
            ("Environment", ("as", env)), ("WorkingDirectory", ("s", spec["cwd"])),
            ("StandardOutputFileToAppend", ("s", spec["stdout"])),
        ]
        if spec.get("stderr"):
            props.append(("StandardErrorFileToAppend", ("s", spec["stderr"])))
        return props + [
            ("ExecStart", ("a(sasb)", [("/bin/sh", ["sh", exec_script, str(len(argv))], False)])),
            ("ExecStopPost", ("a(sasb)", [("/bin/sh", stop, True)])),
        ]

    def direct_unfit(self, spec: dict) -> str | None:
        """Why this job cannot be its unit's main process (it then runs under the supervisor), or None."""
        if self.scripts is None:
            return self.host["modes"][self.mode].get("direct_why") or "no direct units on this host"
        if spec["role"] != "job":
            return "a host unit runs no command: its supervisor holds the allocation and runs tasks"
        if spec.get("hooks"):
            return "its hooks run in Python steps (pre, post), which merge the supervisor's result"
        if spec.get("mem_limit") and spec["watch_mem_limit"]:
            return "systemd cannot enforce the memory limit here: the supervisor's RSS watch does"
        argv, env = spec["argv"], spec["env"]
        if len(argv) > 1000 or sum(len(a) for a in argv) + sum(len(k) + len(v) for k, v in env.items()) > 1 << 19:
            return "the job's argv and environment are too large for one D-Bus call"
        if not all(dbus_text_ok(text) for text in (*argv, *env.values(), spec["cwd"], spec["stdout"],
                                                    spec.get("stderr") or "/")):
            return "the job's argv, environment or paths hold bytes that are not UTF-8, which D-Bus cannot carry"
        if not all(k[0] not in "0123456789" and set(k) <= ENV_NAME_CHARS for k in env):
            return "an environment name systemd refuses (letters, digits and _ only, not first a digit)"
        if not all(normal_path(p) for p in (spec["cwd"], spec["stdout"], spec.get("stderr") or "/")):
            return "a path systemd refuses (not normalized: '//', '/./', '/../' or a trailing '/')"
        return None

    def start_failed(self, unit: str, why: str) -> None:
        """The unit never started: its result says why (unless it has one: its ExecStopPost may
        have come first), as for any finished unit."""
        self.starting.discard(unit)
        self.catch_up()
        u = self.units.get(unit)
        if u is not None and u.result is None:
            result = make_result(u.start_time, why, mode=u.mode)
            self.append(record("finished", unit=unit, result=result), sync=True)
            remove_tree(os.path.join(self.units_dir, unit))

    def finish_starting(self) -> None:
        """Before exiting: wait (up to DBUS_TIMEOUT) for the manager's answer to every start sent,
        so that none the controller was told "started" is left unsent or unanswered."""
        import select

        deadline = time.monotonic() + DBUS_TIMEOUT
        while self.bus is not None and self.starting and time.monotonic() < deadline:
            poller = select.poll()
            poller.register(self.bus.fileno(), select.POLLIN | (select.POLLOUT if self.bus.out else 0))
            poller.poll(100)
            self.handle_bus()

    def fork_tasks(self, unit: str, u: Unit) -> None:
        """Start the tasks just written to a direct unit's host directory: a supervisor for them is
        forked here, moved into the unit by systemd (AttachProcessesToUnit: its cgroup, so they
        are killed with it and count against its limits), and told to go on once it is there."""
        host_dir = os.path.join(self.units_dir, unit)
        spec = {"unit": unit, "role": "tasks", "host_dir": host_dir, "mode": self.mode, **u.direct}
        pid, go = fork_task_supervisor(JournalRecorder(self.spool, unit, self.boot), spec)
        self.task_children[pid] = unit
        if not self.connect_bus(now=True):
            self.answer_tasks(go, "systemd does not answer")
            return
        serial = self.bus.send("AttachProcessesToUnit", "ssau", (f"{unit}.service", "", [pid]))
        self.calls[serial] = ("attach", unit, go)

    @staticmethod
    def answer_tasks(go: int, error: str | None) -> None:
        """Tell a tasks' supervisor that it is inside its unit (error None), or why it is not."""
        try:
            os.write(go, b"ok" if error is None else b"no " + error.encode("utf-8", "replace")[:400])
        except OSError:
            pass
        os.close(go)

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
            "mode": self.mode,
            "modes": self.host["modes"],
            "load": list(os.getloadavg()),
            "gpus": gpus(),
            "cgroup": self.host.get("cgroup"),
            "systemd": self.host.get("systemd"),
            "user": user_name(),
            "uid": os.getuid(),
            "boot_id": self.boot,
            "python": sys.version.split()[0],
        }

    def op_ping(self, req: dict) -> dict:
        return {"time": time.time()}

    def op_launch(self, req: dict) -> dict:
        self.catch_up()
        return {"replies": [self.launch_one(u) for u in req.get("units", [])]}

    def launch_one(self, u: dict) -> dict:
        """Start one unit, or adopt it if the journal knows it (a unit never runs twice)."""
        unit = u.get("unit") if isinstance(u, dict) else None
        reply = {"unit": unit, "status": "refused", "start_time": None, "error": None}
        try:
            validate(u, self.mode)
        except Refused as exc:
            reply["error"] = str(exc)
            return reply
        if unit in self.units:
            return self.adopt(unit, reply, self.unit_status(unit))
        start_time = time.time()
        keys = ("unit", "argv", "env", "cwd", "stdout", "stderr", "run_limit", "mem_limit", "grace", "hostfile",
                "hooks", "profile_env", "post_failure", "starter")
        spec = {k: u.get(k) for k in keys}
        host_dir = os.path.join(self.units_dir, unit)
        spec.update(role=u.get("role", "job"), start_time=start_time, spool=self.spool, mode=self.mode)
        spec["host_dir"] = host_dir
        if spec["grace"] is None:
            spec["grace"] = 10.0
        spec["env"] = self.job_env(spec["env"], unit, host_dir, spec["hostfile"] is not None)
        direct = None
        if self.mode != "plain":
            spec["watch_run_limit"] = False  # RuntimeMaxSec enforces it: one reason, not two racing
            spec["watch_mem_limit"] = self.host["modes"][self.mode]["memory"] != "systemd"
            if self.direct_unfit(spec) is None:
                direct = {"stdout": spec["stdout"], "stderr": spec["stderr"], "grace": spec["grace"]}
                if spec.get("starter"):
                    direct["starter"] = spec["starter"]
        try:
            mode = {} if self.mode == "plain" else {"mode": self.mode}
            if direct is not None:
                mode["direct"] = direct
            self.append(record("launched", unit=unit, start_time=start_time, **mode))
        except OSError as exc:
            reply["error"] = f"cannot write {self.journal_path}: {exc.strerror}; check the spool's file system"
            return reply
        if self.mode != "plain":
            return self.launch_unit(spec, reply, direct is not None)
        spec["host_dir_by"] = spec["hooks_by"] = "supervisor"
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

    def launch_unit(self, spec: dict, reply: dict, direct: bool) -> dict:
        """Ask systemd for the unit (its `launched` is in the journal): the reply says "started" at
        once; a refusal becomes the unit's finished result, and so does a direct job that could
        not start (worded as the supervisor would: exec failed, output files)."""
        unit, host_dir = spec["unit"], spec["host_dir"]
        try:
            remove_tree(host_dir)  # a lost launch's leftovers: its result.json is not this one's
            make_host_dir(spec)
            if direct:
                result = direct_start_problem(spec)
            else:
                result = None
                write_file(os.path.join(host_dir, "spec.json"), dumps(spec))
        except OSError as exc:
            reason = f"cannot make the job's host directory {host_dir}: {exc.strerror}"
            result = make_result(spec["start_time"], reason)
        if result is not None:
            result["mode"] = self.mode
            self.append(record("finished", unit=unit, result=result), sync=True)
            self.emit_finished(unit, result)
            remove_tree(host_dir)
            reply.update(status="finished", start_time=spec["start_time"], result=self.reported(unit, result))
            return reply
        self.start_unit(spec, direct)
        self.watched.add(unit)
        reply.update(status="started", start_time=spec["start_time"])
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
        if not valid_unit_name(unit):
            raise Refused(f"bad unit name {unit!r}")
        self.catch_up()
        status = self.unit_status(unit)
        if status is None or status[0] != "running":
            return {"found": False}
        reason = str(req.get("reason") or "")
        self.append(record("kill_requested", unit=unit, reason=reason))
        u = self.units[unit]
        if u.direct is not None or (u.mode != "plain" and status[3] is None and name in ("TERM", "INT", "HUP", "KILL")):
            # a direct unit; or a supervisor not started yet (its pre hooks may run): systemd stops the unit
            return {"found": self.signal_direct(unit, name, reason)}
        signum = signal.SIGTERM if name == "TERM" else signal.SIGRTMIN + REQUEST_NAMES.index(name)
        return {"found": self.deliver(unit, status[3], signum)}

    def signal_direct(self, unit: str, name: str, reason: str) -> bool:
        """A signal request for a direct unit, through systemd: TERM, INT and HUP stop the unit
        (TERM to all its processes, KILL after TimeoutStopSec), KILL kills them all and stops it
        (a stop cancels a start job still waiting: nothing runs), the others go to all its
        processes (KillUnit), once its start job is over (held until then: they would be lost).
        The reason for STOP_SCRIPT is left in the host directory first."""
        if unit in self.held and name not in ("TERM", "INT", "HUP", "KILL"):
            self.held[unit].append(name)
            return True
        host_dir = os.path.join(self.units_dir, unit)
        try:
            if name in ("TERM", "INT", "HUP", "KILL"):
                write_file(os.path.join(host_dir, "kill_reason"), dumps(reason[:1000] or "killed"))
            elif name in ("USR1", "USR2"):
                write_file(os.path.join(host_dir, "signalled"), f"{name} ".encode() + dumps(reason[:1000] or None))
        except OSError as exc:
            print(f"agent: cannot note the reason for {unit} in {host_dir}: {exc}", file=sys.stderr)
        if not self.connect_bus(now=True):
            raise Refused(f"systemd does not answer at {manager_socket(self.mode, self.host.get('env', {}))}; "
                          "try again")
        service = f"{unit}.service"
        if name not in ("TERM", "INT", "HUP"):
            signum = getattr(signal, f"SIG{name}")
            self.calls[self.bus.send("KillUnit", "ssi", (service, "all", signum))] = ("kill", unit)
        if name in ("TERM", "INT", "HUP", "KILL"):
            self.calls[self.bus.send("StopUnit", "ss", (service, "replace"))] = ("stop", unit)
        return True

    def op_list(self, req: dict) -> dict:
        self.catch_up()
        units, known = [], self.ask_systemd(list(self.units))
        for unit in sorted(self.units):
            state, start_time, result, _pid = self.unit_status(unit, known)
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
            if not valid_unit_name(unit):
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
            for unit in gone:  # a lost unit's host directory: nobody else removes it
                if os.path.lexists(os.path.join(self.units_dir, unit)):
                    remove_tree(os.path.join(self.units_dir, unit))
        return {"units": replies}

    def op_read(self, req: dict) -> dict:
        """A piece of a file (for `xce peek`): up to `max` bytes from `offset`, base64."""
        import base64

        path, offset, size = req.get("path"), req.get("offset", 0), req.get("max", READ_MAX)
        if not isinstance(path, str) or not os.path.isabs(path):
            raise Refused(f"path must be an absolute path, not {path!r}")
        for key, value, top in (("offset", offset, None), ("max", size, READ_MAX)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (top and value > top):
                raise Refused(f"{key} must be an integer from 0{f' to {top}' if top else ''}, not {value!r}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise Refused(f"cannot read {path}: {exc.strerror}") from None
        try:
            total = os.fstat(fd).st_size
            data = os.pread(fd, size, offset)
        except OSError as exc:
            raise Refused(f"cannot read {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        end = offset + len(data)
        return {"data_b64": base64.b64encode(data).decode("ascii"), "offset": end, "size": total, "eof": end >= total}

    def op_tasks(self, req: dict) -> dict:
        """Start tasks of `xce launch` inside a running unit: written to its host directory, and its
        supervisor told with TASKS_SIGNAL (a direct unit, which has none, gets a tasks' supervisor:
        fork_tasks). Each end is a task_finished event."""
        validate_tasks(req)
        unit, launch_id = req["unit"], req["launch_id"]
        self.catch_up()
        status = self.unit_status(unit)
        if status is None or status[0] != "running":
            raise Refused(f"unit {unit} is not running on this host, so its tasks cannot start")
        host_dir = os.path.join(self.units_dir, unit)
        hostfile = os.path.exists(os.path.join(host_dir, "hostfile"))
        tasks = [
            {"index": t["index"], "argv": t["argv"], "cwd": t["cwd"],
             "env": self.job_env(t["env"], unit, host_dir, hostfile)}
            for t in req["tasks"]
        ]
        try:
            os.makedirs(host_dir, exist_ok=True)  # plain mode: its supervisor may not have made it yet
            batch = dumps({"launch_id": launch_id, "tasks": tasks})
            write_file(os.path.join(host_dir, f"tasks-{launch_id}.json"), batch)
        except OSError as exc:
            raise Refused(f"cannot hand the tasks to unit {unit} in {host_dir}: {exc.strerror}") from None
        if self.units[unit].direct is not None:
            self.fork_tasks(unit, self.units[unit])
        else:
            self.deliver(unit, status[3], TASKS_SIGNAL)
        return {"accepted": len(tasks)}

    def op_launch_done(self, req: dict) -> dict:
        """Answer the `xce launch` waiting for `launch_id` with `exit_code` (or keep the answer
        for it, if it is not connected now)."""
        launch_id, code = req.get("launch_id"), req.get("exit_code")
        if not valid_unit_name(launch_id) or not isinstance(code, int) or isinstance(code, bool):
            raise Refused(f"launch_done needs a launch_id and an integer exit_code, not {launch_id!r}, {code!r}")
        fd = self.waiting.pop(launch_id, None)
        if fd is not None and fd in self.clients:
            delivered = self.send_client(fd, {"exit_code": code})
            self.close_client(fd)
            if delivered:
                return {"delivered": True}
        self.launch_codes[launch_id] = code
        while len(self.launch_codes) > 1000:  # answers nobody came back for
            del self.launch_codes[next(iter(self.launch_codes))]
        return {"delivered": False}

    # -- requests from jobs and supervisors on SPOOL/agent.sock

    def open_socket(self) -> None:
        """Listen on SPOOL/agent.sock (0600). Without it the agent still serves: supervisors'
        pokes are replaced by polling, and `xce launch` says it cannot reach the agent."""
        import socket

        try:
            os.unlink(self.sock_path)  # a dead agent's: we hold the spool lock
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"agent: cannot remove {self.sock_path}: {exc}", file=sys.stderr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            address, fd = unix_address(self.sock_path)
            try:
                sock.bind(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            print(f"agent: cannot listen on {self.sock_path} ({exc}): `xce launch` will not work", file=sys.stderr)
            return
        finally:
            os.umask(old_umask)
        sock.setblocking(False)
        self.listener = sock

    def accept_clients(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the jobs retry, pokes are only hints
                print(f"agent: accept on {self.sock_path} failed: {exc}", file=sys.stderr)
                return
            conn.setblocking(False)
            self.clients[conn.fileno()] = Client(conn)
            self.poller.register(conn.fileno(), 1)  # POLLIN

    def read_client(self, fd: int) -> None:
        client = self.clients.get(fd)
        if client is None:
            return
        try:
            data = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close_client(fd)
            return
        client.buf += data
        *lines, rest = client.buf.split(b"\n")
        client.buf = bytearray(rest)
        for line in lines:
            if line.strip() and fd in self.clients:
                self.handle_client_line(fd, line)

    def handle_client_line(self, fd: int, line: bytes) -> None:
        try:
            msg = loads(line)
            op = msg["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.send_client(fd, {"error": f"unreadable request ({exc})"})
            self.close_client(fd)
            return
        if op == "poke":
            synced = msg.get("synced")
            if isinstance(synced, list) and len(synced) == 2 and synced[0] == os.fstat(self.jfd).st_ino:
                self.synced = max(self.synced, int(synced[1]))  # `post` fdatasync'ed up to there
            self.catch_up()
        elif op == "launch":
            self.client_launch(fd, msg)
        elif op == "launch_wait":
            launch_id = msg.get("launch_id")
            if launch_id in self.launch_codes:
                self.send_client(fd, {"exit_code": self.launch_codes.pop(launch_id)})
                self.close_client(fd)
            else:
                self.waiting[launch_id] = fd
        else:
            self.send_client(fd, {"error": f"unknown request {op!r}: this agent takes launch, launch_wait, poke"})
            self.close_client(fd)

    def client_launch(self, fd: int, msg: dict) -> None:
        """`xce launch` from a job: tell the controller, which sends `tasks` to the job's hosts and
        `launch_done` here when all have ended."""
        unit, argv, env, cwd = msg.get("unit"), msg.get("argv"), msg.get("env"), msg.get("cwd")
        try:
            if not valid_unit_name(unit):
                raise Refused(f"bad unit {unit!r} (XCE_UNIT)")
            check_argv_env(argv, env)
            if not isinstance(cwd, str) or not os.path.isabs(cwd):
                raise Refused(f"cwd must be an absolute path, not {cwd!r}")
            self.catch_up()
            status = self.unit_status(unit)
            if status is None or status[0] != "running":
                raise Refused(f"unit {unit} is not running on this host")
        except Refused as exc:
            self.send_client(fd, {"error": str(exc)})
            self.close_client(fd)
            return
        launch_id = f"{unit}.{os.urandom(6).hex()}"
        self.waiting[launch_id] = fd
        self.send_client(fd, {"launch_id": launch_id})
        event = {"event": "launch_requested", "launch_id": launch_id, "unit": unit}
        self.out.append(dumps({**event, "argv": argv, "env": env, "cwd": cwd}))

    def send_client(self, fd: int, msg: dict) -> bool:
        client = self.clients.get(fd)
        try:
            client.sock.send(dumps(msg))  # a short line into an empty socket buffer: never blocks
            return True
        except (OSError, AttributeError):
            return False

    def close_client(self, fd: int) -> None:
        client = self.clients.pop(fd, None)
        if client is None:
            return
        self.poller.unregister(fd)
        client.sock.close()
        for launch_id in [k for k, v in self.waiting.items() if v == fd]:
            del self.waiting[launch_id]  # its `xce launch` comes back with launch_wait

    # -- the loop

    def handle_line(self, line: bytes) -> None:
        try:
            req = loads(line)
            rid, op = req["id"], req["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.out.append(dumps({"event": "error", "error": f"unreadable request {line[:200]!r}: {exc}"}))
            return
        method = getattr(self, f"op_{op}", None) if op in OPS else None
        mark = len(self.out)  # events the op emits go after its reply
        try:
            if method is None:
                raise Refused(
                    f"unknown op {op!r}: agent version {VERSION} speaks {', '.join(OPS)}; "
                    "update the controller or the agent"
                )
            reply = {"id": rid, "ok": True, **method(req)}
        except Refused as exc:
            reply = {"id": rid, "ok": False, "error": str(exc)}
        except Exception as exc:
            import traceback  # only here: keeps the agent, which every supervisor copies, small

            traceback.print_exc()
            reply = {"id": rid, "ok": False, "error": f"agent error in {op}: {exc!r}; see the agent's log"}
        self.out.insert(mark, dumps(reply))

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
        import select

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
        self.poller = select.poll()
        self.poller.register(0, select.POLLIN)
        self.poller.register(wake_r, select.POLLIN)
        if self.listener is not None:
            self.poller.register(self.listener.fileno(), select.POLLIN)
        if self.bus is not None:
            self.poller.register(self.bus.fileno(), select.POLLIN)
        pending = bytearray()
        next_watch = time.monotonic() + WATCH_INTERVAL
        writing = False  # POLLOUT asked for the bus: calls wait in its buffer
        while True:
            timeout = max(0.0, next_watch - time.monotonic()) * 1000 if self.watched else None
            if self.compact_soon:
                timeout = min(timeout if timeout is not None else COMPACT_RETRY, COMPACT_RETRY)
            ready = {fd for fd, _ev in self.poller.poll(timeout)}
            if wake_r in ready:
                drain(wake_r)
            if 0 in ready:
                data = os.read(0, 1 << 16)
                if not data:
                    self.finish_starting()
                    return
                pending += data
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        self.handle_line(line)
            if self.listener is not None and self.listener.fileno() in ready:
                self.accept_clients()
            for fd in ready & self.clients.keys():
                self.read_client(fd)
            self.reap()
            if self.bus is not None:
                self.handle_bus()
            if self.bus is not None and bool(self.bus.out) != writing:
                writing = bool(self.bus.out)
                self.poller.modify(self.bus.fileno(), select.POLLIN | (select.POLLOUT if writing else 0))
            elif self.bus is None:
                writing = False
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
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
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
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
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


# ---------------------------------------------------------------- `xce launch`, the job's side


class LaunchFailed(Exception):
    """`xce launch` could not have its tasks run, or lost track of them; the message says why."""


def launch_tasks(
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    socket_path: str | None = None,
    unit: str | None = None,
    reconnect_for: float = LAUNCH_RECONNECT,
) -> int:
    """Run `argv` as tasks of this job on its hosts (LSF's blaunch), from inside the job; block
    until they have all ended, and return the exit code the controller gives (0 if all exited 0).

    Standard library only, so that the xce CLI can import it too. The agent is found through
    XCE_LAUNCH_SOCKET and the unit through XCE_UNIT (set in every job); env and cwd default to
    this process's. If the agent goes away meanwhile (its SSH connection dropped), this waits up to
    `reconnect_for` seconds for the next one and asks it again. Raises LaunchFailed.
    """
    import socket

    socket_path = socket_path or os.environ.get("XCE_LAUNCH_SOCKET")
    unit = unit or os.environ.get("XCE_UNIT")
    if not socket_path or not unit:
        raise LaunchFailed("xce launch runs only inside an xce job (XCE_LAUNCH_SOCKET and XCE_UNIT are not set)")
    if not argv:
        raise LaunchFailed("nothing to launch: give a command, as in `xce launch -- hostname`")
    request = {"op": "launch", "unit": unit, "argv": list(argv), "env": dict(os.environ if env is None else env),
               "cwd": cwd or os.getcwd()}
    launch_id, deadline = None, None
    while True:
        why = "the agent closed the connection"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address, fd = unix_address(socket_path)
            try:
                sock.connect(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            sock.sendall(dumps(request))
            buf = b""
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = loads(line)
                    if "error" in msg:
                        raise LaunchFailed(f"the host agent refused: {msg['error']}")
                    if "exit_code" in msg:
                        return msg["exit_code"]
                    if "launch_id" in msg:
                        launch_id, deadline = msg["launch_id"], None
                        request = {"op": "launch_wait", "unit": unit, "launch_id": launch_id}
        except (OSError, ValueError) as exc:
            why = str(exc)
        finally:
            sock.close()
        if launch_id is None:
            raise LaunchFailed(
                f"cannot reach the host agent at {socket_path} ({why}): is the controller connected to this host?"
            )
        deadline = deadline or time.monotonic() + reconnect_for
        if time.monotonic() > deadline:
            raise LaunchFailed(
                f"the host agent went away ({why}) and no agent came back within {reconnect_for:g} s; "
                f"the tasks of launch {launch_id} may still run"
            )
        time.sleep(0.5)


def launch_main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        code = launch_tasks(argv)
    except LaunchFailed as exc:
        print(f"xce launch: {exc}", file=sys.stderr)
        return 255
    return code if 0 <= code <= 255 else 255


# ---------------------------------------------------------------- main

USAGE = (
    "usage: agent.py serve --spool DIR [--host-name NAME] [--mode auto|systemd|user|plain]\n"
    "                      [--lock-timeout SECONDS] [--journal-limit BYTES]\n"
    "       agent.py exec UNIT_DIR | pre UNIT_DIR | post UNIT_DIR      (inside a systemd unit)\n"
    "       agent.py launch -- CMD [ARG...]              (inside a job: `xce launch`)"
)


def prepare_spool(spool: str, code: str) -> None:
    """SPOOL/units, and SPOOL/bin/xce: a shim for jobs on hosts where xce is not installed, which
    runs `agent launch`, so that `xce launch -- CMD` works there too."""
    os.makedirs(os.path.join(spool, UNITS), exist_ok=True)
    shim = os.path.join(spool, BIN, "xce")
    text = (
        "#!/bin/sh\n# written by the xce host agent: on this host only `xce launch -- CMD` works, inside a job\n"
        f"exec {shell_quote(sys.executable)} -S -E {shell_quote(code)} \"$@\"\n"
    )
    if read_text(shim) != text:
        write_file(shim, text.encode("utf-8", "surrogateescape"), mode=0o755)


def run_as_bytecode(spool: str, argv: list[str]) -> None:
    """Started from source (`python -S -E agent.py serve ...`, as the controller starts it): exec
    this process again from this file's bytecode in SPOOL/bin (compile_agent), same pid, same pipes.
    Compiling this file at every start leaves the compiler's ~10 MB in the agent's heap for good,
    and the agent forks a supervisor per job: every fork copies the page tables of that memory, and
    the copy-on-write faults that follow cost each job ~0.5 ms (bench/cpu_per_job.py). Where the
    bytecode cannot be written, the agent goes on from source."""
    if os.path.abspath(__file__).endswith(".pyc"):
        return
    try:
        code = compile_agent(os.path.join(spool, BIN))
    except (OSError, SyntaxError):
        return
    os.execv(sys.executable, [sys.executable, "-S", "-E", code, *argv])


def serve_main(argv: list[str]) -> int:
    opts = dict(zip(argv[1::2], argv[2::2]))
    known = {"--spool", "--host-name", "--mode", "--lock-timeout", "--journal-limit"}
    if "--spool" not in opts or len(argv) % 2 != 1 or set(opts) - known:
        print(USAGE, file=sys.stderr)
        return 2
    mode = opts.get("--mode", "auto")
    if mode not in MODES:
        return fatal(f"unknown mode {mode!r}: use auto, systemd, user or plain")
    # Jobs inherit the fds of their supervisor, a fork of this process, that are not close-on-exec:
    # keep none but stdin, stdout and stderr (which every job gets replaced).
    os.closerange(3, 1 << 20)
    spool = os.path.abspath(opts["--spool"])
    try:
        os.makedirs(os.path.join(spool, BIN), exist_ok=True)
    except OSError as exc:
        return fatal(f"cannot create spool {spool}: {exc.strerror}; choose a writable directory")
    run_as_bytecode(spool, argv)
    lock_fd = take_spool_lock(spool, float(opts.get("--lock-timeout", 10)))
    cgroup, code = cgroup_version(), os.path.abspath(__file__)
    modes, host = probe_modes({"python": sys.executable, "agent": code, "spool": spool}, cgroup)
    host.update(modes=modes, cgroup=cgroup)
    if mode == "auto":
        mode = next(m for m in ("systemd", "user", "plain") if modes[m]["ok"])
    elif not modes[mode]["ok"]:
        return fatal(
            f"this host cannot run units in mode {mode}, which its `launch:` setting asks for: "
            f"{modes[mode]['why']}; fix that, or set `launch: auto`"
        )
    scripts = None
    try:
        if mode != "plain":
            code = compile_agent(os.path.join(spool, BIN))
            if host["tools"] is not None:
                scripts = unit_scripts(spool, cgroup, host["tools"])
        prepare_spool(spool, code)
    except (OSError, SyntaxError) as exc:
        return fatal(f"cannot prepare spool {spool}: {exc}; check the spool's file system")
    try:
        limit = int(opts.get("--journal-limit", JOURNAL_LIMIT))
        agent = Agent(spool, opts.get("--host-name") or os.uname().nodename, limit, mode, host, lock_fd, code, scripts)
    except OSError as exc:
        return fatal(f"cannot use the journal in spool {spool}: {exc}; check the spool's file system")
    agent.connect_bus(now=True)
    agent.open_socket()
    try:
        agent.serve()
    except BrokenPipeError:
        agent.finish_starting()  # the controller went away while we wrote: exit as on EOF
    os.close(lock_fd)
    return 0


def main(argv: list[str]) -> int:
    command = argv[0] if argv else None
    if command in ("exec", "pre", "post") and len(argv) == 2:
        unit_dir = os.path.abspath(argv[1])
        return {"exec": exec_main, "pre": pre_main, "post": post_main}[command](unit_dir)
    if command == "launch":
        return launch_main(argv[1:])
    if command == "serve":
        return serve_main(argv)
    if command is not None and not command.startswith("-"):
        print(f"agent: unknown command {command!r}; on a host without xce, only `xce launch -- CMD` works "
              "(inside a job)", file=sys.stderr)
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

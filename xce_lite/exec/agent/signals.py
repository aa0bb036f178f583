"""The signals the agent and its supervisors use, and their names.

`signal` here is the C module `_signal`: the same functions and constants as `signal`, numbers
instead of enums (signal_name() gives the names). The Python wrapper imports enum, some 15 ms of
every unit's start under systemd, where `exec` and `post` are fresh interpreters (measured here:
25 ms for `python -S -E agent.pyc` with it and `json`'s, 12 ms without).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # true for mypy only: unit interpreters load these modules, and never typing
if TYPE_CHECKING:
    import signal  # _signal has no stub of its own; signal's names are a superset of its
else:
    try:
        import _signal as signal
    except ImportError:  # pragma: no cover - other Pythons
        import signal


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
# Reset to default in the job: every signal a process may set (all but KILL, STOP and libc's own).
# Python ignores PIPE and XFSZ, and whatever the agent's parent ignored (nohup's HUP, a shell's INT,
# QUIT, TTOU...) would survive exec too: a job starts as a service of systemd does, with none
# ignored. Naming them all is also cheaper: glibc's posix_spawn sets a listed signal with one
# sigaction in its child, and reads then sets each other one (~100 calls per job against ~60).
JOB_DEFAULT_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))
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


def signal_name(signum: int) -> str:
    """'SIGKILL' for 9; real-time signals as 'SIGRTMIN+3'."""
    if signum in SIGNAL_NAMES:
        return SIGNAL_NAMES[signum]
    if signal.SIGRTMIN <= signum <= signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    return f"signal {signum}"


def is_kill(signum: int) -> bool:
    """True for a signal that asks the supervisor (or a hooks step) to end the unit."""
    if signum in REQUEST_SIGNALS:
        signum = getattr(signal, "SIG" + REQUEST_NAMES[signum - signal.SIGRTMIN])
    return signum in KILL_SIGNALS or signum == signal.SIGKILL


def killpg(pid: int, signum: int) -> None:
    """Signal the process group `pid` (none for 0); a group that is gone is no error."""
    if pid:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

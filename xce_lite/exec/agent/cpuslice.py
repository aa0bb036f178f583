"""A short CPU slice for the agent and its reused supervisors (pool.py): a job's hand-over waits less
for a CPU. The API's threads ask for the same (xce_lite/api/cpuslice.py, which says why at length).

Why: the agent and a worker run in short bursts between waits (a launch line, a job's end, the
result's fdatasync: ~0.05-0.3 ms each), and with Linux's EEVDF scheduler the task on the CPU when one
wakes (a job, the controller) keeps it to the end of its slice (1.4 ms on a 2-CPU box). Since Linux
6.12 a task may ask for a shorter one (sched_setattr's sched_runtime, 0.1-100 ms) without privilege:
a task with a shorter slice preempts a longer one when it wakes, if it is owed CPU time.

Invariants:
- no more CPU for the agent or a worker than before: the weight (the nice value) and the policy are
  kept (read first); only SCHED_OTHER and SCHED_BATCH tasks are changed; the slice changes when,
  not how much;
- a job never has it: SCHED_FLAG_RESET_ON_FORK is set with it, so what the task starts (a zygote,
  a supervisor, a job by posix_spawn) gets the kernel's default;
- where the kernel cannot (older than 6.12 ignores the slice; another architecture; a seccomp
  filter) nothing changes and nothing fails: `short_slice` says False.
Standard library only (ctypes, ~4 ms to import, once, in the agent; workers import nothing for it:
the agent sets a worker's slice by its pid before it hands it its first job).

Off unless XCE_AGENT_SLICE=1: measured on a busy box (bench/README.md, branch host7) it showed no
gain, and the whole tree's CPU per job was higher with it (bench/tree_cpu.py, 5 pairs at load 4-5:
3.91 against 3.21 ms, system 1.05 against 0.90), more preemptions of the jobs; and on a quiet one
(session 17, bench/run.py, 3 pairs at load 1-2.6) it was behind in two pairs of three.
"""

from __future__ import annotations

import os
import struct
import sys

SLICE_NS = 100_000  # the kernel's least (0.1 ms), as the API's threads ask
_NUMBERS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr
_ATTR = struct.Struct("=IIQiIQQQ")  # struct sched_attr as of Linux 3.14 (48 bytes): size, policy,
# flags, nice, priority, runtime, deadline, period
_RESET_ON_FORK = 0x01
_FAIR = (0, 3)  # SCHED_OTHER, SCHED_BATCH
_LIBC: dict = {}  # "syscall": libc's syscall(), once loaded (None where there is none to call)


def short_slice(pid: int = 0, ns: int = SLICE_NS) -> bool:
    """Ask for an `ns` slice for the task `pid` (0: the calling thread), not passed on to what it
    starts; whether the kernel now says so. Only with XCE_AGENT_SLICE=1 in the agent's environment
    (off by default: not shown to pay, see the module's docstring; a job's environment is its
    spec's, never the agent's)."""
    return os.environ.get("XCE_AGENT_SLICE") == "1" and set_slice(pid, ns)


def set_slice(pid: int, ns: int) -> bool:
    """Ask for an `ns` slice for the task `pid` (0: the calling thread) with SCHED_FLAG_RESET_ON_FORK,
    its policy and nice value kept; whether the kernel now reports the slice asked, as it clamps it
    (0.1-100 ms). The one place the syscall is made: the API's threads call it too (api/cpuslice.py)."""
    now = _attr(pid)
    if ns <= 0 or now is None or now[1] not in _FAIR:
        return False
    import ctypes

    attr = ctypes.create_string_buffer(_ATTR.pack(_ATTR.size, now[1], _RESET_ON_FORK, now[3], 0, ns, 0, 0), _ATTR.size)
    if _syscall()(_NUMBERS[os.uname().machine][0], pid, attr, 0) != 0:
        return False
    after = _attr(pid)
    return after is not None and after[5] == min(max(ns, 100_000), 100_000_000)


def slice_ns(pid: int = 0) -> int | None:
    """The task's slice in ns as the kernel reports it (its default, or what was asked), None where
    it cannot be read."""
    now = _attr(pid)
    return now[5] if now is not None else None


def _syscall():
    if "syscall" not in _LIBC:
        try:
            import ctypes

            _LIBC["syscall"] = ctypes.CDLL(None, use_errno=True).syscall
        except (ImportError, OSError, AttributeError):
            _LIBC["syscall"] = None
    return _LIBC["syscall"]


def _attr(pid: int) -> tuple[int, ...] | None:
    """The task's struct sched_attr (sched_getattr), None where there is none to read."""
    numbers = _NUMBERS.get(os.uname().machine)
    if numbers is None or not sys.platform.startswith("linux") or not _syscall():
        return None
    import ctypes

    buf = ctypes.create_string_buffer(_ATTR.size)
    if _syscall()(numbers[1], pid, buf, _ATTR.size, 0) != 0:
        return None
    return _ATTR.unpack(buf.raw)

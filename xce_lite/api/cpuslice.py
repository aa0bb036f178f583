"""A short CPU slice for the API's threads (issue 18, branch post5): a request waits less for a CPU.

Why: with jobs running beside, the API worker that serves one POST per job waited runnable for a
CPU ~0.75-0.85 ms a POST (bench/one_post.py --running, its run-queue wait, load ~1-3), more than it
ran (~0.5 ms): with Linux's EEVDF scheduler the task on the CPU when the worker wakes (a job, the
agent, the tick) keeps it to the end of its slice (1.4 ms on this 2-CPU box), while the worker's
bursts between two waits (the client's bytes, the WAL's fdatasync, the GIL) are ~0.05-0.2 ms. Since
Linux 6.12 a thread may ask for a shorter slice (sched_setattr's sched_runtime, 0.1-100 ms) without
privilege: a task with a shorter slice preempts a longer one when it wakes, if it is owed CPU time.

Invariants:
- no more CPU for the controller than before: the weight (the nice value) is left as it is, so over
  time its threads get the share they had; the slice changes when, not how much. It is no priority:
  an unprivileged process may shorten its slice but not lower its nice value (LSF gives its daemons
  a priority for the same reason: LSF_DAEMON_NICE_LIM and _RES default to -20, as root);
- what the thread starts does not keep it (SCHED_FLAG_RESET_ON_FORK): a thread or a process started
  from it gets the kernel's default slice, so nothing of a job's scheduling changes;
- the thread's policy and nice value are kept (read first); only SCHED_OTHER and SCHED_BATCH threads
  are changed. Where the kernel cannot (older than 6.12 takes the call and ignores the slice; another
  architecture; a seccomp filter) nothing changes and nothing fails: `short_slice` says False.
"""

from __future__ import annotations

import platform
import struct
import sys

SLICE = 0.0001  # seconds: the kernel's least (0.1 ms); Limits.slice, XCE_API_LIMITS=slice=0 leaves the default

_NUMBERS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr
_ATTR = struct.Struct("=IIQiIQQQ")  # struct sched_attr as of Linux 3.14 (48 bytes): size, policy,
# flags, nice, priority, runtime, deadline, period
_RESET_ON_FORK = 0x01
_FAIR = (0, 3)  # SCHED_OTHER, SCHED_BATCH


def short_slice(seconds: float = SLICE) -> bool:
    """Ask for a `seconds` slice for the calling thread (the kernel clamps it to 0.1-100 ms), not
    passed on to what it starts; whether the kernel now says so. `seconds` <= 0: nothing is asked."""
    now = _attr()
    if seconds <= 0 or now is None or now[1] not in _FAIR:
        return False
    import ctypes

    want = int(seconds * 1e9)
    attr = ctypes.create_string_buffer(_ATTR.pack(_ATTR.size, now[1], _RESET_ON_FORK, now[3], 0, want, 0, 0),
                                       _ATTR.size)
    if ctypes.CDLL(None, use_errno=True).syscall(_NUMBERS[platform.machine()][0], 0, attr, 0) != 0:
        return False
    after = _attr()
    return after is not None and after[5] == min(max(want, 100_000), 100_000_000)  # as the kernel clamps it


def slice_of() -> int | None:
    """The calling thread's slice in ns as the kernel reports it (its default, or what was asked),
    None where it cannot be read."""
    now = _attr()
    return now[5] if now is not None else None


def _attr() -> tuple[int, ...] | None:
    """The calling thread's struct sched_attr (sched_getattr), None where there is none to read."""
    numbers = _NUMBERS.get(platform.machine())
    if numbers is None or not sys.platform.startswith("linux"):
        return None
    import ctypes

    buf = ctypes.create_string_buffer(_ATTR.size)
    if ctypes.CDLL(None, use_errno=True).syscall(numbers[1], 0, buf, _ATTR.size, 0) != 0:
        return None
    return _ATTR.unpack(buf.raw)

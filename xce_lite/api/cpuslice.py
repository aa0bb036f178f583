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

The syscall itself is made in one place, the agent's module (exec/agent/cpuslice.py: standard
library only, so the agent's copy on a host has it too); this one names the API's default and speaks
in seconds.
"""

from __future__ import annotations

from xce_lite.exec.agent.cpuslice import set_slice, slice_ns

SLICE = 0.0001  # seconds: the kernel's least (0.1 ms); Limits.slice, XCE_API_LIMITS=slice=0 leaves the default


def short_slice(seconds: float = SLICE) -> bool:
    """Ask for a `seconds` slice for the calling thread (the kernel clamps it to 0.1-100 ms), not
    passed on to what it starts; whether the kernel now says so. `seconds` <= 0: nothing is asked."""
    return seconds > 0 and set_slice(0, int(seconds * 1e9))


def slice_of() -> int | None:
    """The calling thread's slice in ns as the kernel reports it (its default, or what was asked),
    None where it cannot be read."""
    return slice_ns(0)

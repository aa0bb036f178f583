"""The supervisor's wait: one unit's job and its tasks, their limits and the signals asked for.

Single-threaded with SUPERVISOR_SIGNALS blocked and taken by sigtimedwait: no handler, no wake-up
pipe, no signal missed between a check and the wait. A killed job's leftover processes are killed
before its result is returned, and so is every other descendant left once the job has ended
(tree.py): the result's note counts those.
"""

from __future__ import annotations

import os
import time

from .signals import (
    KILL_SIGNALS,
    REQUEST_NAMES,
    REQUEST_SIGNALS,
    SUPERVISOR_SIGNALS,
    TASKS_SIGNAL,
    killpg,
    signal,
    signal_name,
)
from .lease import LEASE_REREAD, clock, expired_reason, lease_stamp, read_lease
from .spawn import JobEnded, open_outputs, spawn_job
from .tree import descendants, leftovers_text, stop_leftovers
from .util import boot_id, format_limit, format_size, read_json

MEM_SAMPLE_INTERVAL = 0.5  # seconds between RSS samples of a job with a memory limit
# ((spool, boot, SPOOL/lease's stamp taken before the read), (until, renewed)): the lease this
# process read last, which a reused supervisor's next job takes while the stamp is the same
_lease_read: tuple[tuple, tuple[float, float]] = ((), (0.0, 0.0))
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


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
        self.termed_groups: set[int] = set()  # process groups sent TERM by a kill, or as ending tasks
        self.leftovers = 0  # descendants left once the unit ended, killed then
        self.lease_renewed = 0.0  # when the host's lease was last renewed, as last read (lease_left)
        self.lease_until: float | None = None  # the lease's end (lease clock), as last read; None: none
        self.lease_seen: tuple[int, int, int] | None = None  # SPOOL/lease's stamp when last read
        self.lease_read = False  # SPOOL/lease was read before the job started (lease_lapsed)
        # tasks of `xce launch` may wait in the host directory before the wait begins (False: the
        # supervisor made it empty, and each task written since came with a TASKS_SIGNAL, held)
        self.tasks_waiting = True

    def start(self) -> None:
        """Start the job (self.pid); JobEnded if it cannot start. A "host" unit starts nothing."""
        if self.spec.get("role") in ("host", "tasks"):
            return
        out, err = open_outputs(self.spec, self.start_time)
        try:
            self.pid = spawn_job(self.spec, out, err, self.start_time, self.spec.get("user"))
        finally:
            os.close(out)
            if err != out:
                os.close(err)

    def wait(self) -> dict:
        """Wait for the unit to end, acting on limits and signals meanwhile; its result."""
        began = time.monotonic()
        # 0 or None: no limit to watch here
        run_limit: float = (self.spec.get("run_limit") if self.spec.get("watch_run_limit", True) else None) or 0
        mem_limit: int = (self.spec.get("mem_limit") if self.spec.get("watch_mem_limit", True) else None) or 0
        run_deadline = began + run_limit if run_limit else None
        next_sample = began + MEM_SAMPLE_INTERVAL if mem_limit else None
        watch_lease = bool(self.spec.get("spool")) and self.spec.get("role") != "tasks"
        lease_at = self.look_at_lease(began, force=not self.lease_read) if watch_lease else None
        if self.tasks_waiting:
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
            if lease_at is not None and now >= lease_at:
                lease_at = self.look_at_lease(now)
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_all(signal.SIGKILL)
                self.kill_at = None
            deadlines = [d for d in (run_deadline, next_sample, self.kill_at, lease_at) if d is not None]
            if deadlines:
                info = signal.sigtimedwait(SUPERVISOR_SIGNALS, max(0.0, min(deadlines) - now))
            else:
                info = signal.sigwaitinfo(SUPERVISOR_SIGNALS)
            if info is not None:
                self.handle_signal(info.si_signo)
        # what is left goes too: a killed job's group at once (it had its TERM), anything else
        # (a `cmd &` of the job, a `setsid` child, a daemon) TERM, then KILL after the grace
        self.leftovers = stop_leftovers(self.grace(), self.reap, frozenset(self.termed_groups))
        return self.result()

    def grace(self) -> float:
        grace = self.spec.get("grace")
        return 10.0 if grace is None else float(grace)

    def look_at_lease(self, now: float, force: bool = False) -> float | None:
        """The supervisor outlives the agent, so it enforces the host's lease itself (lease.py):
        SPOOL/lease is read again when its stamp changed (a grant, which may shorten it), when the
        lease read has run out (renewed meanwhile?) and with `force`; once it has run out, the job
        is stopped. The stamp is looked at every LEASE_REREAD s, as the agent promises the
        controller (a grant's `bound`). The next monotonic time to look (`now`: monotonic), or None
        once the job is being stopped for it."""
        stamp = lease_stamp(self.spec["spool"])
        left = None if self.lease_until is None else self.lease_until - clock()
        if force or stamp != self.lease_seen or (left is not None and left <= 0):
            self.lease_seen = stamp  # taken before the read: a grant between the two is read next time
            left = self.lease_left()
            self.lease_until = None if left is None else clock() + left
        if left is not None and left <= 0:
            if self.reason is None:
                self.begin_kill(expired_reason(self.lease_renewed))
            return None
        return now + (LEASE_REREAD if left is None else min(left, LEASE_REREAD))

    def lease_lapsed(self) -> str | None:
        """The end reason if the host's lease has run out before the job starts, else None. What it
        read is where wait() starts from (one read of SPOOL/lease per job, not two)."""
        spool = self.spec.get("spool")
        if not spool or self.spec.get("role") == "tasks":
            return None
        self.lease_seen = lease_stamp(spool)
        left = self.lease_left()
        self.lease_until = None if left is None else clock() + left
        self.lease_read = True
        return expired_reason(self.lease_renewed) if left is not None and left <= 0 else None

    def lease_left(self) -> float | None:
        """Seconds left of the host's lease in SPOOL/lease (<= 0: it ran out), None without one.
        Called just after `lease_seen` was taken: a reused supervisor (pool.py) takes the lease an
        earlier job of its own read under that very stamp (the file was not replaced since), and
        reads the file again for one that has run out, as look_at_lease does (renewed meanwhile?)."""
        global _lease_read
        spool = self.spec.get("spool")
        boot = getattr(self.recorder, "boot", None) or boot_id()  # a journal recorder has it: no read per job
        if not spool or self.spec.get("role") == "tasks":
            return None
        key = (spool, boot, self.lease_seen)
        if self.lease_seen is not None and _lease_read[0] == key and _lease_read[1][0] > clock():
            lease: tuple[float, float] | None = _lease_read[1]
        else:
            lease = read_lease(spool, boot)
            if lease is not None:
                _lease_read = (key, lease)
        if lease is None:
            return None
        self.lease_renewed = lease[1]
        return lease[0] - clock()

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
            assert self.job_status is not None  # ended() said so
            status, usage = self.job_status
            exit_code = os.waitstatus_to_exitcode(status)
            cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024
        else:
            exit_code, cpu, rss = 0, 0.0, 0
        signum = -exit_code if exit_code < 0 else None
        if reason is None and signum is not None:
            reason = self.kill_reason() if signum in self.forwarded else None
            reason = reason or f"killed by signal {signal_name(signum)}"
        note = leftovers_text(self.leftovers)
        return {
            **({"note": note} if note else {}),
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
            self.begin_kill(self.kill_reason() or "killed")
        elif signum == signal.SIGKILL:
            self.reason = self.reason or self.kill_reason() or "killed"
            self.termed_groups.update((self.pid, *self.tasks))
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
        self.termed_groups.add(self.pid)
        killpg(self.pid, signal.SIGTERM)
        killpg(self.pid, signal.SIGCONT)

    def end_tasks(self) -> None:
        """TERM (and CONT) the tasks' groups, and KILL what is left after the grace period."""
        for pid in list(self.tasks):
            self.termed_groups.add(pid)
            killpg(pid, signal.SIGTERM)
            killpg(pid, signal.SIGCONT)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace()

    def kill_reason(self) -> str | None:
        """The reason of the kill requested (the agent's note), or None if none was given."""
        text = self.recorder.kill_reason()
        return text.strip() if text and text.strip() else None

    def kill_all(self, signum: int) -> None:
        for pid in (self.pid, *self.tasks):
            killpg(pid, signum)

    def group_rss(self) -> int:
        """Resident bytes summed over this supervisor's descendants (the job and the tasks with every
        process they started, in whatever group or session) and the job's and tasks' process groups
        (their orphans, where the supervisor is no subreaper): a best-effort sample from /proc."""
        groups = frozenset(pid for pid in (self.pid, *self.tasks) if pid)
        return sum(int(fields[21]) for fields in descendants(os.getpid(), groups).values()) * PAGE_SIZE

    def start_tasks(self) -> None:
        """Start the tasks that the agent left in the host directory (tasks-LAUNCH_ID.json, each
        {"launch_id", "tasks": [{"index", "argv", "env", "cwd"}]}), each file once. Their output
        is appended to the unit's own stdout and stderr files. None starts once the unit is ending:
        each is reported finished at once, with why."""
        try:
            host_dir = self.spec["host_dir"]
            names = sorted(n for n in os.listdir(host_dir) if n.startswith("tasks-") and n.endswith(".json"))
        except (OSError, TypeError, KeyError):
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
                self.tasks[spawn_job(task, out, err, self.start_time, self.spec.get("user"))] = key
            finally:
                os.close(out)
                if err != out:
                    os.close(err)
        except JobEnded as ended:
            code = ended.result["exit_code"]
            self.recorder.task_finished(launch_id, key[1], None if code is None else code << 8, ended.result["reason"])

"""The supervisor: a unit's process of ours that runs its job (and hooks, and tasks) and records
its result however it ends. Forked by `serve` in plain mode (and for the tasks of a direct unit),
or a systemd unit's main process (`exec`, steps.py).

Invariant: `started` is recorded while the supervisor still holds the fds it inherited from the
agent, the spool lock among them; only then are they closed. See docs/agent-protocol.md.
"""

from __future__ import annotations

import gc
import os
import time

from .fds import restore_for_jobs
from .hooks import run_hooks, with_hooks
from .recorders import JournalRecorder
from .signals import SUPERVISOR_SIGNALS, signal
from .spawn import JobEnded
from .tree import become_subreaper, load_prctl, stop_leftovers
from .runas import chown_to, remove_unit_dir
from .util import make_result, proc_stat, write_all, write_file
from .watch import Watch


def make_host_dir(spec: dict, kept=None) -> bool:
    """The unit's host directory (XCE_JOB_HOST_DIR), with its hostfile if the launch gave one; True
    if this call made it (then no tasks of `xce launch` wait in it: one written later comes with
    TASKS_SIGNAL).

    An existing one is kept: in plain mode the agent may have put tasks of `xce launch` there first.
    A job run as another user (spec `user`) gets its own directory inside ours (spec job_dir, theirs,
    0700: XCE_JOB_HOST_DIR, with the hostfile), which they reach through ours (0711: they can
    neither list it nor read our spec.json and tasks files, nor rename them). With `kept` (a reused
    supervisor's hostdirs.KeptDir) the directory it kept from its last job is renamed to this one.
    """
    path, user = spec["host_dir"], spec.get("user")
    made = kept is not None and kept.give(path)
    if not made:
        try:
            os.mkdir(path, 0o700)
            made = True
            if kept is not None:
                kept.lent(path)
        except FileExistsError:
            made = False
    fresh = made and user is None  # ours alone, and empty: no reader can see a hostfile half-written
    job_dir = path
    if user is not None:
        os.chmod(path, 0o711)
        job_dir = spec["job_dir"]
        try:
            os.mkdir(job_dir, 0o700)
        except FileExistsError:
            pass
        chown_to(job_dir, user)
        os.chmod(job_dir, 0o700)
    if spec.get("hostfile") is not None:
        hostfile = os.path.join(job_dir, "hostfile")
        data = spec["hostfile"].encode("utf-8", "surrogateescape")
        if fresh:  # the job that reads it has not started: written in place (no tmp file, no rename)
            fd = os.open(hostfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                write_all(fd, data, hostfile)
            finally:
                os.close(fd)
        else:
            write_file(hostfile, data)
        chown_to(hostfile, user)
    return made


def remove_host_dir(spec: dict) -> None:
    """Remove the unit's host directory (once its result is recorded). The common case, a directory
    that holds only the hostfile we wrote, costs an unlink and an rmdir; anything else (a file the
    job left, a user's job directory) goes through remove_unit_dir's careful walk."""
    path = spec["host_dir"]
    if spec.get("user") is None:
        try:
            if spec.get("hostfile") is not None:
                # through the directory itself, never a symlink the job may have put in its place
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.unlink("hostfile", dir_fd=fd)
                finally:
                    os.close(fd)
            os.rmdir(path)
            return
        except OSError:
            pass
    remove_unit_dir(path)


_me: tuple[int, int] = (0, 0)  # (pid, its start time in /proc/PID/stat): a reused supervisor reads it once


def own_starttime() -> tuple[int, int]:
    """This process's pid and start time (clock ticks since boot, as /proc/PID/stat says)."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:  # a fresh fork: its own
        fields = proc_stat(pid)
        assert fields is not None  # this very process
        _me = (pid, int(fields[19]))
    return _me


def become_supervisor(recorder, spec: dict, start_time: float, detach: bool, let_go=None, kept=None) -> bool:
    """Run the unit as its supervisor and record its result, whatever happens (even a bug here);
    False if a bug here was the end (the process is fit for no other job). Called with
    SUPERVISOR_SIGNALS blocked; they stay blocked for good: the supervisor takes them with
    sigtimedwait. With `let_go` (a reused supervisor, pool.py), that is called once `started` is
    recorded instead of closing every fd: it closes the spool lock the worker was handed; and
    `kept` (hostdirs.KeptDir) its host directory kept from job to job, renamed, not made and removed.

    Order matters: `started` is recorded while this process still holds the fds it inherited from
    the agent, the spool lock among them (see this module's docstring); only then are they closed
    (with `detach`): the agent's pipes would hide EOF from the controller. The job itself inherits
    none of them: they are close-on-exec or replaced in spawn_job. In plain mode (spec host_dir_by
    "supervisor") this makes the unit's host directory, beside the agent rather than on its serial
    path, and removes it once the result is recorded; and with spec hooks_by "supervisor" it runs
    the unit's hooks itself: `started` (job 0) first, so that the lock is not held while they run,
    then the pre hooks (the job runs only if they all succeed; a kill stops them), the job (its
    run limit counts from here; `started` again with its pid), and the post hooks once it has
    ended, however it ended, before the result is recorded.

    Forked by the agent (`detach`: plain mode, no cgroup to hold the job), it becomes a child
    subreaper (tree.py): whatever the job starts stays its descendant, and is stopped once the job
    has ended (Watch.wait), so the post hooks run after the whole tree is gone; what hooks leave
    is stopped too, before the result is recorded.
    """
    if let_go is None:  # a reused worker (pool.py) did both once, for all its jobs
        try:
            os.setsid()  # the job's group joins this session: how a lost supervisor's job is known
        except OSError:  # exec mode under a process-group leader (systemd):
            pass  # already detached enough
        if detach:
            become_subreaper()
    watch = Watch(recorder, spec, start_time)
    own_dir = spec.get("host_dir_by") == "supervisor"
    hooks = spec.get("hooks_by") == "supervisor" and bool(spec.get("hooks"))
    by_itself = fit = True  # the job ended (or could not start) with no kill begun, nor a bug here
    detached = not detach
    outcomes: list[dict] = []

    def started(job: int) -> None:
        nonlocal detached
        pid, starttime = own_starttime()
        recorder.started(pid, starttime, start_time, job)
        if not detached:
            detached = True
            if let_go is not None:
                let_go()
                return
            os.closerange(0, 1 << 20)  # close_range(2) underneath: cheap whatever the fd limit
            null = os.open(os.devnull, os.O_RDWR)  # becomes fd 0
            os.dup2(null, 1)
            os.dup2(null, 2)

    try:
        try:
            if own_dir:
                try:
                    # made empty here, and no hook takes a TASKS_SIGNAL before the job's wait: that
                    # signal brings every task written from now on, so no listing of it at the start
                    watch.tasks_waiting = not make_host_dir(spec, kept) or hooks
                except OSError as exc:
                    reason = f"cannot make the job's host directory {spec['host_dir']}: {exc.strerror}"
                    raise JobEnded(make_result(start_time, reason)) from None
            if hooks:
                started(0)
                outcomes, failure = run_hooks(spec, "pre")
                if outcomes and outcomes[-1]["stopped"]:
                    raise JobEnded(make_result(start_time, watch.kill_reason() or "killed"))
                if failure:
                    raise JobEnded(make_result(start_time, failure))
            lapsed = watch.lease_lapsed()  # ran out meanwhile (long pre hooks, the agent gone): no job
            if lapsed is not None:
                raise JobEnded(make_result(start_time, lapsed))
            watch.start()
        except JobEnded as ended:
            result = ended.result
            stop_leftovers(watch.grace(), watch.reap)  # of the pre hooks: the post hooks run after
        else:
            started(watch.pid)
            result = watch.wait()
            by_itself = watch.reason is None
        if hooks:
            result["mode"] = spec.get("mode", "plain")
            outcomes += run_hooks(spec, "post", result)[0]
            stop_leftovers(watch.grace(), watch.reap)  # what a post hook left in the background
    except BaseException as exc:
        import traceback  # only here: keeps the agent, which every supervisor copies, small

        watch.kill_all(signal.SIGKILL)  # no job may run on once its result is written
        try:
            stop_leftovers(0.0, watch.reap)  # nor anything it started
        except Exception:  # the result below matters more: record it whatever this did
            pass
        log = recorder.error_log()
        with open(log, "a") as f:
            f.write(f"supervisor of {spec.get('unit')} (pid {os.getpid()}):\n")
            traceback.print_exc(file=f)
        result = make_result(start_time, f"supervisor error: {exc!r} (see {log})")
        by_itself = fit = False
    result["mode"] = spec.get("mode", "plain")
    recorder.finished(with_hooks(result, outcomes, spec.get("post_failure")), by_itself)
    if own_dir and not (kept is not None and fit and kept.take(spec)):
        remove_host_dir(spec)
    return fit


def fork_supervisor(recorder: JournalRecorder, spec: dict, start_time: float) -> int:
    """Fork the unit's supervisor and return its pid (fork_detached)."""
    return fork_detached(lambda: become_supervisor(recorder, spec, start_time, detach=True))


def fork_detached(run, close: tuple[int, ...] = ()) -> int:
    """Fork a supervisor that calls `run()` and exits; its pid. The child never returns from here;
    it closes the fds in `close` at once (the zygote's pipes: the agent hears of the zygote's end
    by EOF).

    SUPERVISOR_SIGNALS are blocked across the fork and stay blocked in the child, which takes them
    with sigtimedwait: a `signal` request that arrives at once is held, not fatal to the supervisor.
    """
    load_prctl()  # here, once per forker: its supervisors inherit it and need no import of their own
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
            restore_for_jobs()  # forked by the agent itself (none is left to do in the zygote's forks)
            for fd in close:
                os.close(fd)
            run()
            code = 0
        finally:
            os._exit(code)  # never return into the agent's loop
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return pid


def fork_task_supervisor(recorder: JournalRecorder, spec: dict) -> tuple[int, int]:
    """Fork a supervisor for the tasks of `xce launch` that wait in a direct unit's host directory
    (spec: role "tasks", host_dir, stdout, stderr, grace); (its pid, the fd to answer it on, see
    link.answer_tasks). It starts no task before the answer says systemd has moved it into the
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
            restore_for_jobs()  # the agent's raised fd limit is not its tasks' (fds.py)
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

"""Starting a job's (or a task's, or a hook's) process: its output files, its program on its own
PATH, posix_spawn into a process group of its own. JobEnded is a job that cannot start, raised
before any job process exists, with the result that says why, worded as every mode words it."""

from __future__ import annotations

import errno
import os

from .runas import AsUser, become, user_env
from .signals import JOB_DEFAULT_SIGNALS, signal
from .util import job_umask, make_result


class JobEnded(Exception):
    """The job cannot start; `result` says why. Raised before any job process exists."""

    def __init__(self, result: dict):
        super().__init__(result["reason"])
        self.result = result


def open_outputs(spec: dict, start_time: float) -> tuple[int, int]:
    """The job's stdout and stderr fds (append, create); stderr is stdout's when spec has none. A new
    file gets 0666 less this process's umask: a supervisor (or unit) runs with the job's. With a
    spec `user`, opened as that user (runas.AsUser): theirs, and only where they may write."""
    with AsUser(spec.get("user")):
        return _open_outputs(spec, start_time)


def _open_outputs(spec: dict, start_time: float) -> tuple[int, int]:
    fds: list[int] = []
    for path in (spec["stdout"], spec.get("stderr") or None):
        if path is None:
            fds.append(fds[0])
            continue
        try:
            fds.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666))
        except OSError as exc:
            if fds:
                os.close(fds[0])
            raise JobEnded(make_result(start_time, f"cannot open output file {path}: {exc.strerror}"))
    return fds[0], fds[1]


def spawn_job(spec: dict, out: int, err: int, start_time: float, user: dict | None = None) -> int:
    """Start `spec`'s argv (the job's, or a task's) as the leader of a new process group; its pid.
    Never through a shell.

    posix_spawn (vfork underneath) is 2-3x faster than fork+exec from Python, and reports an exec
    failure as an exception here. The program is looked up in the JOB's PATH (its env's, or
    /bin:/usr/bin), like execvpe: glibc's posix_spawnp searches the PATH of this process, which is
    set to the job's first (a supervisor is a short-lived copy: its own environment serves no one
    else). As in a shell, a command not found ends the job with 127, one that cannot be executed
    with 126 (a permission error anywhere on the PATH beats a later "not found"). With `user`
    (runas.resolve_user), the job runs as that user: spawn_as.
    """
    if user is not None:
        return spawn_as(spec, out, err, start_time, user)
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
        reason = f"exec failed: {os.strerror(exc.errno) if exc.errno is not None else exc}: {argv[0]}"
        raise JobEnded(make_result(start_time, reason, exit_code=127 if exc.errno == errno.ENOENT else 126))


def spawn_as(spec: dict, out: int, err: int, start_time: float, user: dict) -> int:
    """spawn_job for a job run as `user`: fork; in the child, what posix_spawn does (own process
    group, default signals, an empty mask, the fds) and then drop to the user (groups, gid, uid)
    before the cwd and the program are looked up, so both are checked with the user's permissions.
    HOME, USER and LOGNAME are the user's. A failure before the exec comes back on a close-on-exec
    pipe, as "STAGE ERRNO": the job never ran, and JobEnded says why as spawn_job words it."""
    argv, env, cwd = spec["argv"], user_env(spec["env"], user), spec["cwd"]
    # os.execvpe imports `warnings` when it searches the PATH: imported here, as root, since the user
    # may not read this Python's library (observed: a Python under /root, 0700, made every job of a
    # bare command name fail with an ImportError, reported as EPERM)
    import warnings  # noqa: F401
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the supervisor is single-threaded: only os calls until the exec
        stage = "setup"
        try:
            os.close(read_end)
            os.setpgid(0, 0)
            for signum in JOB_DEFAULT_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.dup2(out, 1)
            os.dup2(err, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            if null != 0:
                os.dup2(null, 0)
                os.close(null)
            stage = "user"
            become(user)
            stage = "cwd"
            os.chdir(cwd)
            stage = "exec"
            os.execvpe(argv[0], argv, env)  # the PATH of `env`, as spawn_job's lookup
        except BaseException as exc:  # whatever it is, the job must not run: say so, never return
            os.write(write_end, f"{stage} {getattr(exc, 'errno', None) or errno.EPERM}".encode())
        finally:
            os._exit(127)
    os.close(write_end)
    try:
        data = b""
        while chunk := os.read(read_end, 64):
            data += chunk
    finally:
        os.close(read_end)
    if not data:
        return pid
    os.waitpid(pid, 0)
    stage, _, number = data.decode().partition(" ")
    why = os.strerror(int(number))
    if stage == "exec":
        code = 127 if int(number) == errno.ENOENT else 126
        raise JobEnded(make_result(start_time, f"exec failed: {why}: {argv[0]}", exit_code=code))
    if stage == "cwd":
        raise JobEnded(make_result(start_time, f"cannot change directory to {cwd} as user {user['name']}: {why}"))
    raise JobEnded(make_result(start_time, f"cannot run the job as user {user['name']}: {why}"))


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
    then its program), worded as the supervisor words it; None if it can start. The output files
    it makes get the job's umask, as the supervisor would give them (the agent's own is 077)."""
    old = os.umask(job_umask(spec))
    try:
        out, err = open_outputs(spec, spec["start_time"])
    except JobEnded as ended:
        return ended.result
    finally:
        os.umask(old)
    os.close(out)
    if err != out:
        os.close(err)
    user = spec.get("user")
    if user is not None:  # systemd enters the cwd as the user: say so as spawn_as would
        with AsUser(user):
            enter = os.access(spec["cwd"], os.X_OK, effective_ids=True)
        if not enter:
            why = f"cannot change directory to {spec['cwd']} as user {user['name']}: {os.strerror(errno.EACCES)}"
            return make_result(spec["start_time"], why)
    name = spec["argv"][0]
    found, err = find_program(name, spec["env"].get("PATH"), spec["cwd"])
    if found is None:
        reason = f"exec failed: {os.strerror(err)}: {name}"
        return make_result(spec["start_time"], reason, exit_code=127 if err == errno.ENOENT else 126)
    return None

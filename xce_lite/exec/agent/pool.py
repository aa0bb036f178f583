"""Reused supervisors: workers, forked by the zygote, that each supervise plain units one after another.

A fresh supervisor per job costs a fork of the zygote, its copy-on-write faults and its exit,
~3 ms of CPU for a `true` job; a worker that runs job after job pays none of them (bench/README.md,
"Reused supervisors"). The zygote forks a worker on a socket the agent passes it and reaps it; the
agent talks to the worker on the other end itself (Workers): a job, then its "d", the release "r"
and the worker's "i", with no hop through the zygote (bench/README.md, "The agent talks to its
workers"). A worker is what a fresh supervisor is, for each job it runs:
- the spool lock is held until the job's `started` record: the agent passes its lock fd with each
  job (SCM_RIGHTS) and the worker closes it once `started` is appended; an idle worker holds none;
- the job leads a process group of its own in the worker's session, and that session holds the
  processes of one job at a time: a job's leftovers are stopped before its result is recorded, and
  a worker with a child left is not reused; so `kill_lost_session` (the worker's pid) still finds
  exactly the lost job's processes;
- nothing is inherited from the previous job: cwd (back to the zygote's), environment (the
  zygote's), umask (the job's), fds (none but the worker's socket and its journal fd, both
  close-on-exec: the job inherits none; the journal fd holds no lock between appends), signal
  mask and dispositions (the job gets every signal at its default, spawn.py), rlimits (those the
  agent was started with, fds.py; never changed per job; a job of the same user could change its
  parent's with prlimit, as it could the agent's own);
- a result is durable before anything reports it, as a fresh supervisor's: a worker appends it
  without a sync and says "d"; the agent, which treats a "d" as an end not known durable, syncs
  the journal once before the lines of that loop turn go out (server.py flush: one fdatasync for
  every result the turn reports, off the worker's path from one job to the next); a worker that
  exits syncs first (a supervisor's exit status 0 says its result is durable);
- a signal meant for the previous job never reaches the next one, and none meant for the next job
  is lost: a worker says it is done ("d") only once the result is recorded; the agent reads the
  result (from then on it sends nothing to that unit's supervisor) and only then releases the
  worker ("r"); the worker drops what is pending then (sent for the previous job, before the
  release) and answers "i". A job may be handed to it once the "r" is sent, before its "i" is
  read (the worker reads the "r", drops and answers before it reads the job): no wait for the
  worker's turn, no wake-up of its own for the job; the signals of that job wait until the agent
  has read the "i" (`settle`, from UnitState.deliver). A signal sent to the worker's pid from
  outside (not by the agent) goes to whichever job it runs or runs next, as it would to whatever
  process next had that pid.
Only units with no user to run as, no hooks of the supervisor's and the role "job" go to a worker
(agent side: poolable); a worker whose supervision went wrong (an error of its own) is not reused,
nor one past MAX_JOBS, nor one the kernel did not make a subreaper (a job's orphans would stay in
its session unseen by has_children). Standard library only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # true for mypy only: supervisors never import typing
if TYPE_CHECKING:
    from _socket import socket

import os

from .cpuslice import short_slice
from .fds import pack_fds, unpack_fds
from .hostdirs import KeptDir
from .journal import JOURNAL, SharedAppender
from .jsonl import loads
from .recorders import JournalRecorder
from .signals import SUPERVISOR_SIGNALS, signal
from .supervisor import become_supervisor, own_starttime
from .tree import become_subreaper, has_children
from .util import UNITS, job_umask

POOL_IDLE = 64  # idle workers the agent keeps (about the jobs a host runs at once); more are let go
IDLE_FOR = 60.0  # seconds an idle worker is kept
DRAIN_READ = 1.0  # seconds after its release a worker no launch took is read for its "i" (idle from then)
SEND_WAIT = 10.0  # seconds the agent waits for a worker to read what it sends; then it is given up
MAX_JOBS = 1000  # jobs a worker runs before it exits (gc is off in it: cycles are never collected)


def poolable(spec: dict) -> bool:
    """True if the unit may run in a reused supervisor: a plain job of the agent's own user,
    without hooks run by the supervisor (they may run as root or as a user, with their own env)."""
    return (spec.get("user") is None and spec.get("role", "job") == "job" and spec.get("host_dir_by") == "supervisor"
            and not (spec.get("hooks_by") == "supervisor" and spec.get("hooks")))


def send_job(sock, line: bytes, lock_fd: int) -> None:
    """Hand a worker its job: the request line, and the spool lock's fd with its first byte."""
    import _socket

    fd = pack_fds([lock_fd])
    sent = send(sock, lambda: sock.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)]))
    while sent < len(line):
        sent += send(sock, lambda rest=line[sent:]: sock.send(rest))


def send(sock, call) -> int:
    """call() (a send on the agent's non-blocking end of a worker's socket), retried while the
    worker's buffer is full, for up to SEND_WAIT; OSError (TimeoutError) past that: the worker is
    stuck. The agent's ends are non-blocking so that a send or a recv costs one syscall, not a
    poll first (a socket with a timeout polls before each): a job's line and the one-byte answers
    fit a socket's buffer, so the wait is never taken in practice. poll, not select: an agent with
    a worker per running job holds fds above select's 1024."""
    import select
    import time

    deadline = None
    while True:
        try:
            return call()
        except BlockingIOError:
            now = time.monotonic()
            deadline = deadline or now + SEND_WAIT
            if now >= deadline:
                raise TimeoutError(f"a worker read nothing for {SEND_WAIT:g} s") from None
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLOUT)
            poller.poll(int((deadline - now) * 1000) + 1)


def receive_job(sock) -> tuple[bytes, int] | None:
    """The next job's request line and the lock fd that came with it; None at EOF (let go)."""
    import _socket

    data, fds = b"", []
    while not data.endswith(b"\n"):
        # close-on-exec, as the lock fd a fresh supervisor inherits: no job may hold the lock
        chunk, anc, _flags, _addr = sock.recvmsg(1 << 16, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC)
        fds += unpack_fds(anc)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        data += chunk
    for fd in fds[1:]:
        os.close(fd)  # cannot happen: one fd per job
    return data, fds[0] if fds else -1


def drop_pending_signals() -> None:
    """Take (and drop) every pending supervisor signal: sent for the previous job, before the release."""
    while signal.sigtimedwait(SUPERVISOR_SIGNALS, 0) is not None:
        pass


def environ_raw() -> dict:
    """os.environ as CPython keeps it (bytes to bytes), compared as one dict in C; os.environ itself
    (compared key by key, decoding each) elsewhere."""
    return dict(getattr(os.environ, "_data", os.environ))


def restore_environ(env: dict[str, str], raw: dict, path: str | None) -> None:
    """Make os.environ `env` again (the zygote's; `raw`: environ_raw() then; `path`: its PATH).
    spawn_job sets PATH to the job's: put back alone, in one putenv; then one comparison in C, and
    every variable rewritten only if something else changed too."""
    if os.environ.get("PATH") != path:
        if path is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = path
    if getattr(os.environ, "_data", os.environ) != raw:  # nothing but spawn_job changes it here today
        os.environ.clear()
        os.environ.update(env)


def worker_main(sock_fd: int, spool: str, boot: str) -> None:
    """A worker's life (forked by the zygote, SUPERVISOR_SIGNALS blocked, gc off): supervise the
    jobs the agent sends, one at a time, until it lets us go (EOF) or a job leaves us unfit."""
    import _socket

    os.closerange(3, sock_fd)  # the zygote's pipes and sockets, the spool lock
    os.closerange(sock_fd + 1, 1 << 20)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)
    os.setsid()  # once: each job's group is in it, one job at a time
    reusable = become_subreaper()  # else a job's orphans leave our sight: one job, then exit
    home = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    env, raw, path = dict(os.environ), environ_raw(), os.environ.get("PATH")
    journal = SharedAppender(os.path.join(spool, JOURNAL))  # open from job to job: one open, not two per job
    sock = _socket.socket(fileno=sock_fd)
    kept = KeptDir(os.path.join(spool, UNITS), *own_starttime())  # its host directory between jobs (hostdirs.py)
    try:
        for count in range(1, MAX_JOBS + 1):
            got = receive_job(sock)
            if got is None:
                return
            line, lock = got
            os.fchdir(home)
            restore_environ(env, raw, path)
            req = loads(line)
            os.umask(job_umask(req["spec"]))
            held = [lock]

            def let_go(held=held) -> None:
                if held[0] >= 0:
                    os.close(held[0])
                    held[0] = -1

            fit = become_supervisor(JournalRecorder(spool, req["unit"], boot, journal), req["spec"],
                                    req["start_time"], detach=True, let_go=let_go, kept=kept)
            let_go()  # a job that never started was recorded with the lock held, as a fresh supervisor does
            if not fit or not reusable or has_children() or not poolable(req["spec"]) or count == MAX_JOBS:
                return  # exit: the zygote reports it as a supervisor's end
            try:
                sock.sendall(b"d")
                if sock.recv(1) != b"r":  # the agent knows the result: no signal for this job comes any more
                    return  # EOF: let go (the agent is gone, or lost its zygote)
                drop_pending_signals()
                sock.sendall(b"i")
            except OSError:  # the agent is gone, or lost its zygote
                return
    finally:
        try:
            journal.sync()  # a supervisor's exit status 0 says its result is durable: so does a worker's
        finally:
            kept.drop()  # even if the sync failed (then the exit status says so: the agent syncs)


class Workers:
    """The agent's side of its reused supervisors: pid -> its end of the worker's socket
    (non-blocking), which are idle (released, and said so) and since when. The zygote forks a
    worker with the other end (a "w" request, the fd passed with it) and reaps it; the agent hands
    it each job, hears its "d" and "i" and releases it itself, with no hop through the zygote.
    Single-threaded, in the agent's loop; `poller` (the serve loop's) polls the sockets of the
    workers that run a job (their "d", or EOF), not those released: a released worker's "i" is
    read when a launch wants a worker (take), or DRAIN_READ after its release (expire), so the
    agent does not wake for it (it came ~0.4 times per job as a wake-up of its own). A worker that
    dies meanwhile is reported by the zygote, which reaps it."""

    def __init__(self, lock_fd: int, slices: bool = False):
        self.lock_fd, self.poller, self.slices = lock_fd, None, slices  # slices: give workers the agent's
        self.socks: dict[int, socket] = {}  # pid -> our end of its socket
        self.pids: dict[int, int] = {}  # socket fd -> pid
        self.idle: list[tuple[int, float]] = []  # (pid, released at), the latest last: the warmest first
        self.done: set[int] = set()  # said "d", not yet released
        self.draining: dict[int, float] = {}  # released (and when), not yet idle: its "i" to come, or unread
        self.polled: set[int] = set()  # socket fds on `poller`: the workers that run a job
        self.ended: list[int] = []  # said "d" (its job's result is recorded), not yet taken by the agent
        self.unsettled: set[int] = set()  # handed a job after its "r", its "i" not read yet: no signal

    def watch(self, poller) -> None:
        """Poll the sockets of busy workers on `poller` (the serve loop's), those there are and
        those to come."""
        self.poller = poller
        for fd in self.polled:
            poller.register(fd, 1)  # POLLIN

    def poll(self, fd: int, on: bool) -> None:
        """Hear the worker of socket `fd` on the serve loop's poller (it runs a job), or not."""
        if on != (fd in self.polled):
            if on:
                self.polled.add(fd)
            else:
                self.polled.discard(fd)
            if self.poller is not None:
                if on:
                    self.poller.register(fd, 1)  # POLLIN: its "d", or EOF
                else:
                    self.poller.unregister(fd)

    def read_drained(self, now: float, before: float | None = None) -> None:
        """Read the "i" (or EOF) of released workers, the earliest released first: those released
        before `before`; without it, until one is idle (a launch wants one). The idle ones join
        `idle`; a read that finds nothing yet costs one syscall."""
        for pid, since in list(self.draining.items()):
            if before is None and self.idle:
                return
            if before is not None and since >= before:
                return  # released in order: the rest came later
            self.readable(self.socks[pid].fileno(), now)

    def take(self, line: bytes) -> int | None:
        """Hand the job of `line` to an idle worker, else to one released whose "i" has not come
        yet (unsettled until it does: see the module's docstring); its pid, or None if none is to
        be had (fork one: `add`)."""
        import time

        if self.draining:
            self.read_drained(time.monotonic())
        while self.idle or self.draining:
            if self.idle:
                pid, _since = self.idle.pop()
            else:  # the earliest released: the likeliest to have dropped its stale signals
                pid = next(iter(self.draining))
                del self.draining[pid]
                self.unsettled.add(pid)
            try:
                send_job(self.socks[pid], line, self.lock_fd)
                self.poll(self.socks[pid].fileno(), True)
                return pid
            except OSError:  # it died meanwhile (the zygote reports its end), or is stuck
                self.forget(pid)
        return None

    def settle(self, pid: int) -> bool:
        """Before a signal goes to worker `pid`: if it was handed its job before its "i" was read,
        read until it comes (the worker has dropped its previous job's signals then), up to
        SEND_WAIT; False if it did not (the caller holds the signal until the job's `started`). A
        "d" read with it waits in `ended` for the serve loop (take_exits): no release before it."""
        import select
        import time

        deadline = time.monotonic() + SEND_WAIT
        while pid in self.unsettled and pid in self.socks:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller = select.poll()
            poller.register(self.socks[pid].fileno(), select.POLLIN)
            if poller.poll(int(left * 1000) + 1):
                self.readable(self.socks[pid].fileno(), time.monotonic())
        return True

    def add(self, pid: int, sock, line: bytes) -> None:
        """A worker the zygote forked on `sock` (our end): hand it the job of `line`. OSError if
        that cannot be done (the worker is let go: it exits at EOF)."""
        sock.setblocking(False)  # see send(): SEND_WAIT for a worker that reads nothing
        if self.slices:
            short_slice(pid)  # the agent's short CPU slice (XCE_AGENT_SLICE=1), which its jobs do not get
        self.socks[pid], self.pids[sock.fileno()] = sock, pid
        self.poll(sock.fileno(), True)
        try:
            send_job(sock, line, self.lock_fd)
        except OSError:
            self.forget(pid)
            raise

    def readable(self, fd: int, now: float) -> None:
        """A worker's socket is readable: its "d" (its job ended: in `ended` for the agent), its
        "i" (idle now), or EOF (it is gone: the zygote reports its end)."""
        pid = self.pids.get(fd)
        if pid is None:
            return
        try:
            data = self.socks[pid].recv(64)
        except BlockingIOError:  # nothing after all (poll said readable): nothing to do
            return
        except OSError:
            data = b""
        if not data:
            self.forget(pid)
            return
        for byte in data:
            if byte == ord("d"):
                self.done.add(pid)
                self.ended.append(pid)
            elif byte == ord("i") and pid in self.draining:  # it dropped its stale signals: idle
                del self.draining[pid]
                self.idle.append((pid, now))
                while len(self.idle) > POOL_IDLE:  # the oldest idle ones beyond POOL_IDLE go
                    self.forget(self.idle.pop(0)[0])
            elif byte == ord("i"):  # handed a job before: its signals may go from now on
                self.unsettled.discard(pid)

    def release(self, pid: int) -> None:
        """The agent knows the worker's job has ended, and sends that job no signal from now on:
        tell the worker, which drops the signals sent for that job and then says it is idle."""
        import time

        if pid not in self.done:
            return  # gone meanwhile
        self.done.discard(pid)
        sock = self.socks[pid]
        try:
            send(sock, lambda: sock.send(b"r"))
        except OSError:
            self.forget(pid)
            return
        self.draining[pid] = time.monotonic()
        self.poll(sock.fileno(), False)  # its "i" is read when a worker is wanted: no wake-up for it

    def expire(self, now: float) -> float | None:
        """Read the "i" of the workers released DRAIN_READ ago that no launch took, and let go of
        the workers idle for IDLE_FOR; seconds until the next of these is due (None: none)."""
        if self.draining:
            self.read_drained(now, now - DRAIN_READ)
        while self.idle and now - self.idle[0][1] >= IDLE_FOR:
            self.forget(self.idle.pop(0)[0])
        due = [t + DRAIN_READ - now for t in self.draining.values()]
        if self.idle:
            due.append(self.idle[0][1] + IDLE_FOR - now)
        return max(0.0, min(due)) if due else None

    def forget(self, pid: int) -> None:
        """Close our end of the worker's socket (an idle worker exits at that EOF; a busy one once
        its job's result is recorded)."""
        sock = self.socks.pop(pid, None)
        if sock is None:
            return
        fd = sock.fileno()
        self.pids.pop(fd, None)
        self.poll(fd, False)
        sock.close()
        self.done.discard(pid)
        self.draining.pop(pid, None)
        self.unsettled.discard(pid)
        self.idle = [(p, t) for p, t in self.idle if p != pid]

    def forget_all(self) -> None:
        for pid in list(self.socks):
            self.forget(pid)

"""The zygote: a lean process that forks plain mode's supervisors for the agent.

`serve` forks it early, before the agent imports its server and grows; it imports only what a
supervisor runs (supervisor.py and its imports). A launch then costs a fork of this small, idle
process instead of one of the whole agent: the agent neither copies its page tables per job nor
takes copy-on-write faults while a supervisor shares its heap (bench/README.md, "The zygote").

Between the two, a socket of lines (agent -> zygote) and a pipe (zygote -> agent). Agent ->
zygote: one JSON object per unit to start, {"unit", "spec", "start_time"}, a launch request's units
in one write; or "w": fork a reused supervisor (pool.py) on the socket passed with the request's
first byte (SCM_RIGHTS, one per "w", in order). Zygote -> agent, in request order: "+PID" (forked)
or "!WHY" (the fork failed); and at any time "xPID STATUS" when a supervisor or a worker has ended
(its wait status): the agent hears of their ends as it did through SIGCHLD. The agent hands a
worker its jobs, hears their ends and releases it on the worker's own socket (pool.Workers): an
idle worker costs a launch no round trip at all.

Invariants: a supervisor is exactly what fork_supervisor makes (same spec, same recorder, same
signals blocked, the job's umask, the spool lock held until its `started` record): only its parent
changes; a worker keeps one pid, start time and session across its jobs, one job at a time.
The zygote holds no fd of the controller's (stdin, stdout) and exits at EOF of its request socket,
when the agent is gone; supervisors outlive it as they outlive the agent. If the zygote dies first,
the agent watches the units it had forked (their journal records, their pids) and forks another at
its next launch (its workers let go, as its end let them go: the busy ones once their result is
recorded); a unit whose fork was never answered counts as starting for START_GRACE.
"""

from __future__ import annotations

import os
import sys
import time

from .fds import keep_only, restore_for_jobs, send_with_fds, unpack_fds
from .hostdirs import sweep
from .jsonl import dumps, loads
from .pool import Workers, poolable, worker_main
from .recorders import JournalRecorder
from .signals import signal
from .supervisor import become_supervisor, fork_detached
from .tree import load_prctl
from .util import UNITS, boot_id, child_exited, job_umask

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .shared import AgentState
    from .state import UnitState

REPLY_TIMEOUT = 30.0  # seconds the agent waits for a fork's answer before it gives the zygote up
NEW_WORKERS = 64  # at most this many workers asked of the zygote per request (their fds in one message)


class Zygote:
    """The agent's handle of its zygote: its pid and the two pipes' ends (non-blocking reads)."""

    def __init__(self, pid: int, requests: int, replies: int):
        self.pid, self.requests, self.replies = pid, requests, replies
        self.buffer = b""
        self.kids: set[int] = set()  # supervisors it forked for us that have not ended yet
        self.exits: list[tuple[int, int]] = []  # (pid, wait status) reported, not yet handled
        self.dead = False

    def spawn(self, items: list[tuple[str, dict, float]], workers: Workers) -> list[tuple[int | None, str | None]]:
        """Start a supervisor for each (unit, spec, start_time), in one round trip at most; (pid,
        None) or (None, why) for each, in order. A poolable unit goes to an idle worker (no round
        trip), else to a new one the zygote forks on a socket passed to it ("w", NEW_WORKERS per
        request at most; a fresh one if the agent cannot make that socket: out of fds); any other
        unit to a fresh supervisor. OSError only if the zygote is gone, or made no progress for
        REPLY_TIMEOUT (killed then): the items may have started or not."""
        import _socket
        from _socket import AF_UNIX, SOCK_CLOEXEC, SOCK_STREAM, socketpair

        answers: list[tuple[int | None, str | None] | None] = [None] * len(items)
        asked: list[tuple[int, _socket.socket | None, bytes]] = []  # (item, our end of a new worker's socket, line)
        theirs: list[_socket.socket] = []
        try:
            for i, (unit, spec, start_time) in enumerate(items):
                line = dumps({"unit": unit, "spec": spec, "start_time": start_time})
                if poolable(spec):
                    pid = workers.take(line)
                    if pid is not None:
                        self.kids.add(pid)
                        answers[i] = (pid, None)
                        continue
                    try:  # out of fds (EMFILE) is the agent's trouble, not a lost zygote: a fresh supervisor then
                        pair = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC) if len(theirs) < NEW_WORKERS else None
                    except OSError:
                        pair = None
                    if pair is not None:
                        theirs.append(pair[1])
                        asked.append((i, pair[0], line))
                        continue
                asked.append((i, None, line))
            request = b"".join(b"w\n" if end is not None else line for _i, end, line in asked)
            replies = self.talk(request, len(asked), [t.fileno() for t in theirs]) if asked else []
        except BaseException:
            for _i, end, _line in asked:
                if end is not None:
                    end.close()
            raise
        finally:
            for other in theirs:
                other.close()
        for (i, end, line), (pid, why) in zip(asked, replies):
            if end is not None and pid is None:
                end.close()
            elif end is not None and pid is not None:
                try:
                    workers.add(pid, end, line)
                except OSError as exc:  # nothing started: it leaves at EOF, its end is reported
                    self.kids.discard(pid)
                    pid, why = None, f"cannot hand the job to its supervisor: {exc}"
            answers[i] = (pid, why)
        return answers  # type: ignore[return-value]  # every item answered above

    def talk(self, request: bytes, forks: int, fds: list[int]) -> list[tuple[int | None, str | None]]:
        """Write `request` (`fds` passed on its first byte: one per "w" line, in order) and read the answers
        of its `forks` lines. Its bytes are written as the zygote reads them, its lines read meanwhile:
        neither waits for the other with a full buffer. OSError as spawn(). poll: fds may pass 1024."""
        import select

        poller = select.poll()
        poller.register(self.replies, select.POLLIN)
        poller.register(self.requests, select.POLLOUT)
        data = memoryview(request)
        answers: list[tuple[int | None, str | None]] = []
        deadline = time.monotonic() + REPLY_TIMEOUT
        ready = False  # read only once select says so: a read just after our write finds nothing yet
        while data or len(answers) < forks:
            if data:
                try:
                    sent = send_with_fds(self.requests, data, fds) if fds else os.write(self.requests, data)
                    data, fds = data[sent:], []
                    deadline = time.monotonic() + REPLY_TIMEOUT
                except BlockingIOError:
                    pass
                if not data:
                    poller.unregister(self.requests)
            for line in self.read() if ready else ():
                deadline = time.monotonic() + REPLY_TIMEOUT
                if line[:1] == b"+":
                    self.kids.add(int(line[1:]))
                    answers.append((int(line[1:]), None))
                elif line[:1] == b"!":
                    answers.append((None, line[1:].decode("utf-8", "replace")))
                else:
                    self.note(line)
            if not data and len(answers) == forks:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise OSError(f"the zygote made no progress for {REPLY_TIMEOUT:g} s")
            ready = any(fd == self.replies for fd, _ev in poller.poll(int(left * 1000) + 1))
        return answers

    def read(self) -> list[bytes]:
        """The complete lines there are now; OSError once the zygote is gone (EOF)."""
        try:
            chunk = os.read(self.replies, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.dead = True
            raise OSError("the zygote exited")
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        return lines

    def note(self, line: bytes) -> None:
        """An "xPID STATUS" line: a supervisor (or a worker) ended."""
        if line[:1] == b"x":
            pid, status = (int(x) for x in line[1:].split())
            self.kids.discard(pid)
            self.exits.append((pid, status))

    def kill(self) -> None:
        self.dead = True
        try:
            os.kill(self.pid, signal.SIGKILL)  # ours: the agent's own child
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for fd in (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass


def start_zygote(spool: str, lock_fd: int) -> Zygote:
    """Fork the zygote (the caller's child); its handle. OSError if it cannot be forked."""
    import _socket

    # requests on a socket: a new worker's end of its socket is passed with its "w" (SCM_RIGHTS)
    req_w, req_r = (s.detach() for s in _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC))
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError:
        for fd in (req_r, req_w, rep_r, rep_w):
            os.close(fd)
        raise
    if pid == 0:
        code = 70
        try:
            os.close(req_w)
            os.close(rep_r)
            zygote_main(spool, lock_fd, req_r, rep_w)
            code = 0
        finally:
            os._exit(code)  # never return into the agent
    os.close(req_r)
    os.close(rep_w)
    os.set_blocking(rep_r, False)
    os.set_blocking(req_w, False)
    return Zygote(pid, req_w, rep_r)


def zygote_main(spool: str, lock_fd: int, requests: int, replies: int) -> None:
    """The zygote's loop: fork a supervisor per request line (a worker per "w", on the socket that
    came with it), report each one's end, and return at EOF of `requests` (the agent is gone).
    Single-threaded, like the agent: os.fork is safe."""
    import _socket
    import gc
    import select

    gc.disable()  # nothing it keeps makes cycles; collections would only touch pages its forks share
    signal.set_wakeup_fd(-1)  # the agent's (when it forks a new zygote), not ours
    keep_only({lock_fd, requests, replies})
    restore_for_jobs()  # the agent's own is raised (fds.py): the supervisors, and their jobs, get this one
    load_prctl()  # once here: every supervisor inherits it
    import resource  # noqa: F401 - os.wait4 imports it for its rusage: once here, not in every supervisor
    boot, units = boot_id(), os.path.join(spool, UNITS)
    sweep(units)  # the host directories kept by workers that died with an earlier agent (hostdirs.py)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    pending, mine = b"", (requests, replies, wake_r, wake_w)
    channel = _socket.socket(fileno=requests)
    sockets: list[int] = []  # fds passed for "w" lines not yet read, in order
    while True:
        ready = {fd for fd, _ev in poller.poll()}
        out = []
        reap = wake_r in ready  # SIGCHLD came (its wake-up byte stays until read): else no wait4 to make
        if reap:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if requests in ready:
            data, anc, _flags, _addr = channel.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * NEW_WORKERS),
                                                       _socket.MSG_CMSG_CLOEXEC)
            sockets += unpack_fds(anc)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if not line:
                    continue
                try:  # the supervisor reads its request: the less the zygote writes, the fewer pages it copies
                    if line == b"w":  # a reused supervisor (pool.py), on the socket that came with it
                        if not sockets:
                            raise OSError("no socket came with the request for a worker")
                        fd = sockets.pop(0)
                        try:
                            out.append(b"+%d\n" % fork_detached(lambda fd=fd: worker_main(fd, spool, boot)))
                        finally:
                            os.close(fd)
                    else:
                        # not holding a worker's socket passed later in this request: its agent would
                        # never see EOF once that worker died, and could hand a job to a dead worker
                        fork = fork_detached(lambda line=line: supervise(line, spool, boot), (*mine, *sockets))
                        out.append(b"+%d\n" % fork)
                except OSError as exc:
                    out.append(f"!{exc}\n".encode("utf-8", "replace"))
        while reap:  # every supervisor that ended (SIGCHLD may merge several)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            out.append(b"x%d %d\n" % (pid, status))
            if os.WIFSIGNALED(status):  # a worker killed leaves the host directory it kept
                sweep(units, pid)
        if out:
            data = b"".join(out)
            while data:
                data = data[os.write(replies, data) :]


def supervise(line: bytes, spool: str, boot: str) -> None:
    """In a supervisor the zygote forked: become the supervisor of the request `line`, with the
    job's umask (the supervisor's own files have explicit modes), as fork_supervisor's child would."""
    req = loads(line)
    os.umask(job_umask(req["spec"]))
    become_supervisor(JournalRecorder(spool, req["unit"], boot), req["spec"], req["start_time"], detach=True)


class ZygoteOps:
    """The Agent's side of its zygote (a part of the Agent, server.py; of `state`, it changes `zygote`,
    `children`, `child_units`, `doubtful`, `watched`, `poller`); `unit_state` hears of ended supervisors."""

    def __init__(self, state: AgentState, unit_state: UnitState):
        self.state, self.unit_state = state, unit_state
        self.workers = Workers(state.lock_fd, slices=True)  # the reused supervisors, talked to without the zygote

    def spawn_supervisors(self, items: list[tuple[str, dict, float]]) -> list[tuple[int | None, str | None]]:
        """(pid, None) or (None, why) for each (unit, spec, start_time), forked by the zygote (a new one if
        there is none, or it exited); None for all when there is no zygote to ask (fork them here)."""
        s = self.state
        if s.zygote is not None and child_exited(s.zygote.pid):  # its SIGCHLD not taken yet: asked, its broken
            self.zygote_lost("it exited")  # pipe would make the whole launch unknown (lost at START_GRACE)
        if s.zygote is None:
            try:
                s.zygote = start_zygote(s.spool, s.lock_fd)
            except OSError as exc:
                print(f"agent: cannot fork a zygote ({exc}); forking supervisors itself", file=sys.stderr, flush=True)
                return [(None, None)] * len(items)
            if s.poller is not None:
                s.poller.register(s.zygote.replies, 1)  # POLLIN
        for item in items:
            s.doubtful[item[0]] = time.monotonic() + START_GRACE_PLAIN  # until its fork is answered
        try:
            answers = s.zygote.spawn(items, self.workers)  # ends told meanwhile wait for take_exits()
        except OSError as exc:
            self.zygote_lost(str(exc))
            return [(None, "unknown")] * len(items)  # each stays doubtful: see zygote_lost
        for item in items:
            s.doubtful.pop(item[0], None)
        return answers

    def zygote_readable(self) -> None:
        """Its lines (supervisors' ends), or its EOF: read on the serve loop's poll()."""
        zygote = self.state.zygote
        assert zygote is not None  # its pipe is polled only while it is the agent's
        try:
            for line in zygote.read():
                zygote.note(line)
        except OSError as exc:
            self.zygote_lost(str(exc))
        self.take_exits()

    def worker_readable(self, fd: int) -> None:
        """A worker's socket is readable (on the serve loop's poll()): its job's end, or it is idle."""
        self.workers.readable(fd, time.monotonic())
        self.take_exits()

    def take_exits(self) -> None:
        """Act on the ends of jobs the workers told ("d": recorded, synced before it goes out, pool.py)
        and of supervisors the zygote told (once their pids are known as children); then release
        those workers: their units' results are known now."""
        s = self.state
        while self.workers.ended or (s.zygote is not None and s.zygote.exits):
            ended, self.workers.ended = self.workers.ended, []
            exits: list[tuple[int, int | None]] = [(pid, None) for pid in ended]
            if s.zygote is not None:
                s.zygote.kids.difference_update(ended)
                exits += s.zygote.exits
                s.zygote.exits = []
            self.unit_state.reaped_children(exits)
            for pid, _status in exits[len(ended) :]:  # the zygote reaped it: a worker is gone, whatever its socket says
                self.workers.forget(pid)
            for pid in ended:
                self.workers.release(pid)

    def zygote_lost(self, why: str) -> None:
        """The zygote is gone: the supervisors it forked are no child of anyone we hear from. Their
        units are watched (journal, pid) from now on, and the next launch forks a new zygote."""
        s = self.state
        zygote, s.zygote = s.zygote, None
        if zygote is None:
            return  # already judged lost
        print(f"agent: the zygote (pid {zygote.pid}) is gone ({why}); watching its supervisors", file=sys.stderr,
              flush=True)
        if s.poller is not None:
            s.poller.unregister(zygote.replies)
        exits, zygote.exits = zygote.exits, []
        self.unit_state.reaped_children(exits)
        for pid in zygote.kids:
            unit = s.children.pop(pid, None)
            if unit is not None and s.child_units.get(unit, (None,))[0] == pid:
                del s.child_units[unit]
                s.doubtful[unit] = time.monotonic() + START_GRACE_PLAIN  # its `started` may be on its way
                s.watched.add(unit)
        for unit in s.doubtful:
            s.watched.add(unit)
        self.workers.forget_all()  # as its own end would have: the idle ones leave, the busy ones once done
        zygote.kill()
        zygote.close()


# Seconds a plain unit whose supervisor's fork was never answered (the zygote died meanwhile), or
# whose supervisor has not recorded `started` yet, counts as starting: a forked supervisor's first
# act is that record.
START_GRACE_PLAIN = 10.0

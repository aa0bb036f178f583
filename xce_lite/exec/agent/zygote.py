"""The zygote: a lean process that forks plain mode's supervisors for the agent.

`serve` forks it early, before the agent imports its server and grows; it imports only what a
supervisor runs (supervisor.py and its imports). A launch then costs a fork of this small, idle
process instead of one of the whole agent: the agent neither copies its page tables per job nor
takes copy-on-write faults while a supervisor shares its heap (bench/README.md, "The zygote").

Between the two, two pipes of lines. Agent -> zygote: one JSON object per unit to start, {"unit",
"spec", "start_time"}, a launch request's units in one write. Zygote -> agent, in request order:
"+PID" (forked) or "!WHY" (the fork failed); and at any time "xPID STATUS" when a supervisor has
ended (its wait status): the agent hears of its supervisors' ends as it did through SIGCHLD.

A request line that starts with "p" (agent side: pool.poolable) goes to a reused supervisor of
the zygote's pool (pool.py), which answers "+PID" as a fork would; when its job has ended the
zygote tells the agent "dPID" (as "xPID 0": the result is durable) and hands it another job only
after the agent's "rPID" (released: the agent has read that result) and the worker's own answer.

Invariants: a supervisor is exactly what fork_supervisor makes (same spec, same recorder, same
signals blocked, the job's umask, the spool lock held until its `started` record): only its parent
changes; a pool worker keeps one pid, start time and session across its jobs, one job at a time.
The zygote holds no fd of the controller's (stdin, stdout) and exits at EOF of its request pipe,
when the agent is gone; supervisors outlive it as they outlive the agent. If the zygote dies first,
the agent watches the units it had forked (their journal records, their pids) and forks another
zygote at its next launch; a unit whose fork was never answered counts as starting for START_GRACE,
for its supervisor's `started` record may still come.
"""

from __future__ import annotations

import os
import sys
import time

from .jsonl import dumps, loads
from .pool import Pool, poolable
from .recorders import JournalRecorder
from .signals import signal
from .supervisor import become_supervisor, fork_detached
from .tree import load_prctl
from .util import boot_id, job_umask

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .shared import AgentState
    from .state import UnitState

REPLY_TIMEOUT = 30.0  # seconds the agent waits for a fork's answer before it gives the zygote up


class Zygote:
    """The agent's handle of its zygote: its pid and the two pipes' ends (non-blocking reads)."""

    def __init__(self, pid: int, requests: int, replies: int):
        self.pid, self.requests, self.replies = pid, requests, replies
        self.buffer = b""
        self.kids: set[int] = set()  # supervisors it forked for us that have not ended yet
        self.exits: list[tuple[int, int]] = []  # (pid, wait status) reported, not yet handled
        self.done: list[int] = []  # workers whose job ended (among exits), to release once handled
        self.dead = False

    def spawn(self, items: list[tuple[str, dict, float]]) -> list[tuple[int | None, str | None]]:
        """Fork a supervisor for each (unit, spec, start_time), in one round trip; (pid, None) or
        (None, why) for each, in order. Raises OSError if the zygote is gone, or makes no progress
        for REPLY_TIMEOUT (it is killed then): the items without an answer may have been forked or
        not. Its requests are written as it reads them, its lines read meanwhile: neither waits
        for the other with a full pipe."""
        data = b"".join((b"p" if poolable(spec) else b"") + dumps({"unit": u, "spec": spec, "start_time": t})
                        for u, spec, t in items)
        return self.talk(data, len(items))

    def release(self, pids: list[int]) -> None:
        """Let the zygote give these workers (pool.py) their next job: the agent has read the result
        of the job each had, and sends its supervisor no signal from now on. OSError as spawn."""
        self.talk(b"".join(b"r%d\n" % pid for pid in pids), 0)

    def talk(self, request: bytes, forks: int) -> list[tuple[int | None, str | None]]:
        """Write `request` and read the answers of its `forks` (spawn). With none to wait for
        (release), the zygote's lines are left to the serve loop's poll."""
        import select

        data = memoryview(request)
        answers: list[tuple[int | None, str | None]] = []
        deadline = time.monotonic() + REPLY_TIMEOUT
        ready = False  # read only once select says so: a read just after our write finds nothing yet
        while data or len(answers) < forks:
            if data:
                try:
                    data = data[os.write(self.requests, data) :]
                    deadline = time.monotonic() + REPLY_TIMEOUT
                except BlockingIOError:
                    pass
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
            ready = bool(select.select([self.replies], [self.requests] if data else [], [], left)[0])
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
        """An "xPID STATUS" line: a supervisor ended; "dPID": a reused one (pool.py) ended its job,
        whose result is durable, as a supervisor that exited 0: it waits for its release."""
        if line[:1] == b"x":
            pid, status = (int(x) for x in line[1:].split())
            self.kids.discard(pid)
            self.exits.append((pid, status))
        elif line[:1] == b"d":
            pid = int(line[1:])
            self.kids.discard(pid)
            self.exits.append((pid, 0))
            self.done.append(pid)

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
    req_r, req_w = os.pipe2(os.O_CLOEXEC)
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


def keep_only(fds: set[int]) -> None:
    """Close every fd above 2 but `fds`; 0 and 1 (the controller's pipes, which the agent's end
    must close) become /dev/null, and so does 2 unless it is a log file (an SSH session's stderr
    would be held open)."""
    import stat

    low = 3
    for fd in sorted(fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    if not stat.S_ISREG(os.fstat(2).st_mode):
        os.dup2(null, 2)
    os.close(null)


def zygote_main(spool: str, lock_fd: int, requests: int, replies: int) -> None:
    """The zygote's loop: fork a supervisor per request line, report each one's end, and return at
    EOF of `requests` (the agent is gone). Single-threaded, like the agent: os.fork is safe."""
    import gc
    import select

    gc.disable()  # nothing it keeps makes cycles; collections would only touch pages its forks share
    signal.set_wakeup_fd(-1)  # the agent's (when it forks a new zygote), not ours
    keep_only({lock_fd, requests, replies})
    load_prctl()  # once here: every supervisor inherits it
    import resource  # noqa: F401 - os.wait4 imports it for its rusage: once here, not in every supervisor
    boot = boot_id()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    pending, mine = b"", (requests, replies, wake_r, wake_w)
    pool = Pool(spool, boot, lock_fd, poller, mine)
    while True:
        ready = {fd for fd, _ev in poller.poll(pool.expire(time.monotonic()))}
        out = []
        reap = wake_r in ready  # SIGCHLD came (its wake-up byte stays until read): else no wait4 to make
        if reap:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        for fd in ready - {wake_r, requests}:
            out.append(pool.readable(fd, time.monotonic()))  # a worker's job has ended: before any fork answer below
        if requests in ready:
            data = os.read(requests, 1 << 16)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if not line:
                    continue
                if line[:1] == b"r":  # the agent knows that worker's job ended
                    pool.release(int(line[1:]))
                    continue
                try:  # the supervisor reads its request: the less the zygote writes, the fewer pages it copies
                    if line[:1] == b"p":  # may run in a reused supervisor (pool.py)
                        out.append(b"+%d\n" % pool.run(line[1:] + b"\n"))
                    else:
                        out.append(b"+%d\n" % fork_detached(lambda line=line: supervise(line, spool, boot), pool.fds()))
                except OSError as exc:
                    out.append(f"!{exc}\n".encode("utf-8", "replace"))
        if pool.outbox:
            out.append(pool.outbox)
            pool.outbox = b""
        while reap:  # every supervisor that ended (SIGCHLD may merge several)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            pool.forget(pid)
            out.append(b"x%d %d\n" % (pid, status))
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

    def spawn_supervisors(self, items: list[tuple[str, dict, float]]) -> list[tuple[int | None, str | None]]:
        """(pid, None) or (None, why) for each (unit, spec, start_time), forked by the zygote (a
        new one if there is none); None for all when there is no zygote to ask (fork them here)."""
        s = self.state
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
            answers = s.zygote.spawn(items)  # ends it tells meanwhile wait for take_exits()
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

    def take_exits(self) -> None:
        """Act on the supervisors' ends the zygote told (once their pids are known as children);
        then release the workers among them (pool.py): their units' results are known now."""
        s = self.state
        while s.zygote is not None and s.zygote.exits:
            zygote = s.zygote
            exits, zygote.exits = zygote.exits, []
            done, zygote.done = zygote.done, []
            self.unit_state.reaped_children(exits)
            if done:
                try:
                    zygote.release(done)  # its answers may tell of more ends: the loop takes them
                except OSError as exc:
                    if s.zygote is zygote:  # not one a nested call already judged lost and replaced
                        self.zygote_lost(str(exc))

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
        zygote.kill()
        zygote.close()


# Seconds a plain unit whose supervisor's fork was never answered (the zygote died meanwhile), or
# whose supervisor has not recorded `started` yet, counts as starting: a forked supervisor's first
# act is that record.
START_GRACE_PLAIN = 10.0

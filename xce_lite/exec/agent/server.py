"""The Agent: the composition root of the serving agent's parts, and `serve`'s loop over one poll()
(the controller's requests on stdin, SIGCHLD, jobs' connections, the manager's socket, the watch
timer). The parts share one AgentState (shared.py), each given in its constructor the state and the
parts it calls, none holding the Agent: unit_state (state.py: journal, unit status), link (the
manager's connection), manager (systemd's calls), zygotes (plain mode's forker), host_lease and
lease_enforcer (lease.py), unit_ops (launch, signal, forget), tasks (`xce launch`), reads (hello,
ping, list, read). The Agent routes each request's op to its part.

Single-threaded, so os.fork is safe. The agent never touches running jobs when it exits (on stdin
EOF); it first waits for systemd's answer to the starts it asked for. Under a lease, an agent whose
controller went away stays (without stdin) while units run or wait queued behind one (it starts
them as their predecessors end, successors.py): it stops them when the lease runs out, and leaves
as soon as none runs or waits, or a new agent asks for the spool. See docs/agent-protocol.md.
"""

from __future__ import annotations

import os
import sys
import time

from .journal import JOURNAL_LIMIT
from .jsonl import dumps, loads
from .lease import LEASE_RETRY, HostLease, LeaseEnforcer
from .link import ManagerLink
from .manager import Manager
from .reads import Reads
from .shared import AgentState
from .signals import signal
from .state import UnitState
from .successors import Successors
from .tasks import TaskOps
from .unitops import UnitOps
from .util import VERSION
from .validate import Refused
from .zygote import ZygoteOps

OPS = ("hello", "ping", "launch", "signal", "list", "forget", "read", "tasks", "launch_done", "lease", "withdraw")
WATCH_INTERVAL = 0.5  # seconds between checks of units this agent did not fork
COMPACT_RETRY = 50.0  # milliseconds before the next try to compact, when the journal's lock was busy
RESULT_HOLD = 0.005  # seconds a turn's ends may wait for the next turn's sync, while the host keeps busy
HOLD_QUEUED = 3  # successors queued behind each one that started, for that (quiet_ends.KEEP_BACKLOG's)
ENDED = b'{"event":"finished","unit":"'  # the lines that may wait: ends, and successors' starts
STARTED = b'{"event":"unqueued","unit":"'


class Agent:
    """The serve loop over the parts. Single-threaded: requests, SIGCHLD, jobs' connections and the
    watch timer share one poll().

    In systemd modes, units are started by calls on the manager's private D-Bus socket, whose
    replies and UnitRemoved signals come into the same poll(), so that the loop never waits for
    systemd. In plain mode its zygote (zygote.py, `state.zygote`: forked by `serve` early; None:
    none yet, or it died) forks the supervisors, and its lines (their ends) come into the same
    poll(). See AgentState for the arguments.
    """

    def __init__(
        self,
        spool: str,
        host_name: str,
        journal_limit: int = JOURNAL_LIMIT,
        mode: str = "plain",
        host: dict | None = None,
        lock_fd: int = -1,
        code: str | None = None,
        scripts: tuple[str, str] | None = None,
    ):
        self.state = s = AgentState(spool, host_name, journal_limit, mode, host, lock_fd, code, scripts)
        self.link = ManagerLink(s)
        self.unit_state = UnitState(s, self.link)
        self.manager = Manager(s, self.link, self.unit_state)
        self.zygotes = ZygoteOps(s, self.unit_state)
        self.unit_state.settle = self.zygotes.workers.settle
        self.host_lease = HostLease(s)
        self.unit_ops = UnitOps(s, self.unit_state, self.manager, self.zygotes, self.host_lease)
        self.tasks = TaskOps(s, self.unit_state, self.unit_ops, self.manager)
        self.reads = Reads(s, self.unit_state, self.host_lease)
        self.lease_enforcer = LeaseEnforcer(s, self.host_lease, self.unit_state, self.unit_ops)
        self.successors = Successors(s, self.unit_state, self.unit_ops, self.host_lease)
        self.ops = {  # OPS, each to its part
            "hello": self.reads.op_hello, "ping": self.reads.op_ping, "launch": self.successors.op_launch,
            "signal": self.successors.op_signal, "list": self.reads.op_list, "forget": self.unit_ops.op_forget,
            "read": self.reads.op_read, "tasks": self.tasks.op_tasks, "launch_done": self.tasks.op_launch_done,
            "lease": self.host_lease.op_lease, "withdraw": self.successors.op_withdraw,
        }
        self.host_lease.load_lease()
        s.jfd = self.unit_state.open_journal()
        self.unit_state.catch_up()
        self.unit_state.sync()  # whatever earlier agents and supervisors left is durable before it is reported
        s.news = []

    def handle_line(self, line: bytes | bytearray) -> None:
        s = self.state
        try:
            req = loads(line)
            rid, op = req["id"], req["op"]
        except (ValueError, KeyError, TypeError) as exc:
            s.out.append(dumps({"event": "error", "error": f"unreadable request {line[:200]!r}: {exc}"}))
            return
        method = self.ops[op] if op in OPS else None  # `in` first: an op may be unhashable (a list)
        mark = len(s.out)  # events the op emits go after its reply
        try:
            if method is None:
                raise Refused(
                    f"unknown op {op!r}: agent version {VERSION} speaks {', '.join(OPS)}; "
                    "update the controller or the agent"
                )
            reply = {"id": rid, "ok": True, **method(req)}
        except Refused as exc:
            reply = {"id": rid, "ok": False, "error": str(exc)}
        except Exception as exc:
            import traceback  # only here: keeps the agent, which every supervisor copies, small

            traceback.print_exc()
            reply = {"id": rid, "ok": False, "error": f"agent error in {op}: {exc!r}; see the agent's log"}
        s.out.insert(mark, dumps(reply))

    def flush(self, now: float | None = None) -> None:
        """Write this turn's lines, once every result they carry is on disk; or, with `now` (the
        loop's turn), hold them for a later turn's sync (see `holds`)."""
        s = self.state
        if now is not None and self.holds(now):
            return
        s.held_since = None
        if s.need_sync:
            self.unit_state.sync()
        data = b"".join(s.out)
        s.out.clear()
        if s.orphan:
            return  # nobody reads them: the next agent lists what happened
        while data:
            data = data[os.write(1, data) :]

    def holds(self, now: float) -> bool:
        """Whether this turn's lines wait for a later turn (up to RESULT_HOLD after the first turn
        that held them), so that one fdatasync makes the results of several turns durable: each
        cost ~0.2 ms of CPU here, mostly the disk's (an append also writes the inode), at ~0.75 a
        job in a stream of one-POST jobs. Only while that costs nobody a slot: the lines are
        ends and successors' starts alone (no reply: the controller may wait for one), a successor
        started for every end, and HOLD_QUEUED more wait behind each of those: the host keeps its
        slots busy by itself, and the controller, which leaves such ends for a later tick anyway
        (quiet_ends.py), has nothing to do at once. A result is still on disk before its line goes out."""
        s = self.state
        if not s.need_sync or s.orphan or not s.out:
            return False
        ended: list[bytes] = []
        started: list[bytes] = []
        for line in s.out:
            kind = ended if line.startswith(ENDED) else started if line.startswith(STARTED) else None
            if kind is None:
                return False
            kind.append(line[len(ENDED):line.find(b'"', len(ENDED))])  # (both prefixes are as long)
        if len(started) < len(ended):
            return False  # a slot left empty: the controller places a job there
        running = {unit.decode() for unit in set(started) - set(ended)}
        if any(count < HOLD_QUEUED for count in self.successors.behind(running).values()):
            return False  # a chain runs short (one that started and ended since is judged by its successor)
        if s.held_since is None:
            s.held_since = now
        return now - s.held_since < RESULT_HOLD

    def running_units(self) -> bool:
        """True while some unit of this spool may run (a lost one is recorded as such here)."""
        self.unit_state.catch_up()
        doubtful = [unit for unit, u in self.state.units.items() if u.result is None]
        known = self.unit_state.ask_systemd(doubtful)
        return any(not self.unit_state.report_if_finished(unit, known) for unit in doubtful)

    def orphan_work(self) -> bool:
        """True while an orphan has something to see to: a successor queued here (this turn's
        `tend` starts it if its predecessor has ended: running_units may be what just learnt of
        that end, from the journal), or a unit that may run (its lease to enforce)."""
        return bool(self.state.queued) or self.running_units()

    def stay_orphan(self) -> bool:
        """At stdin EOF: stay, without a controller, while a lease is in force and units run or
        wait queued (their lease must be enforced by someone; a successor starts when its
        predecessor ends); False: exit now."""
        left = self.host_lease.lease_left()
        return left is not None and left > 0 and self.orphan_work()

    def become_orphan(self) -> None:
        """Stay without a controller: its pipes (stdout; stderr too when it is the SSH session's)
        go to /dev/null, so that the session can end and no write fails later."""
        import stat

        self.state.orphan = True
        try:
            print("agent: the controller went away while a lease holds units here: staying to enforce it",
                  file=sys.stderr, flush=True)
        except OSError:
            pass
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(null, 1)
        if not stat.S_ISREG(os.fstat(2).st_mode):  # a log file (local hosts) stays
            os.dup2(null, 2)
        os.close(null)

    def serve(self) -> None:
        """Serve until stdin reaches EOF (the controller closed or died); then, under a lease, as an
        orphan until no unit runs or a new agent asks for the spool. Running jobs go on, unless
        their lease runs out."""
        import select

        s = self.state
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
        s.poller = select.poll()
        s.poller.register(0, select.POLLIN)
        s.poller.register(wake_r, select.POLLIN)
        if s.listener is not None:
            s.poller.register(s.listener.fileno(), select.POLLIN)
        if s.bus is not None:
            s.poller.register(s.bus.fileno(), select.POLLIN)
        if s.zygote is not None:
            s.poller.register(s.zygote.replies, select.POLLIN)
        workers = self.zygotes.workers
        workers.watch(s.poller)
        pending = bytearray()
        next_watch = time.monotonic() + WATCH_INTERVAL
        writing = False  # POLLOUT asked for the bus: calls wait in its buffer
        reap = True  # children that ended before SIGCHLD was ours to hear
        self.successors.tend()  # successors an earlier agent queued whose predecessor ended meanwhile
        while True:
            watching = s.watched or s.orphan or self.link.unsent  # releases to send again: link.py
            timeout = max(0.0, next_watch - time.monotonic()) * 1000 if watching else None
            if s.compact_soon:
                timeout = min(timeout if timeout is not None else COMPACT_RETRY, COMPACT_RETRY)
            left = self.host_lease.lease_left()
            if left is not None and not s.lease_acted:  # wake when the lease runs out
                timeout = min(timeout if timeout is not None else 1e12, max(0.0, left) * 1000 + 1)
            elif s.lease_retry:  # units it could not stop yet
                timeout = min(timeout if timeout is not None else 1e12, LEASE_RETRY * 1000)
            if s.held_since is not None:  # lines held for a sync (holds): out by RESULT_HOLD
                due_held = max(0.0, s.held_since + RESULT_HOLD - time.monotonic()) * 1000 + 0.5
                timeout = due_held if timeout is None else min(timeout, due_held)
            due = workers.expire(time.monotonic())  # idle workers let go after IDLE_FOR
            if due is not None:
                timeout = min(timeout if timeout is not None else 1e12, due * 1000 + 1)
            ready = {fd for fd, _ev in s.poller.poll(timeout)}
            if wake_r in ready:  # a signal came (SIGCHLD among them): its byte stays until drained here
                drain(wake_r)
                reap = True
            if 0 in ready:
                data = os.read(0, 1 << 16)
                if not data:
                    s.poller.unregister(0)
                    if not self.stay_orphan():
                        self.manager.finish_starting()
                        return
                    self.become_orphan()
                pending += data
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        self.handle_line(line)
            if s.listener is not None and s.listener.fileno() in ready:
                self.tasks.accept_clients()
            for fd in ready & s.clients.keys():
                self.tasks.read_client(fd)
            for fd in ready & workers.pids.keys():  # a reused supervisor's job ended, or it is idle
                self.zygotes.worker_readable(fd)
            if s.zygote is not None and s.zygote.replies in ready:
                self.zygotes.zygote_readable()
            if workers.ended:  # a "d" read while a signal waited for that worker's "i" (Workers.settle)
                self.zygotes.take_exits()
            if reap:  # else no child of ours ended (plain mode's supervisors are the zygote's): no wait4
                reap = False
                self.unit_state.reap()
            if s.bus is not None:
                self.manager.handle_bus()
            self.lease_enforcer.enforce_lease()
            if time.monotonic() >= next_watch:
                self.unit_state.poll_watched()
                next_watch = time.monotonic() + WATCH_INTERVAL
                # a new agent takes the spool from one that no controller keeps: an orphan, or an
                # agent whose lease ran out (its controller's channel is dead or frozen)
                if s.handover or (s.orphan and not self.orphan_work()):
                    self.manager.finish_starting()
                    self.flush()
                    return
            # last before the lines go out: after every way this turn learnt of an end, and the
            # lease's check (a lapsed lease drops the queue); a predecessor's `finished` and its
            # successor's `unqueued` leave together
            self.successors.tend()
            if s.bus is not None and s.bus.out:  # the start calls tend made go out now, not on the next turn
                self.manager.write_bus()  # (which only an input would bring: a controller's quiet tick waits)
            if s.bus is not None and bool(s.bus.out) != writing:
                writing = bool(s.bus.out)
                s.poller.modify(s.bus.fileno(), select.POLLIN | (select.POLLOUT if writing else 0))
            elif s.bus is None:
                writing = False
            self.unit_state.maybe_compact()
            self.flush(time.monotonic())


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass

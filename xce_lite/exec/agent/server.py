"""The Agent: `serve`'s loop over one poll() (the controller's requests on stdin, SIGCHLD, jobs'
connections, the manager's socket, the watch timer) and its state. Its requests are methods of the
mixins, one module per family: state (journal, unit status), manager (systemd), unitops (launch,
signal, forget), tasks (`xce launch`), reads (hello, ping, list, read), lease (the controller's lease).

Single-threaded, so os.fork is safe. The agent never touches running jobs when it exits (on stdin
EOF); it first waits for systemd's answer to the starts it asked for. Under a lease, an agent whose
controller went away stays (without stdin) while units run: it stops them when the lease runs out,
and leaves as soon as none runs or a new agent asks for the spool. See docs/agent-protocol.md.
"""

from __future__ import annotations

import os
import sys
import time

from .dbus import Bus
from .journal import JOURNAL, JOURNAL_LIMIT, Unit
from .jsonl import dumps, loads
from .lease import LEASE_RETRY, LeaseOps
from .manager import Manager
from .reads import Reads
from .signals import signal
from .state import UnitState
from .systemd import boot_epoch_cs
from .tasks import Client, TaskOps
from .unitops import UnitOps
from .util import BIN, SOCKET, UNITS, VERSION, boot_id
from .validate import Refused
from .zygote import ZygoteOps

OPS = ("hello", "ping", "launch", "signal", "list", "forget", "read", "tasks", "launch_done", "lease")
WATCH_INTERVAL = 0.5  # seconds between checks of units this agent did not fork
COMPACT_RETRY = 50.0  # milliseconds before the next try to compact, when the journal's lock was busy


class Agent(UnitState, Manager, UnitOps, TaskOps, Reads, LeaseOps, ZygoteOps):
    """The serve loop. Single-threaded: requests, SIGCHLD, jobs' connections and the watch timer
    share one poll().

    `mode` is how it starts units: "plain" (forked supervisors), "systemd" or "user" (transient
    units, started by calls on the manager's private D-Bus socket, whose replies and UnitRemoved
    signals come into the same poll(), so that the loop never waits for systemd). In plain mode
    its zygote (zygote.py, `zygote`: forked by `serve` early; None: none yet, or it died) forks
    the supervisors, and its lines (their ends) come into the same poll(). `host` holds what
    probe_modes found; `scripts` the paths of systemd.EXEC_SCRIPT and STOP_SCRIPT (None: no direct
    units); `code` the file a supervised unit runs (`python -S -E CODE exec UNIT_DIR`: the agent's
    bytecode in SPOOL/bin; None in process, where no systemd unit is started).
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
        self.spool, self.host_name, self.mode = spool, host_name, mode
        self.host = host or {"modes": {"plain": {"ok": True, "why": None, "memory": "supervisor", "direct": False}}}
        self.lock_fd, self.scripts = lock_fd, scripts
        self.python, self.code = sys.executable, code
        self.units_dir, self.bin_dir = os.path.join(spool, UNITS), os.path.join(spool, BIN)
        self.sock_path = os.path.join(spool, SOCKET)
        self.boot = boot_id()
        self.boot_cs = boot_epoch_cs()
        self.out: list[bytes] = []  # lines to write at the end of this loop turn
        self.children: dict[int, str] = {}  # supervisor pid -> unit, for supervisors forked here or by the zygote
        self.zygote = None  # plain mode's forker of supervisors (zygote.Zygote), once there is one
        self.doubtful: dict[str, float] = {}  # unit -> monotonic deadline: its supervisor may be starting
        self.child_units: dict[str, tuple[int, float]] = {}  # unit -> (pid, start_time), the same
        self.task_children: dict[int, str] = {}  # pid -> unit of the tasks' supervisors of direct units
        self.watched: set[str] = set()  # running units this agent did not fork: polled, or poked
        self.units: dict[str, Unit] = {}  # the fold of the journal
        self.news: list[dict] | None = None  # records to act on, once serving (see catch_up)
        self.bus: Bus | None = None  # the manager's private socket (systemd modes)
        self.next_connect = 0.0  # monotonic time of the next attempt to reach the manager
        self.calls: dict[int, tuple] = {}  # serial -> (what, unit, ...) of calls not answered yet
        self.starting: set[str] = set()  # units whose StartTransientUnit has no reply yet
        self.tracked: set[str] = set()  # units systemd has, as the live connection says (UnitRemoved)
        self.removed: list[str] = []  # units whose UnitRemoved came this turn
        self.accepted: set[str] = set()  # units whose start this agent saw systemd accept
        self.held: dict[str, list[str]] = {}  # direct unit -> signals held until its start job is over
        self.pending: dict[str, list[int]] = {}  # unit -> signals for a supervisor not yet started
        self.clients: dict[int, Client] = {}
        self.waiting: dict[str, int] = {}  # launch id -> fd of the `xce launch` waiting for it
        self.launch_codes: dict[str, int] = {}  # launch_done that came before its client (re)connected
        self.listener = None
        self.poller = None
        self.journal_path = os.path.join(spool, JOURNAL)
        self.base_limit = self.journal_limit = journal_limit
        self.offset = 0  # bytes of the journal file read and applied
        self.synced = 0  # bytes of the journal file known to be on disk
        self.need_sync = False  # a result about to be reported may not be on disk yet
        self.compact_soon = False  # the journal wants compacting, and its lock was busy
        self.orphan = False  # its controller went away (stdin EOF) while a lease holds units here
        self.handover = False  # a new agent asked for the spool (a poke with "handover")
        # opened (0711) to the users jobs run as (runas.share_spool), by this agent or an earlier one
        self.spool_shared = os.geteuid() == 0 and os.stat(spool).st_mode & 0o777 == 0o711
        self.load_lease()
        self.jfd = self.open_journal()
        self.catch_up()
        self.sync()  # whatever earlier agents and supervisors left is durable before it is reported
        self.news = []

    def handle_line(self, line: bytes | bytearray) -> None:
        try:
            req = loads(line)
            rid, op = req["id"], req["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.out.append(dumps({"event": "error", "error": f"unreadable request {line[:200]!r}: {exc}"}))
            return
        method = getattr(self, f"op_{op}", None) if op in OPS else None
        mark = len(self.out)  # events the op emits go after its reply
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
        self.out.insert(mark, dumps(reply))

    def flush(self) -> None:
        """Write this turn's lines, once every result they carry is on disk."""
        if self.need_sync:
            self.sync()
        data = b"".join(self.out)
        self.out.clear()
        if self.orphan:
            return  # nobody reads them: the next agent lists what happened
        while data:
            data = data[os.write(1, data) :]

    def running_units(self) -> bool:
        """True while some unit of this spool may run (a lost one is recorded as such here)."""
        self.catch_up()
        doubtful = [unit for unit, u in self.units.items() if u.result is None]
        known = self.ask_systemd(doubtful)
        return any(not self.report_if_finished(unit, known) for unit in doubtful)

    def stay_orphan(self) -> bool:
        """At stdin EOF: stay, without a controller, while a lease is in force and units run (their
        lease must be enforced by someone); False: exit now."""
        left = self.lease_left()
        return left is not None and left > 0 and self.running_units()

    def become_orphan(self) -> None:
        """Stay without a controller: its pipes (stdout; stderr too when it is the SSH session's)
        go to /dev/null, so that the session can end and no write fails later."""
        import stat

        self.orphan = True
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

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to write to wake_w
        self.poller = select.poll()
        self.poller.register(0, select.POLLIN)
        self.poller.register(wake_r, select.POLLIN)
        if self.listener is not None:
            self.poller.register(self.listener.fileno(), select.POLLIN)
        if self.bus is not None:
            self.poller.register(self.bus.fileno(), select.POLLIN)
        if self.zygote is not None:
            self.poller.register(self.zygote.replies, select.POLLIN)
        pending = bytearray()
        next_watch = time.monotonic() + WATCH_INTERVAL
        writing = False  # POLLOUT asked for the bus: calls wait in its buffer
        while True:
            watching = self.watched or self.orphan
            timeout = max(0.0, next_watch - time.monotonic()) * 1000 if watching else None
            if self.compact_soon:
                timeout = min(timeout if timeout is not None else COMPACT_RETRY, COMPACT_RETRY)
            left = self.lease_left()
            if left is not None and not self.lease_acted:  # wake when the lease runs out
                timeout = min(timeout if timeout is not None else 1e12, max(0.0, left) * 1000 + 1)
            elif self.lease_retry:  # units it could not stop yet
                timeout = min(timeout if timeout is not None else 1e12, LEASE_RETRY * 1000)
            ready = {fd for fd, _ev in self.poller.poll(timeout)}
            if wake_r in ready:
                drain(wake_r)
            if 0 in ready:
                data = os.read(0, 1 << 16)
                if not data:
                    self.poller.unregister(0)
                    if not self.stay_orphan():
                        self.finish_starting()
                        return
                    self.become_orphan()
                pending += data
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        self.handle_line(line)
            if self.listener is not None and self.listener.fileno() in ready:
                self.accept_clients()
            for fd in ready & self.clients.keys():
                self.read_client(fd)
            if self.zygote is not None and self.zygote.replies in ready:
                self.zygote_readable()
            self.reap()
            if self.bus is not None:
                self.handle_bus()
            if self.bus is not None and bool(self.bus.out) != writing:
                writing = bool(self.bus.out)
                self.poller.modify(self.bus.fileno(), select.POLLIN | (select.POLLOUT if writing else 0))
            elif self.bus is None:
                writing = False
            self.enforce_lease()
            if time.monotonic() >= next_watch:
                self.poll_watched()
                next_watch = time.monotonic() + WATCH_INTERVAL
                # a new agent takes the spool from one that no controller keeps: an orphan, or an
                # agent whose lease ran out (its controller's channel is dead or frozen)
                if self.handover or (self.orphan and not self.running_units()):
                    self.finish_starting()
                    self.flush()
                    return
            self.maybe_compact()
            self.flush()


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass

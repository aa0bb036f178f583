"""What the serving agent's parts share in memory: one AgentState, built by the Agent (server.py) and
given to each part (state, link, manager, unitops, tasks, reads, lease, zygote) in its constructor.

Invariants: single-threaded (the serve loop's one poll()), so no lock; `__slots__`, so that a part
cannot grow a field here by a typo; the journal is the truth: `units` is its fold, and everything
else here is about processes, connections and calls of this agent's life only.

Only `serve` loads this module, never a unit's interpreter; its type-only imports sit under
TYPE_CHECKING, which is False at run time (mypy takes any name TYPE_CHECKING as true).
"""

from __future__ import annotations

import os
import sys

from .journal import JOURNAL, JOURNAL_LIMIT
from .systemd import boot_epoch_cs
from .util import BIN, SOCKET, UNITS, boot_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    import select
    import socket

    from .dbus import Bus, DBusMessage
    from .journal import Unit
    from .tasks import Client
    from .zygote import Zygote


class AgentState:
    """The serving agent's memory. `mode` is how it starts units: "plain" (forked supervisors),
    "systemd" or "user" (transient units, by calls on the manager's private D-Bus socket). `host`
    holds what probe_modes found; `scripts` the paths of systemd.EXEC_SCRIPT and STOP_SCRIPT (None:
    no direct units); `code` the file a supervised unit runs (`python -S -E CODE exec UNIT_DIR`: the
    agent's bytecode in SPOOL/bin; None in process, where no systemd unit is started)."""

    __slots__ = (  # sorted; each is set and explained in __init__
        "accepted", "base_limit", "bin_dir", "boot", "boot_cs", "bus", "calls", "child_units", "children", "clients",
        "code", "compact_soon", "doubtful", "ended", "ends", "ends_by_path", "handover", "held", "held_since", "host",
        "host_name", "jfd", "journal_limit", "journal_path", "launch_codes", "lease", "lease_acted", "lease_retry",
        "lease_retry_at", "left", "listener", "lock_fd", "mode", "need_sync", "news", "next_connect", "offset",
        "orphan", "out", "pending", "poller", "python", "queued", "removed", "scripts", "sock_path", "spool",
        "spool_shared", "starting",
        "synced", "task_children", "tracked", "units", "units_dir", "waiting", "watched", "zygote",
    )

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
        self.host: dict = host or {"modes": {"plain": {"ok": True, "why": None, "memory": "supervisor",
                                                               "direct": False}}}
        self.lock_fd, self.scripts = lock_fd, scripts
        self.python, self.code = sys.executable, code
        self.units_dir, self.bin_dir = os.path.join(spool, UNITS), os.path.join(spool, BIN)
        self.sock_path = os.path.join(spool, SOCKET)
        self.boot = boot_id()
        self.boot_cs = boot_epoch_cs()
        self.out: list[bytes] = []  # lines to write at the end of this loop turn
        # units and their processes
        self.units: dict[str, Unit] = {}  # the fold of the journal
        self.queued: dict[str, dict] = {}  # unit -> launch request: successors waiting (successors.py)
        self.left: dict[str, str] = {}  # unit -> its `after`: left the queue unstarted (successors.py)
        self.news: list[dict] | None = None  # records to act on, once serving (state.UnitState.catch_up)
        self.children: dict[int, str] = {}  # supervisor pid -> unit, for supervisors forked here or by the zygote
        self.zygote: Zygote | None = None  # plain mode's forker of supervisors (zygote.py), once there is one
        self.doubtful: dict[str, float] = {}  # unit -> monotonic deadline: its supervisor may be starting
        self.child_units: dict[str, tuple[int, float]] = {}  # unit -> (pid, start_time), the same
        self.task_children: dict[int, str] = {}  # pid -> unit of the tasks' supervisors of direct units
        self.watched: set[str] = set()  # running units this agent did not fork: polled, or poked
        self.pending: dict[str, list[int]] = {}  # unit -> signals for a supervisor not yet started
        # the service manager (systemd modes)
        self.bus: Bus | None = None  # the manager's private socket
        self.next_connect = 0.0  # monotonic time of the next attempt to reach the manager
        self.calls: dict[int, tuple] = {}  # serial -> (what, unit, ...) of calls not answered yet
        self.starting: set[str] = set()  # units whose StartTransientUnit has no reply yet
        self.tracked: set[str] = set()  # units systemd has, as the live connection says (UnitRemoved)
        self.removed: list[str] = []  # units whose UnitRemoved came this turn
        self.accepted: set[str] = set()  # units whose start this agent saw systemd accept
        self.held: dict[str, list[str]] = {}  # direct unit -> signals held until its start job is over
        # direct units whose end the agent records (manager.agent_records): unit -> the last
        # PropertiesChanged of its Service interface (None before one came), and its object path -> unit
        self.ends: dict[str, DBusMessage | None] = {}
        self.ends_by_path: dict[str, str] = {}
        self.ended: dict[str, tuple[str, dict]] = {}  # unit -> (ActiveState, properties) found over, to record
        # jobs' connections (`xce launch`) and the loop's poll()
        self.clients: dict[int, Client] = {}
        self.waiting: dict[str, int] = {}  # launch id -> fd of the `xce launch` waiting for it
        self.launch_codes: dict[str, int] = {}  # launch_done that came before its client (re)connected
        self.listener: socket.socket | None = None
        self.poller: select.poll | None = None
        # the journal (state.UnitState)
        self.journal_path = os.path.join(spool, JOURNAL)
        self.jfd = -1  # the journal, open for appending and reading (once UnitState opened it)
        self.base_limit = self.journal_limit = journal_limit
        self.offset = 0  # bytes of the journal file read and applied
        self.synced = 0  # bytes of the journal file known to be on disk
        self.need_sync = False  # a result about to be reported may not be on disk yet
        self.held_since: float | None = None  # when the lines now held for the next sync were first held (server.py)
        self.compact_soon = False  # the journal wants compacting, and its lock was busy
        # the agent's life
        self.orphan = False  # its controller went away (stdin EOF) while a lease holds units here
        self.handover = False  # a new agent asked for the spool (a poke with "handover")
        # opened (0711) to the users jobs run as (runas.share_spool), by this agent or an earlier one
        self.spool_shared = os.geteuid() == 0 and os.stat(spool).st_mode & 0o777 == 0o711
        # the lease (lease.py): (until, renewed) or None (never granted: nothing is enforced)
        self.lease: tuple[float, float] | None = None
        self.lease_acted = False  # the units were stopped for the current deadline
        self.lease_retry: list[str] = []  # units still to stop at the end of the lease
        self.lease_retry_at = 0.0  # monotonic time of the next try

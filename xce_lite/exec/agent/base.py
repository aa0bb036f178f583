"""The Agent's shared state, declared once for the type checker: the attributes that Agent.__init__
(server.py) sets and says the meaning of, and the methods one mixin (state, manager, unitops, tasks,
reads, lease, zygote) calls on another. Every mixin derives from AgentBase, so that mypy checks each call
across them against the one definition.

Nothing here runs: the class body holds annotations only (strings, under `from __future__ import
annotations`), and the method declarations sit under TYPE_CHECKING, which is False at run time
(mypy takes any name TYPE_CHECKING as true). So the agent, which every unit's interpreter loads,
imports no `typing` for it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import select
    import socket

    from .dbus import Bus
    from .journal import Unit
    from .state import Status
    from .tasks import Client
    from .zygote import Zygote


class AgentBase:
    """What the Agent's mixins share; see Agent.__init__ for what each attribute holds."""

    spool: str
    host_name: str
    mode: str
    host: dict
    lock_fd: int
    scripts: tuple[str, str] | None
    python: str
    code: str | None
    units_dir: str
    bin_dir: str
    sock_path: str
    boot: str
    boot_cs: int
    out: list[bytes]
    children: dict[int, str]
    zygote: Zygote | None
    doubtful: dict[str, float]
    child_units: dict[str, tuple[int, float]]
    task_children: dict[int, str]
    watched: set[str]
    units: dict[str, Unit]
    news: list[dict] | None
    bus: Bus | None
    next_connect: float
    calls: dict[int, tuple]
    starting: set[str]
    tracked: set[str]
    removed: list[str]
    accepted: set[str]
    held: dict[str, list[str]]
    pending: dict[str, list[int]]
    clients: dict[int, Client]
    waiting: dict[str, int]
    launch_codes: dict[str, int]
    listener: socket.socket | None
    poller: select.poll | None
    journal_path: str
    base_limit: int
    journal_limit: int
    offset: int
    synced: int
    need_sync: bool
    compact_soon: bool
    orphan: bool
    handover: bool
    spool_shared: bool
    jfd: int
    lease: tuple[float, float] | None
    lease_acted: bool
    lease_retry: list[str]
    lease_retry_at: float

    if TYPE_CHECKING:
        # state.py
        def append(self, data: bytes, sync: bool = False) -> None: ...
        def catch_up(self) -> None: ...
        def unit_status(self, unit: str, known: dict | None = None) -> Status | None: ...
        def reported(self, unit: str, result: dict) -> dict: ...
        def emit_finished(self, unit: str, result: dict) -> None: ...
        def report_if_finished(self, unit: str, known: dict | None = None) -> bool: ...
        def ask_systemd(self, units: list[str]) -> dict[str, bool]: ...
        def deliver(self, unit: str, pid: int | None, signum: int) -> bool: ...
        def reaped_children(self, ended: list[tuple[int, int]]) -> None: ...

        # manager.py
        def connect_bus(self, now: bool = False) -> Bus | None: ...
        def bus_lost(self, exc: Exception) -> None: ...
        def start_unit(self, spec: dict, direct: bool) -> None: ...
        def direct_unfit(self, spec: dict) -> str | None: ...
        def fork_tasks(self, unit: str, u: Unit) -> None: ...

        # unitops.py
        def job_env(self, env: dict, unit: str, host_dir: str, hostfile: bool) -> dict: ...
        def op_signal(self, req: dict) -> dict: ...
        def signal_direct(self, unit: str, name: str, reason: str) -> bool: ...

        # zygote.py
        def spawn_supervisors(self, items: list[tuple[str, dict, float]]) -> list[tuple[int | None, str | None]]: ...
        def take_exits(self) -> None: ...
        def zygote_readable(self) -> None: ...
        def zygote_lost(self, why: str) -> None: ...

        # tasks.py
        def share(self) -> None: ...

        # lease.py
        def lease_left(self) -> float | None: ...
        def lease_lapsed(self) -> str | None: ...

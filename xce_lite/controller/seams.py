"""What the controller is given rather than what it makes: the clock, the store, the host links,
the signal workers and the scheduler. `Seams()` is the real daemon's set; a test or the simulator
passes its own (a fake clock, `exec/fake.py`'s hosts behind `InlineLink`, `InlineHostOps`, the
in-process scheduler) and calls `Controller.tick(now)` itself, with no thread of its own.

Invariants: the tick and the parts read time only through `Seams.clock` (the runner's loop, serve,
is the one place that turns the real clock into a `now`); an inline seam keeps its real twin's
contract (events on the controller's queue, in the order the real one would put them).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from xce_lite.exec.link import HostDown, HostLink, HostUp


class Clock(Protocol):
    def time(self) -> float: ...  # wall clock: event times, end times, fair share

    def monotonic(self) -> float: ...  # pacing: backoffs, retries

    def lease(self) -> float: ...  # the host leases' clock (leasework.py: CLOCK_BOOTTIME)


class RealClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def lease(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class FakeClock:
    """One number that the caller moves: every clock of the controller reads it."""

    now: float = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def lease(self) -> float:
        return self.now


class WakingQueue(queue.Queue):
    """The controller's event queue: host events wake the tick as they arrive, but those `quiet`
    says need no tick at once (they wait for the next one, which the caller bounds)."""

    def __init__(self, wake: threading.Event, quiet: Callable[[Any], bool] | None = None):
        super().__init__()
        self._wake = wake
        self._quiet = quiet

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if self._quiet is None or not self._quiet(item):
            self._wake.set()


def real_host_factory(host: Any, config: Any, home: Any) -> Callable[[], Any]:
    """How a real host's link makes a fresh connection to it: the local agent, or the SSH gateway."""
    records = "unit" if host.unit_accounting else "agent"  # who records a systemd unit's end (config/cluster.py)
    if host.type == "local":
        from xce_lite.exec.local import LocalHost

        return lambda: LocalHost(host.name, home.spool / host.name, mode=host.launch, records=records)
    from xce_lite.exec.sshgate import GatewayHost  # paramiko lives in the gateway process, not here
    from xce_lite.home.hostadd import ssh_target

    target = ssh_target(host, config, home)
    spool, log_path = host.agent_spool(config.cluster), home.root / f"agent-{host.name}.log"
    heartbeat = config.ssh.keepalive
    return lambda: GatewayHost(host.name, target, spool, mode=host.launch, heartbeat=heartbeat,
                                 log_path=log_path, records=records)


def _real_scheduler() -> Any:
    from xce_lite.controller.sched_switch import SwitchingScheduler

    return SwitchingScheduler()  # small sessions inline, large ones in the worker process


def _real_hostops(events: Any) -> Any:
    from xce_lite.controller.hostops import HostOps

    return HostOps(events)


@dataclass
class Seams:
    """The controller's collaborators. `host_factory(host_config)`, when given, replaces the
    controller's own (local agent or SSH gateway) and returns a maker of unconnected Hosts."""

    clock: Clock = field(default_factory=RealClock)
    store: Any = None  # a JobStore; None: the home's, opened by the controller
    host_factory: Callable[[Any], Callable[[], Any]] | None = None
    link_factory: Callable[..., Any] = HostLink  # (name, factory, events, log, backoff_max=) -> link
    hostops_factory: Callable[[Any], Any] = _real_hostops  # (events) -> HostOps-like
    scheduler_factory: Callable[[], Any] = _real_scheduler  # () -> SchedulerProcess-like
    # queued successors (prefilling.py), where `controller: prefill` allows; the simulator's fake
    # hosts keep no queue, and its decisions stay as they were
    prefill: bool = True
    # ends alone that wait END_WAIT for a commit to join (start_wait.py); not where the clock jumps
    # from event to event (the simulator's): there a wait would last until the next event
    end_waits: bool = True


class InlineLink:
    """A host link with no thread: `start` connects at once and puts `HostUp` on the queue.
    `drop(why)` cuts the host off (its events are lost, as on a dead channel) and says `HostDown`;
    `back()` connects again, as a real link would after a reconnect."""

    def __init__(self, name: str, factory: Callable[[], Any], events: Any, log: Callable[[str], None],
                 backoff_max: float = 60.0, first_delay: float = 1.0):
        self.name, self.factory, self.events, self.log = name, factory, events, log
        self.generation = 0
        self.handle: Any = None

    def start(self) -> None:
        self.back()

    def back(self) -> None:
        self.generation += 1
        self.handle = self.factory()
        probe = self.handle.connect(self.events)
        self.events.put(HostUp(self.name, self.handle, probe, tuple(self.handle.list_units()), self.generation))

    def drop(self, why: str = "the agent's channel was lost") -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self.events.put(HostDown(self.name, why, self.generation))

    def retry_now(self) -> None:
        pass

    def close(self, timeout: float = 15.0) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

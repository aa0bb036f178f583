"""The controller's side of host leases: granting, renewing, storing, and when a host may be lost.

A mixin of `Controller` (it shares the controller's lock, store and config). The arithmetic is
pure, in leases.py; here are the clock readings and the effects:

- each host whose agent gives its lease clock (hello, then every lease reply) gets a lease at
  once when it comes up, renewed every `renew_interval(lease)` from the tick, before the tick's
  launches (so on the channel a launch always follows a grant);
- every grant is stored (meta rows `lease:HOST`) BEFORE it is sent, so that the next controller
  knows the longest lease any host may hold, whatever happened between;
- a host out of reach is declared lost only when `leases.lost_at` says so (_lease_allows_loss);
- a planned stop grants every connected host `maintenance_lease` first (_grant_maintenance).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial

from xce_lite import errors
from xce_lite.controller import leases
from xce_lite.exec.agent.util import boot_id
from xce_lite.store.jobs import Requeue

MAINTENANCE_WAIT = 5.0  # seconds a planned stop waits for the hosts to confirm their long lease


def lease_clock() -> float:
    """The controller's lease clock (CLOCK_BOOTTIME: it runs on across a restart of the controller
    and while this machine is suspended, which only makes the controller wait longer)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class HostLease:
    """One connection's lease state: the host's boot, its latest clock reading and when it was
    heard (one tuple, replaced whole by the reader thread), and when a grant was last sent."""

    boot: str
    latest: tuple[float, float]  # (host clock, controller clock when heard)
    sent: float = leases.NEVER


class LeaseWork:
    """See the module docstring. Expects the controller's attributes (store, config, _mu, _hosts)."""

    def _init_leases(self) -> None:
        self._boot = boot_id()
        self._started_clock = self._clock.lease()
        self._host_leases: dict[str, HostLease] = {}  # host -> its current connection's lease state
        self._down_clock: dict[str, float] = {}  # host -> since when (lease clock) it is out of reach
        # host -> when its lease surely ends (lease clock): from the store, then from every grant
        self._lease_ends: dict[str, float] = {
            host: leases.stored_ends_by(stored, self._boot, self._started_clock)
            for host, stored in self.store.host_leases().items()}

    def _lease_host_up(self, name: str, probe) -> None:
        """A host's agent answers (holds _mu): a lease is granted to it at the next renewal."""
        self._down_clock.pop(name, None)
        clock, boot = probe.extra.get("clock"), probe.extra.get("boot_id")
        if isinstance(clock, (int, float)) and isinstance(boot, str):
            self._host_leases[name] = HostLease(boot, (float(clock), self._clock.lease()))
        else:  # an agent (or a simulated host) without leases
            self._host_leases.pop(name, None)

    def _lease_host_down(self, name: str) -> None:
        """A host is out of reach (holds _mu): no grant goes to it; the loss clock starts."""
        self._host_leases.pop(name, None)
        self._down_clock.setdefault(name, self._clock.lease())

    def _lease_allows_loss(self, name: str) -> bool:
        """True once host `name`, out of reach, may be declared lost (leases.lost_at)."""
        c = self.config.controller
        down = self._down_clock.setdefault(name, self._clock.lease())
        ends_by = self._lease_ends.get(name, leases.NEVER)
        return self._clock.lease() >= leases.lost_at(down, self._started_clock, c.host_lost_after, ends_by,
                                                     c.lease_margin)

    def _lease_wait(self) -> float:
        """The longest the tick may sleep without missing a renewal."""
        return leases.renew_interval(self.config.controller.lease)

    def _renew_leases(self, seconds: float | None = None, force: bool = False) -> list[threading.Event]:
        """Grant a lease to every connected host whose renewal is due (all with `force`): stored
        first, then sent without waiting. The events are set as the hosts answer."""
        seconds = self.config.controller.lease if seconds is None else seconds
        interval = leases.renew_interval(self.config.controller.lease)
        now = self._clock.lease()
        with self._mu:
            due = [(name, self._hosts[name], hl) for name, hl in self._host_leases.items()
                   if name in self._hosts and (force or now - hl.sent >= interval)]
        if not due:
            return []
        grants = [(name, host, hl, leases.grant(*hl.latest, seconds)) for name, host, hl in due]
        wall = self._clock.time()
        longer = {name: leases.stored_record(g, self._boot, wall) for name, _h, _hl, g in grants
                  if g.ends_by > self._lease_ends.get(name, leases.NEVER)}
        if longer:
            try:
                self.store.set_host_leases(longer)
            except errors.StoreError as err:
                c = self.config.controller
                if seconds + c.lease_margin >= c.host_lost_after:  # only the store tells the next controller
                    self.log(f"cannot store the hosts' leases, not granting {seconds:g} s: {err}")
                    return []
                # a next controller waits host_lost_after from its start anyway, which covers this
                # grant: a busy or full store must not make the hosts stop their jobs
                self.log(f"cannot store the hosts' leases ({err}); renewing them all the same")
            for name, record in longer.items():
                self._lease_ends[name] = record["ends_by"]
        answered = []
        for _name, host, hl, g in grants:
            hl.sent = now
            done = threading.Event()
            try:
                host.grant_lease(g.until, g.seconds, hl.boot, partial(_heard, hl, done))
            except (errors.ExecError, AttributeError):
                continue  # lost meanwhile (HostDown follows), or a host without leases
            answered.append(done)
        return answered

    def _requeue_after_expiry(self, job, host: str, result) -> Requeue | None:
        """The requeue of an attempt its host stopped when the lease ran out (the controller was
        away or cut off longer than the lease, but the host not long enough to be declared lost):
        as for a lost host, it runs again (leases.requeue_after_expiry says when). Holds _mu."""
        if not leases.requeue_after_expiry(result.reason, bool(job.killed), self.config.controller.on_host_lost):
            return None
        return Requeue(job.id, job.state, f"host {host}: {result.reason}")

    def _grant_maintenance(self) -> None:
        """Before a planned stop: every connected host gets `maintenance_lease`, so that its jobs go
        on while the controller is away (up to that long); waits briefly for the hosts' answers."""
        seconds = self.config.controller.maintenance_lease
        answered = self._renew_leases(seconds, force=True)
        deadline = time.monotonic() + MAINTENANCE_WAIT
        for done in answered:
            done.wait(max(0.0, deadline - time.monotonic()))
        if answered:
            confirmed = sum(done.is_set() for done in answered)
            self.log(f"granted {confirmed} of {len(answered)} host(s) a maintenance lease of {seconds:g} s: "
                     "their jobs go on while the controller is stopped, up to that long")


def _heard(hl: HostLease, done: threading.Event, reply: dict | None, error: Exception | None) -> None:
    """A host's answer to a grant (reader thread): its clock reading is the base of the next one."""
    if error is None and reply is not None and reply.get("ok") and isinstance(reply.get("clock"), (int, float)):
        heard = lease_clock()
        if heard > hl.latest[1]:
            hl.latest = (float(reply["clock"]), heard)
        done.set()

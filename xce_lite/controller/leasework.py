"""The controller's side of host leases: granting, renewing, storing, and when a host may be lost.

A part of the controller (`Controller.leases`), given what it needs; the arithmetic is pure, in
leases.py; here are the clock readings and the effects:

- each host whose agent gives its lease clock (hello, then every lease reply) gets a lease at
  once when it comes up, renewed every `renew_interval(lease)` from the tick, before the tick's
  launches (so on the channel a launch always follows a grant);
- every grant is stored (meta rows `lease:HOST`) BEFORE it is sent, so that the next controller
  knows the longest lease any host may hold, whatever happened between;
- a host out of reach is declared lost only when `leases.lost_at` says so (allows_loss);
- a host's reckoning comes down when it confirms a grant that binds every unit there
  (`leases.bound_ends_by`): a maintenance lease the hosts held over a restart stops counting once
  they obey this controller's short grants; the lowered reckoning is stored too (lower);
- a planned stop grants every connected host `maintenance_lease` first (grant_maintenance).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from xce_lite import errors
from xce_lite.config.cluster import ControllerConfig
from xce_lite.controller import leases
from xce_lite.exec.agent.util import boot_id
from xce_lite.store.jobs import Requeue

MAINTENANCE_WAIT = 5.0  # seconds a planned stop waits for the hosts to confirm their long lease
SENT_KEPT = 256  # grants per host kept until a confirmation covers them (older: no lowering from theirs)


@dataclass
class HostLease:
    """One connection's lease state: the host's boot, its latest clock reading and when it was
    heard (one tuple, replaced whole by the reader thread), and when a grant was last sent."""

    boot: str
    latest: tuple[float, float]  # (host clock, controller clock when heard)
    sent: float = leases.NEVER


class HostLeases:
    """See the module docstring. A part of the controller with its dependencies given: the store
    (where grants are kept), the clock, the log and the controller's settings of now (a reconfig
    changes them). Called on the tick's thread only; the hosts it grants to are passed in."""

    def __init__(self, store: Any, clock: Any, log: Callable[[str], None],
                 settings: Callable[[], ControllerConfig]) -> None:
        self.store, self.clock, self.log, self.settings = store, clock, log, settings
        self.boot = boot_id()
        self.started = clock.lease()
        self.current: dict[str, HostLease] = {}  # host -> its current connection's lease state
        self.down: dict[str, float] = {}  # host -> since when (lease clock) it is out of reach
        # host -> when its lease surely ends (lease clock): from the store, then from every grant
        self.ends: dict[str, float] = {
            host: leases.stored_ends_by(stored, self.boot, self.started)
            for host, stored in store.host_leases().items()}
        self.seq = 0  # numbers this controller's grants, in the order they are sent (to any host)
        self.sent: dict[str, list[tuple[int, float]]] = {}  # host -> (seq, ends_by) since its last confirmation
        # (host, seq, heard, bound) of confirmed grants, appended by the reader threads
        self.confirmed: deque[tuple[str, int, float, float | None]] = deque()

    def host_up(self, name: str, probe: Any) -> None:
        """A host's agent answers: a lease is granted to it at the next renewal."""
        self.down.pop(name, None)
        clock, boot = probe.extra.get("clock"), probe.extra.get("boot_id")
        if isinstance(clock, (int, float)) and isinstance(boot, str):
            self.current[name] = HostLease(boot, (float(clock), self.clock.lease()))
        else:  # an agent (or a simulated host) without leases
            self.current.pop(name, None)

    def host_down(self, name: str) -> None:
        """A host is out of reach: no grant goes to it; the loss clock starts."""
        self.current.pop(name, None)
        self.down.setdefault(name, self.clock.lease())

    def allows_loss(self, name: str) -> bool:
        """True once host `name`, out of reach, may be declared lost (leases.lost_at)."""
        c = self.settings()
        self.lower()
        down = self.down.setdefault(name, self.clock.lease())
        ends_by = self.ends.get(name, leases.NEVER)
        return self.clock.lease() >= leases.lost_at(down, self.started, c.host_lost_after, ends_by, c.lease_margin)

    def wait(self) -> float:
        """The longest the tick may sleep without missing a renewal."""
        return leases.renew_interval(self.settings().lease)

    def renew(self, hosts: dict[str, Any], seconds: float | None = None,
              force: bool = False) -> list[threading.Event]:
        """Grant a lease to every connected host (`hosts`: name -> handle) whose renewal is due (all
        with `force`): stored first, then sent without waiting. The events are set as the hosts
        answer."""
        c = self.settings()
        self.lower()
        seconds = c.lease if seconds is None else seconds
        interval = leases.renew_interval(c.lease)
        now = self.clock.lease()
        due = [(name, hosts[name], hl) for name, hl in self.current.items()
               if name in hosts and (force or now - hl.sent >= interval)]
        if not due:
            return []
        grants = [(name, host, hl, leases.grant(*hl.latest, seconds)) for name, host, hl in due]
        wall = self.clock.time()
        longer = {name: leases.stored_record(g, self.boot, wall) for name, _h, _hl, g in grants
                  if g.ends_by > self.ends.get(name, leases.NEVER)}
        if longer:
            try:
                self.store.set_host_leases(longer)
            except errors.StoreError as err:
                if seconds + c.lease_margin >= c.host_lost_after:  # only the store tells the next controller
                    self.log(f"cannot store the hosts' leases, not granting {seconds:g} s: {err}")
                    return []
                # a next controller waits host_lost_after from its start anyway, which covers this
                # grant: a busy or full store must not make the hosts stop their jobs
                self.log(f"cannot store the hosts' leases ({err}); renewing them all the same")
            for name, record in longer.items():
                self.ends[name] = record["ends_by"]
        answered = []
        for name, host, hl, g in grants:
            hl.sent = now
            done = threading.Event()
            self.seq += 1
            sent = self.sent.setdefault(name, [])
            sent.append((self.seq, g.ends_by))  # before it is sent: its reply may come at once
            del sent[:-SENT_KEPT]
            try:
                host.grant_lease(g.until, g.seconds, hl.boot,
                                 partial(_heard, hl, done, self.clock.lease, self.confirmed.append, name, self.seq))
            except (errors.ExecError, AttributeError):
                continue  # lost meanwhile (HostDown follows), or a host without leases
            answered.append(done)
        return answered

    def lower(self) -> None:
        """Lower each host's reckoning (self.ends) as its confirmations allow (leases.bound_ends_by),
        and store it. Safe even if the store fails: a reckoning stored higher only makes the next
        controller wait longer."""
        lowered = {}
        while self.confirmed:
            name, seq, heard, bound = self.confirmed.popleft()
            sent = self.sent.get(name, [])
            if not sent or seq < sent[0][0]:  # a later grant's confirmation came first, or it was dropped
                continue
            self.sent[name] = later = [(n, ends_by) for n, ends_by in sent if n >= seq]
            if bound is None:  # not written (came too late), or a unit there may not obey it soon
                continue
            ends = leases.bound_ends_by(heard, bound, [ends_by for _n, ends_by in later])
            if ends < self.ends.get(name, leases.NEVER):
                self.ends[name] = lowered[name] = ends
        if not lowered:
            return
        now, wall = self.clock.lease(), self.clock.time()
        for name, ends in lowered.items():  # rare: a longer lease held before (a planned stop's)
            self.log(f"host {name} obeys this controller's lease now: its lease ends "
                     f"{max(0.0, ends - now):.0f} s from now at the latest")
        try:
            self.store.set_host_leases({name: leases.lowered_record(ends, now, self.boot, wall)
                                        for name, ends in lowered.items()})
        except errors.StoreError as err:
            self.log(f"cannot store the hosts' lowered leases ({err}); a next controller waits for the longer ones")

    def requeue_after_expiry(self, job: Any, host: str, result: Any) -> Requeue | None:
        """The requeue of an attempt its host stopped when the lease ran out (the controller was
        away or cut off longer than the lease, but the host not long enough to be declared lost):
        as for a lost host, it runs again (leases.requeue_after_expiry says when)."""
        if not leases.requeue_after_expiry(result.reason, bool(job.killed), self.settings().on_host_lost):
            return None
        return Requeue(job.id, job.state, f"host {host}: {result.reason}")

    def grant_maintenance(self, hosts: dict[str, Any]) -> None:
        """Before a planned stop: every connected host gets `maintenance_lease`, so that its jobs go
        on while the controller is away (up to that long); waits briefly for the hosts' answers."""
        seconds = self.settings().maintenance_lease
        answered = self.renew(hosts, seconds, force=True)
        deadline = time.monotonic() + MAINTENANCE_WAIT
        for done in answered:
            done.wait(max(0.0, deadline - time.monotonic()))
        if answered:
            confirmed = sum(done.is_set() for done in answered)
            self.log(f"granted {confirmed} of {len(answered)} host(s) a maintenance lease of {seconds:g} s: "
                     "their jobs go on while the controller is stopped, up to that long")


def _heard(hl: HostLease, done: threading.Event, now: Callable[[], float], confirm: Callable[[tuple], None],
           name: str, seq: int, reply: dict | None, error: Exception | None) -> None:
    """A host's answer to a grant (reader thread): its clock reading is the base of the next one;
    the confirmation (with the reply's `bound`) goes to HostLeases.lower, on the tick's thread."""
    if error is None and reply is not None and reply.get("ok") and isinstance(reply.get("clock"), (int, float)):
        heard = now()  # the controller's lease clock (seams.RealClock.lease: CLOCK_BOOTTIME)
        if heard > hl.latest[1]:
            hl.latest = (float(reply["clock"]), heard)
        bound = reply.get("bound")
        if not isinstance(bound, (int, float)) or isinstance(bound, bool) or not 0 <= bound < float("inf"):
            bound = None  # an older agent's reply, or one that binds nothing
        confirm((name, seq, heard, bound))
        done.set()

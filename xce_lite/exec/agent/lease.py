"""The host side of the controller's lease: this host runs xce units only while the controller has
been heard from within the lease it granted (docs/agent-protocol.md, "Lease").

The lease is a deadline on this host's CLOCK_BOOTTIME (one clock for every process of a boot, and
it counts while the host is suspended, so a host that sleeps through its lease wakes up fenced).
The controller never sends a time of its own: it grants `until` = a reading of this clock that the
agent sent it (hello, ping, lease replies) + the lease, so no clock sync is assumed and a grant
that arrives late (a frozen sshd, a stalled network) extends nothing the controller did not
reckon with. Each grant replaces the lease, shorter or longer: grants on one channel arrive in the
order they were sent, and a controller reckons with the longest lease it ever granted (and stored),
so a shorter grant only fences its units sooner; a longer lease left by another controller (a store
started afresh, a maintenance lease) must not outlive the lease the controller of now reckons with.

SPOOL/lease holds it ({"boot", "until", "renewed": when the last grant came, "seconds": its
length}, replaced atomically at each grant), so that every supervisor (which outlives the agent)
and the next agent enforce the same deadline: at it, each stops its units, with expired_reason().
A file of another boot is no lease (its units were lost with that boot); no file means no lease
was ever granted here (an agent driven without leases). The agent's parts: HostLease (the `lease`
request, the deadline) and LeaseEnforcer (its units stopped at it).
"""

from __future__ import annotations

import os
import sys
import time

from .jsonl import dumps, loads
from .util import format_limit, read_text, write_file

TYPE_CHECKING = False  # true for mypy only: supervisors load this module (watch.py), never typing
if TYPE_CHECKING:
    from .shared import AgentState
    from .state import UnitState
    from .unitops import UnitOps

LEASE = "lease"  # in the spool
LEASE_RETRY = 1.0  # seconds between two tries to stop a unit whose lease ran out


def clock() -> float:
    """This host's lease clock, in seconds (CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def expired_reason(renewed: float) -> str:
    """The end reason of a unit stopped because its lease ran out (`renewed`: when the last grant
    came, on the lease clock); the same words from the agent and from a supervisor."""
    return f"lease expired: no word from the controller for {format_limit(clock() - renewed)}"


def read_lease(spool: str, boot: str) -> tuple[float, float] | None:
    """(until, renewed) of the lease granted in this boot, or None if none was."""
    try:
        text = read_text(os.path.join(spool, LEASE))
        d = loads(text) if text else None
        if isinstance(d, dict) and d.get("boot") == boot:
            return float(d["until"]), float(d["renewed"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_lease(spool: str, boot: str, until: float, renewed: float, seconds: float) -> None:
    data = {"boot": boot, "until": until, "renewed": renewed, "seconds": seconds}
    write_file(os.path.join(spool, LEASE), dumps(data))


class HostLease:
    """The `lease` request and the deadline it sets: `state.lease` is (until, renewed) or None (never
    granted: nothing is enforced, as with a version 2 controller)."""

    def __init__(self, state: AgentState):
        self.state = state

    def load_lease(self) -> None:
        """At start: the lease an earlier agent wrote in this boot holds for this one too."""
        s = self.state
        s.lease = read_lease(s.spool, s.boot)

    def op_lease(self, req: dict) -> dict:
        """{until (this host's clock), seconds, boot} -> clock, until (the lease in force): the lease
        ends at `until` from now on (see the module docstring: it may shorten it). A grant whose
        `until` has passed renews nothing; a grant for another boot is refused."""
        from .validate import Refused

        s = self.state
        until, seconds = req.get("until"), req.get("seconds")
        for name, value in (("until", until), ("seconds", seconds)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                raise Refused(f"lease: {name} must be a number, not {value!r}")
        if req.get("boot") != s.boot:
            raise Refused(f"lease: granted for boot {req.get('boot')!r}, this host runs boot {s.boot}")
        assert isinstance(until, (int, float)) and isinstance(seconds, (int, float))  # checked above
        now = clock()
        if until > now:  # else it came too late to count: it renews nothing
            try:
                write_lease(s.spool, s.boot, float(until), now, float(seconds))
            except OSError as exc:
                raise Refused(f"cannot write {os.path.join(s.spool, LEASE)}: {exc.strerror}") from None
            s.lease = (float(until), now)
            s.lease_acted = False  # a new deadline: enforced when it comes
        return {"clock": now, "until": None if s.lease is None else s.lease[0]}

    def lease_left(self) -> float | None:
        """Seconds until the lease runs out (<= 0: it has), or None without a lease."""
        lease = self.state.lease
        return None if lease is None else lease[0] - clock()

    def lease_lapsed(self) -> str | None:
        """Why no unit may start now (the lease ran out), or None."""
        left = self.lease_left()
        if left is None or left > 0:
            return None
        return (f"this host's lease ran out {left * -1:.0f} s ago (no word from the controller): "
                "it starts nothing until the controller renews it")


class LeaseEnforcer:
    """The end of the lease: every unit `unit_state` knows running is stopped by `unit_ops`'s signal
    request; `state.lease_acted` is set once that was done for the current deadline."""

    def __init__(self, state: AgentState, host_lease: HostLease, unit_state: UnitState, unit_ops: UnitOps):
        self.state, self.host_lease, self.unit_state, self.unit_ops = state, host_lease, unit_state, unit_ops

    def enforce_lease(self) -> None:
        """Once the lease has run out: stop every running unit, with the lease's reason (once per
        deadline; a unit's post hooks run as for any kill). A unit that could not be asked to stop
        (systemd did not answer) is asked again every LEASE_RETRY seconds."""
        s = self.state
        left = self.host_lease.lease_left()
        if left is None or left > 0:
            return
        if not s.lease_acted:
            s.lease_acted = True
            self.unit_state.catch_up()
            s.lease_retry = [unit for unit, u in s.units.items() if u.result is None]
            s.lease_retry_at = 0.0
        if not s.lease_retry or time.monotonic() < s.lease_retry_at:
            return
        assert s.lease is not None  # lease_left() gave a number
        reason = expired_reason(s.lease[1])
        units, s.lease_retry, stopped = s.lease_retry, [], 0
        for unit in units:
            try:
                stopped += bool(self.unit_ops.op_signal({"unit": unit, "signal": "TERM", "reason": reason})["found"])
            except Exception as exc:  # one unit's trouble must not spare the others
                s.lease_retry.append(unit)
                log(f"cannot stop {unit} at the end of its lease ({exc}); trying again")
        s.lease_retry_at = time.monotonic() + LEASE_RETRY
        if stopped:
            log(f"{reason}: stopping {stopped} unit(s)")


def log(message: str) -> None:
    try:
        print(f"agent: {message}", file=sys.stderr, flush=True)
    except OSError:  # an orphan's stderr may be gone
        pass

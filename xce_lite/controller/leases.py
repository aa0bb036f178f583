"""The arithmetic of host leases, pure (no clock, no I/O): every time is an argument.

Two clocks, never compared with each other: the host's lease clock (its CLOCK_BOOTTIME, read by its
agent) and the controller's (its own CLOCK_BOOTTIME). A grant is `until` = a reading of the host's
clock the agent sent + the lease; the controller heard that reading at `heard` on its own clock, at
or after the moment the host took it. So, whenever the grant arrives (a frozen channel may deliver
it late), the host's lease ends no later than `heard + lease` on the controller's clock, up to the
two clocks' rate difference, which the margin covers along with the time the host takes to stop
its jobs. Nothing here assumes the clocks agree on the time of day.

The reckoning may come down (bound_ends_by): once a host confirms a grant with `bound` (its agent
wrote it, and every unit there obeys the lease file within `bound` s), whatever it held before
(a maintenance lease of an hour) binds nothing from `bound` s after the reply was heard: from
then on only this grant and the ones sent after it count.

The rule for declaring a host lost: out of reach for `host_lost_after`, AND `host_lost_after` since
this controller started (a restart knows nothing of the time before it), AND past the end of every
lease it (or an earlier controller, as stored) may have granted, plus the margin.
"""

from __future__ import annotations

from dataclasses import dataclass

NEVER = float("-inf")


@dataclass(frozen=True)
class Grant:
    """A lease to send: `until` on the host's clock; `ends_by` on the controller's clock."""

    until: float
    seconds: float
    ends_by: float


def grant(host_clock: float, heard: float, seconds: float) -> Grant:
    """The lease of `seconds` counted from the host clock reading `host_clock`, heard at `heard`."""
    return Grant(host_clock + seconds, seconds, heard + seconds)


def renew_interval(lease: float) -> float:
    """How often a connected host's lease is renewed: a quarter of it (at most every 0.2 s, at
    least every minute), so that a host keeps most of its lease through a few missed renewals."""
    return min(60.0, max(0.2, lease / 4))


def lost_at(down_since: float, started: float, host_lost_after: float, ends_by: float, margin: float) -> float:
    """The controller-clock time from which a host out of reach since `down_since` may be declared
    lost (its jobs requeued): see the module docstring."""
    return max(down_since + host_lost_after, started + host_lost_after, ends_by + margin)


def bound_ends_by(heard: float, bound: float, later: list[float]) -> float:
    """When a host's lease surely ends, on this controller's clock, once it confirmed (reply heard
    at `heard`) a grant that binds every unit there within `bound` s: its spool held that grant
    (or a later one) before it replied, grants on one channel arrive in order and the next agent
    takes the spool only after this one let it go, so every unit obeys one of the grants sent
    since, `later` (their `ends_by`, this grant's among them), at the latest from `heard + bound`."""
    return max([heard + bound, *later])


def stored_ends_by(stored: dict, boot: str, started: float) -> float:
    """When a lease stored by an earlier controller surely ends, on this controller's clock.

    `stored` is {"boot", "ends_by", "seconds"}. Of this machine's boot, its `ends_by` holds as it
    is (the clock runs on across a restart). Of another boot, the time between is unknown: the
    lease can have at most its whole length left, counted from this start."""
    try:
        if stored.get("boot") == boot:
            return float(stored["ends_by"])
        return started + float(stored["seconds"])
    except (KeyError, TypeError, ValueError):
        return started  # unreadable: the start's own wait (host_lost_after) still holds


def stored_record(g: Grant, boot: str, granted_at: float) -> dict:
    """What the store keeps of a grant (`granted_at`: wall time, for people reading it)."""
    return {"boot": boot, "ends_by": g.ends_by, "seconds": g.seconds, "granted_at": granted_at}


def lowered_record(ends_by: float, now: float, boot: str, granted_at: float) -> dict:
    """What the store keeps of a lowered reckoning (bound_ends_by) made at `now`: as a grant's
    record, with the longest the lease can have left from now as its length (what another boot's
    controller counts from its start)."""
    return {"boot": boot, "ends_by": ends_by, "seconds": max(0.0, ends_by - now), "granted_at": granted_at}


# The first words of the reason a host gives a unit it stopped because its lease ran out (the
# agent's and the supervisors' expired_reason, exec/agent/lease.py; a test ties the two).
EXPIRED = "lease expired:"


def requeue_after_expiry(reason: str | None, killed: bool, on_host_lost: str) -> bool:
    """Whether an attempt that ended with `reason` goes back to PEND as a job on a lost host would:
    its host stopped it for want of the controller, not for anything the job did. A job someone
    killed still ends EXIT (kill wins); `on_host_lost: exit` ends it EXIT with the reason."""
    return reason is not None and reason.startswith(EXPIRED) and not killed and on_host_lost == "requeue"

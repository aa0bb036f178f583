"""The controller's reckoning of a host's lease comes down once the host confirms a grant that binds
every unit there (controller/leasework.py HostLeases.lower, leases.bound_ends_by), and never below
a lease it may still hold: the stored hour of a planned stop counts until then.

A real store on a fresh SQLite file and the real HostLeases; the host is a stand-in that answers
each grant as the agent does (`bound` as the test says), on the controller's fake clock.
"""

from __future__ import annotations

from types import SimpleNamespace

from xce_lite.config.cluster import ControllerConfig
from xce_lite.controller import leases
from xce_lite.controller.leasework import HostLeases
from xce_lite.controller.seams import FakeClock
from xce_lite.exec.agent.util import boot_id

SETTINGS = ControllerConfig(lease=5, lease_margin=2, host_lost_after=9, maintenance_lease=3600)
HOUR = 3600.0


class Host:
    """Answers every grant at once with the host clock `offset` ahead of the controller's, or holds
    the answers back (`answer` False) until release()."""

    def __init__(self, clock: FakeClock, bound: float | None, answer: bool = True):
        self.clock, self.bound, self.answer, self.held = clock, bound, answer, []

    def grant_lease(self, until, seconds, boot, callback):
        reply = {"ok": True, "clock": self.clock.now + 1000.0, "until": until, "bound": self.bound}
        if self.answer:
            callback(reply, None)
        else:
            self.held.append((callback, reply))

    def release(self) -> None:
        for callback, reply in self.held:
            callback(reply, None)


def controller(store, clock: FakeClock, logs: list[str]) -> HostLeases:
    return HostLeases(store, clock, logs.append, lambda: SETTINGS)


def up(hl: HostLeases, clock: FakeClock) -> None:
    hl.host_up("h", SimpleNamespace(extra={"clock": clock.now + 1000.0, "boot_id": "host-boot"}))


def after_a_planned_stop(store, clock: FakeClock) -> None:
    """What `xce controller stop` left in the store: an hour-long lease granted to h just now."""
    store.set_host_leases({"h": leases.stored_record(leases.grant(0.0, clock.now, HOUR), boot_id(), 0.0)})


def test_a_confirmed_binding_grant_lowers_the_hour_so_a_host_cut_off_is_lost_in_seconds_also_after_a_restart(store):
    clock, logs = FakeClock(100.0), []
    after_a_planned_stop(store, clock)
    hl = controller(store, clock, logs)
    assert hl.ends["h"] == 100.0 + HOUR
    up(hl, clock)
    assert len(hl.renew({"h": Host(clock, bound=1.0)})) == 1
    hl.lower()
    assert hl.ends["h"] == 100.0 + 5  # this grant (heard at 100 + 5 s) outlasts the reply + 1 s
    assert any("host h obeys this controller's lease now" in line for line in logs), logs
    clock.now = 101.0
    hl.host_down("h")
    clock.now = 109.0 + 1
    assert hl.allows_loss("h")  # host_lost_after (9 s) from its start and from the loss; the lease + 2 s
    # a controller started next (a crash) reads the lowered reckoning from the store
    clock.now = 111.0
    again = controller(store, clock, [])
    assert again.ends["h"] <= 105.0 + 1e-9
    again.host_down("h")
    clock.now = 111.0 + 9
    assert again.allows_loss("h")


def test_without_bound_or_without_an_answer_the_hour_still_counts(store):
    clock = FakeClock(100.0)
    after_a_planned_stop(store, clock)
    hl = controller(store, clock, [])
    up(hl, clock)
    hl.renew({"h": Host(clock, bound=None)})  # a unit an older agent launched runs there
    silent = Host(clock, bound=1.0, answer=False)
    clock.now = 102.0
    hl.renew({"h": silent})  # sent, never answered: the host may not even have it
    hl.lower()
    assert hl.ends["h"] == 100.0 + HOUR
    hl.host_down("h")
    clock.now = 100.0 + HOUR
    assert not hl.allows_loss("h")
    clock.now = 100.0 + HOUR + 2
    assert hl.allows_loss("h")


def test_a_confirmation_never_lowers_below_a_longer_grant_sent_after_it(store):
    """A short grant, then the maintenance grant of a second planned stop, and only then the short
    one's reply: the host may hold the hour again, so the reckoning stays with it."""
    clock = FakeClock(100.0)
    hl = controller(store, clock, [])
    up(hl, clock)
    host = Host(clock, bound=1.0, answer=False)
    hl.renew({"h": host})
    clock.now = 101.0
    hl.renew({"h": host}, seconds=HOUR, force=True)
    host.release()
    hl.lower()
    assert hl.ends["h"] == 100.0 + HOUR  # counted from the host's reading, heard at 100
    assert store.host_leases()["h"]["ends_by"] == 100.0 + HOUR


def test_bound_ends_by_is_the_latest_of_the_reply_plus_the_reread_and_every_grant_since():
    assert leases.bound_ends_by(10.0, 1.0, [8.0]) == 11.0
    assert leases.bound_ends_by(10.0, 1.0, [15.0, 3610.0, 20.0]) == 3610.0
    record = leases.lowered_record(15.0, 10.0, "b", 0.0)
    assert leases.stored_ends_by(record, "b", 12.0) == 15.0
    assert leases.stored_ends_by(record, "other boot", 12.0) == 17.0  # its whole remainder, from the start

"""hostlinks.py: each host kept connected in the background, with backoff.

The link's logic runs against a scripted Host (the seam is narrow: connect, list_units, close), and
once against a real local agent that is killed under it.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from pathlib import Path

from tests.support.waiting import wait_until
from xce_lite.errors import HostKeyChanged, HostUnreachable
from xce_lite.exec.host import HostLost, HostProbe, UnitInfo
from xce_lite.exec.link import HostDown, HostLink, HostUp
from xce_lite.exec.local import LocalHost

PROBE = HostProbe(hostname="h", cpus=2, mem=1 << 30, agent_version=1)


class ScriptedHost:
    """A Host whose connect fails while `plan` says so; records what was done to it."""

    def __init__(self, plan: list[str], log: list[str]):
        self.plan, self.log = plan, log
        self.sink = None

    def connect(self, events):
        outcome = self.plan.pop(0) if self.plan else "ok"
        self.log.append(f"connect:{outcome}")
        if outcome == "key changed":
            raise HostKeyChanged("HOST KEY CHANGED for h: it shows ssh-ed25519 SHA256:new", "SHA256:new")
        if outcome != "ok":
            raise HostUnreachable(f"host h: {outcome}")
        self.sink = events
        return PROBE

    def list_units(self):
        return [UnitInfo("xce-t-1-1-0", "running", 1.0)]

    def close(self):
        self.log.append("close")


def take(events: queue.Queue, kind, timeout: float = 10.0):
    """The next event of `kind` (others are kept in order in the returned list's head)."""
    skipped = []
    while True:
        event = events.get(timeout=timeout)
        if isinstance(event, kind):
            return event, skipped
        skipped.append(event)


def link_with(plan: list[str]) -> tuple[HostLink, queue.Queue, list[str], list[ScriptedHost]]:
    events: queue.Queue = queue.Queue()
    log: list[str] = []
    made: list[ScriptedHost] = []

    def factory():
        made.append(ScriptedHost(plan, log))
        return made[-1]

    link = HostLink("h", factory, events, lambda _m: None, backoff_max=0.05, first_delay=0.01)
    link.start()
    return link, events, log, made


def test_a_link_announces_the_host_up_with_what_it_lists() -> None:
    link, events, _log, _made = link_with([])
    try:
        up, _ = take(events, HostUp)
        assert (up.host, up.probe, up.generation) == ("h", PROBE, 1)
        assert [u.unit for u in up.units] == ["xce-t-1-1-0"]
    finally:
        link.close()


def test_failed_connects_are_reported_once_and_retried_until_one_works() -> None:
    link, events, log, _made = link_with(["refused", "refused", "refused"])
    try:
        down, _ = take(events, HostDown)
        assert "refused" in down.why
        up, skipped = take(events, HostUp)
        assert skipped == []  # one HostDown for the whole outage, not one per attempt
        assert up.generation == 4
        assert log.count("connect:refused") == 3 and log[-1] == "connect:ok"
    finally:
        link.close()


def test_a_lost_connection_is_reported_and_made_again_and_old_news_is_ignored() -> None:
    link, events, log, made = link_with([])
    try:
        take(events, HostUp)
        first = made[0]
        first.sink.put(HostLost("h", "the agent's output ended"))
        down, _ = take(events, HostDown)
        assert (down.why, down.generation) == ("the agent's output ended", 1)
        up, _ = take(events, HostUp)
        assert up.generation == 2 and up.handle is made[1]
        first.sink.put(HostLost("h", "a late word from the old connection"))
        assert wait_until(lambda: "close" in log, 5, "the old connection to be closed")
        assert events.empty()  # the old connection's loss changes nothing
    finally:
        link.close()


def test_a_new_reason_in_the_same_outage_is_reported_at_once() -> None:
    """A host lost, then refusing connections (its sshd restarting), then showing a changed key: each
    new reason is news (the key's above all: only a person can fix it), a repeated one is not."""
    link, events, log, made = link_with(["ok", "refused", "refused", "key changed", "key changed"])
    try:
        take(events, HostUp)
        made[0].sink.put(HostLost("h", "the agent's output ended"))
        whys = [take(events, HostDown)[0].why for _ in range(3)]
        assert whys == ["the agent's output ended", "host h: refused",
                        "HOST KEY CHANGED for h: it shows ssh-ed25519 SHA256:new"]
        _up, skipped = take(events, HostUp)
        assert skipped == []  # the second refusal and the second key refusal said nothing new
        assert log.count("connect:key changed") == 2
    finally:
        link.close()


def test_close_stops_trying_and_closes_the_connection() -> None:
    link, events, log, _made = link_with([])
    take(events, HostUp)
    link.close()
    assert log[-1] == "close"
    assert not link._thread.is_alive()


def test_a_real_agent_killed_under_its_link_comes_back(tmp_path: Path) -> None:
    events: queue.Queue = queue.Queue()
    hosts: list[LocalHost] = []
    lock = threading.Lock()

    def factory():
        with lock:
            hosts.append(LocalHost("local", tmp_path / "spool"))
            return hosts[-1]

    link = HostLink("local", factory, events, lambda _m: None, first_delay=0.05)
    link.start()
    try:
        take(events, HostUp)
        pid = hosts[0].agent_pid
        os.kill(pid, signal.SIGKILL)
        down, _ = take(events, HostDown)
        assert "ended" in down.why
        up, _ = take(events, HostUp)
        assert up.handle is hosts[1] and hosts[1].agent_pid != pid
    finally:
        link.close()

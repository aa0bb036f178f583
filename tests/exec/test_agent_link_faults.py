"""link.systemd_known and the releases of agent-recorded units when the manager's answers fail midway:
a GetAll whose connection breaks (systemd re-executing), a GetAll refused, a release never sent or
refused. The manager is a scripted stand-in at the D-Bus seam (Bus.call / Bus.send), as in
test_agent_dbus_watch.py; the real re-exec is test_agent_systemd_records.py's."""

from __future__ import annotations

import errno
from pathlib import Path

from xce_lite.exec.agent.dbus import Bus, DBusError, unit_path
from xce_lite.exec.agent.journal import Unit
from xce_lite.exec.agent.link import ManagerLink
from xce_lite.exec.agent.shared import AgentState

RECORDED = {"record": "agent"}
FAILED = {"Result": ("s", "exit-code"), "ExecMainCode": ("i", 1), "ExecMainStatus": ("i", 3),
          "ExecMainExitTimestamp": ("t", 1796231394766925)}
EXITED = {**FAILED, "Result": ("s", "success"), "ExecMainStatus": ("i", 0)}


class Manager(Bus):
    """No socket: call() answers ListUnitsByNames from `units` (name -> (active, sub)) and GetAll from
    `props` (unit -> properties, or an exception to raise); send() keeps what was sent."""

    def __init__(self, units: dict, props: dict):
        self.units, self.props, self.sent, self.closed = units, props, [], False
        self.watch, self.backlog, self.out, self.serial = set(), [], bytearray(), 0

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        self.closed = True

    def call(self, member, signature="", args=(), timeout=0.0, **where):
        if self.closed:
            raise OSError(errno.EPIPE, "closed")
        if member == "ListUnitsByNames":
            rows = []
            for name in args[0]:
                unit = name.removesuffix(".service")
                active, sub = self.units.get(unit, ("inactive", "dead"))
                load = "loaded" if unit in self.units else "not-found"
                rows.append((name, "", load, active, sub, "", unit_path(name), 0, "/", "/"))
            return [rows]
        assert member == "GetAll"
        unit = next(u for u in self.units if unit_path(f"{u}.service") == where["path"])
        found = self.props[unit]
        if isinstance(found, Exception):
            if isinstance(found, OSError):
                self.closed = True
            raise found
        return [found]

    def send(self, member, signature="", args=(), **where):
        self.serial += 1
        self.sent.append((member, args[0].removesuffix(".service")))
        return self.serial


def agent(tmp_path: Path, manager: Manager) -> tuple[AgentState, ManagerLink]:
    s = AgentState(str(tmp_path), "h", mode="systemd")
    for unit in manager.units:
        s.units[unit] = Unit(1.0, "systemd", dict(RECORDED))
    s.bus = manager
    return s, ManagerLink(s)


def test_a_connection_lost_during_getall_leaves_no_unit_tracked_or_judged(tmp_path):
    # a re-exec breaks the connection at the first unit's GetAll: the units after it were not asked
    # about on a live connection; none may be tracked (it would never be asked about again) or lost
    units = {"a": ("active", "exited"), "b": ("failed", "failed"), "c": ("active", "exited")}
    manager = Manager(units, {"a": OSError(errno.ECONNRESET, "re-exec"), "b": FAILED, "c": EXITED})
    s, link = agent(tmp_path, manager)
    s.next_connect = 1e18  # no reconnecting here
    assert link.systemd_known(list(units)) == {}
    assert s.tracked == set() and s.bus is None and s.ended == {}


def test_a_getall_refused_leaves_an_ended_unit_to_be_asked_again(tmp_path):
    units = {"a": ("active", "exited"), "b": ("failed", "failed"), "c": ("active", "running"),
             "d": ("failed", "failed")}
    manager = Manager(units, {"a": DBusError("org.freedesktop.DBus.Error.Failed", "no"),
                              "b": ValueError("bad reply"), "d": FAILED})
    s, link = agent(tmp_path, manager)
    known = link.systemd_known(list(units))
    # a and b: over, their result unread: neither running on the live connection nor lost
    assert known == {"c": True, "d": False}
    assert s.tracked == {"c"} and set(s.ended) == {"d"}
    manager.props.update(a=EXITED, b=FAILED)  # asked again: now read
    assert link.systemd_known(["a", "b"]) == {"a": False, "b": False}
    assert s.ended["a"][0] == "active" and s.ended["b"][0] == "failed"


def test_a_release_not_sent_refused_or_lost_is_sent_again_until_the_unit_is_gone(tmp_path):
    units = {"a": ("active", "exited"), "b": ("failed", "failed")}
    manager = Manager(units, {})
    s, link = agent(tmp_path, manager)
    s.bus = None
    s.next_connect = 1e18
    link.release("a", "active")  # recorded while reconnecting: nothing can be sent
    link.release("b", "failed")
    link.retry_releases()  # not connected yet
    assert manager.sent == []
    s.bus = manager  # connected again
    link.retry_releases()
    assert sorted(manager.sent) == [("ResetFailedUnit", "b"), ("StopUnit", "a")]
    assert sorted(s.calls.values()) == [("release", "a"), ("release", "b")]
    link.release_failed("b", "org.freedesktop.DBus.Error.AccessDenied")  # refused: sent again
    manager.sent.clear()
    link.retry_releases()
    assert manager.sent == [("ResetFailedUnit", "b")]
    link.bus_lost(OSError(errno.ECONNRESET, "re-exec"))  # the replies, or the UnitRemoved, went with it
    assert s.calls == {} and link.unsent == {"a", "b"}
    manager.closed, manager.sent = False, []
    s.bus = manager
    link.send_releases()  # as connect_bus does on connecting
    assert sorted(manager.sent) == [("ResetFailedUnit", "b"), ("StopUnit", "a")]
    link.release_failed("a", "org.freedesktop.systemd1.NoSuchUnit")  # gone meanwhile: let go
    link.released("b")  # its release answered
    assert link.to_release == {} and link.unsent == set()
    manager.sent.clear()
    link.retry_releases()
    assert manager.sent == []

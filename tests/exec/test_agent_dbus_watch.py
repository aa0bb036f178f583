"""The agent's D-Bus reader picks a watched unit's PropertiesChanged out of the manager's stream and
reads the properties it needs without decoding the rest; the messages are marshalled here with the
agent's own dbus_put, as sd-bus lays them out (path first) and with the fields in another order."""

from __future__ import annotations

import _struct

from xce_lite.exec.agent.dbus import DBUS_SIGNAL, Bus, dbus_put, unit_path


def signal_message(path: str, interface: str, changed: dict, path_first: bool = True) -> bytes:
    body = bytearray()
    for kind, value in (("s", interface), ("a{sv}", changed), ("as", [])):
        dbus_put(body, kind, value)
    fields = [(1, ("o", path)), (2, ("s", "org.freedesktop.DBus.Properties")), (3, ("s", "PropertiesChanged")),
              (8, ("g", "sa{sv}as"))]
    if not path_first:
        fields = fields[1:] + fields[:1]
    head = bytearray(_struct.pack("<cBBBII", b"l", DBUS_SIGNAL, 0, 1, len(body), 7))
    dbus_put(head, "a(yv)", fields)
    head += bytes(-len(head) % 8)
    return bytes(head + body)


class Reader(Bus):
    def __init__(self):  # no socket: parse() reads what is put in inbuf
        self.inbuf, self.watch, self.backlog = bytearray(), set(), []


def test_unit_paths_are_escaped_as_systemd_does():
    assert unit_path("xce-c1-12-1-0.service") == "/org/freedesktop/systemd1/unit/xce_2dc1_2d12_2d1_2d0_2eservice"
    assert unit_path("1a_b.service") == "/org/freedesktop/systemd1/unit/_31a_5fb_2eservice"


def test_a_watched_units_properties_are_read_and_the_others_skipped():
    ours, other = unit_path("ours.service"), unit_path("other.service")
    # a value that holds a property's name (and its NUL) before that property: not taken for its key
    service = {"StatusText": ("s", "see ExecMainCode"), "Result": ("s", "exit-code"), "ExecMainCode": ("i", 1),
               "ExecMainStatus": ("i", 3), "ExecMainExitTimestamp": ("t", 1796231394766925)}
    unit = {"ActiveState": ("s", "failed"), "SubState": ("s", "failed")}
    reader = Reader()
    reader.watch = {ours}
    for path_first in (True, False):
        reader.inbuf += signal_message(other, "org.freedesktop.systemd1.Service", service, path_first)
        reader.inbuf += signal_message(ours, "org.freedesktop.systemd1.Service", service, path_first)
        reader.inbuf += signal_message(ours, "org.freedesktop.systemd1.Unit", unit, path_first)
        found = reader.parse()
        assert [(m.path, m.interface) for m in found] == [(ours, "org.freedesktop.systemd1.Service"),
                                                          (ours, "org.freedesktop.systemd1.Unit")]
        assert [found[0].prop(k) for k in ("Result", "ExecMainCode", "ExecMainStatus", "ExecMainExitTimestamp")] == [
            "exit-code", 1, 3, 1796231394766925]
        assert found[0].prop("CPUUsageNSec") is None  # not sent: not there
        assert (found[1].prop("ActiveState"), found[1].prop("SubState")) == ("failed", "failed")
        assert found[1].decoded()[1]["SubState"] == ("s", "failed") and found[1].prop("SubState") == "failed"
    reader.watch = set()  # nothing watched: PropertiesChanged are skipped as before
    reader.inbuf += signal_message(ours, "org.freedesktop.systemd1.Unit", unit)
    assert reader.parse() == []

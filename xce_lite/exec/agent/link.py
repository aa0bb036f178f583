"""The agent's connection to the service manager's private socket (systemd modes): made when first
needed and again after a loss, and the one question every part may ask on it, which units systemd
knows. The calls that start, stop and attach are manager.py's.

Invariants: at most one attempt a second while the manager does not answer (unless `now`); when the
connection is lost, every call not answered is forgotten (a start is no longer "starting", a tasks'
supervisor waiting for its attach is told) and what systemd tracked is doubtful until asked again.
A unit whose end the agent records itself (manager.agent_records) is watched (its PropertiesChanged
read) from before systemd is asked about it, so that no end of it between the two goes unseen: it
stays loaded once over, and no UnitRemoved would come. Once its result is recorded it is released
(StopUnit or ResetFailedUnit), again and again if need be, until systemd answers that call (or
says it has no such unit): never left loaded. Not until its UnitRemoved: a re-executing systemd
sends UnitRemoved for every unit, then drops the connection with the release perhaps unread.
"""

from __future__ import annotations

import os
import sys
import time

from .dbus import Bus, DBusError, manager_socket, unit_path
from .systemd import END_PROPERTIES, unit_over

TYPE_CHECKING = False  # true for mypy only: see shared.py
if TYPE_CHECKING:
    from .shared import AgentState


class ManagerLink:
    """The connection (state.bus) and what hangs on it (state.calls, starting, tracked, held)."""

    def __init__(self, state: AgentState):
        self.state = state
        # units over and recorded, to be let go: unit -> its ActiveState then ("failed", or "active"
        # and exited), until systemd answers its release (or NoSuchUnit); `unsent`: those whose release is to be
        # sent (again): not connected, refused, or lost with the connection (send_releases)
        self.to_release: dict[str, str] = {}
        self.unsent: set[str] = set()

    def connect_bus(self, now: bool = False) -> Bus | None:
        """Reach the manager's private socket, unless connected (tried at most once a second while
        it does not answer, unless `now`); the connection (state.bus), or None if there is none."""
        s = self.state
        if s.bus is not None:
            return s.bus
        if s.mode == "plain" or (time.monotonic() < s.next_connect and not now):
            return None
        path = manager_socket(s.mode, s.host.get("env", os.environ))
        try:
            s.bus = bus = Bus(path, timeout=2.0)
        except OSError as exc:
            s.next_connect = time.monotonic() + 1.0
            print(f"agent: cannot reach the manager at {path} ({exc}); trying again", file=sys.stderr)
            return None
        if s.poller is not None:
            s.poller.register(bus.fileno(), 1)  # POLLIN
        self.send_releases()
        return bus

    def bus_lost(self, exc: Exception) -> None:
        """The manager closed the connection (as it does when it re-executes itself) or broke it:
        what it did not answer is unknown, and what it tracked is doubtful, until it is asked again
        (poll_watched does, reconnecting)."""
        s = self.state
        print(f"agent: lost the connection to the manager ({exc}); reconnecting", file=sys.stderr)
        bus, s.bus = s.bus, None
        if bus is not None:
            if s.poller is not None:
                s.poller.unregister(bus.fileno())
            bus.close()
        for what, unit, *extra in s.calls.values():
            if what == "start":
                s.starting.discard(unit)
            elif what == "attach":
                answer_tasks(extra[0], "the connection to systemd was lost")
        s.calls.clear()
        s.tracked.clear()
        s.ends.clear()  # watched on the lost connection: again once asked about (systemd_known)
        s.ends_by_path.clear()
        s.held.clear()  # their JobRemoved will not come: a signal now goes straight to systemd
        self.unsent.update(self.to_release)  # sent, maybe unread: unanswered

    def systemd_known(self, units: list[str]) -> dict[str, bool]:
        """unit -> True if systemd knows it (loaded, and active, activating, deactivating or
        reloading, or with a job queued: a unit waits inactive for its start job), False if not;
        units systemd was not asked about (it did not answer; another mode's) are left out. One
        ListUnitsByNames call for all of `units`; a unit it says is there is tracked from then on.
        A unit that records no result of its own and is over (exited, or failed) is not known: its
        properties go to state.ended, whence record_lost takes its result; one whose properties
        could not be read is left out (not tracked: asked again), for its PropertiesChanged went by."""
        s = self.state
        names = [u for u in units if s.units[u].mode == s.mode]
        bus = self.connect_bus() if names else None
        if bus is None:
            return {}
        for unit in names:
            if agent_recorded(s.units[unit].direct):
                self.watch_end(unit)
        listed = self.list_units(bus, names)
        if listed is None:
            return {}
        known = {}
        for name, _desc, load, active, sub, _following, path, job, *_rest in listed:
            unit = name.removesuffix(".service")
            if unit not in s.units:
                continue
            alive = active in ("active", "activating", "deactivating", "reloading")
            over = active == "failed" or sub == "exited"  # or stays so: it records no result of its own
            if load == "loaded" and over and agent_recorded(s.units[unit].direct):
                props = self.end_properties(path)
                if s.bus is not bus:  # lost on the way: what was tracked is doubtful again (bus_lost)
                    return {}
                if props is None or not unit_over(active, sub, props):
                    continue  # systemd holds its result, unread yet: neither running nor lost
                s.ended[unit] = (active, props)
                known[unit] = False
            else:
                known[unit] = load == "loaded" and (alive or job != 0)
            if known[unit]:
                s.tracked.add(unit)
            else:
                self.forget_end(unit)
        return known

    def list_units(self, bus: Bus, units: list[str]) -> list | None:
        """ListUnitsByNames of `units` (one call): its rows (name, description, load, active, sub,
        following, path, job id, ...), or None if systemd did not answer (its units are not judged now)."""
        try:
            return bus.call("ListUnitsByNames", "as", ([f"{u}.service" for u in units],))[0]
        except DBusError as exc:
            print(f"agent: ListUnitsByNames failed ({exc}); its units are not judged now", file=sys.stderr)
        except OSError as exc:
            self.bus_lost(exc)
        return None

    def release_recorded(self) -> None:
        """At start: let go the units an earlier agent recorded but did not release (it died in
        between): each was kept loaded for its result, which the journal has. One ListUnitsByNames call."""
        s = self.state
        units = [u for u, unit in s.units.items()
                 if unit.result is not None and unit.mode == s.mode and agent_recorded(unit.direct)]
        bus = self.connect_bus(now=True) if units else None
        listed = self.list_units(bus, units) if bus is not None else None
        for name, _desc, load, active, sub, *_rest in listed or ():
            if load == "loaded" and (active == "failed" or sub == "exited"):
                self.release(name.removesuffix(".service"), active)

    def end_properties(self, path: str) -> dict | None:
        """systemd.END_PROPERTIES of the unit at `path` (one GetAll call), None if it did not answer."""
        s = self.state
        if s.bus is None:
            return None
        try:
            [found] = s.bus.call("GetAll", "s", ("org.freedesktop.systemd1.Service",), path=path,
                                 interface="org.freedesktop.DBus.Properties")
        except (DBusError, ValueError) as exc:
            print(f"agent: cannot read the properties of {path} ({exc}); asked again later", file=sys.stderr)
            return None
        except OSError as exc:
            self.bus_lost(exc)
            return None
        return {k: found[k][1] for k in END_PROPERTIES if k in found}

    def watch_end(self, unit: str) -> None:
        """Read the unit's PropertiesChanged from now on (it records no result of its own)."""
        s = self.state
        if s.bus is not None and unit not in s.ends:
            path = unit_path(f"{unit}.service")
            s.bus.watch.add(path)
            s.ends_by_path[path] = unit
            s.ends[unit] = None

    def forget_end(self, unit: str) -> None:
        s = self.state
        if s.ends.pop(unit, 0) != 0:
            path = unit_path(f"{unit}.service")
            s.ends_by_path.pop(path, None)
            if s.bus is not None:
                s.bus.watch.discard(path)

    def release(self, unit: str, active: str) -> None:
        """Let systemd forget a unit over whose result is recorded: it was kept loaded for it. Sent
        again (send_releases) until answered if not connected, refused, or lost with the connection."""
        if active == "inactive":  # gone already
            return
        self.to_release[unit] = active
        self.unsent.add(unit)
        self.send_releases()

    def send_releases(self) -> None:
        """Send the releases still to be sent, if connected (called on connecting, and by poll_watched)."""
        s = self.state
        if s.bus is None:
            return
        for unit in self.unsent:
            if self.to_release[unit] == "failed":
                serial = s.bus.send("ResetFailedUnit", "s", (f"{unit}.service",))
            else:
                serial = s.bus.send("StopUnit", "ss", (f"{unit}.service", "replace"))
            s.calls[serial] = ("release", unit)
        self.unsent.clear()

    def retry_releases(self) -> None:
        """Send the releases still to be sent, reconnecting if need be (at most once a second)."""
        if self.unsent:
            self.connect_bus()  # connected again: it sends them
            self.send_releases()

    def release_failed(self, unit: str, error: str | None) -> None:
        """A release call's error reply: a unit systemd no longer has is let go; else sent again."""
        if unit in self.to_release:
            if error == "org.freedesktop.systemd1.NoSuchUnit":
                del self.to_release[unit]
                self.unsent.discard(unit)
            else:
                self.unsent.add(unit)

    def released(self, unit: str) -> None:
        """systemd answered the unit's release: it is reset or being stopped, and then collected
        (CollectMode=inactive), a stop job surviving a re-exec."""
        if self.to_release.pop(unit, None) is not None:
            self.unsent.discard(unit)


def agent_recorded(direct: dict | None) -> bool:
    """Whether a unit's `direct` (its launched record's) says the agent records its end."""
    return direct is not None and direct.get("record") == "agent"


def answer_tasks(go: int, error: str | None) -> None:
    """Tell a tasks' supervisor that it is inside its unit (error None), or why it is not."""
    try:
        os.write(go, b"ok" if error is None else b"no " + error.encode("utf-8", "replace")[:400])
    except OSError:
        pass
    os.close(go)

"""The Host seam (host.py) over an agent's channel (channel.py): `AgentOps` turns each operation
into the agent's request and its reply into host.py values, so every transport (LocalHost, SshHost,
the gateway's hosts) shares it; a transport provides connect() and close(). `EventGate` holds a
connecting channel's events until its hello is answered.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from xce_lite.errors import ExecError, HostUnreachable, LaunchRejected
from xce_lite.exec.channel import AgentChannel, result_from_json
from xce_lite.exec.host import (
    EventSink,
    FileChunk,
    HostEvent,
    HostProbe,
    JobUser,
    LaunchReply,
    LaunchRequest,
    Task,
    UnitInfo,
    UnitsLaunched,
)

SIGNAL_NAMES = ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "STOP", "CONT")


class EventGate:
    """Holds one connecting channel's events until open() passes them, and every later one, to the
    queue in order; after drop() they go nowhere (the attempt failed and connect raised). For
    transports whose connect greets the agent before the caller may hear from it."""

    def __init__(self, events: EventSink) -> None:
        self._events, self._state = events, "holding"
        self._held: list[HostEvent] = []
        self._lock = threading.Lock()

    def put(self, event: HostEvent) -> None:
        with self._lock:
            if self._state == "open":
                self._events.put(event)
            elif self._state == "holding":
                self._held.append(event)

    def open(self) -> None:
        with self._lock:
            for event in self._held:
                self._events.put(event)
            self._held, self._state = [], "open"

    def drop(self) -> None:
        with self._lock:
            self._held, self._state = [], "dropped"


def _reply(x: dict) -> LaunchReply:
    return LaunchReply(unit=x["unit"], status=x["status"], start_time=x.get("start_time"), error=x.get("error"))


def request_to_json(r: LaunchRequest) -> dict:
    hooks = {}
    if r.hooks:  # sent only with hooks: a launch without them stays as small as before
        hooks = {"hooks": [{"point": h.point, "layer": h.layer, "argv": list(h.argv), "timeout": h.timeout,
                            **({"as": "root"} if h.as_root else {})} for h in r.hooks],
                 "profile_env": dict(r.profile_env), "post_failure": r.post_failure}
    return {
        "unit": r.unit,
        "argv": list(r.argv),
        "env": dict(r.env),
        "cwd": r.cwd,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "run_limit": r.run_limit,
        "mem_limit": r.mem_limit,
        "grace": r.grace,
        "role": r.role,
        "hostfile": r.hostfile,
        **hooks,
        **({"starter": list(r.starter)} if r.starter else {}),
        **({"umask": r.umask} if r.umask is not None else {}),
        **({"user": user_to_json(r.user)} if r.user is not None else {}),
        **({"after": r.after} if r.after is not None else {}),
    }


def user_to_json(user: JobUser) -> dict:
    return {"name": user.name, "uid": user.uid, "gid": user.gid,
            "groups": None if user.groups is None else list(user.groups)}


class AgentOps:
    """The Host operations over `self._channel` (an AgentChannel). Transports subclass this and
    provide connect() and close(); a host whose channel is not open raises HostUnreachable."""

    name: str
    _channel: AgentChannel | None = None

    def close(self) -> None:
        raise NotImplementedError("the transport provides close()")

    def corked(self) -> AbstractContextManager[None]:
        """The channel's corked() (channel.py); nothing to hold while none is open."""
        channel = self._channel
        return channel.corked() if channel is not None else contextlib.nullcontext()

    def _chan(self) -> AgentChannel:
        if self._channel is None:
            raise HostUnreachable(f"host {self.name} is not connected; call connect() first")
        return self._channel

    def _greet(self, rfile, wfile, events, timeout: float, heartbeat: float | None) -> HostProbe:
        """Open the channel on a transport's files and greet the agent; its events reach `events`
        only once the hello is answered (a failed attempt's never do: self.close() and raise)."""
        gate = EventGate(events)
        self._channel = AgentChannel(rfile, wfile, gate.put, self.name, timeout, heartbeat=heartbeat)
        try:
            hello = self.probe()
        except BaseException:
            gate.drop()
            self.close()
            raise
        gate.open()
        return hello

    def probe(self) -> HostProbe:
        r = self._chan().request("hello")
        extra = {k: v for k, v in r.items() if k not in ("id", "ok", "hostname", "cpus", "mem", "version")}
        return HostProbe(
            hostname=r["hostname"], cpus=r["cpus"], mem=r["mem"], agent_version=r["version"], extra=extra
        )

    def launch(self, requests: list[LaunchRequest], timeout: float | None = None) -> list[LaunchReply]:
        """Start or adopt each unit in ONE round trip; one reply per request, in order."""
        if not requests:
            return []
        r = self._chan().request("launch", timeout, units=[request_to_json(q) for q in requests])
        return [_reply(x) for x in r["replies"]]

    def launch_nowait(self, requests: list[LaunchRequest]) -> None:
        """Like launch, without waiting: the replies come as one UnitsLaunched event, in order
        with the host's other events (a unit's finished event never comes before its reply)."""
        if not requests:
            return
        units = [q.unit for q in requests]

        def deliver(reply: dict | None, error: Exception | None) -> None:
            if isinstance(error, HostUnreachable):
                return  # the channel is lost: HostLost follows, and a reconnect lists the units
            if error is None and reply is not None and not reply.get("ok"):
                error = LaunchRejected(f"host {self.name} refused 'launch': {reply.get('error')}")
            if error is not None:
                self._chan()._emit(UnitsLaunched(self.name, (), tuple(units), str(error)))
                return
            assert reply is not None  # a request ends with a reply or an error
            self._chan()._emit(UnitsLaunched(self.name, tuple(_reply(x) for x in reply["replies"])))

        self._chan().request_nowait("launch", deliver, units=[request_to_json(q) for q in requests])

    def signal(self, unit: str, name: str, reason: str) -> bool:
        if name not in SIGNAL_NAMES:
            raise ValueError(f"signal {name!r} is not one of {', '.join(SIGNAL_NAMES)}")
        return bool(self._chan().request("signal", unit=unit, signal=name, reason=reason)["found"])

    def withdraw_nowait(self, unit: str) -> None:
        """Ask the agent to drop a queued successor unstarted and go on: its answer comes as a
        UnitUnqueued event (status "withdrawn", or "started" if it started first); a lost channel
        loses nothing (the unit is then listed queued, or not at all, and reconciled)."""
        self._chan().request_nowait("withdraw", lambda _reply, _error: None, unit=unit)

    def list_units(self) -> list[UnitInfo]:
        listed = self._chan().request("list")
        return [
            UnitInfo(
                unit=u["unit"],
                status=u["status"],
                start_time=u.get("start_time"),
                result=result_from_json(u["result"]) if u.get("result") else None,
            )
            for u in listed["units"]
        ] + [UnitInfo(unit=q["unit"], status="queued") for q in listed.get("queued", ())]

    def forget(self, units: list[str], wait: bool = True) -> None:
        """Drop finished units; ExecError names any that are still running (the rest are dropped).

        With wait=False the request is only sent: no round trip, and no error is reported.
        """
        if not units:
            return
        if not wait:
            self._chan().send("forget", units=list(units))
            return
        refused = [u for u in self._chan().request("forget", units=list(units))["units"] if not u["ok"]]
        if refused:
            raise ExecError(
                f"host {self.name} kept {len(refused)} unit(s): " + "; ".join(u["error"] for u in refused)
            )

    def ping(self, timeout: float | None = None) -> float:
        """The host's clock: one cheap round trip (heartbeats)."""
        return float(self._chan().request("ping", timeout)["time"])

    def grant_lease(self, until: float, seconds: float, boot: str,
                    callback: Callable[[dict | None, Exception | None], Any] | None = None) -> dict | None:
        """Extend the host's lease to `until` on its lease clock (a reading it sent, + the lease:
        controller/leases.py); `boot` is the host's boot id. With a callback, send and go on;
        without, wait: the reply's `clock` is the host's lease clock now, `until` its lease."""
        fields: dict[str, Any] = {"until": until, "seconds": seconds, "boot": boot}
        if callback is not None:
            self._chan().request_nowait("lease", callback, **fields)
            return None
        return self._chan().request("lease", **fields)

    def read(self, path: str, offset: int = 0, max: int = 1 << 20) -> FileChunk:
        """Up to `max` bytes (at most 1 MiB) of the host's file from `offset`; LaunchRejected names a
        file that is missing or unreadable."""
        r = self._chan().request("read", path=path, offset=offset, max=max)
        return FileChunk(data=base64.b64decode(r["data_b64"]), offset=r["offset"], size=r["size"], eof=r["eof"])

    def tasks(self, unit: str, launch_id: str, tasks: list[Task]) -> None:
        """Start tasks of `xce launch` inside the running unit; LaunchRejected if it does not run."""
        items = [{"index": t.index, "argv": list(t.argv), "env": dict(t.env), "cwd": t.cwd} for t in tasks]
        self._chan().request("tasks", unit=unit, launch_id=launch_id, tasks=items)

    def launch_done(self, launch_id: str, exit_code: int) -> bool:
        """Answer the job's waiting `xce launch`; True if it heard it now (else it is kept for it)."""
        return bool(self._chan().request("launch_done", launch_id=launch_id, exit_code=exit_code)["delivered"])

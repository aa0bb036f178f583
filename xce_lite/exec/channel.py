"""The controller's side of the host agent's protocol: JSON lines over a pair of binary file objects.

Transport-agnostic: `AgentChannel` needs only a readable and a writable binary file object, the
agent's stdout and stdin; a subprocess's pipes (LocalHost) or an SSH channel's files provide them.
`AgentOps` maps the Host seam (host.py) onto the agent's ops, so every transport shares it.

Invariants:
- Each request gets its own id and its own deadline; a reply is matched to its request by id, so
  any number of threads may send requests at once. Writes are serialised by a lock.
- Once the agent's output ends or turns to garbage, the channel is lost for good: every pending and
  later request fails with HostUnreachable, and `on_event(HostLost(...))` is called exactly once
  (not after a deliberate `close()`). Reconnect by making a new channel.
- Agent events are handed to `on_event` as host.py values (UnitFinished, LaunchRequested,
  TaskFinished), on the reader thread.
- With `heartbeat=N`, a thread sends a `ping` every N s and loses the channel (HostLost, once) when
  no reply comes within `heartbeat_timeout`: a read on a silent SSH connection can block for ever,
  and paramiko's keepalive never declares a peer dead. Any reply counts, an error too (an agent that
  does not know `ping` answers "unknown op", which proves it reads and writes just as well).

The protocol (agent version 3) is documented in docs/agent-protocol.md; exec/agent/ is the other end of it.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from typing import IO, Any

from xce_lite.errors import ExecError, HostUnreachable, LaunchRejected
from xce_lite.exec.host import (
    EventSink,
    FileChunk,
    HostEvent,
    HostLost,
    HostProbe,
    JobResult,
    JobUser,
    LaunchReply,
    LaunchRequest,
    LaunchRequested,
    Task,
    TaskFinished,
    UnitFinished,
    UnitInfo,
    UnitsLaunched,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0  # seconds a request may wait for its reply
SIGNAL_NAMES = ("TERM", "KILL", "INT", "HUP", "USR1", "USR2", "STOP", "CONT")


class _Pending:
    """One request waiting for its reply (or for the channel's loss).

    With a callback, nobody waits: the reader thread calls it with the reply, or with the error.
    """

    def __init__(self, callback: Callable[[dict | None, Exception | None], Any] | None = None) -> None:
        self.done = threading.Event()
        self.reply: dict | None = None
        self.error: Exception | None = None
        self.callback = callback

    def finish(self) -> None:
        self.done.set()
        if self.callback is not None:
            try:
                self.callback(self.reply, self.error)
            except Exception:  # a faulty consumer must not stop the reader
                log.exception("reply callback failed")


class AgentChannel:
    """Requests and events over the agent's JSON lines. See the module docstring for the contract."""

    def __init__(
        self,
        rfile: IO[bytes],
        wfile: IO[bytes],
        on_event: Callable[[HostEvent], Any],
        name: str,
        timeout: float = DEFAULT_TIMEOUT,
        heartbeat: float | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.name, self.timeout = name, timeout
        self._rfile, self._wfile, self._on_event = rfile, wfile, on_event
        self._lock = threading.Lock()  # guards _pending, _next_id, _lost, _closing
        self._write_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._lost: str | None = None
        self._closing = False
        self._stopped = threading.Event()  # set on close() and on loss: ends the heartbeat
        self._reader = threading.Thread(target=self._read_loop, name=f"agent-{name}", daemon=True)
        self._reader.start()
        if heartbeat:
            threading.Thread(
                target=self._heartbeat_loop,
                args=(heartbeat, timeout if heartbeat_timeout is None else heartbeat_timeout),
                name=f"heartbeat-{name}",
                daemon=True,
            ).start()

    @property
    def lost(self) -> str | None:
        """Why the channel was lost, or None while it works."""
        return self._lost

    def request(self, op: str, timeout: float | None = None, **fields: Any) -> dict:
        """Send one request and wait for its reply; the reply's fields (with "ok": true).

        Raises HostUnreachable if the channel is lost or the reply does not come within `timeout`
        (default: the channel's), and LaunchRejected if the agent answered "ok": false.
        """
        timeout = self.timeout if timeout is None else timeout
        pending = _Pending()
        rid = self._write(op, fields, pending)
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(rid, None)
            raise HostUnreachable(
                f"host {self.name}: the agent did not answer {op!r} within {timeout:g} s; the host may "
                "be overloaded or hung: check it, then reconnect"
            )
        if pending.error is not None:
            raise pending.error
        reply = pending.reply or {}
        if not reply.get("ok"):
            raise LaunchRejected(f"host {self.name} refused {op!r}: {reply.get('error')}")
        return reply

    def request_nowait(self, op: str, callback: Callable[[dict | None, Exception | None], Any],
                       **fields: Any) -> None:
        """Send one request and go on; the reader thread calls `callback(reply, error)` later."""
        self._write(op, fields, _Pending(callback))

    def send(self, op: str, **fields: Any) -> None:
        """Send one request without waiting: its reply, when it comes, is dropped.

        For requests whose outcome the caller can learn again later (`forget`: a unit not dropped
        now is listed and forgotten after the next reconnect), so they cost no round trip.
        """
        self._write(op, fields, None)

    def _write(self, op: str, fields: dict, pending: _Pending | None) -> int:
        with self._lock:
            if self._lost is not None:
                raise HostUnreachable(f"host {self.name}: {self._lost}; reconnect to the host")
            self._next_id += 1
            rid = self._next_id
            if pending is not None:
                self._pending[rid] = pending
        line = json.dumps({"id": rid, "op": op, **fields}, ensure_ascii=True).encode("ascii") + b"\n"
        try:
            with self._write_lock:
                self._wfile.write(line)
                self._wfile.flush()
        except (OSError, ValueError) as exc:
            self._fail(f"cannot write to the agent ({exc})")
        return rid

    def close(self, timeout: float = 10.0) -> None:
        """Close our end (the agent sees EOF and exits) and wait up to `timeout` for its output to end.

        Does not report HostLost: the loss was asked for. The caller owns the transport and must
        end it (kill the process, close the SSH channel) if the reader is still running after this.
        """
        with self._lock:
            self._closing = True
        self._stopped.set()
        try:
            self._wfile.close()
        except OSError:
            pass
        self._reader.join(timeout)
        if not self._reader.is_alive():
            self._rfile.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the reader thread to end; True if it has."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def _heartbeat_loop(self, interval: float, timeout: float) -> None:
        while not self._stopped.wait(interval):
            answered = threading.Event()

            def pong(_reply: dict | None, _error: Exception | None, answered: threading.Event = answered) -> None:
                answered.set()

            try:
                self.request_nowait("ping", pong)
            except HostUnreachable:
                return  # lost already
            if not answered.wait(timeout) and not self._stopped.is_set():
                self._fail(
                    f"no reply to a heartbeat within {timeout:g} s: the host, the network or the agent "
                    "hangs"
                )
                return

    # -- the reader thread

    def _read_loop(self) -> None:
        try:
            for line in iter(self._rfile.readline, b""):
                if not self._handle_line(line):
                    return
        except (OSError, ValueError) as exc:
            self._fail(f"reading from the agent failed ({exc})")
            return
        self._fail("the agent's output ended (it exited or was killed)")

    def _handle_line(self, line: bytes) -> bool:
        """Deliver one line; False if it was garbage (the channel is then lost)."""
        try:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                raise TypeError("not an object")
            if msg.get("id") is not None:
                with self._lock:
                    pending = self._pending.pop(msg["id"], None)
                if pending is not None:  # None: its requester gave up (timed out), or sent and went on
                    pending.reply = msg
                    pending.finish()
                return True
            event = msg.get("event")
            if event == "fatal":
                self._fail(f"the agent stopped: {msg.get('error')}")
                return False
            if event == "finished":
                self._emit(
                    UnitFinished(host=self.name, unit=msg["unit"], result=result_from_json(msg["result"]))
                )
            elif event == "launch_requested":
                self._emit(LaunchRequested(self.name, msg["launch_id"], msg["unit"], tuple(msg["argv"]),
                                           dict(msg["env"]), msg["cwd"]))
            elif event == "task_finished":
                self._emit(TaskFinished(self.name, msg["unit"], msg["launch_id"], msg["index"], msg["exit_code"],
                                        msg["signal"], msg.get("error")))
            else:
                log.warning("host %s: agent event %r: %s", self.name, event, msg.get("error"))
            return True
        except (ValueError, KeyError, TypeError) as exc:
            self._fail(f"the agent sent garbage ({exc}): {line[:200]!r}")
            return False

    def _emit(self, event: HostEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # a faulty consumer must not stop the reader
            log.exception("host %s: event handler failed on %r", self.name, event)

    def _fail(self, why: str) -> None:
        """Lose the channel (once): fail every pending request and report HostLost."""
        with self._lock:
            if self._lost is not None:
                return
            self._lost = why
            pending, self._pending = list(self._pending.values()), {}
            report = not self._closing
        self._stopped.set()
        for p in pending:
            p.error = HostUnreachable(f"host {self.name}: {why}; reconnect to the host")
            p.finish()
        if report:
            self._emit(HostLost(host=self.name, why=why))


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



# ---------------------------------------------------------------- the Host seam over a channel


def result_from_json(d: dict) -> JobResult:
    return JobResult(
        exit_code=d["exit_code"],
        signal=d["signal"],
        start_time=d["start_time"],
        end_time=d["end_time"],
        cpu_time=d["cpu_time"],
        max_rss=d["max_rss"],
        reason=d.get("reason"),
        service_result=d.get("service_result"),
        mode=d.get("mode"),
        note=d.get("note"),
        hooks=tuple(d.get("hooks") or ()),
    )


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

    def list_units(self) -> list[UnitInfo]:
        return [
            UnitInfo(
                unit=u["unit"],
                status=u["status"],
                start_time=u.get("start_time"),
                result=result_from_json(u["result"]) if u.get("result") else None,
            )
            for u in self._chan().request("list")["units"]
        ]

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

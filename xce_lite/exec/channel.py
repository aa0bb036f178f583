"""The controller's side of the host agent's protocol: JSON lines over a pair of binary file objects.

Transport-agnostic: `AgentChannel` needs only a readable and a writable binary file object, the
agent's stdout and stdin; a subprocess's pipes (LocalHost) or an SSH channel's files provide them.
`AgentOps` (agentops.py) maps the Host seam (host.py) onto the agent's ops, so every transport
shares it.

Invariants:
- Each request gets its own id and its own deadline; a reply is matched to its request by id, so
  any number of threads may send requests at once. Writes are serialised by a lock.
- `corked()`: the lines of requests nobody waits for (`send`, `request_nowait`) are held until the
  block ends, then written with one write and one flush: a tick's launch and forget lines wake the
  agent once. A request that waits for its reply (`request`) writes the held lines and its own at
  once, whatever thread sends it, so that nothing ever waits for a reply to a line still held.
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

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from xce_lite.errors import HostUnreachable, LaunchRejected
from xce_lite.exec.host import (
    HostEvent,
    HostLost,
    JobResult,
    LaunchRequested,
    TaskFinished,
    UnitFinished,
    UnitUnqueued,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0  # seconds a request may wait for its reply


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
        self._held: list[bytes] | None = None  # lines held while corked (under _write_lock)
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
        rid = self._write(op, fields, pending, now=True)
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

    @contextlib.contextmanager
    def corked(self) -> Iterator[None]:
        """Hold the lines nobody waits for until the block ends, then write them at once (see the
        module docstring). Nested blocks are one: the outermost writes."""
        with self._write_lock:
            outer = self._held is None
            if outer:
                self._held = []
        try:
            yield
        finally:
            if outer:
                self._flush_held()

    def _flush_held(self) -> None:
        try:
            with self._write_lock:
                lines, self._held = self._held, None
                if lines:
                    self._wfile.write(b"".join(lines))
                    self._wfile.flush()
        except (OSError, ValueError) as exc:
            self._fail(f"cannot write to the agent ({exc})")

    def _write(self, op: str, fields: dict, pending: _Pending | None, now: bool = False) -> int:
        """Send one line; `now`: its sender waits for the reply, so it (and any held line) goes at once."""
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
                held = self._held
                if held is not None and not now:
                    held.append(line)
                    return rid
                if held:
                    held.append(line)
                    line = b"".join(held)
                    held.clear()
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

            try:  # never held by a cork (`now`): a block stalled on another host must not starve this one's ping
                self._write("ping", {}, _Pending(pong), now=True)
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
            elif event == "unqueued":
                self._emit(UnitUnqueued(self.name, msg["unit"], msg["status"], msg.get("start_time"), msg.get("error")))
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

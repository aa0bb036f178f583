"""The SSH gateway: the controller's SSH connections, in a process of their own.

paramiko and its crypto cost ~26 MB of memory to load, and a CPU to encrypt: the controller keeps
neither. It starts ONE gateway process (`python -m xce_lite.exec.sshgate`, its child) and, for each
ssh host it connects, hands the gateway one end of a fresh socket pair with the target; the gateway
opens the route, starts the agent (ssh.open_agent: host keys, the ssh config, the copy by content
hash, every wait bounded), answers on the control socket, and from then on only moves bytes between
that socket and the agent's channel. The controller's end is an ordinary AgentChannel: heartbeats,
requests and events go through the gateway untouched.

Control protocol: a SOCK_SEQPACKET socket pair (message boundaries kept). Each request is one JSON
message with the host's socket attached (SCM_RIGHTS): {"id", "op": "connect", "name", "target",
"spool", "mode", "accept_new", "log_path"}; each reply one JSON message: {"id", "ok": true,
"deployed"} or {"id", "ok": false, "kind", "message", ...}: the error as errors.py names it.
Op "run" ({"target", "command", "stdin", "timeout"}: one command, sshrun.py) streams the command's
stdout into the attached socket, closes it, then replies {"id", "ok": true, "status", "stderr"}.
Op "stream" ({"target", "name", "command", "log_path"}) is "connect" with a command of the caller's
(a Slurm pool's relay through its login host, slurmhost.py) in place of the agent's start.

Invariants:
- A host's connection lives as long as both ends do: EOF from the controller's end closes the
  channel and the route (the agent sees EOF and exits; running jobs go on); the channel's end
  (the agent exited, the connection dropped) closes the socket, which the controller sees as the
  agent's output ending: HostLost, and its link reconnects.
- The gateway lives as long as the control socket: when the controller exits (even kill -9), the
  gateway closes every connection and exits. If the gateway dies, every host's socket closes: each
  host is lost and reconnected through a new gateway, started on demand.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xce_lite import errors
from xce_lite.exec.agentops import AgentOps
from xce_lite.exec.channel import DEFAULT_TIMEOUT, AgentChannel
from xce_lite.exec.host import EventSink, HostProbe
from xce_lite.exec.sshtarget import SshTarget

if TYPE_CHECKING:
    from xce_lite.exec.ssh import AgentStream  # paramiko: imported by the gateway only

MAX_MESSAGE = 1 << 16
CONNECT_WAIT = 300.0  # the gateway bounds every step itself; this only catches a hung gateway


# ---------------------------------------------------------------- the controller's side


class Gateway:
    """The gateway process and its control socket, started on first use (and again if it died)."""

    _lock = threading.Lock()
    _current: Gateway | None = None

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "xce_lite.exec.sshgate", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self.sock = ours
        self._send_lock = threading.Lock()
        self._replies: dict[int, queue.Queue] = {}
        self._next_id = 0
        self._dead: str | None = None
        threading.Thread(target=self._read, name="sshgate-replies", daemon=True).start()

    @classmethod
    def get(cls) -> Gateway:
        with cls._lock:
            if cls._current is None or cls._current._dead is not None:
                cls._current = cls()
            return cls._current

    def connect(self, request: dict, fd: int) -> dict:
        """Send one connect request with `fd`; its reply (raises HostUnreachable if the gateway died)."""
        rid, waiter = self.send(request, fd)
        return self.reply(rid, waiter, CONNECT_WAIT)

    def send(self, request: dict, fd: int) -> tuple[int, queue.Queue]:
        """Send one request with `fd`; what `reply` waits on."""
        with self._send_lock:
            if self._dead is not None:
                raise errors.HostUnreachable(f"the SSH gateway is gone ({self._dead}); retrying")
            self._next_id += 1
            rid = self._next_id
            waiter: queue.Queue = queue.Queue(1)
            self._replies[rid] = waiter
            socket.send_fds(self.sock, [json.dumps({"id": rid, **request}).encode()], [fd])
        return rid, waiter

    def reply(self, rid: int, waiter: queue.Queue, wait: float) -> dict:
        """The reply to request `rid`, within `wait` seconds (HostUnreachable if none comes)."""
        try:
            reply = waiter.get(timeout=wait)
        except queue.Empty:
            raise errors.HostUnreachable(f"the SSH gateway did not answer within {wait:g} s") from None
        finally:
            self._replies.pop(rid, None)
        if reply is None:
            raise errors.HostUnreachable(f"the SSH gateway stopped ({self._dead}); retrying")
        return reply

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(MAX_MESSAGE)
                if not data:
                    break
                reply = json.loads(data)
                waiter = self._replies.get(reply.get("id"))
                if waiter is not None:
                    waiter.put(reply)
        except (OSError, ValueError) as exc:
            self._dead = f"its control socket failed: {exc}"
        self._dead = self._dead or f"it exited ({self.proc.poll()})"
        for waiter in list(self._replies.values()):
            waiter.put(None)
        self.proc.wait()


def open_channel(request: dict) -> tuple[dict, socket.socket]:
    """Ask the gateway for a channel (`request`: a connect or stream op) over one end of a socket
    pair; (its reply, our end). A refusal raises its error, with nothing left open."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        reply = Gateway.get().connect(request, theirs.fileno())
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    if not reply.get("ok"):
        ours.close()
        raise _error(reply)
    return reply, ours


def _error(reply: dict) -> errors.XceError:
    """The gateway's refusal as the error kind it was."""
    kind = getattr(errors, reply.get("kind") or "", None)
    message = reply.get("message") or "the SSH gateway failed"
    if isinstance(kind, type) and issubclass(kind, errors.HostKeyError):
        return kind(message, reply.get("fingerprint"), reply.get("path"), reply.get("line"))
    if isinstance(kind, type) and issubclass(kind, errors.XceError):
        return kind(message)
    return errors.HostUnreachable(message)


class GatewayHost(AgentOps):
    """An ssh host as a Host, its connection held by the SSH gateway (see the module docstring).
    The same contract and arguments as ssh.SshHost."""

    def __init__(self, name: str, target: SshTarget, spool: str, mode: str = "auto",
                 timeout: float = DEFAULT_TIMEOUT, heartbeat: float | None = None, accept_new: bool = False,
                 log_path: str | os.PathLike | None = None, records: str = "unit") -> None:
        self.name, self.target, self.spool, self.mode, self.records = name, target, spool, mode, records
        self.timeout, self.heartbeat, self.accept_new = timeout, heartbeat, accept_new
        self.log_path = str(log_path) if log_path is not None else None
        self.deployed = False
        self.agent_pid: int | None = None
        self._sock: socket.socket | None = None
        self._channel: AgentChannel | None = None

    def connect(self, events: EventSink) -> HostProbe:
        self.close()
        reply, ours = open_channel({"op": "connect", "name": self.name, "target": self.target.to_json(),
                                    "spool": self.spool, "mode": self.mode, "records": self.records,
                                    "accept_new": self.accept_new,
                                    "log_path": self.log_path})
        self.deployed, self._sock = bool(reply.get("deployed")), ours
        hello = self._greet(ours.makefile("rb"), ours.makefile("wb"), events, self.timeout, self.heartbeat)
        self.agent_pid = hello.extra.get("pid")
        return hello

    def close(self) -> None:
        """EOF to the gateway (which sends it on: the agent exits, its jobs go on), then wait a
        little for the agent's output to end. Closing the channel's file objects alone would not
        do: the socket stays open while this object holds it."""
        channel, sock, self._channel, self._sock = self._channel, self._sock, None, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if channel is not None:
            channel.close(0.0 if channel.lost else 10.0)
        if sock is not None:
            sock.close()


def run_command(target: SshTarget, command: str, stdin: str | None, timeout: float) -> tuple[int, str, str]:
    """Run `command` on `target` through the gateway (sshrun.py): (exit status, stdout, stderr).
    Its stdout comes over a socket of its own, so its size has no limit. HostUnreachable (or
    HostKeyError, ConfigError) when the host cannot be reached or the command did not end in time."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    gateway = Gateway.get()
    try:
        rid, waiter = gateway.send({"op": "run", "target": target.to_json(), "command": command, "stdin": stdin,
                                    "timeout": timeout}, theirs.fileno())
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    # the gateway bounds connecting (4 steps of connect_timeout) and the command (timeout) itself
    wait = timeout + 5 * target.connect_timeout + 5
    chunks = []
    try:
        ours.settimeout(wait)
        while data := ours.recv(MAX_MESSAGE):
            chunks.append(data)
    except OSError as exc:
        raise errors.HostUnreachable(f"the SSH gateway's output for {target.name} failed: {exc}") from None
    finally:
        ours.close()
    reply = gateway.reply(rid, waiter, wait)
    if not reply.get("ok"):
        raise _error(reply)
    return int(reply["status"]), b"".join(chunks).decode("utf-8", "replace"), reply.get("stderr") or ""


# ---------------------------------------------------------------- the gateway process


def _pump(name: str, sock: socket.socket, stream) -> None:
    """Move bytes both ways until either end closes; then close both (see the module docstring)."""
    chan = stream.chan
    done = threading.Event()

    def agent_to_controller() -> None:
        try:
            while True:
                data = chan.recv(MAX_MESSAGE)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=agent_to_controller, name=f"gate-out-{name}", daemon=True).start()
    try:
        while not done.is_set():
            data = sock.recv(MAX_MESSAGE)
            if not data:
                break
            chan.sendall(data)
    except OSError:
        pass
    finally:
        try:
            chan.shutdown_write()  # the agent sees EOF and exits; its jobs go on
        except OSError:
            pass
        stream.close()
        sock.close()


def _failed(reply: dict[str, Any], exc: Exception) -> None:
    if isinstance(exc, errors.XceError):
        reply.update(ok=False, kind=type(exc).__name__, message=str(exc),
                     fingerprint=getattr(exc, "fingerprint", None), path=getattr(exc, "path", None),
                     line=getattr(exc, "line", None))
    else:  # a bug or an unexpected library error: say so; the caller retries
        reply.update(ok=False, kind="HostUnreachable", message=f"failed unexpectedly: {exc!r}")


def _serve_run(control: socket.socket, send_lock: threading.Lock, request: dict, sock: socket.socket) -> None:
    """Op "run": one command, its stdout streamed into `sock`, closed before the reply is sent."""
    from xce_lite.exec.sshrun import run_command as run  # paramiko: here, in the gateway

    reply: dict[str, Any] = {"id": request.get("id")}
    try:
        status, stderr = run(SshTarget.from_json(request["target"]), request["command"], request.get("stdin"),
                             float(request["timeout"]), sock)
    except Exception as exc:
        _failed(reply, exc)
    else:
        reply.update(ok=True, status=status, stderr=stderr)
    finally:
        sock.close()
    with send_lock:
        control.send(json.dumps(reply).encode())


def _serve_one(control: socket.socket, send_lock: threading.Lock, request: dict, sock: socket.socket) -> None:
    if request.get("op") == "run":
        _serve_run(control, send_lock, request, sock)
        return
    from xce_lite.exec.ssh import open_agent, open_command  # paramiko: here, in the gateway

    reply: dict[str, Any] = {"id": request.get("id")}
    try:
        log_path = Path(request["log_path"]) if request.get("log_path") else None
        if request.get("op") == "stream":  # a relay (srun through a login host): its stdio is the channel
            stream: AgentStream | None = open_command(SshTarget.from_json(request["target"]), request["name"],
                                                      request["command"], log_path)
        else:
            stream = open_agent(SshTarget.from_json(request["target"]), request["name"], request["spool"],
                                request["mode"], bool(request.get("accept_new")), log_path,
                                request.get("records", "unit"))
    except errors.XceError as exc:
        reply.update(ok=False, kind=type(exc).__name__, message=str(exc),
                     fingerprint=getattr(exc, "fingerprint", None), path=getattr(exc, "path", None),
                     line=getattr(exc, "line", None))
        stream = None
    except Exception as exc:  # a bug or an unexpected library error: say so; the link retries
        reply.update(ok=False, kind="HostUnreachable", message=f"connecting failed unexpectedly: {exc!r}")
        stream = None
    else:
        assert stream is not None  # open_agent() returned it
        reply.update(ok=True, deployed=stream.deployed)
    with send_lock:
        control.send(json.dumps(reply).encode())
    if stream is None:
        sock.close()
        return
    _pump(request["name"], sock, stream)


def main(argv: list[str]) -> int:
    """Serve connect requests on the control socket (fd argv[0]) until it closes."""
    control = socket.socket(fileno=int(argv[0]))
    send_lock = threading.Lock()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 1)
        except OSError:
            return 0
        if not data:
            return 0  # the controller is gone: daemon threads (and their connections) end with us
        try:
            request = json.loads(data)
        except ValueError:
            for fd in fds:
                os.close(fd)
            continue
        if not fds:
            continue
        sock = socket.socket(fileno=fds[0])
        threading.Thread(target=_serve_one, args=(control, send_lock, request, sock),
                         name=f"gate-{request.get('name')}", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

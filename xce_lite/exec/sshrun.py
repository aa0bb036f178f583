"""One command on an ssh host, in the SSH gateway process (sshgate.py, op "run"): a pool's Slurm
commands on its login host (`via:`, controller/pools.py).

`run_command(target, command, stdin, timeout, out)` opens the route (sshroute.py: host keys, the
ssh config, every step bounded), runs `command` on one channel, writes `stdin` to it, and streams
its stdout into the socket `out` as it comes (no size limit: squeue's JSON grows with the jobs);
it returns (exit status, stderr's first 8 KB).

Invariants: the whole run is bounded: connecting by connect_timeout per step, the command by
`timeout` (a watchdog closes the route, which fails every wait on it); a failure is a
HostUnreachable, HostKeyError or ConfigError saying what to check. The connection to a target is
kept open for the next command (a new one per command took 0.62 s a command here, a kept one
0.48 s: bench/slurm_via.py; most of the rest is the login shell); any failure closes it, so a
host that froze, rebooted or changed its key is met afresh by the next command. Commands to one
target may run at once, each on a channel of its own.
"""

from __future__ import annotations

import json
import socket
import threading

import paramiko

from xce_lite.errors import HostUnreachable
from xce_lite.exec.ssh import _exec
from xce_lite.exec.sshroute import Deadline, Route
from xce_lite.exec.sshtarget import SshTarget

STDERR_KEPT = 8192
CHUNK = 1 << 16


def run_command(target: SshTarget, command: str, stdin: str | None, timeout: float,
                out: socket.socket) -> tuple[int, str]:
    """See the module docstring. `out` is left open (the caller closes it)."""
    route, deadline = _route(target)
    ok = False
    try:
        chan = _exec(route, deadline, target, "starting the command", command)
        where = route.where(route.links[-1])
        errors: list[bytes] = []
        drained = threading.Thread(target=_drain_stderr, args=(chan, errors), daemon=True)
        drained.start()
        deadline.arm("running the command", timeout)
        try:
            if stdin:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            while data := chan.recv(CHUNK):
                out.sendall(data)
            status = chan.recv_exit_status()
            drained.join(timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if deadline.expired:
                raise HostUnreachable(f"{where}: the command did not end within {timeout:g} s") from exc
            raise HostUnreachable(f"{where}: the command's channel failed: {exc or type(exc).__name__}") from exc
        if deadline.expired:  # the watchdog closed the channel: what came is not all there was
            raise HostUnreachable(f"{where}: the command did not end within {timeout:g} s")
        chan.close()
        ok = True
        return status, b"".join(errors).decode("utf-8", "replace")
    finally:
        deadline.disarm()
        if not ok:
            _drop(target, route)


_routes: dict[str, Route] = {}
_lock = threading.Lock()


def _route(target: SshTarget) -> tuple[Route, Deadline]:
    """The open connection to `target` (opened now if there is none, or it died), and a watchdog
    over it for this command alone."""
    key = json.dumps(target.to_json(), sort_keys=True)
    with _lock:
        route = _routes.get(key)
    if route is not None and route.transport.is_active():
        return route, Deadline(route.close)
    route = Route(target, accept_new=False)
    deadline = Deadline(route.close)
    try:
        route.open(deadline)
    except BaseException:
        deadline.disarm()
        route.close()
        raise
    with _lock:
        old, _routes[key] = _routes.get(key), route
    if old is not None:
        old.close()
    return route, deadline


def _drop(target: SshTarget, route: Route) -> None:
    key = json.dumps(target.to_json(), sort_keys=True)
    with _lock:
        if _routes.get(key) is route:
            del _routes[key]
    route.close()


def _drain_stderr(chan: paramiko.Channel, kept: list[bytes]) -> None:
    """Read stderr to its end (a full window would stall the command), keeping its beginning."""
    size = 0
    try:
        while data := chan.recv_stderr(CHUNK):
            if size < STDERR_KEPT:
                kept.append(data[: STDERR_KEPT - size])
                size += len(kept[-1])
    except (OSError, EOFError, paramiko.SSHException):
        pass

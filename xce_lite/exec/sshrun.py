"""One command on an ssh host, in the SSH gateway process (sshgate.py, op "run"): a pool's Slurm
commands on its login host (`via:`, controller/pools.py).

`run_command(target, command, stdin, timeout, out)` opens the route (sshroute.py: host keys, the
ssh config, every step bounded), runs `command` on one channel, writes `stdin` to it, and streams
its stdout into the socket `out` as it comes (no size limit: squeue's JSON grows with the jobs);
it returns (exit status, stderr's first 8 KB).

Invariants: the whole run is bounded: connecting by connect_timeout per step, the command by
`timeout` (a watchdog closes the route, which fails every wait on it); a failure is a
HostUnreachable, HostKeyError or ConfigError saying what to check. One connection per command:
a login host that froze, rebooted or changed its key is met afresh each time, and nothing is
left open between two polls (a few hundred ms of the gateway's CPU per command: `bench` has it).
"""

from __future__ import annotations

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
    route = Route(target, accept_new=False)
    deadline = Deadline(route.close)
    try:
        route.open(deadline)
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
        return status, b"".join(errors).decode("utf-8", "replace")
    finally:
        deadline.disarm()
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

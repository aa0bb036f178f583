"""`xce launch`, the job's side: ask the host agent to run tasks of this job on its hosts (LSF's
blaunch) and wait for their exit code. Standard library only: the xce CLI imports it too."""

from __future__ import annotations

import os
import sys
import time

from .jsonl import dumps, loads
from .util import unix_address

LAUNCH_RECONNECT = 120.0  # seconds `xce launch` waits for a host agent that went away to come back


class LaunchFailed(Exception):
    """`xce launch` could not have its tasks run, or lost track of them; the message says why."""


def launch_tasks(
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    socket_path: str | None = None,
    unit: str | None = None,
    reconnect_for: float = LAUNCH_RECONNECT,
) -> int:
    """Run `argv` as tasks of this job on its hosts (LSF's blaunch), from inside the job; block
    until they have all ended, and return the exit code the controller gives (0 if all exited 0).

    Standard library only, so that the xce CLI can import it too. The agent is found through
    XCE_LAUNCH_SOCKET and the unit through XCE_UNIT (set in every job); env and cwd default to
    this process's. If the agent goes away meanwhile (its SSH connection dropped), this waits up to
    `reconnect_for` seconds for the next one and asks it again. Raises LaunchFailed.
    """
    import socket

    socket_path = socket_path or os.environ.get("XCE_LAUNCH_SOCKET")
    unit = unit or os.environ.get("XCE_UNIT")
    if not socket_path or not unit:
        raise LaunchFailed("xce launch runs only inside an xce job (XCE_LAUNCH_SOCKET and XCE_UNIT are not set)")
    if not argv:
        raise LaunchFailed("nothing to launch: give a command, as in `xce launch -- hostname`")
    request = {"op": "launch", "unit": unit, "argv": list(argv), "env": dict(os.environ if env is None else env),
               "cwd": cwd or os.getcwd()}
    launch_id, deadline = None, None
    while True:
        why = "the agent closed the connection"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address, fd = unix_address(socket_path)
            try:
                sock.connect(address)
            finally:
                if fd >= 0:
                    os.close(fd)
            sock.sendall(dumps(request))
            buf = b""
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = loads(line)
                    if "error" in msg:
                        raise LaunchFailed(f"the host agent refused: {msg['error']}")
                    if "exit_code" in msg:
                        return msg["exit_code"]
                    if "launch_id" in msg:
                        launch_id, deadline = msg["launch_id"], None
                        request = {"op": "launch_wait", "unit": unit, "launch_id": launch_id}
        except (OSError, ValueError) as exc:
            why = str(exc)
        finally:
            sock.close()
        if launch_id is None:
            raise LaunchFailed(
                f"cannot reach the host agent at {socket_path} ({why}): is the controller connected to this host?"
            )
        deadline = deadline or time.monotonic() + reconnect_for
        if time.monotonic() > deadline:
            raise LaunchFailed(
                f"the host agent went away ({why}) and no agent came back within {reconnect_for:g} s; "
                f"the tasks of launch {launch_id} may still run"
            )
        time.sleep(0.5)


def launch_main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        code = launch_tasks(argv)
    except LaunchFailed as exc:
        print(f"xce launch: {exc}", file=sys.stderr)
        return 255
    return code if 0 <= code <= 255 else 255

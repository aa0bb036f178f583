"""The API server's connections (server.py): the record of one, and the socket calls on a
non-blocking one: send a reply whole, refuse and close, drain a wake-up pipe, and wait a moment
for a connection's next bytes.

Standard library only. Nothing here holds a lock or changes a connection's state: server.py does.
"""

from __future__ import annotations

import select
import socket

from xce_lite.api.caller import Caller


class Conn:
    """One client connection. While `busy` a worker owns it; otherwise the serving thread does."""

    __slots__ = ("buffer", "busy", "caller", "fd", "last", "sock", "started")

    def __init__(self, sock: socket.socket, caller: Caller, now: float):
        self.sock = sock
        self.fd = sock.fileno()  # the key in ApiServer._conns (a closed socket forgets its fd)
        self.caller = caller
        self.buffer = bytearray()
        self.last = now  # when it last sent bytes or got a reply
        self.started: float | None = None  # when the request being received began
        self.busy = False


def send(sock: socket.socket, data: bytes, timeout: float) -> None:
    """All of `data` on the non-blocking `sock`: at once if the socket's buffer takes it (a reply
    mostly fits), else waiting at most `timeout` for it to drain (OSError if it does not)."""
    try:
        sent = sock.send(data)
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent == len(data):
        return
    sock.settimeout(timeout)
    try:
        sock.sendall(memoryview(data)[sent:])
    finally:
        sock.setblocking(False)


def send_and_close(sock: socket.socket, reply: bytes) -> None:
    """Best effort, without blocking: a small reply fits in the socket's buffer."""
    try:
        sock.send(reply)
    except OSError:
        pass
    sock.close()


def wake(sock: socket.socket) -> None:
    """One byte into the serving thread's wake-up pipe (its other end is drained by `drain`)."""
    try:
        sock.send(b"x")
    except OSError:
        pass  # already full of wake-ups, or closed at shutdown


def drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def readable(sock: socket.socket, timeout: float) -> bool:
    """Whether `sock` has bytes (or its end, or an error) to read within `timeout` seconds: one
    poll(2) of this one descriptor, without the GIL while it waits."""
    waiter = select.poll()
    waiter.register(sock.fileno(), select.POLLIN)
    return bool(waiter.poll(timeout * 1000))

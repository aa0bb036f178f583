"""Talking to the controller: JSON over HTTP/1.1 on the home's Unix socket, under /xce/v1/.

Standard library only and no http.client: this is on the path of every `xce submit`, whose whole
run must stay within a few times a bare Python start. Errors come back as XceError subclasses so the
CLI prints the controller's message and exits with the code the error kind carries.

What a lost connection means, and what is safe to repeat:
- a kept-alive connection the server closed while it was idle (it may, and does after its idle
  timeout) is noticed when a request on it gets no byte back: the request is sent again once on a
  new connection (the server never serves a request on a connection it is closing). If no new
  connection can be made, the controller died, maybe after it got the request: ReplyLost;
- 503 (the controller is busy) means the request was not served: it is sent again after a pause;
- a submission whose reply is lost after it was sent may or may not have been stored: `submit`
  sends a request id with it, and the controller answers a repeat of that id with the jobs it
  stored the first time, never a second copy. `submit` asks again once, when the controller answers.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from xce_lite import errors

API = "/xce/v1"
_ERROR_KINDS = {cls.__name__: cls for cls in (
    errors.SpecError, errors.ConfigError, errors.HomeError, errors.StoreError, errors.TransitionError,
    errors.NotFound, errors.ExecError, errors.HostUnreachable, errors.LaunchRejected, errors.ControllerDown)}
BUSY_PAUSES = (0.2, 0.5, 1.0, 2.0)  # after each 503, before asking again
RETRY_WAIT = 30.0  # how long `submit` waits for the controller to answer again after a lost reply


class ReplyLost(errors.ControllerDown):
    """The request was sent, and the connection ended before the whole reply came back: the
    controller may have acted on it. Retrying is safe for reads and for a submission with the same
    request id."""


class _Lost(Exception):
    def __init__(self, cause: BaseException, answered: bool):
        super().__init__(str(cause))
        self.cause = cause
        self.answered = answered  # some of a reply came back


def new_request_id() -> str:
    """A submission's request id: the time in ns (16 hex digits), then 64 random bits (16 more; the
    random part alone was 128 bits, what secrets.token_hex gives, without its ~4 ms import). Ids
    made later sort later: the controller keeps them a day (keep_requests) in a table keyed by the
    id, and a new one goes into the page the last went to, not into a random page of that table
    (with 200,000 kept: 0.41 instead of 2.8-2.9 read calls and 38.2 instead of 44 KB written per
    one-job submit, `python3 bench/request_ids.py --runs 2`, bench/README branch post4). Unique as
    long as two ids of one nanosecond differ in 64 random bits; the controller checks nothing about
    them but their form (submit.request_id_of)."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


class Client:
    """One connection to the controller, kept open across requests (HTTP keep-alive)."""

    def __init__(self, socket_path: Path, timeout: float = 60.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = bytearray()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = bytearray()

    def get(self, path: str, **query: Any) -> Any:
        pairs = [f"{k}={quote(str(v))}" for k, v in query.items() if v is not None and v is not False]
        return self.request("GET", path + ("?" + "&".join(pairs) if pairs else ""))

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def submit(self, body: dict, path: str = "/jobs", on_retry: Callable[[str], None] | None = None,
               wait: float = RETRY_WAIT) -> Any:
        """POST a submission with a request id (`body["request_id"]`, made here if absent); if its
        reply is lost, wait up to `wait` seconds for the controller to answer again and ask once
        more with the same id: the reply then names the jobs stored the first time, if they were.
        `on_retry(message)` is told before the second try."""
        body = dict(body)
        body.setdefault("request_id", new_request_id())
        try:
            return self.request("POST", path, body)
        except ReplyLost as lost:
            if on_retry is not None:
                on_retry(f"the controller's reply was lost ({lost.__cause__ or lost}); asking again with the "
                         f"same request id ({body['request_id']}), so the submission is stored at most once")
        deadline = time.monotonic() + wait
        while True:
            try:
                return self.request("POST", path, body)
            except ReplyLost as lost:
                raise ReplyLost(f"{lost}. The submission (request id {body['request_id']}) may have been stored; "
                                f"`xce jobs` shows it once the controller answers") from None
            except errors.ControllerDown as down:
                if time.monotonic() >= deadline:
                    raise errors.ControllerDown(
                        f"{down} The controller stopped answering after it got a submission and did not come "
                        f"back within {wait:g} s; the submission (request id {body['request_id']}) may have "
                        f"been stored: `xce jobs` shows it once the controller runs again") from None
                time.sleep(0.2)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        payload = b"" if body is None else json.dumps(body, ensure_ascii=True).encode()
        head = (f"{method} {API}{path} HTTP/1.1\r\nHost: xce\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        for pause in (*BUSY_PAUSES, None):
            status, reply = self._send(head + payload)
            if status != 503 or pause is None:
                break
            time.sleep(pause)
        if status >= 400:
            kind = _ERROR_KINDS.get(reply.get("kind", "") if isinstance(reply, dict) else "", errors.XceError)
            message = reply.get("error") if isinstance(reply, dict) else None
            raise kind(message or f"the controller answered HTTP {status}")
        return reply

    def _send(self, data: bytes) -> tuple[int, Any]:
        """Send one request and read its reply; again once on a new connection if a kept-alive one
        turns out closed before any of the reply came back."""
        reused = self._sock is not None
        try:
            return self._exchange(self._connect(), data)
        except _Lost as lost:
            self.close()
            if not reused or lost.answered:
                raise ReplyLost(self._lost_message(lost)) from lost.cause
        try:
            sock = self._connect()
        except errors.ControllerDown as down:  # it died: it may have got the request before
            raise ReplyLost(f"{down} (it stopped answering after a request was sent to it)") from None
        try:
            return self._exchange(sock, data)
        except _Lost as lost:
            self.close()
            raise ReplyLost(self._lost_message(lost)) from lost.cause

    def _lost_message(self, lost: _Lost) -> str:
        return (f"the controller at {self.socket_path} stopped answering ({lost.cause or 'connection closed'}); "
                f"check `xce controller status` and its log")

    def _exchange(self, sock: socket.socket, data: bytes) -> tuple[int, Any]:
        sent_error: OSError | None = None
        try:
            sock.sendall(data)
        except OSError as err:  # it may have answered and closed already (413): read what it said
            sent_error = err
        before = len(self._buffer)
        try:
            return self._read_response(sock)
        except (OSError, ConnectionError, ValueError) as err:
            raise _Lost(sent_error or err, answered=len(self._buffer) > before) from None

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connect_within(sock)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise errors.ControllerDown(
                f"the controller is not running (nothing answers at {self.socket_path}); "
                f"start it with `xce controller start`") from None
        except OSError as err:
            sock.close()
            raise errors.ControllerDown(f"cannot reach the controller at {self.socket_path}: {err}") from None
        self._sock = sock
        self._buffer = bytearray()
        return sock

    def _connect_within(self, sock: socket.socket) -> None:
        """Connect, waiting up to the timeout while the controller's listen backlog is full (a
        Unix socket with a timeout says EAGAIN at once instead of waiting)."""
        sock.settimeout(self.timeout)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock.connect(str(self.socket_path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    def _read_response(self, sock: socket.socket) -> tuple[int, Any]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            self._recv(sock)
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "connection" and value.strip().lower() == "close":
                close = True
        start = end + 4
        while len(self._buffer) < start + length:
            self._recv(sock)
        body = bytes(self._buffer[start:start + length])
        del self._buffer[:start + length]
        if close:
            self.close()
        return status, json.loads(body) if body else {}

    def _recv(self, sock: socket.socket) -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        self._buffer += chunk

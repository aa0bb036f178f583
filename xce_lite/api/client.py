"""Talking to the controller: JSON over HTTP/1.1 on the home's Unix socket, under /xce/v1/.

Standard library only and no http.client: this is on the path of every `xce submit`, whose whole
run must stay within a few times a bare Python start. Errors come back as XceError subclasses so the
CLI prints the controller's message and exits with the code the error kind carries.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

from xce_lite import errors

API = "/xce/v1"
_ERROR_KINDS = {cls.__name__: cls for cls in (
    errors.SpecError, errors.ConfigError, errors.HomeError, errors.StoreError, errors.TransitionError,
    errors.NotFound, errors.ExecError, errors.HostUnreachable, errors.LaunchRejected)}


class Client:
    """One connection to the controller, kept open across requests (HTTP keep-alive)."""

    def __init__(self, socket_path: Path, timeout: float = 60.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def get(self, path: str, **query: Any) -> Any:
        pairs = [f"{k}={quote(str(v))}" for k, v in query.items() if v is not None and v is not False]
        return self.request("GET", path + ("?" + "&".join(pairs) if pairs else ""))

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        payload = b"" if body is None else json.dumps(body, ensure_ascii=True).encode()
        head = (f"{method} {API}{path} HTTP/1.1\r\nHost: xce\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        sock = self._connect()
        try:
            sock.sendall(head + payload)
            status, reply = self._read_response(sock)
        except (OSError, ConnectionError) as err:
            self.close()
            raise errors.ControllerDown(
                f"the controller at {self.socket_path} stopped answering ({err}); check "
                f"`xce controller status` and its log") from None
        if status >= 400:
            kind = _ERROR_KINDS.get(reply.get("kind", ""), errors.XceError)
            raise kind(reply.get("error", f"the controller answered HTTP {status}"))
        return reply

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise errors.ControllerDown(
                f"the controller is not running (nothing answers at {self.socket_path}); "
                f"start it with `xce controller start`") from None
        except OSError as err:
            sock.close()
            raise errors.ControllerDown(f"cannot reach the controller at {self.socket_path}: {err}") from None
        self._sock = sock
        return sock

    def _read_response(self, sock: socket.socket) -> tuple[int, Any]:
        while b"\r\n\r\n" not in self._buffer:
            self._recv(sock)
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "connection" and value.strip().lower() == "close":
                close = True
        while len(self._buffer) < length:
            self._recv(sock)
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        if close:
            self.close()
        return status, json.loads(body) if body else {}

    def _recv(self, sock: socket.socket) -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        self._buffer += chunk
